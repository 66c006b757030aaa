//! Where weights come from: a Hugging Face folder (`config.json` plus one
//! `model.safetensors` or a sharded `model.safetensors.index.json`) or a GGUF
//! file. Tensors are asked for by their canonical HF name
//! (`model.layers.3.self_attn.q_proj.weight`) and row-major HF shape, and come
//! back as `f32` after the shape has been checked, so every model is built by
//! one code path whatever the file format.
//!
//! GGUF specifics undone here (llama.cpp `convert_hf_to_gguf.py`):
//! - names: `blk.N.attn_q.weight` ↔ `model.layers.N.self_attn.q_proj.weight`, ...;
//! - dims are listed fastest-first, so GGUF `[in, out]` is row-major `[out, in]`;
//! - Llama Q/K rows are permuted for llama.cpp's interleaved RoPE
//!   (`LlamaModel.permute`); [`WeightSource::tensor`] restores HF order so the
//!   HF rotate-half RoPE applies and both formats give identical modules;
//! - Gemma RMSNorm gains are stored as `1 + w` (HF stores `w`): see
//!   [`WeightSource::norm_gain`];
//! - GPT-2's `Conv1D` weights (`[in, out]` in HF checkpoints) are transposed
//!   to `[out, in]` by the converter (`GPT2Model.modify_tensors`); they are
//!   transposed back, so a GPT-2 GGUF tensor has its HF shape too.

use std::path::Path;

use burn::tensor::{Tensor, TensorData};

use crate::backend::ModelBackend;
use crate::error::ModelError;
use crate::gguf::GgufFile;
use crate::layers::{Linear, RmsNorm};
#[cfg(feature = "flex")]
use crate::plan::DecodeProducts;
use crate::plan::ProductPlan;
use crate::safetensors::{SafetensorsError, SafetensorsFile, ShardedSafetensors};

mod gguf_layout;

pub use gguf_layout::gguf_name;
#[cfg(feature = "flex")]
use gguf_layout::unpermuted_order;
use gguf_layout::{is_gpt2_conv1d_weight, transpose, unpermute_rows};

/// A checkpoint's tensors by canonical (HF) name.
#[derive(Debug)]
pub enum WeightSource {
    /// One `model.safetensors`.
    Safetensors(SafetensorsFile),
    /// A sharded checkpoint (`model.safetensors.index.json`).
    Sharded(ShardedSafetensors),
    /// A GGUF file and the facts needed to undo llama.cpp's conversions.
    Gguf {
        /// The parsed file.
        file: GgufFile,
        /// `general.architecture`.
        arch: String,
        /// Query heads (for the Q permutation).
        num_heads: usize,
        /// Key/value heads (for the K permutation).
        num_kv_heads: usize,
        /// Restore HF row order of Llama Q/K (default); when false the rows
        /// stay in llama.cpp's order, for a model using
        /// [`crate::layers::RopeStyle::Interleaved`].
        undo_qk_permutation: bool,
    },
}

impl WeightSource {
    /// The safetensors weights of the HF folder `dir`: `model.safetensors`, or
    /// the shards listed by `model.safetensors.index.json`.
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<Self, ModelError> {
        let dir = dir.as_ref();
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        if single.is_file() {
            Ok(Self::Safetensors(SafetensorsFile::open(single)?))
        } else if index.is_file() {
            Ok(Self::Sharded(ShardedSafetensors::open(index)?))
        } else {
            Err(ModelError::Io {
                path: dir.display().to_string(),
                message: "neither model.safetensors nor model.safetensors.index.json found".into(),
            })
        }
    }

    /// The weights of a parsed GGUF file (head counts read from its metadata).
    pub fn from_gguf(file: GgufFile) -> Result<Self, ModelError> {
        let arch = crate::config_fields::gguf_str(&file, "general.architecture")?.to_string();
        let num_heads =
            crate::config_fields::gguf_usize(&file, &format!("{arch}.attention.head_count"))?;
        let num_kv_heads = crate::config_fields::gguf_usize_or(
            &file,
            &format!("{arch}.attention.head_count_kv"),
            num_heads,
        )?;
        Ok(Self::Gguf {
            file,
            arch,
            num_heads,
            num_kv_heads,
            undo_qk_permutation: true,
        })
    }

