//! `EnsembleRunner`: the public model and N LoRA members in one batched
//! forward — base weights shared, each member's update applied per row as a
//! batched low-rank product `(x A_i) B_i`, a KV cache row per batch row —
//! for the mechanisms' per-step `(N + 1) × V` log-probabilities.

use burn::tensor::{Int, Tensor, TensorData, backend::Backend};
use privmix_models::runtime::to_vec;
use privmix_models::{Batch, KvCache, KvPrecision, LanguageModel, LinearDelta, log_softmax};

pub use crate::error::EnsembleError;
use crate::lora::{BaseShapes, LoraAdapter, LoraBase};
use crate::rows::{BlockScores, LogProbRows, RowLayout};
use crate::stacked::{FactorPrecision, RowAdapters, StackedAdapters};

/// A base model and N LoRA members run together.
///
/// Every step runs the rows of a [`RowLayout`] through the base model once,
/// with [`StackedAdapters`] adding each row's member update at every adapted
/// projection. Row `i` therefore computes exactly what the model with member
/// `layout[i]`'s adapter computes alone (tested to 1e-4 in `tests/integration/runner.rs`),
/// and the base weights are read once per step for all rows.
#[derive(Debug, Clone)]
pub struct EnsembleRunner<B: Backend, M> {
    model: M,
    base: BaseShapes,
    adapters: StackedAdapters<B>,
    kv: KvPrecision,
}

impl<B: Backend, M: LanguageModel<B> + LoraBase> EnsembleRunner<B, M> {
    /// A runner over `model` with `members` (possibly none: the public model
    /// alone), each checked against the model's projections.
    pub fn new(model: M, members: &[LoraAdapter<B>]) -> Result<Self, EnsembleError> {
        Self::with_precision(model, members, FactorPrecision::F32)
    }

    /// [`EnsembleRunner::new`] with the members' factors held as
    /// `precision` says ([`FactorPrecision::F16`]: half the bytes per
    /// step, each factor entry rounded to f16 once).
    pub fn with_precision(
        model: M,
        members: &[LoraAdapter<B>],
        precision: FactorPrecision,
    ) -> Result<Self, EnsembleError> {
        let base = model.base_shapes()?;
        let adapters = StackedAdapters::with_precision(
            members,
            &base,
            precision,
            model.plan(),
            &model.device(),
        )?;
        Ok(Self {
            model,
            base,
            adapters,
            kv: KvPrecision::F32,
        })
    }

    /// The runner with its decoders' and block scorings' caches holding
    /// keys and values in `kv` ([`KvPrecision::F16`]: each rounded to f16
    /// when appended; half the cache memory and bytes read per step on
    /// plain flex). Default: f32.
    pub fn with_kv_precision(mut self, kv: KvPrecision) -> Self {
        self.kv = kv;
        self
    }

    /// How the runner's caches hold keys and values.
    pub fn kv_precision(&self) -> KvPrecision {
        self.kv
    }

    /// The base model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The base model's adaptable projections.
    pub fn base_shapes(&self) -> &BaseShapes {
        &self.base
    }

    /// Number of members.
    pub fn num_members(&self) -> usize {
        self.adapters.num_members()
    }

    /// The stacked member factors.
    pub fn adapters(&self) -> &StackedAdapters<B> {
        &self.adapters
    }

