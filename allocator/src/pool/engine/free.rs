//! The free path: a thread heap's, the pool's fast path, the general path with its checks
//! (owner, size, graph reservations), and blocks freed on other streams parked until their
//! events complete.

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use std::sync::atomic::Ordering;

use super::{HEAPS, Live, LiveInfo, PARKED, Parked, Shared, State};
use crate::error::Error;
use crate::pool::FreeRequest;
use crate::pool::stream::{StreamEvent, StreamId, StreamSync};
use crate::pool::thread_heap::ThreadHeap;

impl Shared {
    /// Frees `addr`. `caller`: the client asking (`None`: the pool itself, which may free any
    /// allocation). `from_slice`: the call comes from the [`PoolSlice`](crate::pool::PoolSlice) that owns it.
    #[inline(always)]
    pub(in crate::pool) fn deallocate(
        &self,
        caller: Option<u32>,
        req: FreeRequest,
        from_slice: bool,
    ) -> Result<(), Error> {
        let FreeRequest { addr, size, stream } = req;
        // As for `allocate`: the home stream or no stream runtime, known before the call
        // where the caller passes no stream.
        let home = match stream {
            None => true,
            Some(stream) => self.streams.is_none() || stream == self.home,
        };
        let stream = stream.unwrap_or(self.home);
        // The calling thread's heap for the stream of the free takes it if the allocation is
        // there (a free on another stream of a heap's block goes on, and parks it).
        if size.is_none() && self.flags.load(Ordering::Relaxed) & HEAPS != 0 {
            if self.deallocate_on_thread_heap(caller, addr, stream, from_slice) {
                return Ok(());
            }
            // Another thread's heap (a consumer freeing what a producer allocated), found and
            // locked without the pool's lock.
            if self.deallocate_remote(caller, addr, stream, from_slice) {
                return Ok(());
            }
        }
        let mut state = match self.lock() {
            Ok(state) => state,
            Err(error) => {
                return self.deallocate_reentrant(caller, addr, size, stream, from_slice, error);
            }
        };
        if home
            && size.is_none()
            && self
                .deallocate_fast(&mut state, caller, addr, stream, from_slice)
                .is_some()
        {
            return Ok(());
        }
        let result = self.deallocate_general(&mut state, caller, addr, size, stream, from_slice);
        // The backtrace (if any) is freed outside the lock.
        self.unlock_and_deliver(state, result).map(drop)
    }

    /// A free made inside one of this pool's own callbacks (`error` says so). A slice dropped
    /// there is freed later ([`defer_free`](Self::defer_free)): its destructor could only
    /// log the error and leak the block. Any other free fails with `error`.
    #[cold]
    #[inline(never)]
    fn deallocate_reentrant(
        &self,
        caller: Option<u32>,
        addr: u64,
        size: Option<usize>,
        stream: StreamId,
        from_slice: bool,
        error: Error,
    ) -> Result<(), Error> {
        match caller {
            Some(client) if from_slice && size.is_none() => {
                self.defer_free(client, addr, stream);
                Ok(())
            }
            _ => Err(error),
        }
    }

    /// A free on the calling thread's heap, where it has one and the allocation is there:
    /// whether it freed.
    #[inline(never)]
    pub(super) fn deallocate_on_thread_heap(
        &self,
        caller: Option<u32>,
        addr: u64,
        stream: StreamId,
        from_slice: bool,
    ) -> bool {
        match self.on_thread_heap(stream, |heap| {
            // After a free of another heap's block, the span directory is asked first (see
            // `OwnerHint`): `deallocate_remote` finds the heap, this one included. (Not inside
            // a callback of the pool, a logger's included, where that path gives way to the
            // pool's lock: there the heap is tried as it always was.)
            if heap.frees_elsewhere.get() && !self.state.in_callback() {
                return None;
            }
            let freed = self.heap_deallocate_fast(heap, caller, addr, from_slice);
            if freed.is_none() {
                heap.frees_elsewhere.set(true);
            }
            freed
        }) {
            Some(Some(over)) => {
                if over {
                    self.shrink(stream);
                }
                true
            }
            _ => false,
        }
    }

