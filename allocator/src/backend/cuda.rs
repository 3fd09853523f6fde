//! The CUDA backends, through cudarc: device memory (`cuMemAlloc`), stream-ordered device
//! memory (`cuMemAllocAsync`), managed memory (`cuMemAllocManaged`) and pinned host memory
//! (`cuMemHostAlloc`).
//!
//! This is the only module of `devarena` that calls cudarc.
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

use alloc::format;
use alloc::string::{String, ToString};
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::marker::PhantomData;
use core::ops::{Bound, RangeBounds};

pub use cudarc::driver::{
    CudaContext, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, LaunchArgs, PushKernelArg,
};
use cudarc::driver::{DriverError, SyncOnDrop, result, sys};

use super::{Allocation, Backend, BackendStats, Counters};
use crate::arena::{Arena, Disjoint};
use crate::error::Error;
use crate::layout::{Element, HostBase, HostMut, HostRef, ViewKind};

/// Alignment `cuMemAlloc`, `cuMemAllocAsync` and `cuMemAllocManaged` guarantee.
const DEVICE_GUARANTEED_ALIGN: usize = 256;
/// Alignment `cuMemHostAlloc` guarantees (a host page).
const PINNED_GUARANTEED_ALIGN: usize = 4096;

// --- driver discovery and errors ---------------------------------------------------------------

/// Whether the CUDA driver library can be loaded on this machine.
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the driver library by its known names.
    unsafe { sys::is_culib_present() }
}

/// Turns a driver error into [`Error::Driver`] (or [`Error::NoDevice`] when the driver says
/// there is none), with the CUDA error name and description.
pub fn driver_error(call: &'static str, e: DriverError) -> Error {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("CUresult {}", e.0 as u32));
    let text = e
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    if e.0 == sys::CUresult::CUDA_ERROR_NO_DEVICE {
        return Error::NoDevice {
            reason: format!("{call}: {name}: {text}"),
        };
    }
    Error::Driver {
        call,
        name,
        text,
        code: e.0 as u32,
    }
}

fn drv(call: &'static str) -> impl FnOnce(DriverError) -> Error {
    move |e| driver_error(call, e)
}

/// Number of CUDA devices, or [`Error::NoDevice`] when no driver is installed.
pub fn device_count() -> Result<usize, Error> {
    if !driver_present() {
        return Err(Error::NoDevice {
            reason: "the CUDA driver library (libcuda.so / nvcuda.dll) was not found".to_string(),
        });
    }
    result::init().map_err(drv("cuInit"))?;
    let n = result::device::get_count().map_err(drv("cuDeviceGetCount"))?;
    Ok(n.max(0) as usize)
}

/// A new non-blocking stream on device `ordinal` (its primary context), or
/// [`Error::NoDevice`] when there is no driver or no such device.
pub fn cuda_stream(ordinal: usize) -> Result<Arc<CudaStream>, Error> {
    let n = device_count()?;
    if ordinal >= n {
        return Err(Error::NoDevice {
            reason: format!("device {ordinal} was asked for; the driver reports {n} device(s)"),
        });
    }
    let ctx = CudaContext::new(ordinal).map_err(drv("cuDevicePrimaryCtxRetain"))?;
    ctx.new_stream().map_err(drv("cuStreamCreate"))
}

/// Free and total bytes of the stream's device (`cuMemGetInfo`).
pub fn mem_info(stream: &CudaStream) -> Result<(usize, usize), Error> {
    stream
        .context()
        .bind_to_thread()
        .map_err(drv("cuCtxSetCurrent"))?;
    result::mem_get_info().map_err(drv("cuMemGetInfo"))
}

fn alloc_error(call: &'static str, backend: &'static str, bytes: usize, e: DriverError) -> Error {
    if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        let free = result::mem_get_info().ok().map(|(free, _)| free);
        return Error::OutOfMemory {
            backend,
            requested: bytes,
            free,
            detail: Some("CUDA_ERROR_OUT_OF_MEMORY"),
        };
    }
    driver_error(call, e)
}

/// Bytes to ask the driver for so that an `align`-aligned block of `bytes` fits, given what
/// the driver guarantees.
fn padded(bytes: usize, align: usize, guaranteed: usize) -> Result<usize, Error> {
    if !align.is_power_of_two() {
        return Err(Error::invalid(format!(
            "alignment {align} is not a power of two"
        )));
    }
    let extra = align.saturating_sub(guaranteed);
    bytes.checked_add(extra).ok_or_else(|| {
        Error::invalid(format!(
            "{bytes} bytes plus {extra} bytes of alignment slack overflow usize"
        ))
    })
}

fn aligned(raw: u64, align: usize) -> u64 {
    let a = align as u64;
    raw.div_ceil(a) * a
}

fn zero_sized(align: usize) -> Allocation {
    Allocation {
        addr: align as u64,
        raw_addr: 0,
        bytes: 0,
        align,
    }
}

/// What every CUDA backend's `allocate` does around its driver call: zero bytes take no memory;
/// otherwise ask for enough to reach an alignment the driver does not guarantee, with the
/// context bound, count the outcome, and align the address.
fn allocate_with(
    stream: &CudaStream,
    counters: &Counters,
    bytes: usize,
    align: usize,
    guaranteed: usize,
    raw_alloc: impl FnOnce(usize) -> Result<u64, Error>,
) -> Result<Allocation, Error> {
    if bytes == 0 {
        counters.allocated(0);
        return Ok(zero_sized(align));
    }
    let total = padded(bytes, align, guaranteed)?;
    bind(stream)?;
    let raw = raw_alloc(total).inspect_err(|_| counters.failed())?;
    counters.allocated(bytes);
    Ok(Allocation {
        addr: aligned(raw, align),
        raw_addr: raw,
        bytes,
        align,
    })
}

