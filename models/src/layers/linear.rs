//! Linear projections and the LoRA hook.
//!
//! Every projection a LoRA adapter may target goes through [`Linear::forward`],
//! which adds, besides `x Wᵀ + b`, whatever the optional [`LinearDelta`] returns
//! for that [`Site`]. With no adapter the hook costs one `Option` check.

use burn::tensor::{Tensor, backend::Backend};

use crate::backend::ModelBackend;
#[cfg(feature = "flex")]
use crate::cpu::CpuWeight;
#[cfg(feature = "flex")]
use crate::cpu::Q8Rows;
use crate::plan::{ProductPlan, ProjectionKernel};

/// Which projection of a layer (the modules a LoRA may target).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Projection {
    /// Attention query projection (`q_proj`).
    Q,
    /// Attention key projection (`k_proj`).
    K,
    /// Attention value projection (`v_proj`).
    V,
    /// Attention output projection (`o_proj`).
    O,
    /// MLP gate projection (`gate_proj`).
    Gate,
    /// MLP up projection (`up_proj`).
    Up,
    /// MLP down projection (`down_proj`).
    Down,
    /// GPT-2 fused query/key/value projection (`attn.c_attn`).
    CAttn,
    /// GPT-2 attention output projection (`attn.c_proj`).
    CProj,
    /// GPT-2 MLP input projection (`mlp.c_fc`).
    CFc,
    /// GPT-2 MLP output projection (`mlp.c_proj`).
    MlpCProj,
}

/// Where in the network a linear projection sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Site {
    /// Transformer block index, from 0.
    pub layer: usize,
    /// Which projection of the block.
    pub module: Projection,
}

/// A per-call source of additive corrections to linear projections (a LoRA
/// adapter, or one adapter per batch row).
///
/// `Sync`, so that a forward pass may run on another thread (plain
/// burn-flex runs it on rayon's pool).
pub trait LinearDelta<B: Backend>: Sync {
    /// Extra output to add to the base projection of `x`
    /// (`[batch, seq, in]` → `[batch, seq, out]`), or `None` when this site
    /// carries no adapter. Each batch row may belong to a different member.
    ///
    /// Contract: a returned tensor has exactly the base projection's shape.
    fn delta(&self, site: Site, x: &Tensor<B, 3>) -> Option<Tensor<B, 3>>;

    /// Adds the delta at `site` into `y` in host memory, for `x` (`[batch ·
    /// seq, in]`, row-major) and `y` (`[batch · seq, out]`): the decode path
    /// of plain burn-flex, which computes `x Wᵀ` there already. Returns
    /// `false`, leaving `y` untouched, when this source has no host form;
    /// [`LinearDelta::delta`] then serves. The default has none.
    fn add_host(&self, site: Site, x: &[f32], batch: usize, y: &mut [f32]) -> bool {
        let _ = (site, x, batch, y);
        false
    }

    /// Whether [`LinearDelta::add_host_row`] serves (then for every site).
    fn has_host_rows(&self) -> bool {
        false
    }

    /// Adds the delta at `site` for one row in host memory: `x` and `y` are
    /// that row's input and output, `batch_row` its batch row (the rows of a
    /// step's `seq` tokens share one). The decode step uses it to add an
    /// update inside a per-row pass it makes anyway, and calls it only when
    /// [`LinearDelta::has_host_rows`] says it serves; the default (no
    /// per-row form) adds nothing.
    fn add_host_row(&self, site: Site, batch_row: usize, x: &[f32], y: &mut [f32]) {
        let _ = (site, batch_row, x, y);
    }

    /// [`LinearDelta::add_host`] at several sites that share `x` (a block's
    /// query, key and value), `ys[i]` for `sites[i]`: all of them added, or
    /// none when this source has no host form. A source may override it to
    /// do them in one pass over the rows; the default takes them one by one.
    fn add_host_shared(
        &self,
        sites: &[Site],
        x: &[f32],
        batch: usize,
        ys: &mut [&mut [f32]],
    ) -> bool {
        // Whether a source has a host form does not depend on the site, so
        // the first answer holds for all.
        let mut pairs = sites.iter().zip(ys.iter_mut());
        let Some((&first, y)) = pairs.next() else {
            return true;
        };
        if !self.add_host(first, x, batch, y) {
            return false;
        }
        for (&site, y) in pairs {
            let added = self.add_host(site, x, batch, y);
            debug_assert!(added, "add_host answered differently per site");
        }
        true
    }
}

