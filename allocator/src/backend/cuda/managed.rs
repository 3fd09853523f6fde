//! Managed (unified) memory: `cuMemAllocManaged`, with prefetching to the device or the host.

use alloc::format;
use alloc::sync::Arc;

use cudarc::driver::{CudaStream, result, sys};

use super::core::CudaCore;
use super::driver::{alloc_error, bind, device_attribute, drv};
use super::view::{CudaBase, CudaMut, CudaRef};
use crate::backend::{Allocation, Backend, BackendStats, DirectViews, MemoryKind};
use crate::error::Error;
use crate::layout::HostBase;
use crate::plan::CUDA_ALIGN;

/// Managed (unified) memory, `cuMemAllocManaged`: the host writes through its pointer, then
/// `Arena::prefetch_to_device` moves it before the kernels run. Keep managed arenas small
/// (hundreds of MiB at most): oversubscribing managed memory can stall the whole GPU.
/// Host views need a device with concurrent managed access (Linux on Pascal or later): on
/// one without (Windows, some Jetson boards) they are refused with an error.
#[derive(Debug, Clone)]
pub struct ManagedBackend {
    core: CudaCore,
}

impl ManagedBackend {
    /// Managed memory whose views are ordered on `stream`.
    pub fn new(stream: Arc<CudaStream>) -> Self {
        ManagedBackend {
            core: CudaCore::new(stream),
        }
    }

    /// The stream views are ordered on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.core.stream
    }

    /// What this backend (and its clones) did so far.
    pub fn stats(&self) -> BackendStats {
        self.core.stats()
    }

    /// Queues a migration of `allocation` to the device (`to_device`) or to host memory on the
    /// stream (`cuMemPrefetchAsync`).
    pub(crate) fn prefetch(&self, allocation: &Allocation, to_device: bool) -> Result<(), Error> {
        if allocation.bytes == 0 {
            return Ok(());
        }
        let stream = &self.core.stream;
        bind(stream)?;
        let location = if to_device {
            sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: stream.context().ordinal() as i32,
            }
        } else {
            sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
                id: 0,
            }
        };
        // SAFETY: the range is one live managed allocation of this backend.
        unsafe {
            result::mem_prefetch_async(
                allocation.addr,
                allocation.bytes,
                location,
                stream.cu_stream(),
            )
        }
        .map_err(drv("cuMemPrefetchAsync"))
    }

    /// Waits for the stream, then the host base of `allocation`: managed memory is
    /// host-addressable at the address the driver returned.
    ///
    /// An error on a device without concurrent managed access
    /// (`CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS` 0: Windows, some Jetson boards): there
    /// the host may not touch memory attached to every stream, as this backend's is, while
    /// any kernel of the device runs, on any stream, which no wait for this backend's stream
    /// can promise.
    ///
    /// # Safety
    ///
    /// `allocation` must be a live allocation of this backend, borrowed for `'a` as the views
    /// made from the base require (exclusively for mutable views).
    pub(crate) unsafe fn host_base<'a>(
        &'a self,
        allocation: &Allocation,
    ) -> Result<HostBase<'a>, Error> {
        let ctx = self.core.stream.context();
        let concurrent = device_attribute(
            ctx,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS,
        )?;
        if concurrent == 0 {
            return Err(Error::invalid(format!(
                "host views of `cuda-managed` memory: device {} has no concurrent managed \
                 access (CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS is 0), so the host may \
                 not touch managed memory while any of its kernels runs; copy through device \
                 views instead",
                ctx.ordinal()
            )));
        }
        self.core.synchronize()?;
        // SAFETY: the caller keeps the allocation live and borrowed; the stream is idle, so
        // no kernel of it still uses the memory.
        Ok(unsafe { HostBase::new(allocation.addr as usize as *mut u8) })
    }

    /// Waits for everything queued on the stream.
    pub(crate) fn synchronize(&self) -> Result<(), Error> {
        self.core.synchronize()
    }
}

// SAFETY: its views are device views, ordered on the backend's stream: the host never
// touches the memory through them, so there is nothing to wait for.
unsafe impl DirectViews for ManagedBackend {}

// SAFETY: as for `CudaBackend`, with `cuMemAllocManaged`; the memory is managed memory.
unsafe impl Backend for ManagedBackend {
    type Mut = CudaMut;
    type Ref = CudaRef;

    fn name(&self) -> &'static str {
        "cuda-managed"
    }

    fn memory(&self) -> MemoryKind {
        MemoryKind::Managed
    }

    fn allocate(&self, bytes: usize, align: usize) -> Result<Allocation, Error> {
        self.core
            .allocate(self.name(), bytes, align, CUDA_ALIGN, |total| {
                let attach = sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL;
                // SAFETY: the context is bound; views hold `Element`s only.
                let raw = unsafe { result::malloc_managed(total, attach) }
                    .map_err(|e| alloc_error("cuMemAllocManaged", "cuda-managed", total, e))?;
                // Zeroed before anyone sees it, as pinned memory is: host views read the bytes,
                // which the driver does not promise to initialise. On the device, so that no page
                // migrates to the host for it (a memset of managed memory returns once done).
                // SAFETY: `total` bytes at `raw` were just allocated in the bound context.
                if let Err(e) = unsafe { result::memset_d8_sync(raw, 0, total) } {
                    // SAFETY: `raw` came from `cuMemAllocManaged` above, and nothing uses it.
                    let _ = unsafe { result::free_sync(raw) };
                    return Err(drv("cuMemsetD8")(e));
                }
                Ok(raw)
            })
    }

    unsafe fn deallocate(&self, allocation: &Allocation) -> Result<(), Error> {
        self.core.free(allocation, true, |raw| {
            // SAFETY: `raw` came from `cuMemAllocManaged` and is freed once; the stream that
            // used it is idle.
            unsafe { result::free_sync(raw) }.map_err(drv("cuMemFree"))
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

// SAFETY: the backend's device views are made on `core.stream` (`CudaCore::device_base`); its
// host views (`host_base`) and its free (`CudaCore::free` with the wait) wait for that stream.
unsafe impl super::event::StreamOrdered for ManagedBackend {
    fn stream(&self) -> &Arc<CudaStream> {
        &self.core.stream
    }
}
