//! Text to token ids and back, over the Hugging Face `tokenizers` crate.
//!
//! Three sources:
//! - a `tokenizer.json` ([`Tokenizer::from_file`]);
//! - GPT-2's `encoder.json`/`vocab.json` + `vocab.bpe`/`merges.txt`
//!   ([`Tokenizer::from_gpt2_files`]);
//! - the vocabulary stored in a GGUF file's metadata ([`Tokenizer::from_gguf`]),
//!   rebuilt the way llama.cpp's `src/llama-vocab.cpp` reads it:
//!   * `tokenizer.ggml.model = "gpt2"`: byte-level BPE from `tokens` and
//!     `merges`, split first by the pre-tokenizer regexes that
//!     `tokenizer.ggml.pre` names in llama.cpp (`llama_vocab::impl::load`);
//!   * `tokenizer.ggml.model = "llama"`: SentencePiece BPE. llama.cpp's
//!     `llm_tokenizer_spm` merges adjacent symbols, highest `scores` entry of
//!     the merged piece first, falling back to `<0xNN>` byte pieces for
//!     characters outside the vocabulary, with `▁` for spaces. The same
//!     procedure is a BPE whose merge ranks follow the merged piece's score,
//!     which is how the merges are derived here (as HF's
//!     `SentencePieceExtractor` does).
//!
//! End of a turn: [`Tokenizer::stop_ids`] is the set of ids at which generation
//! stops. In a Hugging Face folder it is `generation_config.json`'s
//! `eos_token_id` (an id or a list, what transformers' `generate` stops at),
//! else the id of `tokenizer_config.json`'s `eos_token`; in a GGUF file
//! `tokenizer.ggml.eos_token_id` with `eot_token_id` and `eom_token_id` where
//! present (llama.cpp's end-of-generation ids).
//!
//! Control tokens (GGUF `token_type` 3) are added as special tokens and
//! user-defined ones (type 4) as plain added tokens: both are matched in the
//! input text before BPE, as llama.cpp does with `parse_special = true`.
//! The tests compare ids with llama.cpp's own tokenizer on real files.

use std::collections::HashMap;
use std::path::Path;

use tokenizers::decoders::DecoderWrapper;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::models::bpe::{BPE, Merges, Vocab};
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::chat_template::special_token_string;
use crate::error::ModelError;
use crate::gguf::{GgufFile, MetadataValue};

/// GGUF `token_type` of a control token (`LLAMA_TOKEN_TYPE_CONTROL`).
const TOKEN_TYPE_CONTROL: i64 = 3;
/// GGUF `token_type` of a user-defined token.
const TOKEN_TYPE_USER_DEFINED: i64 = 4;
/// GGUF `token_type` of a byte piece `<0xNN>`.
const TOKEN_TYPE_BYTE: i64 = 6;
/// GGUF `token_type` of a normal token.
const TOKEN_TYPE_NORMAL: i64 = 1;

fn tok_err(message: impl Into<String>) -> ModelError {
    ModelError::Tokenizer(message.into())
}

/// A tokenizer with the special-token ids a model needs.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// `inner`'s number of ids, added tokens included: `tokenizers` counts them
    /// by building its whole vocabulary map, too slow for every `decode`.
    vocab_size: usize,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    /// The end-of-turn ids, sorted, without repeats.
    stops: Vec<u32>,
}

