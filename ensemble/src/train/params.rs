//! The trainable parameters of one LoRA adapter, on the host as one flat
//! `f32` vector (so that the optimizer, clipping, noise and checkpoints work
//! on plain slices), with the layout of every site's `A` and `B` in it.

use burn::tensor::backend::Backend;
use privmix_models::Site;
use privmix_models::runtime::to_vec;
use rand::Rng;

use super::error::TrainError;
use crate::lora::{BaseShapes, LoraAdapter, LoraConfig, module_name};

/// Where one site's factors lie in the flat vector: `A: [fan_in, r]` at
/// `a_offset`, `B: [r, fan_out]` at `b_offset`, both row-major.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SiteLayout {
    /// The projection.
    pub site: Site,
    /// Input width.
    pub fan_in: usize,
    /// Output width.
    pub fan_out: usize,
    /// Offset of `A`.
    pub a_offset: usize,
    /// Offset of `B`.
    pub b_offset: usize,
}

/// A LoRA adapter's factors as one flat host vector.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraParams {
    config: LoraConfig,
    layout: Vec<SiteLayout>,
    values: Vec<f32>,
}

impl LoraParams {
    /// The layout for every site of `base` that `config` targets, in the
    /// base's site order; and the total length.
    fn plan(config: &LoraConfig, base: &BaseShapes) -> (Vec<SiteLayout>, usize) {
        let r = config.r;
        let mut at = 0;
        let mut layout = Vec::new();
        for site in base.sites() {
            if !module_name(site.module).is_some_and(|m| config.targets(m)) {
                continue;
            }
            let (fan_in, fan_out) = base.shape(site).unwrap_or_default();
            layout.push(SiteLayout {
                site,
                fan_in,
                fan_out,
                a_offset: at,
                b_offset: at + fan_in * r,
            });
            at += r * (fan_in + fan_out);
        }
        (layout, at)
    }

    /// PEFT's default initialisation (`init_lora_weights=True`): `A` from
    /// Kaiming-uniform with `a = √5` over PEFT's `[r, in]` weight, i.e.
    /// `U(−1/√in, 1/√in)`, and `B = 0`, so the adapter starts as the
    /// identity update. Errors: a configuration that targets no site of `base`.
    pub fn init(
        config: &LoraConfig,
        base: &BaseShapes,
        rng: &mut impl Rng,
    ) -> Result<Self, TrainError> {
        config.validate()?;
        let (layout, len) = Self::plan(config, base);
        if layout.is_empty() {
            return Err(TrainError::bad(
                "target_modules",
                "no projection of the base model is targeted",
            ));
        }
        let mut values = vec![0.0f32; len];
        for l in &layout {
            let bound = 1.0 / (l.fan_in as f64).sqrt();
            for v in &mut values[l.a_offset..l.b_offset] {
                *v = rng.random_range(-bound..bound) as f32;
            }
        }
        Ok(Self {
            config: config.clone(),
            layout,
            values,
        })
    }

    /// The parameters of `adapter` (which must cover exactly the sites its
    /// configuration targets in `base`).
    pub fn from_adapter<B: Backend>(
        adapter: &LoraAdapter<B>,
        base: &BaseShapes,
    ) -> Result<Self, TrainError> {
        let config = adapter.config().clone();
        let (layout, len) = Self::plan(&config, base);
        if adapter.sites().len() != layout.len() {
            return Err(TrainError::bad(
                "adapter",
                format!(
                    "{} adapted sites, the configuration targets {}",
                    adapter.sites().len(),
                    layout.len()
                ),
            ));
        }
        let mut values = vec![0.0f32; len];
        for l in &layout {
            let f = adapter
                .factors(l.site)
                .ok_or_else(|| TrainError::bad("adapter", format!("no factors at {:?}", l.site)))?;
            let a = to_vec(f.a.clone())?;
            let b = to_vec(f.b.clone())?;
            values[l.a_offset..l.b_offset].copy_from_slice(&a);
            values[l.b_offset..l.b_offset + b.len()].copy_from_slice(&b);
        }
        Ok(Self {
            config,
            layout,
            values,
        })
    }

    /// The adapter on `device` (checked against `base`).
    pub fn to_adapter<B: Backend>(
        &self,
        base: &BaseShapes,
        device: &B::Device,
    ) -> Result<LoraAdapter<B>, TrainError> {
        let factors = self
            .layout
            .iter()
            .map(|l| {
                let (a, b) = self.factors(l);
                (l.site, a.to_vec(), b.to_vec())
            })
            .collect();
        Ok(LoraAdapter::from_host(
            self.config.clone(),
            factors,
            base,
            device,
        )?)
    }

    /// `(A, B)` of one site.
    pub fn factors(&self, l: &SiteLayout) -> (&[f32], &[f32]) {
        let r = self.config.r;
        (
            &self.values[l.a_offset..l.b_offset],
            &self.values[l.b_offset..l.b_offset + r * l.fan_out],
        )
    }

    /// The configuration.
    pub fn config(&self) -> &LoraConfig {
        &self.config
    }

    /// The sites and where their factors lie.
    pub fn layout(&self) -> &[SiteLayout] {
        &self.layout
    }

    /// All parameters.
    pub fn values(&self) -> &[f32] {
        &self.values
    }

    /// All parameters, mutable (the layout stays).
    pub fn values_mut(&mut self) -> &mut [f32] {
        &mut self.values
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Always false (an adapter has at least one site).
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}