    /// Keeps a GGUF file's Llama Q/K rows in llama.cpp's permuted order (no
    /// effect on other sources): the model must then use
    /// [`crate::layers::RopeStyle::Interleaved`], which is mathematically the
    /// same network.
    pub fn keep_gguf_qk_permutation(mut self) -> Self {
        if let Self::Gguf {
            undo_qk_permutation,
            ..
        } = &mut self
        {
            *undo_qk_permutation = false;
        }
        self
    }

    /// Whether the checkpoint holds tensor `name` (canonical HF name).
    pub fn contains(&self, name: &str) -> bool {
        match self {
            Self::Safetensors(f) => f.info(name).is_ok(),
            Self::Sharded(s) => s.shard_of(name).is_ok(),
            Self::Gguf { file, arch, .. } => {
                gguf_name(arch, name).is_some_and(|g| file.tensor_info(&g).is_some())
            }
        }
    }

    /// Whether the weights come from a GGUF file.
    pub fn is_gguf(&self) -> bool {
        matches!(self, Self::Gguf { .. })
    }

    /// Tensor `name` as row-major `f32` after checking it has `shape`
    /// (HF layout) and only finite values.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        let (values, found) = match self {
            Self::Safetensors(f) => f.tensor_f32(name).map_err(|e| missing(e, name))?,
            Self::Sharded(s) => s.tensor_f32(name).map_err(|e| missing(e, name))?,
            Self::Gguf {
                file,
                arch,
                num_heads,
                num_kv_heads,
                undo_qk_permutation,
                ..
            } => {
                let gname = gguf_name(arch, name)
                    .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
                let info = file
                    .tensor_info(&gname)
                    .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
                let mut found: Vec<usize> = info.dims.iter().rev().map(|&d| d as usize).collect();
                let conv1d = arch == "gpt2" && is_gpt2_conv1d_weight(name) && found.len() == 2;
                if conv1d {
                    // Stored `[out, in]`: report and check it in HF's `[in, out]`.
                    found.reverse();
                }
                if found != shape {
                    return Err(shape_mismatch(name, shape, &found));
                }
                let mut values = file.tensor_f32(&gname)?;
                if conv1d {
                    values = transpose(&values, shape[1], shape[0]);
                }
                if arch == "llama" && *undo_qk_permutation {
                    if name.ends_with("self_attn.q_proj.weight")
                        || name.ends_with("self_attn.q_proj.bias")
                    {
                        values = unpermute_rows(values, shape, *num_heads, name)?;
                    } else if name.ends_with("self_attn.k_proj.weight")
                        || name.ends_with("self_attn.k_proj.bias")
                    {
                        values = unpermute_rows(values, shape, *num_kv_heads, name)?;
                    }
                }
                (values, found)
            }
        };
        if found != shape {
            return Err(shape_mismatch(name, shape, &found));
        }
        if values.iter().any(|v| !v.is_finite()) {
            return Err(ModelError::NonFiniteWeight(name.to_string()));
        }
        Ok(values)
    }

    /// The effective gain `g` of an RMSNorm (`y = x̂ · g`), `[dim]`.
    ///
    /// With `one_plus` (Gemma's `(1 + w)` norms) an HF checkpoint's `w` is
    /// turned into `1 + w` in f32, exactly as HF's forward computes it, while a
    /// GGUF file already stores `1 + w` (llama.cpp adds it at conversion) and
    /// is returned unchanged.
    pub fn norm_gain(
        &self,
        name: &str,
        dim: usize,
        one_plus: bool,
    ) -> Result<Vec<f32>, ModelError> {
        let mut w = self.tensor(name, &[dim])?;
        if one_plus && !self.is_gguf() {
            w.iter_mut().for_each(|v| *v += 1.0);
        }
        Ok(w)
    }
}

fn shape_mismatch(name: &str, expected: &[usize], found: &[usize]) -> ModelError {
    ModelError::ShapeMismatch {
        name: name.to_string(),
        expected: expected.to_vec(),
        found: found.to_vec(),
    }
}

