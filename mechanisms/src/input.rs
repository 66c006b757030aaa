//! Next-token distributions as the mechanisms receive them.
//!
//! A model runtime hands over its raw logits, or probabilities, or
//! log-probabilities, in f32 or f64, as rows of one buffer. [`Ensemble::new`]
//! validates them once and converts them to f64 probability rows that sum to 1
//! in f64: every divergence a mechanism charges is then computed on exactly the
//! distribution it samples from.

use privmix_renyi::{NORMALISATION_TOLERANCE, ValidatedRow, ValidatedRows};
use rayon::prelude::*;

use crate::MechanismError;
use crate::bounds::MAX_VOCAB;

/// Rows of next-token distributions in one row-major buffer.
///
/// Any model runtime can feed the mechanisms: logits straight from the model's
/// head ([`Rows::LogitsF32`]), or distributions it has already normalised.
///
/// ```
/// use privmix_mechanisms::{Ensemble, Rows};
///
/// // Public logits over a vocabulary of 3, and two members' logits (row-major);
/// // −∞ masks a token.
/// let public = [2.0_f32, 1.0, 0.0];
/// let members = [1.0_f32, 1.0, 1.0, 0.5, f32::NEG_INFINITY, 3.0];
/// let e = Ensemble::new(Rows::LogitsF32(&public), Rows::LogitsF32(&members))?;
/// assert_eq!(e.len(), 2);
/// assert_eq!(e.member(1)[1], 0.0);
/// assert!((e.member(0)[2] - 1.0 / 3.0).abs() < 1e-15);
/// # Ok::<(), privmix_mechanisms::MechanismError>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub enum Rows<'a> {
    /// Probabilities in f32.
    ProbF32(&'a [f32]),
    /// Probabilities in f64.
    ProbF64(&'a [f64]),
    /// Natural-log probabilities in f32 (−∞ for zero).
    LogProbF32(&'a [f32]),
    /// Natural-log probabilities in f64 (−∞ for zero).
    LogProbF64(&'a [f64]),
    /// Unnormalised scores (logits) in f32, widened to f64 and turned into
    /// probabilities by a log-softmax in f64 (`x − max − ln Σ exp(x − max)`, so
    /// nothing overflows whatever the scale). −∞ masks a token (probability 0);
    /// NaN or +∞ is [`MechanismError::NonFinite`], a row of −∞ only is
    /// [`MechanismError::NoFiniteLogit`].
    LogitsF32(&'a [f32]),
    /// Unnormalised scores (logits) in f64, as [`Rows::LogitsF32`].
    LogitsF64(&'a [f64]),
}

impl<'a> Rows<'a> {
    fn len(&self) -> usize {
        match self {
            Rows::ProbF32(r) => r.len(),
            Rows::ProbF64(r) => r.len(),
            Rows::LogProbF32(r) => r.len(),
            Rows::LogProbF64(r) => r.len(),
            Rows::LogitsF32(r) => r.len(),
            Rows::LogitsF64(r) => r.len(),
        }
    }

    /// Entries `start..start + len`, of the same kind.
    fn slice(&self, start: usize, len: usize) -> Rows<'a> {
        let range = start..start + len;
        match *self {
            Rows::ProbF32(r) => Rows::ProbF32(&r[range]),
            Rows::ProbF64(r) => Rows::ProbF64(&r[range]),
            Rows::LogProbF32(r) => Rows::LogProbF32(&r[range]),
            Rows::LogProbF64(r) => Rows::LogProbF64(&r[range]),
            Rows::LogitsF32(r) => Rows::LogitsF32(&r[range]),
            Rows::LogitsF64(r) => Rows::LogitsF64(&r[range]),
        }
    }
}

/// A validated step input: the public distribution and N member distributions,
/// each an f64 probability row of length `vocab` summing to 1 in f64.
///
/// The rows are kept as `privmix_renyi::ValidatedRows`, so that the λ solves of every
/// step (N of them against the same public row) do not validate them again.
#[derive(Debug, Clone, PartialEq)]
pub struct Ensemble {
    public: ValidatedRows,
    members: ValidatedRows,
}

impl Ensemble {
    /// Validates and converts. Each row must be finite (log rows may hold −∞),
    /// non-negative, and sum to 1 within [`NORMALISATION_TOLERANCE`]; it is then
    /// divided by its f64 sum so that it is a distribution in f64. Rows may hold at
    /// most [`MAX_VOCAB`] entries ([`MechanismError::VocabularyTooLarge`]): the charges
    /// of the averaged mechanisms rest on every row's exact mass lying within `1 ±`
    /// [`row_mass_deviation`](crate::bounds::row_mass_deviation), which is proven for
    /// rows up to that length (`src/pmixed/proof.md`, "Rounding"). Row 0 in errors is
    /// the public row, row i ≥ 1 is member i − 1.
    ///
    /// Zero members are allowed here (the public-only baseline); mechanisms that
    /// need members return [`MechanismError::EmptyEnsemble`].
    pub fn new(public: Rows<'_>, members: Rows<'_>) -> Result<Self, MechanismError> {
        Self::build(public, members, Vec::new(), Vec::new())
    }

    /// [`Ensemble::new`] for the next token, reusing this ensemble's buffers: a
    /// runtime that builds an ensemble every step then allocates (and the kernel
    /// zero-fills) nothing new. On error the buffers are dropped.
    pub fn renew(self, public: Rows<'_>, members: Rows<'_>) -> Result<Self, MechanismError> {
        Self::build(
            public,
            members,
            self.public.into_data(),
            self.members.into_data(),
        )
    }

    /// [`Ensemble::renew`] on `previous` where there is one, else
    /// [`Ensemble::new`]: the form for a loop that builds one ensemble per
    /// token and keeps the last (`last = Some(Ensemble::renew_or_new(last.take(), ..)?)`).
    pub fn renew_or_new(
        previous: Option<Self>,
        public: Rows<'_>,
        members: Rows<'_>,
    ) -> Result<Self, MechanismError> {
        match previous {
            Some(e) => e.renew(public, members),
            None => Self::new(public, members),
        }
    }

    fn build(
        public: Rows<'_>,
        members: Rows<'_>,
        mut public_buf: Vec<f64>,
        mut members_buf: Vec<f64>,
    ) -> Result<Self, MechanismError> {
        let vocab = public.len();
        if vocab == 0 {
            return Err(MechanismError::EmptyVocabulary);
        }
        if vocab > MAX_VOCAB {
            return Err(MechanismError::VocabularyTooLarge {
                vocab,
                max: MAX_VOCAB,
            });
        }
        if !members.len().is_multiple_of(vocab) {
            return Err(MechanismError::LengthMismatch {
                what: "members",
                len: members.len(),
                vocab,
            });
        }
        public_buf.resize(vocab, 0.0);
        let public_sum = convert_row(public, 0, &mut public_buf)?;
        // Rows are converted in parallel, each into its own slice of one buffer;
        // each row's arithmetic is that of `convert_row` alone, so the result does
        // not depend on the thread count. The first bad row (in order) is reported.
        members_buf.resize(members.len(), 0.0);
        let member_sums = members_buf
            .par_chunks_mut(vocab)
            .enumerate()
            .map(|(m, out)| convert_row(members.slice(m * vocab, vocab), m + 1, out))
            .collect::<Vec<_>>()
            .into_iter()
            .collect::<Result<Vec<f64>, _>>()?;
        // Each row divided by its sum in the pass that validates it for the solvers.
        Ok(Self {
            public: ValidatedRows::new_divided(public_buf, vocab, &[public_sum])?,
            members: ValidatedRows::new_divided(members_buf, vocab, &member_sums)?,
        })
    }

    /// From f64 probability rows (the common case in tests).
    pub fn from_probabilities(public: &[f64], members: &[f64]) -> Result<Self, MechanismError> {
        Self::new(Rows::ProbF64(public), Rows::ProbF64(members))
    }

    /// Vocabulary size V.
    pub fn vocab(&self) -> usize {
        self.public.row_len()
    }

    /// Number of members N.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// True when there are no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The public distribution p0.
    pub fn public(&self) -> &[f64] {
        self.public.entries(0)
    }

    /// The public distribution with its validation summary (for the solvers).
    pub fn public_row(&self) -> ValidatedRow<'_> {
        self.public.row(0)
    }

    /// Member i's distribution p_i (0-based).
    pub fn member(&self, i: usize) -> &[f64] {
        self.members.entries(i)
    }

    /// Member i's distribution with its validation summary (for the solvers).
    pub fn member_row(&self, i: usize) -> ValidatedRow<'_> {
        self.members.row(i)
    }

    /// All member rows, row-major.
    pub fn members(&self) -> &[f64] {
        self.members.as_slice()
    }

    /// The same ensemble without member i: the neighbouring dataset of
    /// PMixED and AdaPMixED (a member's data removed). Used by tests and audits.
    pub fn without_member(&self, i: usize) -> Self {
        Self {
            public: self.public.clone(),
            members: self.members.without_row(i),
        }
    }
}

/// One row converted to f64 probabilities in `out` (of the row's length): checked
/// (finite and non-negative, or for log rows not NaN and not positive, or for
/// logits not NaN, not +∞ and not all −∞) and summed; its sum, which must lie
/// within [`NORMALISATION_TOLERANCE`] of 1 (a softmax sums to 1 within a few ulps
/// per entry), is returned, for the caller to divide the row by
/// (`ValidatedRows::new_divided`).
fn convert_row(row: Rows<'_>, index: usize, out: &mut [f64]) -> Result<f64, MechanismError> {
    let sum = match row {
        Rows::ProbF32(r) => probabilities(r, index, out)?,
        Rows::ProbF64(r) => probabilities(r, index, out)?,
        Rows::LogProbF32(r) => log_probabilities(r.iter().map(|&x| f64::from(x)), index, out)?,
        Rows::LogProbF64(r) => log_probabilities(r.iter().copied(), index, out)?,
        Rows::LogitsF32(r) => softmax(r.iter().map(|&x| f64::from(x)), index, out)?,
        Rows::LogitsF64(r) => softmax(r.iter().copied(), index, out)?,
    };
    // Entries are finite, so the sum is finite (or +∞ on overflow, which fails too).
    if sum.is_nan() || (sum - 1.0).abs() > NORMALISATION_TOLERANCE {
        return Err(MechanismError::NotNormalised {
            row: index,
            sum,
            tolerance: NORMALISATION_TOLERANCE,
        });
    }
    Ok(sum)
}

/// Lanes of the conversion's sums: a fixed summation order whatever the vector width.
const LANES: usize = 8;

/// Probability entries widened into `out`, in one pass that also forms their sum
/// (in [`LANES`] interleaved partial sums) and their minimum; the first bad entry is
/// looked for only when that screen (a non-finite sum or a negative minimum) says
/// there is one. Returns the sum.
fn probabilities<T: Copy + Into<f64> + Send + Sync>(
    row: &[T],
    index: usize,
    out: &mut [f64],
) -> Result<f64, MechanismError> {
    let (sum, min) = pulp::Arch::new().dispatch(Widen(row, out));
    if !sum.is_finite() || min < 0.0 {
        for (i, &value) in out.iter().enumerate() {
            if !value.is_finite() {
                return Err(MechanismError::NonFinite {
                    row: index,
                    index: i,
                    value,
                });
            }
            if value < 0.0 {
                return Err(MechanismError::Negative {
                    row: index,
                    index: i,
                    value,
                });
            }
        }
    }
    Ok(sum)
}

/// The pass of [`probabilities`], compiled for the CPU's widest vectors.
struct Widen<'a, T>(&'a [T], &'a mut [f64]);

impl<T: Copy + Into<f64>> pulp::WithSimd for Widen<'_, T> {
    type Output = (f64, f64);

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) -> (f64, f64) {
        let Widen(row, out) = self;
        let (mut sum, mut min) = ([0.0_f64; LANES], [0.0_f64; LANES]);
        let mut blocks = out.chunks_exact_mut(LANES);
        let mut entries = row.chunks_exact(LANES);
        for (o, r) in (&mut blocks).zip(&mut entries) {
            for j in 0..LANES {
                let v: f64 = r[j].into();
                o[j] = v;
                sum[j] += v;
                min[j] = if v < min[j] { v } else { min[j] };
            }
        }
        for (j, (o, &r)) in blocks
            .into_remainder()
            .iter_mut()
            .zip(entries.remainder())
            .enumerate()
        {
            let v: f64 = r.into();
            *o = v;
            sum[j] += v;
            min[j] = if v < min[j] { v } else { min[j] };
        }
        let total =
            ((sum[0] + sum[4]) + (sum[2] + sum[6])) + ((sum[1] + sum[5]) + (sum[3] + sum[7]));
        (total, min.into_iter().fold(0.0, f64::min))
    }
}

