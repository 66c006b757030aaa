//! Privacy events: what a mechanism did, as data, and its RDP curve.
//!
//! A [`DpEvent`] describes a release the way dp_accounting's `DpEvent` does
//! (a Gaussian, a subsampled event, a composition, …), so that it can be
//! stored, sent, and re-accounted later with another method or other orders.
//! [`DpEvent::rdp`] maps it to an [`RdpCurve`] with the constructions of this
//! crate; each leaf lives in its own folder with its guarantee, its proof note
//! where privmix relies on its own argument, and its tests.

pub mod adapmixed_screening;
pub mod dps_mozo;
pub mod gaussian;
pub mod laplace;
pub mod pmixed;
pub mod randomized_response;

pub(crate) mod check;
use check::check_non_negative;

use crate::amplification::{check_q, check_sigma};
use crate::{AccountantError, Orders, RdpCurve};
use privmix_renyi::round::{div_up, u64_down, u64_up};

use laplace::{check_scale, laplace_at};
use randomized_response::{check_randomized_response, randomized_response_at};

/// The deepest nesting of events accepted (sampling, self-composition and
/// composition each add a level); it bounds recursion on untrusted input.
pub const MAX_EVENT_DEPTH: usize = 64;

/// A private release, described by what was run rather than by its cost.
///
/// Leaves are mechanisms with a closed-form RDP curve; the other variants
/// build on events. [`Self::rdp`] gives the curve; [`Self::validate`] checks
/// every parameter (deserialisation and the ledger's decoder call it, so an
/// event read back satisfies the same checks as one about to be charged).
///
/// Adjacency: sampling theorems need their base bound under a particular
/// neighbouring relation. [`Self::PoissonSampled`] (Zhu & Wang's bound) needs
/// add/remove-one, [`Self::SampledWithoutReplacement`] (Wang, Balle &
/// Kasiviswanathan's) replace-one. The sensitivity-1 Gaussian and Laplace
/// bounds hold for whichever relation the sensitivity is measured under, and a
/// [`Self::Measured`] curve is taken to hold for whichever the sampling needs;
/// randomized response is replace-one; [`Self::PmixedSubsampled`] is
/// add/remove-one-member for every ensemble size, while [`Self::PmixedQuery`]
/// and [`Self::AdapmixedScreening`] bound one ensemble size (which sampling
/// changes) and [`Self::DpsMozoToken`] states no relation, so none of those
/// three is sampled. A combination whose base bound is not
/// known to hold for the sampling's relation is refused with
/// [`AccountantError::UnsupportedEvent`], never accounted with a bound that
/// does not apply.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    // The derives write inherent `DpEvent::serialize`/`deserialize`; the trait
    // impls in `serde_impls.rs` call them and validate what is read.
    serde(remote = "Self", rename_all = "snake_case", deny_unknown_fields)
)]
#[non_exhaustive]
pub enum DpEvent {
    /// A release that reveals nothing (ε(α) = 0).
    NoOp,
    /// The Gaussian mechanism on a query of L2 sensitivity 1 with noise
    /// standard deviation `noise_multiplier` (see [`gaussian::gaussian`]).
    Gaussian {
        /// σ/Δ, finite and > 0.
        noise_multiplier: f64,
    },
    /// The Laplace mechanism on a query of L1 sensitivity 1 with noise scale
    /// `scale` (see [`laplace::laplace`]).
    Laplace {
        /// b/Δ, finite and > 0.
        scale: f64,
    },
    /// k-ary randomized response with parameter ε (see
    /// [`randomized_response::randomized_response`]).
    RandomizedResponse {
        /// The pure-DP parameter ε, finite and ≥ 0.
        epsilon: f64,
        /// The number of categories k ≥ 2 (2 for binary randomized response).
        categories: u64,
    },
    /// `event` run on a Poisson subsample: each record kept independently
    /// with probability `sampling_probability` (add/remove-one adjacency).
    PoissonSampled {
        /// q ∈ [0, 1].
        sampling_probability: f64,
        /// What runs on the sample.
        event: Box<DpEvent>,
    },
    /// `event` run on `sample_size` records drawn uniformly without
    /// replacement from `source_size` (replace-one adjacency).
    SampledWithoutReplacement {
        /// n ≥ 1.
        source_size: u64,
        /// m ≤ n.
        sample_size: u64,
        /// What runs on the sample.
        event: Box<DpEvent>,
    },
    /// `event` run `count` times (Mironov, arXiv:1702.07476, Prop. 1).
    SelfComposed {
        /// What is repeated.
        event: Box<DpEvent>,
        /// How many times.
        count: u64,
    },
    /// Each event run once, in any order, adaptively (Mironov, arXiv:1702.07476, Prop. 1).
    Composed(Vec<DpEvent>),
    /// One PMixED query as the paper bounds it (see [`pmixed::pmixed_query`]).
    PmixedQuery {
        /// The per-member constraint β ≥ 0.
        beta: f64,
        /// The ensemble size.
        members: u64,
    },
    /// One PMixED query with Poisson-sampled members (see
    /// [`pmixed::pmixed_subsampled`]).
    PmixedSubsampled {
        /// The per-member constraint β ≥ 0.
        beta: f64,
        /// q ∈ [0, 1].
        sampling_probability: f64,
    },
    /// One DPS-MOZO token as the paper bounds it (see
    /// [`dps_mozo::dps_mozo_token`]).
    DpsMozoToken {
        /// The per-shot constraint β ≥ 0.
        beta: f64,
    },
    /// AdaPMixED's noisy screening (see
    /// [`adapmixed_screening::adapmixed_screening`]).
    AdapmixedScreening {
        /// The mixing weight λ ≥ 0.
        lambda: f64,
        /// The ensemble size N ≥ 1.
        members: u64,
        /// The noise σ, finite and > 0.
        sigma: f64,
    },
    /// A data-independent RDP curve given by its values (any analytic bound
    /// computed elsewhere). At other orders it is read with
    /// [`RdpCurve::bound_at`].
    Measured(RdpCurve),
    /// A data-dependent charge: a divergence measured on the actual data
    /// (AdaPMixED's `max_i Dsym_α(p ‖ p₋ᵢ)`, SubMix's per-query divergence).
    /// It composes like any curve, but it is not a bound over all
    /// neighbouring inputs, so no sampling theorem applies to it.
    DataDependent(RdpCurve),
}

