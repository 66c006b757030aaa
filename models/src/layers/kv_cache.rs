//! Key/value cache with per-row bookkeeping.
//!
//! The cache holds one key and one value tensor per layer,
//! `[batch, kv_heads, slots, head_dim]`, and for every batch row the validity
//! and the position of every slot. A padding token occupies a slot that no
//! query may attend to and does not advance its row's position, so rows of
//! different lengths (left or right padding, or rows that stop early) share
//! one cache and each row sees exactly what it would see alone.

use burn::tensor::{Bool, Tensor, TensorData, backend::Backend};

use super::rope::RopeAngles;
use crate::error::ModelError;

/// Steps of at most this many new tokens per row are attended on the host
/// (plain burn-flex); longer ones (prefill) use gemm through burn's ops.
#[cfg(feature = "flex")]
pub(crate) const HOST_QUERIES_MAX: usize = 8;

/// The shape of one step's queries, keys and values in host memory.
#[cfg(feature = "flex")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HostShape {
    /// Batch rows.
    pub batch: usize,
    /// New tokens per row.
    pub seq: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

/// How a [`KvCache`] holds keys and values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum KvPrecision {
    /// As the projections make them (f32).
    #[default]
    F32,
    /// Each key and value entry rounded to the nearest f16 when it is
    /// appended (llama.cpp's default cache type); attention then runs in
    /// f32 exactly as for [`KvPrecision::F32`] over those values (widening
    /// an f16 is exact). Host-held caches (plain burn-flex) keep the f16
    /// bits: half the memory, and half the bytes a decode step reads from
    /// its cache. Tensor-held caches keep the rounded values in f32 (burn's
    /// cast to f16 and back). An entry beyond f16's range (|x| ≥ 65520)
    /// becomes infinite and the step's outputs NaN, which the mechanisms
    /// reject with a typed error (non-finite probabilities), never used.
    F16,
}

/// One row's slot bookkeeping.
#[derive(Debug, Clone, Default)]
struct RowSlots {
    /// Whether slot `j` holds a real token.
    valid: Vec<bool>,
    /// Position (rotary index) of slot `j` (for padding: the row's next position).
    position: Vec<usize>,
    /// Number of real tokens so far: the position of the next real token.
    next_position: usize,
}

/// One layer's keys and values.
#[derive(Debug, Clone)]
enum Layer<B: Backend> {
    /// Nothing appended yet.
    Empty,
    /// `[batch, kv_heads, slots, head_dim]` tensors, grown by `cat`.
    Tensors(Tensor<B, 4>, Tensor<B, 4>),
    /// Host vectors with spare capacity (plain burn-flex; see [`super::host_kv`]).
    #[cfg(feature = "flex")]
    Host(super::host_kv::HostKv),
}

/// The attention mask of one step: which slots each new query may see.
#[derive(Debug, Clone)]
pub struct StepMask<B: Backend> {
    /// `[batch, 1, new, slots]`, `true` where attention is NOT allowed
    /// ([`KvCache::mask`]).
    pub keys: Tensor<B, 4, Bool>,
    /// The sliding window it was made with, if any.
    pub window: Option<usize>,
}

/// How attention scores are formed: `q·k · scale`, then, with a cap `c`,
/// `c·tanh(score / c)` (Gemma 2's soft-capping).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scoring {
    /// Multiplier of `q·k` (usually `head_dim^-1/2`).
    pub scale: f64,
    /// Soft-cap of the scores, if any.
    pub softcap: Option<f64>,
}

/// Per-layer keys and values plus per-row slot validity and positions.
///
/// Cloning copies host-held keys and values (plain burn-flex), so a clone
/// and its original each append in place; tensors are shared as usual.
#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    layers: Vec<Layer<B>>,
    rows: Vec<RowSlots>,
    precision: KvPrecision,
}

impl<B: Backend> KvCache<B> {
    /// An empty cache for `num_layers` layers and `batch` rows, in f32.
    pub fn new(num_layers: usize, batch: usize) -> Self {
        Self::with_precision(num_layers, batch, KvPrecision::F32)
    }

    /// An empty cache for `num_layers` layers and `batch` rows, holding
    /// keys and values as `precision` says.
    pub fn with_precision(num_layers: usize, batch: usize, precision: KvPrecision) -> Self {
        Self {
            layers: vec![Layer::Empty; num_layers],
            rows: vec![RowSlots::default(); batch],
            precision,
        }
    }