    /// The common case: a live allocation that `caller` may free, untracked, freed on the
    /// home stream or without a stream runtime (checked by the caller). It changes nothing
    /// unless it frees; `None`
    /// sends the call down [`deallocate_general`](Self::deallocate_general).
    #[inline(always)]
    pub(super) fn deallocate_fast(
        &self,
        state: &mut State,
        caller: Option<u32>,
        addr: u64,
        stream: StreamId,
        from_slice: bool,
    ) -> Option<()> {
        let slot = state.live.find(addr)?;
        let block = state.live.value_at(slot);
        let live = state.meta[block as usize];
        if live.tracked
            || (live.owned && !from_slice)
            || caller.is_some_and(|caller| caller != live.client)
            || state.sink.is_some()
            || state.graphs.owns_blocks()
        {
            return None;
        }
        state.live.remove_at(slot);
        self.commit_free(state, addr, block, &live, stream, None, None);
        Some(())
    }

    /// Every free the fast path does not take: tracked allocations, other streams, and every
    /// refusal. Returns what tracking recorded, to be dropped outside the lock.
    #[inline(never)]
    pub(super) fn deallocate_general(
        &self,
        state: &mut State,
        caller: Option<u32>,
        addr: u64,
        size: Option<usize>,
        stream: StreamId,
        from_slice: bool,
    ) -> Result<Option<Box<LiveInfo>>, Error> {
        let Some(block) = state.live.get(addr) else {
            return self.deallocate_on_heap(state, caller, addr, size, stream, from_slice);
        };
        let live = state.meta[block as usize];
        self.check_free(state, caller, addr, size, &live, from_slice)?;
        // A block a graph owns is held for it (`engine/graph.rs`).
        if state.graphs.owns_blocks() {
            if let Some(owner) = state.graphs.owner(addr) {
                return self.free_graph_block(state, addr, block, &live, stream, owner, from_slice);
            }
        }
        // Record the event before changing anything, so a failing stream runtime leaves the
        // allocation live and the pool as it was.
        let (event, unrecorded) = match &self.streams {
            Some(streams) if stream != self.home => {
                let (event, unrecorded) = self.free_event(&**streams, stream, from_slice)?;
                (Some(event), unrecorded)
            }
            _ => (None, None),
        };
        let info = state.forget_live(addr, block, live.tracked);
        let tag = info.as_ref().and_then(|i| i.tag.as_deref());
        self.commit_free(state, addr, block, &live, stream, event, tag);
        unrecorded.map_or(Ok(info), Err)
    }

    /// The event that a free on `stream` parks its block behind, and the error of its
    /// recording where a slice's free parks the block behind that failure instead.
    ///
    /// A free by address whose event cannot be recorded (a driver error, a panic of the
    /// runtime) fails and changes nothing: its caller still has the address. A slice's free
    /// cannot leave its block live that way: the slice is gone, and only it may free its
    /// block, which would be lost for good. Its block is parked behind the failure (an event
    /// whose query fails with the recording's error), and the next look at parked blocks sets
    /// it aside, as it does every block whose event cannot be queried (logged, counted in
    /// [`PoolStats::quarantined`](crate::pool::PoolStats::quarantined)); the free still
    /// returns the error.
    pub(super) fn free_event(
        &self,
        streams: &dyn StreamSync,
        stream: StreamId,
        from_slice: bool,
    ) -> Result<(Box<dyn StreamEvent>, Option<Error>), Error> {
        match self.record_event(streams, stream) {
            Ok(event) => Ok((event, None)),
            Err(error) if from_slice => Ok((Box::new(Unrecorded(error.clone())), Some(error))),
            Err(error) => Err(error),
        }
    }

    /// Whether `caller` may free `live`, the live allocation at `addr`, with a free that names
    /// `size`.
    pub(super) fn check_free(
        &self,
        state: &State,
        caller: Option<u32>,
        addr: u64,
        size: Option<usize>,
        live: &Live,
        from_slice: bool,
    ) -> Result<(), Error> {
        if (live.owned && !from_slice) || caller.is_some_and(|caller| caller != live.client) {
            return Err(self.refused_free(state, caller, addr, live, from_slice));
        }
        if let Some(size) = size.filter(|&size| size != live.size) {
            return Err(self.wrong_size(state, addr, size, live));
        }
        Ok(())
    }

