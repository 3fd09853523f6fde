//! Page-locked host memory: `cuMemHostAlloc`, portable and mapped into the device's address
//! space.

use alloc::sync::Arc;

use cudarc::driver::{CudaStream, result, sys};

use super::core::CudaCore;
use super::driver::{alloc_error, bind, drv};
use super::view::CudaBase;
use crate::backend::{Allocation, Backend, BackendStats, MemoryKind};
use crate::error::Error;
use crate::layout::{HostBase, HostMut, HostRef};

/// Alignment `cuMemHostAlloc` guarantees (a host page).
const PINNED_GUARANTEED_ALIGN: usize = 4096;

/// Page-locked host memory, `cuMemHostAlloc` (portable, device-mapped): staging for
/// asynchronous copies. Views are host slices; handing them out first waits for the stream,
/// so no queued copy still reads or writes them, and a failed wait is an error: arenas on it
/// hand out views through `Arena::try_views_mut` / `try_views`.
#[derive(Debug, Clone)]
pub struct PinnedBackend {
    core: CudaCore,
}

impl PinnedBackend {
    /// Pinned memory whose copies are ordered on `stream`.
    pub fn new(stream: Arc<CudaStream>) -> Self {
        PinnedBackend {
            core: CudaCore::new(stream),
        }
    }

    /// The stream copies are ordered on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.core.stream
    }

    /// What this backend (and its clones) did so far.
    pub fn stats(&self) -> BackendStats {
        self.core.stats()
    }

    /// The base of device views of `allocation` at its mapped device address
    /// (`cuMemHostGetDevicePointer`), ordered on the stream: kernels reach the same bytes
    /// without a copy.
    ///
    /// # Safety
    ///
    /// `allocation` must be a live allocation of this backend, borrowed for `'a` as the views
    /// made from the base require (exclusively for mutable views).
    pub(crate) unsafe fn mapped_base<'a>(
        &'a self,
        allocation: &Allocation,
    ) -> Result<CudaBase<'a>, Error> {
        let ptr = if allocation.bytes == 0 {
            allocation.addr
        } else {
            bind(&self.core.stream)?;
            let mut dptr: sys::CUdeviceptr = 0;
            // SAFETY: `allocation.addr` lies inside a live `cuMemHostAlloc` allocation made
            // with `CU_MEMHOSTALLOC_DEVICEMAP`; `dptr` is a valid out-pointer.
            unsafe {
                sys::cuMemHostGetDevicePointer_v2(
                    &mut dptr,
                    allocation.addr as usize as *mut core::ffi::c_void,
                    0,
                )
            }
            .result()
            .map_err(drv("cuMemHostGetDevicePointer"))?;
            dptr
        };
        // SAFETY: the mapped address addresses the allocation's bytes; the caller keeps them
        // live and borrowed.
        Ok(unsafe { CudaBase::new(ptr, &self.core.stream) })
    }
}

// SAFETY: `allocate` returns fresh page-locked host memory at least `bytes` long from an
// `align`-aligned address; `base_*` address it after the stream is idle; the memory is pinned
// host memory.
unsafe impl Backend for PinnedBackend {
    type Mut = HostMut;
    type Ref = HostRef;

    fn name(&self) -> &'static str {
        "cuda-pinned"
    }

    fn memory(&self) -> MemoryKind {
        MemoryKind::Pinned
    }

    fn allocate(&self, bytes: usize, align: usize) -> Result<Allocation, Error> {
        self.core.allocate(
            self.name(),
            bytes,
            align,
            PINNED_GUARANTEED_ALIGN,
            |total| {
                let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
                // SAFETY: the context is bound.
                let raw = unsafe { result::malloc_host(total, flags) }
                    .map_err(|e| alloc_error("cuMemHostAlloc", "cuda-pinned", total, e))?;
                // SAFETY: `total` bytes at `raw` were just allocated; zero them so every view
                // starts initialised.
                unsafe { core::ptr::write_bytes(raw.cast::<u8>(), 0, total) };
                Ok(raw as u64)
            },
        )
    }

    unsafe fn deallocate(&self, allocation: &Allocation) -> Result<(), Error> {
        self.core.free(allocation, true, |raw| {
            // SAFETY: `raw` came from `cuMemHostAlloc` and is freed once; no copy still uses it.
            unsafe { result::free_host(raw as usize as *mut core::ffi::c_void) }
                .map_err(drv("cuMemFreeHost"))
        })
    }

    fn ready(&self, allocation: &Allocation) -> Result<(), Error> {
        let _ = allocation;
        // Copies and mapped kernels queued on the stream may still read or write the memory:
        // wait for them. A failed wait (a broken context, a fault in a kernel) leaves the
        // host without views.
        self.core.synchronize()
    }

    unsafe fn base_mut<'a>(&'a self, allocation: &Allocation) -> HostBase<'a> {
        // SAFETY: the caller keeps the allocation live and exclusively borrowed for `'a`, and
        // `ready` waited for the stream.
        unsafe { HostBase::new(allocation.addr as usize as *mut u8) }
    }

    unsafe fn base_ref<'a>(&'a self, allocation: &Allocation) -> HostBase<'a> {
        // SAFETY: the caller keeps the allocation live and unwritten for `'a`, and `ready`
        // waited for the stream.
        unsafe { HostBase::new(allocation.addr as usize as *mut u8) }
    }

    fn stats(&self) -> BackendStats {
        self.core.stats()
    }
}