    /// How this cache holds keys and values.
    pub fn precision(&self) -> KvPrecision {
        self.precision
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Number of batch rows.
    pub fn batch_size(&self) -> usize {
        self.rows.len()
    }

    /// Number of slots (tokens, padding included) held per row.
    pub fn slots(&self) -> usize {
        self.rows.first().map_or(0, |r| r.valid.len())
    }

    /// Number of real (non-padding) tokens of row `row` so far.
    pub fn real_tokens(&self, row: usize) -> Option<usize> {
        self.rows.get(row).map(|r| r.next_position)
    }

    /// Registers a step of `real[row][i]` flags (one per new token) and returns
    /// the positions of the new tokens. Checks the batch size and that rows
    /// have equal length.
    pub fn push_step(&mut self, real: &[Vec<bool>]) -> Result<Vec<Vec<usize>>, ModelError> {
        if real.len() != self.rows.len() {
            return Err(ModelError::bad_input(format!(
                "batch has {} rows but the cache was made for {}",
                real.len(),
                self.rows.len()
            )));
        }
        let mut positions = Vec::with_capacity(real.len());
        for (row, flags) in self.rows.iter_mut().zip(real) {
            let mut pos = Vec::with_capacity(flags.len());
            for &is_real in flags {
                row.valid.push(is_real);
                row.position.push(row.next_position);
                pos.push(row.next_position);
                if is_real {
                    row.next_position += 1;
                }
            }
            positions.push(pos);
        }
        Ok(positions)
    }

    /// Attention mask for the last `new` slots as queries against all slots
    /// as keys, `[batch, 1, new, slots]`, `true` where attention is NOT
    /// allowed. A key is visible to a query iff it is real, not later than
    /// the query, and (with a window `w`) fewer than `w` positions before it
    /// (HF `sliding_window_overlay`: `kv > q - w`).
    pub fn mask(
        &self,
        new: usize,
        window: Option<usize>,
        device: &B::Device,
    ) -> Tensor<B, 4, Bool> {
        let t = self.slots();
        let start = t.saturating_sub(new);
        let new = t - start;
        let mut data = Vec::with_capacity(self.rows.len() * new * t);
        for row in &self.rows {
            for q in start..t {
                let qp = row.position[q];
                for k in 0..t {
                    let kp = row.position[k];
                    let visible =
                        row.valid[k] && k <= q && window.is_none_or(|w| qp - kp.min(qp) < w);
                    data.push(!visible);
                }
            }
        }
        Tensor::from_data(TensorData::new(data, [self.rows.len(), 1, new, t]), device)
    }

    /// [`KvCache::mask`] for the last `new` slots, with its window.
    pub fn step_mask(&self, new: usize, window: Option<usize>, device: &B::Device) -> StepMask<B> {
        StepMask {
            keys: self.mask(new, window, device),
            window,
        }
    }

    /// Appends this step's keys and values to layer `layer` and returns the
    /// attention of this step's queries over all slots (HF eager attention:
    /// `softmax(q kᵀ · scale, soft-capped, masked) v`).
    ///
    /// `q: [batch, new, heads, head_dim]`, `k` and `v`: `[batch, new,
    /// kv_heads, head_dim]` (`heads` a multiple of `kv_heads`); returns
    /// `[batch, new, heads · head_dim]`. With `rope`, `q` and `k` are
    /// rotated first ([`RopeAngles::apply_seq_major`]; in host memory on the
    /// host path, with the same bits). Models call it with
    /// `layer < num_layers()` (checked once per step by
    /// [`crate::runtime::start_step`]); a larger index panics.
    ///
    /// On plain burn-flex the keys and values are kept in host memory and a
    /// step of at most `HOST_QUERIES_MAX` queries (decoding) is answered
    /// there (`layers::host_kv`); other backends, autodiff and longer steps
    /// use burn's tensor ops.
    #[allow(clippy::too_many_arguments)]
    pub fn attend(
        &mut self,
        layer: usize,
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        rope: Option<&RopeAngles<B>>,
        mask: &StepMask<B>,
        scoring: Scoring,
    ) -> Tensor<B, 3> {
        #[cfg(feature = "flex")]
        if crate::runtime::is_plain_flex::<B>() {
            return self.attend_host(layer, q, k, v, rope, mask, scoring);
        }
        let (q, k) = match rope {
            Some(r) => (r.apply_seq_major(q), r.apply_seq_major(k)),
            None => (q, k),
        };
        let (k, v) = self.append_tensors(layer, k.swap_dims(1, 2), v.swap_dims(1, 2));
        super::attention::eager(q, k, v, &mask.keys, scoring)
    }

    /// Appends `[batch, kv_heads, new, head_dim]` keys and values to a
    /// tensor-held layer and returns all of them.
    fn append_tensors(
        &mut self,
        layer: usize,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let (k, v) = match self.precision {
            KvPrecision::F32 => (k, v),
            KvPrecision::F16 => (round_to_f16(k), round_to_f16(v)),
        };
        let (k, v) = match std::mem::replace(&mut self.layers[layer], Layer::Empty) {
            Layer::Tensors(pk, pv) => (Tensor::cat(vec![pk, k], 2), Tensor::cat(vec![pv, v], 2)),
            _ => (k, v),
        };
        self.layers[layer] = Layer::Tensors(k.clone(), v.clone());
        (k, v)
    }

    /// [`KvCache::attend`] with host-held keys and values.
    #[cfg(feature = "flex")]
    #[allow(clippy::too_many_arguments)]
    fn attend_host(
        &mut self,
        layer: usize,
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        rope: Option<&RopeAngles<B>>,
        mask: &StepMask<B>,
        scoring: Scoring,
    ) -> Tensor<B, 3> {
        let [b, s, heads, d] = q.dims();
        let kv_heads = k.dims()[2];
        let device = q.device();
        let read = |t: Tensor<B, 4>| crate::runtime::to_vec(t).expect("plain flex f32 data");
        let (mut q, mut k, mut v) = (read(q), read(k), read(v));
        let shape = HostShape {
            batch: b,
            seq: s,
            heads,
            kv_heads,
            head_dim: d,
        };
        if s <= HOST_QUERIES_MAX {
            let out = self.append_and_attend_host(
                layer,
                (&mut q, &mut k, &mut v),
                shape,
                rope,
                mask.window,
                scoring,
                None,
            );
            return Tensor::from_data(TensorData::new(out, [b, s, heads * d]), &device);
        }
        if let Some(r) = rope {
            r.apply_host(&mut q, heads);
            r.apply_host(&mut k, kv_heads);
        }
        self.append_host(layer, &k, &v, shape);
        let Layer::Host(kv) = &self.layers[layer] else {
            unreachable!("appended just above")
        };
        let t = kv.len();
        let (kc, vc) = kv.contiguous();
        let tensor = |x: Vec<f32>, shape: [usize; 4]| {
            Tensor::<B, 4>::from_data(TensorData::new(x, shape), &device)
        };
        let q = tensor(q, [b, s, heads, d]);
        let (kc, vc) = (
            tensor(kc, [b, kv_heads, t, d]),
            tensor(vc, [b, kv_heads, t, d]),
        );
        super::attention::eager(q, kc, vc, &mask.keys, scoring)
    }

    /// Appends rotated keys and values `[batch, seq, kv_heads, head_dim]`
    /// (row-major host vectors) to layer `layer`, held in host memory.
    #[cfg(feature = "flex")]
    fn append_host(&mut self, layer: usize, k: &[f32], v: &[f32], shape: HostShape) {
        host_layer(&mut self.layers[layer], shape, self.precision).append(k, v, shape.seq);
    }

    /// Appends this step's keys and values to layer `layer` (held in host
    /// memory) and returns the attention of this step's queries over all
    /// slots, `[batch, seq, heads · head_dim]`: [`KvCache::attend`]'s host
    /// path on host vectors (`q: [batch, seq, heads, head_dim]`, `k` and
    /// `v`: `[batch, seq, kv_heads, head_dim]`, `seq` at most
    /// `HOST_QUERIES_MAX`), `q` and `k` rotated in place by `rope` first
    /// and, before that, each run of rows passed to `prepare(first_row, q,
    /// k, v)` if given. The rows are split over threads once for all of it.
    #[cfg(feature = "flex")]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn append_and_attend_host(
        &mut self,
        layer: usize,
        qkv: (&mut [f32], &mut [f32], &mut [f32]),
        shape: HostShape,
        rope: Option<&RopeAngles<B>>,
        window: Option<usize>,
        scoring: Scoring,
        prepare: Option<&super::host_kv::PrepareRows<'_>>,
    ) -> Vec<f32> {
        use super::host_kv::{HostScoring, append_and_attend};
        let s = shape.seq;
        debug_assert!(s <= HOST_QUERIES_MAX);
        let kv = host_layer(&mut self.layers[layer], shape, self.precision);
        let t = kv.len() + s;
        let rows = &self.rows;
        let visible = |row: usize, i: usize, j: usize| {
            let r = &rows[row];
            let qs = t - s + i;
            let (qp, kp) = (r.position[qs], r.position[j]);
            r.valid[j] && j <= qs && window.is_none_or(|w| qp - kp.min(qp) < w)
        };
        let host = HostScoring {
            heads: shape.heads,
            // As burn's `mul_scalar` on f32 tensors: the scalar in f32.
            scale: scoring.scale as f32,
            softcap: scoring.softcap.map(|c| c as f32),
        };
        let rotate = |x: &mut [f32], first: usize, heads: usize| {
            if let Some(r) = rope {
                r.apply_host_from(x, first, heads);
            }
        };
        let prepare = prepare.unwrap_or(&|_, _, _, _| {});
        append_and_attend(kv, qkv, s, host, &visible, prepare, &rotate)
    }