/// What every CUDA backend's `deallocate` does around its driver call: count the free, skip a
/// zero-sized allocation, bind the context, optionally wait for the stream (work queued on it may
/// still use the memory), then free the address the driver returned.
fn free_with(
    stream: &CudaStream,
    counters: &Counters,
    allocation: &Allocation,
    wait_for_stream: bool,
    raw_free: impl FnOnce(u64) -> Result<(), Error>,
) -> Result<(), Error> {
    counters.freed(allocation.bytes);
    if allocation.bytes == 0 {
        return Ok(());
    }
    bind(stream)?;
    if wait_for_stream {
        stream.synchronize().map_err(drv("cuStreamSynchronize"))?;
    }
    raw_free(allocation.raw_addr)
}

// --- view types --------------------------------------------------------------------------------

/// A read-only view of `len` elements of device memory, tied to its arena's borrow and stream.
///
/// Implements cudarc's [`DeviceSlice`] and [`DevicePtr`], and `&DeviceView` is a kernel
/// argument (`launch_builder(..).arg(&view)`).
pub struct DeviceView<'a, T> {
    ptr: sys::CUdeviceptr,
    len: usize,
    stream: &'a Arc<CudaStream>,
    _marker: PhantomData<&'a [T]>,
}

/// A mutable view of `len` elements of device memory, tied to its arena's borrow and stream.
///
/// Implements cudarc's [`DeviceSlice`], [`DevicePtr`] and [`DevicePtrMut`], and both `&view`
/// and `&mut view` are kernel arguments.
pub struct DeviceViewMut<'a, T> {
    ptr: sys::CUdeviceptr,
    len: usize,
    stream: &'a Arc<CudaStream>,
    _marker: PhantomData<&'a mut [T]>,
}

impl<T> Clone for DeviceView<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DeviceView<'_, T> {}

impl<T> core::fmt::Debug for DeviceView<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DeviceView")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("type", &core::any::type_name::<T>())
            .finish()
    }
}

impl<T> core::fmt::Debug for DeviceViewMut<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DeviceViewMut")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("type", &core::any::type_name::<T>())
            .finish()
    }
}

fn range_of(range: impl RangeBounds<usize>, len: usize) -> Result<(usize, usize), Error> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    if start > end || end > len {
        return Err(Error::invalid(format!(
            "range {start}..{end} is outside a view of {len} elements"
        )));
    }
    Ok((start, end))
}

fn check_len(what: &str, view: usize, host: usize) -> Result<(), Error> {
    if view != host {
        return Err(Error::invalid(format!(
            "{what}: the view holds {view} elements, the host slice {host}"
        )));
    }
    Ok(())
}

macro_rules! common_view_methods {
    () => {
        /// Number of elements.
        pub fn len(&self) -> usize {
            self.len
        }

        /// Whether the view holds no elements.
        pub fn is_empty(&self) -> bool {
            self.len == 0
        }

        /// Bytes of the view.
        pub fn num_bytes(&self) -> usize {
            self.len * core::mem::size_of::<T>()
        }

        /// The device address (`CUdeviceptr`).
        pub fn device_addr(&self) -> u64 {
            self.ptr
        }

        /// The stream of the arena the view belongs to.
        pub fn stream(&self) -> &Arc<CudaStream> {
            self.stream
        }

        /// A read-only view of `range`.
        pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceView<'_, T>, Error> {
            let (start, end) = range_of(range, self.len)?;
            Ok(DeviceView {
                ptr: self.ptr + (start * core::mem::size_of::<T>()) as u64,
                len: end - start,
                stream: self.stream,
                _marker: PhantomData,
            })
        }

        /// Copies the view into `dst` (same length) and waits for the copy.
        pub fn download(&self, dst: &mut [T]) -> Result<(), Error>
        where
            T: Element,
        {
            check_len("download", self.len, dst.len())?;
            if self.len == 0 {
                return Ok(());
            }
            bind(self.stream)?;
            // SAFETY: `dst` holds exactly `len` elements and the view addresses `len` live
            // elements of device memory; the copy completes before `synchronize` returns.
            unsafe { result::memcpy_dtoh_async(dst, self.ptr, self.stream.cu_stream()) }
                .map_err(drv("cuMemcpyDtoHAsync"))?;
            self.stream
                .synchronize()
                .map_err(drv("cuStreamSynchronize"))
        }

        /// Copies the view into a new `Vec`.
        pub fn to_vec(&self) -> Result<Vec<T>, Error>
        where
            T: Element,
        {
            let mut v = Vec::with_capacity(self.len);
            // SAFETY: every bit pattern is a valid `T` (`Element`), and zeroing first keeps
            // the vector initialised even if the copy fails.
            unsafe {
                core::ptr::write_bytes(v.as_mut_ptr(), 0, self.len);
                v.set_len(self.len);
            }
            self.download(&mut v)?;
            Ok(v)
        }
    };
}

fn bind(stream: &CudaStream) -> Result<(), Error> {
    stream
        .context()
        .bind_to_thread()
        .map_err(drv("cuCtxSetCurrent"))
}

impl<'a, T> DeviceView<'a, T> {
    common_view_methods!();
}

impl<'a, T> DeviceViewMut<'a, T> {
    common_view_methods!();

