//! Opening the wgpu device with fixed 16 MiB allocator blocks.
//!
//! cubecl opens its wgpu device with `MemoryHints::MemoryUsage`, under which
//! wgpu's Vulkan allocator (gpu-allocator) carves buffers out of shared
//! memory blocks whose size doubles from 8 to 64 MiB as blocks are added.
//! cubecl's pool pages (8, 32 and 128 MiB) and wgpu's short-lived buffers
//! (the staging copy of every upload, the per-dispatch uniforms) share those
//! blocks. On a software driver such as Mesa lavapipe, device memory is
//! process memory, and a block that transient buffers have written stays
//! resident after they are freed, so the process keeps about everything
//! ever allocated resident.
//!
//! [`open_wgpu_device`] opens the same adapter with the same features and
//! limits as cubecl, but with fixed blocks (`MemoryHints::Manual`): 16 MiB for
//! device memory, and half that, 8 MiB, for host-visible memory. lavapipe's
//! only memory type is host-visible, so there every block is 8 MiB, exactly
//! one of cubecl's small pages, and the pages no longer share blocks with the
//! transient buffers. (gpu-allocator rounds block sizes up to multiples of
//! 4 MiB and gives anything larger than a block an allocation of its own.)
//!
//! Larger blocks leave more block space written; 4 MiB blocks make each of
//! cubecl's 8 MiB pages an allocation of its own. Nothing is computed
//! differently: only how device memory is carved. The peak memory measured
//! for each block size is in the git log (`git log --grep "wgpu allocator"`).
//! On a discrete GPU, 16 MiB blocks are still far below Vulkan's
//! allocation-count limits for a model of this size.

use burn::backend::wgpu::graphics::{AutoGraphicsApi, GraphicsApi};
use burn::backend::wgpu::{RuntimeOptions, WgpuDevice, WgpuSetup, init_device};

use crate::ModelError;

/// The device allocator block size; host-visible blocks are half of it (see
/// the module documentation).
const BLOCK_BYTES: u64 = 16 * 1024 * 1024;

/// Opens the default wgpu adapter (Vulkan on Linux; lavapipe on machines
/// without a GPU) as a burn device, with 16 MiB allocator blocks (see the
/// module documentation). Use it in place of `WgpuDevice::default()`.
///
/// Errors: [`ModelError::Device`] when no adapter is found or the device
/// cannot be opened.
pub fn open_wgpu_device() -> Result<WgpuDevice, ModelError> {
    let backend = AutoGraphicsApi::backend();
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: backend.into(),
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        force_fallback_adapter: false,
        compatible_surface: None,
    }))
    .map_err(|e| ModelError::Device(format!("no wgpu adapter for {backend:?}: {e}")))?;
    // The features and limits cubecl asks for (cubecl-wgpu's
    // `request_device`), without its experimental passthrough shaders,
    // which the WGSL compiler does not use.
    let (device, queue) = pollster::block_on(
        adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("privmix"),
            required_features: adapter
                .features()
                .difference(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS),
            required_limits: adapter.limits(),
            memory_hints: wgpu::MemoryHints::Manual {
                suballocated_device_memory_block_size: BLOCK_BYTES..BLOCK_BYTES,
            },
            ..Default::default()
        }),
    )
    .map_err(|e| ModelError::Device(format!("opening {:?}: {e}", adapter.get_info().name)))?;
    let setup = WgpuSetup {
        instance,
        adapter,
        device,
        queue,
        backend,
    };
    Ok(init_device(setup, RuntimeOptions::default()))
}
