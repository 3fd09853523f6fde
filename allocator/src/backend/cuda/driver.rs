//! Finding the driver and devices, mapping driver errors to [`Error`], and asking the driver
//! about addresses.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, DriverError, result, sys};

use crate::error::Error;

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

pub(crate) fn drv(call: &'static str) -> impl FnOnce(DriverError) -> Error {
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

/// The primary context of device `ordinal`, or [`Error::NoDevice`] when there is no driver or
/// no such device.
fn device_context(ordinal: usize) -> Result<Arc<CudaContext>, Error> {
    let n = device_count()?;
    if ordinal >= n {
        return Err(Error::NoDevice {
            reason: format!("device {ordinal} was asked for; the driver reports {n} device(s)"),
        });
    }
    CudaContext::new(ordinal).map_err(drv("cuDevicePrimaryCtxRetain"))
}

/// A new non-blocking stream on device `ordinal` (its primary context), or
/// [`Error::NoDevice`] when there is no driver or no such device.
///
/// Making it waits for nothing: cudarc's `CudaContext::new_stream` synchronizes the whole
/// context (`cuCtxSynchronize`) to make the first stream of a `CudaContext`, which would wait
/// for all of the device's work and fail (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, disturbing
/// the capture) while any thread of the process captures a graph. That synchronize puts in
/// order the work a `CudaContext` ran before it tracked events; the `CudaContext` made here is
/// new and has run nothing, so its first stream is made without it.
pub fn cuda_stream(ordinal: usize) -> Result<Arc<CudaStream>, Error> {
    let ctx = device_context(ordinal)?;
    // SAFETY: `ctx` is this call's alone and has made no `CudaSlice` and run no work, so no
    // use needs the tracking that is off for the one call below (which makes no slice); it is
    // back on before `ctx` is handed out.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.new_stream();
    // SAFETY: as above.
    unsafe { ctx.enable_event_tracking() };
    stream.map_err(drv("cuStreamCreate"))
}

/// The legacy default stream (handle `0`) of device `ordinal`'s primary context: the context
/// and the stream the CUDA runtime, and so PyTorch, use unless told otherwise. Memory allocated
/// on it is usable by runtime-API code in the same process. [`Error::NoDevice`] when there is
/// no driver or no such device.
pub fn default_stream(ordinal: usize) -> Result<Arc<CudaStream>, Error> {
    Ok(device_context(ordinal)?.default_stream())
}

/// Binds the stream's context to the calling thread (every driver call needs it current).
pub(crate) fn bind(stream: &CudaStream) -> Result<(), Error> {
    bind_context(stream.context())
}

/// Makes `ctx` the calling thread's current context (`cuCtxSetCurrent`, where it is not
/// already). Not cudarc's `bind_to_thread`, which first returns (and clears) an error that
/// cudarc recorded in the context object earlier, from some drop of the user's: that error
/// would be reported as this call's failure, and lost to its owner.
pub(crate) fn bind_context(ctx: &CudaContext) -> Result<(), Error> {
    make_current(ctx).map_err(drv("cuCtxSetCurrent"))
}

/// [`bind_context`] with the driver's error, for callers that only log it.
pub(crate) fn make_current(ctx: &CudaContext) -> Result<(), DriverError> {
    let ours = ctx.cu_ctx();
    if result::ctx::get_current()? != Some(ours) {
        // SAFETY: `ctx` holds the context alive for the call.
        unsafe { result::ctx::set_current(ours) }?;
    }
    Ok(())
}

/// One attribute of `ctx`'s device (`cuDeviceGetAttribute`), read without cudarc's
/// `CudaContext::attribute`, which would first report an error cudarc recorded in the
/// context object earlier as this call's (see [`bind_context`]).
pub(crate) fn device_attribute(
    ctx: &CudaContext,
    attribute: sys::CUdevice_attribute,
) -> Result<i32, Error> {
    // SAFETY: the device handle of a live context; reads one attribute.
    unsafe { result::device::get_attribute(ctx.cu_device(), attribute) }
        .map_err(drv("cuDeviceGetAttribute"))
}

/// Waits for everything queued on `stream` (`cuStreamSynchronize`), with the driver's call
/// itself: cudarc's `CudaStream::synchronize` first returns an error that cudarc recorded in
/// the context object earlier (some drop of the caller's), before it waits, and a caller that
/// waits so that an asynchronous copy into host memory it lends ends first would then hand
/// that memory back with the copy still running.
pub fn synchronize_stream(stream: &CudaStream) -> Result<(), Error> {
    bind(stream)?;
    // SAFETY: a live stream of the bound context.
    unsafe { result::stream::synchronize(stream.cu_stream()) }.map_err(drv("cuStreamSynchronize"))
}

/// Free and total bytes of the stream's device (`cuMemGetInfo`).
pub fn mem_info(stream: &CudaStream) -> Result<(usize, usize), Error> {
    bind(stream)?;
    result::mem_get_info().map_err(drv("cuMemGetInfo"))
}

pub(super) fn alloc_error(
    call: &'static str,
    backend: &'static str,
    bytes: usize,
    e: DriverError,
) -> Error {
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
    // A query, legal in the middle of a capture (a pool slice's views are made while one
    // records); relaxed mode keeps a thread-local or global capture from refusing it.
    super::graph::relaxed_capture(|| pointer_info_now(stream, addr))
}

fn pointer_info_now(stream: &CudaStream, addr: u64) -> Result<PointerInfo, Error> {
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
