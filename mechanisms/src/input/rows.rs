//! The row kinds a model runtime hands over ([`Rows`]).

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
    /// NaN or +∞ is [`MechanismError::NonFinite`](crate::MechanismError::NonFinite), a row of −∞ only is
    /// [`MechanismError::NoFiniteLogit`](crate::MechanismError::NoFiniteLogit).
    LogitsF32(&'a [f32]),
    /// Unnormalised scores (logits) in f64, as [`Rows::LogitsF32`].
    LogitsF64(&'a [f64]),
}

impl<'a> Rows<'a> {
    pub(super) fn len(&self) -> usize {
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
    pub(super) fn slice(&self, start: usize, len: usize) -> Rows<'a> {
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
