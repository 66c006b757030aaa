//! # privmix-mechanisms
//!
//! Private next-token prediction: PMixED and AdaPMixED (Flemings et al.,
//! arXiv:2403.15638 and arXiv:2410.02016), SubMix (Ginart et al., arXiv:2201.00971),
//! DPS-MOZO (Flemings et al., arXiv:2501.19287) and the baselines the papers compare
//! against, over next-token distributions from any source.
//!
//! Every mechanism implements one step: given the public distribution, the
//! members' distributions (rows of one buffer, as logits, probabilities or
//! log-probabilities: [`Rows`]), a random source and an [`Account`], it charges the
//! account *before* it releases a token and returns the token, the charge and
//! diagnostics ([`StepOutcome`]). The [`step_loop`] settles every driver's steps
//! (step → charge → refusal → release); the [`driver`] module runs steps over any
//! [`DistributionSource`].
//!
//! ```
//! use privmix_accountant::{Orders, RdpCurve};
//! use privmix_mechanisms::{
//!     Ensemble, EnsembleMechanism, Pmixed, PmixedConfig, PrivacyRng, Rows, Unbudgeted,
//! };
//!
//! // A public model and two members over a vocabulary of 3, as probabilities.
//! let ensemble = Ensemble::new(
//!     Rows::ProbF64(&[0.5, 0.3, 0.2]),
//!     Rows::ProbF64(&[0.1, 0.2, 0.7, 0.6, 0.3, 0.1]),
//! )?;
//! let orders = Orders::integers(8)?;
//! let mut pmixed = Pmixed::new(PmixedConfig::new(36.0, 0.05, 1.0)?);
//! let mut account = Unbudgeted::new(orders.clone());
//! let mut rng = PrivacyRng::from_seed(7); // for tests only: serve with `from_os`
//! let step = pmixed.step(&ensemble, &mut rng, &mut account)?;
//! assert!(step.token < 3);
//! // The charge is data-independent: the configuration's curve for two members.
//! assert_eq!(step.charge, pmixed.config().curve(&orders, 2)?);
//! assert_eq!(account.spent(), &RdpCurve::zero(orders).compose(&step.charge)?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Each construction lives in its own module folder with the proof of what it
//! charges (`proof.md`) and its tests beside it.
//!
//! Randomness: [`PrivacyRng::from_os`] (ChaCha20 seeded by the operating system)
//! is the default; [`PrivacyRng::from_seed`] exists for tests and benchmarks and
//! must not be used to serve private text.

mod account;
pub mod adapmixed;
pub mod baselines;
mod calibration;
mod dps_mozo;
pub mod driver;
mod embedding_aggregation;
mod error;
pub mod exact;
mod input;
pub mod noise;
mod pmixed;
pub mod proofs;
mod rng;
mod sample;
mod step;
pub mod step_loop;
pub mod submix;

/// AdaPMixED's individual Rényi filter: [`adapmixed::filter`] under the path
/// it has always had.
pub use adapmixed::filter as adapmixed_filter;
pub use pmixed::bounds;

pub use account::{Account, Unbudgeted};
pub use adapmixed::{Adapmixed, AdapmixedConfig, PrivateAnswer, ScreenDecision, ScreeningVector};
pub use calibration::RunBudget;
pub use dps_mozo::step::{
    DpDemonstration, DpDemonstrations, DpFewShot, DpsMozo, FewShotProduct, FewShotSource,
    IclMechanism, IclSource, ZeroShot, generate_dp_demonstrations, generate_icl, zero_shot_step,
};
pub use dps_mozo::{
    DpsMozoConfig, IclOutput, calibrate_radius, dps_mozo_charge, dps_mozo_output,
    dps_mozo_pure_epsilon, dps_mozo_token_curve, draw_demonstrations, few_shot_output,
};
pub use driver::DistributionSource;
pub use embedding_aggregation::{EmbeddingRelease, EmbeddingSpaceAggregation, clipped_mean};
pub use error::MechanismError;
pub use input::{Ensemble, Rows};
pub use pmixed::{Pmixed, PmixedConfig, PmixedOutput, temper};
pub use rng::PrivacyRng;
pub use sample::{sample_index, sample_log_index};
pub use step::{Diagnostics, EnsembleMechanism, PublicReason, Release, StepOutcome};
pub use submix::protocol::{SubMix, SubmixConfig};
pub use submix::{SubmixDistribution, submix_distribution};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