    /// A read-only view of the whole view, borrowed.
    pub fn as_view(&self) -> DeviceView<'_, T> {
        DeviceView {
            ptr: self.ptr,
            len: self.len,
            stream: self.stream,
            _marker: PhantomData,
        }
    }

    /// A mutable view of `range`, borrowed.
    pub fn slice_mut(
        &mut self,
        range: impl RangeBounds<usize>,
    ) -> Result<DeviceViewMut<'_, T>, Error> {
        let (start, end) = range_of(range, self.len)?;
        Ok(DeviceViewMut {
            ptr: self.ptr + (start * core::mem::size_of::<T>()) as u64,
            len: end - start,
            stream: self.stream,
            _marker: PhantomData,
        })
    }

    /// Splits into two disjoint mutable views at `mid`, keeping the arena's lifetime.
    pub fn split_at(self, mid: usize) -> Result<(Self, Self), Error> {
        if mid > self.len {
            return Err(Error::invalid(format!(
                "split at {mid} is outside a view of {} elements",
                self.len
            )));
        }
        let right = DeviceViewMut {
            ptr: self.ptr + (mid * core::mem::size_of::<T>()) as u64,
            len: self.len - mid,
            stream: self.stream,
            _marker: PhantomData,
        };
        Ok((DeviceViewMut { len: mid, ..self }, right))
    }

    /// Copies `src` (same length) into the view and waits for the copy, so `src` may be
    /// changed as soon as this returns (also when it is pinned memory).
    pub fn upload(&mut self, src: &[T]) -> Result<(), Error>
    where
        T: Element,
    {
        check_len("upload", self.len, src.len())?;
        if self.len == 0 {
            return Ok(());
        }
        bind(self.stream)?;
        // SAFETY: `src` holds exactly `len` elements and the view addresses `len` live,
        // exclusively borrowed elements; `synchronize` keeps `src` borrowed until the copy ends.
        unsafe { result::memcpy_htod_async(self.ptr, src, self.stream.cu_stream()) }
            .map_err(drv("cuMemcpyHtoDAsync"))?;
        self.stream
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))
    }

    /// Sets every byte of the view to `byte`, queued on the arena's stream.
    pub fn fill_bytes(&mut self, byte: u8) -> Result<(), Error> {
        if self.len == 0 {
            return Ok(());
        }
        bind(self.stream)?;
        // SAFETY: the view addresses `num_bytes` live, exclusively borrowed bytes.
        unsafe {
            result::memset_d8_async(self.ptr, byte, self.num_bytes(), self.stream.cu_stream())
        }
        .map_err(drv("cuMemsetD8Async"))
    }
}

impl<T> DeviceSlice<T> for DeviceView<'_, T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }
}

impl<T> DeviceSlice<T> for DeviceViewMut<'_, T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }
}

/// Orders `stream` after the view's own stream when they differ (see the module docs).
fn order_after<'s>(own: &Arc<CudaStream>, stream: &'s CudaStream) -> SyncOnDrop<'s> {
    if own.cu_stream() == stream.cu_stream() {
        return SyncOnDrop::Sync(None);
    }
    stream.context().record_err(stream.join(own));
    SyncOnDrop::sync_stream(stream)
}

impl<T> DevicePtr<T> for DeviceView<'_, T> {
    fn device_ptr<'s>(&'s self, stream: &'s CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'s>) {
        (self.ptr, order_after(self.stream, stream))
    }
}

impl<T> DevicePtr<T> for DeviceViewMut<'_, T> {
    fn device_ptr<'s>(&'s self, stream: &'s CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'s>) {
        (self.ptr, order_after(self.stream, stream))
    }
}

impl<T> DevicePtrMut<T> for DeviceViewMut<'_, T> {
    fn device_ptr_mut<'s>(
        &'s mut self,
        stream: &'s CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'s>) {
        (self.ptr, order_after(self.stream, stream))
    }
}

// SAFETY: pushes a pointer to the view's stored device address, which lives as long as the
// borrow of the view ('b), which outlives the launch arguments ('a).
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b DeviceView<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b DeviceView<'c, T>) -> &mut Self {
        self.arg(&arg.ptr)
    }
}

// SAFETY: as above; a shared borrow of a mutable view gives the kernel read access.
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b DeviceViewMut<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b DeviceViewMut<'c, T>) -> &mut Self {
        self.arg(&arg.ptr)
    }
}

// SAFETY: as above; the exclusive borrow keeps every other use of the view out while the
// launch arguments live.
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b mut DeviceViewMut<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut DeviceViewMut<'c, T>) -> &mut Self {
        self.arg(&arg.ptr)
    }
}

// --- view kinds --------------------------------------------------------------------------------

/// The start of a device region and the stream its views are ordered on.
#[derive(Debug, Clone, Copy)]
pub struct CudaBase<'a> {
    ptr: u64,
    stream: &'a Arc<CudaStream>,
}

/// Device views you can write: [`DeviceViewMut`] per field.
#[derive(Debug, Clone, Copy)]
pub enum CudaMut {}

/// Device views you can read: [`DeviceView`] per field.
#[derive(Debug, Clone, Copy)]
pub enum CudaRef {}

// SAFETY: `slice` makes a view of exactly `len` elements at `offset` bytes from the base.
unsafe impl ViewKind for CudaMut {
    type Base<'a> = CudaBase<'a>;
    type Slice<'a, T: Element> = DeviceViewMut<'a, T>;

