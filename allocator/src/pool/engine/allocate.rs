//! The allocation path: a thread heap's, the pool's fast path under the lock, the general
//! path (tracking, sinks, other streams, growth of a growable region) and the refusals.

use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;
use core::cell::Cell;
use std::backtrace::Backtrace;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::trim::FreeChunks;
use super::{
    Ask, EAGER, HEAP_SLOW, HEAPS, Live, LiveInfo, PARKED, Refusal, SINK, Shared, State, TRACKING,
    Taken, grow_meta, store_info,
};
use crate::error::Error;
use crate::pool::events::PoolAction;
use crate::pool::lock::LockGuard;
use crate::pool::lock::logged;
use crate::pool::stats::Tracking;
use crate::pool::stream::{StreamId, StreamSync};
use crate::pool::tlsf;
use crate::pool::{
    AllocRequest, DEFAULT_POOL_ALIGN, MAX_POOL_ALIGN, effective_align, reserved_bytes,
};

/// How long a thread waits for its heap's lock, in spin-loop hints, before its allocation goes
/// to the pool's lock: about what another thread's free holds it for (a hint takes up to
/// about 140 cycles on recent Intel cores; a free holds the lock for a few hundred ns).
const HEAP_LOCK_SPINS: u32 = 32;

std::thread_local! {
    /// The id of the pool whose request on this thread ran out of device memory where the free
    /// chunks it holds mapped could go back to the device after a wait for the home stream (0:
    /// none). That wait must not happen under the pool's lock (work queued on the home stream
    /// may call into the pool): the request fails uncounted, and its entry point, once the
    /// lock is released, waits, gives the chunks back and makes the request again
    /// ([`Shared::retry_after_trim`]).
    static TRIM_WANTED: Cell<u64> = const { Cell::new(0) };
    /// Where the request left its entry point a wait for the home stream rather than a trim
    /// ([`TRIM_WANTED`] names the pool): the stream, capturing a graph, that the wait is for
    /// (see [`Shared::drain_home_for_capture`]).
    static DRAIN_WANTED: Cell<Option<StreamId>> = const { Cell::new(None) };
    /// The id of the pool whose entry point makes such a request again on this thread (0:
    /// none): it fails as any other request.
    static TRIM_RETRY: Cell<u64> = const { Cell::new(0) };
}

/// Whether a request of pool `id` on this thread waits for the trim (or the wait for the home
/// stream) its entry point makes.
pub(in crate::pool) fn trim_wanted(id: u64) -> bool {
    TRIM_WANTED.with(|w| w.get() == id)
}

/// Leaves a wait for the home stream, for `stream` that captures a graph, to the entry point
/// of the request of pool `id` on this thread; whether it could (not inside a request already
/// made again, nor where the entry point has something else to do).
pub(in crate::pool) fn want_drain(id: u64, stream: StreamId) -> bool {
    if TRIM_RETRY.with(|r| r.get() == id) || TRIM_WANTED.with(|w| w.get() != 0) {
        return false;
    }
    TRIM_WANTED.with(|w| w.set(id));
    DRAIN_WANTED.with(|d| d.set(Some(stream)));
    true
}

impl Shared {
    // Inlined into each public entry point: the call and its argument passing cost about 20
    // instructions of the fast path.
    #[inline(always)]
    pub(in crate::pool) fn allocate(
        &self,
        client: u32,
        req: AllocRequest<'_>,
        owned: bool,
    ) -> Result<u64, Error> {
        // What the fast path needs that the lock does not protect: tracking off, a valid
        // alignment, the home stream (or no stream runtime). Where the caller passes no stream
        // (`allocate`), the compiler knows the last one.
        let home = match req.stream {
            None => true,
            Some(stream) => self.streams.is_none() || stream == self.home,
        };
        let align = effective_align(req.align);
        let flags = self.flags.load(Ordering::Relaxed);
        // Nothing on: the pool's own index, as a pool that never had thread heaps does it.
        if let (0, Some(align), true) = (flags, align, home) {
            return self.allocate_on_pool(client, req, align, owned);
        }
        // Thread heaps on (another thread has one, or every thread gets one): the calling
        // thread's heap for the request's stream serves. (For the home stream, `flags` is not
        // 0 here unless something sends it down the general path.) Parked blocks do not stop
        // the heaps: they come back when a path takes the pool's lock.
        if let (0, Some(align), false) = (flags & HEAP_SLOW, align, flags & (HEAPS | EAGER) == 0) {
            let stream = req.stream.unwrap_or(self.home);
            if let Some(addr) = self.allocate_on_heap_fast(client, req.size, align, stream, owned) {
                return Ok(addr);
            }
            return self.allocate_on_heap(client, req.size, align, stream, owned);
        }
        let req = AllocRequest { ..req };
        self.allocate_other(client, &req, owned)
    }

