//! CUDA graphs that take temporaries from a pool: [`Pool::capture`] records work on a stream
//! into a graph whose blocks the pool keeps for it ([`PoolGraph`]); the rules are in the
//! [`graph`](super::graph) module.

use alloc::format;
use alloc::sync::Arc;
use core::marker::PhantomData;

use super::{GraphReservation, GraphStats, Pool, PoolSlice};
use crate::backend::cuda::{CudaStream, GraphExec, StreamCapture};
use crate::error::Error;
use crate::layout::Element;

impl Pool {
    /// Captures the work `record` queues on `stream` into a CUDA graph whose temporaries come
    /// from this pool, and returns it ready to replay (instantiated and uploaded).
    ///
    /// `record` gets a [`PoolCapture`]: blocks it allocates
    /// ([`alloc_slice`](PoolCapture::alloc_slice), [`allocate`](PoolCapture::allocate)) are
    /// the graph's. They are made for `stream` without recording anything on it, and a block
    /// of the graph freed while the graph lives (a temporary dropped inside `record`, or any
    /// time later) is held for it: no one gets its bytes until the graph is dropped and its
    /// replays are done. The graph also keeps the pool's region alive. See the
    /// [`graph`](super::graph) module for the full story.
    ///
    /// The capture is the arena graphs' (thread-local mode, `Arena::capture`): kernels
    /// launched and copies queued on `stream` are recorded, in order; a call the driver cannot
    /// record (a synchronous copy, `cuMemAlloc`) fails the capture with the CUDA error's name;
    /// whatever ends the capture — an `Err` from `record`, a refused call, a panic — the stream
    /// is out of capture mode and the blocks of the failed graph go back to the pool. The pool
    /// must have a CUDA stream runtime ([`Pool::cuda`], `PoolBuilder::build_cuda`); `stream`
    /// is registered with it (it may be the pool's home stream or another of its device).
    ///
    /// # Safety
    ///
    /// A graph replays the addresses its work was recorded with. Every byte the work `record`
    /// queues reaches that is not one of the graph's own blocks (those allocated through the
    /// [`PoolCapture`]) — blocks of this pool allocated before the capture, arenas, cudarc
    /// buffers, a host buffer of a captured copy, an address passed to a kernel — must stay
    /// allocated at its address until the graph is dropped and its last replay has finished,
    /// and be touched by nothing else while a replay may run (other than by work ordered with
    /// the replays on `stream`); so must the modules whose kernels it launches stay loaded.
    /// The graph's own blocks stay allocated without the caller's care: the pool holds them
    /// for the graph. But the replays write them, so one that `record` hands out (a slice
    /// returned from it) must likewise be touched by nothing else while a replay may run,
    /// other than by work ordered with the replays on `stream`. (A safe `capture` could not be sound: `stream` is the caller's, and safe
    /// cudarc calls on it during the capture record whatever they reach.)
    ///
    /// ```no_run
    /// use devarena::backend::cuda::{cuda_stream, driver_error};
    /// use devarena::Pool;
    ///
    /// let stream = cuda_stream(0)?;
    /// let pool = Pool::cuda(stream.clone(), 256 << 20)?;
    /// let mut output = pool.alloc_slice::<f32>(1024)?; // lives outside the graph
    /// // SAFETY: besides the graph's own temporary, the work reaches `output`, which is freed
    /// // only after the graph is dropped and its replays are done (`to_vec` waits for them).
    /// let graph = unsafe {
    ///     pool.capture(&stream, |c| {
    ///         let mut temp = c.alloc_slice::<f32>(1024)?; // the graph's own
    ///         temp.device_view_mut(c.stream())?.fill_bytes(0)?; // recorded, not run
    ///         let temp = temp.device_view(c.stream())?;
    ///         stream
    ///             .memcpy_dtod(&temp, &mut output.device_view_mut(&stream)?)
    ///             .map_err(|e| driver_error("cuMemcpyDtoDAsync", e))
    ///         // `temp` is dropped here: held for the graph, never handed out while it lives
    ///     })?
    /// };
    /// for _ in 0..3 {
    ///     graph.launch()?;
    /// }
    /// assert_eq!(output.device_view(&stream)?.to_vec()?, vec![0.0; 1024]);
    /// drop(graph); // the temporary goes back once the replays are done
    /// drop(output); // after the graph
    /// # Ok::<(), devarena::Error>(())
    /// ```
    pub unsafe fn capture<F>(&self, stream: &Arc<CudaStream>, record: F) -> Result<PoolGraph, Error>
    where
        F: FnOnce(&mut PoolCapture<'_>) -> Result<(), Error>,
    {
        let Some(streams) = self.cuda_streams() else {
            return Err(Error::invalid(format!(
                "pool `{}` has no CUDA stream runtime: a graph's blocks need one (make the pool \
                 with `Pool::cuda` or `PoolBuilder::build_cuda`)",
                self.name()
            )));
        };
        let id = streams.register(stream)?;
        // Declared before the capture, so that it is released after the capture has ended,
        // also when `record` panics: its release event goes on a stream that is no longer
        // capturing.
        let reservation = self.graph_reservation(id)?;
        let session = StreamCapture::begin(stream)?;
        let mut capture = PoolCapture {
            reservation: &reservation,
            stream,
            _thread: PhantomData,
        };
        let recorded = record(&mut capture);
        let exec = session.finish(recorded)?;
        reservation.capture_over();
        Ok(PoolGraph { exec, reservation })
    }
}

/// The pool during [`Pool::capture`]: allocations for the graph, on the capturing stream.
///
/// Not `Send`: the capture is thread-local and ends on the thread that began it.
pub struct PoolCapture<'c> {
    reservation: &'c GraphReservation,
    stream: &'c Arc<CudaStream>,
    _thread: PhantomData<*const ()>,
}

