//! Running a language model: batches with padding, the [`LanguageModel`]
//! trait every model implements, prefill and decode through a [`KvCache`],
//! log-probabilities on the device, and greedy / sampled generation.

use burn::tensor::{Int, Tensor, TensorData, activation, backend::Backend};
use rand::Rng;

use crate::error::ModelError;
use crate::layers::{KvCache, KvPrecision, LinearDelta};
use crate::plan::ExecutionPlan;
pub use crate::threads::{for_each_task, on_hot_pool, rows_per_task};
pub use crate::to_host::to_vec;

/// Token ids of several rows, padded to one length, with a flag per token
/// saying whether it is real (`true`) or padding (`false`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    rows: usize,
    len: usize,
    tokens: Vec<u32>,
    real: Vec<bool>,
}

impl Batch {
    /// Rows of equal, positive length, all tokens real.
    pub fn new(rows: &[Vec<u32>]) -> Result<Self, ModelError> {
        let len = rows.first().map_or(0, Vec::len);
        if rows.iter().any(|r| r.len() != len) {
            return Err(ModelError::bad_input(
                "rows of different lengths (pad them with left_padded or right_padded)",
            ));
        }
        let real = rows.iter().map(|r| vec![true; r.len()]).collect::<Vec<_>>();
        Self::from_parts(rows, &real)
    }

    /// One row.
    pub fn single(tokens: &[u32]) -> Result<Self, ModelError> {
        Self::new(&[tokens.to_vec()])
    }

    /// Rows of any lengths, padded on the left with `pad` to the longest.
    pub fn left_padded(rows: &[Vec<u32>], pad: u32) -> Result<Self, ModelError> {
        Self::padded(rows, pad, true)
    }

    /// Rows of any lengths, padded on the right with `pad` to the longest.
    pub fn right_padded(rows: &[Vec<u32>], pad: u32) -> Result<Self, ModelError> {
        Self::padded(rows, pad, false)
    }

    fn padded(rows: &[Vec<u32>], pad: u32, left: bool) -> Result<Self, ModelError> {
        let len = rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut tokens = Vec::with_capacity(rows.len());
        let mut real = Vec::with_capacity(rows.len());
        for r in rows {
            let n = len - r.len();
            let (t, m): (Vec<u32>, Vec<bool>) = if left {
                (
                    vec![pad; n].into_iter().chain(r.iter().copied()).collect(),
                    (0..len).map(|i| i >= n).collect(),
                )
            } else {
                (
                    r.iter().copied().chain(vec![pad; n]).collect(),
                    (0..len).map(|i| i < r.len()).collect(),
                )
            };
            tokens.push(t);
            real.push(m);
        }
        Self::from_parts(&tokens, &real)
    }