    /// Where a request of this thread on this pool failed for want of device memory and
    /// left the trim to its entry point ([`TRIM_WANTED`]): with the lock released, waits for
    /// the home stream and gives every chunk inside a free block back to the device, as
    /// [`trim`](Self::trim_to) does, then makes the request again, once; the events recorded
    /// meanwhile are delivered after it. Where it left a wait for the home stream instead
    /// ([`DRAIN_WANTED`], a stream that captures a graph), that wait. Any other result is
    /// returned as it is.
    #[cold]
    #[inline(never)]
    pub(in crate::pool) fn retry_after_trim(
        &self,
        result: Result<u64, Error>,
        again: impl FnOnce() -> Result<u64, Error>,
    ) -> Result<u64, Error> {
        if !trim_wanted(self.id) {
            return result;
        }
        TRIM_WANTED.with(|w| w.set(0));
        if let Some(stream) = DRAIN_WANTED.with(Cell::take) {
            // Where the wait fails, the request made again asks for it again and fails with
            // the error of a request that cannot have it.
            if let Err(error) = self.drain_home_unlocked(stream) {
                logged(|| {
                    log::warn!(
                        target: "devarena::pool",
                        "pool `{}`: waiting for the home stream for an allocation on stream \
                         {stream}, which captures a graph, failed: {error}",
                        self.name
                    )
                });
            }
        } else if let Err(error) = self.trim_to(0) {
            logged(|| {
                log::warn!(
                    target: "devarena::pool",
                    "pool `{}`: giving free chunks back to the device for a request that found \
                     none left failed: {error}",
                    self.name
                )
            });
        }
        /// Clears [`TRIM_RETRY`] when the request made again returns (or unwinds).
        struct Retrying(u64);
        impl Drop for Retrying {
            fn drop(&mut self) {
                TRIM_RETRY.with(|r| r.set(self.0));
            }
        }
        let retrying = Retrying(TRIM_RETRY.with(|r| r.replace(self.id)));
        let result = again();
        // Sinks run as after any request: one that calls the pool gets a trim of its own.
        drop(retrying);
        self.deliver();
        result
    }

    /// Where a request failed: made again after a trim where it asks for one
    /// ([`retry_after_trim`](Self::retry_after_trim)).
    #[cold]
    #[inline(never)]
    pub(in crate::pool) fn allocate_failed(
        &self,
        client: u32,
        req: AllocRequest<'_>,
        owned: bool,
        result: Result<u64, Error>,
    ) -> Result<u64, Error> {
        self.retry_after_trim(result, || self.allocate(client, req, owned))
    }

    /// The common case where thread heaps are on: the calling thread's heap serves (see
    /// [`heap_allocate_fast`](Self::heap_allocate_fast)). A function of its own, with nothing
    /// else in it and the address in registers: with the fallbacks beside it, the compiler
    /// spilled the request to the stack before it looked for the heap.
    #[inline(never)]
    pub(super) fn allocate_on_heap_fast(
        &self,
        client: u32,
        size: usize,
        align: usize,
        stream: StreamId,
        owned: bool,
    ) -> Option<u64> {
        let ask = Ask {
            client,
            size,
            align,
            stream,
        };
        self.on_thread_heap(stream, |heap| self.heap_allocate_fast(heap, &ask, owned))
            .flatten()
    }