    /// A free of an address that is no live allocation of the pool's index: one of a thread
    /// heap's (any thread's), or an unknown address.
    #[cold]
    #[inline(never)]
    pub(super) fn deallocate_on_heap(
        &self,
        state: &mut State,
        caller: Option<u32>,
        addr: u64,
        size: Option<usize>,
        stream: StreamId,
        from_slice: bool,
    ) -> Result<Option<Box<LiveInfo>>, Error> {
        let unknown = |state: &State| Err(Self::unknown_address(state, caller, addr));
        let Some(heap) = Self::span_owner(state, addr) else {
            return unknown(state);
        };
        // Another thread's heap: with the span directory up to date, the next such frees find
        // it without this lock. The caller's own (its lock was busy, or the thread asked the
        // directory first): its next free tries its heap first again, and the directory,
        // which serves other threads, is left as it is.
        if crate::pool::thread_heap::is_current(self.id, stream, Arc::as_ptr(&heap)) {
            heap.frees_elsewhere.set(false);
        } else {
            self.refresh_span_directory(state);
        }
        let found = {
            let h = heap.state.lock_wait();
            h.live.get(addr).map(|block| h.meta[block as usize])
        };
        let Some(live) = found else {
            return unknown(state);
        };
        self.check_free(state, caller, addr, size, &live, from_slice)?;
        // As in `deallocate_general`: the event first, with the heap unlocked (no callback
        // runs with a heap locked by this path). A heap hands its blocks out again on its own
        // stream only: a free on any other stream, the home stream included, parks the block
        // until that stream is done with it.
        let (event, unrecorded) = match &self.streams {
            Some(streams) if stream != heap.stream => {
                let (event, unrecorded) = self.free_event(&**streams, stream, from_slice)?;
                (Some(event), unrecorded)
            }
            _ => (None, None),
        };
        let mut guard = heap.state.lock_wait();
        let h = &mut *guard;
        // The heap's thread may have freed it, and allocated there again, meanwhile.
        let Some((slot, block)) = h.live.find_entry(addr) else {
            return unknown(state);
        };
        let live = h.meta[block as usize];
        self.check_free(state, caller, addr, size, &live, from_slice)?;
        h.live.remove_at(slot);
        let reserved = match event {
            Some(event) => {
                let bytes = h.tlsf.block_size(block) as usize;
                self.park(state, stream, Some(heap.clone()), block, bytes, event);
                bytes
            }
            None => h.tlsf.release(block) as usize,
        };
        h.uncount(&live, reserved);
        self.settle_locked(state, &heap, h, live.client);
        drop(guard);
        self.emit_free(state, &live, addr, reserved, stream, None);
        unrecorded.map_or(Ok(None), Err)
    }