    /// A decoder of no rows, to which prefilled decoders are joined with
    /// [`Decoder::append`] (a server's batch before its first request).
    pub fn empty_decoder(&self) -> Decoder<'_, B, M> {
        Decoder {
            runner: self,
            cache: self.model.new_cache_with(0, self.kv),
            layout: RowLayout::custom(Vec::new()),
            adapters: RowAdapters::none(),
        }
    }

    /// An incremental decoder over `layout`'s rows with an empty KV cache.
    pub fn decoder(&self, layout: RowLayout) -> Result<Decoder<'_, B, M>, EnsembleError> {
        if layout.is_empty() {
            return Err(EnsembleError::BadInput("a layout with no rows".into()));
        }
        let adapters = self.adapters.for_rows(layout.rows())?;
        Ok(Decoder {
            runner: self,
            cache: self.model.new_cache_with(layout.len(), self.kv),
            layout,
            adapters,
        })
    }

    /// Teacher-forced scoring of `tokens` (≥ 2) by every row of `layout`:
    /// `log p(tokens[i + 1] | tokens[..=i])`, gathered on the device (for
    /// perplexity over fixed-length blocks).
    pub fn score_block(
        &self,
        layout: &RowLayout,
        tokens: &[u32],
    ) -> Result<BlockScores, EnsembleError> {
        let (log_probs, n) = self.block_log_probs(layout, tokens)?;
        let rows = layout.len();
        let targets: Vec<i64> = (0..rows)
            .flat_map(|_| tokens[1..].iter().map(|&t| i64::from(t)))
            .collect();
        let idx = Tensor::<B, 3, Int>::from_data(
            TensorData::new(targets, [rows, n, 1]),
            &self.model.device(),
        );
        let values = to_vec(log_probs.gather(2, idx))?;
        Ok(BlockScores::new(layout.clone(), n, values))
    }

    /// Teacher-forced full distributions: for each position `i` of `tokens`
    /// but the last, every row's log-probabilities of the token after
    /// `tokens[..=i]` (what a mixing mechanism needs at every position of a
    /// block). Holds `rows × (len − 1) × V` floats on the host.
    pub fn score_block_full(
        &self,
        layout: &RowLayout,
        tokens: &[u32],
    ) -> Result<Vec<LogProbRows>, EnsembleError> {
        let (log_probs, n) = self.block_log_probs(layout, tokens)?;
        let vocab = self.model.vocab_size();
        // [rows, n, V] -> [n, rows, V] so each position is one contiguous slab.
        let flat = to_vec(log_probs.swap_dims(0, 1))?;
        let per = layout.len() * vocab;
        Ok((0..n)
            .map(|i| LogProbRows::new(layout.clone(), vocab, flat[i * per..(i + 1) * per].to_vec()))
            .collect())
    }

    fn block_log_probs(
        &self,
        layout: &RowLayout,
        tokens: &[u32],
    ) -> Result<(Tensor<B, 3>, usize), EnsembleError> {
        if tokens.len() < 2 {
            return Err(EnsembleError::BadInput(
                "a block needs at least two tokens".into(),
            ));
        }
        if layout.is_empty() {
            return Err(EnsembleError::BadInput("a layout with no rows".into()));
        }
        let n = tokens.len() - 1;
        let adapters = self.adapters.for_rows(layout.rows())?;
        let batch = Batch::new(&vec![tokens[..n].to_vec(); layout.len()])?;
        let mut cache = self.model.new_cache_with(layout.len(), self.kv);
        let logits = self.model.forward(&batch, &mut cache, hook(&adapters))?;
        Ok((log_softmax(logits), n))
    }
}

fn hook<B: Backend>(adapters: &RowAdapters<B>) -> Option<&dyn LinearDelta<B>> {
    (!adapters.is_empty()).then_some(adapters as &dyn LinearDelta<B>)
}

/// Incremental decoding of a [`RowLayout`]'s rows through one KV cache (a
/// cache row per batch row), made by [`EnsembleRunner::decoder`]. Each call
/// returns the next-token log-probabilities of every row. After an error in
/// a step the cache may hold part of the failed step: start a new decoder.
///
/// Continuous batching: decoders of the same runner join with
/// [`Decoder::append`] and rows leave with [`Decoder::retain_rows`], at step
/// boundaries; each row keeps its own context and decodes as it would in a
/// decoder of its own (the rows' caches are aligned at their last slot,
/// shorter ones padded in front with masked slots). A server starts from
/// [`EnsembleRunner::empty_decoder`], prefills each request in a decoder of
/// its own ([`Decoder::prefill`]), appends it to the running batch, steps all
/// rows with [`Decoder::next_log_probs_rows`] (each request reads its run of
/// rows: [`LogProbRows::slice`]), and drops a finished request's rows.
#[derive(Debug)]
pub struct Decoder<'a, B: Backend, M> {
    runner: &'a EnsembleRunner<B, M>,
    layout: RowLayout,
    adapters: RowAdapters<B>,
    cache: KvCache<B>,
}