    /// Where [`allocate_on_heap_fast`](Self::allocate_on_heap_fast) did not serve: the calling
    /// thread's heap, if it has one, or a new one. (Here thread heaps are on and another
    /// thread has one, or every thread gets one, [`EAGER`]: a thread left on
    /// the pool's own index would pay for both paths on every call, looking for a heap first,
    /// and would hold the pool's lock that the heaps' slow paths need. On the H200 host, eight
    /// threads of which one had no heap ran 9% slower per pair than with a heap each.)
    /// It looks for the heap again rather than being told: a fast path that also said whether
    /// the thread has a heap (`Option<Option<u64>>`, the request kept for the fallbacks) cost
    /// 17 instructions more per heap allocation by callgrind, and this path runs rarely.
    #[inline(never)]
    pub(super) fn allocate_on_heap(
        &self,
        client: u32,
        size: usize,
        align: usize,
        stream: StreamId,
        owned: bool,
    ) -> Result<u64, Error> {
        let ask = Ask {
            client,
            size,
            align,
            stream,
        };
        match self.on_thread_heap(stream, |heap| {
            // Its lock held by another thread's free of one of its blocks (for a moment, see
            // `thread_heap::remote`): waited for here rather than at the pool's lock.
            heap.state.wait_unlocked(HEAP_LOCK_SPINS);
            self.heap_allocate_fast(heap, &ask, owned)
        }) {
            Some(Some(addr)) => return Ok(addr),
            Some(None) => return self.heap_allocate_slow(&ask, owned),
            None => {}
        }
        let req = AllocRequest::new(size, align).on(stream);
        self.allocate_contended(&req, &ask, owned)
    }

    /// The fast path on the pool's own index (`align` valid, tracking off, the home stream).
    #[inline(always)]
    pub(super) fn allocate_on_pool(
        &self,
        client: u32,
        req: AllocRequest<'_>,
        align: usize,
        owned: bool,
    ) -> Result<u64, Error> {
        let stream = req.stream.unwrap_or(self.home);
        let Some(mut state) = self.state.try_guard() else {
            let req = AllocRequest { ..req };
            let ask = Ask {
                client,
                size: req.size,
                align,
                stream,
            };
            return self.allocate_contended(&req, &ask, owned);
        };
        let ask = Ask {
            client,
            size: req.size,
            align,
            stream,
        };
        if let Some(addr) = self.allocate_fast(&mut state, &ask, owned) {
            return Ok(addr);
        }
        // The general path decides, from its start (it takes the lock again): the request is
        // made again there after a trim that needs the lock released. (Done here, the check
        // of the result cost the fast path 5 instructions by callgrind.) Copies made where
        // they are needed: a reference to `req` itself would have the compiler store it on
        // the stack on every call.
        drop(state);
        let req = AllocRequest { ..req };
        self.allocate_other(client, &req, owned)
    }

    /// The fast path's allocation when another thread holds the pool's lock, when another
    /// thread has a heap (or every thread gets one), or on a stream other than the home stream:
    /// the calling thread gets a heap of its own for the request's stream (see
    /// [`thread_heap`](crate::pool::thread_heap)) unless they are off or the stream can have none.
    #[cold]
    #[inline(never)]
    pub(in crate::pool) fn allocate_contended(
        &self,
        req: &AllocRequest<'_>,
        ask: &Ask,
        owned: bool,
    ) -> Result<u64, Error> {
        let result = self.allocate_contended_once(req, ask, owned);
        if result.is_ok() {
            return result;
        }
        self.allocate_failed(ask.client, *req, owned, result)
    }

    #[inline(always)]
    fn allocate_contended_once(
        &self,
        req: &AllocRequest<'_>,
        ask: &Ask,
        owned: bool,
    ) -> Result<u64, Error> {
        let mut state = self.lock()?;
        // (Home-stream heaps stay away for a while after they stepped aside near the
        // capacity: see `HeapBar`.)
        let home_heap = self.heap_stream(ask.stream) == self.heap_stream(self.home);
        let barred = home_heap && state.heap_bar.on(state.next_serial);
        if home_heap && !barred {
            state.heap_bar.note_over();
        }
        if self.heap_bytes > 0 && !barred {
            // The thread's heap for the stream where it has one (a sink or tracking switched
            // off since the caller looked sends it here too), else a new one.
            let heap = self
                .usable_thread_heap(ask.stream)
                .or_else(|| self.new_thread_heap(&mut state, ask.stream));
            if let Some(heap) = heap {
                let result = self.heap_allocate_locked(&mut state, &heap, ask, owned);
                return self.unlock_and_deliver(state, result);
            }
        }
        // (The pool's fast path serves the home stream only.)
        let home = self.streams.is_none() || ask.stream == self.home;
        if home && let Some(addr) = self.allocate_fast(&mut state, ask, owned) {
            return Ok(addr);
        }
        let result = self.allocate_general(&mut state, ask.client, req, ask.stream, owned, None);
        self.unlock_and_deliver(state, result)
    }

