//! The engine's side of graph reservations (`pool/graph.rs` has the bookkeeping and the public
//! handle): allocations for a capturing stream, frees of a graph's blocks, releases. Kept in a
//! room of its own; the engine calls in from two places only: `deallocate_general` (a block a
//! graph owns) and `deallocate_fast` (which leaves the pool's blocks to the general path while
//! any graph owns one).

use alloc::boxed::Box;
use alloc::format;

use super::super::graph::{GraphEvent, GraphStats, Held, Owner};
use super::{Ask, Live, LiveInfo, LockGuard, Shared, State, TRIM_TRIES};
use crate::error::Error;
use crate::pool::lock::logged;
use crate::pool::stream::{StreamEvent, StreamId};
use crate::pool::{AllocRequest, Tracking, effective_align};

impl Shared {
    /// Opens a graph reservation on `stream` (a stream the runtime must accept); its key.
    pub(in crate::pool) fn open_graph(&self, stream: StreamId) -> Result<u64, Error> {
        if let Some(streams) = &self.streams {
            if stream != self.home {
                // A reservation may be released on another thread, its release event recorded
                // on the stream its handle names there: another stream, for a per-thread
                // handle, which the graph's replays do not precede.
                if self.per_thread_stream(stream)? {
                    return Err(Error::invalid(format!(
                        "pool `{}`: stream {stream} names a different stream on each thread \
                         (CUDA's per-thread default stream); a graph reservation, which may be \
                         released on another thread, would record its release event there, \
                         out of the order of the graph's replays: capture on a stream of your \
                         own",
                        self.name
                    )));
                }
                // (Without the lock: a call back into the pool from it waits for the lock as
                // any call does, whether or not another thread holds it.)
                self.runtime_call("validate", || streams.validate(stream))?;
                // The calling thread's heap for the stream, which would serve the stream's
                // plain requests during the capture without asking whether it captures (a
                // free there handed out again at once, though the graph may replay work that
                // used the block), goes back first: during the capture those requests take the
                // pool's index, which refuses a free on the capturing stream, and the thread
                // gets a new heap for the stream at a request after the capture.
                self.give_back_thread_heap(stream);
            }
        }
        let mut state = self.lock()?;
        let key = state.graphs.open(stream);
        if self.streams.is_some() && stream != self.home {
            // Other threads' heaps for the stream would serve it the same way: they give
            // their spans back (their live blocks reach the pool's index, at their addresses)
            // and take none while a reservation on the stream is open
            // (`heap_allocate_locked`), so the stream's requests on every thread take the
            // pool's index meanwhile.
            self.dissolve_stream_heaps(&mut state, stream);
        }
        Ok(key)
    }

    /// An allocation for a stream that may be capturing a graph: no event is recorded on it and
    /// it waits for nothing; instead the host waits for the home stream's frees first (see
    /// `pool/graph.rs`). With `graph`, the block is that graph's.
    pub(in crate::pool) fn allocate_for_graph(
        &self,
        client: u32,
        req: AllocRequest<'_>,
        owned: bool,
        graph: Option<u64>,
    ) -> Result<u64, Error> {
        let result = self.allocate_for_graph_once(client, req, owned, graph);
        if result.is_ok() {
            return result;
        }
        self.retry_after_trim(result, || {
            self.allocate_for_graph_once(client, req, owned, graph)
        })
    }

