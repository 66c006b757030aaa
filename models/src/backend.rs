//! What the models need to know about a burn backend, stated per backend
//! type: [`ModelBackend`].
//!
//! The execution plan ([`crate::plan`]) chooses each forward's
//! implementation from [`ModelBackend::KIND`] and
//! [`ModelBackend::AUTODIFF_OVER_HOST_MEMORY`], and the CPU kernels read a
//! weight's values in place through [`ModelBackend::host_f32`]: a typed
//! route per backend, resolved at compile time, instead of inspecting the
//! backend's type at run time.

use std::ops::Range;

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

/// What the forwards need to know about a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// burn-flex without autodiff: tensors are host memory that the CPU
    /// kernels may read and write directly.
    HostMemory,
    /// Any other backend (wgpu, cuda, autodiff): burn's tensor ops only.
    Device,
}

impl BackendKind {
    /// Whether the CPU kernels may read this backend's tensors in place.
    pub const fn is_host_memory(self) -> bool {
        matches!(self, Self::HostMemory)
    }
}

/// A burn backend the models run on: what the execution plan needs to know
/// about it, decided by its type.
///
/// Implemented for burn-flex ([`burn::backend::Flex`], feature `flex`: host
/// memory, with a host view of its f32 tensors), burn autodiff over any
/// `ModelBackend` (feature `autodiff`: burn's ops, host views of the inner
/// tensors), wgpu and cuda (features `wgpu`, `cuda`: burn's ops only). The
/// defaults describe a device backend, so another backend takes the models
/// with one line:
///
/// ```ignore
/// impl privmix_models::ModelBackend for MyBackend {}
/// ```
///
/// and then runs every forward on burn's tensor ops.
pub trait ModelBackend: Backend {
    /// Where the backend's tensors live: [`BackendKind::HostMemory`] lets
    /// the plan use the CPU kernels on them.
    const KIND: BackendKind = BackendKind::Device;

    /// Whether the backend is burn autodiff over a host-memory backend:
    /// parameters under the autodiff graph whose values are host memory,
    /// where a LoRA training step may run on host vectors (see
    /// [`crate::ExecutionPlan::with_host_training`]).
    const AUTODIFF_OVER_HOST_MEMORY: bool = false;

    /// The values of the f32 float tensor `tensor` in host memory, read in
    /// place (sharing its storage, not copied), where the backend keeps
    /// them there; `None` elsewhere (a device, another dtype). Reading is
    /// all a view allows: a product computed from it is a new tensor
    /// outside any autodiff graph.
    fn host_f32(tensor: &FloatTensor<Self>) -> Option<HostF32> {
        let _ = tensor;
        None
    }
}

/// The storage a [`HostF32`] shares.
#[cfg(feature = "flex")]
type SharedStorage = burn_flex::FlexTensor;
/// Without burn-flex no backend has a host view: a [`HostF32`] cannot be
/// built.
#[cfg(not(feature = "flex"))]
type SharedStorage = std::convert::Infallible;

/// A float tensor's f32 values in host memory, read in place: a handle on
/// the tensor's storage (kept alive while the view lives, not copied) with
/// the tensor's layout in it.
#[derive(Debug, Clone)]
pub struct HostF32 {
    storage: SharedStorage,
    start: usize,
    shape: Vec<usize>,
    strides: Vec<isize>,
}

impl HostF32 {
    /// The view of a burn-flex tensor, where its dtype is f32.
    #[cfg(feature = "flex")]
    fn of_flex(tensor: &burn_flex::FlexTensor) -> Option<Self> {
        if tensor.dtype() != burn::tensor::DType::F32 {
            return None;
        }
        let layout = tensor.layout();
        Some(Self {
            storage: tensor.clone(),
            start: layout.start_offset(),
            shape: layout.shape().to_vec(),
            strides: layout.strides().to_vec(),
        })
    }

    /// The tensor's shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The element strides of the tensor's dimensions in its storage.
    pub fn strides(&self) -> &[isize] {
        &self.strides
    }

    /// The tensor's values as they lie in its storage, where its element
    /// strides are exactly `strides` and `strides` lay the shape out
    /// densely (a permutation of a row-major layout: the values are then
    /// one run of the storage, from the tensor's first element); `None`
    /// otherwise. With `strides` row-major for the shape, the values are in
    /// row-major order; with another permutation, in that order.
    pub fn values_with_strides(&self, strides: &[usize]) -> Option<&[f32]> {
        let run = self.run(strides)?;
        Some(&self.storage_f32()[run])
    }

