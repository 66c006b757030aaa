//! Key/value cache with per-row bookkeeping.
//!
//! The cache holds one key and one value tensor per layer,
//! `[batch, kv_heads, slots, head_dim]`, and for every batch row the validity
//! and the position of every slot. A padding token occupies a slot that no
//! query may attend to and does not advance its row's position, so rows of
//! different lengths (left or right padding, or rows that stop early) share
//! one cache and each row sees exactly what it would see alone.

use burn::tensor::{Bool, Tensor, TensorData, backend::Backend};

pub use super::eager::Scoring;
#[cfg(feature = "flex")]
use super::host_kv::HostKv;
pub use super::kv_precision::KvPrecision;
use super::rope::RopeAngles;
use crate::error::ModelError;
#[cfg(feature = "flex")]
use crate::plan::HOST_QUERIES_MAX;

/// `prepare(first_row, q, k, v)` of [`KvCache::append_and_attend_host`].
#[cfg(feature = "flex")]
pub(crate) type PrepareRows<'a> = crate::cpu::attention::PrepareRows<'a>;

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

/// Per-layer keys and values plus per-row slot validity and positions.
///
/// Cloning copies host-held keys and values (plain burn-flex), so a clone
/// and its original each append in place; tensors are shared as usual.
#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    layers: Vec<Layer<B>>,
    rows: Vec<RowSlots>,
    precision: KvPrecision,
    /// Keys and values kept in host memory and decode steps attended there
    /// (the execution plan's `host_kv`).
    host: bool,
}

impl<B: Backend> KvCache<B> {
    /// An empty cache for `num_layers` layers and `batch` rows, holding
    /// keys and values as `precision` says: in host memory where `host` (a
    /// model's [`crate::plan::ExecutionPlan::host_kv`], which
    /// [`crate::LanguageModel::new_cache_with`] passes), else in tensors.
    /// Host storage needs the CPU kernels (feature `flex`); without them
    /// the cache holds tensors whatever `host` says.
    pub fn with_storage(
        num_layers: usize,
        batch: usize,
        precision: KvPrecision,
        host: bool,
    ) -> Self {
        Self {
            layers: vec![Layer::Empty; num_layers],
            rows: vec![RowSlots::default(); batch],
            precision,
            host: cfg!(feature = "flex") && host,
        }
    }

