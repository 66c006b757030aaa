//! llama.cpp's GGUF tensor names and layouts (`convert_hf_to_gguf.py`,
//! gguf-py's `tensor_mapping.py`) and the inverse transforms that give back
//! the Hugging Face tensors.

use crate::error::ModelError;

/// Undoes llama.cpp's `permute(w, n_head)`: within each head of `d` rows,
/// GGUF row `2j + c` is HF row `c·d/2 + j`.
pub(super) fn unpermute_rows(
    values: Vec<f32>,
    shape: &[usize],
    heads: usize,
    name: &str,
) -> Result<Vec<f32>, ModelError> {
    let rows = shape[0];
    let cols: usize = shape[1..].iter().product();
    if heads == 0 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
        return Err(ModelError::bad_config(
            "attention.head_count",
            format!("{name}: {rows} rows do not split into {heads} heads of even width"),
        ));
    }
    let d = rows / heads;
    let mut out = vec![0.0f32; values.len()];
    for h in 0..heads {
        for j in 0..d / 2 {
            for c in 0..2 {
                let src = (h * d + 2 * j + c) * cols;
                let dst = (h * d + c * d / 2 + j) * cols;
                out[dst..dst + cols].copy_from_slice(&values[src..src + cols]);
            }
        }
    }
    Ok(out)
}

/// The row map of [`unpermute_rows`]: HF row `r` is GGUF row `from[r]`.
#[cfg(feature = "flex")]
pub(super) fn unpermuted_order(
    rows: usize,
    heads: usize,
    name: &str,
) -> Result<Vec<usize>, ModelError> {
    let order: Vec<f32> = (0..rows).map(|r| r as f32).collect();
    Ok(unpermute_rows(order, &[rows, 1], heads, name)?
        .into_iter()
        .map(|r| r as usize)
        .collect())
}

/// Whether `name` is the weight of one of GPT-2's `Conv1D` projections.
pub(super) fn is_gpt2_conv1d_weight(name: &str) -> bool {
    [
        ".attn.c_attn.weight",
        ".attn.c_proj.weight",
        ".mlp.c_fc.weight",
        ".mlp.c_proj.weight",
    ]
    .iter()
    .any(|s| name.ends_with(s))
}

/// The `[cols, rows]` transpose of the row-major `[rows, cols]` matrix `values`.
pub(super) fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; values.len()];
    for (r, row) in values.chunks_exact(cols.max(1)).enumerate().take(rows) {
        for (c, &v) in row.iter().enumerate() {
            out[c * rows + r] = v;
        }
    }
    out
}

/// The GGUF name of GPT-2 tensor `name` (HF `GPT2LMHeadModel` names, with
/// the `transformer.` prefix), after gguf-py's `tensor_mapping.py`.
fn gpt2_gguf_name(name: &str) -> Option<String> {
    let global = match name {
        "transformer.wte.weight" => Some("token_embd.weight"),
        "transformer.wpe.weight" => Some("position_embd.weight"),
        "transformer.ln_f.weight" => Some("output_norm.weight"),
        "transformer.ln_f.bias" => Some("output_norm.bias"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(g) = global {
        return Some(g.to_string());
    }
    let rest = name.strip_prefix("transformer.h.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, suffix) = rest.rsplit_once('.')?;
    let g = match module {
        "ln_1" => "attn_norm",
        "attn.c_attn" => "attn_qkv",
        "attn.c_proj" => "attn_output",
        "ln_2" => "ffn_norm",
        "mlp.c_fc" => "ffn_up",
        "mlp.c_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{g}.{suffix}"))
}

/// The GGUF tensor name of canonical HF tensor `name` for architecture `arch`.
pub fn gguf_name(arch: &str, name: &str) -> Option<String> {
    if arch == "gpt2" {
        return gpt2_gguf_name(name);
    }
    let global = match name {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(g) = global {
        return Some(g.to_string());
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, suffix) = rest.rsplit_once('.')?;
    let gemma_post_norms = arch == "gemma2" || arch == "gemma3";
    let g = match module {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" if gemma_post_norms => "post_attention_norm",
        "post_attention_layernorm" => "ffn_norm",
        "pre_feedforward_layernorm" => "ffn_norm",
        "post_feedforward_layernorm" => "post_ffw_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{g}.{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_like_llama_cpp() {
        let n = |a, s| gguf_name(a, s).unwrap();
        assert_eq!(
            n("llama", "model.layers.12.self_attn.o_proj.weight"),
            "blk.12.attn_output.weight"
        );
        assert_eq!(
            n("llama", "model.layers.0.post_attention_layernorm.weight"),
            "blk.0.ffn_norm.weight"
        );
        assert_eq!(
            n("gemma3", "model.layers.0.post_attention_layernorm.weight"),
            "blk.0.post_attention_norm.weight"
        );
        assert_eq!(
            n("gemma3", "model.layers.1.pre_feedforward_layernorm.weight"),
            "blk.1.ffn_norm.weight"
        );
        assert_eq!(n("gemma", "model.embed_tokens.weight"), "token_embd.weight");
        assert_eq!(
            gguf_name("llama", "model.layers.x.mlp.up_proj.weight"),
            None
        );
    }

    #[test]
    fn gpt2_names_map_like_gguf_py() {
        let n = |s| gguf_name("gpt2", s).unwrap();
        assert_eq!(n("transformer.wte.weight"), "token_embd.weight");
        assert_eq!(n("transformer.wpe.weight"), "position_embd.weight");
        assert_eq!(n("transformer.ln_f.bias"), "output_norm.bias");
        assert_eq!(n("transformer.h.3.ln_1.weight"), "blk.3.attn_norm.weight");
        assert_eq!(n("transformer.h.3.attn.c_attn.bias"), "blk.3.attn_qkv.bias");
        assert_eq!(
            n("transformer.h.0.attn.c_proj.weight"),
            "blk.0.attn_output.weight"
        );
        assert_eq!(n("transformer.h.0.ln_2.bias"), "blk.0.ffn_norm.bias");
        assert_eq!(n("transformer.h.1.mlp.c_fc.weight"), "blk.1.ffn_up.weight");
        assert_eq!(
            n("transformer.h.1.mlp.c_proj.weight"),
            "blk.1.ffn_down.weight"
        );
        assert_eq!(gguf_name("gpt2", "model.embed_tokens.weight"), None);
        assert!(is_gpt2_conv1d_weight("transformer.h.1.mlp.c_proj.weight"));
        assert!(!is_gpt2_conv1d_weight("transformer.h.1.mlp.c_proj.bias"));
    }

    #[test]
    fn transpose_swaps_rows_and_columns() {
        // [[0, 1, 2], [3, 4, 5]] -> [[0, 3], [1, 4], [2, 5]].
        let t = transpose(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], 2, 3);
        assert_eq!(t, vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    }

    #[test]
    fn unpermute_inverts_the_converter_permutation() {
        // Two heads of width 4, one column: HF rows 0..8.
        let hf: Vec<f32> = (0..8).map(|i| i as f32).collect();
        // llama.cpp permute: reshape(heads, 2, d/2).swapaxes(1, 2).
        let gguf = vec![0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0];
        assert_eq!(unpermute_rows(gguf, &[8, 1], 2, "q").unwrap(), hf);
        assert!(unpermute_rows(vec![0.0; 6], &[6, 1], 2, "q").is_err());
    }
}