    /// An allocation the fast path never takes: tracking on, a bad alignment, another stream
    /// while no thread has a heap. A request on another stream gets the calling thread a heap
    /// for that stream at once, where heaps can serve it: without one every free there would
    /// record an event and park its block until the event completes, while a heap reuses its
    /// blocks on its own stream at once (a thread alone on a stream of its own: 20 to 30 times
    /// faster a pair on the H200). On the home stream a thread that finds the pool's lock taken
    /// gets one.
    #[inline(never)]
    pub(super) fn allocate_other(
        &self,
        client: u32,
        req: &AllocRequest<'_>,
        owned: bool,
    ) -> Result<u64, Error> {
        let stream = req.stream.unwrap_or(self.home);
        let flags = self.flags.load(Ordering::Relaxed);
        let info = match flags & TRACKING {
            0 => None,
            _ => Some(self.record_info(req.tag)),
        };
        // Where a heap may serve the request: tracking and sinks off, a valid alignment.
        let on_heap = match effective_align(req.align) {
            Some(align) if flags & HEAP_SLOW == 0 && self.heap_bytes > 0 => Some(Ask {
                client,
                size: req.size,
                align,
                stream,
            }),
            _ => None,
        };
        if let (Some(ask), Some(_)) = (&on_heap, &self.streams) {
            if stream != self.home {
                return self.allocate_contended(req, ask, owned);
            }
        }
        let mut state = match self.state.try_guard() {
            Some(state) => state,
            None => match &on_heap {
                Some(ask) => return self.allocate_contended(req, ask, owned),
                None => self.lock()?,
            },
        };
        let result = self.allocate_general(&mut state, client, req, stream, owned, info);
        let result = self.unlock_and_deliver(state, result);
        if result.is_ok() {
            return result;
        }
        self.allocate_failed(client, *req, owned, result)
    }

    /// Releases the lock, then delivers the events the call recorded (if any).
    #[inline(always)]
    pub(in crate::pool) fn unlock_and_deliver<R>(
        &self,
        state: LockGuard<'_, State>,
        result: R,
    ) -> R {
        let recorded = !state.outbox.is_empty();
        drop(state);
        // (A request that left a trim to its entry point has them delivered there, after it is
        // made again: a sink that calls the pool meanwhile would find the trim pending.)
        if recorded && !trim_wanted(self.id) {
            // (Inside a request made again after a trim, the sinks' own requests are not.)
            let retrying = TRIM_RETRY.with(|r| r.replace(0));
            self.deliver();
            TRIM_RETRY.with(|r| r.set(retrying));
        }
        result
    }

    /// The common case: a valid alignment, tracking off, the home stream (or no stream
    /// runtime) (all three checked by the caller), nothing parked, within capacity and quota,
    /// and a free block found. It changes nothing until it has a block; `None` sends the
    /// request down [`allocate_general`](Self::allocate_general), which decides the same way
    /// and reports why a request fails.
    #[inline(always)]
    pub(super) fn allocate_fast(&self, state: &mut State, ask: &Ask, owned: bool) -> Option<u64> {
        // Under the lock the flags are exact for a sink, parked blocks and thread heaps: all
        // three are set and cleared under it.
        let flags = self.flags.load(Ordering::Relaxed);
        // (`reserved_bytes` within the capacity, and the class's index.)
        let (reserved, class) = tlsf::request_class(ask.size as u64, self.max_request)?;
        let reserved = reserved as usize;
        let client = &state.clients[ask.client as usize];
        if !client.allows(reserved) {
            return None;
        }
        // With leases out, the general path takes their unused part back before it counts a
        // new peak.
        if flags & (SINK | PARKED | HEAPS) != 0
            && (flags & (SINK | PARKED) != 0
                || self.exact_peaks
                    && !(client.counts.admits(reserved) && state.counts.admits(reserved)))
        {
            return None;
        }
        let (block, addr) =
            state
                .tlsf
                .allocate_in_class(reserved as u64, class, ask.align as u64)?;
        // Memory behind the block: mapped already (all of a classic region, which needs no
        // look), or the general path maps it.
        if self.growable && !self.chunks.covers(addr, reserved as u64) {
            state.tlsf.free(block);
            return None;
        }
        let taken = Taken {
            block,
            addr,
            reserved,
        };
        // No sink: the flags, exact under the lock, said so.
        self.commit_allocation(state, ask, owned, None, taken, false);
        Some(addr)
    }

