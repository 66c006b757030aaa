//! Typed readers of configuration fields, from an HF `config.json`
//! document or from GGUF metadata, shared by every architecture's config
//! (a leaf module: it imports no model).

use serde_json::Value;

use crate::error::ModelError;
use crate::gguf::{GgufFile, MetadataValue};

/// A required non-negative integer field of an HF config.
pub fn json_usize(doc: &Value, key: &str) -> Result<usize, ModelError> {
    json_usize_opt(doc, key)?.ok_or_else(|| ModelError::bad_config(key, "missing"))
}

/// An optional non-negative integer field (`null` reads as absent).
pub fn json_usize_opt(doc: &Value, key: &str) -> Result<Option<usize>, ModelError> {
    match doc.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| ModelError::bad_config(key, format!("not a non-negative integer: {v}"))),
    }
}

/// An optional finite number field (`null` reads as absent).
pub fn json_f64_opt(doc: &Value, key: &str) -> Result<Option<f64>, ModelError> {
    match doc.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite())
            .map(Some)
            .ok_or_else(|| ModelError::bad_config(key, format!("not a finite number: {v}"))),
    }
}

/// An optional boolean field (`null` reads as absent).
pub fn json_bool_opt(doc: &Value, key: &str) -> Result<Option<bool>, ModelError> {
    match doc.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| ModelError::bad_config(key, format!("not a boolean: {v}"))),
    }
}

/// A required string metadata value of a GGUF file.
pub fn gguf_str<'a>(file: &'a GgufFile, key: &str) -> Result<&'a str, ModelError> {
    file.metadata_value(key)
        .ok_or_else(|| ModelError::bad_config(key, "missing"))?
        .as_str()
        .ok_or_else(|| ModelError::bad_config(key, "not a string"))
}

/// A required non-negative integer metadata value of a GGUF file.
pub fn gguf_usize(file: &GgufFile, key: &str) -> Result<usize, ModelError> {
    gguf_usize_opt(file, key)?.ok_or_else(|| ModelError::bad_config(key, "missing"))
}

/// An integer metadata value, or `default` when absent.
pub fn gguf_usize_or(file: &GgufFile, key: &str, default: usize) -> Result<usize, ModelError> {
    Ok(gguf_usize_opt(file, key)?.unwrap_or(default))
}

/// An optional non-negative integer metadata value.
pub fn gguf_usize_opt(file: &GgufFile, key: &str) -> Result<Option<usize>, ModelError> {
    match file.metadata_value(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| ModelError::bad_config(key, "not a non-negative integer")),
    }
}

/// An optional floating-point metadata value (F32 or F64), which must be finite.
pub fn gguf_f64_opt(file: &GgufFile, key: &str) -> Result<Option<f64>, ModelError> {
    match file.metadata_value(key) {
        None => Ok(None),
        Some(MetadataValue::F32(x)) if x.is_finite() => Ok(Some(f64::from(*x))),
        Some(MetadataValue::F64(x)) if x.is_finite() => Ok(Some(*x)),
        Some(_) => Err(ModelError::bad_config(key, "not a finite float")),
    }
}

/// The vocabulary size of a GGUF model: `{arch}.vocab_size`, else the length
/// of `tokenizer.ggml.tokens`, else the embedding's row count.
pub fn gguf_vocab_size(file: &GgufFile, arch: &str) -> Result<usize, ModelError> {
    if let Some(n) = gguf_usize_opt(file, &format!("{arch}.vocab_size"))? {
        return Ok(n);
    }
    if let Some(MetadataValue::Array(tokens)) = file.metadata_value("tokenizer.ggml.tokens") {
        return Ok(tokens.len());
    }
    file.tensor_info("token_embd.weight")
        .and_then(|t| t.dims.get(1))
        .map(|&d| d as usize)
        .ok_or_else(|| ModelError::bad_config(format!("{arch}.vocab_size"), "missing"))
}

