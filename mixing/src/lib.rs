//! # privmix-mixing
//!
//! λ solvers that project private next-token distributions toward a public one.