    /// Keeps only the rows `keep` (in that order), e.g. to drop finished rows
    /// between decode steps.
    pub fn select_rows(&mut self, keep: &[usize]) -> Result<(), ModelError> {
        if let Some(&bad) = keep.iter().find(|&&r| r >= self.rows.len()) {
            return Err(ModelError::bad_input(format!(
                "row {bad} out of range for a cache of {} rows",
                self.rows.len()
            )));
        }
        self.rows = keep.iter().map(|&r| self.rows[r].clone()).collect();
        for entry in &mut self.layers {
            match entry {
                Layer::Empty => {}
                Layer::Tensors(k, v) => {
                    let idx: Vec<i64> = keep.iter().map(|&r| r as i64).collect();
                    let idx = Tensor::<B, 1, burn::tensor::Int>::from_data(
                        TensorData::new(idx, [keep.len()]),
                        &k.device(),
                    );
                    *entry =
                        Layer::Tensors(k.clone().select(0, idx.clone()), v.clone().select(0, idx));
                }
                #[cfg(feature = "flex")]
                Layer::Host(kv) => kv.select_rows(keep),
            }
        }
        Ok(())
    }
}

/// `x` with each entry rounded to the nearest f16, kept in f32.
fn round_to_f16<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    use burn::tensor::FloatDType;
    x.cast(FloatDType::F16).cast(FloatDType::F32)
}

