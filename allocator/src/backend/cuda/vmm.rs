//! Device memory through the CUDA virtual memory API: an address range reserved once
//! (`cuMemAddressReserve`), physical memory created and mapped under it in chunks
//! (`cuMemCreate`, `cuMemMap`, `cuMemSetAccess`), unmapped chunk by chunk (`cuMemUnmap`).
//!
//! The driver's rules this file follows: every address, size and offset is a multiple of the
//! minimum granularity (`cuMemGetAllocationGranularity`); a mapping is unmapped whole, never in
//! part, so every chunk is a mapping of its own (one `cuMemCreate` + `cuMemMap` each); a new
//! mapping has no access until `cuMemSetAccess` grants it, which one call does for a whole run
//! of fresh chunks; the allocation handle is released (`cuMemRelease`) right after its mapping
//! is made, which keeps the memory until the chunk is unmapped, so nothing but the address
//! has to be remembered; a reservation is freed (`cuMemAddressFree`) with its exact size, once
//! nothing in it is mapped.

use alloc::format;
use alloc::sync::Arc;

use cudarc::driver::{CudaStream, sys};

use super::driver::{alloc_error, bind, drv};
use super::graph::{relaxed_capture, trace_call};
use crate::backend::{MemoryKind, VirtualMemory};
use crate::error::Error;

/// The name of [`CudaVirtualMemory`] in messages and reports.
const NAME: &str = "cuda-vmm";

/// Device memory of one GPU through the virtual memory API: what a growable device pool is made
/// of (`Pool::cuda`). Its chunks are device memory of the stream's device, readable and
/// writable from it.
///
/// ```no_run
/// use devarena::backend::cuda::{cuda_stream, CudaVirtualMemory};
/// use devarena::backend::VirtualMemory;
///
/// let stream = cuda_stream(0)?;
/// let vm = CudaVirtualMemory::new(stream)?;
/// assert!(vm.granularity().is_power_of_two()); // 2 MiB on an H200
/// # Ok::<(), devarena::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct CudaVirtualMemory {
    stream: Arc<CudaStream>,
    device: sys::CUdevice,
    granularity: usize,
    recommended: usize,
}

impl CudaVirtualMemory {
    /// The virtual memory of `stream`'s device. An error when the device has no virtual memory
    /// management (`CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`) or the driver
    /// reports no granularity.
    pub fn new(stream: Arc<CudaStream>) -> Result<Self, Error> {
        let ctx = stream.context();
        if !Self::supported(&stream)? {
            return Err(Error::invalid(format!(
                "device {} does not support the CUDA virtual memory API; use a classic region \
                 (`RegionKind::Classic`)",
                ctx.ordinal()
            )));
        }
        let device = ctx.cu_device();
        let query = |option| -> Result<usize, Error> {
            let mut granularity = 0usize;
            let prop = allocation_prop(device);
            // SAFETY: both pointers are valid for the call; `prop` describes pinned device
            // memory of a device the driver knows.
            unsafe { sys::cuMemGetAllocationGranularity(&mut granularity, &prop, option) }
                .result()
                .map_err(drv("cuMemGetAllocationGranularity"))?;
            Ok(granularity)
        };
        use sys::CUmemAllocationGranularity_flags as G;
        let granularity = query(G::CU_MEM_ALLOC_GRANULARITY_MINIMUM)?;
        let recommended = query(G::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)?;
        if !granularity.is_power_of_two() {
            return Err(Error::invalid(format!(
                "device {}: the driver reports a mapping granularity of {granularity} bytes, \
                 not a power of two",
                ctx.ordinal()
            )));
        }
        // A chunk is a multiple of the minimum, and a power of two (the pool's chunk index is a
        // shift).
        let recommended = recommended
            .max(granularity)
            .checked_next_power_of_two()
            .unwrap_or(granularity);
        Ok(CudaVirtualMemory {
            stream,
            device,
            granularity,
            recommended,
        })
    }

    /// Whether `stream`'s device has the virtual memory API
    /// (`CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`).
    pub fn supported(stream: &CudaStream) -> Result<bool, Error> {
        bind(stream)?;
        let supported = super::driver::device_attribute(
            stream.context(),
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
        )?;
        Ok(supported != 0)
    }

    /// The stream whose device and context the memory belongs to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Unmaps `count` chunks from `addr` on, after a failed map (errors are logged: the chunks
    /// were just made, nothing uses them, and the map's own error is the one to report).
    fn unmap_run(&self, addr: u64, chunk: usize, count: usize) {
        for i in 0..count {
            let at = addr + (i * chunk) as u64;
            // SAFETY: the chunk was mapped by this map call a moment ago and nothing uses it.
            if let Err(e) = unsafe { sys::cuMemUnmap(at, chunk) }.result() {
                log::error!(
                    target: "devarena::pool",
                    "{NAME}: undoing a failed map, unmapping {chunk} bytes at {at:#x} failed: {}",
                    super::driver_error("cuMemUnmap", e)
                );
            }
        }
    }