    /// Every allocation the fast path does not take: tracking on, a bad alignment, parked
    /// blocks, another stream, and every failure.
    #[inline(never)]
    pub(in crate::pool) fn allocate_general(
        &self,
        state: &mut State,
        client: u32,
        req: &AllocRequest<'_>,
        stream: StreamId,
        owned: bool,
        info: Option<Box<LiveInfo>>,
    ) -> Result<u64, Error> {
        // (Paths that take the lock with `try_guard` come here; `lock()` makes them too.)
        self.make_deferred_frees(state);
        let align = effective_align(req.align);
        let ask = Ask {
            client,
            size: req.size,
            align: align.unwrap_or(req.align),
            stream,
        };
        let result = match align {
            Some(align) => self.try_allocate(state, &ask, align, owned, info),
            None => Err(self.unsupported_align(state, &ask)),
        };
        result.map_err(|error| {
            // Left to the entry point, which counts it if the request fails again.
            if trim_wanted(self.id) {
                return error;
            }
            self.allocation_failed(state, &ask, req.tag, error)
        })
    }

    /// What tracking records for a new allocation (outside the lock: a backtrace is slow).
    #[cold]
    #[inline(never)]
    pub(super) fn record_info(&self, tag: Option<&str>) -> Box<LiveInfo> {
        Box::new(LiveInfo {
            tag: tag.map(String::from),
            at: Instant::now(),
            backtrace: (self.tracking() == Tracking::Backtraces).then(Backtrace::force_capture),
        })
    }

    #[cold]
    #[inline(never)]
    pub(super) fn unsupported_align(&self, state: &State, ask: &Ask) -> Error {
        Error::invalid(format!(
            "pool `{}`, client `{}`: alignment {} is not supported (a power of two up to \
             {MAX_POOL_ALIGN}, or 0 for {DEFAULT_POOL_ALIGN})",
            self.name, state.clients[ask.client as usize].name, ask.align
        ))
    }

    /// Counts and reports a failed allocation; returns its error.
    #[cold]
    #[inline(never)]
    pub(in crate::pool) fn allocation_failed(
        &self,
        state: &mut State,
        ask: &Ask,
        tag: Option<&str>,
        error: Error,
    ) -> Error {
        state.clients[ask.client as usize].counts.on_failure();
        self.emit(
            state,
            PoolAction::AllocateFailure,
            ask,
            0,
            0,
            tag,
            Some(&error),
        );
        error
    }

