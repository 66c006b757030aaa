//! Reading and writing adapters in PEFT's format: a folder with
//! `adapter_config.json` and `adapter_model.safetensors`, tensors named
//! `base_model.model.<module path>.lora_A.weight` (`[r, in]`) and
//! `.lora_B.weight` (`[out, r]`) — checked against a save by peft 0.21.2
//! (`tests/fixtures/peft/make_peft.py`).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use burn::tensor::{Tensor, backend::Backend};
use privmix_models::Site;
use privmix_models::safetensors::SafetensorsFile;
use safetensors::{Dtype, tensor::TensorView};

use super::adapter::{LoraAdapter, check_site};
use super::config::LoraConfig;
use super::error::LoraError;
use super::sites::{BaseShapes, module_path, parse_module_path};

/// The configuration file of a PEFT adapter folder.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
/// The weights file of a PEFT adapter folder.
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
const PREFIX: &str = "base_model.model.";

/// A site and the names of its `lora_A` and `lora_B` tensors, as found.
type FactorNames = (Site, Option<String>, Option<String>);

/// `(site, is_a)` of a PEFT tensor name.
fn parse_tensor_name(name: &str) -> Option<(Site, bool)> {
    let rest = name.strip_prefix(PREFIX)?;
    let (path, is_a) = if let Some(p) = rest.strip_suffix(".lora_A.weight") {
        (p, true)
    } else {
        (rest.strip_suffix(".lora_B.weight")?, false)
    };
    Some((parse_module_path(path)?, is_a))
}

fn factor_name(site: Site, a: bool) -> String {
    let path = module_path(site).unwrap_or_default();
    format!("{PREFIX}{path}.lora_{}.weight", if a { "A" } else { "B" })
}

/// The transpose of row-major `a: [rows, cols]`, row-major `[cols, rows]`
/// (in 32 × 32 tiles, so both sides stay in cache on large weights).
pub(crate) fn transpose(a: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    const TILE: usize = 32;
    let mut t = vec![0.0f32; a.len()];
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    t[c * rows + r] = a[r * cols + c];
                }
            }
        }
    }
    t
}

impl<B: Backend> LoraAdapter<B> {
    /// Loads a PEFT LoRA adapter folder for the base model `base`. Typed
    /// errors: [`LoraError::MissingFile`], an unsupported or malformed config,
    /// unknown tensor names, a factor without its partner, a rank other than
    /// `r`, a site or width the base model lacks (an adapter for another base
    /// model), non-finite values, no factors at all.
    pub fn load_peft(
        dir: impl AsRef<Path>,
        base: &BaseShapes,
        device: &B::Device,
    ) -> Result<Self, LoraError> {
        let dir = dir.as_ref();
        let config_path = dir.join(ADAPTER_CONFIG);
        let weights_path = dir.join(ADAPTER_WEIGHTS);
        for p in [&config_path, &weights_path] {
            if !p.is_file() {
                return Err(LoraError::MissingFile(p.display().to_string()));
            }
        }
        let text =
            std::fs::read_to_string(&config_path).map_err(|e| LoraError::io(&config_path, &e))?;
        let label = config_path.display().to_string();
        let doc = serde_json::from_str(&text).map_err(|e| LoraError::ConfigJson {
            path: label.clone(),
            message: e.to_string(),
        })?;
        let config = LoraConfig::from_json(&doc, &label)?;
        let file = SafetensorsFile::open(&weights_path)?;

        let mut pairs: BTreeMap<(usize, usize), FactorNames> = BTreeMap::new();
        for name in file.names() {
            let (site, is_a) =
                parse_tensor_name(&name).ok_or_else(|| LoraError::UnknownTensor(name.clone()))?;
            let e = pairs
                .entry(super::sites::site_order(&site))
                .or_insert((site, None, None));
            if is_a {
                e.1 = Some(name)
            } else {
                e.2 = Some(name)
            }
        }
        if pairs.is_empty() {
            return Err(LoraError::EmptyAdapter);
        }
        let mut factors = Vec::with_capacity(pairs.len());
        for (site, a_name, b_name) in pairs.into_values() {
            let path = module_path(site).unwrap_or_default();
            let a_name = a_name.ok_or_else(|| LoraError::MissingFactor {
                site: path.clone(),
                factor: "lora_A",
            })?;
            let b_name = b_name.ok_or(LoraError::MissingFactor {
                site: path,
                factor: "lora_B",
            })?;
            let (a, a_shape) = file.tensor_f32(&a_name)?;
            let (b, b_shape) = file.tensor_f32(&b_name)?;
            for (n, s) in [(&a_name, &a_shape), (&b_name, &b_shape)] {
                if s.len() != 2 {
                    return Err(LoraError::ShapeMismatch {
                        tensor: n.clone(),
                        expected: vec![0, 0],
                        found: s.clone(),
                    });
                }
            }
            // PEFT: lora_A.weight is [r, in], lora_B.weight is [out, r].
            let (r_a, i) = (a_shape[0], a_shape[1]);
            let (o, r_b) = (b_shape[0], b_shape[1]);
            if r_a != config.r {
                return Err(LoraError::RankMismatch {
                    tensor: a_name,
                    expected: config.r,
                    found: r_a,
                });
            }
            check_site(&config, base, site, &b_name, (i, r_a), (r_b, o))?;
            for (n, v) in [(&a_name, &a), (&b_name, &b)] {
                if v.iter().any(|x| !x.is_finite()) {
                    return Err(LoraError::NonFinite(n.clone()));
                }
            }
            factors.push((site, transpose(&a, r_a, i), transpose(&b, o, r_b)));
        }
        Self::from_host(config, factors, base, device)
    }