    unsafe fn offset<'a>(base: Self::Base<'a>, offset: usize) -> Self::Base<'a> {
        CudaBase {
            ptr: base.ptr + offset as u64,
            stream: base.stream,
        }
    }

    unsafe fn slice<'a, T: Element>(
        base: Self::Base<'a>,
        offset: usize,
        len: usize,
    ) -> Self::Slice<'a, T> {
        DeviceViewMut {
            ptr: base.ptr + offset as u64,
            len,
            stream: base.stream,
            _marker: PhantomData,
        }
    }
}

// SAFETY: `slice` makes a view of exactly `len` elements at `offset` bytes from the base.
unsafe impl ViewKind for CudaRef {
    type Base<'a> = CudaBase<'a>;
    type Slice<'a, T: Element> = DeviceView<'a, T>;

    unsafe fn offset<'a>(base: Self::Base<'a>, offset: usize) -> Self::Base<'a> {
        CudaBase {
            ptr: base.ptr + offset as u64,
            stream: base.stream,
        }
    }

    unsafe fn slice<'a, T: Element>(
        base: Self::Base<'a>,
        offset: usize,
        len: usize,
    ) -> Self::Slice<'a, T> {
        DeviceView {
            ptr: base.ptr + offset as u64,
            len,
            stream: base.stream,
            _marker: PhantomData,
        }
    }
}

// --- device memory -----------------------------------------------------------------------------

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
    stream: Arc<CudaStream>,
    mode: DeviceAlloc,
    counters: Arc<Counters>,
}

impl CudaBackend {
    /// `cuMemAlloc` / `cuMemFree`; views ordered on `stream`.
    pub fn new(stream: Arc<CudaStream>) -> Self {
        CudaBackend {
            stream,
            mode: DeviceAlloc::Sync,
            counters: Arc::default(),
        }
    }

    /// `cuMemAllocAsync` / `cuMemFreeAsync` on `stream` (needs a device with memory pools).
    pub fn stream_ordered(stream: Arc<CudaStream>) -> Self {
        CudaBackend {
            stream,
            mode: DeviceAlloc::StreamOrdered,
            counters: Arc::default(),
        }
    }

    /// The stream views are ordered on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// How this backend allocates.
    pub fn mode(&self) -> DeviceAlloc {
        self.mode
    }

    /// What this backend (and its clones) did so far.
    pub fn stats(&self) -> BackendStats {
        self.counters.snapshot()
    }
}

// SAFETY: `allocate` returns a fresh driver allocation at least `bytes` long from an address
// aligned to `align` (over-allocating when the driver guarantees less); `base_*` address it.
unsafe impl Backend for CudaBackend {
    type Mut = CudaMut;
    type Ref = CudaRef;

    fn name(&self) -> &'static str {
        match self.mode {
            DeviceAlloc::Sync => "cuda",
            DeviceAlloc::StreamOrdered => "cuda-async",
        }
    }

    fn allocate(&self, bytes: usize, align: usize) -> Result<Allocation, Error> {
        if self.mode == DeviceAlloc::StreamOrdered && !self.stream.context().has_async_alloc() {
            return Err(Error::invalid(
                "cuda-async backend: this device does not support memory pools \
                 (cuMemAllocAsync); use CudaBackend::new",
            ));
        }
        let counters = &*self.counters;
        allocate_with(
            &self.stream,
            counters,
            bytes,
            align,
            DEVICE_GUARANTEED_ALIGN,
            |total| {
                match self.mode {
                    // SAFETY: the context is bound; the memory is only handed out as views of
                    // `Element`s, for which every bit pattern is valid.
                    DeviceAlloc::Sync => unsafe { result::malloc_sync(total) }
                        .map_err(|e| alloc_error("cuMemAlloc", "cuda", total, e)),
                    DeviceAlloc::StreamOrdered => {
                        // SAFETY: as above; the stream is alive (held by `self`).
                        unsafe { result::malloc_async(self.stream.cu_stream(), total) }
                            .map_err(|e| alloc_error("cuMemAllocAsync", "cuda-async", total, e))
                    }
                }
            },
        )
    }

    unsafe fn deallocate(&self, allocation: &Allocation) -> Result<(), Error> {
        let sync = self.mode == DeviceAlloc::Sync;
        free_with(
            &self.stream,
            &self.counters,
            allocation,
            sync,
            |raw| match self.mode {
                // SAFETY: `raw` came from `cuMemAlloc` and is freed once (the caller's contract);
                // the stream that used it is idle.
                DeviceAlloc::Sync => unsafe { result::free_sync(raw) }.map_err(drv("cuMemFree")),
                DeviceAlloc::StreamOrdered => {
                    // SAFETY: `raw` came from `cuMemAllocAsync` on this stream and is freed
                    // once, after the work queued before it.
                    unsafe { result::free_async(raw, self.stream.cu_stream()) }
                        .map_err(drv("cuMemFreeAsync"))
                }
            },
        )
    }

    unsafe fn base_mut<'a>(&'a self, allocation: &Allocation) -> CudaBase<'a> {
        CudaBase {
            ptr: allocation.addr,
            stream: &self.stream,
        }
    }

    unsafe fn base_ref<'a>(&'a self, allocation: &Allocation) -> CudaBase<'a> {
        CudaBase {
            ptr: allocation.addr,
            stream: &self.stream,
        }
    }

    fn stats(&self) -> BackendStats {
        self.counters.snapshot()
    }
}

// --- managed memory ----------------------------------------------------------------------------