impl Tokenizer {
    /// Loads a Hugging Face `tokenizer.json`. BOS/EOS are the
    /// `bos_token`/`eos_token` of `tokenizer_config.json` beside it when it
    /// names them (each must be in the vocabulary); otherwise the vocabulary
    /// entries `<s>`/`</s>`, `<bos>`/`<eos>` or `<|endoftext|>` when present.
    /// The stop ids are `generation_config.json`'s `eos_token_id` beside it
    /// (an id or a list), else EOS (see the module documentation).
    /// `encode(_, true)` applies the file's own post-processor.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        let path = path.as_ref();
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| tok_err(format!("{}: {e}", path.display())))?;
        let dir = path.parent().unwrap_or_else(|| Path::new("."));
        let config_path = dir.join("tokenizer_config.json");
        let config = read_optional_json(&config_path)?;
        let named = |key: &str| -> Result<Option<u32>, ModelError> {
            let Some(config) = &config else {
                return Ok(None);
            };
            match special_token_string(config, key, &config_path)? {
                None => Ok(None),
                Some(token) => inner.token_to_id(&token).map(Some).ok_or_else(|| {
                    tok_err(format!(
                        "{}: {key} {token:?} is not in the vocabulary of {}",
                        config_path.display(),
                        path.display()
                    ))
                }),
            }
        };
        let find = |names: &[&str]| names.iter().find_map(|n| inner.token_to_id(n));
        let bos_id = match named("bos_token")? {
            Some(id) => Some(id),
            None => find(&["<s>", "<bos>", "<|begin_of_text|>", "<|endoftext|>"]),
        };
        let eos_id = match named("eos_token")? {
            Some(id) => Some(id),
            None => find(&["</s>", "<eos>", "<|end_of_text|>", "<|endoftext|>"]),
        };
        let vocab = inner.get_vocab_size(true);
        let stops = match generation_eos_ids(&dir.join("generation_config.json"), vocab)? {
            Some(ids) => ids,
            None => eos_id.into_iter().collect(),
        };
        Ok(Self {
            vocab_size: inner.get_vocab_size(true),
            inner,
            bos_id,
            eos_id,
            add_bos: false,
            add_eos: false,
            stops: sorted_unique(stops),
        })
    }

    /// Loads GPT-2's byte-level BPE from `encoder.json` (token → id) and
    /// `vocab.bpe` (merges, one `a b` pair a line after a `#version` header).
    /// `<|endoftext|>` is BOS and EOS; nothing is added on encode.
    pub fn from_gpt2_files(
        vocab_json: impl AsRef<Path>,
        merges_txt: impl AsRef<Path>,
    ) -> Result<Self, ModelError> {
        let (v, m) = (vocab_json.as_ref(), merges_txt.as_ref());
        let bpe = BPE::from_file(&v.to_string_lossy(), &m.to_string_lossy())
            .build()
            .map_err(|e| tok_err(format!("{} / {}: {e}", v.display(), m.display())))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
        inner.with_decoder(Some(ByteLevel::new(false, true, true)));
        let eot = inner.token_to_id("<|endoftext|>");
        if eot.is_some() {
            inner.add_special_tokens(&[AddedToken::from("<|endoftext|>", true)]);
        }
        Ok(Self {
            vocab_size: inner.get_vocab_size(true),
            inner,
            bos_id: eot,
            eos_id: eot,
            add_bos: false,
            add_eos: false,
            stops: eot.into_iter().collect(),
        })
    }

    /// Builds the tokenizer stored in a GGUF file's `tokenizer.ggml.*`
    /// metadata (see the module documentation). Missing or malformed keys,
    /// an unknown `tokenizer.ggml.model` or `tokenizer.ggml.pre` give
    /// [`ModelError::Tokenizer`].
    pub fn from_gguf(file: &GgufFile) -> Result<Self, ModelError> {
        let model = meta_str(file, "tokenizer.ggml.model")?;
        let tokens = meta_strings(file, "tokenizer.ggml.tokens")?;
        let n = tokens.len();
        let types = match file.metadata_value("tokenizer.ggml.token_type") {
            Some(v) => meta_ints(v, "tokenizer.ggml.token_type", n)?,
            None => vec![TOKEN_TYPE_NORMAL; n],
        };
        let bos_id = meta_id(file, "tokenizer.ggml.bos_token_id", n)?;
        let eos_id = meta_id(file, "tokenizer.ggml.eos_token_id", n)?;
        let unk_id = meta_id(file, "tokenizer.ggml.unknown_token_id", n)?;
        let eot_id = meta_id(file, "tokenizer.ggml.eot_token_id", n)?;
        let eom_id = meta_id(file, "tokenizer.ggml.eom_token_id", n)?;
        let mut inner = match model {
            "gpt2" => {
                let pre = file
                    .metadata_value("tokenizer.ggml.pre")
                    .and_then(MetadataValue::as_str)
                    .unwrap_or("default");
                build_gpt2(file, &tokens, pre)?
            }
            "llama" => {
                let scores = match file.metadata_value("tokenizer.ggml.scores") {
                    Some(MetadataValue::Array(a)) if a.len() == n => a
                        .iter()
                        .map(|v| match v {
                            MetadataValue::F32(s) if s.is_finite() => Ok(*s),
                            _ => Err(tok_err("tokenizer.ggml.scores: not finite f32 values")),
                        })
                        .collect::<Result<Vec<f32>, _>>()?,
                    Some(_) => {
                        return Err(tok_err(format!(
                            "tokenizer.ggml.scores: not an array of {n} f32"
                        )));
                    }
                    None => return Err(tok_err("missing tokenizer.ggml.scores")),
                };
                let unk = unk_id.map(|i| tokens[i as usize].clone());
                build_spm(&tokens, &scores, &types, unk)?
            }
            other => {
                return Err(tok_err(format!(
                    "tokenizer.ggml.model {other:?} is not supported (gpt2, llama)"
                )));
            }
        };
        let mut special = Vec::new();
        let mut user = Vec::new();
        for (tok, &ty) in tokens.iter().zip(&types) {
            if ty == TOKEN_TYPE_CONTROL {
                special.push(AddedToken::from(tok.clone(), true).normalized(false));
            } else if ty == TOKEN_TYPE_USER_DEFINED {
                user.push(AddedToken::from(tok.clone(), false).normalized(false));
            }
        }
        inner.add_special_tokens(&special);
        inner.add_tokens(&user);
        let default_add_bos = model == "llama";
        Ok(Self {
            vocab_size: inner.get_vocab_size(true),
            inner,
            bos_id,
            eos_id,
            add_bos: meta_bool(file, "tokenizer.ggml.add_bos_token")?.unwrap_or(default_add_bos),
            add_eos: meta_bool(file, "tokenizer.ggml.add_eos_token")?.unwrap_or(false),
            stops: sorted_unique([eos_id, eot_id, eom_id].into_iter().flatten().collect()),
        })
    }

    /// Token ids of `text`. With `add_special`, BOS (EOS) is added when the
    /// source asks for it (GGUF `add_bos_token`/`add_eos_token`, or the
    /// `tokenizer.json` post-processor). Special-token text in `text` (e.g.
    /// `<|im_start|>`) is always read as that special token.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, ModelError> {
        let enc = self
            .inner
            .encode_fast(text, add_special)
            .map_err(|e| tok_err(format!("encode: {e}")))?;
        let mut ids = Vec::with_capacity(enc.len() + 2);
        if add_special && self.add_bos {
            ids.extend(self.bos_id);
        }
        ids.extend_from_slice(enc.get_ids());
        if add_special && self.add_eos {
            ids.extend(self.eos_id);
        }
        Ok(ids)
    }

    /// The text of `ids` (special tokens included as their text). An id
    /// outside the vocabulary is an error.
    pub fn decode(&self, ids: &[u32]) -> Result<String, ModelError> {
        let size = self.vocab_size();
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= size) {
            return Err(tok_err(format!(
                "decode: id {bad} outside vocabulary of {size}"
            )));
        }
        self.inner
            .decode(ids, false)
            .map_err(|e| tok_err(format!("decode: {e}")))
    }

    /// The beginning-of-sequence id, if the source names one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// The end-of-sequence id, if the source names one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// The ids that end a turn, sorted (see the module documentation): where
    /// generation stops. Empty when the source names none.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stops
    }

    /// True when `id` ends a turn.
    pub fn is_stop(&self, id: u32) -> bool {
        self.stops.binary_search(&id).is_ok()
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }
}