    /// Rows of tokens and their real/padding flags (same shapes).
    pub fn from_parts(tokens: &[Vec<u32>], real: &[Vec<bool>]) -> Result<Self, ModelError> {
        let len = tokens.first().map_or(0, Vec::len);
        if tokens.is_empty() || len == 0 {
            return Err(ModelError::bad_input("empty batch"));
        }
        if real.len() != tokens.len()
            || tokens
                .iter()
                .zip(real)
                .any(|(t, m)| t.len() != len || m.len() != len)
        {
            return Err(ModelError::bad_input(
                "tokens and flags must be rows of one length",
            ));
        }
        Ok(Self {
            rows: tokens.len(),
            len,
            tokens: tokens.concat(),
            real: real.concat(),
        })
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Tokens per row (padding included).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a batch holds at least one token (kept for clippy's `len` convention).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Token `i` of row `row`.
    pub fn token(&self, row: usize, i: usize) -> u32 {
        self.tokens[row * self.len + i]
    }

    /// Whether token `i` of row `row` is real.
    pub fn is_real(&self, row: usize, i: usize) -> bool {
        self.real[row * self.len + i]
    }

    /// Index of the last real token of `row`, if any.
    pub fn last_real(&self, row: usize) -> Option<usize> {
        (0..self.len).rev().find(|&i| self.is_real(row, i))
    }

    /// The real/padding flags, one row per batch row.
    pub fn real_rows(&self) -> Vec<Vec<bool>> {
        self.real.chunks(self.len).map(<[bool]>::to_vec).collect()
    }
}

/// A causal language model: token ids in, next-token logits out.
pub trait LanguageModel<B: Backend> {
    /// Vocabulary size (width of the logits).
    fn vocab_size(&self) -> usize;

    /// Number of decoder blocks (layers of the cache).
    fn num_layers(&self) -> usize;

    /// The device the weights live on.
    fn device(&self) -> B::Device;

    /// Which implementations run the forward pass (chosen at load); code
    /// around the model (caches, adapters, log-softmax) reads its decisions
    /// from here rather than from the backend's type.
    fn plan(&self) -> &ExecutionPlan;

    /// Runs the tokens of `batch` after whatever `cache` holds, appends them
    /// to the cache, and returns the final hidden states (after the last
    /// norm) at every position, `[rows, len, hidden]` (rows at padding
    /// positions are meaningless). `delta` adds adapter outputs to the
    /// linear projections.
    fn forward_hidden(
        &self,
        batch: &Batch,
        cache: &mut KvCache<B>,
        delta: Option<&dyn LinearDelta<B>>,
    ) -> Result<Tensor<B, 3>, ModelError>;

    /// The output head: logits of final hidden states, `[rows, len, hidden]`
    /// → `[rows, len, vocab]` (with the final soft-capping where the model
    /// has one). Position by position, so it may be applied to any subset of
    /// the positions [`LanguageModel::forward_hidden`] returned.
    fn head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3>;

    /// Runs the tokens of `batch` after whatever `cache` holds, appends them
    /// to the cache, and returns logits for every position,
    /// `[rows, len, vocab]` (rows at padding positions are meaningless).
    /// `delta` adds adapter outputs to the linear projections.
    fn forward(
        &self,
        batch: &Batch,
        cache: &mut KvCache<B>,
        delta: Option<&dyn LinearDelta<B>>,
    ) -> Result<Tensor<B, 3>, ModelError> {
        Ok(self.head(self.forward_hidden(batch, cache, delta)?))
    }

    /// An empty cache for `rows` rows.
    fn new_cache(&self, rows: usize) -> KvCache<B> {
        self.new_cache_with(rows, KvPrecision::F32)
    }

    /// An empty cache for `rows` rows holding keys and values in `precision`
    /// (where the model's execution plan keeps them: [`ExecutionPlan::host_kv`]).
    fn new_cache_with(&self, rows: usize, precision: KvPrecision) -> KvCache<B> {
        KvCache::with_storage(self.num_layers(), rows, precision, self.plan().host_kv)
    }

    /// Logits at every position of `batch` from an empty cache.
    fn logits_all(&self, batch: &Batch) -> Result<Tensor<B, 3>, ModelError> {
        let mut cache = self.new_cache(batch.rows());
        self.forward(batch, &mut cache, None)
    }

    /// Runs `batch` through `cache` and returns the logits at each row's last
    /// real token, `[rows, vocab]` (an error if a row has none).
    fn logits_last(
        &self,
        batch: &Batch,
        cache: &mut KvCache<B>,
        delta: Option<&dyn LinearDelta<B>>,
    ) -> Result<Tensor<B, 2>, ModelError> {
        let last = last_real_positions(batch)?;
        // The head only where it is read: over a prompt of n tokens the
        // full `[rows, n, vocab]` logits would cost n head products and n
        // vocabulary-wide rows of memory for one row of use.
        let hidden = select_positions(self.forward_hidden(batch, cache, delta)?, &last);
        let [rows, width] = hidden.dims();
        let logits = self.head(hidden.reshape([rows, 1, width]));
        Ok(logits.reshape([rows, self.vocab_size()]))
    }

    /// The head's logits of host hidden states `hidden: [rows, width]`
    /// (row-major, after the last norm), row-major `[rows, vocab]`, where the
    /// plan computes them on the host: the same values as
    /// [`LanguageModel::head`], without a tensor on either side. `None` where it
    /// does not (then [`LanguageModel::log_probs_last_rows`] goes through
    /// [`LanguageModel::head`]).
    fn head_host(&self, hidden: &[f32], rows: usize) -> Option<Vec<f32>> {
        let _ = (hidden, rows);
        None
    }

    /// [`LanguageModel::logits_last`]'s log-softmax over the vocabulary, read into
    /// host memory (`[rows, vocab]`, row-major): the next-token log-probabilities
    /// of every row. Where the plan computes the head on the host
    /// ([`LanguageModel::head_host`]) the logits go from the head's product
    /// straight into the log-softmax, in place, in one buffer (a decode step
    /// over many rows holds `rows × vocab` of them); elsewhere by
    /// [`log_softmax_to_vec`]. The same values either way.
    fn log_probs_last_rows(
        &self,
        batch: &Batch,
        cache: &mut KvCache<B>,
        delta: Option<&dyn LinearDelta<B>>,
    ) -> Result<Vec<f32>, ModelError> {
        let last = last_real_positions(batch)?;
        let hidden = select_positions(self.forward_hidden(batch, cache, delta)?, &last);
        let [rows, width] = hidden.dims();
        #[cfg(feature = "flex")]
        if self.plan().products.cpu_kernels
            && let Some(mut logits) = self.head_host(&to_vec(hidden.clone())?, rows)
        {
            crate::cpu::vexp::log_softmax_rows_in_place(&mut logits, self.vocab_size());
            return Ok(logits);
        }
        let logits = self.head(hidden.reshape([rows, 1, width]));
        log_softmax_to_vec(self.plan(), logits.reshape([rows, self.vocab_size()]))
    }

    /// Log-probabilities of the next token after `tokens` (one row, empty
    /// cache), on the host.
    fn log_probs_last(&self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let batch = Batch::single(tokens)?;
        let mut cache = self.new_cache(1);
        let logits = self.logits_last(&batch, &mut cache, None)?;
        to_vec(log_softmax(logits))
    }

    /// `log p(tokens[i + 1] | tokens[..=i])` for every `i` (one row, empty
    /// cache): `tokens.len() - 1` values, gathered on the device, for
    /// perplexity. An error for fewer than two tokens.
    fn next_token_log_probs(&self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        if tokens.len() < 2 {
            return Err(ModelError::bad_input("need at least two tokens"));
        }
        let n = tokens.len() - 1;
        let logits = self.logits_all(&Batch::single(&tokens[..n])?)?;
        let targets: Vec<i64> = tokens[1..].iter().map(|&t| i64::from(t)).collect();
        let idx =
            Tensor::<B, 3, Int>::from_data(TensorData::new(targets, [1, n, 1]), &self.device());
        to_vec(log_softmax(logits).gather(2, idx))
    }
}

/// Log-softmax over the last dimension, read into host memory (row-major).
/// Where `plan` (the model's) uses the CPU kernels, computed there,
/// vectorised and rows in parallel (`cpu::vexp`); elsewhere by
/// [`log_softmax`] on the device.
pub fn log_softmax_to_vec<B: Backend, const D: usize>(
    plan: &ExecutionPlan,
    logits: Tensor<B, D>,
) -> Result<Vec<f32>, ModelError> {
    #[cfg(not(feature = "flex"))]
    let _ = plan;
    #[cfg(feature = "flex")]
    if plan.products.cpu_kernels {
        let width = logits.dims()[D - 1];
        let mut v = to_vec(logits)?;
        crate::cpu::vexp::log_softmax_rows_in_place(&mut v, width);
        return Ok(v);
    }
    to_vec(log_softmax(logits))
}

/// Log-softmax over the last dimension, on the device.
pub fn log_softmax<B: Backend, const D: usize>(logits: Tensor<B, D>) -> Tensor<B, D> {
    activation::log_softmax(logits, D - 1)
}

/// The `[rows, width]` slice of `[rows, len, width]` values (logits, hidden
/// states) at position `positions[row]` of each row.
pub fn select_positions<B: Backend>(values: Tensor<B, 3>, positions: &[usize]) -> Tensor<B, 2> {
    let [rows, len, width] = values.dims();
    let idx: Vec<i64> = positions
        .iter()
        .enumerate()
        .map(|(r, &p)| (r * len + p) as i64)
        .collect();
    let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(idx, [rows]), &values.device());
    values.reshape([rows * len, width]).select(0, idx)
}

/// One forward step's inputs on the device, made by [`start_step`].
#[derive(Debug, Clone)]
pub struct Step<B: Backend> {
    /// Token ids, `[rows, len]`.
    pub ids: Tensor<B, 2, Int>,
    /// Position (RoPE index) of every token, `[rows][len]`.
    pub positions: Vec<Vec<usize>>,
}

/// Checks `batch` against the model and the cache, registers the step in the
/// cache, and returns the [`Step`]. Called first by every model's forward.
pub fn start_step<B: Backend, M: LanguageModel<B> + ?Sized>(
    model: &M,
    batch: &Batch,
    cache: &mut KvCache<B>,
) -> Result<Step<B>, ModelError> {
    if cache.num_layers() != model.num_layers() {
        return Err(ModelError::bad_input(format!(
            "cache has {} layers, model {}",
            cache.num_layers(),
            model.num_layers()
        )));
    }
    let vocab = model.vocab_size();
    if let Some(&bad) = batch.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ModelError::bad_input(format!(
            "token id {bad} outside the vocabulary of {vocab}"
        )));
    }
    let positions = cache.push_step(&batch.real_rows())?;
    let ids: Vec<i64> = batch.tokens.iter().map(|&t| i64::from(t)).collect();
    let ids = Tensor::from_data(
        TensorData::new(ids, [batch.rows, batch.len]),
        &model.device(),
    );
    Ok(Step { ids, positions })
}

