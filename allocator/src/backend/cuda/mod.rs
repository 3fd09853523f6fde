//! The CUDA backends, through cudarc: device memory (`cuMemAlloc`), stream-ordered device
//! memory (`cuMemAllocAsync`), managed memory (`cuMemAllocManaged`) and pinned host memory
//! (`cuMemHostAlloc`).
//!
//! This folder and `devarena-kernels` are the only code that calls cudarc's driver API; the
//! arena's and the pool's CUDA conveniences (`Arena::prefetch_to_device`, `Pool::cuda`, ...)
//! live next to the arena and the pool and go through what is here.
//!
//! | file | what |
//! | --- | --- |
//! | `driver.rs` | finding the driver and devices, error mapping, pointer queries |
//! | `core.rs` | what every CUDA backend shares: its stream, counters, padding and freeing |
//! | `device.rs` | [`CudaBackend`]: `cuMemAlloc` and `cuMemAllocAsync` |
//! | `managed.rs` | [`ManagedBackend`]: `cuMemAllocManaged` and prefetching |
//! | `pinned.rs` | [`PinnedBackend`]: `cuMemHostAlloc` and its mapped device address |
//! | `view.rs` | [`DeviceView`], [`DeviceViewMut`] and the view kinds [`CudaMut`], [`CudaRef`] |
//! | `event.rs` | [`RecordedEvent`](event::RecordedEvent): events on raw stream handles, for stream ordering |
//!
//! ```no_run
//! use devarena::backend::cuda::{cuda_stream, CudaBackend};
//! use devarena::{Arena, DeviceLayout};
//!
//! #[derive(DeviceLayout)]
//! struct Frame { gray: [f32; 1024], hist: [u32; 256] }
//!
//! let stream = cuda_stream(0)?; // Err(Error::NoDevice { .. }) without a driver or device
//! let mut arena = Arena::<Frame, _>::new_in(CudaBackend::new(stream.clone()))?;
//! let mut views = arena.views_mut(); // DeviceViewMut<'_, f32>, DeviceViewMut<'_, u32>
//! views.gray.upload(&[0.5; 1024])?;
//! let mut hist = [0u32; 256];
//! views.hist.download(&mut hist)?;
//! // Views go straight to cudarc: `stream.launch_builder(&f).arg(&views.gray).arg(&mut views.hist)`.
//! # Ok::<(), devarena::Error>(())
//! ```
//!
//! # Streams
//!
//! Every view carries the stream of its arena. Work queued on that stream is ordered by the
//! stream itself, so a view needs no events there. When cudarc uses a view on *another* stream
//! (`DevicePtr::device_ptr(.., other)`), that stream first waits for the arena's stream and is
//! synchronized when the operation has been queued: correct, but serial. Pipelines that run on
//! several streams should give each stream its own arena, or order the streams themselves.

pub use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice,
    LaunchArgs, LaunchConfig, PushKernelArg,
};
pub use cudarc::nvrtc::Ptx;

mod core;
mod device;
mod driver;
pub mod event;
mod managed;
mod pinned;
mod view;

pub use device::{CudaBackend, DeviceAlloc};
pub use driver::{
    PointerInfo, PointerMemory, cuda_stream, default_stream, describe_device, device_count,
    driver_error, driver_present, mem_info, pointer_info,
};
pub use managed::ManagedBackend;
pub use pinned::PinnedBackend;
pub use view::{CudaBase, CudaMut, CudaRef, DeviceView, DeviceViewMut};