fn sorted_unique(mut ids: Vec<u32>) -> Vec<u32> {
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// A JSON file that may be absent (`Ok(None)`); present but unreadable or
/// malformed is an error naming it.
fn read_optional_json(path: &Path) -> Result<Option<serde_json::Value>, ModelError> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| ModelError::ConfigJson {
            path: path.display().to_string(),
            message: e.to_string(),
        })
}

/// `eos_token_id` of a `generation_config.json` (an id or a list of ids, each
/// below `vocab`); `Ok(None)` when the file or the field is absent or null.
fn generation_eos_ids(path: &Path, vocab: usize) -> Result<Option<Vec<u32>>, ModelError> {
    let Some(config) = read_optional_json(path)? else {
        return Ok(None);
    };
    let bad = || ModelError::ConfigJson {
        path: path.display().to_string(),
        message: format!(
            "eos_token_id is not an id or a list of ids below the vocabulary size {vocab}"
        ),
    };
    let id = |v: &serde_json::Value| {
        v.as_u64()
            .filter(|&i| i < vocab as u64)
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(bad)
    };
    match config.get("eos_token_id") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Array(list)) => {
            list.iter().map(id).collect::<Result<_, _>>().map(Some)
        }
        Some(v) => Ok(Some(vec![id(v)?])),
    }
}

