//! Many LoRA adapters over one base model, applied to the rows of one batch:
//! row `i` of the batch gets member `rows[i]`'s update, or none (the public
//! model).

use std::collections::HashMap;
use std::sync::Arc;

use burn::tensor::{Int, Tensor, TensorData, backend::Backend};
use privmix_models::plan::ExecutionPlan;
use privmix_models::runtime::to_vec;
use privmix_models::{LinearDelta, Site};

use crate::host_factors::{HostFactors, HostSite, add_shared};

use crate::error::EnsembleError;
use crate::lora::{BaseShapes, LoraAdapter, LoraConfig, LoraError, module_name, module_path};

/// How [`StackedAdapters`] holds the members' factors.
///
/// Each decode step reads every member's factors once (at N = 8, rank 4 on
/// all seven projections of SmolLM2, 39 MB in f32, against 96 MB of
/// quantised base weights), so their width is a cost of every step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FactorPrecision {
    /// As the adapters hold them (f32): the update is the adapter's own.
    #[default]
    F32,
    /// Each entry of `A`, and of `B` after the member's scale is folded in,
    /// rounded to the nearest f16 once, when the adapters are stacked; the
    /// update is then computed in f32 exactly as for [`FactorPrecision::F32`]
    /// over those values (widening an f16 is exact). Each entry moves by at
    /// most `2⁻¹¹·|x|` (normal range, `|x| ≥ 2⁻¹⁴`) or `2⁻²⁵` (below it);
    /// an entry beyond f16's range gives [`LoraError::HalfOverflow`]. With
    /// host-held factors (plain burn-flex) they are kept in f16, half the
    /// bytes to read per step; tensors keep the rounded values in f32.
    /// Adapters trained or saved in f16 lose nothing.
    F16,
}

impl FactorPrecision {
    /// `values` of factor `tensor` as this precision holds them: unchanged
    /// in f32, each rounded to the nearest f16 (and checked to be in its
    /// range) in f16.
    fn hold(self, tensor: impl Fn() -> String, values: Vec<f32>) -> Result<Vec<f32>, LoraError> {
        match self {
            FactorPrecision::F32 => Ok(values),
            FactorPrecision::F16 => values
                .into_iter()
                .map(|x| {
                    let h = half::f16::from_f32(x);
                    if h.is_finite() {
                        Ok(h.to_f32())
                    } else {
                        Err(LoraError::HalfOverflow {
                            tensor: tensor(),
                            value: x,
                        })
                    }
                })
                .collect(),
        }
    }
}

/// The factors of `M` adapters stacked per site — `A: [M + 1, in, r]` and
/// `B: [M + 1, r, out]` with each member's scale folded into its `B`, and a
/// last all-zero slot for rows without an adapter — so that one gather and
/// two batched matmuls apply a different adapter to every row.
///
/// Members of different ranks are padded with zero columns of `A` and zero
/// rows of `B` to the largest rank, which leaves `x A B` unchanged; a member
/// without a site gets zero factors there. So row `i`'s delta is exactly its
/// member's `scale · x A B` (up to f32 rounding of the folded scale).
///
/// Where the model's execution plan says so
/// ([`ExecutionPlan::lora_factors_in_host_memory`]: plain burn-flex with the
/// CPU kernels) the factors are kept in host memory instead
/// (`host_factors`), where the decode path adds them to the base projection
/// directly; the tensors are not kept there, so either form is held, never
/// both.
#[derive(Debug, Clone)]
pub struct StackedAdapters<B: Backend> {
    num_members: usize,
    rank: usize,
    sites: HashMap<Site, (Tensor<B, 3>, Tensor<B, 3>)>,
    host: Option<Arc<HostFactors>>,
}

impl<B: Backend> StackedAdapters<B> {
    /// Stacks `members` in f32, after checking each against `base` (an
    /// adapter for another base model gives [`LoraError::SiteNotInBase`] or
    /// [`LoraError::ShapeMismatch`]), held where the model's execution plan
    /// `plan` says (`model.plan()`).
    pub fn new(
        members: &[LoraAdapter<B>],
        base: &BaseShapes,
        plan: &ExecutionPlan,
        device: &B::Device,
    ) -> Result<Self, LoraError> {
        Self::with_precision(members, base, FactorPrecision::F32, plan, device)
    }