/// The neighbouring relations a bound is known to hold for.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Adjacency {
    add_remove: bool,
    replace_one: bool,
}

impl Adjacency {
    const BOTH: Self = Self {
        add_remove: true,
        replace_one: true,
    };
    const ADD_REMOVE: Self = Self {
        add_remove: true,
        replace_one: false,
    };
    const REPLACE_ONE: Self = Self {
        add_remove: false,
        replace_one: true,
    };
    const NONE: Self = Self {
        add_remove: false,
        replace_one: false,
    };

    fn and(self, other: Self) -> Self {
        Self {
            add_remove: self.add_remove && other.add_remove,
            replace_one: self.replace_one && other.replace_one,
        }
    }
}

impl DpEvent {
    /// The Gaussian event, checked.
    pub fn gaussian(noise_multiplier: f64) -> Result<Self, AccountantError> {
        Self::checked(Self::Gaussian { noise_multiplier })
    }

    /// The Laplace event, checked.
    pub fn laplace(scale: f64) -> Result<Self, AccountantError> {
        Self::checked(Self::Laplace { scale })
    }

    /// The k-ary randomized-response event, checked.
    pub fn randomized_response(epsilon: f64, categories: u64) -> Result<Self, AccountantError> {
        Self::checked(Self::RandomizedResponse {
            epsilon,
            categories,
        })
    }

    /// `self` on a Poisson subsample of rate `q`, checked.
    pub fn poisson_sampled(self, q: f64) -> Result<Self, AccountantError> {
        Self::checked(Self::PoissonSampled {
            sampling_probability: q,
            event: Box::new(self),
        })
    }

    /// `self` on `sample_size` of `source_size` records drawn without
    /// replacement, checked.
    pub fn sampled_without_replacement(
        self,
        source_size: u64,
        sample_size: u64,
    ) -> Result<Self, AccountantError> {
        Self::checked(Self::SampledWithoutReplacement {
            source_size,
            sample_size,
            event: Box::new(self),
        })
    }

    /// `self` run `count` times, checked.
    pub fn self_composed(self, count: u64) -> Result<Self, AccountantError> {
        Self::checked(Self::SelfComposed {
            event: Box::new(self),
            count,
        })
    }

    fn checked(event: Self) -> Result<Self, AccountantError> {
        event.validate()?;
        Ok(event)
    }

    /// Checks every parameter of the event and of the events inside it, the
    /// nesting depth (at most [`MAX_EVENT_DEPTH`]), and that every sampling
    /// applies to the event it samples (see the type's docs on adjacency).
    pub fn validate(&self) -> Result<(), AccountantError> {
        self.adjacency(0).map(drop)
    }

