//! The CUDA backends, through cudarc: device memory (`cuMemAlloc`), stream-ordered device
//! memory (`cuMemAllocAsync`), managed memory (`cuMemAllocManaged`), pinned host memory
//! (`cuMemHostAlloc`), and device memory mapped on demand under reserved addresses (the
//! virtual memory API, [`CudaVirtualMemory`]).
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
//! | `view.rs` | [`DeviceView`], [`DeviceViewMut`], the view kinds [`CudaMut`], [`CudaRef`], and [`TrustedDevicePtr`], the buffers safe kernel wrappers may launch on |
//! | `vmm.rs` | [`CudaVirtualMemory`]: `cuMemAddressReserve`, `cuMemCreate` + `cuMemMap` + `cuMemSetAccess`, `cuMemUnmap`: the growable pool region |
//! | `event.rs` | [`RecordedEvent`](event::RecordedEvent): events on raw stream handles, for stream ordering |
//! | `graph.rs` | CUDA graphs by stream capture: begin, end, instantiate, launch, and the capture mode (thread-local), for `Arena::capture` and `Pool::capture`; [`is_capturing`], [`capture_status_raw`] |
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
//! Every view carries a stream: its arena's, unless it was made for another one. What holds:
//!
//! * Work queued on the view's own stream is ordered by the stream: devarena's copies
//!   (`upload`, `download`, `fill_bytes`) run there, and so do kernels launched on it.
//! * cudarc's copy functions on *another* stream ask the view for its pointer on that stream
//!   (`DevicePtr::device_ptr(.., other)`): `other` first waits for the view's stream and is
//!   synchronized once the copy is queued. Correct, but serial.
//! * A view pushed as a kernel argument (`launch_builder(..).arg(&view)`) records and waits
//!   on nothing: cudarc's `launch` is `unsafe`, and a launch on a stream other than the
//!   view's is ordered only if the caller orders it. To run an arena's kernels on another
//!   stream, take views made for that stream: `Arena::views_mut_on(&other, |views| ..)` (and
//!   `stage_mut_on`) makes `other` wait for the arena's stream first, runs the closure with
//!   views whose stream is `other`, and makes the arena's stream wait for `other` once the
//!   closure has returned (or panicked); the views cannot outlive the closure.
//!   [`order_streams`] orders two streams by hand.

pub use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice,
    LaunchArgs, LaunchConfig, PushKernelArg,
};
pub use cudarc::nvrtc::Ptx;

mod core;
pub(crate) use self::core::PER_THREAD_STREAM;
pub use self::core::is_per_thread;
mod device;
mod driver;
pub mod event;
mod graph;
mod managed;
mod pinned;
mod view;
mod vmm;

pub use device::{CudaBackend, DeviceAlloc};
pub use driver::{
    PointerInfo, PointerMemory, cuda_stream, default_stream, describe_device, device_count,
    driver_error, driver_present, mem_info, pointer_info, synchronize_stream,
};
pub use event::{StreamOrdered, order_streams};
pub use graph::{CaptureStatus, capture_status_raw, is_capturing};
pub(crate) use graph::{GraphExec, PrivateStream, StreamCapture, is_capturing_raw};
pub use managed::ManagedBackend;
pub use pinned::PinnedBackend;
pub use view::{CudaBase, CudaMut, CudaRef, DeviceView, DeviceViewMut, TrustedDevicePtr};
pub use vmm::CudaVirtualMemory;
