//! Which member each batch row runs, and the host-side outputs of a step.

/// The member each row of an ensemble batch runs: `None` is the public
/// (base) model, `Some(i)` member `i`'s adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowLayout {
    rows: Vec<Option<usize>>,
}

impl RowLayout {
    /// Any assignment of rows to members.
    pub fn custom(rows: Vec<Option<usize>>) -> Self {
        Self { rows }
    }

    /// Row 0 the public model, rows `1..=n` members `0..n` (PMixED,
    /// AdaPMixED: the public row and N member rows).
    pub fn public_and_members(n: usize) -> Self {
        Self::custom(std::iter::once(None).chain((0..n).map(Some)).collect())
    }

    /// The given members only, in order.
    pub fn members(members: &[usize]) -> Self {
        Self::custom(members.iter().map(|&m| Some(m)).collect())
    }

    /// SubMix (Ginart et al. 2022): row 0 the public model, then the two
    /// members of each part, `pairs[k] = (a, b)` at rows `1 + 2k` and `2 + 2k`.
    pub fn submix_pairs(pairs: &[(usize, usize)]) -> Self {
        Self::custom(
            std::iter::once(None)
                .chain(pairs.iter().flat_map(|&(a, b)| [Some(a), Some(b)]))
                .collect(),
        )
    }

    /// `n` rows of the base model alone (DPS-MOZO's prompt rows: one
    /// zero-shot and `n − 1` one-shot prompts, no adapters).
    pub fn public_only(n: usize) -> Self {
        Self::custom(vec![None; n])
    }

    /// The member of every row.
    pub fn rows(&self) -> &[Option<usize>] {
        &self.rows
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True when there are no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// Next-token natural-log probabilities of every row of one step, `rows × V`
/// row-major in f32 (log-softmax computed on the device).
///
/// For a [`RowLayout::public_and_members`] layout, [`LogProbRows::row`]`(0)`
/// is the public row and [`LogProbRows::member_rows`] the N member rows
/// contiguous, the layout of `privmix_mechanisms::Rows::LogF32` for
/// `Ensemble::new(public, members)`.
#[derive(Debug, Clone, PartialEq)]
pub struct LogProbRows {
    layout: RowLayout,
    vocab: usize,
    values: Vec<f32>,
}

impl LogProbRows {
    pub(crate) fn new(layout: RowLayout, vocab: usize, values: Vec<f32>) -> Self {
        debug_assert_eq!(values.len(), layout.len() * vocab);
        Self {
            layout,
            vocab,
            values,
        }
    }

    /// The row layout.
    pub fn layout(&self) -> &RowLayout {
        &self.layout
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.layout.len()
    }

    /// Vocabulary size V.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Row `i`'s log-probabilities (length V).
    pub fn row(&self, i: usize) -> &[f32] {
        &self.values[i * self.vocab..(i + 1) * self.vocab]
    }

    /// Rows `rows` with their part of the layout (e.g. one request's run
    /// of rows in a batch of several), or `None` where the range ends past
    /// the last row.
    pub fn slice(&self, rows: std::ops::Range<usize>) -> Option<LogProbRows> {
        let layout = RowLayout::custom(self.layout.rows().get(rows.clone())?.to_vec());
        let values = self.values[rows.start * self.vocab..rows.end * self.vocab].to_vec();
        Some(Self::new(layout, self.vocab, values))
    }

    /// All rows, row-major.
    pub fn as_flat(&self) -> &[f32] {
        &self.values
    }

    /// Rows `1..` row-major: the member rows when row 0 is the public model.
    pub fn member_rows(&self) -> &[f32] {
        &self.values[self.vocab.min(self.values.len())..]
    }

    /// All rows converted to f64.
    pub fn to_f64(&self) -> Vec<f64> {
        self.values.iter().map(|&v| f64::from(v)).collect()
    }
}

/// Teacher-forced scores of one block for every row: `log p(t[i + 1] | t[..=i])`
/// for each position `i` of the block and each row.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockScores {
    layout: RowLayout,
    positions: usize,
    values: Vec<f32>,
}

impl BlockScores {
    pub(crate) fn new(layout: RowLayout, positions: usize, values: Vec<f32>) -> Self {
        Self {
            layout,
            positions,
            values,
        }
    }

    /// The row layout.
    pub fn layout(&self) -> &RowLayout {
        &self.layout
    }

    /// Number of scored positions (block length − 1).
    pub fn positions(&self) -> usize {
        self.positions
    }

    /// Row `r`'s target log-probabilities, one per position.
    pub fn row(&self, r: usize) -> &[f32] {
        &self.values[r * self.positions..(r + 1) * self.positions]
    }

    /// Row `r`'s perplexity, `exp(−mean log p)`, accumulated in f64.
    pub fn perplexity(&self, r: usize) -> f64 {
        let row = self.row(r);
        let sum: f64 = row.iter().map(|&v| f64::from(v)).sum();
        (-sum / row.len() as f64).exp()
    }
}