    /// [`StackedAdapters::new`] with the factors held as `precision` says.
    pub fn with_precision(
        members: &[LoraAdapter<B>],
        base: &BaseShapes,
        precision: FactorPrecision,
        plan: &ExecutionPlan,
        device: &B::Device,
    ) -> Result<Self, LoraError> {
        let rank = members.iter().map(|m| m.config().r).max().unwrap_or(0);
        let mut used: Vec<Site> = Vec::new();
        for m in members {
            for site in m.sites() {
                let name = module_path(site).unwrap_or_default();
                let (i, o) = base
                    .shape(site)
                    .ok_or_else(|| LoraError::SiteNotInBase(name.clone()))?;
                let f = m.factors(site).expect("listed site");
                let found = [f.a.dims()[0], f.b.dims()[1]];
                if found != [i, o] {
                    return Err(LoraError::ShapeMismatch {
                        tensor: name,
                        expected: vec![i, o],
                        found: found.to_vec(),
                    });
                }
                if !used.contains(&site) {
                    used.push(site);
                }
            }
        }
        let host = plan.lora_factors_in_host_memory();
        let mut sites = HashMap::with_capacity(used.len());
        let mut host_sites = HostFactors::with_capacity(used.len());
        for site in used {
            let (i, o) = base.shape(site).unwrap_or_default();
            let mut a_all = Vec::with_capacity(members.len() + 1);
            let mut b_all = Vec::with_capacity(members.len() + 1);
            let name = module_path(site).unwrap_or_default();
            for m in members {
                let (a, b) = match m.factors(site) {
                    Some(f) => {
                        let r = m.config().r;
                        let b = f.b.clone().mul_scalar(m.scale());
                        if r == rank {
                            (f.a.clone(), b)
                        } else {
                            let za = Tensor::zeros([i, rank - r], device);
                            let zb = Tensor::zeros([rank - r, o], device);
                            (
                                Tensor::cat(vec![f.a.clone(), za], 1),
                                Tensor::cat(vec![b, zb], 0),
                            )
                        }
                    }
                    None => (
                        Tensor::zeros([i, rank], device),
                        Tensor::zeros([rank, o], device),
                    ),
                };
                a_all.push(a);
                b_all.push(b);
            }
            if host {
                let mut factors = Vec::with_capacity(members.len());
                for (a, b) in a_all.into_iter().zip(b_all) {
                    factors.push((
                        precision.hold(|| format!("{name}.lora_A"), to_vec(a)?)?,
                        precision.hold(|| format!("{name}.lora_B (scaled)"), to_vec(b)?)?,
                    ));
                }
                let held = match precision {
                    FactorPrecision::F32 => HostSite::new(i, o, rank, &factors),
                    FactorPrecision::F16 => HostSite::new_f16(i, o, rank, &factors),
                };
                host_sites.insert(site, held);
                continue;
            }
            if precision != FactorPrecision::F32 {
                let held = |t: Tensor<B, 2>, tensor: &str| -> Result<Tensor<B, 2>, LoraError> {
                    let dims = t.dims();
                    let values = precision.hold(|| format!("{name}.{tensor}"), to_vec(t)?)?;
                    Ok(Tensor::from_data(TensorData::new(values, dims), device))
                };
                a_all = a_all
                    .into_iter()
                    .map(|a| held(a, "lora_A"))
                    .collect::<Result<_, _>>()?;
                b_all = b_all
                    .into_iter()
                    .map(|b| held(b, "lora_B (scaled)"))
                    .collect::<Result<_, _>>()?;
            }
            a_all.push(Tensor::zeros([i, rank], device));
            b_all.push(Tensor::zeros([rank, o], device));
            sites.insert(site, (Tensor::stack(a_all, 0), Tensor::stack(b_all, 0)));
        }
        Ok(Self {
            num_members: members.len(),
            rank,
            sites,
            host: host.then(|| Arc::new(host_sites)),
        })
    }

    /// Number of stacked members.
    pub fn num_members(&self) -> usize {
        self.num_members
    }

    /// The common (largest) rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Bytes of the stacked factors (the tensors' zero slot included).
    pub fn bytes(&self) -> usize {
        let host: usize = self
            .host
            .iter()
            .flat_map(|h| h.values())
            .map(HostSite::bytes)
            .sum();
        host + self
            .sites
            .values()
            .map(|(a, b)| {
                4 * (a.dims().iter().product::<usize>() + b.dims().iter().product::<usize>())
            })
            .sum::<usize>()
    }

    /// Bytes [`StackedAdapters::bytes`] reports for `members` adapters of
    /// `config` on every targeted site of `base` held in `precision`,
    /// without building them: `width · slots · r · Σ_sites (in + out)`, with
    /// `slots = members` and `width` 4 (f32) or 2 (f16) for host-held
    /// factors (`plan` holds them in host memory,
    /// [`ExecutionPlan::lora_factors_in_host_memory`]), and
    /// `slots = members + 1` (their zero slot) and `width = 4` for tensors.
    pub fn bytes_for(
        base: &BaseShapes,
        config: &LoraConfig,
        members: usize,
        precision: FactorPrecision,
        plan: &ExecutionPlan,
    ) -> usize {
        let per_rank: usize = base
            .sites()
            .into_iter()
            .filter(|s| module_name(s.module).is_some_and(|m| config.targets(m)))
            .map(|s| {
                let (i, o) = base.shape(s).unwrap_or_default();
                i + o
            })
            .sum();
        let (slots, width) = if !plan.lora_factors_in_host_memory() {
            (members + 1, 4)
        } else if precision == FactorPrecision::F16 {
            (members, 2)
        } else {
            (members, 4)
        };
        width * slots * config.r * per_rank
    }

