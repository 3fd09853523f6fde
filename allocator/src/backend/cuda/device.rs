//! Device memory: `cuMemAlloc` or, stream-ordered, `cuMemAllocAsync`.

use alloc::sync::Arc;

use cudarc::driver::{CudaStream, result};

use super::core::CudaCore;
use super::driver::{alloc_error, drv};
use super::view::{CudaBase, CudaMut, CudaRef};
use crate::backend::{Allocation, Backend, BackendStats, DirectViews, MemoryKind};
use crate::error::Error;
use crate::plan::CUDA_ALIGN;

/// How [`CudaBackend`] allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceAlloc {
    /// `cuMemAlloc` / `cuMemFree` (the free waits for the arena's stream first).
    Sync,
    /// `cuMemAllocAsync` / `cuMemFreeAsync` on the arena's stream: stream-ordered.
    StreamOrdered,
}

/// Device memory on one stream: `cuMemAlloc` ([`CudaBackend::new`]) or `cuMemAllocAsync`
/// ([`CudaBackend::stream_ordered`]). Clones share the stream and the counters.
#[derive(Debug, Clone)]
pub struct CudaBackend {
    core: CudaCore,
    mode: DeviceAlloc,
}

impl CudaBackend {
    /// `cuMemAlloc` / `cuMemFree`; views ordered on `stream`.
    pub fn new(stream: Arc<CudaStream>) -> Self {
        CudaBackend {
            core: CudaCore::new(stream),
            mode: DeviceAlloc::Sync,
        }
    }

    /// `cuMemAllocAsync` / `cuMemFreeAsync` on `stream` (needs a device with memory pools).
    pub fn stream_ordered(stream: Arc<CudaStream>) -> Self {
        CudaBackend {
            core: CudaCore::new(stream),
            mode: DeviceAlloc::StreamOrdered,
        }
    }

    /// The stream views are ordered on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.core.stream
    }

    /// How this backend allocates.
    pub fn mode(&self) -> DeviceAlloc {
        self.mode
    }

    /// What this backend (and its clones) did so far.
    pub fn stats(&self) -> BackendStats {
        self.core.stats()
    }
}

// SAFETY: its views are device views, ordered on the backend's stream: the host never
// touches the memory through them, so there is nothing to wait for.
unsafe impl DirectViews for CudaBackend {}

// SAFETY: `allocate` returns a fresh driver allocation at least `bytes` long from an address
// aligned to `align` (over-allocating when the driver guarantees less); `base_*` address it;
// the memory is device memory.
unsafe impl Backend for CudaBackend {
    type Mut = CudaMut;
    type Ref = CudaRef;

    fn name(&self) -> &'static str {
        match self.mode {
            DeviceAlloc::Sync => "cuda",
            DeviceAlloc::StreamOrdered => "cuda-async",
        }
    }

    fn memory(&self) -> MemoryKind {
        MemoryKind::Device
    }

    fn allocate(&self, bytes: usize, align: usize) -> Result<Allocation, Error> {
        let stream = &self.core.stream;
        if self.mode == DeviceAlloc::StreamOrdered && !stream.context().has_async_alloc() {
            return Err(Error::invalid(
                "cuda-async backend: this device does not support memory pools \
                 (cuMemAllocAsync); use CudaBackend::new",
            ));
        }
        self.core
            .allocate(self.name(), bytes, align, CUDA_ALIGN, |total| {
                match self.mode {
                    // SAFETY: the context is bound; the memory is only handed out as views of
                    // `Element`s, for which every bit pattern is valid.
                    DeviceAlloc::Sync => unsafe { result::malloc_sync(total) }
                        .map_err(|e| alloc_error("cuMemAlloc", "cuda", total, e)),
                    DeviceAlloc::StreamOrdered => {
                        // SAFETY: as above; the stream is alive (held by `self`).
                        unsafe { result::malloc_async(stream.cu_stream(), total) }
                            .map_err(|e| alloc_error("cuMemAllocAsync", "cuda-async", total, e))
                    }
                }
            })
    }

    unsafe fn deallocate(&self, allocation: &Allocation) -> Result<(), Error> {
        let sync = self.mode == DeviceAlloc::Sync;
        self.core.free(allocation, sync, |raw| match self.mode {
            // SAFETY: `raw` came from `cuMemAlloc` and is freed once (the caller's contract);
            // the stream that used it is idle.
            DeviceAlloc::Sync => unsafe { result::free_sync(raw) }.map_err(drv("cuMemFree")),
            DeviceAlloc::StreamOrdered => {
                // SAFETY: `raw` came from `cuMemAllocAsync` on this stream and is freed once,
                // after the work queued before it.
                unsafe { result::free_async(raw, self.core.stream.cu_stream()) }
                    .map_err(drv("cuMemFreeAsync"))
            }
        })
    }

    unsafe fn base_mut<'a>(&'a self, allocation: &Allocation) -> CudaBase<'a> {
        self.core.device_base(allocation)
    }

    unsafe fn base_ref<'a>(&'a self, allocation: &Allocation) -> CudaBase<'a> {
        self.core.device_base(allocation)
    }

    fn stats(&self) -> BackendStats {
        self.core.stats()
    }
}

// SAFETY: the backend's device views are made on `core.stream` (`CudaCore::device_base`), and
// its free waits for that stream (`cuMemFree` after `cuStreamSynchronize`) or is queued on it
// (`cuMemFreeAsync`); the host never touches device memory.
unsafe impl super::event::StreamOrdered for CudaBackend {
    fn stream(&self) -> &Arc<CudaStream> {
        &self.core.stream
    }
}