    fn allocate_for_graph_once(
        &self,
        client: u32,
        req: AllocRequest<'_>,
        owned: bool,
        graph: Option<u64>,
    ) -> Result<u64, Error> {
        let stream = req.stream.unwrap_or(self.home);
        let info = match self.tracking() {
            Tracking::Off => None,
            _ => Some(self.record_info(req.tag)),
        };
        let mut state = match self.lock_drained(stream) {
            Ok(state) => state,
            Err(error) => {
                let mut state = self.lock()?;
                let ask = Ask {
                    client,
                    size: req.size,
                    align: effective_align(req.align).unwrap_or(req.align),
                    stream,
                };
                let error = self.allocation_failed(&mut state, &ask, req.tag, error);
                return self.unlock_and_deliver(state, Err(error));
            }
        };
        if let Some(key) = graph {
            if !state.graphs.is_open(key) {
                return Err(Error::invalid(format!(
                    "pool `{}`: the graph reservation was released",
                    self.name
                )));
            }
            // A graph allocation while the stream captures: the capture has begun (thread
            // heaps stay off the stream until it is seen to end, see `Graphs::heaps_barred`).
            if stream != self.home && self.capturing(stream) == Some(true) {
                state.graphs.saw_capture(key);
            }
        }
        // The host has waited for the home stream past every free on it: `stream` is ordered
        // after them as if it had waited itself, so the general path makes it wait for nothing.
        if stream != self.home && self.streams.is_some() {
            let drained = state.graphs.drained;
            state.note_waited(stream, drained);
        }
        let result = self.allocate_general(&mut state, client, &req, stream, owned, info);
        if let (Ok(addr), Some(key)) = (&result, graph) {
            state.graphs.adopt(key, *addr);
        }
        self.unlock_and_deliver(state, result)
    }

    /// Where `stream` is another stream that captures a graph (it cannot wait for the home
    /// stream) and blocks freed on the home stream reached the free lists during the request:
    /// the host must wait for the home stream first, as [`lock_drained`](Self::lock_drained)
    /// does before a capture's allocation. Not here, with the lock held (work queued on the
    /// home stream may call into the pool, and would wait for the lock for ever): the request
    /// fails, uncounted, and its entry point waits once the lock is released
    /// ([`drain_home_unlocked`](Self::drain_home_unlocked)) and makes it again. The request
    /// made again fails with an error where it finds the same once more. Nothing for any
    /// other stream.
    pub(super) fn drain_home_for_capture(&self, stream: StreamId) -> Result<(), Error> {
        let Some(streams) = self.streams.as_ref().filter(|_| stream != self.home) else {
            return Ok(());
        };
        if !self
            .stream_call("is_capturing", || streams.is_capturing(stream))
            .unwrap_or(false)
        {
            return Ok(());
        }
        if super::allocate::want_drain(self.id, stream) {
            return Err(Error::invalid(format!(
                "pool `{}`: an allocation for stream {stream}, which captures a graph, waits \
                 for the home stream first",
                self.name
            )));
        }
        Err(Error::invalid(format!(
            "pool `{}`: an allocation for stream {stream}, which captures a graph (and cannot \
             wait for the home stream), needs the host to wait for the home stream past blocks \
             freed there, and more reached the pool while it waited; nothing allocated",
            self.name
        )))
    }

    /// The wait [`drain_home_for_capture`](Self::drain_home_for_capture) leaves to a request's
    /// entry point, without the lock: afterwards `stream` counts as having waited for the
    /// home stream's frees up to the wait's start (frees on the home stream made meanwhile
    /// park behind an event recorded there, see [`State::home_fences`]).
    pub(super) fn drain_home_unlocked(&self, stream: StreamId) -> Result<(), Error> {
        let (epoch, mut state) = self.wait_for_home_fenced(self.lock()?, || self.lock())?;
        state.graphs.drained = state.graphs.drained.max(epoch);
        state.note_waited(stream, epoch);
        Ok(())
    }

