//! # privmix-renyi
//!
//! Rényi divergences of discrete distributions, computed in f64 and log space.