fn missing(e: SafetensorsError, name: &str) -> ModelError {
    match e {
        SafetensorsError::MissingTensor(_) => ModelError::MissingTensor(name.to_string()),
        other => other.into(),
    }
}

/// Typed tensor builders on top of [`WeightSource::tensor`].
impl WeightSource {
    /// A 1-D tensor `[n]`.
    pub fn tensor1<B: ModelBackend>(
        &self,
        name: &str,
        n: usize,
        device: &B::Device,
    ) -> Result<Tensor<B, 1>, ModelError> {
        let v = self.tensor(name, &[n])?;
        Ok(Tensor::from_data(TensorData::new(v, [n]), device))
    }

    /// A 2-D tensor `[rows, cols]`.
    pub fn tensor2<B: ModelBackend>(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        device: &B::Device,
    ) -> Result<Tensor<B, 2>, ModelError> {
        let v = self.tensor(name, &[rows, cols])?;
        let t = Tensor::from_data(TensorData::new(v, [rows, cols]), device);
        // On a device backend the upload is only queued, its data held in a
        // staging copy until the queue runs. Waiting for each weight frees
        // its staging copy before the next is made, instead of letting the
        // copies pile up until the queue runs, which raised the load's peak
        // memory and made the run's peak vary from run to run. Where
        // tensors live in host memory (burn-flex) the upload is done and
        // the wait returns at once.
        B::sync(device).map_err(|e| ModelError::Device(format!("uploading {name}: {e:?}")))?;
        Ok(t)
    }

    /// The linear layer `{prefix}.weight` (`[out, in]`) with `{prefix}.bias`
    /// if `bias`, computing its products as `products` says: where that
    /// plan uses the CPU kernels, a GGUF Q4_1/Q8_0 weight is kept in its
    /// blocks too, in the form [`ProductPlan::decode_products`] asks for.
    pub fn linear<B: ModelBackend>(
        &self,
        prefix: &str,
        (in_features, out_features): (usize, usize),
        bias: bool,
        products: ProductPlan,
        device: &B::Device,
    ) -> Result<Linear<B>, ModelError> {
        let w = self.tensor2(
            &format!("{prefix}.weight"),
            out_features,
            in_features,
            device,
        )?;
        let b = if bias {
            Some(self.tensor1(&format!("{prefix}.bias"), out_features, device)?)
        } else {
            None
        };
        let linear = Linear::new(w, b).with_product_plan(products);
        // Only the CPU kernels read the blocks: elsewhere reading them would
        // be a transient copy of every weight for nothing.
        #[cfg(feature = "flex")]
        if products.cpu_kernels
            && let Some(q) =
                self.quantized(&format!("{prefix}.weight"), out_features, in_features)?
        {
            return Ok(decode_form(linear.with_quantized(q), products));
        }
        Ok(linear)
    }

    /// A GPT-2 `Conv1D` — `{prefix}.weight` in its HF shape `[in, out]`
    /// (the transpose of `nn.Linear`'s) and `{prefix}.bias` `[out]` — as a
    /// linear layer: the weight is transposed to `[out, in]` once, here at
    /// load, so that its products take the kernels every other projection
    /// takes, as `products` says. llama.cpp's converter stores a `Conv1D`
    /// `[out, in]` already, so a GGUF Q4_1/Q8_0 one is kept in its blocks
    /// too where the plan uses the CPU kernels, as [`WeightSource::linear`]
    /// keeps them.
    pub fn conv1d<B: ModelBackend>(
        &self,
        prefix: &str,
        (in_features, out_features): (usize, usize),
        products: ProductPlan,
        device: &B::Device,
    ) -> Result<Linear<B>, ModelError> {
        let name = format!("{prefix}.weight");
        let in_out = self.tensor(&name, &[in_features, out_features])?;
        let out_in = transpose(&in_out, in_features, out_features);
        drop(in_out);
        let w = Tensor::from_data(TensorData::new(out_in, [out_features, in_features]), device);
        B::sync(device).map_err(|e| ModelError::Device(format!("uploading {name}: {e:?}")))?;
        let b = self.tensor1(&format!("{prefix}.bias"), out_features, device)?;
        let linear = Linear::new(w, Some(b)).with_product_plan(products);
        #[cfg(feature = "flex")]
        if products.cpu_kernels
            && let Some(q) = self.quantized(&name, out_features, in_features)?
        {
            return Ok(decode_form(linear.with_quantized(q), products));
        }
        Ok(linear)
    }

