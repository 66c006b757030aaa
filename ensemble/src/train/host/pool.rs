//! Reusable f32 buffers of the host training step.

/// Buffers kept between steps: a step takes each of its buffers from here
/// and gives them all back at the end.
///
/// A request is served by the smallest kept buffer that holds it but is at
/// most [`SLACK`] times its size; failing that, by the largest kept buffer
/// too small for it, grown (its old memory freed); failing that, by a new
/// buffer. The bound matters: a step keeps small buffers for a long time
/// (each layer's input when layers are recomputed) while large ones come
/// and go (a layer's attention probabilities), and a small request served
/// by a large free buffer holds that buffer's memory unused while the next
/// large request allocates again, once per layer.
#[derive(Debug, Default)]
pub(crate) struct Pool(Vec<Vec<f32>>);

/// How many times larger than a request a kept buffer that serves it may be.
const SLACK: usize = 2;

impl Pool {
    /// A zeroed buffer of `n` entries.
    pub(crate) fn take(&mut self, n: usize) -> Vec<f32> {
        let mut v = self.pick(n);
        v.clear();
        v.resize(n, 0.0);
        v
    }

    /// A buffer of `n` entries that the caller overwrites in full before it
    /// reads any (the output of a product that does not accumulate, of a
    /// norm, a copy): a kept buffer's old values are left in place, not
    /// zeroed, since the step's buffers add up to hundreds of MB, zeroed
    /// on one thread while the others wait. In builds with debug
    /// assertions (the tests) every entry is NaN instead, so a read before
    /// the write shows in the losses and gradients.
    pub(crate) fn take_for_overwrite(&mut self, n: usize) -> Vec<f32> {
        let mut v = self.pick(n);
        if cfg!(debug_assertions) {
            v.clear();
            v.resize(n, f32::NAN);
        } else if v.len() >= n {
            v.truncate(n);
        } else {
            v.resize(n, 0.0);
        }
        v
    }

    /// The kept buffer that serves a request for `n` entries (see the type's
    /// docs), or a new empty one.
    fn pick(&mut self, n: usize) -> Vec<f32> {
        let cap = |i: usize| self.0[i].capacity();
        let best = (0..self.0.len())
            .filter(|&i| cap(i) >= n && cap(i) <= n.saturating_mul(SLACK))
            .min_by_key(|&i| cap(i))
            .or_else(|| {
                (0..self.0.len())
                    .filter(|&i| cap(i) < n)
                    .max_by_key(|&i| cap(i))
            });
        best.map(|i| self.0.swap_remove(i)).unwrap_or_default()
    }

    pub(crate) fn give(&mut self, v: Vec<f32>) {
        self.0.push(v);
    }

    /// Bytes of every kept buffer's capacity.
    #[cfg(test)]
    fn kept_bytes(&self) -> usize {
        self.0.iter().map(|v| v.capacity() * 4).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pattern of a recomputed step's forward pass: each layer keeps a
    /// small buffer (its input) and takes and gives back a large one (its
    /// attention probabilities). Memory stays one large buffer plus the
    /// small ones, however many layers run.
    #[test]
    fn a_small_request_never_holds_a_large_free_buffer() {
        let (small, large, layers) = (1_000, 50_000, 30);
        let mut pool = Pool::default();
        let mut kept = Vec::new();
        let mut peak_live = 0;
        for _ in 0..layers {
            kept.push(pool.take(small));
            let probs = pool.take(large);
            let live: usize = kept.iter().map(Vec::capacity).sum::<usize>() + probs.capacity();
            peak_live = peak_live.max(live);
            pool.give(probs);
        }
        assert_eq!(peak_live, layers * small + large);
        for v in kept {
            pool.give(v);
        }
        assert_eq!(pool.kept_bytes(), 4 * (layers * small + large));
    }

    /// A buffer taken for overwriting has its `n` entries and comes from
    /// the same kept buffers as a zeroed one; in builds with debug
    /// assertions every entry is NaN.
    #[test]
    fn a_buffer_for_overwriting_is_reused_and_poisoned_in_tests() {
        let mut pool = Pool::default();
        let mut v = pool.take(100);
        v.iter_mut().for_each(|x| *x = 1.0);
        let ptr = v.as_ptr();
        pool.give(v);
        let w = pool.take_for_overwrite(80);
        assert_eq!((w.len(), w.as_ptr()), (80, ptr));
        if cfg!(debug_assertions) {
            assert!(w.iter().all(|x| x.is_nan()));
        }
        pool.give(w);
        let grown = pool.take_for_overwrite(150);
        assert_eq!(grown.len(), 150);
        assert_eq!(pool.0.len(), 0, "the kept buffer was grown");
    }

    #[test]
    fn buffers_are_zeroed_and_reused_within_the_slack() {
        let mut pool = Pool::default();
        let mut v = pool.take(100);
        v.iter_mut().for_each(|x| *x = 1.0);
        let ptr = v.as_ptr();
        pool.give(v);
        let w = pool.take(60);
        assert_eq!(
            w.as_ptr(),
            ptr,
            "a buffer at most twice the request is reused"
        );
        assert!(w.iter().all(|&x| x == 0.0));
        pool.give(w);
        let u = pool.take(10);
        assert_ne!(
            u.as_ptr(),
            ptr,
            "a buffer ten times the request is left for a larger one"
        );
        pool.give(u);
        let big = pool.take(500);
        assert_eq!(big.len(), 500);
        assert_eq!(
            pool.0.len(),
            1,
            "the largest too-small buffer was grown, not a new one made"
        );
    }
}
