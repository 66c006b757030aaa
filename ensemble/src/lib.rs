//! # privmix-ensemble
//!
//! Not yet implemented: this crate is a placeholder in the workspace so that the
//! dependency graph of the design card is fixed from the start.
//!
//! What will live here: N LoRA-fine-tuned members over one shared base model,
//! evaluated together with the public model in one batched forward; user-level
//! partitioning of a private corpus; LoRA and DP-SGD fine-tuning with adapters in
//! the PEFT format. Builds on `privmix-models`.
pub mod lora;
pub mod rows;
pub mod runner;
pub mod stacked;
