//! The driver calls and small helpers the measurements share.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaStream, result, sys};
use devarena::{Error, FieldPlacement};
use devarena_kernels::pipeline::cuda::driver_error;

/// The device, its memory and the driver's CUDA version, for the tables' header.
pub fn describe(ctx: &Arc<CudaContext>) -> Result<String, Error> {
    let name = ctx.name().map_err(|e| driver_error("cuDeviceGetName", e))?;
    let (major, minor) = ctx
        .compute_capability()
        .map_err(|e| driver_error("cuDeviceGetAttribute", e))?;
    let total = ctx
        .total_mem()
        .map_err(|e| driver_error("cuDeviceTotalMem", e))?;
    let mut version = 0i32;
    // SAFETY: writes one `int` through a valid pointer.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(|e| driver_error("cuDriverGetVersion", e))?;
    Ok(format!(
        "{name} (sm_{major}{minor}, {:.1} GiB), CUDA driver API {}.{}",
        total as f64 / (1u64 << 30) as f64,
        version / 1000,
        version % 1000 / 10
    ))
}

/// The label of the pipeline's `Frame` in every table.
pub const FRAME: &str = "Frame (pipeline, up to 3840×2160)";

/// The sizes of a layout's buffers, in declaration order.
pub fn field_sizes(fields: &[FieldPlacement]) -> Vec<usize> {
    fields.iter().map(|f| f.size).collect()
}

pub fn median(v: &mut [Duration]) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

pub fn sync(stream: &CudaStream) -> Result<(), Error> {
    stream
        .synchronize()
        .map_err(|e| driver_error("cuStreamSynchronize", e))
}

/// Device buffers made with one `cuMemAlloc` each, freed by [`free`](Self::free) or on drop.
pub struct RawBuffers(pub Vec<sys::CUdeviceptr>);

impl RawBuffers {
    /// One `cuMemAlloc` per size, in order; on a failure, what was allocated is freed.
    pub fn alloc(sizes: &[usize]) -> Result<Self, Error> {
        let mut b = RawBuffers(Vec::with_capacity(sizes.len()));
        for &s in sizes {
            // SAFETY: a plain allocation in the current context, freed once when `b` frees or
            // drops.
            let p = unsafe { result::malloc_sync(s) }.map_err(|e| driver_error("cuMemAlloc", e))?;
            b.0.push(p);
        }
        Ok(b)
    }

    /// `cuMemFree` of every buffer, in order; the first failure is returned, and the buffers
    /// after it are freed on drop.
    pub fn free(mut self) -> Result<(), Error> {
        let mut ptrs = std::mem::take(&mut self.0).into_iter();
        for p in ptrs.by_ref() {
            // SAFETY: allocated by `alloc`, freed once: it has left `self.0`.
            if let Err(e) = unsafe { result::free_sync(p) } {
                self.0 = ptrs.collect();
                return Err(driver_error("cuMemFree", e));
            }
        }
        Ok(())
    }
}

impl Drop for RawBuffers {
    fn drop(&mut self) {
        for &p in &self.0 {
            // SAFETY: each pointer came from `malloc_sync` and is freed once, here.
            let _ = unsafe { result::free_sync(p) };
        }
    }
}