    /// Creates one chunk of physical memory and maps it at `at`; the handle is released at once
    /// (the mapping keeps the memory).
    ///
    /// # Safety
    ///
    /// As for [`VirtualMemory::map`], for the one chunk; the context is bound.
    unsafe fn map_one(&self, at: u64, chunk: usize) -> Result<(), Error> {
        let prop = allocation_prop(self.device);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer and properties; `chunk` is a multiple of the granularity.
        unsafe { sys::cuMemCreate(&mut handle, chunk, &prop, 0) }
            .result()
            .map_err(|e| alloc_error("cuMemCreate", NAME, chunk, e))?;
        // SAFETY: `at..at + chunk` lies in a reservation of this process, at the granularity,
        // unmapped (the caller's contract); the handle is live and `chunk` bytes long; offset
        // and flags 0.
        let mapped = unsafe { sys::cuMemMap(at, chunk, 0, handle, 0) }.result();
        // The handle goes either way: when the map failed this frees the memory, when it
        // worked the mapping keeps the memory until the chunk is unmapped.
        // SAFETY: the handle came from `cuMemCreate` above and is released once.
        let released = unsafe { sys::cuMemRelease(handle) }.result();
        mapped.map_err(|e| alloc_error("cuMemMap", NAME, chunk, e))?;
        if let Err(e) = released {
            self.unmap_run(at, chunk, 1);
            return Err(super::driver_error("cuMemRelease", e));
        }
        Ok(())
    }
}

/// What every chunk is: pinned (non-migratable) memory on `device`, no shareable handle.
fn allocation_prop(device: sys::CUdevice) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: device_location(device),
        win32HandleMetaData: core::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

fn device_location(device: sys::CUdevice) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: device,
    }
}

// SAFETY: `reserve` returns what `cuMemAddressReserve` returned, aligned to the minimum
// granularity (asked for), which no other allocation overlaps until `cuMemAddressFree`; `map`
// makes every chunk of the run device memory of this device with read-write access from it,
// or unmaps what it mapped and fails; the granularity is the driver's minimum, a power of two
// (checked in `new`), fixed for the device.
unsafe impl VirtualMemory for CudaVirtualMemory {
    fn name(&self) -> &'static str {
        NAME
    }

    fn memory(&self) -> MemoryKind {
        MemoryKind::Device
    }

    fn granularity(&self) -> usize {
        self.granularity
    }

    fn recommended_chunk(&self) -> usize {
        self.recommended
    }

    fn reserve(&self, bytes: usize) -> Result<u64, Error> {
        bind(&self.stream)?;
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: a valid out-pointer; `bytes` is a multiple of the granularity (the caller's
        // contract), the alignment a power of two, no address hint, flags 0.
        unsafe { sys::cuMemAddressReserve(&mut base, bytes, self.granularity, 0, 0) }
            .result()
            .map_err(|e| alloc_error("cuMemAddressReserve", NAME, bytes, e))?;
        Ok(base)
    }

    unsafe fn free_reservation(&self, base: u64, bytes: usize) -> Result<(), Error> {
        bind(&self.stream)?;
        // SAFETY: the caller's contract: a reservation made by `reserve` with this size, with
        // nothing mapped in it.
        unsafe { sys::cuMemAddressFree(base, bytes) }
            .result()
            .map_err(drv("cuMemAddressFree"))
    }

    unsafe fn map(&self, addr: u64, chunk: usize, count: usize) -> Result<(), Error> {
        // Relaxed capture mode: a pool may grow in the middle of someone's capture (PyTorch asks
        // its allocator for memory while capturing), and none of these calls touches a stream.
        trace_call(
            "cuMemCreate+cuMemMap+cuMemSetAccess",
            format_args!("{addr:#x}, {count} x {chunk} bytes"),
        );
        // SAFETY: the caller's contract, passed on.
        relaxed_capture(|| unsafe { self.map_run(addr, chunk, count) })
    }

    unsafe fn unmap(&self, addr: u64, chunk: usize) -> Result<(), Error> {
        trace_call("cuMemUnmap", format_args!("{addr:#x}, {chunk} bytes"));
        relaxed_capture(|| {
            bind(&self.stream)?;
            // SAFETY: the caller's contract: one whole chunk mapped by `map`, unused from now
            // on.
            unsafe { sys::cuMemUnmap(addr, chunk) }
                .result()
                .map_err(drv("cuMemUnmap"))
        })
    }

    fn synchronize(&self) -> Result<(), Error> {
        // In relaxed capture mode, as every other call here: a graph captured in global mode
        // elsewhere must not make the teardown's wait fail (which leaves the region mapped).
        super::event::synchronize_context(self.stream.context())
    }
}

impl CudaVirtualMemory {
    /// [`VirtualMemory::map`], in whatever capture mode the thread is in.
    ///
    /// # Safety
    ///
    /// As for [`VirtualMemory::map`].
    unsafe fn map_run(&self, addr: u64, chunk: usize, count: usize) -> Result<(), Error> {
        bind(&self.stream)?;
        for i in 0..count {
            let at = addr + (i * chunk) as u64;
            // SAFETY: one chunk of the run, which the caller's contract covers.
            if let Err(error) = unsafe { self.map_one(at, chunk) } {
                self.unmap_run(addr, chunk, i);
                return Err(error);
            }
        }
        let bytes = chunk * count;
        let access = sys::CUmemAccessDesc {
            location: device_location(self.device),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // One call for the whole run: the range is exactly the chunks just mapped, each a
        // whole mapping.
        // SAFETY: `addr..addr + bytes` is fully mapped (above); one valid descriptor.
        if let Err(e) = unsafe { sys::cuMemSetAccess(addr, bytes, &access, 1) }.result() {
            self.unmap_run(addr, chunk, count);
            return Err(alloc_error("cuMemSetAccess", NAME, bytes, e));
        }
        Ok(())
    }
}