/// `y = x Wᵀ + b` with `W` stored `[out, in]` as in PyTorch checkpoints.
#[derive(Debug, Clone)]
pub struct Linear<B: Backend> {
    /// `Wᵀ`, `[in, out]` (a transposed view of the `[out, in]` weight).
    weight_t: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    /// The same weight in its GGUF blocks, for decode products on plain
    /// burn-flex (see [`crate::cpu::blocks_f32`]); `weight_t` serves everything else.
    #[cfg(feature = "flex")]
    quantized: Option<std::sync::Arc<CpuWeight>>,
    /// The bias in host memory, read once for the host block operations.
    #[cfg(feature = "flex")]
    host_bias: std::sync::Arc<std::sync::OnceLock<Option<Vec<f32>>>>,
    /// Which kernels compute the products (chosen at load).
    plan: ProductPlan,
}

impl<B: ModelBackend> Linear<B> {
    /// A projection from a PyTorch-layout `[out, in]` weight and optional `[out]` bias.
    pub fn new(weight: Tensor<B, 2>, bias: Option<Tensor<B, 1>>) -> Self {
        Self {
            weight_t: weight.transpose(),
            bias,
            #[cfg(feature = "flex")]
            quantized: None,
            #[cfg(feature = "flex")]
            host_bias: Default::default(),
            plan: ProductPlan::for_backend::<B>(),
        }
    }

    /// The projection computing its products as `plan` says (the CPU
    /// kernels, or burn's matmul only); without the CPU kernels a quantised
    /// copy is dropped.
    pub fn with_product_plan(mut self, plan: ProductPlan) -> Self {
        self.plan = plan;
        #[cfg(feature = "flex")]
        if !plan.cpu_kernels {
            self.quantized = None;
        }
        self
    }

    /// How this projection computes its products.
    pub fn product_plan(&self) -> ProductPlan {
        self.plan
    }

    /// Keeps `quantized` (the same `[out, in]` weight in GGUF blocks) for
    /// products of a few rows (the plan's `few_rows_max`) through the CPU
    /// kernels: a decode step then reads the blocks' 0.6–1.1 bytes per weight
    /// instead of 4. Declined (the projection is returned unchanged) when
    /// the shapes differ or the plan has no CPU kernels (elsewhere it would
    /// be memory spent for nothing).
    #[cfg(feature = "flex")]
    pub fn with_quantized(mut self, quantized: crate::cpu::BlockWeight) -> Self {
        if self.plan.cpu_kernels
            && quantized.in_features() == self.in_features()
            && quantized.out_features() == self.out_features()
        {
            self.quantized = Some(std::sync::Arc::new(CpuWeight::blocks(quantized)));
        }
        self
    }

    /// Products with the quantised copy take 8-bit activations, llama.cpp's
    /// way (see [`crate::cpu::tiles_q8`]), for any number of rows: the
    /// copy is rearranged into 16-row tiles, replacing the blocks. No change
    /// without a quantised copy, or when the output width is not a multiple
    /// of 16.
    #[cfg(feature = "flex")]
    pub fn with_int8_activations(mut self) -> Self {
        if let Some(CpuWeight::Blocks(q, _)) = self.quantized.as_deref()
            && let Some(w) = crate::cpu::TiledWeight::from_blocks(q)
        {
            self.quantized = Some(std::sync::Arc::new(CpuWeight::Tiles(w)));
        }
        self
    }

    /// Whether decode products read a quantised copy of the weight.
    pub fn is_quantized(&self) -> bool {
        #[cfg(feature = "flex")]
        {
            self.quantized.is_some()
        }
        #[cfg(not(feature = "flex"))]
        {
            false
        }
    }

    /// The weight as `[in, out]` (a view of the checkpoint's `[out, in]`).
    pub fn weight_t(&self) -> &Tensor<B, 2> {
        &self.weight_t
    }

    /// The bias, `[out]`, if any.
    pub fn bias(&self) -> Option<&Tensor<B, 1>> {
        self.bias.as_ref()
    }

    /// Input width.
    pub fn in_features(&self) -> usize {
        self.weight_t.dims()[0]
    }

    /// Output width.
    pub fn out_features(&self) -> usize {
        self.weight_t.dims()[1]
    }