/// Managed (unified) memory, `cuMemAllocManaged`: the host writes through its pointer, then
/// [`Arena::prefetch_to_device`] moves it before the kernels run. Keep managed arenas small
/// (hundreds of MiB at most): oversubscribing managed memory can stall the whole GPU.
#[derive(Debug, Clone)]
pub struct ManagedBackend {
    stream: Arc<CudaStream>,
    counters: Arc<Counters>,
}

impl ManagedBackend {
    /// Managed memory whose views are ordered on `stream`.
    pub fn new(stream: Arc<CudaStream>) -> Self {
        ManagedBackend {
            stream,
            counters: Arc::default(),
        }
    }

    /// The stream views are ordered on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// What this backend (and its clones) did so far.
    pub fn stats(&self) -> BackendStats {
        self.counters.snapshot()
    }
}

// SAFETY: as for `CudaBackend`, with `cuMemAllocManaged`.
unsafe impl Backend for ManagedBackend {
    type Mut = CudaMut;
    type Ref = CudaRef;

    fn name(&self) -> &'static str {
        "cuda-managed"
    }

    fn allocate(&self, bytes: usize, align: usize) -> Result<Allocation, Error> {
        let counters = &*self.counters;
        allocate_with(
            &self.stream,
            counters,
            bytes,
            align,
            DEVICE_GUARANTEED_ALIGN,
            |total| {
                let attach = sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL;
                // SAFETY: the context is bound; views hold `Element`s only.
                unsafe { result::malloc_managed(total, attach) }
                    .map_err(|e| alloc_error("cuMemAllocManaged", "cuda-managed", total, e))
            },
        )
    }

    unsafe fn deallocate(&self, allocation: &Allocation) -> Result<(), Error> {
        free_with(&self.stream, &self.counters, allocation, true, |raw| {
            // SAFETY: `raw` came from `cuMemAllocManaged` and is freed once; the stream that
            // used it is idle.
            unsafe { result::free_sync(raw) }.map_err(drv("cuMemFree"))
        })
    }

    unsafe fn base_mut<'a>(&'a self, allocation: &Allocation) -> CudaBase<'a> {
        CudaBase {
            ptr: allocation.addr,
            stream: &self.stream,
        }
    }

    unsafe fn base_ref<'a>(&'a self, allocation: &Allocation) -> CudaBase<'a> {
        CudaBase {
            ptr: allocation.addr,
            stream: &self.stream,
        }
    }

    fn stats(&self) -> BackendStats {
        self.counters.snapshot()
    }
}

fn prefetch(stream: &CudaStream, a: &Allocation, to_device: bool) -> Result<(), Error> {
    if a.bytes == 0 {
        return Ok(());
    }
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
    // SAFETY: the range lies inside one live managed allocation.
    unsafe { result::mem_prefetch_async(a.addr, a.bytes, location, stream.cu_stream()) }
        .map_err(drv("cuMemPrefetchAsync"))
}

impl<L: Disjoint> Arena<L, ManagedBackend> {
    /// Queues a migration of the whole arena to the device on the arena's stream: call it after
    /// the host has written its inputs and before the kernels run.
    pub fn prefetch_to_device(&self) -> Result<(), Error> {
        prefetch(self.backend().stream(), &self.allocation(), true)
    }

    /// Migrates the whole arena to host memory and waits, so the host reads without faults.
    pub fn prefetch_to_host(&self) -> Result<(), Error> {
        let stream = self.backend().stream();
        prefetch(stream, &self.allocation(), false)?;
        stream.synchronize().map_err(drv("cuStreamSynchronize"))
    }

    /// Host views of every field. Waits for the arena's stream first, so no kernel of this
    /// stream still uses the memory while the host touches it.
    pub fn host_views_mut(&mut self) -> Result<L::Views<'_, HostMut>, Error> {
        self.backend()
            .stream()
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))?;
        // SAFETY: the allocation is live and exclusively borrowed; managed memory is
        // host-addressable at the same address; the stream is idle.
        Ok(unsafe { L::views::<HostMut>(HostBase::new(self.addr() as usize as *mut u8)) })
    }

    /// Read-only host views (waits for the arena's stream first).
    pub fn host_views(&self) -> Result<L::Views<'_, HostRef>, Error> {
        self.backend()
            .stream()
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))?;
        // SAFETY: as above, with a shared borrow.
        Ok(unsafe { L::views::<HostRef>(HostBase::new(self.addr() as usize as *mut u8)) })
    }
}

// --- pinned host memory ------------------------------------------------------------------------

/// Page-locked host memory, `cuMemHostAlloc` (portable, device-mapped): staging for
/// asynchronous copies. Views are host slices; handing them out first waits for the stream,
/// so no queued copy still reads or writes them.
#[derive(Debug, Clone)]
pub struct PinnedBackend {
    stream: Arc<CudaStream>,
    counters: Arc<Counters>,
}

impl PinnedBackend {
    /// Pinned memory whose copies are ordered on `stream`.
    pub fn new(stream: Arc<CudaStream>) -> Self {
        PinnedBackend {
            stream,
            counters: Arc::default(),
        }
    }

    /// The stream copies are ordered on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// What this backend (and its clones) did so far.
    pub fn stats(&self) -> BackendStats {
        self.counters.snapshot()
    }
}

// SAFETY: `allocate` returns fresh page-locked host memory at least `bytes` long from an
// `align`-aligned address; `base_*` address it after the stream is idle.
unsafe impl Backend for PinnedBackend {
    type Mut = HostMut;
    type Ref = HostRef;

