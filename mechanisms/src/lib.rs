//! # privmix-mechanisms
//!
//! Private next-token prediction: PMixED and AdaPMixED (Flemings et al.), SubMix
//! (Ginart et al.), DPS-MOZO (Flemings et al.) and the baselines the papers
//! compare against, over next-token distributions from any source.
//!
//! Every mechanism implements one step: given the public distribution, the
//! members' distributions (rows of one buffer), a random source and an
//! [`Account`], it charges the account *before* it releases a token and returns
//! the token, the charge and diagnostics ([`StepOutcome`]). The [`driver`]
//! module runs steps over any [`DistributionSource`].
//!
//! Randomness: [`PrivacyRng::from_os`] (ChaCha20 seeded by the operating system)
//! is the default; [`PrivacyRng::from_seed`] exists for tests and benchmarks and
//! must not be used to serve private text.

mod account;
pub mod adapmixed;
#[path = "adapmixed/filter.rs"]
pub mod adapmixed_filter;
pub mod baselines;
#[path = "pmixed/bounds.rs"]
pub mod bounds;
mod dps_mozo;
#[path = "dps_mozo/step.rs"]
mod dps_mozo_step;
pub mod driver;
mod embedding_aggregation;
mod error;
pub mod exact;
mod input;
#[path = "adapmixed/leave_one_out.rs"]
mod leave_one_out;
pub mod noise;
mod pmixed;
mod rng;
mod sample;
mod step;
pub mod submix;
#[path = "submix/protocol.rs"]
mod submix_protocol;

pub use account::{Account, Unbudgeted};
pub use adapmixed::{Adapmixed, AdapmixedConfig, PrivateAnswer, ScreenDecision, ScreeningVector};
pub use dps_mozo::{
    DpsMozoConfig, IclOutput, calibrate_radius, dps_mozo_charge, dps_mozo_output,
    dps_mozo_pure_epsilon, dps_mozo_token_curve, draw_demonstrations, few_shot_output,
};
pub use dps_mozo_step::{
    DpDemonstration, DpDemonstrations, DpFewShot, DpsMozo, FewShotProduct, FewShotSource,
    IclMechanism, IclSource, ZeroShot, generate_dp_demonstrations, generate_icl,
};
pub use driver::DistributionSource;
pub use embedding_aggregation::{EmbeddingRelease, EmbeddingSpaceAggregation, clipped_mean};
pub use error::MechanismError;
pub use input::{Ensemble, Rows};
pub use pmixed::{Pmixed, PmixedConfig, PmixedOutput, temper};
pub use rng::PrivacyRng;
pub use sample::{sample_index, sample_log_index};
pub use step::{Diagnostics, EnsembleMechanism, PublicReason, Release, StepOutcome};
pub use submix::{SubmixDistribution, submix_distribution};
pub use submix_protocol::{SubMix, SubmixConfig};