    /// Whether keys and values are kept in host memory.
    pub fn is_host(&self) -> bool {
        self.host
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
    /// Where the cache keeps keys and values in host memory a step of at
    /// most `HOST_QUERIES_MAX` queries (decoding) is answered there
    /// (`layers::host_kv`); tensor-held caches and longer steps use burn's
    /// tensor ops.
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
        if self.host {
            return self.attend_host(layer, q, k, v, rope, mask, scoring);
        }
        let (q, k) = match rope {
            Some(r) => (r.apply_seq_major(q), r.apply_seq_major(k)),
            None => (q, k),
        };
        let (k, v) = self.append_tensors(layer, k.swap_dims(1, 2), v.swap_dims(1, 2));
        super::eager::eager(q, k, v, &mask.keys, scoring)
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
        super::eager::eager(q, kc, vc, &mask.keys, scoring)
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
        prepare: Option<&crate::cpu::attention::PrepareRows<'_>>,
    ) -> Vec<f32> {
        use super::host_kv::append_and_attend;
        use crate::cpu::attention::HostScoring;
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
    /// between decode steps. Slots then masked in every row stay until
    /// [`KvCache::compact`].
    pub fn select_rows(&mut self, keep: &[usize]) -> Result<(), ModelError> {
        if let Some(&bad) = keep.iter().find(|&&r| r >= self.rows.len()) {
            return Err(ModelError::bad_input(format!(
                "row {bad} out of range for a cache of {} rows",
                self.rows.len()
            )));
        }
        self.rows = keep.iter().map(|&r| self.rows[r].clone()).collect();
        self.keep_in_layers(Kept::Rows, keep);
        Ok(())
    }

    /// Keeps only the rows or slots `keep` (in that order) of every layer's
    /// keys and values. Keeping none leaves layers holding no keys (what
    /// `append_rows` expects of a cache of no rows), not layers of zero
    /// rows or slots.
    fn keep_in_layers(&mut self, kept: Kept, keep: &[usize]) {
        if keep.is_empty() {
            self.layers.fill(Layer::Empty);
            return;
        }
        let idx: Vec<i64> = keep.iter().map(|&i| i as i64).collect();
        // Keys and values are `[rows, kv_heads, slots, head_dim]`.
        let dim = match kept {
            Kept::Rows => 0,
            Kept::Slots => 2,
        };
        for entry in &mut self.layers {
            match entry {
                Layer::Empty => {}
                Layer::Tensors(k, v) => {
                    let idx = Tensor::<B, 1, burn::tensor::Int>::from_data(
                        TensorData::new(idx.clone(), [keep.len()]),
                        &k.device(),
                    );
                    *entry = Layer::Tensors(
                        k.clone().select(dim, idx.clone()),
                        v.clone().select(dim, idx),
                    );
                }
                #[cfg(feature = "flex")]
                Layer::Host(kv) => match kept {
                    Kept::Rows => kv.select_rows(keep),
                    Kept::Slots => kv.keep_slots(keep),
                },
            }
        }
    }
}

/// What [`KvCache::keep_in_layers`] selects.
#[derive(Debug, Clone, Copy)]
enum Kept {
    /// Batch rows.
    Rows,
    /// Slots (positions) of every row.
    Slots,
}

/// What a layer holds: its representation and
/// `[rows, kv_heads, slots, head_dim]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LayerShape {
    /// Host vectors (plain burn-flex) rather than tensors.
    host: bool,
    rows: usize,
    kv_heads: usize,
    slots: usize,
    head_dim: usize,
}

impl<B: Backend> Layer<B> {
    /// The layer's shape, `None` while it is empty.
    fn shape(&self) -> Option<LayerShape> {
        match self {
            Layer::Empty => None,
            Layer::Tensors(k, _) => {
                let [rows, kv_heads, slots, head_dim] = k.dims();
                Some(LayerShape {
                    host: false,
                    rows,
                    kv_heads,
                    slots,
                    head_dim,
                })
            }
            #[cfg(feature = "flex")]
            Layer::Host(kv) => Some(LayerShape {
                host: true,
                rows: kv.batch(),
                kv_heads: kv.heads(),
                slots: kv.len(),
                head_dim: kv.dim(),
            }),
        }
    }
}