    fn name(&self) -> &'static str {
        "cuda-pinned"
    }

    fn allocate(&self, bytes: usize, align: usize) -> Result<Allocation, Error> {
        let counters = &*self.counters;
        allocate_with(
            &self.stream,
            counters,
            bytes,
            align,
            PINNED_GUARANTEED_ALIGN,
            |total| {
                let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
                // SAFETY: the context is bound.
                let raw = unsafe { result::malloc_host(total, flags) }
                    .map_err(|e| alloc_error("cuMemHostAlloc", "cuda-pinned", total, e))?;
                // SAFETY: `total` bytes at `raw` were just allocated; zero them so every view starts
                // initialised.
                unsafe { core::ptr::write_bytes(raw.cast::<u8>(), 0, total) };
                Ok(raw as u64)
            },
        )
    }

    unsafe fn deallocate(&self, allocation: &Allocation) -> Result<(), Error> {
        free_with(&self.stream, &self.counters, allocation, true, |raw| {
            // SAFETY: `raw` came from `cuMemHostAlloc` and is freed once; no copy still uses it.
            unsafe { result::free_host(raw as usize as *mut core::ffi::c_void) }
                .map_err(drv("cuMemFreeHost"))
        })
    }

    unsafe fn base_mut<'a>(&'a self, allocation: &Allocation) -> HostBase<'a> {
        // Copies queued on the stream may still read or write the memory: wait for them. A
        // failure is kept in the context's error state (cudarc's `check_err`).
        self.stream.context().record_err(self.stream.synchronize());
        // SAFETY: the caller keeps the allocation live and exclusively borrowed for `'a`.
        unsafe { HostBase::new(allocation.addr as usize as *mut u8) }
    }

    unsafe fn base_ref<'a>(&'a self, allocation: &Allocation) -> HostBase<'a> {
        self.stream.context().record_err(self.stream.synchronize());
        // SAFETY: the caller keeps the allocation live and unwritten for `'a`.
        unsafe { HostBase::new(allocation.addr as usize as *mut u8) }
    }

    fn stats(&self) -> BackendStats {
        self.counters.snapshot()
    }
}

impl<L: Disjoint> Arena<L, PinnedBackend> {
    /// Device views of the pinned memory (zero-copy access from kernels through the mapped
    /// address), ordered on the arena's stream.
    pub fn device_views_mut(&mut self) -> Result<L::Views<'_, CudaMut>, Error> {
        let a = self.allocation();
        let ptr = if a.bytes == 0 {
            a.addr
        } else {
            bind(self.backend().stream())?;
            let mut dptr: sys::CUdeviceptr = 0;
            // SAFETY: `a.addr` lies inside a live `cuMemHostAlloc` allocation made with
            // `CU_MEMHOSTALLOC_DEVICEMAP`; `dptr` is a valid out-pointer.
            unsafe {
                sys::cuMemHostGetDevicePointer_v2(
                    &mut dptr,
                    a.addr as usize as *mut core::ffi::c_void,
                    0,
                )
            }
            .result()
            .map_err(drv("cuMemHostGetDevicePointer"))?;
            dptr
        };
        let stream = self.backend().stream();
        // SAFETY: the allocation is live and exclusively borrowed for the views' lifetime; the
        // mapped address addresses the same bytes.
        Ok(unsafe { L::views::<CudaMut>(CudaBase { ptr, stream }) })
    }
}

/// A short description of the device behind `stream`: name, compute capability, memory.
pub fn describe_device(stream: &CudaStream) -> Result<String, Error> {
    let ctx = stream.context();
    let name = ctx.name().map_err(drv("cuDeviceGetName"))?;
    let (major, minor) = ctx
        .compute_capability()
        .map_err(drv("cuDeviceGetAttribute"))?;
    let (free, total) = mem_info(stream)?;
    Ok(format!(
        "{name} (sm_{major}{minor}), {:.1} GiB total, {:.1} GiB free",
        total as f64 / (1u64 << 30) as f64,
        free as f64 / (1u64 << 30) as f64
    ))
}

// --- the runtime pool on a device --------------------------------------------------------------
//
// What `crate::pool` needs from CUDA, kept here so that the pool itself knows nothing of the
// driver: a stream runtime (`StreamSync`) on CUDA events, the constructor of a device pool, the
// conversion of a `PoolSlice` into device views, and pointer queries.

pub use cudarc::driver::{CudaFunction, CudaModule, LaunchConfig};
pub use cudarc::nvrtc::Ptx;

use alloc::boxed::Box;

use crate::pool::{Pool, PoolBuilder, PoolSlice, StreamEvent, StreamId, StreamSync};

/// The raw `CUstream` of a [`StreamId`].
fn cu_stream_of(stream: StreamId) -> sys::CUstream {
    stream.raw() as usize as sys::CUstream
}

/// The [`StreamId`] of a stream: its raw `CUstream` handle (`0` for the legacy default stream).
pub fn stream_id(stream: &CudaStream) -> StreamId {
    StreamId(stream.cu_stream() as usize as u64)
}

/// The legacy default stream (handle `0`) of device `ordinal`'s primary context: the context
/// and the stream the CUDA runtime, and so PyTorch, use unless told otherwise. Memory allocated
/// on it is usable by runtime-API code in the same process. [`Error::NoDevice`] when there is
/// no driver or no such device.
pub fn default_stream(ordinal: usize) -> Result<Arc<CudaStream>, Error> {
    let n = device_count()?;
    if ordinal >= n {
        return Err(Error::NoDevice {
            reason: format!("device {ordinal} was asked for; the driver reports {n} device(s)"),
        });
    }
    let ctx = CudaContext::new(ordinal).map_err(drv("cuDevicePrimaryCtxRetain"))?;
    Ok(ctx.default_stream())
}

