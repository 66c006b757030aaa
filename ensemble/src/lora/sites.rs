//! The projections of a base model a LoRA adapter may target, their widths,
//! and their names in PEFT checkpoints.

use std::collections::HashMap;

use burn::tensor::backend::Backend;
use privmix_models::{Gemma, GemmaConfig, Llama, LlamaConfig, Model, Projection, Site};

use super::error::LoraError;

/// PEFT's module name of a projection (the name `target_modules` lists).
pub fn module_name(p: Projection) -> Option<&'static str> {
    Some(match p {
        Projection::Q => "q_proj",
        Projection::K => "k_proj",
        Projection::V => "v_proj",
        Projection::O => "o_proj",
        Projection::Gate => "gate_proj",
        Projection::Up => "up_proj",
        Projection::Down => "down_proj",
        Projection::CAttn => "c_attn",
        Projection::CProj | Projection::MlpCProj => "c_proj",
        Projection::CFc => "c_fc",
        _ => return None,
    })
}

/// The module path of `site` inside the HF model (`model.layers.3.self_attn.q_proj`,
/// `transformer.h.0.mlp.c_fc`), which PEFT prefixes with `base_model.model.`.
pub fn module_path(site: Site) -> Option<String> {
    let i = site.layer;
    let name = module_name(site.module)?;
    Some(match site.module {
        Projection::Q | Projection::K | Projection::V | Projection::O => {
            format!("model.layers.{i}.self_attn.{name}")
        }
        Projection::Gate | Projection::Up | Projection::Down => {
            format!("model.layers.{i}.mlp.{name}")
        }
        Projection::CAttn | Projection::CProj => format!("transformer.h.{i}.attn.{name}"),
        _ => format!("transformer.h.{i}.mlp.{name}"),
    })
}

/// The site a module path names (the inverse of [`module_path()`]).
pub fn parse_module_path(path: &str) -> Option<Site> {
    let (layer, block, name) = if let Some(rest) = path.strip_prefix("model.layers.") {
        split3(rest)?
    } else {
        split3(path.strip_prefix("transformer.h.")?)?
    };
    let module = match (block, name) {
        ("self_attn", "q_proj") => Projection::Q,
        ("self_attn", "k_proj") => Projection::K,
        ("self_attn", "v_proj") => Projection::V,
        ("self_attn", "o_proj") => Projection::O,
        ("mlp", "gate_proj") => Projection::Gate,
        ("mlp", "up_proj") => Projection::Up,
        ("mlp", "down_proj") => Projection::Down,
        ("attn", "c_attn") => Projection::CAttn,
        ("attn", "c_proj") => Projection::CProj,
        ("mlp", "c_fc") => Projection::CFc,
        ("mlp", "c_proj") => Projection::MlpCProj,
        _ => return None,
    };
    let site = Site { layer, module };
    // Reject mismatched families such as `model.layers.0.attn.c_attn`.
    (module_path(site).as_deref() == Some(path)).then_some(site)
}

fn split3(rest: &str) -> Option<(usize, &str, &str)> {
    let mut it = rest.splitn(3, '.');
    let layer = it.next()?;
    if layer.is_empty() || !layer.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((layer.parse().ok()?, it.next()?, it.next()?))
}

/// A stable order of sites (layer, then projection), for saving.
pub fn site_order(site: &Site) -> (usize, usize) {
    let k = match site.module {
        Projection::Q => 0,
        Projection::K => 1,
        Projection::V => 2,
        Projection::O => 3,
        Projection::Gate => 4,
        Projection::Up => 5,
        Projection::Down => 6,
        Projection::CAttn => 7,
        Projection::CProj => 8,
        Projection::CFc => 9,
        Projection::MlpCProj => 10,
        _ => 11,
    };
    (site.layer, k)
}

/// Every adaptable projection of a base model with its `(in, out)` widths:
/// what an adapter is checked against before it is applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseShapes {
    num_layers: usize,
    shapes: HashMap<Site, (usize, usize)>,
}