    /// Validates, and returns the relations the event's bound holds for.
    fn adjacency(&self, depth: usize) -> Result<Adjacency, AccountantError> {
        if depth >= MAX_EVENT_DEPTH {
            return Err(AccountantError::UnsupportedEvent {
                event: self.name(),
                reason: "events are nested deeper than MAX_EVENT_DEPTH",
            });
        }
        Ok(match self {
            Self::NoOp => Adjacency::BOTH,
            Self::Gaussian { noise_multiplier } => {
                check_sigma(*noise_multiplier)?;
                Adjacency::BOTH
            }
            Self::Laplace { scale } => {
                check_scale(*scale)?;
                Adjacency::BOTH
            }
            Self::RandomizedResponse {
                epsilon,
                categories,
            } => {
                check_randomized_response(*epsilon, *categories)?;
                Adjacency::REPLACE_ONE
            }
            Self::PoissonSampled {
                sampling_probability,
                event,
            } => {
                check_q(*sampling_probability)?;
                if !event.adjacency(depth + 1)?.add_remove {
                    return Err(AccountantError::UnsupportedEvent {
                        event: event.name(),
                        reason: "Poisson amplification needs a bound under add/remove-one adjacency that holds for every input size; this event has none",
                    });
                }
                Adjacency::ADD_REMOVE
            }
            Self::SampledWithoutReplacement {
                source_size,
                sample_size,
                event,
            } => {
                if *source_size == 0 {
                    return Err(AccountantError::InvalidParameter {
                        name: "source_size",
                        value: 0.0,
                        reason: "the source must hold at least one record",
                    });
                }
                if sample_size > source_size {
                    return Err(AccountantError::InvalidParameter {
                        name: "sample_size",
                        value: *sample_size as f64,
                        reason: "a sample without replacement cannot exceed its source",
                    });
                }
                if !event.adjacency(depth + 1)?.replace_one {
                    return Err(AccountantError::UnsupportedEvent {
                        event: event.name(),
                        reason: "amplification by sampling without replacement needs a bound under replace-one adjacency that holds for every input size; this event has none",
                    });
                }
                Adjacency::REPLACE_ONE
            }
            Self::SelfComposed { event, .. } => event.adjacency(depth + 1)?,
            Self::Composed(events) => {
                let mut all = Adjacency::BOTH;
                for e in events {
                    all = all.and(e.adjacency(depth + 1)?);
                }
                all
            }
            Self::PmixedQuery { beta, .. } => {
                check_non_negative("beta", *beta)?;
                // The bound is for one ensemble size, which sampling changes
                // (`PmixedSubsampled` is the sampled form).
                Adjacency::NONE
            }
            Self::PmixedSubsampled {
                beta,
                sampling_probability,
            } => {
                check_non_negative("beta", *beta)?;
                check_q(*sampling_probability)?;
                Adjacency::ADD_REMOVE
            }
            Self::DpsMozoToken { beta } => {
                check_non_negative("beta", *beta)?;
                // The paper states no adjacency a sampling theorem could use.
                Adjacency::NONE
            }
            Self::AdapmixedScreening {
                lambda,
                members,
                sigma,
            } => {
                check_non_negative("lambda", *lambda)?;
                check_sigma(*sigma)?;
                if *members == 0 {
                    return Err(AccountantError::InvalidParameter {
                        name: "members",
                        value: 0.0,
                        reason: "the ensemble must have at least one member",
                    });
                }
                // The sensitivity √2λ/N is for one ensemble size N.
                Adjacency::NONE
            }
            Self::Measured(_) => Adjacency::BOTH,
            Self::DataDependent(_) => Adjacency::NONE,
        })
    }