/// The pool's stream runtime on CUDA events: `cuEventRecord` when a block is freed on a stream
/// other than the pool's home stream, `cuEventQuery` to see whether it may be reused, and
/// `cuEventRecord` + `cuStreamWaitEvent` to order a stream after the home stream.
///
/// Streams are named by their raw handles ([`StreamId`]), so streams that cudarc does not own
/// (a `cudaStream_t` from PyTorch, the legacy default stream `0`, the per-thread default stream
/// `2`) work too; they must belong to this context. Every call binds the context to the calling
/// thread first, never blocks the host and never calls back into the pool.
#[derive(Debug, Clone)]
pub struct CudaStreams {
    ctx: Arc<CudaContext>,
}

impl CudaStreams {
    /// A stream runtime for streams of `ctx`.
    pub fn new(ctx: Arc<CudaContext>) -> Self {
        CudaStreams { ctx }
    }

    /// The context the streams belong to.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// A fresh event (`cuEventCreate` with `CU_EVENT_DISABLE_TIMING`) recorded on `stream`.
    fn record_on(&self, stream: StreamId) -> Result<cudarc::driver::CudaEvent, Error> {
        // `new_event` binds the context.
        let event = self
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(drv("cuEventCreate"))?;
        // SAFETY: the event is alive (owned here); the stream handle is one the caller named
        // as a stream of this context, which the context is bound for.
        unsafe { result::event::record(event.cu_event(), cu_stream_of(stream)) }
            .map_err(drv("cuEventRecord"))?;
        Ok(event)
    }
}

/// An event recorded by [`CudaStreams`]; destroyed (`cuEventDestroy`) on drop.
#[derive(Debug)]
struct CudaPoolEvent {
    event: cudarc::driver::CudaEvent,
}

impl StreamEvent for CudaPoolEvent {
    fn is_complete(&self) -> Result<bool, Error> {
        self.event
            .context()
            .bind_to_thread()
            .map_err(drv("cuCtxSetCurrent"))?;
        // `cuEventQuery`: CUDA_SUCCESS → true, CUDA_ERROR_NOT_READY → false, else an error.
        self.event.try_is_complete().map_err(drv("cuEventQuery"))
    }
}

impl StreamSync for CudaStreams {
    fn record(&self, stream: StreamId) -> Result<Box<dyn StreamEvent>, Error> {
        Ok(Box::new(CudaPoolEvent {
            event: self.record_on(stream)?,
        }))
    }

    fn order_after(&self, waiter: StreamId, producer: StreamId) -> Result<(), Error> {
        let event = self.record_on(producer)?;
        // SAFETY: both handles are streams of this context (bound by `record_on`); the event is
        // alive. Destroying it right after the wait is allowed: the wait keeps what it needs.
        unsafe {
            result::stream::wait_event(
                cu_stream_of(waiter),
                event.cu_event(),
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(drv("cuStreamWaitEvent"))
    }
}

impl PoolBuilder {
    /// Reserves the region with `cuMemAlloc` on `stream`'s device ([`CudaBackend::new`]) and
    /// makes the pool stream-aware ([`CudaStreams`]) with `stream` as its home stream.
    ///
    /// ```no_run
    /// use devarena::backend::cuda::cuda_stream;
    /// use devarena::pool::{Pool, Tracking};
    ///
    /// let stream = cuda_stream(0)?;
    /// let pool = Pool::builder(1 << 30)
    ///     .name("engines")
    ///     .tracking(Tracking::Tags)
    ///     .build_cuda(stream)?;
    /// assert_eq!(pool.backend_name(), "cuda");
    /// # Ok::<(), devarena::Error>(())
    /// ```
    pub fn build_cuda(self, stream: Arc<CudaStream>) -> Result<Pool, Error> {
        let home = stream_id(&stream);
        let streams = Arc::new(CudaStreams::new(stream.context().clone()));
        self.streams(streams, home)
            .build_in(CudaBackend::new(stream))
    }
}

impl Pool {
    /// A pool of `capacity` bytes of device memory: one `cuMemAlloc` on `stream`'s device,
    /// home stream `stream` (see [`PoolBuilder::build_cuda`] for the other settings).
    ///
    /// Allocation and free never call the driver, except to record an event when a block is
    /// freed on another stream (see [`crate::pool::stream`]). [`PoolSlice::device_view`] and
    /// [`PoolSlice::device_view_mut`] turn typed slices into views for cudarc.
    ///
    /// ```no_run
    /// use devarena::backend::cuda::cuda_stream;
    /// use devarena::Pool;
    ///
    /// let stream = cuda_stream(0)?;
    /// let pool = Pool::cuda(stream.clone(), 256 << 20)?;
    /// let mut xs = pool.alloc_slice::<f32>(1 << 20)?;
    /// xs.device_view_mut(&stream)?.upload(&vec![1.0; 1 << 20])?;
    /// assert_eq!(xs.device_view(&stream)?.to_vec()?[12345], 1.0);
    /// # Ok::<(), devarena::Error>(())
    /// ```
    pub fn cuda(stream: Arc<CudaStream>, capacity: usize) -> Result<Pool, Error> {
        PoolBuilder::new(capacity).build_cuda(stream)
    }
}

impl<T: Element> PoolSlice<T> {
    /// Checks that the slice may be viewed on `stream` and returns its device address.
    fn device_addr_for(&self, stream: &CudaStream) -> Result<u64, Error> {
        let backend = self.client().backend_name();
        if !matches!(backend, "cuda" | "cuda-async" | "cuda-managed") {
            return Err(Error::invalid(format!(
                "pool slice at {:#x} lives in `{backend}` memory, which has no device view",
                self.addr()
            )));
        }
        let id = stream_id(stream);
        if id != self.stream() {
            return Err(Error::invalid(format!(
                "pool slice at {:#x} was allocated for stream {}, not stream {id}: a view is \
                 ordered on its slice's stream (allocate it with `alloc_slice_on` for the other \
                 stream, or pass the view to work on the other stream, which then waits)",
                self.addr(),
                self.stream()
            )));
        }
        let info = pointer_info(stream, self.addr())?;
        let ordinal = stream.context().ordinal();
        if info.device_ordinal != Some(ordinal) {
            return Err(Error::invalid(format!(
                "pool slice at {:#x} lives on device {:?}, the stream on device {ordinal}",
                self.addr(),
                info.device_ordinal
            )));
        }
        Ok(self.addr())
    }

    /// A read-only device view of the slice, ordered on `stream`: the stream the slice was
    /// allocated for (the pool's home stream for [`Pool::alloc_slice`]). The view borrows the
    /// slice, so the slice cannot be freed while a view of it lives.
    ///
    /// An error when the pool is not device memory, `stream` is not the slice's stream, or the
    /// memory is on another device than `stream`.
    pub fn device_view<'a>(
        &'a self,
        stream: &'a Arc<CudaStream>,
    ) -> Result<DeviceView<'a, T>, Error> {
        let ptr = self.device_addr_for(stream)?;
        Ok(DeviceView {
            ptr,
            len: self.len(),
            stream,
            _marker: PhantomData,
        })
    }

