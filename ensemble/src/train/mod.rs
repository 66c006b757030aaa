//! Fine-tuning the members: LoRA with AdamW ([`Trainer`]) and the papers'
//! training-time baseline, DP-SGD LoRA ([`DpSgdTrainer`]): one trainer,
//! [`LoraTrainer`], whose gradient rule is a value ([`MeanGradient`] or
//! [`DpSgd`]). Runs on any burn autodiff backend
//! (`Autodiff<Flex>` on the CPU); the base model's weights stay frozen and
//! only the adapter's factors train.

mod adamw;
mod checkpoint;
mod config;
mod dpsgd;
mod dpsgd_checkpoint;
mod error;
mod host;
mod joint;
mod loss;
mod mean;
mod params;
mod privacy;
mod report;
mod trainable;
mod trainer;

pub use adamw::{AdamW, AdamWConfig, linear_schedule};
pub use config::TrainConfig;
pub use dpsgd::{DpSgd, DpSgdConfig, DpSgdStep, DpSgdTrainer, NoiseSource};
pub use error::TrainError;
pub use host::{HostTrainable, StepPath};
pub use joint::JointTrainer;
pub use loss::{check_blocks, mean_nll};
pub use mean::{MeanGradient, Trainer};
pub use params::{LoraParams, SiteLayout};
pub use privacy::{
    DpSgdAccountant, DpSgdEpsilon, DpSgdNoise, GRID_BITS, SIGMA_REL_TOL, clip_to_norm,
    dp_sgd_epsilon, dp_sgd_rdp_curve, dp_sgd_rdp_epsilon_at, dp_sgd_sigma, l2_norm, poisson_sample,
};
pub use report::{History, TrainReport};
pub use trainer::{GradientRule, LoraTrainer, Schedule};