    /// The allocation itself, at a valid alignment (`align`, at least 256).
    #[inline(always)]
    pub(super) fn try_allocate(
        &self,
        state: &mut State,
        ask: &Ask,
        align: usize,
        owned: bool,
        info: Option<Box<LiveInfo>>,
    ) -> Result<u64, Error> {
        if !state.parked.is_empty() {
            let epoch = state.home_epoch;
            self.reclaim_parked(state);
            if state.home_epoch > epoch {
                // A slice that an event dropped there was freed on the home stream: a
                // capturing stream, which cannot wait for it, has the host wait instead.
                self.drain_home_for_capture(ask.stream)?;
            }
        }
        let reserved = match reserved_bytes(ask.size) {
            Some(r) if r <= self.capacity => r,
            _ => return Err(self.exhausted(state, ask, "capacity")),
        };
        let mut info = info;
        // Thread heaps give their spans back once before a request fails for capacity or for
        // want of device memory to map (and what heaps of other streams gave back parked is
        // ordered, see `order_given_back`).
        let mut given_back = state.heaps.is_empty()
            && !state
                .parked
                .iter()
                .any(|(_, queue)| queue.iter().any(|p| p.given_back));
        let mut trimmed = false;
        loop {
            if self.exact_peaks && !state.heaps.is_empty() {
                // Headroom that waits for heaps serves the pool's own index too.
                self.draw_spare(state, ask.client, reserved);
            }
            let client = &state.clients[ask.client as usize];
            let exact = client.allows(reserved)
                && (!self.exact_peaks
                    || client.counts.admits(reserved) && state.counts.admits(reserved));
            let result = if exact || state.heaps.is_empty() {
                self.allocate_admitted(state, ask, align, reserved, owned, &mut info)
            } else {
                // The heaps' unused leases would count as in use: they are taken back first,
                // and the heaps stay locked until the allocation is counted, so that the
                // quota check and the peak are exact.
                self.with_heaps(state, |state, heaps| {
                    self.revoke(state, heaps, ask.client);
                    self.allocate_admitted(state, ask, align, reserved, owned, &mut info)
                })
            };
            match result {
                Ok(addr) => return Ok(addr),
                // Blocks freed on the home stream (or given back by its heaps) while a wait for
                // it runs outside the lock wait behind events there; a request that would fail
                // without them takes them back first: the home stream's own order covers their
                // reuse there, and another stream is ordered after the home stream before it
                // gets them (one that captures a graph has the host wait instead).
                Err(Refusal::Capacity | Refusal::Error(Error::OutOfMemory { .. }))
                    if self.take_fenced(state) =>
                {
                    self.drain_home_for_capture(ask.stream)?;
                }
                // Out of memory for new chunks of a growable region: the heaps' mapped free
                // memory may serve (as for capacity, a request fails only after they gave it
                // back once).
                Err(Refusal::Capacity | Refusal::Error(Error::OutOfMemory { .. }))
                    if !given_back =>
                {
                    let epoch = state.home_epoch;
                    self.dissolve_all(state, true);
                    self.order_given_back(state);
                    // The events it dropped may have owned slices: freed for this request.
                    self.make_deferred_frees(state);
                    given_back = true;
                    if state.home_epoch > epoch {
                        // Blocks that reached the pool's index here are ordered before the
                        // home stream's later work: a capturing stream, which cannot wait for
                        // the home stream, has the host wait for it instead.
                        self.drain_home_for_capture(ask.stream)?;
                    }
                }
                // Still no device memory: the free chunks this pool holds mapped go back to
                // the device, once, and the request maps its own (a growable region).
                Err(Refusal::Error(error @ Error::OutOfMemory { .. })) => {
                    if trimmed || TRIM_RETRY.with(|r| r.get() == self.id) {
                        return Err(error);
                    }
                    trimmed = true;
                    match self.unmap_free_for_request(state, ask.stream) {
                        FreeChunks::Unmapped => {}
                        FreeChunks::AfterWait if TRIM_WANTED.with(|w| w.get() == 0) => {
                            TRIM_WANTED.with(|w| w.set(self.id));
                            return Err(error);
                        }
                        FreeChunks::AfterWait | FreeChunks::None => return Err(error),
                    }
                }
                Err(Refusal::Capacity) => return Err(self.exhausted(state, ask, "capacity")),
                Err(Refusal::Quota) => return Err(self.exhausted(state, ask, "quota")),
                Err(Refusal::Error(error)) => return Err(error),
            }
        }
    }

    /// [`try_allocate`](Self::try_allocate) once the leases are settled: the quota, the
    /// streams, a block from the pool's index.
    #[inline(always)]
    pub(super) fn allocate_admitted(
        &self,
        state: &mut State,
        ask: &Ask,
        align: usize,
        reserved: usize,
        owned: bool,
        info: &mut Option<Box<LiveInfo>>,
    ) -> Result<u64, Refusal> {
        if !state.clients[ask.client as usize].allows(reserved) {
            return Err(Refusal::Quota);
        }
        if let Some(streams) = &self.streams {
            if ask.stream != self.home {
                self.stream_call("validate", || streams.validate(ask.stream))
                    .map_err(Refusal::Error)?;
                self.order_after_home(state, &**streams, ask.stream, self.home)
                    .map_err(Refusal::Error)?;
            }
        }
        let mut taken = state.tlsf.allocate(reserved as u64, align as u64);
        if taken.is_none() && state.tlsf.cached().1 > 0 {
            // Merge what waits in the reuse cache and look again: a request fails only when
            // it fails with every free byte merged.
            state.tlsf.flush();
            taken = state.tlsf.allocate(reserved as u64, align as u64);
        }
        let Some((block, addr)) = taken else {
            return Err(Refusal::Capacity);
        };
        // Memory behind the block: map what is missing; when that fails, the block goes back
        // and the pool is as it was.
        let (block, addr) = if state.mapping.covers(addr, reserved as u64) {
            (block, addr)
        } else {
            self.map_block(state, block, addr, reserved, align)
                .map_err(Refusal::Error)?
        };
        let taken = Taken {
            block,
            addr,
            reserved,
        };
        let log = state.sink.is_some();
        self.commit_allocation(state, ask, owned, info.take(), taken, log);
        Ok(addr)
    }