    /// A mutable device view of the slice, ordered on `stream` (see
    /// [`device_view`](Self::device_view)); `&mut self` makes it the only view.
    pub fn device_view_mut<'a>(
        &'a mut self,
        stream: &'a Arc<CudaStream>,
    ) -> Result<DeviceViewMut<'a, T>, Error> {
        let ptr = self.device_addr_for(stream)?;
        Ok(DeviceViewMut {
            ptr,
            len: self.len(),
            stream,
            _marker: PhantomData,
        })
    }
}

/// What the driver knows about an address (`cuPointerGetAttribute`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PointerInfo {
    /// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`: device, host, array or unified memory.
    pub memory_type: PointerMemory,
    /// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`, when the driver reports one.
    pub device_ordinal: Option<usize>,
    /// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`: start of the allocation the address lies in.
    pub range_start: u64,
    /// `CU_POINTER_ATTRIBUTE_RANGE_SIZE`: bytes of that allocation.
    pub range_size: usize,
}

/// The kind of memory an address points to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PointerMemory {
    /// Device memory (`cuMemAlloc`, `cuMemAllocAsync`).
    Device,
    /// Host memory known to the driver (pinned or registered).
    Host,
    /// A CUDA array.
    Array,
    /// Unified (managed) memory.
    Unified,
}

/// What the driver knows about `addr`, in `stream`'s context: an error for an address the
/// driver does not know (plain host memory, a freed allocation).
///
/// ```no_run
/// use devarena::backend::cuda::{cuda_stream, pointer_info, PointerMemory};
/// use devarena::Pool;
///
/// let stream = cuda_stream(0)?;
/// let pool = Pool::cuda(stream.clone(), 64 << 20)?;
/// let addr = pool.allocate(1000, 0)?;
/// let info = pointer_info(&stream, addr)?;
/// assert_eq!(info.memory_type, PointerMemory::Device);
/// assert!(info.range_start <= pool.base());
/// # Ok::<(), devarena::Error>(())
/// ```
pub fn pointer_info(stream: &CudaStream, addr: u64) -> Result<PointerInfo, Error> {
    bind(stream)?;
    fn attribute<V: Default>(attr: sys::CUpointer_attribute, addr: u64) -> Result<V, Error> {
        let mut value = V::default();
        // SAFETY: `value` is a valid out-pointer of the type the attribute writes (the
        // callers pair each attribute with its documented type: unsigned int, int, CUdeviceptr
        // or size_t); the driver only reads `addr`.
        unsafe {
            sys::cuPointerGetAttribute(
                (&mut value as *mut V).cast::<core::ffi::c_void>(),
                attr,
                addr,
            )
        }
        .result()
        .map_err(drv("cuPointerGetAttribute"))?;
        Ok(value)
    }
    use sys::CUpointer_attribute as A;
    let memory_type = match attribute::<u32>(A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, addr)? {
        t if t == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 => PointerMemory::Device,
        t if t == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32 => PointerMemory::Host,
        t if t == sys::CUmemorytype::CU_MEMORYTYPE_ARRAY as u32 => PointerMemory::Array,
        _ => PointerMemory::Unified,
    };
    let is_managed = attribute::<u32>(A::CU_POINTER_ATTRIBUTE_IS_MANAGED, addr)? != 0;
    let memory_type = if is_managed {
        PointerMemory::Unified
    } else {
        memory_type
    };
    let device_ordinal = attribute::<i32>(A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, addr)
        .ok()
        .and_then(|o| usize::try_from(o).ok());
    let range_start = attribute::<u64>(A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, addr)?;
    let range_size = attribute::<usize>(A::CU_POINTER_ATTRIBUTE_RANGE_SIZE, addr)?;
    Ok(PointerInfo {
        memory_type,
        device_ordinal,
        range_start,
        range_size,
    })
}