/// Checks a configuration's invariants shared by every decoder.
pub(crate) fn check_dims(
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    layers: usize,
    vocab: usize,
) -> Result<(), ModelError> {
    let positive = [
        ("hidden_size", hidden),
        ("num_attention_heads", heads),
        ("num_key_value_heads", kv_heads),
        ("head_dim", head_dim),
        ("num_hidden_layers", layers),
        ("vocab_size", vocab),
    ];
    for (field, v) in positive {
        if v == 0 {
            return Err(ModelError::bad_config(field, "must be positive"));
        }
    }
    // Products the loaders form (weight shapes) must not overflow.
    for (field, a, b) in [
        ("num_attention_heads × head_dim", heads, head_dim),
        ("vocab_size × hidden_size", vocab, hidden),
        (
            "hidden_size × num_attention_heads × head_dim",
            hidden,
            heads.saturating_mul(head_dim),
        ),
    ] {
        if a.checked_mul(b).is_none_or(|p| p > isize::MAX as usize / 4) {
            return Err(ModelError::bad_config(field, "too large"));
        }
    }
    if !heads.is_multiple_of(kv_heads) {
        return Err(ModelError::bad_config(
            "num_key_value_heads",
            format!("{kv_heads} does not divide num_attention_heads {heads}"),
        ));
    }
    if !head_dim.is_multiple_of(2) {
        return Err(ModelError::bad_config(
            "head_dim",
            format!("{head_dim} is odd (RoPE needs pairs)"),
        ));
    }
    Ok(())
}

/// Reads RoPE parameters from an HF config: transformers 5's
/// `rope_parameters` object (`rope_theta`, `rope_type`, `factor`, ...) or the
/// 4.x layout (`rope_theta` at top level, `rope_scaling` object with
/// `rope_type` or `type`). Returns `(theta, scaling)`; `theta` is `None` when
/// neither layout gives one.
pub fn hf_rope(doc: &Value) -> Result<(Option<f64>, crate::layers::RopeScaling), ModelError> {
    match doc.get("rope_parameters") {
        Some(params @ Value::Object(_)) => Ok((
            json_f64_opt(params, "rope_theta")?,
            rope_scaling(params, "rope_parameters")?,
        )),
        _ => {
            let theta = json_f64_opt(doc, "rope_theta")?;
            let scaling = match doc.get("rope_scaling") {
                None | Some(Value::Null) => crate::layers::RopeScaling::None,
                Some(s) => rope_scaling(s, "rope_scaling")?,
            };
            Ok((theta, scaling))
        }
    }
}

/// The scaling described by one HF rope-parameters object.
pub fn rope_scaling(obj: &Value, field: &str) -> Result<crate::layers::RopeScaling, ModelError> {
    use crate::layers::RopeScaling;
    let kind = obj
        .get("rope_type")
        .or_else(|| obj.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let num = |key: &str| {
        json_f64_opt(obj, key)?
            .ok_or_else(|| ModelError::bad_config(format!("{field}.{key}"), "missing"))
    };
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear {
            factor: num("factor")?,
        }),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: num("factor")?,
            low_freq_factor: num("low_freq_factor")?,
            high_freq_factor: num("high_freq_factor")?,
            original_max_position_embeddings: num("original_max_position_embeddings")?,
        }),
        other => Err(ModelError::bad_config(
            format!("{field}.rope_type"),
            format!("unsupported RoPE scaling {other:?} (supported: default, linear, llama3)"),
        )),
    }
}

/// RoPE scaling from GGUF metadata (`{arch}.rope.scaling.type`/`.factor`).
/// llama.cpp stores Llama 3 scaling as a `rope_freqs.weight` tensor, which
/// this crate does not read: such files are rejected rather than run wrong.
pub fn gguf_rope_scaling(
    file: &GgufFile,
    arch: &str,
) -> Result<crate::layers::RopeScaling, ModelError> {
    use crate::layers::RopeScaling;
    if file.tensor_info("rope_freqs.weight").is_some() {
        return Err(ModelError::bad_config(
            "rope_freqs.weight",
            "per-frequency RoPE factors (Llama 3.1 scaling in GGUF) are not supported",
        ));
    }
    let key = format!("{arch}.rope.scaling.type");
    match file.metadata_value(&key).and_then(MetadataValue::as_str) {
        None | Some("none") => Ok(RopeScaling::None),
        Some("linear") => {
            let fkey = format!("{arch}.rope.scaling.factor");
            let factor = gguf_f64_opt(file, &fkey)?
                .ok_or_else(|| ModelError::bad_config(fkey, "missing"))?;
            Ok(RopeScaling::Linear { factor })
        }
        Some(other) => Err(ModelError::bad_config(
            key,
            format!("unsupported RoPE scaling {other:?}"),
        )),
    }
}
