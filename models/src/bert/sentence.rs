//! Sentence embeddings from a sentence-transformers folder: BERT, mean
//! pooling over real tokens, optional L2 normalisation — the three modules
//! of all-MiniLM-L6-v2's `modules.json`.

use std::path::Path;

use burn::tensor::{Tensor, backend::Backend};
use serde_json::Value;
use tokenizers::{TruncationDirection, TruncationParams, TruncationStrategy};

use super::{Bert, BertConfig};
use crate::backend::ModelBackend;
use crate::error::ModelError;
use crate::weights::WeightSource;

/// Sentences encoded per forward.
const BATCH: usize = 32;

/// A sentence-transformers model: `Transformer` (BERT) → mean `Pooling` →
/// optional `Normalize`.
#[derive(Debug, Clone)]
pub struct SentenceEncoder<B: Backend> {
    bert: Bert<B>,
    tokenizer: tokenizers::Tokenizer,
    normalize: bool,
}

impl<B: ModelBackend> SentenceEncoder<B> {
    /// Loads the folder `dir`: `config.json`, `model.safetensors`,
    /// `tokenizer.json`, `modules.json`, `1_Pooling/config.json` (or the
    /// pooling module's own path) and `sentence_bert_config.json`.
    ///
    /// Only mean pooling is implemented; a folder asking for CLS, max or
    /// sqrt-length pooling is refused with [`ModelError::BadConfig`].
    pub fn load(dir: impl AsRef<Path>, device: &B::Device) -> Result<Self, ModelError> {
        let dir = dir.as_ref();
        let modules = read_json(&dir.join("modules.json"))?;
        let modules = modules
            .as_array()
            .ok_or_else(|| ModelError::bad_config("modules.json", "not a list"))?;
        let kind = |m: &Value| {
            m.get("type")
                .and_then(Value::as_str)
                .map(|t| t.rsplit('.').next().unwrap_or(t).to_string())
        };
        let mut pooling_path = None;
        let mut normalize = false;
        for (i, m) in modules.iter().enumerate() {
            match kind(m).as_deref() {
                Some("Transformer") => {}
                Some("Pooling") => {
                    pooling_path =
                        Some(m.get("path").and_then(Value::as_str).unwrap_or("1_Pooling"))
                }
                Some("Normalize") => normalize = true,
                other => {
                    return Err(ModelError::bad_config(
                        format!("modules.json[{i}].type"),
                        format!("{other:?}: supported are Transformer, Pooling, Normalize"),
                    ));
                }
            }
        }
        let pooling_path = pooling_path
            .ok_or_else(|| ModelError::bad_config("modules.json", "no Pooling module"))?;
        check_mean_pooling(&read_json(&dir.join(pooling_path).join("config.json"))?)?;

        let config = BertConfig::from_hf(&read_json(&dir.join("config.json"))?)?;
        let max_seq_length = match read_json(&dir.join("sentence_bert_config.json")) {
            Ok(doc) => crate::config_fields::json_usize_opt(&doc, "max_seq_length")?,
            Err(ModelError::Io { .. }) => None,
            Err(e) => return Err(e),
        }
        .unwrap_or(config.max_position_embeddings)
        .min(config.max_position_embeddings);

        let path = dir.join("tokenizer.json");
        let tok_err =
            |e: tokenizers::Error| ModelError::Tokenizer(format!("{}: {e}", path.display()));
        let mut tokenizer = tokenizers::Tokenizer::from_file(&path).map_err(tok_err)?;
        // sentence-transformers calls the tokenizer with `padding=True,
        // truncation="longest_first", max_length=max_seq_length`, which
        // overrides the file's own fixed padding and truncation.
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: max_seq_length,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
                direction: TruncationDirection::Right,
            }))
            .map_err(tok_err)?;

        let weights = WeightSource::from_hf_dir(dir)?;
        Ok(Self {
            bert: Bert::load(&config, &weights, device)?,
            tokenizer,
            normalize,
        })
    }

    /// Width of an embedding.
    pub fn dimension(&self) -> usize {
        self.bert.config.hidden_size
    }

    /// Whether embeddings are L2-normalised (a `Normalize` module).
    pub fn normalizes(&self) -> bool {
        self.normalize
    }

    /// The token ids of `text` as the encoder sees them (`[CLS] … [SEP]`,
    /// truncated).
    pub fn tokens(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        let enc = self
            .tokenizer
            .encode_fast(text, true)
            .map_err(|e| ModelError::Tokenizer(format!("encode: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// One embedding per text, in order: the mean of BERT's last hidden
    /// states over each text's tokens, divided by its L2 norm (clamped at
    /// 1e-12, as `torch.nn.functional.normalize`) when the folder normalises.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, ModelError> {
        let mut out = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(BATCH) {
            let rows = chunk
                .iter()
                .map(|t| self.tokens(t))
                .collect::<Result<Vec<_>, _>>()?;
            let hidden = self.bert.forward(&rows)?;
            let [b, t, h] = hidden.dims();
            let mask = self.bert.mask(&rows, t).float().reshape([b, t, 1]);
            let summed: Tensor<B, 2> = (hidden * mask).sum_dim(1).reshape([b, h]);
            let values = summed
                .into_data()
                .into_vec::<f32>()
                .map_err(|e| ModelError::NonFiniteOutput(format!("{e:?}")))?;
            for (row, tokens) in values.chunks(h).zip(&rows) {
                let count = tokens.len() as f64;
                let mean: Vec<f64> = row.iter().map(|&v| v as f64 / count).collect();
                if mean.iter().any(|v| !v.is_finite()) {
                    return Err(ModelError::NonFiniteOutput("sentence embedding".into()));
                }
                let scale = if self.normalize {
                    mean.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-12)
                } else {
                    1.0
                };
                out.push(mean.iter().map(|v| (v / scale) as f32).collect());
            }
        }
        Ok(out)
    }
}

/// Refuses any pooling but the mean over tokens.
fn check_mean_pooling(doc: &Value) -> Result<(), ModelError> {
    for (key, wanted) in [
        ("pooling_mode_mean_tokens", true),
        ("pooling_mode_cls_token", false),
        ("pooling_mode_max_tokens", false),
        ("pooling_mode_mean_sqrt_len_tokens", false),
    ] {
        let set = doc.get(key).and_then(Value::as_bool).unwrap_or(false);
        if set != wanted {
            return Err(ModelError::bad_config(
                format!("1_Pooling/config.json {key}"),
                format!("{set}: only mean pooling is implemented"),
            ));
        }
    }
    Ok(())
}

fn read_json(path: &Path) -> Result<Value, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    serde_json::from_str(&text).map_err(|e| ModelError::ConfigJson {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}