    /// Writes the adapter as a PEFT folder (created if absent), f32 tensors,
    /// loadable by `peft.PeftModel.from_pretrained` (checked by
    /// `tests/fixtures/peft/check_ours.py`).
    pub fn save_peft(&self, dir: impl AsRef<Path>) -> Result<(), LoraError> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|e| LoraError::io(dir, &e))?;
        let mut buffers: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
        for site in self.sites() {
            let f = &self.factors(site).expect("listed site");
            for (is_a, t) in [(true, f.a.clone()), (false, f.b.clone())] {
                // Stored transposed: A [in, r] -> [r, in]; B [r, out] -> [out, r].
                let t: Tensor<B, 2> = t.transpose();
                let shape = t.dims().to_vec();
                let values = t
                    .into_data()
                    .convert::<f32>()
                    .to_vec::<f32>()
                    .map_err(|e| LoraError::bad_config("factors", format!("{e:?}")))?;
                let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                buffers.push((factor_name(site, is_a), shape, bytes));
            }
        }
        let views = buffers
            .iter()
            .map(|(n, s, b)| {
                TensorView::new(Dtype::F32, s.clone(), b)
                    .map(|v| (n.clone(), v))
                    .map_err(|e| LoraError::bad_config("factors", e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let weights = dir.join(ADAPTER_WEIGHTS);
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        safetensors::serialize_to_file(views, Some(meta), &weights).map_err(|e| LoraError::Io {
            path: weights.display().to_string(),
            message: e.to_string(),
        })?;
        let config = dir.join(ADAPTER_CONFIG);
        let text = serde_json::to_string_pretty(&self.config().to_json())
            .map_err(|e| LoraError::bad_config("config", e.to_string()))?;
        std::fs::write(&config, text).map_err(|e| LoraError::io(&config, &e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use privmix_models::Projection;

    #[test]
    fn tensor_names() {
        let site = Site {
            layer: 7,
            module: Projection::Down,
        };
        let a = factor_name(site, true);
        assert_eq!(
            a,
            "base_model.model.model.layers.7.mlp.down_proj.lora_A.weight"
        );
        assert_eq!(parse_tensor_name(&a), Some((site, true)));
        assert_eq!(
            parse_tensor_name(&factor_name(site, false)),
            Some((site, false))
        );
        assert_eq!(
            parse_tensor_name(
                "base_model.model.model.layers.7.mlp.down_proj.lora_A.default.weight"
            ),
            None
        );
        assert_eq!(
            transpose(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3),
            [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
        );
    }

    #[test]
    fn transpose_moves_every_entry_across_tile_edges() {
        // 37 × 70 crosses the 32-wide tiles' edges both ways.
        let (rows, cols) = (37, 70);
        let a: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
        let t = transpose(&a, rows, cols);
        for r in 0..rows {
            for c in 0..cols {
                assert_eq!(t[c * rows + r], a[r * cols + c], "({r}, {c})");
            }
        }
        assert_eq!(transpose(&t, cols, rows), a);
    }
}