/// Byte-level BPE with llama.cpp's pre-tokenizer for `pre`.
fn build_gpt2(
    file: &GgufFile,
    tokens: &[String],
    pre: &str,
) -> Result<tokenizers::Tokenizer, ModelError> {
    let merges_raw = meta_strings(file, "tokenizer.ggml.merges")?;
    let mut merges: Merges = Vec::with_capacity(merges_raw.len());
    for (i, m) in merges_raw.iter().enumerate() {
        let (a, b) = m
            .split_once(' ')
            .ok_or_else(|| tok_err(format!("tokenizer.ggml.merges[{i}] = {m:?}: no space")))?;
        merges.push((a.to_string(), b.to_string()));
    }
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| tok_err(format!("BPE from GGUF: {e}")))?;
    // Regexes applied before GPT-2's, per llama.cpp's `tokenizer.ggml.pre`
    // table (llama-vocab.cpp, `llm_tokenizer_bpe`).
    let extra: &[&str] = match pre {
        "default" | "gpt2" | "gpt-2" | "mpt" | "olmo" | "jais" => &[],
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva" => {
            &[r"\p{N}"]
        }
        other => {
            return Err(tok_err(format!(
                "tokenizer.ggml.pre {other:?} is not supported"
            )));
        }
    };
    let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
    for re in extra {
        let split = Split::new(
            SplitPattern::Regex((*re).to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| tok_err(format!("pre-tokenizer regex: {e}")))?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, true, true).into());
    // ByteLevel's own regex is GPT-2's, the last of llama.cpp's list.
    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(PreSequence::new(steps)));
    inner.with_decoder(Some(ByteLevel::new(false, true, true)));
    Ok(inner)
}

/// SentencePiece BPE: merges ranked by the merged piece's score.
fn build_spm(
    tokens: &[String],
    scores: &[f32],
    types: &[i64],
    unk: Option<String>,
) -> Result<tokenizers::Tokenizer, ModelError> {
    let index: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mergeable = |ty: i64| ty == TOKEN_TYPE_NORMAL || ty == TOKEN_TYPE_USER_DEFINED;
    let mut ranked: Vec<(f32, usize, usize, String, String)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate() {
        if !mergeable(types[id]) {
            continue;
        }
        for (cut, _) in piece.char_indices().skip(1) {
            let (a, b) = piece.split_at(cut);
            if let (Some(&ia), Some(&ib)) = (index.get(a), index.get(b))
                && mergeable(types[ia])
                && mergeable(types[ib])
            {
                ranked.push((scores[id], id, cut, a.to_string(), b.to_string()));
            }
        }
    }
    // Higher score first; then by id and by left length for a fixed order.
    ranked.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
    let merges: Merges = ranked.into_iter().map(|(_, _, _, a, b)| (a, b)).collect();
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    if !types.contains(&TOKEN_TYPE_BYTE) {
        return Err(tok_err(
            "SentencePiece vocabulary without <0xNN> byte pieces",
        ));
    }
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true);
    if let Some(u) = unk {
        builder = builder.unk_token(u);
    }
    let bpe = builder
        .build()
        .map_err(|e| tok_err(format!("SentencePiece BPE from GGUF: {e}")))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    let replace = Replace::new(" ", "▁").map_err(|e| tok_err(e.to_string()))?;
    inner.with_normalizer(Some(replace));
    let un_replace = Replace::new("▁", " ").map_err(|e| tok_err(e.to_string()))?;
    inner.with_decoder(Some(DecoderSequence::new(vec![
        DecoderWrapper::Replace(un_replace),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ])));
    Ok(inner)
}

fn meta_str<'a>(file: &'a GgufFile, key: &str) -> Result<&'a str, ModelError> {
    match file.metadata_value(key) {
        Some(v) => v
            .as_str()
            .ok_or_else(|| tok_err(format!("{key}: not a string"))),
        None => Err(tok_err(format!("missing {key}"))),
    }
}

fn meta_strings(file: &GgufFile, key: &str) -> Result<Vec<String>, ModelError> {
    match file.metadata_value(key) {
        Some(MetadataValue::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| tok_err(format!("{key}: not an array of strings")))
            })
            .collect(),
        Some(_) => Err(tok_err(format!("{key}: not an array of strings"))),
        None => Err(tok_err(format!("missing {key}"))),
    }
}

fn meta_ints(v: &MetadataValue, key: &str, n: usize) -> Result<Vec<i64>, ModelError> {
    let bad = || tok_err(format!("{key}: not an array of {n} integers"));
    match v {
        MetadataValue::Array(a) if a.len() == n => a
            .iter()
            .map(|x| match *x {
                MetadataValue::I32(t) => Ok(i64::from(t)),
                MetadataValue::U32(t) => Ok(i64::from(t)),
                _ => Err(bad()),
            })
            .collect(),
        _ => Err(bad()),
    }
}

fn meta_id(file: &GgufFile, key: &str, n: usize) -> Result<Option<u32>, ModelError> {
    match file.metadata_value(key) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(id) if (id as usize) < n => Ok(Some(id as u32)),
            _ => Err(tok_err(format!("{key}: not an id below {n}"))),
        },
    }
}

fn meta_bool(file: &GgufFile, key: &str) -> Result<Option<bool>, ModelError> {
    match file.metadata_value(key) {
        None => Ok(None),
        Some(MetadataValue::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(tok_err(format!("{key}: not a bool"))),
    }
}
