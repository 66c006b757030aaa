//! LoRA adapters (Hu et al. 2022) in PEFT's format: configuration, factors
//! per projection, the [`LinearDelta`](privmix_models::LinearDelta) hook for
//! one adapter, and the base model's table of adaptable projections.

mod adapter;
mod config;
mod error;
mod peft;
mod sites;

pub use adapter::{LoraAdapter, LoraFactors};
pub use config::{KNOWN_TARGET_MODULES, LLAMA_TARGET_MODULES, LoraConfig};
pub use error::LoraError;
pub(crate) use peft::transpose;
pub use peft::{ADAPTER_CONFIG, ADAPTER_WEIGHTS};
pub use sites::{BaseShapes, LoraBase, module_name, module_path, parse_module_path, site_order};