    /// A short name of the variant, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Self::NoOp => "no_op",
            Self::Gaussian { .. } => "gaussian",
            Self::Laplace { .. } => "laplace",
            Self::RandomizedResponse { .. } => "randomized_response",
            Self::PoissonSampled { .. } => "poisson_sampled",
            Self::SampledWithoutReplacement { .. } => "sampled_without_replacement",
            Self::SelfComposed { .. } => "self_composed",
            Self::Composed(_) => "composed",
            Self::PmixedQuery { .. } => "pmixed_query",
            Self::PmixedSubsampled { .. } => "pmixed_subsampled",
            Self::DpsMozoToken { .. } => "dps_mozo_token",
            Self::AdapmixedScreening { .. } => "adapmixed_screening",
            Self::Measured(_) => "measured",
            Self::DataDependent(_) => "data_dependent",
        }
    }

    /// Whether the event is a leaf with a closed form at every order.
    fn is_closed_form(&self) -> bool {
        matches!(
            self,
            Self::NoOp
                | Self::Gaussian { .. }
                | Self::Laplace { .. }
                | Self::RandomizedResponse { .. }
                | Self::AdapmixedScreening { .. }
        )
    }

    /// A leaf's RDP at one order, rounded up; `None` for events that are not
    /// closed-form leaves. Parameters must have been validated.
    fn closed_form_at(&self, alpha: f64) -> Option<f64> {
        Some(match *self {
            Self::NoOp => 0.0,
            Self::Gaussian { noise_multiplier } => {
                crate::amplification::poisson::gaussian_rdp_up(alpha, noise_multiplier)
            }
            Self::Laplace { scale } => laplace_at(alpha, scale),
            Self::RandomizedResponse {
                epsilon,
                categories,
            } => randomized_response_at(alpha, epsilon, categories),
            Self::AdapmixedScreening {
                lambda,
                members,
                sigma,
            } => adapmixed_screening::screening_at(alpha, lambda, members, sigma),
            _ => return None,
        })
    }

    /// The event's RDP curve over `orders`: an upper bound, rounded up, on
    /// its Rényi divergence at each order, from the construction each variant
    /// names. The event is validated first.
    ///
    /// * Leaves: their closed forms.
    /// * [`Self::PoissonSampled`]: for a Gaussian, the exact moment of Mironov,
    ///   Talwar & Zhang (arXiv:1908.10530) at every order
    ///   ([`crate::poisson_subsampled_gaussian`]); for another closed-form
    ///   leaf, Zhu & Wang's tight bound with the leaf evaluated at every
    ///   integer order; otherwise [`RdpCurve::poisson_subsampled`] of the
    ///   inner curve.
    /// * [`Self::SampledWithoutReplacement`] with q = m/n rounded up: for a
    ///   Gaussian, Wang, Balle & Kasiviswanathan (arXiv:1808.00087) Thm 27
    ///   ([`crate::without_replacement_gaussian`]); for another closed-form
    ///   leaf their Thm 9 with the leaf at every integer order; otherwise
    ///   [`RdpCurve::sampled_without_replacement`].
    /// * Compositions: [`RdpCurve::compose`] and [`RdpCurve::self_compose`].
    /// * [`Self::Measured`] and [`Self::DataDependent`]: the curve read at
    ///   `orders` with [`RdpCurve::bound_at`].
    pub fn rdp(&self, orders: &Orders) -> Result<RdpCurve, AccountantError> {
        self.validate()?;
        self.rdp_unchecked(orders)
    }

    fn rdp_unchecked(&self, orders: &Orders) -> Result<RdpCurve, AccountantError> {
        if self.is_closed_form() {
            return RdpCurve::from_fn(orders.clone(), |a| {
                self.closed_form_at(a).unwrap_or(f64::INFINITY)
            });
        }
        match self {
            Self::PoissonSampled {
                sampling_probability: q,
                event,
            } => match **event {
                Self::Gaussian { noise_multiplier } => {
                    crate::poisson_subsampled_gaussian(orders, *q, noise_multiplier)
                }
                ref leaf if leaf.is_closed_form() => {
                    crate::amplification::poisson::poisson_amplify_analytic(orders, *q, &|a| {
                        leaf.closed_form_at(a).unwrap_or(f64::INFINITY)
                    })
                }
                ref other => other.rdp_unchecked(orders)?.poisson_subsampled(*q),
            },
            Self::SampledWithoutReplacement {
                source_size,
                sample_size,
                event,
            } => {
                // q = m/n rounded up, at most 1: a larger q never lowers the bound.
                let q = div_up(u64_up(*sample_size), u64_down(*source_size)).min(1.0);
                match **event {
                    Self::Gaussian { noise_multiplier } => {
                        crate::without_replacement_gaussian(orders, q, noise_multiplier)
                    }
                    ref leaf if leaf.is_closed_form() => {
                        crate::amplification::without_replacement::without_replacement_amplify_analytic(
                            orders,
                            q,
                            &|a| leaf.closed_form_at(a).unwrap_or(f64::INFINITY),
                        )
                    }
                    ref other => other.rdp_unchecked(orders)?.sampled_without_replacement(q),
                }
            }
            Self::SelfComposed { event, count } => {
                Ok(event.rdp_unchecked(orders)?.self_compose(*count))
            }
            Self::Composed(events) => {
                let mut total = RdpCurve::zero(orders.clone());
                for e in events {
                    total = total.compose(&e.rdp_unchecked(orders)?)?;
                }
                Ok(total)
            }
            Self::PmixedQuery { beta, members } => pmixed::pmixed_query(orders, *beta, *members),
            Self::PmixedSubsampled {
                beta,
                sampling_probability,
            } => pmixed::pmixed_subsampled(orders, *beta, *sampling_probability),
            Self::DpsMozoToken { beta } => dps_mozo::dps_mozo_token(orders, *beta),
            Self::Measured(curve) | Self::DataDependent(curve) => Ok(curve.bound_at(orders)),
            _ => Err(AccountantError::UnsupportedEvent {
                event: self.name(),
                reason: "no RDP bound is implemented for this event",
            }),
        }
    }
}

#[cfg(test)]
mod tests;
