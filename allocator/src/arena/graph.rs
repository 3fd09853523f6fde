//! Arena graphs: work on an arena's stream captured once into a CUDA graph
//! ([`Arena::capture`]) and replayed with one launch per frame ([`ArenaGraph`]); the full story
//! is on [`ArenaGraph`].

use alloc::sync::Arc;
use core::marker::PhantomData;

use super::{Arena, Disjoint, Stage};
use crate::backend::DirectViews;
use crate::backend::cuda::{
    CudaMut, CudaStream, GraphExec, ManagedBackend, PrivateStream, StreamCapture, StreamOrdered,
};
use crate::error::Error;
use crate::layout::{DeviceLayout, HostMut};

impl<L: DeviceLayout, B: DirectViews<Mut = CudaMut> + StreamOrdered> Arena<L, B> {
    /// Captures the work `record` queues on the arena's stream into a CUDA graph that borrows
    /// the arena exclusively, and returns it ready to replay (instantiated and uploaded to the
    /// device).
    ///
    /// `record` gets a [`Capture`], whose views are the arena's device views: kernels launched
    /// and copies or memsets queued with them on the arena's stream (`view.stream()`) are
    /// recorded, in order, and nothing runs yet. Its error discards the capture and comes back
    /// unchanged; a call the driver cannot record, or a capture the driver invalidated, is an
    /// [`Error::Driver`] naming the CUDA error (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`,
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`). The stream is out of capture mode whenever
    /// this returns, and also when `record` panics. An arena on the legacy default stream
    /// cannot capture this way (`default_stream`): use a stream of its own (`cuda_stream`), or
    /// [`capture_on_own_stream`](Self::capture_on_own_stream).
    ///
    /// See [`ArenaGraph`] for what the borrow guarantees and why the input is
    /// uploaded between replays.
    ///
    /// # Safety
    ///
    /// A graph replays the addresses its work was recorded with, and nothing ties the memory
    /// behind them to the graph but the arena, which the graph borrows. So every byte the work
    /// `record` queues reaches outside the arena's allocation (a cudarc buffer, another arena,
    /// a pool slice, a host buffer of a captured copy, an address passed to a kernel) must stay
    /// allocated at its address until the graph is dropped and its last replay has finished,
    /// and be touched by nothing else while a replay may run (other than by work ordered with
    /// the replays on the arena's stream); so must the modules whose kernels it launches stay
    /// loaded. Work on the arena's own views alone (those
    /// [`Capture`] hands out) meets this with nothing more to check: the graph borrows the
    /// arena exclusively for its whole life. The same holds for work any other thread queues
    /// on the arena's stream while `record` runs, which the capture records as well (whichever
    /// thread queues it): capture while no other thread uses the stream, or check what the
    /// graph holds ([`ArenaGraph::nodes`]) before its first launch. (A safe `capture` could not
    /// be sound: the stream is the caller's, and safe cudarc calls on it during the capture
    /// record whatever they reach.)
    ///
    /// ```no_run
    /// use devarena::backend::cuda::{CudaBackend, cuda_stream, driver_error};
    /// use devarena::{Arena, DeviceLayout};
    ///
    /// #[derive(DeviceLayout)]
    /// struct Frame {
    ///     input: [f32; 1024],
    ///     output: [f32; 1024],
    /// }
    ///
    /// let stream = cuda_stream(0)?;
    /// let mut arena = Arena::<Frame, _>::new_in(CudaBackend::new(stream.clone()))?;
    /// // SAFETY: the recorded work reaches the arena's views alone.
    /// let mut graph = unsafe {
    ///     arena.capture(|capture| {
    ///         let mut v = capture.views_mut();
    ///         // Recorded, not run: a copy here, kernels (`launch_builder(..).arg(&v.input)`)
    ///         // alike.
    ///         v.output.fill_bytes(0)?;
    ///         stream
    ///             .memcpy_dtod(&v.input, &mut v.output)
    ///             .map_err(|e| driver_error("cuMemcpyDtoDAsync", e))
    ///     })?
    /// };
    /// let mut out = [0.0f32; 1024];
    /// for frame in 0..3 {
    ///     graph.views_mut().input.upload(&[frame as f32; 1024])?; // between replays
    ///     graph.launch()?; // one call per frame
    ///     graph.arena().views().output.download(&mut out)?;
    ///     assert_eq!(out[0], frame as f32);
    /// }
    /// drop(graph); // the arena is free again
    /// arena.views_mut().input.fill_bytes(0)?;
    /// # Ok::<(), devarena::Error>(())
    /// ```
    pub unsafe fn capture<F>(&mut self, record: F) -> Result<ArenaGraph<'_, L, B>, Error>
    where
        F: FnOnce(&mut Capture<'_, L, B>) -> Result<(), Error>,
    {
        let stream = self.backend.stream().clone();
        // The views must queue their work where the capture records: on the backend's stream.
        // SAFETY: `self` is borrowed exclusively and the base only read for its stream; no view
        // is made from it.
        let base = unsafe { self.backend.base_mut(&self.allocation) };
        if !crate::backend::cuda::event::same_stream(base.stream(), &stream) {
            return Err(Error::invalid(alloc::format!(
                "arena of `{}`: its backend's views are not ordered on the backend's stream, \
                 so a capture on that stream would not record them",
                L::NAME
            )));
        }
        let exec = self.record_on(stream, false, None, record)?;
        Ok(ArenaGraph { arena: self, exec })
    }

    /// Captures `record`'s work on `stream` (`own`: a stream made for the capture, see
    /// [`Capture::views_mut`]) into a graph uploaded to and replayed on `replay` (the
    /// capturing stream where `None`).
    fn record_on<F>(
        &mut self,
        stream: Arc<CudaStream>,
        own: bool,
        replay: Option<Arc<CudaStream>>,
        record: F,
    ) -> Result<GraphExec, Error>
    where
        F: FnOnce(&mut Capture<'_, L, B>) -> Result<(), Error>,
    {
        // Declared before the capture handle, so that during a panic in `record` it is dropped
        // after it and ends the capture.
        let session = StreamCapture::begin(&stream)?;
        let mut capture = Capture {
            arena: &mut *self,
            stream,
            own,
            _thread: PhantomData,
        };
        let recorded = record(&mut capture);
        drop(capture);
        session.finish_for(recorded, replay)
    }

    /// [`capture`](Self::capture) on a stream made for this capture alone, in the arena's
    /// context, instead of the arena's stream: a capture records whatever any thread queues on
    /// the stream it captures, and no other thread holds this one. Work other threads queue on
    /// the arena's stream meanwhile runs as usual and stays out of the graph, and cannot race
    /// the capture's end. `record`'s [`Capture`] hands out views on the capture's stream
    /// ([`Capture::stream`]); [`Capture::views_mut_on`] for the arena's own stream records on
    /// the capture's stream too, so that the arena's stream does not join the capture. Nothing
    /// is queued on the arena's stream before the capture ends; the graph is then uploaded to
    /// it (unless it is being captured by someone else by then: the first replay then pays for
    /// the upload) and replays on it, as for [`capture`](Self::capture). An arena on the
    /// legacy default stream, or on a stream borrowed from another library, captures this way
    /// too.
    ///
    /// Queue the work on the capture's stream: through the views [`Capture`] hands out (their
    /// `stream()`) or on [`Capture::stream`]. Work queued on the arena's own stream is not
    /// recorded, and a view's device pointer taken for the arena's stream (cudarc's
    /// `device_ptr` with that stream) orders the capture's stream with it, which the driver
    /// refuses (the capture is then invalidated and the call fails with the CUDA error).
    ///
    /// The capture's stream is a non-blocking one made with the driver (`cuStreamCreate`, an
    /// error of that name where it fails), not through cudarc, which would synchronize the
    /// whole device to make the first stream it counts in a context. It is destroyed on
    /// return; where a clone of its `Arc` outlives the call, it is leaked instead (never
    /// destroyed, so the clone stays usable).
    ///
    /// # Safety
    ///
    /// As for [`capture`](Self::capture), for the work `record` queues. Work that other
    /// threads queue on the arena's stream cannot reach the graph; work that anyone queues on
    /// another stream that `record` joins to the capture ([`Capture::views_mut_on`] with a
    /// stream other than the arena's) while it is joined is recorded, as with
    /// [`capture`](Self::capture).
    pub unsafe fn capture_on_own_stream<F>(
        &mut self,
        record: F,
    ) -> Result<ArenaGraph<'_, L, B>, Error>
    where
        F: FnOnce(&mut Capture<'_, L, B>) -> Result<(), Error>,
    {
        let arena_stream = self.backend.stream().clone();
        // Declared first: dropped last, after the capture is ended and every handle to the
        // stream that this call made is gone.
        let own = PrivateStream::new(&arena_stream)?;
        // Uploaded to and replayed on the arena's stream, ordered with every view of the
        // arena. (The capture is ended, also during a panic in `record`, before `own` goes.)
        let exec = self.record_on(own.stream().clone(), true, Some(arena_stream), record)?;
        drop(own);
        Ok(ArenaGraph { arena: self, exec })
    }
}

/// The arena during [`Arena::capture`]: its device views, on the capturing stream. Work queued
/// with them is recorded into the graph, not run.
///
/// Not `Send`: the capture is thread-local and ends on the thread that began it.
pub struct Capture<'c, L: DeviceLayout, B: DirectViews<Mut = CudaMut> + StreamOrdered> {
    arena: &'c mut Arena<L, B>,
    /// The stream the capture records: the arena's, or one made for the capture alone
    /// ([`Arena::capture_on_own_stream`], `own`).
    stream: Arc<CudaStream>,
    own: bool,
    _thread: PhantomData<*const ()>,
}

impl<L: DeviceLayout, B: DirectViews<Mut = CudaMut> + StreamOrdered> Capture<'_, L, B> {
    /// Device views of every field, on the capturing stream ([`stream`](Self::stream)).
    pub fn views_mut(&mut self) -> L::Views<'_, CudaMut>
    where
        L: Disjoint,
    {
        if !self.own {
            return self.arena.views_mut();
        }
        // SAFETY: the arena's allocation (device memory of the arena's context, in which the
        // capture's stream was made), live and exclusively borrowed through `&mut self` for
        // the views' life; `L: Disjoint` means no two fields share bytes. Their work on the
        // capture's stream is recorded, not run.
        unsafe {
            L::views::<CudaMut>(crate::backend::cuda::CudaBase::new(
                self.arena.allocation.addr,
                &self.stream,
            ))
        }
    }

    /// Device views of the fields live in stage `S`. Visit the stages in order: each one's work
    /// is recorded after the work of the stages visited before it (see [`ArenaGraph`]).
    pub fn stage_mut<const S: usize>(&mut self) -> <L as Stage<S>>::StageViews<'_, CudaMut>
    where
        L: Stage<S>,
    {
        if !self.own {
            return self.arena.stage_mut::<S>();
        }
        // SAFETY: as in `views_mut`; the fields of one stage are disjoint (`Stage`'s
        // contract).
        unsafe {
            L::stage_views::<CudaMut>(crate::backend::cuda::CudaBase::new(
                self.arena.allocation.addr,
                &self.stream,
            ))
        }
    }

    /// Runs `f` with device views of every field for work on `stream`, which joins the
    /// capture: before `f`, `stream` waits for the work recorded so far on the capturing
    /// stream ([`stream`](Self::stream)), which pulls it into the capture; `f`'s work on it is
    /// recorded; once `f` has returned (or panicked) the capturing stream waits for it, which
    /// joins it back. Results and errors as [`Arena::views_mut_on`]. In a capture on a stream
    /// of its own ([`Arena::capture_on_own_stream`]), the arena's stream is not joined: `f`
    /// gets views on the capturing stream, as [`views_mut`](Self::views_mut) gives.
    pub fn views_mut_on<R>(
        &mut self,
        stream: &Arc<CudaStream>,
        f: impl FnOnce(L::Views<'_, CudaMut>) -> Result<R, Error>,
    ) -> Result<R, Error>
    where
        L: Disjoint,
    {
        if self.own_records(stream) {
            return f(self.views_mut());
        }
        self.arena.views_mut_after(&self.stream, stream, f)
    }

    /// [`stage_mut`](Self::stage_mut) for work on another stream, run in `f` and joined to the
    /// capture as in [`views_mut_on`](Self::views_mut_on).
    pub fn stage_mut_on<const S: usize, R>(
        &mut self,
        stream: &Arc<CudaStream>,
        f: impl FnOnce(<L as Stage<S>>::StageViews<'_, CudaMut>) -> Result<R, Error>,
    ) -> Result<R, Error>
    where
        L: Stage<S>,
    {
        if self.own_records(stream) {
            return f(self.stage_mut::<S>());
        }
        self.arena.stage_mut_after::<S, R>(&self.stream, stream, f)
    }

    /// In a capture on a stream of its own, whether `stream` is the arena's: work for it is
    /// recorded on the capturing stream, so that the arena's stream, which other threads may
    /// use, never joins the capture.
    fn own_records(&self, stream: &CudaStream) -> bool {
        let arena = self.arena.backend.stream();
        // The legacy default stream has two handles: 0 and `CU_STREAM_LEGACY` (1).
        let handle = |s: &CudaStream| match s.cu_stream() as usize {
            1 => 0,
            h => h,
        };
        self.own && stream.context() == arena.context() && handle(stream) == handle(arena)
    }

    /// The capturing stream: the arena's, or the one made for the capture alone
    /// ([`Arena::capture_on_own_stream`]).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<L: DeviceLayout, B: DirectViews<Mut = CudaMut> + StreamOrdered> core::fmt::Debug
    for Capture<'_, L, B>
{
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Capture")
            .field("layout", &L::NAME)
            .field("addr", &format_args!("{:#x}", self.arena.addr()))
            .finish()
    }
}

/// A CUDA graph of an arena: the work of a frame, queued on the arena's stream, captured once
/// ([`Arena::capture`]) and replayed with one launch per frame ([`launch`](Self::launch)).
///
/// An arena is what a graph needs: every buffer at a fixed address for the arena's whole life,
/// nothing allocated or freed while a frame runs. The graph records those addresses, so it
/// borrows the arena **exclusively** for as long as it lives ([`ArenaGraph<'a, L, B>`] holds
/// the `&'a mut Arena`):
///
/// * the arena cannot be dropped, freed, moved or swapped for another while a graph that reads
///   and writes it exists — its addresses stay valid for every replay;
/// * no view of the arena exists outside the graph: every access between replays goes through
///   the graph ([`ArenaGraph::views_mut`], [`ArenaGraph::stage_mut`], [`ArenaGraph::arena`]),
///   and [`launch`](ArenaGraph::launch) takes `&mut self`, so no view survives into a replay's
///   submission. A shared borrow would not do: a managed arena's host views come from `&self`
///   (after waiting for the stream), and a replay launched while they live would write under
///   the host's reads;
/// * every replay runs on the arena's stream, the stream every view of the arena orders its
///   work on and every host access waits for (managed host views synchronize it first), so
///   host access and replays never overlap.
///
/// **The input is updated between replays, not inside the graph.** Upload it through the
/// graph's views (`graph.views_mut().input.upload(&frame)?`, or in stage 0 of a layout with
/// stages); the upload is ordered on the arena's stream after the previous replay and before
/// the next, and each replay reads whatever the input field holds when it runs. A captured
/// host-to-device copy would instead bake a host address into the graph: the host buffer would
/// have to outlive the graph, be pinned (a copy from pageable memory is staged when it is
/// queued, which a replay cannot repeat) and never be written while a replay might read it. Uploading outside keeps the graph
/// a function of the arena's bytes alone. A device-to-device copy from a resident buffer may be
/// captured (the benchmark does), when that buffer outlives the graph.
///
/// # Capture
///
/// [`Arena::capture`] begins a capture on the arena's stream, hands a [`Capture`] to the code
/// that records the frame, and ends the capture when that code returns. The views a [`Capture`]
/// hands out are the arena's device views on the arena's stream: kernels launched and copies
/// queued with them are recorded, in the order they are queued. The capture is thread-local
/// (`CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`: global mode would also refuse allocations on every
/// other thread of the process while a capture is open, relaxed mode would let a `cuMemAlloc`
/// through unseen): on the capturing thread, a call the driver cannot record — a synchronous copy (a
/// view's `upload`/`download`, which wait), a `cuMemAlloc` (a new arena), a stream
/// synchronize — fails with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidates the
/// capture. Whatever ends a capture — an `Err` from the recording code, an invalidated capture,
/// a panic — the capture is ended and discarded and the stream is usable again; the error comes
/// back as [`Error::Driver`] with the CUDA error name.
///
/// [`Arena::capture_on_own_stream`] does the same on a stream made for the capture alone, so
/// that work other threads queue on the arena's stream meanwhile runs instead of being
/// recorded; its graph replays on the arena's stream all the same.
///
/// **Layouts with stages** capture stage by stage: [`Capture::stage_mut`] borrows the capture
/// mutably, so one stage's views are gone before the next stage's are taken, and all of them
/// queue their work on the one stream. The captured graph is then a chain in the order the
/// stages were visited: a later stage's kernels run after an earlier stage's have finished,
/// and bytes shared between stages are never live twice — as in eager execution.
///
/// **Another stream** joins the capture through [`Capture::views_mut_on`] (and
/// [`Capture::stage_mut_on`]), which run a closure with views for that stream: the other
/// stream waits for the capturing stream, which pulls it into the capture; the closure's work
/// on it is recorded; when the closure returns (or panics) the capturing stream waits for it,
/// which joins it back. Replays keep that order.
///
/// **Memory other than the arena's.** The graph replays whatever the recording code queued,
/// also work on buffers that are not the arena's (a cudarc `CudaSlice`, another arena, a raw
/// address passed to a kernel). devarena only knows the arena: such buffers must outlive the
/// graph and its replays, which is why [`Arena::capture`] is `unsafe` (its `# Safety` says
/// exactly what to keep). (cudarc's own event tracking refuses some of them: waiting in a
/// capture on an event recorded outside it invalidates the capture.) The same holds for a
/// capture begun around the arena's work with cudarc's own `CudaStream::begin_capture`: its
/// graph does not borrow the arena, and replaying it after the arena is gone writes freed
/// memory. Capture an arena's work with [`Arena::capture`].
///
/// ```compile_fail,E0505
/// # use devarena::backend::cuda::{CudaBackend, cuda_stream};
/// # use devarena::{Arena, DeviceLayout};
/// # #[derive(DeviceLayout)]
/// # struct Frame { input: [f32; 1024] }
/// let stream = cuda_stream(0)?;
/// let mut arena = Arena::<Frame, _>::new_in(CudaBackend::new(stream))?;
/// // SAFETY: the recorded work reaches the arena's views alone.
/// let mut graph = unsafe { arena.capture(|c| c.views_mut().input.fill_bytes(0))? };
/// drop(arena); // error: `arena` is borrowed by `graph`
/// graph.launch()?;
/// # Ok::<(), devarena::Error>(())
/// ```
pub struct ArenaGraph<'a, L: DeviceLayout, B: DirectViews<Mut = CudaMut> + StreamOrdered> {
    arena: &'a mut Arena<L, B>,
    exec: GraphExec,
}

impl<L: DeviceLayout, B: DirectViews<Mut = CudaMut> + StreamOrdered> ArenaGraph<'_, L, B> {
    /// Queues one replay of the captured work on the arena's stream (`cuGraphLaunch`): after
    /// everything queued on the stream before (the input's upload), before everything queued
    /// after (reading the outputs). Returns once it is queued.
    pub fn launch(&mut self) -> Result<(), Error> {
        // SAFETY: the captured work reaches the arena's allocation, which `self` borrows
        // exclusively: it stays allocated for the graph's life, and no view of it outlives the
        // `&mut self` of this call. The replay is ordered on the arena's stream, on which every
        // view of the arena orders its work and for which every host access waits. Memory
        // other than the arena's that the captured work reaches is kept allocated and
        // untouched for every replay by the caller of `Arena::capture` (its safety contract).
        unsafe { self.exec.launch() }
    }

    /// Device views of every field between replays: upload the next input, read outputs. Their
    /// work is ordered on the arena's stream with the replays.
    pub fn views_mut(&mut self) -> L::Views<'_, CudaMut>
    where
        L: Disjoint,
    {
        self.arena.views_mut()
    }

    /// Device views of the fields live in stage `S`, between replays (for a layout with stages:
    /// upload the input in the stage that writes it, read each output in its last stage).
    pub fn stage_mut<const S: usize>(&mut self) -> <L as Stage<S>>::StageViews<'_, CudaMut>
    where
        L: Stage<S>,
    {
        self.arena.stage_mut::<S>()
    }

    /// Runs `f` with device views of every field for work on `stream` between replays (an
    /// upload of the next input on a copy stream, say), ordered as [`Arena::views_mut_on`]:
    /// `stream` first waits for the replays queued so far, and the arena's stream waits for
    /// `stream` before this returns, so the next replay runs after `f`'s work.
    pub fn views_mut_on<R>(
        &mut self,
        stream: &Arc<CudaStream>,
        f: impl FnOnce(L::Views<'_, CudaMut>) -> Result<R, Error>,
    ) -> Result<R, Error>
    where
        L: Disjoint,
    {
        self.arena.views_mut_on(stream, f)
    }

    /// [`stage_mut`](Self::stage_mut) for work on another stream between replays, ordered as
    /// [`views_mut_on`](Self::views_mut_on).
    pub fn stage_mut_on<const S: usize, R>(
        &mut self,
        stream: &Arc<CudaStream>,
        f: impl FnOnce(<L as Stage<S>>::StageViews<'_, CudaMut>) -> Result<R, Error>,
    ) -> Result<R, Error>
    where
        L: Stage<S>,
    {
        self.arena.stage_mut_on::<S, R>(stream, f)
    }

    /// The arena, shared: its shared views (`views()`, `stage::<S>()`), addresses and backend.
    /// No replay can be launched while the borrow lasts.
    pub fn arena(&self) -> &Arena<L, B> {
        self.arena
    }

    /// The stream the graph replays on: the arena's.
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.arena.backend().stream()
    }

    /// Waits for every replay queued so far (and everything else queued on the arena's stream).
    pub fn synchronize(&self) -> Result<(), Error> {
        crate::backend::cuda::synchronize_stream(self.stream())
    }

    /// The number of nodes the capture recorded (kernels, copies, memsets, ...).
    pub fn nodes(&self) -> usize {
        self.exec.nodes()
    }
}

impl<L: Disjoint> ArenaGraph<'_, L, ManagedBackend> {
    /// Host views of every field of a managed arena, between replays: waits for the arena's
    /// stream first, so no replay still runs while the host touches the memory.
    pub fn host_views_mut(&mut self) -> Result<L::Views<'_, HostMut>, Error> {
        self.arena.host_views_mut()
    }
}

impl<L: DeviceLayout, B: DirectViews<Mut = CudaMut> + StreamOrdered> core::fmt::Debug
    for ArenaGraph<'_, L, B>
{
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ArenaGraph")
            .field("layout", &L::NAME)
            .field("addr", &format_args!("{:#x}", self.arena.addr()))
            .field("nodes", &self.exec.nodes())
            .finish()
    }
}