    /// [`HostF32::values_with_strides`] as a handle that keeps sharing the
    /// storage: the values stay readable (without checking the layout
    /// again) as long as the handle lives.
    pub fn into_values_with_strides(self, strides: &[usize]) -> Option<SharedF32> {
        let run = self.run(strides)?;
        Some(SharedF32 {
            storage: self.storage,
            run,
        })
    }

    /// Where the values lie in the storage, as
    /// [`HostF32::values_with_strides`] says.
    fn run(&self, strides: &[usize]) -> Option<Range<usize>> {
        if strides.len() != self.strides.len()
            || strides
                .iter()
                .zip(&self.strides)
                .any(|(&want, &have)| isize::try_from(want).ok() != Some(have))
            || !lays_out_densely(&self.shape, strides)
        {
            return None;
        }
        let len = self
            .shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))?;
        let run = self.start..self.start.checked_add(len)?;
        (run.end <= storage_f32(&self.storage).len()).then_some(run)
    }

    /// The whole storage the tensor shares.
    fn storage_f32(&self) -> &[f32] {
        storage_f32(&self.storage)
    }
}

/// A run of f32 values shared with a tensor's storage (see
/// [`HostF32::into_values_with_strides`]).
#[derive(Debug, Clone)]
pub struct SharedF32 {
    storage: SharedStorage,
    run: Range<usize>,
}

impl SharedF32 {
    /// The values.
    pub fn as_slice(&self) -> &[f32] {
        &storage_f32(&self.storage)[self.run.clone()]
    }
}

/// The f32 values of `storage`.
fn storage_f32(storage: &SharedStorage) -> &[f32] {
    #[cfg(feature = "flex")]
    {
        storage.storage::<f32>()
    }
    #[cfg(not(feature = "flex"))]
    match *storage {}
}

/// Whether `strides` place the elements of `shape` at distinct offsets
/// `0..len`: each dimension's stride is the product of the sizes of the
/// dimensions taken before it, in some order (no allocation: this runs
/// at every product that reads a weight in place).
fn lays_out_densely(shape: &[usize], strides: &[usize]) -> bool {
    if shape.len() != strides.len() || shape.len() > 64 {
        return false;
    }
    let mut taken = 0u64;
    let mut next = 1usize;
    for _ in 0..shape.len() {
        let Some(d) = (0..shape.len()).find(|&d| taken & (1 << d) == 0 && strides[d] == next)
        else {
            return false;
        };
        taken |= 1 << d;
        match next.checked_mul(shape[d]) {
            Some(n) => next = n,
            None => return false,
        }
    }
    true
}

/// burn-flex: tensors in host memory, f32 tensors viewed in place.
#[cfg(feature = "flex")]
impl ModelBackend for burn::backend::Flex {
    const KIND: BackendKind = BackendKind::HostMemory;

    fn host_f32(tensor: &FloatTensor<Self>) -> Option<HostF32> {
        HostF32::of_flex(tensor)
    }
}

/// burn autodiff: burn's ops (the graph must see every operation); over a
/// host-memory backend, the host training step may run, and the values of
/// the inner tensors are viewed in place (the frozen weights a training
/// step reads).
#[cfg(feature = "autodiff")]
impl<B, C> ModelBackend for burn::backend::Autodiff<B, C>
where
    B: ModelBackend,
    C: burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy,
{
    const AUTODIFF_OVER_HOST_MEMORY: bool = B::KIND.is_host_memory();

    fn host_f32(tensor: &FloatTensor<Self>) -> Option<HostF32> {
        use burn::tensor::backend::AutodiffBackend;
        B::host_f32(&<Self as AutodiffBackend>::inner(tensor.clone()))
    }
}

/// wgpu (its default element types, the ones the models use): a device,
/// burn's ops only.
#[cfg(feature = "wgpu")]
impl ModelBackend for burn::backend::Wgpu {}

/// CUDA (its default element types): a device, burn's ops only.
#[cfg(feature = "cuda")]
impl ModelBackend for burn::backend::Cuda {}

#[cfg(test)]
mod tests;
