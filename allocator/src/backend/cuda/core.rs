//! What every CUDA backend shares: the stream its views are ordered on, its counters, and the
//! shape of an allocation around the driver call (padding to an alignment the driver does not
//! guarantee, binding the context, counting, aligning) and of a free.

use alloc::format;
use alloc::sync::Arc;

use cudarc::driver::CudaStream;

use super::driver::bind;
use super::view::CudaBase;
use crate::backend::{Allocation, BackendStats, Counters};
use crate::error::Error;
use crate::plan::align_up_u64;

/// CUDA's per-thread default stream (`CU_STREAM_PER_THREAD`): one handle that names another
/// stream on each thread.
pub(crate) const PER_THREAD_STREAM: u64 = 2;

/// Whether `stream` is CUDA's per-thread default stream (`CU_STREAM_PER_THREAD`, the handle
/// `2` that cudarc's `CudaContext::per_thread_stream` gives), which names another stream on
/// each thread.
pub fn is_per_thread(stream: &CudaStream) -> bool {
    stream.cu_stream() as u64 == PER_THREAD_STREAM
}

/// The stream and counters of a CUDA backend. Clones share both.
#[derive(Debug, Clone)]
pub(super) struct CudaCore {
    pub(super) stream: Arc<CudaStream>,
    counters: Arc<Counters>,
}

impl CudaCore {
    pub(super) fn new(stream: Arc<CudaStream>) -> Self {
        CudaCore {
            stream,
            counters: Arc::default(),
        }
    }

    pub(super) fn stats(&self) -> BackendStats {
        self.counters.snapshot()
    }

    /// An allocation around `raw_alloc` for the backend `name`: zero bytes take no memory;
    /// otherwise ask for enough to reach `align` from the `guaranteed` alignment of the
    /// driver's addresses, with the context bound, count the outcome and align the address.
    /// Refused on CUDA's per-thread default stream.
    pub(super) fn allocate(
        &self,
        name: &str,
        bytes: usize,
        align: usize,
        guaranteed: usize,
        raw_alloc: impl FnOnce(usize) -> Result<u64, Error>,
    ) -> Result<Allocation, Error> {
        // An arena is `Send` and `Sync`: used or dropped on another thread, its work, its
        // host views' waits and its free would go to that thread's stream, out of the order
        // of the work queued on it here (the pool refuses this stream for its slices too).
        if is_per_thread(&self.stream) {
            return Err(Error::invalid(format!(
                "{name} backend: its stream is CUDA's per-thread default stream, which names a \
                 different stream on each thread; an arena, which may be used and dropped on \
                 any thread, orders its work, its host views and its free on one stream: use a \
                 stream of your own (`ctx.new_stream()`)"
            )));
        }
        if !align.is_power_of_two() {
            return Err(Error::invalid(format!(
                "alignment {align} is not a power of two"
            )));
        }
        if bytes == 0 {
            self.counters.allocated(0);
            return Ok(Allocation {
                addr: align as u64,
                raw_addr: 0,
                bytes: 0,
                align,
            });
        }
        let extra = align.saturating_sub(guaranteed);
        let Some(total) = bytes.checked_add(extra) else {
            return Err(Error::invalid(format!(
                "{bytes} bytes plus {extra} bytes of alignment slack overflow usize"
            )));
        };
        bind(&self.stream)?;
        let raw = raw_alloc(total).inspect_err(|_| self.counters.failed())?;
        self.counters.allocated(bytes);
        Ok(Allocation {
            // `raw + extra` is inside the allocation, so rounding up cannot overflow.
            addr: align_up_u64(raw, align as u64).unwrap_or(raw),
            raw_addr: raw,
            bytes,
            align,
        })
    }

    /// A free around `raw_free`: skip a zero-sized allocation, bind the context, optionally
    /// wait for the stream (work queued on it may still use the memory), free the address the
    /// driver returned, and count the free once it is done.
    pub(super) fn free(
        &self,
        allocation: &Allocation,
        wait_for_stream: bool,
        raw_free: impl FnOnce(u64) -> Result<(), Error>,
    ) -> Result<(), Error> {
        if allocation.bytes == 0 {
            self.counters.freed(0);
            return Ok(());
        }
        bind(&self.stream)?;
        if wait_for_stream {
            super::driver::synchronize_stream(&self.stream)?;
        }
        raw_free(allocation.raw_addr)?;
        // Counted once it is freed: a free that failed leaves the memory with the driver, and
        // the statistics say so (one allocation still live, its bytes still in use).
        self.counters.freed(allocation.bytes);
        Ok(())
    }

    /// The base of device views of `allocation`, ordered on this backend's stream.
    pub(super) fn device_base<'a>(&'a self, allocation: &Allocation) -> CudaBase<'a> {
        // SAFETY: the address is where the allocation starts; the caller of the backend's
        // `base_*` keeps it live and borrowed as the view kind requires.
        unsafe { CudaBase::new(allocation.addr, &self.stream) }
    }
}

impl CudaCore {
    /// Waits for everything queued on the stream.
    pub(super) fn synchronize(&self) -> Result<(), Error> {
        super::driver::synchronize_stream(&self.stream)
    }
}