    /// The per-row view: row `i` gets member `rows[i]`, `None` for no adapter.
    pub fn for_rows(&self, rows: &[Option<usize>]) -> Result<RowAdapters<B>, EnsembleError> {
        if let Some(&m) = rows.iter().flatten().find(|&&m| m >= self.num_members) {
            return Err(EnsembleError::MemberOutOfRange {
                member: m,
                members: self.num_members,
            });
        }
        if rows.iter().all(Option::is_none) {
            return Ok(RowAdapters::none());
        }
        if let Some(host) = &self.host {
            return Ok(RowAdapters {
                sites: HashMap::new(),
                host: Some((host.clone(), rows.to_vec())),
            });
        }
        let idx: Vec<i64> = rows
            .iter()
            .map(|r| r.unwrap_or(self.num_members) as i64)
            .collect();
        let mut sites = HashMap::with_capacity(self.sites.len());
        for (site, (a, b)) in &self.sites {
            let idx = Tensor::<B, 1, Int>::from_data(
                TensorData::new(idx.clone(), [rows.len()]),
                &a.device(),
            );
            sites.insert(
                *site,
                (a.clone().select(0, idx.clone()), b.clone().select(0, idx)),
            );
        }
        Ok(RowAdapters { sites, host: None })
    }
}

/// Stacked adapters gathered for one assignment of members to batch rows
/// (made by [`StackedAdapters::for_rows`]): per site `A: [rows, in, r]`,
/// `B: [rows, r, out]`. As a [`LinearDelta`] it returns `(x A) B` by two
/// batched matmuls, one member per row. A batch with another row count than
/// the assignment's is a caller error the runner never makes.
///
/// With host-held factors (plain burn-flex) it holds the factors and each
/// row's member instead, and computes the update in host memory.
#[derive(Debug, Clone)]
pub struct RowAdapters<B: Backend> {
    sites: HashMap<Site, (Tensor<B, 3>, Tensor<B, 3>)>,
    host: Option<(Arc<HostFactors>, Vec<Option<usize>>)>,
}

impl<B: Backend> RowAdapters<B> {
    /// No adapter on any row.
    pub(crate) fn none() -> Self {
        Self {
            sites: HashMap::new(),
            host: None,
        }
    }

    /// True when no row carries an adapter (the hook can be skipped).
    pub fn is_empty(&self) -> bool {
        self.sites.is_empty() && self.host.is_none()
    }
}

impl<B: Backend> LinearDelta<B> for RowAdapters<B> {
    fn delta(&self, site: Site, x: &Tensor<B, 3>) -> Option<Tensor<B, 3>> {
        if let Some((host, rows)) = &self.host {
            let h = host.get(&site)?;
            let [b, s, _] = x.dims();
            let xs = privmix_models::runtime::to_vec(x.clone()).expect("plain flex f32 data");
            let mut y = vec![0.0f32; b * s * h.out_features()];
            h.add(rows, &xs, &mut y);
            return Some(Tensor::from_data(
                TensorData::new(y, [b, s, h.out_features()]),
                &x.device(),
            ));
        }
        let (a, b) = self.sites.get(&site)?;
        Some(x.clone().matmul(a.clone()).matmul(b.clone()))
    }

    fn add_host(&self, site: Site, x: &[f32], _batch: usize, y: &mut [f32]) -> bool {
        let Some((host, rows)) = &self.host else {
            return false;
        };
        // A site no member adapts adds nothing.
        if let Some(h) = host.get(&site) {
            h.add(rows, x, y);
        }
        true
    }

    fn has_host_rows(&self) -> bool {
        self.host.is_some()
    }

    fn add_host_row(&self, site: Site, batch_row: usize, x: &[f32], y: &mut [f32]) {
        if let Some((host, rows)) = &self.host
            && let (Some(h), Some(&Some(member))) = (host.get(&site), rows.get(batch_row))
        {
            h.add_row(member, x, y);
        }
    }

    fn add_host_shared(
        &self,
        sites: &[Site],
        x: &[f32],
        _batch: usize,
        ys: &mut [&mut [f32]],
    ) -> bool {
        let Some((host, rows)) = &self.host else {
            return false;
        };
        let factors: Vec<Option<&HostSite>> = sites.iter().map(|s| host.get(s)).collect();
        add_shared(&factors, rows, x, ys);
        true
    }
}