/// A layer's keys and values in host memory, made empty (for `shape`'s rows
/// and heads) if the layer holds none yet.
#[cfg(feature = "flex")]
fn host_layer<B: Backend>(
    entry: &mut Layer<B>,
    shape: HostShape,
    precision: KvPrecision,
) -> &mut super::host_kv::HostKv {
    if !matches!(entry, Layer::Host(_)) {
        *entry = Layer::Host(super::host_kv::HostKv::new(
            shape.batch,
            shape.kv_heads,
            shape.head_dim,
            precision,
        ));
    }
    let Layer::Host(kv) = entry else {
        unreachable!("set just above")
    };
    kv
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    #[test]
    fn padding_slots_are_masked_and_do_not_advance_positions() {
        let mut cache = KvCache::<Flex>::new(1, 2);
        let pos = cache
            .push_step(&[vec![true, true, true], vec![false, true, true]])
            .unwrap();
        assert_eq!(pos, vec![vec![0, 1, 2], vec![0, 0, 1]]);
        let m = cache
            .mask(3, None, &Default::default())
            .into_data()
            .to_vec::<bool>()
            .unwrap();
        // Row 1, query slot 2 sees slots 1 and 2 only.
        assert_eq!(&m[9 + 6..9 + 9], &[true, false, false]);
        // Row 0 is plain causal.
        assert_eq!(&m[0..3], &[false, true, true]);
        let w = cache
            .mask(1, Some(2), &Default::default())
            .into_data()
            .to_vec::<bool>()
            .unwrap();
        assert_eq!(&w[0..3], &[true, false, false]);
        assert!(cache.push_step(&[vec![true]]).is_err());
    }
}
