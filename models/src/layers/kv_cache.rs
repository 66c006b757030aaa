//! Key/value cache with per-row bookkeeping.
//!
//! The cache holds one key and one value tensor per layer,
//! `[batch, kv_heads, slots, head_dim]`, and for every batch row the validity
//! and the position of every slot. A padding token occupies a slot that no
//! query may attend to and does not advance its row's position, so rows of
//! different lengths (left or right padding, or rows that stop early) share
//! one cache and each row sees exactly what it would see alone.

use burn::tensor::{Bool, Tensor, TensorData, backend::Backend};

use crate::error::ModelError;

/// One row's slot bookkeeping.
#[derive(Debug, Clone, Default)]
struct RowSlots {
    /// Whether slot `j` holds a real token.
    valid: Vec<bool>,
    /// Position (rotary index) of slot `j` (for padding: the row's next position).
    position: Vec<usize>,
    /// Number of real tokens so far: the position of the next real token.
    next_position: usize,
}

/// Per-layer keys and values plus per-row slot validity and positions.
#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    layers: Vec<Option<(Tensor<B, 4>, Tensor<B, 4>)>>,
    rows: Vec<RowSlots>,
}

impl<B: Backend> KvCache<B> {
    /// An empty cache for `num_layers` layers and `batch` rows.
    pub fn new(num_layers: usize, batch: usize) -> Self {
        Self {
            layers: vec![None; num_layers],
            rows: vec![RowSlots::default(); batch],
        }
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Number of batch rows.
    pub fn batch_size(&self) -> usize {
        self.rows.len()
    }

    /// Number of slots (tokens, padding included) held per row.
    pub fn slots(&self) -> usize {
        self.rows.first().map_or(0, |r| r.valid.len())
    }

    /// Number of real (non-padding) tokens of row `row` so far.
    pub fn real_tokens(&self, row: usize) -> Option<usize> {
        self.rows.get(row).map(|r| r.next_position)
    }

    /// Registers a step of `real[row][i]` flags (one per new token) and returns
    /// the positions of the new tokens. Checks the batch size and that rows
    /// have equal length.
    pub fn push_step(&mut self, real: &[Vec<bool>]) -> Result<Vec<Vec<usize>>, ModelError> {
        if real.len() != self.rows.len() {
            return Err(ModelError::bad_input(format!(
                "batch has {} rows but the cache was made for {}",
                real.len(),
                self.rows.len()
            )));
        }
        let mut positions = Vec::with_capacity(real.len());
        for (row, flags) in self.rows.iter_mut().zip(real) {
            let mut pos = Vec::with_capacity(flags.len());
            for &is_real in flags {
                row.valid.push(is_real);
                row.position.push(row.next_position);
                pos.push(row.next_position);
                if is_real {
                    row.next_position += 1;
                }
            }
            positions.push(pos);
        }
        Ok(positions)
    }

    /// Attention mask for the last `new` slots as queries against all slots
    /// as keys, `[batch, 1, new, slots]`, `true` where attention is NOT
    /// allowed. A key is visible to a query iff it is real, not later than
    /// the query, and (with a window `w`) fewer than `w` positions before it
    /// (HF `sliding_window_overlay`: `kv > q - w`).
    pub fn mask(
        &self,
        new: usize,
        window: Option<usize>,
        device: &B::Device,
    ) -> Tensor<B, 4, Bool> {
        let t = self.slots();
        let start = t.saturating_sub(new);
        let new = t - start;
        let mut data = Vec::with_capacity(self.rows.len() * new * t);
        for row in &self.rows {
            for q in start..t {
                let qp = row.position[q];
                for k in 0..t {
                    let kp = row.position[k];
                    let visible =
                        row.valid[k] && k <= q && window.is_none_or(|w| qp - kp.min(qp) < w);
                    data.push(!visible);
                }
            }
        }
        Tensor::from_data(TensorData::new(data, [self.rows.len(), 1, new, t]), device)
    }

    /// Appends this step's keys and values to layer `layer` and returns all of
    /// them (`[batch, kv_heads, slots, head_dim]`). Models call it with
    /// `layer < num_layers()` (checked once per step by
    /// [`crate::runtime::start_step`]); a larger index panics.
    pub fn append(
        &mut self,
        layer: usize,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let entry = match self.layers[layer].take() {
            Some((pk, pv)) => (Tensor::cat(vec![pk, k], 2), Tensor::cat(vec![pv, v], 2)),
            None => (k, v),
        };
        self.layers[layer] = Some(entry.clone());
        entry
    }

    /// Keeps only the rows `keep` (in that order), e.g. to drop finished rows
    /// between decode steps.
    pub fn select_rows(&mut self, keep: &[usize]) -> Result<(), ModelError> {
        if let Some(&bad) = keep.iter().find(|&&r| r >= self.rows.len()) {
            return Err(ModelError::bad_input(format!(
                "row {bad} out of range for a cache of {} rows",
                self.rows.len()
            )));
        }
        self.rows = keep.iter().map(|&r| self.rows[r].clone()).collect();
        for entry in &mut self.layers {
            if let Some((k, v)) = entry.take() {
                let device = k.device();
                let idx: Vec<i64> = keep.iter().map(|&r| r as i64).collect();
                let idx = Tensor::<B, 1, burn::tensor::Int>::from_data(
                    TensorData::new(idx, [keep.len()]),
                    &device,
                );
                *entry = Some((k.select(0, idx.clone()), v.select(0, idx)));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    #[test]
    fn padding_slots_are_masked_and_do_not_advance_positions() {
        let mut cache = KvCache::<Flex>::new(1, 2);
        let pos = cache
            .push_step(&[vec![true, true, true], vec![false, true, true]])
            .unwrap();
        assert_eq!(pos, vec![vec![0, 1, 2], vec![0, 0, 1]]);
        let m = cache
            .mask(3, None, &Default::default())
            .into_data()
            .to_vec::<bool>()
            .unwrap();
        // Row 1, query slot 2 sees slots 1 and 2 only.
        assert_eq!(&m[9 + 6..9 + 9], &[true, false, false]);
        // Row 0 is plain causal.
        assert_eq!(&m[0..3], &[false, true, true]);
        let w = cache
            .mask(1, Some(2), &Default::default())
            .into_data()
            .to_vec::<bool>()
            .unwrap();
        assert_eq!(&w[0..3], &[true, false, false]);
        assert!(cache.push_step(&[vec![true]]).is_err());
    }
}