    /// Maps the memory behind a block whose chunks are not all mapped (a growable region
    /// grows). When that fails, the block goes back to the free lists; if freed blocks wait in
    /// the reuse cache (all of them mapped), they are merged and the request looks once more.
    /// When the device is out of memory, every free block is then looked at for mapped memory
    /// that holds the request ([`Tlsf::allocate_where`](crate::pool::tlsf::Tlsf::allocate_where)):
    /// the index's search looks at sizes only and may pass it by. When nothing serves, the pool
    /// is as it was (but for the merged cache) and the error (`OutOfMemory` with the driver's
    /// error name, when the device is out of memory) fails the request.
    ///
    /// The cache is not merged before the pool grows: merging it resets what it learned, and
    /// on the pool benchmark's workload that cut its hits from 93% to 28% and doubled the time
    /// of a pair, for a quarter of the memory mapped (see `BENCHMARKS.md`). A growable region so
    /// maps the addresses a classic region of the same workload would touch, no more.
    #[cold]
    #[inline(never)]
    pub(super) fn map_block(
        &self,
        state: &mut State,
        block: u32,
        addr: u64,
        reserved: usize,
        align: usize,
    ) -> Result<(u32, u64), Error> {
        let Err(mut error) = state.mapping.ensure(addr, reserved as u64) else {
            return Ok((block, addr));
        };
        let (size, align) = (reserved as u64, align as u64);
        state.tlsf.free(block);
        if state.tlsf.cached().1 > 0 {
            state.tlsf.flush();
            if let Some((block, addr)) = state.tlsf.allocate(size, align) {
                if state.mapping.covers(addr, size) {
                    return Ok((block, addr));
                }
                match state.mapping.ensure(addr, size) {
                    Ok(()) => return Ok((block, addr)),
                    Err(again) => {
                        state.tlsf.free(block);
                        error = again;
                    }
                }
            }
        }
        // Out of device memory: the index's search looks at sizes only, and may have passed
        // by a free block with mapped memory enough (one of a larger size class, or a mapped
        // part of a block that reaches into unmapped chunks). Every free block is looked at
        // before the request fails.
        if !matches!(error, Error::OutOfMemory { .. }) {
            return Err(error);
        }
        let mapping = &state.mapping;
        state
            .tlsf
            .allocate_where(size, |at, bytes| {
                mapping.mapped_start(at, bytes, size, align)
            })
            .ok_or(error)
    }