    /// The lock, once the host has waited for the home stream past its last free (nothing to
    /// wait for on the home stream itself or without a stream runtime). The wait happens
    /// outside the lock; a free on the home stream meanwhile parks its block behind an event
    /// recorded there, and so do the free blocks a home-stream thread heap gives back (as
    /// during a trim's wait, see [`State::home_fences`]). Blocks that reach the pool's index
    /// meanwhile without an event of their own (see [`trim_to`](Self::trim_to)) send it round
    /// again, and after [`TRIM_TRIES`] tries the allocation fails with an error.
    fn lock_drained(&self, stream: StreamId) -> Result<LockGuard<'_, State>, Error> {
        if self.streams.is_none() || stream == self.home {
            return self.lock_made();
        }
        for _ in 0..TRIM_TRIES {
            let state = self.lock_made()?;
            if state.graphs.drained >= state.home_epoch {
                return Ok(state);
            }
            let (epoch, mut state) = self.wait_for_home_fenced(state, || self.lock_made())?;
            state.graphs.drained = state.graphs.drained.max(epoch);
            if state.graphs.drained >= state.home_epoch {
                return Ok(state);
            }
        }
        // Never a wait with the lock held (work queued on the home stream may call into the
        // pool): the allocation fails instead.
        Err(Error::invalid(format!(
            "pool `{}`: an allocation for stream {stream} (a graph's, which cannot wait for the \
             home stream) needs the host to wait for the home stream past its frees, and blocks \
             freed there kept reaching the pool during {TRIM_TRIES} waits; nothing allocated",
            self.name
        )))
    }

    /// The lock, with the deferred frees made (see [`defer_free`](Self::defer_free)): a free
    /// on the home stream then counts in the epoch that [`lock_drained`](Self::lock_drained)
    /// compares with what the host waited for (made later, by the general path, it would have
    /// a capturing stream wait for the home stream, which invalidates the capture).
    fn lock_made(&self) -> Result<LockGuard<'_, State>, Error> {
        let mut state = self.lock()?;
        self.make_deferred_frees(&mut state);
        Ok(state)
    }

    /// Frees a live block that a graph owns: held for the graph while it lives, parked until
    /// its release event once it is released. Called by `deallocate_general` after the checks.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn free_graph_block(
        &self,
        state: &mut State,
        addr: u64,
        block: u32,
        live: &Live,
        stream: StreamId,
        owner: Owner,
        from_slice: bool,
    ) -> Result<Option<Box<LiveInfo>>, Error> {
        // The event of the free itself, recorded before anything changes, for a stream that is
        // neither the home stream (ordered through its free count) nor, while the reservation
        // is open, the graph's (whose work the release event covers, and which may be
        // capturing). Once it is released, work queued on the graph's stream after the release
        // event may still use the block: a free there needs its own event too.
        let (event, unrecorded) = match &self.streams {
            Some(streams)
                if stream != self.home && (stream != owner.stream || owner.released.is_some()) =>
            {
                let (event, unrecorded) = self.free_event(&**streams, stream, from_slice)?;
                (Some(event), unrecorded)
            }
            _ => (None, None),
        };
        let info = state.forget_live(addr, block, live.tracked);
        let reserved = state.tlsf.block_size(block) as usize;
        if stream == self.home && self.streams.is_some() {
            // As for any free on the home stream: other streams wait for it before reuse.
            state.home_epoch += 1;
        }
        match owner.released {
            None => {
                state.pending += reserved;
                let held = Held {
                    block,
                    bytes: reserved,
                    event,
                };
                state.graphs.hold(owner.key, held);
            }
            Some(graph) if graph.has_failed() => self.set_aside(state, owner.stream, reserved),
            Some(graph) => self.park(
                state,
                owner.stream,
                None,
                block,
                reserved,
                graph.with(event),
            ),
        }
        state.graphs.forget(addr);
        let tag = info.as_ref().and_then(|i| i.tag.as_deref());
        self.count_free(state, live, addr, reserved, stream, tag);
        unrecorded.map_or(Ok(info), Err)
    }

    /// The capture of graph `key` has ended (see `GraphReservation::capture_over`).
    pub(in crate::pool) fn graph_capture_over(&self, key: u64) {
        if let Ok(mut state) = self.lock() {
            state.graphs.capture_over(key);
        }
    }

    /// Releases a graph reservation: an event on the graph's stream (or the host's wait for
    /// it, when no event can be recorded), with which every held block is parked and every
    /// live block of the graph will be at its free. When neither works, the held blocks are
    /// set aside for good and the error comes back.
    pub(in crate::pool) fn release_graph(&self, key: u64) -> Result<(), Error> {
        let mut state = self.lock()?;
        let Some((stream, has_blocks)) = state.graphs.describe(key) else {
            return Ok(());
        };
        if !has_blocks {
            state.graphs.release(key, GraphEvent::complete());
            return Ok(());
        }
        // Where no event can be recorded on the graph's stream (a rare path: a driver error,
        // or the stream capturing again), the host waits for the stream instead, without the
        // lock (work queued there may call into the pool): the graph is released now behind
        // an event that completes when that wait has returned.
        let (event, waited, host_wait) = match &self.streams {
            None => (GraphEvent::complete(), true, None),
            Some(streams) => match self.record_event(&**streams, stream) {
                Ok(event) => (GraphEvent::after(event), false, None),
                Err(record_error) => {
                    let wait = HostWait::default();
                    let event = GraphEvent::after(Box::new(wait.clone()));
                    (event, false, Some((streams.clone(), wait, record_error)))
                }
            },
        };
        for held in state.graphs.release(key, event.clone()) {
            state.pending -= held.bytes;
            if waited && held.event.is_none() {
                state.tlsf.free(held.block);
            } else {
                let event = event.clone().with(held.event);
                self.park(&mut state, stream, None, held.block, held.bytes, event);
            }
        }
        drop(state);
        let Some((streams, wait, record_error)) = host_wait else {
            return Ok(());
        };
        let waited = self.runtime_call("synchronize", || streams.synchronize(stream));
        let error = waited.as_ref().err().map(|wait_error| {
            Error::invalid(format!(
                "pool `{}`: releasing a graph on stream {stream}: no event could be recorded \
                 there ({record_error}) and the host could not wait for it ({wait_error}); the \
                 graph's blocks are set aside for good",
                self.name
            ))
        });
        match &error {
            None => wait.done(),
            // The graph's event fails for good: its parked blocks are set aside at the next look,
            // and blocks of the graph freed from now on at once.
            Some(error) => event.fail(error.clone()),
        }
        // The held blocks come back (or, where the wait failed, are set aside) now rather than
        // at the next look at parked blocks.
        if let Ok(mut state) = self.lock() {
            self.reclaim_parked(&mut state);
        }
        error.map_or(Ok(()), Err)
    }

    /// Sets aside a block of a graph whose replays nothing can tell are done.
    fn set_aside(&self, state: &mut State, stream: StreamId, bytes: usize) {
        state.quarantined += bytes;
        logged(|| {
            log::error!(
                target: "devarena::pool",
                "pool `{}`: a block of {bytes} bytes of a graph on stream {stream} is set aside for \
                 good: nothing says the graph's replays are done with it",
                self.name
            )
        });
    }

    /// What a graph reservation holds now.
    pub(in crate::pool) fn graph_stats(&self, key: u64) -> GraphStats {
        self.lock_wait("a graph reservation's statistics")
            .graphs
            .stats(key)
    }
}

/// The event of a graph released while the host waits for its stream (no event could be
/// recorded there): complete once the wait has returned. (Where the wait fails, the graph's
/// own event fails instead, see [`GraphEvent::fail`].)
#[derive(Debug, Clone, Default)]
struct HostWait(alloc::sync::Arc<core::sync::atomic::AtomicBool>);

impl HostWait {
    fn done(&self) {
        self.0.store(true, core::sync::atomic::Ordering::Release);
    }
}

impl StreamEvent for HostWait {
    fn is_complete(&self) -> Result<bool, Error> {
        Ok(self.0.load(core::sync::atomic::Ordering::Acquire))
    }
}
