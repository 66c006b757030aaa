//! # privmix-mechanisms
//!
//! PMixED, AdaPMixED, SubMix, DPS-MOZO and their baselines.