impl<B: Backend, M> Clone for Decoder<'_, B, M> {
    /// A copy of the decoder's state (the cache's tensors are shared until
    /// written), to branch decoding or to repeat a step.
    fn clone(&self) -> Self {
        Self {
            runner: self.runner,
            layout: self.layout.clone(),
            adapters: self.adapters.clone(),
            cache: self.cache.clone(),
        }
    }
}

impl<'a, B: Backend, M: LanguageModel<B> + LoraBase> Decoder<'a, B, M> {
    /// The row layout.
    pub fn layout(&self) -> &RowLayout {
        &self.layout
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.layout.len()
    }

    /// True when the decoder holds no rows (nothing to step).
    pub fn is_empty(&self) -> bool {
        self.layout.is_empty()
    }

    /// Tokens fed to row `row` so far (its context length), `None` past
    /// the last row.
    pub fn context_len(&self, row: usize) -> Option<usize> {
        self.cache.real_tokens(row)
    }

    /// Slots the cache holds per row: the longest row's context, plus
    /// padding slots that no row holds until [`Decoder::retain_rows`]
    /// drops them.
    pub fn cache_slots(&self) -> usize {
        self.cache.slots()
    }

    /// Adds `other`'s rows after this decoder's rows (layouts concatenated,
    /// caches joined by [`KvCache::append_rows`]), so that the next steps
    /// decode both together; each row continues from its own context.
    /// Errors, with this decoder unchanged: `other` made by another runner
    /// ([`EnsembleError::BadInput`]), or caches that cannot be joined
    /// ([`EnsembleError::Model`], e.g. a cache left by a failed step).
    pub fn append(&mut self, other: Decoder<'a, B, M>) -> Result<(), EnsembleError> {
        if !std::ptr::eq(self.runner, other.runner) {
            return Err(EnsembleError::BadInput(
                "decoders of different runners cannot be joined".into(),
            ));
        }
        let mut rows = self.layout.rows().to_vec();
        rows.extend_from_slice(other.layout.rows());
        let layout = RowLayout::custom(rows);
        let adapters = self.runner.adapters.for_rows(layout.rows())?;
        self.cache.append_rows(other.cache)?;
        self.layout = layout;
        self.adapters = adapters;
        Ok(())
    }

    /// Keeps rows `keep` (in that order; e.g. without a finished request's
    /// rows), and drops the cache slots no remaining row holds, so a batch
    /// whose requests come and go keeps no more slots than its longest
    /// context needs. An empty `keep` leaves a decoder of no rows. A row
    /// index past the last row gives [`EnsembleError::BadInput`], with this
    /// decoder unchanged.
    pub fn retain_rows(&mut self, keep: &[usize]) -> Result<(), EnsembleError> {
        if let Some(&bad) = keep.iter().find(|&&r| r >= self.layout.len()) {
            return Err(EnsembleError::BadInput(format!(
                "row {bad} out of range for a decoder of {} rows",
                self.layout.len()
            )));
        }
        let layout = RowLayout::custom(keep.iter().map(|&r| self.layout.rows()[r]).collect());
        let adapters = self.runner.adapters.for_rows(layout.rows())?;
        self.cache.select_rows(keep)?;
        self.cache.compact();
        self.layout = layout;
        self.adapters = adapters;
        Ok(())
    }

