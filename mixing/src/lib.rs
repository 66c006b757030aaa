//! # privmix-mixing
//!
//! λ solvers that project private next-token distributions toward a public one under a
//! Rényi-divergence constraint, and the top-k truncation they run on.
//!
//! Three mechanisms mix a private prediction with a public one and pick, per query, the
//! largest mixing weight λ whose Rényi divergence stays within a bound:
//!
//! | solver | constraint | range | paper |
//! |---|---|---|---|
//! | [`PmixedProjection`] | `Dsym(λp_i + (1−λ)p₀, p₀) ≤ b` | [0, 1] | PMixED (arXiv:2403.15638); AdaPMixED (arXiv:2410.02016) §3.2, Alg. 1 |
//! | [`SubmixPairProjection`] | `D_α(λh + (1−λ)p₀ ‖ λh' + (1−λ)p₀) ≤ β` | [0, 1] | SubMix (arXiv:2201.00971) §3, Eq. 2 |
//! | [`LogitMixing`] | `Dsym(softmax(λl₁ + (1−λ)l₀), softmax(l₀)) ≤ b` | [0, 1.5] | DPS-MOZO (arXiv:2501.19287) §4.1, Eq. 2–3 |
//!
//! The papers: Flemings, Razaviyayn, Annavaram, "Differentially Private Next-Token
//! Prediction of Large Language Models" (PMixED) and "Adaptively Private Next-Token
//! Prediction of Large Language Models" (AdaPMixED); Ginart, van der Maaten, Zou, Guo,
//! "SubMix: Practical Private Prediction for Large-Scale Language Models"; Flemings, Gan,
//! Li, Razaviyayn, Annavaram, "Differentially Private In-context Learning via Sampling
//! Few-shot Mixed with Zero-shot Outputs" (DPS-MOZO).
//!
//! What every solver guarantees (the property the privacy analyses rest on):
//! * The λ returned satisfies its constraint **as evaluated in f64** by the solver's own
//!   evaluator (exposed as `constraint(λ)`), never approximately: the search keeps a
//!   bracket whose lower end has been evaluated feasible and returns that end.
//! * It is within [`LAMBDA_TOLERANCE`] (1e-9) of the supremum of the feasible set — the
//!   bracket's upper end, [`Solution::violated_at`], was evaluated infeasible, or (PMixED,
//!   whose transformed constraint is convex in λ) proven infeasible by the tangent at the
//!   λ returned — or it is the upper end of the range when that is feasible.
//! * Each constraint is non-decreasing in λ (each module documents why), so the feasible
//!   set is an interval starting at 0 and "largest λ" is well defined.
//! * `solve_certified` (on each projection) goes further: the *exact* divergence of the
//!   distribution returned, not its f64 evaluation, is at most the radius. It enforces
//!   [`enforced_radius`] — the radius less a margin covering the evaluator's relative and
//!   absolute error ([`EvaluatorError`], derived in `src/margin/proof.md`) — and returns
//!   λ = 0 when the margin swallows the radius. Mechanisms that charge a bound computed
//!   from the radius must use it: a relative margin alone fails for tiny radii, where the
//!   evaluator's absolute error (about `1e-16` per unit of `α/(α−1)`, times the
//!   vocabulary's summation depth) exceeds it.
//!
//! * The λ found does not depend on the order of the vocabulary (the evaluators'
//!   summation order) beyond the last bits: a converged search returns λ on a grid of
//!   `2⁻³²`, so it is bit-identical across permutations in practice.
//!
//! The search is a safeguarded Newton method (in log–log coordinates, on a transform of
//! each direction of the divergence chosen to be nearly a power of λ) using the value and
//! λ-derivative from one pass of `privmix_renyi`'s path evaluators: a typical solve costs
//! 3 to 8 passes over the vocabulary, where the reference implementations' 20-step
//! bisection costs 21 and quantises λ to `2⁻²⁰`.
//!
//! Each construction lives in its own module folder with a `proof.md` (shipped in the
//! crate) that states its guarantee and the argument for it: `pmixed/`, `submix/`,
//! `logit/`, the shared search `solver/`, the certified margin `margin/`, and the
//! top-k truncation `topk/`.
//!
//! ```
//! use privmix_mixing::{pmixed_lambda, LAMBDA_TOLERANCE};
//! use privmix_renyi::Order;
//!
//! let public = [0.5, 0.3, 0.2];
//! let private = [0.1, 0.2, 0.7];
//! let alpha = Order::new(18.0)?;
//! let sol = pmixed_lambda(&private, &public, alpha, 0.2 * 18.0 / 10.0)?;
//! assert!(sol.value <= 0.36 && sol.lambda > 0.0 && sol.lambda < 1.0);
//! assert!(sol.violated_at.unwrap() - sol.lambda <= LAMBDA_TOLERANCE);
//! # Ok::<(), privmix_mixing::MixingError>(())
//! ```

mod error;
mod logit;
mod margin;
mod pmixed;
pub mod proofs;
mod solver;
mod submix;
mod topk;

pub use error::MixingError;
pub use logit::{DEFAULT_LOGIT_UPPER, LogitMixing, log_softmax, logit_mixing_lambda};
pub use margin::{EvaluatorError, LOG_RANGE, RELATIVE_ERROR, enforced_radius, evaluator_error};
pub use pmixed::{PmixedProjection, pmixed_lambda, pmixed_lambdas};
pub use solver::{LAMBDA_TOLERANCE, Solution};
pub use submix::{SubmixPairProjection, submix_lambda};
pub use topk::{gather, renormalise, top_k_indices, truncate_renormalised};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