    /// `x Wᵀ + b` (+ the adapter's delta at `site`), `[batch, seq, in]` →
    /// `[batch, seq, out]`.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        site: Site,
        delta: Option<&dyn LinearDelta<B>>,
    ) -> Tensor<B, 3> {
        #[cfg(feature = "flex")]
        if let Some([y]) = Self::forward_host([(self, site)], &x, delta) {
            return y;
        }
        let extra = delta.and_then(|d| d.delta(site, &x));
        let y = self.forward_base(x);
        match extra {
            Some(e) => y + e,
            None => y,
        }
    }

    /// [`Linear::forward`] of several projections of one `x` (a block's
    /// query, key and value, or an MLP's gate and up): the same results, but
    /// on the host path `x` is read out of its tensor once, and with 8-bit
    /// activations quantised once, for all of them (rather than once per
    /// projection).
    pub fn forward_shared<const N: usize>(
        projections: [(&Self, Site); N],
        x: Tensor<B, 3>,
        delta: Option<&dyn LinearDelta<B>>,
    ) -> [Tensor<B, 3>; N] {
        #[cfg(feature = "flex")]
        if let Some(ys) = Self::forward_host(projections, &x, delta) {
            return ys;
        }
        projections.map(|(p, site)| p.forward(x.clone(), site, delta))
    }

    /// [`Linear::forward_shared`] in host memory, when every projection
    /// has a quantised copy, no bias and `x`'s width, on plain burn-flex with
    /// few rows (any number with 8-bit activations): `x` is read once, each
    /// delta (if any) added to its product before it becomes a tensor.
    /// `None` where that does not apply.
    #[cfg(feature = "flex")]
    fn forward_host<const N: usize>(
        projections: [(&Self, Site); N],
        x: &Tensor<B, 3>,
        delta: Option<&dyn LinearDelta<B>>,
    ) -> Option<[Tensor<B, 3>; N]> {
        let [b, s, i] = x.dims();
        if !projections
            .iter()
            .all(|(p, _)| p.bias.is_none() && p.host_ready(b * s, i))
        {
            return None;
        }
        let xs = crate::runtime::to_vec(x.clone().reshape([b * s, i])).ok()?;
        let device = x.device();
        let ys = Self::host_products(projections, &xs, [b, s], delta, &device)?;
        let mut outs = projections.iter().zip(ys).map(|((p, _), y)| {
            Tensor::from_data(
                burn::tensor::TensorData::new(y, [b, s, p.out_features()]),
                &device,
            )
        });
        Some(std::array::from_fn(|_| outs.next().expect("N outputs")))
    }

    /// Whether [`Linear::host_base_products`] serves this projection for
    /// `rows` rows of width `k`: a quantised copy that takes them.
    #[cfg(feature = "flex")]
    pub(crate) fn host_ready(&self, rows: usize, k: usize) -> bool {
        self.host_weight(rows, k).is_some()
    }

    /// The bias in host memory, if any (read from its tensor once).
    #[cfg(feature = "flex")]
    pub(crate) fn host_bias(&self) -> Option<&[f32]> {
        self.host_bias
            .get_or_init(|| {
                self.bias
                    .clone()
                    .map(|b| crate::runtime::to_vec(b).expect("f32 bias in host memory"))
            })
            .as_deref()
    }

    /// The name of the kernel that computes this projection's decode
    /// products (for the execution plan).
    pub fn kernel_name(&self) -> String {
        #[cfg(feature = "flex")]
        if let Some(q) = self.quantized.as_deref() {
            return host_kernel_name(q);
        }
        #[cfg(feature = "flex")]
        if self.plan.cpu_kernels {
            // The row kernel reads the `[out, in]` rows `Linear::new` keeps
            // (as the transposed view `weight_t`).
            let rows_kernel = crate::cpu::kernel_for(
                crate::cpu::WeightFormat::F32,
                crate::cpu::ActivationFormat::F32,
            );
            if let Some(k) = rows_kernel {
                return format!(
                    "{k} up to {} rows, else burn matmul",
                    self.plan.few_rows_max
                );
            }
        }
        "burn matmul".to_string()
    }

    /// This projection as the execution plan sees it: whether the host
    /// products read it, in which activation format, by which kernel.
    pub fn projection_kernel(&self) -> ProjectionKernel {
        ProjectionKernel {
            host: self.is_quantized(),
            int8_activations: self.takes_int8_activations(),
            kernel: self.kernel_name(),
        }
    }

    /// Whether this projection's quantised copy takes 8-bit activations.
    pub fn takes_int8_activations(&self) -> bool {
        #[cfg(feature = "flex")]
        {
            self.host_takes_int8()
        }
        #[cfg(not(feature = "flex"))]
        {
            false
        }
    }

    /// `x Wᵀ` (+ the delta at each site) of several projections of one
    /// host-held `x` (`[batch · seq, in]` row-major; `shape` = `[batch,
    /// seq]`), row-major: `x` quantised once for all of them with 8-bit
    /// activations. A delta without a host form is computed by its tensor
    /// form from a tensor of `x` on `device`. `None` unless every projection
    /// is [`Linear::host_ready`].
    #[cfg(feature = "flex")]
    pub(crate) fn host_products<const N: usize>(
        projections: [(&Self, Site); N],
        xs: &[f32],
        [b, s]: [usize; 2],
        delta: Option<&dyn LinearDelta<B>>,
        device: &B::Device,
    ) -> Option<[Vec<f32>; N]> {
        let mut ys = Self::host_base_products(projections.map(|(p, _)| p), xs, b * s, None)?;
        if let Some(d) = delta {
            Self::add_deltas(
                &projections.map(|(_, site)| site),
                xs,
                [b, s],
                d,
                device,
                &mut ys,
            );
        }
        Some(ys)
    }

    /// `x Wᵀ` of several [`Linear::host_ready`] projections of one
    /// host-held `x` (`[rows, in]`), in one parallel region, without
    /// deltas; `quantized`: `x` quantised already (8-bit activations).
    /// `None` unless every projection is host-ready.
    #[cfg(feature = "flex")]
    pub(crate) fn host_base_products<const N: usize>(
        projections: [&Self; N],
        xs: &[f32],
        rows: usize,
        quantized: Option<&Q8Rows>,
    ) -> Option<[Vec<f32>; N]> {
        let i = xs.len() / rows.max(1);
        if !projections.iter().all(|p| p.host_ready(rows, i)) {
            return None;
        }
        let weights = projections.map(|p| p.host_weight(rows, i).expect("checked above"));
        let mut ys = CpuWeight::matmul_many(&weights, xs, rows, quantized).into_iter();
        Some(std::array::from_fn(|_| ys.next().expect("N products")))
    }

    /// Whether this host-ready projection takes 8-bit activations (its
    /// products read `x` quantised).
    #[cfg(feature = "flex")]
    pub(crate) fn host_takes_int8(&self) -> bool {
        self.quantized.as_deref().is_some_and(CpuWeight::takes_q8)
    }

    /// Adds `delta`'s update at `sites[i]` to `ys[i]` for the host-held `x`
    /// (`[batch · seq, in]`; `shape` = `[batch, seq]`): by its host form in
    /// one pass when it has one, else by its tensor form from a tensor of
    /// `x` on `device`.
    #[cfg(feature = "flex")]
    pub(crate) fn add_deltas(
        sites: &[Site],
        xs: &[f32],
        [b, s]: [usize; 2],
        delta: &dyn LinearDelta<B>,
        device: &B::Device,
        ys: &mut [Vec<f32>],
    ) {
        let mut views: Vec<&mut [f32]> = ys.iter_mut().map(Vec::as_mut_slice).collect();
        if delta.add_host_shared(sites, xs, b, &mut views) {
            return;
        }
        let i = xs.len() / (b * s).max(1);
        let x = Tensor::<B, 3>::from_data(
            burn::tensor::TensorData::new(xs.to_vec(), [b, s, i]),
            device,
        );
        for (y, &site) in ys.iter_mut().zip(sites) {
            if let Some(e) = delta.delta(site, &x) {
                let e = crate::runtime::to_vec(e).expect("plain flex f32 data");
                y.iter_mut().zip(e).for_each(|(y, e)| *y += e);
            }
        }
    }

    /// `x Wᵀ + b` without any adapter.
    pub fn forward_base(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let [b, s, i] = x.dims();
        let x = x.reshape([b * s, i]);
        let y = match self.few_rows(&x) {
            Some(y) => y,
            None => x.matmul(self.weight_t.clone()),
        };
        let y = match &self.bias {
            Some(bias) => y + bias.clone().unsqueeze::<2>(),
            None => y,
        };
        y.reshape([b, s, self.out_features()])
    }

    /// `x Wᵀ` by [`crate::cpu::dense`] when `x` has at most the plan's `few_rows_max`
    /// rows and the weight is a plain burn-flex f32 `[out, in]` tensor.
    fn few_rows(&self, x: &Tensor<B, 2>) -> Option<Tensor<B, 2>> {
        #[cfg(feature = "flex")]
        {
            let [rows, _] = x.dims();
            if !self.plan.cpu_kernels {
                return None;
            }
            if let Some(y) = self.quantized_product(x) {
                return Some(Tensor::from_data(
                    burn::tensor::TensorData::new(y, [rows, self.out_features()]),
                    &x.device(),
                ));
            }
            if rows <= self.plan.few_rows_max {
                return crate::cpu::gemm::few_rows_matmul(x, &self.weight_t);
            }
        }
        let _ = x;
        None
    }

    /// `x Wᵀ` for row-major host `x: [rows, in]`, row-major `[rows, out]`, by the
    /// quantised kernel that [`Linear::forward_base`] runs for the same rows (so
    /// the same bits), without a tensor on either side; `None` where that path
    /// does not serve these rows (no quantised copy, not plain burn-flex with the
    /// CPU kernels, or a bias).
    pub fn forward_base_host(&self, x: &[f32], rows: usize) -> Option<Vec<f32>> {
        #[cfg(feature = "flex")]
        {
            let k = x.len().checked_div(rows)?;
            if !self.plan.cpu_kernels || self.bias.is_some() || rows * k != x.len() {
                return None;
            }
            let q = self.host_weight(rows, k)?;
            Some(q.matmul(x, rows))
        }
        #[cfg(not(feature = "flex"))]
        {
            let _ = (x, rows);
            None
        }
    }

    /// `x` read into host memory and `x Wᵀ` by the quantised kernel, both
    /// row-major, when the weight has a quantised copy, the backend is plain
    /// burn-flex, and `x: [rows, in]` has at most the plan's `few_rows_max` rows, or
    /// any number of rows with 8-bit activations: then every product takes
    /// them, so that a row's result never depends on how many rows share its
    /// batch (a prefill of several rows and a decode step of one agree).
    #[cfg(feature = "flex")]
    fn quantized_product(&self, x: &Tensor<B, 2>) -> Option<Vec<f32>> {
        let [rows, k] = x.dims();
        let q = self.host_weight(rows, k)?;
        let xs = crate::runtime::to_vec(x.clone()).ok()?;
        Some(q.matmul(&xs, rows))
    }

    /// The quantised copy, where it serves a product of `rows` rows of
    /// width `k`: on plain burn-flex, for at most the plan's `few_rows_max` rows, or any
    /// number with 8-bit activations.
    #[cfg(feature = "flex")]
    fn host_weight(&self, rows: usize, k: usize) -> Option<&CpuWeight> {
        let q = self.quantized.as_deref()?;
        let any_rows = matches!(q, CpuWeight::Tiles(_));
        ((rows <= self.plan.few_rows_max || any_rows) && k == q.in_features()).then_some(q)
    }
}

/// The kernels of the dispatch table that multiply by `w` (for the
/// execution plan): by row count where they differ.
#[cfg(feature = "flex")]
fn host_kernel_name(w: &CpuWeight) -> String {
    use crate::cpu::tiles_f32::TILES_F32_MIN_ROWS;
    use crate::cpu::{ActivationFormat, WeightFormat, kernel_for};
    let name =
        |f, a| kernel_for(f, a).map_or_else(|| format!("{f:?} × {a:?}: none"), |k| k.to_string());
    match w {
        CpuWeight::Blocks(b, _) => {
            let few = name(b.format(), ActivationFormat::F32);
            let tiles = match b.format() {
                WeightFormat::Q4_1 => WeightFormat::Q4_1x16,
                WeightFormat::Q8_0 => WeightFormat::Q8_0x16,
                other => other,
            };
            match kernel_for(tiles, ActivationFormat::F32) {
                Some(k) => format!("{few}, from {TILES_F32_MIN_ROWS} rows {k}"),
                None => few,
            }
        }
        CpuWeight::Tiles(t) => name(t.format(), ActivationFormat::Q8_1),
    }
}

#[cfg(test)]
mod tests;
