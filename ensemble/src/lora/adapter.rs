//! `LoraAdapter`: one fine-tuned member's low-rank updates, applied through
//! the models crate's [`LinearDelta`] hook.

use std::collections::HashMap;

use burn::tensor::{Tensor, TensorData, backend::Backend};
use privmix_models::{LinearDelta, Site};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rand_distr::{Distribution, Normal};

use super::config::LoraConfig;
use super::error::LoraError;
use super::sites::{BaseShapes, module_name, module_path, site_order};

/// The two factors of one projection's update, in the orientation of the
/// forward: `A: [in, r]`, `B: [r, out]` (PEFT stores their transposes,
/// `lora_A.weight: [r, in]` and `lora_B.weight: [out, r]`).
#[derive(Debug, Clone)]
pub struct LoraFactors<B: Backend> {
    /// Down-projection `A`, `[in, r]`.
    pub a: Tensor<B, 2>,
    /// Up-projection `B`, `[r, out]`.
    pub b: Tensor<B, 2>,
}

/// A LoRA adapter (Hu et al. 2022): for every targeted projection `y = x W`
/// of the base model, `y = x W + scale · (x A) B` with rank-`r` factors and
/// `scale` from [`LoraConfig::scale`]. Equivalent to the merged weight
/// `W + scale · A B` (tested in `tests/integration/merged.rs`).
///
/// Construction checks every factor against the base model's
/// [`BaseShapes`], so an adapter can only exist for a base it fits.
#[derive(Debug, Clone)]
pub struct LoraAdapter<B: Backend> {
    config: LoraConfig,
    factors: HashMap<Site, LoraFactors<B>>,
}

impl<B: Backend> LoraAdapter<B> {
    /// An adapter from device factors, checked against `config` and `base`:
    /// every site exists in the base ([`LoraError::SiteNotInBase`]), is a
    /// targeted module ([`LoraError::UntargetedModule`]), has rank `config.r`
    /// ([`LoraError::RankMismatch`]) and the base's widths
    /// ([`LoraError::ShapeMismatch`]); at least one site ([`LoraError::EmptyAdapter`]).
    pub fn new(
        config: LoraConfig,
        factors: Vec<(Site, LoraFactors<B>)>,
        base: &BaseShapes,
    ) -> Result<Self, LoraError> {
        config.validate()?;
        if factors.is_empty() {
            return Err(LoraError::EmptyAdapter);
        }
        let mut map = HashMap::with_capacity(factors.len());
        for (site, f) in factors {
            let name = module_path(site).unwrap_or_else(|| format!("{site:?}"));
            let [a_in, a_r] = f.a.dims();
            let [b_r, b_out] = f.b.dims();
            check_site(&config, base, site, &name, (a_in, a_r), (b_r, b_out))?;
            if map.insert(site, f).is_some() {
                return Err(LoraError::bad_config(
                    "factors",
                    format!("{name} given twice"),
                ));
            }
        }
        Ok(Self {
            config,
            factors: map,
        })
    }

    /// An adapter from host factors (row-major `A: [in, r]`, `B: [r, out]`
    /// for each site), checked as in [`LoraAdapter::new`] and for finite values.
    pub fn from_host(
        config: LoraConfig,
        factors: Vec<(Site, Vec<f32>, Vec<f32>)>,
        base: &BaseShapes,
        device: &B::Device,
    ) -> Result<Self, LoraError> {
        let r = config.r;
        let mut out = Vec::with_capacity(factors.len());
        for (site, a, b) in factors {
            let name = module_path(site).unwrap_or_else(|| format!("{site:?}"));
            let (i, o) = base
                .shape(site)
                .ok_or_else(|| LoraError::SiteNotInBase(name.clone()))?;
            if a.len() != i * r || b.len() != r * o {
                return Err(LoraError::ShapeMismatch {
                    tensor: name,
                    expected: vec![i * r, r * o],
                    found: vec![a.len(), b.len()],
                });
            }
            if a.iter().chain(&b).any(|v| !v.is_finite()) {
                return Err(LoraError::NonFinite(name));
            }
            let a = Tensor::from_data(TensorData::new(a, [i, r]), device);
            let b = Tensor::from_data(TensorData::new(b, [r, o]), device);
            out.push((site, LoraFactors { a, b }));
        }
        Self::new(config, out, base)
    }

