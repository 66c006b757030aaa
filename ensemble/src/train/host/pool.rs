//! Reusable f32 buffers of the host training step.

/// Buffers kept between steps: a step takes each of its buffers from here
/// (the smallest that holds it) and gives them all back at the end.
#[derive(Debug, Default)]
pub(crate) struct Pool(Vec<Vec<f32>>);

impl Pool {
    /// A zeroed buffer of `n` entries.
    pub(crate) fn take(&mut self, n: usize) -> Vec<f32> {
        let best = (0..self.0.len())
            .filter(|&i| self.0[i].capacity() >= n)
            .min_by_key(|&i| self.0[i].capacity())
            .or_else(|| (0..self.0.len()).max_by_key(|&i| self.0[i].capacity()));
        let mut v = best.map(|i| self.0.swap_remove(i)).unwrap_or_default();
        v.clear();
        v.resize(n, 0.0);
        v
    }

    pub(crate) fn give(&mut self, v: Vec<f32>) {
        self.0.push(v);
    }
}
