//! The one place a step's block operations are picked (from the model's
//! execution plan) and a forward generic over them is run.

/// Evaluates `$body` with `$ops` bound to the block operations `$plan`
/// picks for a step of `$batch` ([`crate::plan::ExecutionPlan::block_ops`]):
/// a forward written once, generic over [`BlockOps`], run by either
/// implementation.
macro_rules! dispatch {
    ($plan:expr, $batch:expr, $delta:expr, $device:expr, |$ops:ident| $body:expr) => {{
        let (rows, new_tokens) = ($batch.rows(), $batch.len());
        match $plan.block_ops(rows, new_tokens) {
            #[cfg(feature = "flex")]
            $crate::plan::BlockOpsKind::Host => {
                let $ops = $crate::ops::host::HostOps::new(
                    $delta,
                    [rows, new_tokens],
                    $plan.host_int8,
                    $device,
                );
                $body
            }
            _ => {
                let $ops = $crate::ops::tensor::TensorOps::new($delta, $plan.products.cpu_kernels);
                $body
            }
        }
    }};
}
pub(crate) use dispatch;