impl BaseShapes {
    /// A Llama-style block (q/k/v/o, gate/up/down): residual width `hidden`,
    /// MLP width `intermediate`, query heads × head width `q_width`, key/value
    /// heads × head width `kv_width`. Gemma 1/2/3 share the layout.
    pub fn llama_style(
        num_layers: usize,
        hidden: usize,
        intermediate: usize,
        q_width: usize,
        kv_width: usize,
    ) -> Self {
        let mut shapes = HashMap::new();
        for layer in 0..num_layers {
            for (module, io) in [
                (Projection::Q, (hidden, q_width)),
                (Projection::K, (hidden, kv_width)),
                (Projection::V, (hidden, kv_width)),
                (Projection::O, (q_width, hidden)),
                (Projection::Gate, (hidden, intermediate)),
                (Projection::Up, (hidden, intermediate)),
                (Projection::Down, (intermediate, hidden)),
            ] {
                shapes.insert(Site { layer, module }, io);
            }
        }
        Self { num_layers, shapes }
    }

    /// The projections of a Llama model.
    pub fn from_llama(c: &LlamaConfig) -> Self {
        Self::llama_style(
            c.num_hidden_layers,
            c.hidden_size,
            c.intermediate_size,
            c.num_attention_heads * c.head_dim,
            c.num_key_value_heads * c.head_dim,
        )
    }

    /// The projections of a Gemma 1/2/3 model.
    pub fn from_gemma(c: &GemmaConfig) -> Self {
        Self::llama_style(
            c.num_hidden_layers,
            c.hidden_size,
            c.intermediate_size,
            c.num_attention_heads * c.head_dim,
            c.num_key_value_heads * c.head_dim,
        )
    }

    /// Number of decoder blocks.
    pub fn num_layers(&self) -> usize {
        self.num_layers
    }

    /// `(in, out)` of `site`, or `None` when the model has no such projection.
    pub fn shape(&self, site: Site) -> Option<(usize, usize)> {
        self.shapes.get(&site).copied()
    }

    /// Every site, in [`site_order`].
    pub fn sites(&self) -> Vec<Site> {
        let mut s: Vec<Site> = self.shapes.keys().copied().collect();
        s.sort_by_key(site_order);
        s
    }
}

/// A base model whose adaptable projections are known.
pub trait LoraBase {
    /// The model's projections and widths.
    fn base_shapes(&self) -> Result<BaseShapes, LoraError>;
}

impl<B: Backend> LoraBase for Llama<B> {
    fn base_shapes(&self) -> Result<BaseShapes, LoraError> {
        Ok(BaseShapes::from_llama(&self.config))
    }
}

impl<B: Backend> LoraBase for Gemma<B> {
    fn base_shapes(&self) -> Result<BaseShapes, LoraError> {
        Ok(BaseShapes::from_gemma(&self.config))
    }
}

impl<B: Backend> LoraBase for Model<B> {
    fn base_shapes(&self) -> Result<BaseShapes, LoraError> {
        match self {
            Model::Llama(m) => m.base_shapes(),
            Model::Gemma(m) => m.base_shapes(),
            #[allow(unreachable_patterns)]
            _ => Err(LoraError::UnsupportedBase(
                "no LoRA site table for this architecture".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_round_trip() {
        let shapes = BaseShapes::llama_style(3, 8, 16, 8, 4);
        for site in shapes.sites() {
            let p = module_path(site).unwrap();
            assert_eq!(parse_module_path(&p), Some(site), "{p}");
        }
        for module in [
            Projection::CAttn,
            Projection::CProj,
            Projection::CFc,
            Projection::MlpCProj,
        ] {
            let site = Site { layer: 11, module };
            assert_eq!(parse_module_path(&module_path(site).unwrap()), Some(site));
        }
        for bad in [
            "model.layers.x.self_attn.q_proj",
            "model.layers.0.attn.c_attn",
            "model.layers.0.self_attn.q_proj.extra",
            "lm_head",
            "model.layers.-1.mlp.up_proj",
        ] {
            assert_eq!(parse_module_path(bad), None, "{bad}");
        }
        assert_eq!(
            shapes.shape(Site {
                layer: 3,
                module: Projection::Q
            }),
            None
        );
        assert_eq!(
            shapes.shape(Site {
                layer: 2,
                module: Projection::Down
            }),
            Some((16, 8))
        );
    }
}