impl<B: Backend> KvCache<B> {
    /// Adds the rows of `other` after this cache's rows, e.g. to decode a
    /// newly prefilled sequence in the same batch as running ones.
    ///
    /// Rows are aligned at their last slot: the cache with fewer slots gets
    /// masked padding slots at the front of each of its rows (zero keys and
    /// values, invalid, at position 0), so both hold as many slots. Padding
    /// is attended by no query and moves no position, so every row keeps
    /// the keys, values, positions (RoPE indices, window distances) and
    /// visible slots it had, and decodes as it would alone. On the host
    /// path (plain burn-flex) masked slots get probability exactly 0 and
    /// are skipped, so a row's attention is the same bit for bit; burn's
    /// tensor ops may sum the longer rows in another order.
    ///
    /// Works for every representation (burn tensors, moved to this cache's
    /// device where `other`'s lie elsewhere; host vectors on plain
    /// burn-flex), for f32 and f16 caches and for caches that hold no keys
    /// yet. [`ModelError::CacheMismatch`], with this cache unchanged, where
    /// the two differ in layer count, precision, key/value heads or head
    /// width, hold one layer as tensors and the other as host vectors, or
    /// where either's layers disagree with its rows (left by a failed
    /// step).
    pub fn append_rows(&mut self, mut other: KvCache<B>) -> Result<(), ModelError> {
        if self.layers.len() != other.layers.len() {
            return Err(ModelError::CacheMismatch(format!(
                "{} layers and {} layers",
                self.layers.len(),
                other.layers.len()
            )));
        }
        if self.precision != other.precision {
            return Err(ModelError::CacheMismatch(format!(
                "keys and values held in {:?} and in {:?}",
                self.precision, other.precision
            )));
        }
        let (own, theirs) = (self.layer_shapes()?, other.layer_shapes()?);
        for (i, (a, b)) in own.iter().zip(&theirs).enumerate() {
            if let (Some(a), Some(b)) = (a, b)
                && (a.host, a.kv_heads, a.head_dim) != (b.host, b.kv_heads, b.head_dim)
            {
                let form = |s: &LayerShape| if s.host { "host vectors" } else { "tensors" };
                return Err(ModelError::CacheMismatch(format!(
                    "layer {i} holds {} heads of width {} as {} in one cache, \
                     {} heads of width {} as {} in the other",
                    a.kv_heads,
                    a.head_dim,
                    form(a),
                    b.kv_heads,
                    b.head_dim,
                    form(b)
                )));
            }
        }
        if other.rows.is_empty() {
            return Ok(());
        }
        if self.rows.is_empty() {
            *self = other;
            return Ok(());
        }
        let slots = self.slots().max(other.slots());
        let (pad_own, pad_theirs) = (slots - self.slots(), slots - other.slots());
        let (rows_own, rows_theirs) = (self.rows.len(), other.rows.len());
        #[cfg(feature = "flex")]
        let precision = self.precision;
        for (i, theirs) in other.layers.into_iter().enumerate() {
            let own = std::mem::replace(&mut self.layers[i], Layer::Empty);
            // The shapes were checked above: both sides of one representation,
            // heads and width, and an empty side holds no slots.
            self.layers[i] = match (own, theirs) {
                (Layer::Empty, Layer::Empty) => Layer::Empty,
                (Layer::Tensors(k, v), Layer::Tensors(k2, v2)) => {
                    let device = k.device();
                    joined_tensors(
                        (front_padded(k, pad_own), front_padded(v, pad_own)),
                        (
                            front_padded(k2.to_device(&device), pad_theirs),
                            front_padded(v2.to_device(&device), pad_theirs),
                        ),
                    )
                }
                (Layer::Tensors(k, v), Layer::Empty) => {
                    let zeros = (
                        zero_rows(&k, rows_theirs, slots),
                        zero_rows(&v, rows_theirs, slots),
                    );
                    joined_tensors((front_padded(k, pad_own), front_padded(v, pad_own)), zeros)
                }
                (Layer::Empty, Layer::Tensors(k2, v2)) => {
                    let zeros = (
                        zero_rows(&k2, rows_own, slots),
                        zero_rows(&v2, rows_own, slots),
                    );
                    joined_tensors(
                        zeros,
                        (front_padded(k2, pad_theirs), front_padded(v2, pad_theirs)),
                    )
                }
                #[cfg(feature = "flex")]
                (Layer::Host(mut kv), Layer::Host(kv2)) => {
                    kv.append_rows(&kv2)?;
                    Layer::Host(kv)
                }
                #[cfg(feature = "flex")]
                (Layer::Host(mut kv), Layer::Empty) => {
                    let empty = HostKv::new(rows_theirs, kv.heads(), kv.dim(), precision);
                    kv.append_rows(&empty)?;
                    Layer::Host(kv)
                }
                #[cfg(feature = "flex")]
                (Layer::Empty, Layer::Host(kv2)) => {
                    let mut kv = HostKv::new(rows_own, kv2.heads(), kv2.dim(), precision);
                    kv.append_rows(&kv2)?;
                    Layer::Host(kv)
                }
                #[cfg(feature = "flex")]
                (Layer::Host(_), Layer::Tensors(..)) | (Layer::Tensors(..), Layer::Host(_)) => {
                    unreachable!("layers of two representations are refused above")
                }
            };
        }
        for (rows, pad) in [(&mut self.rows, pad_own), (&mut other.rows, pad_theirs)] {
            for row in rows.iter_mut() {
                row.valid.splice(0..0, std::iter::repeat_n(false, pad));
                row.position.splice(0..0, std::iter::repeat_n(0, pad));
            }
        }
        self.rows.append(&mut other.rows);
        Ok(())
    }

