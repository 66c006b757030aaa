//! Model configurations, read from a Hugging Face `config.json` or from GGUF
//! metadata. Each architecture's config struct lives in its own `config.rs`
//! (`llama/config.rs`, `gpt2/config.rs`, `gemma/config.rs`); this module
//! dispatches on the architecture. The typed field readers they share are in
//! [`crate::config_fields`], a leaf module.

use std::path::Path;

use serde_json::Value;

use crate::config_fields::gguf_str;
use crate::error::ModelError;
use crate::gemma::GemmaConfig;
use crate::gguf::GgufFile;
use crate::gpt2::Gpt2Config;
use crate::llama::LlamaConfig;

/// The configuration of any supported model.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ModelConfig {
    /// GPT-2.
    Gpt2(Gpt2Config),
    /// Llama family (Llama 2/3, SmolLM2, ...).
    Llama(LlamaConfig),
    /// Gemma 1, 2 and 3 (text).
    Gemma(GemmaConfig),
}

impl ModelConfig {
    /// Parses an HF `config.json` file.
    pub fn from_hf_file(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let doc: Value = serde_json::from_str(&text).map_err(|e| ModelError::ConfigJson {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::from_hf_json(&doc)
    }

    /// Parses an HF config document, dispatching on `model_type`.
    pub fn from_hf_json(doc: &Value) -> Result<Self, ModelError> {
        let model_type = doc
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| ModelError::bad_config("model_type", "missing or not a string"))?;
        match model_type {
            "gpt2" => Ok(Self::Gpt2(Gpt2Config::from_hf(doc)?)),
            "llama" => Ok(Self::Llama(LlamaConfig::from_hf(doc)?)),
            "gemma" | "gemma2" | "gemma3_text" | "gemma3" => {
                Ok(Self::Gemma(GemmaConfig::from_hf(doc)?))
            }
            other => Err(ModelError::UnknownArchitecture(other.to_string())),
        }
    }

    /// Reads the configuration from GGUF metadata (`general.architecture`).
    pub fn from_gguf(file: &GgufFile) -> Result<Self, ModelError> {
        match gguf_str(file, "general.architecture")? {
            "gpt2" => Ok(Self::Gpt2(Gpt2Config::from_gguf(file)?)),
            "llama" => Ok(Self::Llama(LlamaConfig::from_gguf(file)?)),
            "gemma" | "gemma2" | "gemma3" => Ok(Self::Gemma(GemmaConfig::from_gguf(file)?)),
            other => Err(ModelError::UnknownArchitecture(other.to_string())),
        }
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        match self {
            Self::Gpt2(c) => c.vocab_size,
            Self::Llama(c) => c.vocab_size,
            Self::Gemma(c) => c.vocab_size,
        }
    }
}
