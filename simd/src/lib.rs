//! Software prefetch for SIMD kernels ([`Prefetch`]), shared by the kernels
//! of `privmix-renyi` and `privmix-models`, which do not depend on each
//! other.
#![doc = include_str!("../README.md")]

/// Software prefetch of the cache lines that a kernel will read next, so that
/// memory latency overlaps with the current computation (a Rényi divergence
/// pass's next row entries, an attention kernel's next key/value head, the
/// next weight blocks of a product). A hint only: it reads nothing
/// architecturally, never faults, and changes no result. Through `pulp`'s
/// safe wrapper of SSE's `prefetcht0` (`pulp::x86::V1`, present on every
/// x86-64 CPU); a no-op elsewhere. It prefetches from slices of any element
/// type.
#[derive(Debug, Clone, Copy)]
pub struct Prefetch {
    #[cfg(target_arch = "x86_64")]
    v1: Option<pulp::x86::V1>,
}

impl Default for Prefetch {
    fn default() -> Self {
        Self::new()
    }
}

impl Prefetch {
    /// The CPU's prefetch instruction, if it has one this crate can use.
    pub fn new() -> Self {
        Prefetch {
            #[cfg(target_arch = "x86_64")]
            v1: pulp::x86::V1::try_new(),
        }
    }

    /// Asks for the cache line holding `row[index]` (nothing past the row's end).
    #[inline(always)]
    pub fn line<T>(&self, row: &[T], index: usize) {
        #[cfg(target_arch = "x86_64")]
        if let (Some(v1), Some(x)) = (self.v1, row.get(index)) {
            let at: *const T = x;
            v1.sse
                ._mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(at.cast::<i8>());
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (row, index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prefetching any index, in or past any row (empty ones too), of any
    /// element type, leaves the data and the kernel's result as they were.
    #[test]
    fn prefetch_changes_nothing() {
        let p = Prefetch::new();
        let row: Vec<u64> = (0..1000).collect();
        let empty: [f32; 0] = [];
        for i in [0, 1, 999, 1000, usize::MAX] {
            p.line(&row, i);
            p.line(&empty, i);
        }
        assert_eq!(row.iter().sum::<u64>(), 999 * 1000 / 2);
    }
}