    /// Every layer's shape, checked against the rows' bookkeeping: a
    /// non-empty layer holds every row's every slot, an empty one no slots.
    /// A cache of no rows has no keys to join (`None` throughout).
    fn layer_shapes(&self) -> Result<Vec<Option<LayerShape>>, ModelError> {
        let (rows, slots) = (self.rows.len(), self.slots());
        if rows == 0 {
            return Ok(vec![None; self.layers.len()]);
        }
        self.layers
            .iter()
            .enumerate()
            .map(|(i, layer)| match layer.shape() {
                Some(s) if (s.rows, s.slots) != (rows, slots) => {
                    Err(ModelError::CacheMismatch(format!(
                        "layer {i} holds {} rows of {} slots, the cache's rows are {rows} of {slots}",
                        s.rows, s.slots
                    )))
                }
                None if slots > 0 => Err(ModelError::CacheMismatch(format!(
                    "layer {i} holds no keys for the {slots} slots of its rows"
                ))),
                shape => Ok(shape),
            })
            .collect()
    }

    /// Drops the slots that are masked in every row (padding that rows
    /// dropped by [`KvCache::select_rows`] or joined by
    /// [`KvCache::append_rows`] left behind) and returns how many. Every
    /// row keeps its real slots in order with their positions, so it
    /// attends as before; a batch whose rows come and go then holds no
    /// more slots than its rows need. Host-held layers also give back room
    /// beyond four times the slots kept.
    pub fn compact(&mut self) -> usize {
        let slots = self.slots();
        let keep: Vec<usize> = (0..slots)
            .filter(|&j| self.rows.iter().any(|r| r.valid[j]))
            .collect();
        let dropped = slots - keep.len();
        if dropped == 0 {
            return 0;
        }
        for row in &mut self.rows {
            row.valid = keep.iter().map(|&j| row.valid[j]).collect();
            row.position = keep.iter().map(|&j| row.position[j]).collect();
        }
        self.keep_in_layers(Kept::Slots, &keep);
        dropped
    }
}

/// `x: [rows, heads, slots, dim]` with `pad` zero slots in front of each
/// row's.
fn front_padded<B: Backend>(x: Tensor<B, 4>, pad: usize) -> Tensor<B, 4> {
    if pad == 0 {
        return x;
    }
    let [rows, heads, _, dim] = x.dims();
    let zeros = Tensor::zeros([rows, heads, pad, dim], &x.device());
    Tensor::cat(vec![zeros, x], 2)
}

/// Zero keys or values, `[rows, heads, slots, dim]` with `like`'s heads
/// and width, on its device.
fn zero_rows<B: Backend>(like: &Tensor<B, 4>, rows: usize, slots: usize) -> Tensor<B, 4> {
    let [_, heads, _, dim] = like.dims();
    Tensor::zeros([rows, heads, slots, dim], &like.device())
}

/// A tensor-held layer of `first`'s rows then `second`'s (keys, values).
fn joined_tensors<B: Backend>(
    first: (Tensor<B, 4>, Tensor<B, 4>),
    second: (Tensor<B, 4>, Tensor<B, 4>),
) -> Layer<B> {
    Layer::Tensors(
        Tensor::cat(vec![first.0, second.0], 0),
        Tensor::cat(vec![first.1, second.1], 0),
    )
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

#[cfg(all(test, feature = "flex"))]
mod join_tests;
#[cfg(test)]
mod tests;