impl PoolCapture<'_> {
    /// A typed slice of `len` elements for the graph, for the capturing stream (its device
    /// views are ordered there): the graph's block, held for it once dropped.
    pub fn alloc_slice<T: Element>(&self, len: usize) -> Result<PoolSlice<T>, Error> {
        self.reservation.alloc_slice(len)
    }

    /// `size` bytes at `align` (0 = 256) for the graph, for the capturing stream; the address.
    /// Freed like any allocation of the pool (`Pool::deallocate_on(addr, stream)`), which holds
    /// it for the graph while the graph lives.
    pub fn allocate(&self, size: usize, align: usize) -> Result<u64, Error> {
        self.reservation.allocate(size, align)
    }

    /// The capturing stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }

    /// The graph's reservation (its statistics, its stream id).
    pub fn reservation(&self) -> &GraphReservation {
        self.reservation
    }
}

impl core::fmt::Debug for PoolCapture<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PoolCapture")
            .field("stream", &self.stream.cu_stream())
            .field("reservation", self.reservation)
            .finish()
    }
}

/// A CUDA graph captured by [`Pool::capture`], replayed on its stream with one launch
/// ([`launch`](Self::launch)); the pool keeps the graph's blocks for as long as it lives.
///
/// Dropping it destroys the executable graph, then releases its reservation: an event recorded
/// on its stream after the last replay, which every held block waits for before the pool hands
/// it out again (see the [`graph`](super::graph) module).
///
/// Neither `Send` nor `Sync` (the driver does not synchronize graph objects between threads).
pub struct PoolGraph {
    // Dropped first: the executable graph goes before its blocks are released.
    exec: GraphExec,
    reservation: GraphReservation,
}

impl PoolGraph {
    /// Queues one replay on the graph's stream (`cuGraphLaunch`): after everything queued on
    /// the stream before, before everything queued after. Refused on a stream that is
    /// capturing (it would be recorded instead of run).
    pub fn launch(&self) -> Result<(), Error> {
        // SAFETY: the graph's own blocks stay reserved for as long as `self` lives and are
        // handed out again only after an event recorded on this stream after the last replay
        // has completed; the pool's region lives as long as the reservation. Other memory the
        // captured work reaches is kept allocated and untouched for every replay by the caller
        // of `Pool::capture` (its safety contract).
        unsafe { self.exec.launch() }
    }

    /// The stream the graph replays on (the one it was captured on).
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.exec.stream()
    }

    /// Waits for every replay queued so far (and everything else queued on the stream).
    pub fn synchronize(&self) -> Result<(), Error> {
        crate::backend::cuda::synchronize_stream(self.stream())
    }

    /// The number of nodes the capture recorded.
    pub fn nodes(&self) -> usize {
        self.exec.nodes()
    }

    /// The graph's reservation.
    pub fn reservation(&self) -> &GraphReservation {
        &self.reservation
    }

    /// What the graph's reservation holds.
    pub fn stats(&self) -> GraphStats {
        self.reservation.stats()
    }
}

impl core::fmt::Debug for PoolGraph {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PoolGraph")
            .field("nodes", &self.exec.nodes())
            .field("stream", &self.stream().cu_stream())
            .field("reservation", &self.reservation)
            .finish()
    }
}