    /// Records a block taken for `ask`: the address map, the block's [`Live`], what tracking
    /// recorded, the counters, the event log.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn commit_allocation(
        &self,
        state: &mut State,
        ask: &Ask,
        owned: bool,
        info: Option<Box<LiveInfo>>,
        taken: Taken,
        log: bool,
    ) {
        let Taken {
            block,
            addr,
            reserved,
        } = taken;
        state.counts.on_alloc_bytes(reserved);
        state.clients[ask.client as usize]
            .counts
            .on_alloc(reserved, ask.size);
        state.live.insert_new(addr, block);
        let slot = block as usize;
        let tracked = info.is_some();
        let serial = state.next_serial;
        state.next_serial += 1;
        let live = Live {
            size: ask.size,
            serial,
            stream: ask.stream,
            client: ask.client,
            // At most MAX_POOL_ALIGN (4096).
            align: ask.align as u16,
            owned,
            tracked,
        };
        if state.meta.len() <= slot {
            grow_meta(&mut state.meta, slot);
        }
        // Field by field: the compiler builds a whole `Live` on the stack and copies it.
        let entry = &mut state.meta[slot];
        entry.size = live.size;
        entry.serial = live.serial;
        entry.stream = live.stream;
        entry.client = live.client;
        entry.align = live.align;
        entry.owned = live.owned;
        entry.tracked = live.tracked;
        if let Some(info) = info {
            store_info(&mut state.info, slot, info);
        }
        if log {
            let tag = tracked
                .then(|| state.info[slot].as_ref()?.tag.clone())
                .flatten();
            // A copy made here: a reference to the caller's would keep it on the stack.
            let ask = *ask;
            let tag = tag.as_deref();
            self.emit(state, PoolAction::Allocate, &ask, addr, reserved, tag, None);
        }
    }

    /// Makes `stream` wait for the home stream if the home stream freed anything since its
    /// last wait.
    pub(in crate::pool) fn order_after_home(
        &self,
        state: &mut State,
        streams: &dyn StreamSync,
        stream: StreamId,
        home: StreamId,
    ) -> Result<(), Error> {
        let epoch = state.home_epoch;
        // A handle that is another stream on each thread waits every time: the last wait was
        // another thread's stream's. (A runtime that panics here is taken at its worst.)
        let per_thread = self.stream_call("is_per_thread", || Ok(streams.is_per_thread(stream)));
        if per_thread.unwrap_or(true) {
            return self.stream_call("order_after", || streams.order_after(stream, home));
        }
        let last = state.waited.iter().find(|(s, _)| *s == stream);
        if last.map_or(0, |&(_, last)| last) < epoch {
            self.stream_call("order_after", || streams.order_after(stream, home))?;
            state.note_waited(stream, epoch);
        }
        Ok(())
    }

    /// Returns parked blocks whose events completed to the free lists; the bytes reclaimed.
    ///
    /// An event that cannot be queried (the driver reports an error, or the stream runtime
    /// panics) sets aside its own block for good: nothing says the stream is done with it, so
    /// it is never handed out again. The pool carries on with the rest; the block is logged
    /// (target `devarena::pool`, level `error`) and counted in [`PoolStats::quarantined`](crate::pool::PoolStats::quarantined).
    pub(in crate::pool) fn reclaim_parked(&self, state: &mut State) -> usize {
        let mut reclaimed = 0;
        let State {
            parked,
            tlsf,
            pending,
            quarantined,
            ..
        } = state;
        for (stream, queue) in parked.iter_mut() {
            while let Some(front) = queue.front() {
                let complete = self.stream_call("is_complete", || front.event.is_complete());
                match complete {
                    Ok(false) => break,
                    Ok(true) => {
                        let Some(parked) = queue.pop_front() else {
                            break;
                        };
                        match &parked.heap {
                            None => tlsf.free(parked.block),
                            Some(heap) => heap.state.lock_wait().tlsf.free(parked.block),
                        };
                        *pending -= parked.bytes;
                        reclaimed += parked.bytes;
                    }
                    Err(error) => {
                        let Some(parked) = queue.pop_front() else {
                            break;
                        };
                        *pending -= parked.bytes;
                        *quarantined += parked.bytes;
                        logged(|| {
                            log::error!(
                                target: "devarena::pool",
                                "pool `{}`: the event of a block of {} bytes freed on stream {stream} \
                                 could not be queried ({error}); the block is set aside for good \
                                 and the pool carries on",
                                self.name,
                                parked.bytes
                            )
                        });
                    }
                }
            }
        }
        self.forget_empty_queues(state);
        // The events dropped here may have owned slices of this pool (see `defer_free`): their
        // memory is free when this returns.
        self.make_deferred_frees(state);
        reclaimed
    }

    /// Drops the streams whose queues of parked blocks are empty; clears [`PARKED`] once no
    /// block is parked.
    pub(in crate::pool) fn forget_empty_queues(&self, state: &mut State) {
        state.parked.retain(|(_, queue)| !queue.is_empty());
        if state.parked.is_empty() {
            self.flags.fetch_and(!PARKED, Ordering::Relaxed);
        }
    }

    pub(super) fn exhausted(&self, state: &mut State, ask: &Ask, limit: &'static str) -> Error {
        // The figures of the pool with every thread heap given back: the largest free block
        // counts merged blocks only.
        self.dissolve_all(state, true);
        state.tlsf.flush();
        let c = &state.clients[ask.client as usize];
        let (limit_bytes, in_use) = match limit {
            "quota" => (c.quota, c.counts.in_use),
            _ => (self.capacity, state.counts.in_use),
        };
        Error::PoolExhausted {
            client: String::from(&*c.name),
            requested: ask.size,
            align: ask.align,
            limit,
            limit_bytes,
            in_use,
            free: state.tlsf.free_bytes() as usize,
            largest_free: state.tlsf.largest_free() as usize,
            pending: state.pending,
        }
    }
}