    /// Returns the block of a freed allocation (already out of the address map) to the free
    /// lists, or parks it until `event` completes; counts it; logs it.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn commit_free(
        &self,
        state: &mut State,
        addr: u64,
        block: u32,
        live: &Live,
        stream: StreamId,
        event: Option<Box<dyn StreamEvent>>,
        tag: Option<&str>,
    ) {
        let reserved = match event {
            Some(event) => {
                let reserved = state.tlsf.block_size(block) as usize;
                self.park(state, stream, None, block, reserved, event);
                reserved
            }
            None => {
                if self.streams.is_some() {
                    if state.home_fences > 0 {
                        return self.commit_fenced_free(state, addr, block, live, stream, tag);
                    }
                    state.home_epoch += 1;
                }
                state.tlsf.release(block) as usize
            }
        };
        self.count_free(state, live, addr, reserved, stream, tag);
    }

    /// [`commit_free`](Self::commit_free) of a free on the home stream while a wait for it
    /// runs outside the lock (see [`State::home_fences`](super::State)): parks `block` behind
    /// an event recorded there now, which the wait does not cover. Where no event can be
    /// recorded the block is freed as usual, and the waiting side, which sees the home
    /// stream's epoch move, looks again.
    #[cold]
    #[inline(never)]
    fn commit_fenced_free(
        &self,
        state: &mut State,
        addr: u64,
        block: u32,
        live: &Live,
        stream: StreamId,
        tag: Option<&str>,
    ) {
        let event = match &self.streams {
            Some(streams) => self.record_event(&**streams, self.home).ok(),
            None => None,
        };
        let reserved = match event {
            Some(event) => {
                let bytes = state.tlsf.block_size(block) as usize;
                let parked = Parked {
                    heap: None,
                    block,
                    bytes,
                    event,
                    given_back: false,
                    fenced: true,
                };
                self.park_entry(state, self.home, parked);
                bytes
            }
            None => {
                state.home_epoch += 1;
                state.tlsf.release(block) as usize
            }
        };
        self.count_free(state, live, addr, reserved, stream, tag);
    }

    /// For a request that would fail without them: the blocks freed on the home stream (or
    /// given back by its heaps) while a wait for it ran outside the lock ([`Parked::fenced`])
    /// go back to the free lists, and the home stream's epoch moves, so that the waiting side
    /// looks again; whether there were any. (The home stream's own order covers their reuse
    /// there; another stream is ordered after the home stream before it gets them, as for any
    /// block freed there, and one that captures a graph has the host wait instead.)
    #[cold]
    #[inline(never)]
    pub(super) fn take_fenced(&self, state: &mut State) -> bool {
        let home = self.home;
        let State {
            parked,
            tlsf,
            pending,
            ..
        } = &mut *state;
        let Some((_, queue)) = parked.iter_mut().find(|(s, _)| *s == home) else {
            return false;
        };
        let mut taken = false;
        queue.retain(|p| {
            if p.fenced {
                tlsf.free(p.block);
                *pending -= p.bytes;
                taken = true;
            }
            !p.fenced
        });
        if taken {
            state.home_epoch += 1;
            self.forget_empty_queues(state);
        }
        taken
    }

    #[cold]
    #[inline(never)]
    pub(super) fn unknown_address(state: &State, caller: Option<u32>, addr: u64) -> Error {
        Error::UnknownAddress {
            addr,
            client: String::from(&*state.clients[caller.unwrap_or(0) as usize].name),
        }
    }

    /// A free that names another size than the live allocation at `addr` asked for: most
    /// likely a stale free of an address that has been handed out again since.
    #[cold]
    #[inline(never)]
    pub(super) fn wrong_size(&self, state: &State, addr: u64, size: usize, live: &Live) -> Error {
        let owner = &state.clients[live.client as usize].name;
        Error::invalid(format!(
            "pool `{}`: a free of {addr:#x} names {size} bytes, but the live allocation there \
             (client `{owner}`, allocation #{}) asked for {} bytes: probably a stale free of an \
             address handed out again; nothing was freed",
            self.name, live.serial, live.size
        ))
    }

    /// Why `caller` may not free the live allocation at `addr`.
    #[cold]
    #[inline(never)]
    pub(super) fn refused_free(
        &self,
        state: &State,
        caller: Option<u32>,
        addr: u64,
        live: &Live,
        from_slice: bool,
    ) -> Error {
        let owner = &state.clients[live.client as usize].name;
        if live.owned && !from_slice {
            return Error::invalid(format!(
                "pool `{}`: address {addr:#x} belongs to a PoolSlice of client `{owner}`; drop \
                 the slice to free it",
                self.name
            ));
        }
        let caller = caller.map_or_else(String::new, |c| {
            String::from(&*state.clients[c as usize].name)
        });
        Error::invalid(format!(
            "pool `{}`: client `{caller}` cannot free {addr:#x}: it belongs to client `{owner}`",
            self.name
        ))
    }

    /// Parks a block freed on another stream until `event` completes.
    #[cold]
    #[inline(never)]
    pub(in crate::pool) fn park(
        &self,
        state: &mut State,
        stream: StreamId,
        heap: Option<Arc<ThreadHeap>>,
        block: u32,
        bytes: usize,
        event: Box<dyn StreamEvent>,
    ) {
        let parked = Parked {
            heap,
            block,
            bytes,
            event,
            given_back: false,
            fenced: false,
        };
        self.park_entry(state, stream, parked);
    }

    /// Parks `parked` in `stream`'s queue.
    pub(in crate::pool) fn park_entry(&self, state: &mut State, stream: StreamId, parked: Parked) {
        self.flags.fetch_or(PARKED, Ordering::Relaxed);
        state.pending += parked.bytes;
        match state.parked.iter_mut().find(|(s, _)| *s == stream) {
            Some((_, queue)) => queue.push_back(parked),
            None => state.parked.push((stream, VecDeque::from([parked]))),
        }
    }
}

/// What a slice's free on another stream parks its block behind when no event could be
/// recorded there (see [`Shared::free_event`]): it never completes; its query fails with the
/// recording's error, so the block is set aside for good.
#[derive(Debug)]
struct Unrecorded(Error);

impl StreamEvent for Unrecorded {
    fn is_complete(&self) -> Result<bool, Error> {
        Err(self.0.clone())
    }
}