    /// An adapter with every factor entry drawn i.i.d. `N(0, std²)` from a
    /// ChaCha20 stream seeded by `seed`, on every site of `base` whose module
    /// `config` targets (for tests and benchmarks; a trained adapter comes
    /// from [`LoraAdapter::load_peft`]).
    pub fn random(
        config: LoraConfig,
        base: &BaseShapes,
        std: f32,
        seed: u64,
        device: &B::Device,
    ) -> Result<Self, LoraError> {
        let normal =
            Normal::new(0.0f32, std).map_err(|e| LoraError::bad_config("std", format!("{e}")))?;
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let r = config.r;
        let mut factors = Vec::new();
        for site in base.sites() {
            if !module_name(site.module).is_some_and(|m| config.targets(m)) {
                continue;
            }
            let (i, o) = base.shape(site).unwrap_or_default();
            let a = (0..i * r).map(|_| normal.sample(&mut rng)).collect();
            let b = (0..r * o).map(|_| normal.sample(&mut rng)).collect();
            factors.push((site, a, b));
        }
        Self::from_host(config, factors, base, device)
    }

    /// The configuration.
    pub fn config(&self) -> &LoraConfig {
        &self.config
    }

    /// The multiplier of `x A B`.
    pub fn scale(&self) -> f64 {
        self.config.scale()
    }

    /// The adapted sites, in layer then projection order.
    pub fn sites(&self) -> Vec<Site> {
        let mut s: Vec<Site> = self.factors.keys().copied().collect();
        s.sort_by_key(site_order);
        s
    }

    /// The factors at `site`, if adapted.
    pub fn factors(&self, site: Site) -> Option<&LoraFactors<B>> {
        self.factors.get(&site)
    }

    /// The update of the `[in, out]` weight at `site`, `scale · A B`: adding
    /// it to `Wᵀ` gives the merged model.
    pub fn delta_weight(&self, site: Site) -> Option<Tensor<B, 2>> {
        let f = self.factors.get(&site)?;
        Some(f.a.clone().matmul(f.b.clone()).mul_scalar(self.scale()))
    }

    /// Number of adapter parameters (`r · (in + out)` per site).
    pub fn num_parameters(&self) -> usize {
        self.factors
            .values()
            .map(|f| f.a.dims().iter().product::<usize>() + f.b.dims().iter().product::<usize>())
            .sum()
    }
}

/// Checks one site's factor shapes (`a: (in, r)`, `b: (r, out)`).
pub(crate) fn check_site(
    config: &LoraConfig,
    base: &BaseShapes,
    site: Site,
    name: &str,
    a: (usize, usize),
    b: (usize, usize),
) -> Result<(), LoraError> {
    let (i, o) = base
        .shape(site)
        .ok_or_else(|| LoraError::SiteNotInBase(name.to_string()))?;
    let module = module_name(site.module).unwrap_or("?");
    if !config.targets(module) {
        return Err(LoraError::UntargetedModule {
            tensor: name.to_string(),
            module: module.to_string(),
        });
    }
    for found in [a.1, b.0] {
        if found != config.r {
            return Err(LoraError::RankMismatch {
                tensor: name.to_string(),
                expected: config.r,
                found,
            });
        }
    }
    if a.0 != i || b.1 != o {
        return Err(LoraError::ShapeMismatch {
            tensor: name.to_string(),
            expected: vec![i, o],
            found: vec![a.0, b.1],
        });
    }
    Ok(())
}

impl<B: Backend> LinearDelta<B> for LoraAdapter<B> {
    fn delta(&self, site: Site, x: &Tensor<B, 3>) -> Option<Tensor<B, 3>> {
        let f = self.factors.get(&site)?;
        let [b, s, i] = x.dims();
        let out = f.b.dims()[1];
        let low = x.clone().reshape([b * s, i]).matmul(f.a.clone());
        let y = low.matmul(f.b.clone()).mul_scalar(self.scale());
        Some(y.reshape([b, s, out]))
    }
}
