//! The random source of every mechanism.
//!
//! Sampling and noise decide what is released, so the default generator is a
//! cryptographic one (ChaCha20) seeded by the operating system: an observer who
//! sees released tokens cannot predict or replay the mechanism's coins. A fixed
//! seed exists for tests and benchmarks only.

use rand::{CryptoRng, RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

use crate::MechanismError;

/// ChaCha20, seeded by the OS unless a test asks for a fixed seed.
#[derive(Debug, Clone)]
pub struct PrivacyRng(ChaCha20Rng);

impl PrivacyRng {
    /// Seeded from the operating system's entropy source (the default).
    pub fn from_os() -> Result<Self, MechanismError> {
        ChaCha20Rng::try_from_os_rng()
            .map(Self)
            .map_err(|_| MechanismError::InvalidParameter {
                name: "rng",
                value: f64::NAN,
                reason: "the operating system's entropy source is unavailable",
            })
    }

    /// A fixed seed: reproducible, and therefore NOT for serving private text.
    pub fn from_seed(seed: u64) -> Self {
        Self(ChaCha20Rng::seed_from_u64(seed))
    }
}

impl RngCore for PrivacyRng {
    fn next_u32(&mut self) -> u32 {
        self.0.next_u32()
    }
    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn fill_bytes(&mut self, dst: &mut [u8]) {
        self.0.fill_bytes(dst)
    }
}

impl CryptoRng for PrivacyRng {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_os_seeds_differ() {
        let mut a = PrivacyRng::from_seed(7);
        let mut b = PrivacyRng::from_seed(7);
        assert_eq!(a.next_u64(), b.next_u64());
        let mut c = PrivacyRng::from_os().unwrap();
        let mut d = PrivacyRng::from_os().unwrap();
        assert_ne!((c.next_u64(), c.next_u64()), (d.next_u64(), d.next_u64()));
    }
}