    /// A head tied to the token embedding `embed_tokens` (`[vocab, hidden]`),
    /// computing its products as `products` says; where that plan uses the
    /// CPU kernels, it reads the embedding's GGUF blocks when decoding.
    pub fn tied_head<B: ModelBackend>(
        &self,
        embed_tokens: &Tensor<B, 2>,
        products: ProductPlan,
    ) -> Result<Linear<B>, ModelError> {
        let head = Linear::new(embed_tokens.clone(), None).with_product_plan(products);
        #[cfg(feature = "flex")]
        if products.cpu_kernels {
            let [vocab, hidden] = embed_tokens.dims();
            if let Some(q) = self.quantized("model.embed_tokens.weight", vocab, hidden)? {
                return Ok(decode_form(head.with_quantized(q), products));
            }
        }
        Ok(head)
    }

    /// Tensor `name` (`[out, in]`, HF layout) in its GGUF blocks, for
    /// [`Linear::with_quantized`], or `None` where it is not a GGUF Q4_1/Q8_0
    /// tensor of that shape (then the f32 path alone serves it). llama.cpp's
    /// q/k row permutation is undone on whole rows of blocks, as
    /// [`WeightSource::tensor`] undoes it on f32 rows.
    #[cfg(feature = "flex")]
    pub fn quantized(
        &self,
        name: &str,
        out: usize,
        inp: usize,
    ) -> Result<Option<crate::cpu::BlockWeight>, ModelError> {
        let Self::Gguf {
            file,
            arch,
            num_heads,
            num_kv_heads,
            undo_qk_permutation,
            ..
        } = self
        else {
            return Ok(None);
        };
        let Some(gname) = gguf_name(arch, name) else {
            return Ok(None);
        };
        let Some(info) = file.tensor_info(&gname) else {
            return Ok(None);
        };
        let dims: Vec<usize> = info.dims.iter().rev().map(|&d| d as usize).collect();
        if dims != [out, inp] {
            return Ok(None);
        }
        let Some(q) = crate::cpu::BlockWeight::from_ggml(
            info.ggml_type,
            &file.tensor_bytes(&gname)?,
            out,
            inp,
        )?
        else {
            return Ok(None);
        };
        let heads = if arch == "llama" && *undo_qk_permutation {
            if name.ends_with("self_attn.q_proj.weight") {
                Some(*num_heads)
            } else if name.ends_with("self_attn.k_proj.weight") {
                Some(*num_kv_heads)
            } else {
                None
            }
        } else {
            None
        };
        Ok(Some(match heads {
            Some(h) => q.permute_rows(&unpermuted_order(out, h, name)?),
            None => q,
        }))
    }

    /// The RMSNorm `name` (see [`WeightSource::norm_gain`] for `one_plus`).
    pub fn rms_norm<B: ModelBackend>(
        &self,
        name: &str,
        dim: usize,
        eps: f64,
        one_plus: bool,
        device: &B::Device,
    ) -> Result<RmsNorm<B>, ModelError> {
        let g = self.norm_gain(name, dim, one_plus)?;
        Ok(RmsNorm::new(
            Tensor::from_data(TensorData::new(g, [dim]), device),
            eps,
        ))
    }
}

/// `linear` with its quantised copy in the form `products` asks for.
#[cfg(feature = "flex")]
fn decode_form<B: ModelBackend>(linear: Linear<B>, products: ProductPlan) -> Linear<B> {
    match products.decode_products {
        DecodeProducts::F32Activations => linear,
        DecodeProducts::Int8Activations => linear.with_int8_activations(),
    }
}
