//! BERT hyper-parameters from an HF `config.json` (`BertConfig` names).

use serde_json::Value;

use crate::config_fields::{json_f64_opt, json_usize, json_usize_opt};
use crate::error::ModelError;

/// Hyper-parameters of a BERT encoder.
#[derive(Debug, Clone, PartialEq)]
pub struct BertConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden width.
    pub hidden_size: usize,
    /// Number of encoder blocks.
    pub num_hidden_layers: usize,
    /// Attention heads (each `hidden_size / num_attention_heads` wide).
    pub num_attention_heads: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// Number of learned positions.
    pub max_position_embeddings: usize,
    /// Number of token types (segments).
    pub type_vocab_size: usize,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f64,
}

impl BertConfig {
    /// From an HF `config.json` document. Options this forward does not
    /// implement (relative positions, another activation, a decoder) are
    /// rejected rather than run wrong.
    pub fn from_hf(doc: &Value) -> Result<Self, ModelError> {
        let text = |key: &str| doc.get(key).and_then(Value::as_str);
        match text("model_type") {
            Some("bert") => {}
            other => {
                return Err(ModelError::bad_config(
                    "model_type",
                    format!("{other:?}: a BERT encoder needs \"bert\""),
                ));
            }
        }
        if let Some(act) = text("hidden_act")
            && act != "gelu"
        {
            return Err(ModelError::bad_config(
                "hidden_act",
                format!("{act:?}: only exact \"gelu\" is supported"),
            ));
        }
        if let Some(pos) = text("position_embedding_type")
            && pos != "absolute"
        {
            return Err(ModelError::bad_config(
                "position_embedding_type",
                format!("{pos:?}: only \"absolute\" is supported"),
            ));
        }
        if doc.get("is_decoder").and_then(Value::as_bool) == Some(true) {
            return Err(ModelError::bad_config(
                "is_decoder",
                "only encoders are supported",
            ));
        }
        let c = Self {
            vocab_size: json_usize(doc, "vocab_size")?,
            hidden_size: json_usize(doc, "hidden_size")?,
            num_hidden_layers: json_usize(doc, "num_hidden_layers")?,
            num_attention_heads: json_usize(doc, "num_attention_heads")?,
            intermediate_size: json_usize(doc, "intermediate_size")?,
            max_position_embeddings: json_usize(doc, "max_position_embeddings")?,
            type_vocab_size: json_usize_opt(doc, "type_vocab_size")?.unwrap_or(2),
            layer_norm_eps: json_f64_opt(doc, "layer_norm_eps")?.unwrap_or(1e-12),
        };
        c.check()?;
        Ok(c)
    }

    fn check(&self) -> Result<(), ModelError> {
        for (field, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
            ("type_vocab_size", self.type_vocab_size),
        ] {
            if v == 0 {
                return Err(ModelError::bad_config(field, "must be positive"));
            }
            if v > 1 << 24 {
                return Err(ModelError::bad_config(
                    field,
                    format!("{v} is implausibly large"),
                ));
            }
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(ModelError::bad_config(
                "num_attention_heads",
                format!(
                    "{} does not divide hidden_size {}",
                    self.num_attention_heads, self.hidden_size
                ),
            ));
        }
        if !(self.layer_norm_eps.is_finite() && self.layer_norm_eps > 0.0) {
            return Err(ModelError::bad_config(
                "layer_norm_eps",
                "must be positive and finite",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn minilm() -> Value {
        // sentence-transformers/all-MiniLM-L6-v2's config.json, abridged.
        json!({
            "model_type": "bert", "hidden_act": "gelu", "hidden_size": 384,
            "intermediate_size": 1536, "layer_norm_eps": 1e-12,
            "max_position_embeddings": 512, "num_attention_heads": 12,
            "num_hidden_layers": 6, "position_embedding_type": "absolute",
            "type_vocab_size": 2, "vocab_size": 30522
        })
    }

    #[test]
    fn reads_minilm() {
        let c = BertConfig::from_hf(&minilm()).unwrap();
        assert_eq!(
            (c.hidden_size, c.num_hidden_layers, c.vocab_size),
            (384, 6, 30522)
        );
        assert_eq!(c.layer_norm_eps, 1e-12);
    }

    #[test]
    fn rejects_what_the_forward_does_not_implement() {
        for (key, value) in [
            ("model_type", json!("roberta")),
            ("hidden_act", json!("relu")),
            ("position_embedding_type", json!("relative_key")),
            ("is_decoder", json!(true)),
            ("num_attention_heads", json!(7)),
            ("hidden_size", json!(0)),
            ("layer_norm_eps", json!(-1.0)),
        ] {
            let mut doc = minilm();
            doc[key] = value;
            let err = BertConfig::from_hf(&doc).unwrap_err();
            assert!(matches!(err, ModelError::BadConfig { .. }), "{key}: {err}");
        }
    }
}