/// Log-probability entries exponentiated into `out`: −∞ is a valid log-probability
/// (zero); NaN and +∞ are not, and a positive one is a probability above 1. Returns
/// the sum of the probabilities.
fn log_probabilities(
    values: impl Iterator<Item = f64>,
    row: usize,
    out: &mut [f64],
) -> Result<f64, MechanismError> {
    let mut sum = 0.0;
    for (index, (x, o)) in values.zip(out.iter_mut()).enumerate() {
        if x.is_nan() || x == f64::INFINITY {
            return Err(MechanismError::NonFinite {
                row,
                index,
                value: x,
            });
        }
        if x > 0.0 {
            return Err(MechanismError::Negative {
                row,
                index,
                value: -x,
            });
        }
        *o = x.exp();
        sum += *o;
    }
    Ok(sum)
}

/// Logits turned into probabilities in `out` by a log-softmax in f64:
/// `p(x) = exp(x − m − ln Σ_y exp(y − m))` with `m` the largest logit. Every
/// shifted logit is ≤ 0 and the largest is exactly 0, so the sum lies in [1, V]
/// and nothing overflows or underflows to a zero sum. −∞ gives probability 0;
/// NaN and +∞ are errors, and so is a row with no finite logit (no token would
/// have positive probability). Returns the sum of the probabilities.
fn softmax(
    values: impl Iterator<Item = f64>,
    row: usize,
    out: &mut [f64],
) -> Result<f64, MechanismError> {
    let mut max = f64::NEG_INFINITY;
    for (index, (x, o)) in values.zip(out.iter_mut()).enumerate() {
        if x.is_nan() || x == f64::INFINITY {
            return Err(MechanismError::NonFinite {
                row,
                index,
                value: x,
            });
        }
        *o = x;
        max = max.max(x);
    }
    if max == f64::NEG_INFINITY {
        return Err(MechanismError::NoFiniteLogit { row });
    }
    let mut shifted_sum = 0.0;
    for o in out.iter_mut() {
        *o -= max;
        shifted_sum += o.exp();
    }
    let ln_sum = shifted_sum.ln();
    let mut sum = 0.0;
    for o in out.iter_mut() {
        *o = (*o - ln_sum).exp();
        sum += *o;
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocabularies_beyond_the_proven_length_are_refused() {
        let v = MAX_VOCAB + 1;
        let row = vec![1.0 / v as f64; v];
        assert!(matches!(
            Ensemble::from_probabilities(&row, &row),
            Err(MechanismError::VocabularyTooLarge { vocab, max }) if vocab == v && max == MAX_VOCAB
        ));
    }

    #[test]
    fn log_rows_convert_to_normalised_f64() {
        let public = [0.5f64.ln(), 0.5f64.ln()];
        let members = [0.25f32.ln(), 0.75f32.ln(), f32::NEG_INFINITY, 0.0];
        let e = Ensemble::new(Rows::LogProbF64(&public), Rows::LogProbF32(&members)).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e.member(1), &[0.0, 1.0]);
        assert!((e.member(0).iter().sum::<f64>() - 1.0).abs() < 1e-15);
    }

    #[test]
    fn bad_rows_are_typed_errors() {
        let p = [0.5, 0.5];
        assert!(matches!(
            Ensemble::from_probabilities(&p, &[0.5, 0.5, 1.0]),
            Err(MechanismError::LengthMismatch { .. })
        ));
        assert!(matches!(
            Ensemble::from_probabilities(&p, &[f64::NAN, 1.0]),
            Err(MechanismError::NonFinite {
                row: 1,
                index: 0,
                ..
            })
        ));
        assert!(matches!(
            Ensemble::from_probabilities(&p, &[-0.5, 1.5]),
            Err(MechanismError::Negative {
                row: 1,
                index: 0,
                ..
            })
        ));
        assert!(matches!(
            Ensemble::from_probabilities(&p, &[0.5, 0.6]),
            Err(MechanismError::NotNormalised { row: 1, .. })
        ));
        assert!(matches!(
            Ensemble::from_probabilities(&[], &[]),
            Err(MechanismError::EmptyVocabulary)
        ));
        let logs = [0.1f64, -3.0];
        assert!(matches!(
            Ensemble::new(Rows::LogProbF64(&logs), Rows::ProbF64(&p)),
            Err(MechanismError::Negative { row: 0, .. })
        ));
    }

    #[test]
    fn renew_equals_new_and_checks_the_same() {
        let public = [0.5, 0.25, 0.25];
        let a = [0.2, 0.3, 0.5, 0.6, 0.2, 0.2];
        let b: Vec<f32> = vec![0.1, 0.1, 0.8];
        let first = Ensemble::from_probabilities(&public, &a).unwrap();
        // Fewer members and f32 rows this time: the buffers shrink and are refilled.
        let renewed = first
            .clone()
            .renew(Rows::ProbF64(&public), Rows::ProbF32(&b))
            .unwrap();
        assert_eq!(
            renewed,
            Ensemble::new(Rows::ProbF64(&public), Rows::ProbF32(&b)).unwrap()
        );
        assert_eq!(renewed.len(), 1);
        assert!(matches!(
            first.renew(
                Rows::ProbF64(&public),
                Rows::ProbF64(&[0.5, 0.5, -0.1, 0.1])
            ),
            Err(MechanismError::LengthMismatch { .. })
        ));
        let bad = [0.5, 0.5, 0.0, 0.7, f64::NAN, -0.2];
        assert!(matches!(
            renewed.renew(Rows::ProbF64(&public), Rows::ProbF64(&bad)),
            Err(MechanismError::NonFinite {
                row: 2,
                index: 1,
                ..
            })
        ));
    }

    #[test]
    fn renew_or_new_equals_new_with_or_without_a_previous_ensemble() {
        let public = [0.5, 0.25, 0.25];
        let a = [0.2, 0.3, 0.5, 0.6, 0.2, 0.2];
        let want = Ensemble::new(Rows::ProbF64(&public), Rows::ProbF64(&a)).unwrap();
        let first =
            Ensemble::renew_or_new(None, Rows::ProbF64(&public), Rows::ProbF64(&a)).unwrap();
        assert_eq!(first, want);
        let b = [0.1, 0.1, 0.8];
        let second =
            Ensemble::renew_or_new(Some(first), Rows::ProbF64(&public), Rows::ProbF64(&b)).unwrap();
        assert_eq!(
            second,
            Ensemble::new(Rows::ProbF64(&public), Rows::ProbF64(&b)).unwrap()
        );
        assert!(matches!(
            Ensemble::renew_or_new(Some(second), Rows::ProbF64(&public), Rows::ProbF64(&[0.5])),
            Err(MechanismError::LengthMismatch { .. })
        ));
    }

    #[test]
    fn long_rows_are_checked_entry_by_entry() {
        // Past the vector blocks: the first bad entry is named wherever it is.
        let v = 37;
        let public = vec![1.0 / v as f64; v];
        for bad in [0, 7, 8, 35, 36] {
            let mut row = public.clone();
            row[bad] = -1e-3;
            row[(bad + 1) % v] += 1e-3;
            match Ensemble::from_probabilities(&public, &row) {
                Err(MechanismError::Negative { row: 1, index, .. }) => assert_eq!(index, bad),
                other => panic!("entry {bad}: {other:?}"),
            }
        }
        let e = Ensemble::from_probabilities(&public, &public).unwrap();
        assert!((e.member(0).iter().sum::<f64>() - 1.0).abs() < 1e-15);
    }

    #[test]
    fn without_member_drops_one_row() {
        let e = Ensemble::from_probabilities(&[0.5, 0.5], &[1.0, 0.0, 0.0, 1.0, 0.5, 0.5]).unwrap();
        let d = e.without_member(1);
        assert_eq!(d.len(), 2);
        assert_eq!(d.member(1), &[0.5, 0.5]);
    }

    /// Softmax computed independently, the textbook way: `exp(x)/Σ exp(x)` with no
    /// shift (safe for logits in [−30, 30]).
    fn naive_softmax(logits: &[f64]) -> Vec<f64> {
        let w: Vec<f64> = logits.iter().map(|&x| x.exp()).collect();
        let s: f64 = w.iter().sum();
        w.into_iter().map(|x| x / s).collect()
    }

    fn from_logits(public: &[f64], members: &[f64]) -> Result<Ensemble, MechanismError> {
        Ensemble::new(Rows::LogitsF64(public), Rows::LogitsF64(members))
    }

    #[test]
    fn logits_give_the_softmax() {
        let public = [0.5, -1.25, 3.0, 0.0];
        let members = [1.0, 2.0, 3.0, 4.0, -7.5, 0.25, 0.25, 12.0];
        let e = from_logits(&public, &members).unwrap();
        for (got, want) in [
            (e.public(), naive_softmax(&public)),
            (e.member(0), naive_softmax(&members[..4])),
            (e.member(1), naive_softmax(&members[4..])),
        ] {
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() <= 2e-14 * w, "{g} vs {w}");
            }
        }
        // −∞ masks a token; the others share the mass as without it.
        let masked = from_logits(&[f64::NEG_INFINITY, 0.0, 0.0], &[0.0, 0.0, 0.0]).unwrap();
        assert_eq!(masked.public(), &[0.0, 0.5, 0.5]);
        // Logits whose exponentials overflow: the closed form 1/(1 + e), e/(1 + e).
        let huge = from_logits(&[1000.0, 1001.0], &[-1e300, 1e300]).unwrap();
        let e1 = 1f64.exp();
        assert!((huge.public()[0] - 1.0 / (1.0 + e1)).abs() < 1e-15);
        assert!((huge.public()[1] - e1 / (1.0 + e1)).abs() < 1e-15);
        assert_eq!(huge.member(0), &[0.0, 1.0]);
        // f32 logits are widened exactly: the same distribution as their f64 values.
        let l32 = [0.1f32, -2.5, 7.0];
        let l64: Vec<f64> = l32.iter().map(|&x| f64::from(x)).collect();
        assert_eq!(
            Ensemble::new(Rows::LogitsF32(&l32), Rows::LogitsF32(&l32)).unwrap(),
            from_logits(&l64, &l64).unwrap()
        );
    }

    #[test]
    fn bad_logits_are_typed_errors_naming_the_row() {
        let ok = [0.0, 1.0];
        for (bad, index) in [([f64::NAN, 1.0], 0), ([0.0, f64::INFINITY], 1)] {
            match from_logits(&ok, &[0.0, 0.0, bad[0], bad[1]]) {
                Err(MechanismError::NonFinite {
                    row: 2, index: i, ..
                }) => assert_eq!(i, index),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        let masked = [f64::NEG_INFINITY; 2];
        assert!(matches!(
            from_logits(&masked, &ok),
            Err(MechanismError::NoFiniteLogit { row: 0 })
        ));
        assert!(matches!(
            Ensemble::new(
                Rows::LogitsF64(&ok),
                Rows::LogitsF32(&[0.0, 1.0, f32::NEG_INFINITY, f32::NEG_INFINITY])
            ),
            Err(MechanismError::NoFiniteLogit { row: 2 })
        ));
        assert!(from_logits(&[], &[]).is_err());
    }

    proptest::proptest! {
        /// Adding a constant to every logit leaves the distribution as it was, up to
        /// the rounding of the additions (a few ulps of |x| + |c|, relative).
        #[test]
        fn shifted_logits_give_the_same_distribution(
            logits in proptest::collection::vec(-60.0f64..60.0, 1..40),
            c in -1e3f64..1e3,
        ) {
            let shifted: Vec<f64> = logits.iter().map(|&x| x + c).collect();
            let a = from_logits(&logits, &logits).unwrap();
            let b = from_logits(&shifted, &shifted).unwrap();
            for (x, y) in a.public().iter().zip(b.public()) {
                proptest::prop_assert!((x - y).abs() <= 1e-11 * x.max(*y), "{} vs {}", x, y);
            }
            let want = naive_softmax(&logits);
            for (x, w) in a.member(0).iter().zip(&want) {
                proptest::prop_assert!((x - w).abs() <= 1e-13 * w, "{} vs {}", x, w);
            }
        }

        /// Integer logits shifted by an integer: every subtraction is exact, so the
        /// distributions are equal bit for bit.
        #[test]
        fn integer_shifts_are_exact(
            logits in proptest::collection::vec(-500i32..500, 1..40),
            c in -100_000i32..100_000,
        ) {
            let a: Vec<f64> = logits.iter().map(|&x| f64::from(x)).collect();
            let b: Vec<f64> = logits.iter().map(|&x| f64::from(x + c)).collect();
            proptest::prop_assert_eq!(from_logits(&a, &a).unwrap(), from_logits(&b, &b).unwrap());
        }
    }
}