/// Greedy decoding: feeds `prompt`, then `n` times appends the most likely
/// token. Returns the `n` new tokens.
pub fn generate_greedy<B: Backend, M: LanguageModel<B> + ?Sized>(
    model: &M,
    prompt: &[u32],
    n: usize,
    delta: Option<&dyn LinearDelta<B>>,
) -> Result<Vec<u32>, ModelError> {
    generate(model, prompt, n, delta, |logits| {
        let mut best = 0;
        for (i, &l) in logits.iter().enumerate() {
            if l > logits[best] {
                best = i;
            }
        }
        best as u32
    })
}

/// Sampling at temperature `temperature` (> 0) from the model's next-token
/// distribution, `n` tokens after `prompt`, with randomness from `rng`.
pub fn generate_sampled<B: Backend, M: LanguageModel<B> + ?Sized, R: Rng>(
    model: &M,
    prompt: &[u32],
    n: usize,
    temperature: f64,
    rng: &mut R,
    delta: Option<&dyn LinearDelta<B>>,
) -> Result<Vec<u32>, ModelError> {
    if !(temperature.is_finite() && temperature > 0.0) {
        return Err(ModelError::bad_input(format!(
            "temperature {temperature} is not a positive number"
        )));
    }
    generate(model, prompt, n, delta, |logits| {
        let max = logits
            .iter()
            .fold(f64::NEG_INFINITY, |m, &l| m.max(f64::from(l)));
        let weights: Vec<f64> = logits
            .iter()
            .map(|&l| ((f64::from(l) - max) / temperature).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut u = rng.random::<f64>() * total;
        for (i, w) in weights.iter().enumerate() {
            if u < *w {
                return i as u32;
            }
            u -= w;
        }
        (weights.len() - 1) as u32
    })
}

fn generate<B: Backend, M: LanguageModel<B> + ?Sized>(
    model: &M,
    prompt: &[u32],
    n: usize,
    delta: Option<&dyn LinearDelta<B>>,
    mut pick: impl FnMut(&[f32]) -> u32,
) -> Result<Vec<u32>, ModelError> {
    let mut cache = model.new_cache(1);
    let mut out = Vec::with_capacity(n);
    let mut step = Batch::single(prompt)?;
    for _ in 0..n {
        let logits = to_vec(model.logits_last(&step, &mut cache, delta)?)?;
        if logits.iter().any(|l| l.is_nan()) {
            return Err(ModelError::NonFiniteOutput(
                "NaN logits during generation".into(),
            ));
        }
        let next = pick(&logits);
        out.push(next);
        step = Batch::single(&[next])?;
    }
    Ok(out)
}

/// Each row's last real token position (an error naming the first row that has
/// none): where [`LanguageModel::logits_last`] and
/// [`LanguageModel::log_probs_last_rows`] read the head.
fn last_real_positions(batch: &Batch) -> Result<Vec<usize>, ModelError> {
    (0..batch.rows())
        .map(|r| {
            batch
                .last_real(r)
                .ok_or_else(|| ModelError::bad_input(format!("row {r} has no real token")))
        })
        .collect()
}