    /// [`Decoder::retain_rows`] for a batch whose rows leave at almost every
    /// step (a server): the slots no remaining row holds are dropped only once
    /// the cache holds at least twice the longest remaining context (and more
    /// than 16 slots), so that each slot is moved O(1) times rather than the
    /// whole cache at every leave; until then they stay as masked padding,
    /// which no row attends. Row `keep[i]` should be at least `i` (rows kept in
    /// order, or a leaving request's place filled by the last request's rows):
    /// the cache then moves only the rows that change place.
    pub fn leave(&mut self, keep: &[usize]) -> Result<(), EnsembleError> {
        if let Some(&bad) = keep.iter().find(|&&r| r >= self.layout.len()) {
            return Err(EnsembleError::BadInput(format!(
                "row {bad} out of range for a decoder of {} rows",
                self.layout.len()
            )));
        }
        let layout = RowLayout::custom(keep.iter().map(|&r| self.layout.rows()[r]).collect());
        let adapters = self.runner.adapters.for_rows(layout.rows())?;
        self.cache.select_rows(keep)?;
        let longest = (0..keep.len())
            .filter_map(|r| self.cache.real_tokens(r))
            .max()
            .unwrap_or(0);
        if self.cache.slots() > (2 * longest).max(16) {
            self.cache.compact();
        }
        self.layout = layout;
        self.adapters = adapters;
        Ok(())
    }

    /// Feeds the same `context` to every row (the ensemble case).
    pub fn prefill(&mut self, context: &[u32]) -> Result<LogProbRows, EnsembleError> {
        if context.is_empty() {
            return Err(EnsembleError::BadInput("empty context".into()));
        }
        self.check_rows(self.layout.len())?;
        let rows = vec![context.to_vec(); self.layout.len()];
        self.run(&Batch::new(&rows)?)
    }

    /// Feeds a different context to each row (DPS-MOZO's zero-shot and
    /// one-shot prompts), left-padded to the longest with masked padding, so
    /// each row sees only its own tokens.
    pub fn prefill_rows(&mut self, contexts: &[Vec<u32>]) -> Result<LogProbRows, EnsembleError> {
        self.check_rows(contexts.len())?;
        if contexts.iter().any(Vec::is_empty) {
            return Err(EnsembleError::BadInput(
                "a row with an empty context".into(),
            ));
        }
        self.run(&Batch::left_padded(contexts, 0)?)
    }

    /// Appends `token` to every row and returns the next `rows × V`
    /// log-probabilities (the released token of a private prediction step).
    pub fn next_log_probs(&mut self, token: u32) -> Result<LogProbRows, EnsembleError> {
        self.check_rows(self.layout.len())?;
        self.run(&Batch::new(&vec![vec![token]; self.layout.len()])?)
    }

    /// Appends `tokens[i]` to row `i` and returns the next log-probabilities.
    pub fn next_log_probs_rows(&mut self, tokens: &[u32]) -> Result<LogProbRows, EnsembleError> {
        self.check_rows(tokens.len())?;
        let rows: Vec<Vec<u32>> = tokens.iter().map(|&t| vec![t]).collect();
        self.run(&Batch::new(&rows)?)
    }

    fn check_rows(&self, n: usize) -> Result<(), EnsembleError> {
        if self.layout.is_empty() {
            return Err(EnsembleError::BadInput(
                "the decoder holds no rows to decode".into(),
            ));
        }
        if n != self.layout.len() {
            return Err(EnsembleError::BadInput(format!(
                "{n} rows of input for a layout of {} rows",
                self.layout.len()
            )));
        }
        Ok(())
    }

    fn run(&mut self, batch: &Batch) -> Result<LogProbRows, EnsembleError> {
        let model = &self.runner.model;
        let values = model.log_probs_last_rows(batch, &mut self.cache, hook(&self.adapters))?;
        Ok(LogProbRows::new(
            self.layout.clone(),
            model.vocab_size(),
            values,
        ))
    }
}
