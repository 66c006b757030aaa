//! Next-token cross-entropy of a model (plus an optional adapter) on
//! fixed-length token blocks.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use privmix_models::{Batch, LanguageModel, LinearDelta, log_softmax};

use super::error::TrainError;

/// Checks that `blocks` is non-empty and all blocks have one length ≥ 2.
pub fn check_blocks(blocks: &[Vec<u32>]) -> Result<usize, TrainError> {
    let len = blocks
        .first()
        .map(Vec::len)
        .ok_or_else(|| TrainError::BadData("no block".into()))?;
    if len < 2 {
        return Err(TrainError::BadData(format!("blocks of {len} token(s)")));
    }
    if let Some(b) = blocks.iter().find(|b| b.len() != len) {
        return Err(TrainError::BadData(format!(
            "blocks of lengths {len} and {}",
            b.len()
        )));
    }
    Ok(len)
}

/// `log p(block[i+1] | block[..=i])` of every position, `[blocks, len − 1, 1]`.
fn target_log_probs<B: Backend, M: LanguageModel<B> + ?Sized>(
    model: &M,
    blocks: &[&Vec<u32>],
    delta: Option<&dyn LinearDelta<B>>,
) -> Result<Tensor<B, 3>, TrainError> {
    let owned: Vec<Vec<u32>> = blocks.iter().map(|b| (*b).clone()).collect();
    let len = check_blocks(&owned)?;
    let n = len - 1;
    let rows: Vec<Vec<u32>> = owned.iter().map(|b| b[..n].to_vec()).collect();
    let targets: Vec<i64> = owned
        .iter()
        .flat_map(|b| b[1..].iter().map(|&t| i64::from(t)))
        .collect();
    let batch = Batch::new(&rows)?;
    let mut cache = model.new_cache(rows.len());
    let logits = model.forward(&batch, &mut cache, delta)?;
    let idx = Tensor::<B, 3, Int>::from_data(
        TensorData::new(targets, [rows.len(), n, 1]),
        &model.device(),
    );
    Ok(log_softmax(logits).gather(2, idx))
}

/// Mean over all predicted positions of `−log p(block[i+1] | block[..=i])`,
/// for blocks of one length (each block's first `len − 1` tokens are the
/// input, the last `len − 1` the targets), as a one-element tensor on the
/// model's device (differentiable when the backend is).
pub fn mean_nll<B: Backend, M: LanguageModel<B> + ?Sized>(
    model: &M,
    blocks: &[&Vec<u32>],
    delta: Option<&dyn LinearDelta<B>>,
) -> Result<Tensor<B, 1>, TrainError> {
    Ok(target_log_probs(model, blocks, delta)?
        .mean()
        .neg()
        .reshape([1]))
}

/// Each block's own mean next-token loss (as [`mean_nll`] of that block
/// alone), `[blocks]`, from one batched forward.
pub fn block_mean_nll<B: Backend, M: LanguageModel<B> + ?Sized>(
    model: &M,
    blocks: &[&Vec<u32>],
    delta: Option<&dyn LinearDelta<B>>,
) -> Result<Tensor<B, 1>, TrainError> {
    let lp = target_log_probs(model, blocks, delta)?;
    let [rows, n, _] = lp.dims();
    Ok(lp.reshape([rows, n]).mean_dim(1).neg().reshape([rows]))
}
