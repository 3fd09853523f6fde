//! A heap's allocation and free paths: the fast paths under the heap's own lock, the slow
//! path under the pool's lock (more lease, serial numbers, a new span, mapping a growable
//! region's chunks), and the general path where a heap cannot serve.

use alloc::sync::Arc;
use core::sync::atomic::Ordering;

use super::{ClientShare, FEW_HEAPS, HeapState, SERIAL_BATCH, SHORT_SPANS, Span, ThreadHeap, keep};
use crate::error::Error;
use crate::pool::counters::Lease;
use crate::pool::engine::{Ask, EAGER, HEAP_SLOW, PAUSE, SINK, Shared, State};
use crate::pool::lock::LockGuard;
use crate::pool::tlsf::{self, GRANULE};
use crate::pool::{AllocRequest, reserved_bytes};

impl Shared {
    /// The common case on a thread heap: within its leases, a block found in its spans. It
    /// changes nothing unless it allocates; `None` sends the request to
    /// [`heap_allocate_slow`](Self::heap_allocate_slow).
    #[inline(always)]
    pub(in crate::pool) fn heap_allocate_fast(
        &self,
        heap: &ThreadHeap,
        ask: &Ask,
        owned: bool,
    ) -> Option<u64> {
        let (mut guard, reserved, class) = self.heap_guard(heap, ask)?;
        let h = &mut *guard;
        let share = h.clients.get_mut(ask.client as usize)?;
        if h.serials.0 == h.serials.1 {
            return None;
        }
        let fits = h.lease.fits(reserved) && share.lease.fits(reserved);
        if !(fits || self.refill(&mut h.lease, share, h.shard, reserved)) {
            return None;
        }
        let (block, addr) = h
            .tlsf
            .allocate_in_class(reserved as u64, class, ask.align as u64)?;
        // A growable region: memory behind the block, or the slow path maps it under the
        // pool's lock (a block split off a free one: merged back, the index as it was).
        if self.growable && !self.chunks.covers(addr, reserved as u64) {
            h.tlsf.free(block);
            return None;
        }
        HeapState::count(&mut h.lease, share, &mut h.serials, ask, reserved);
        h.record(ask, owned, block, addr);
        Some(addr)
    }

    /// Where an allocation on `heap` without the pool's lock starts: the bytes the request
    /// reserves (within the capacity) and the heap's lock, unless another thread holds it or
    /// a sink or tracking was switched on since the caller looked.
    #[inline(always)]
    fn heap_guard<'h>(
        &self,
        heap: &'h ThreadHeap,
        ask: &Ask,
    ) -> Option<(LockGuard<'h, HeapState>, usize, usize)> {
        // (`reserved_bytes` within the capacity, and the class's index.)
        let (reserved, class) = tlsf::request_class(ask.size as u64, self.max_request)?;
        // Held by another thread only while it takes leases back or gives spans back.
        let guard = heap.state.try_guard()?;
        // Checked again under the heap's lock: a sink switched on since is seen here, and a
        // thread that waits for this lock with the pool's ([`PAUSE`]).
        if self.flags.load(Ordering::Relaxed) & (HEAP_SLOW | PAUSE) != 0 {
            return None;
        }
        Some((guard, reserved as usize, class))
    }

    /// With exact peaks: takes what the heap's leases (the pool's, `share`'s) lack for
    /// `reserved` more bytes from the spare headroom, without the pool's lock; whether both
    /// fit now. (What one of them took stays with it if the other cannot be filled.)
    #[cold]
    #[inline(never)]
    pub(super) fn refill(
        &self,
        lease: &mut Lease,
        share: &mut ClientShare,
        shard: usize,
        reserved: usize,
    ) -> bool {
        // (Before the pool first told it what to keep, a heap asks the pool.)
        if !self.exact_peaks || lease.keep == 0 {
            return false;
        }
        if !lease.fits(reserved) && !lease.refill(&self.spare, shard, reserved) {
            return false;
        }
        if share.lease.fits(reserved) {
            return true;
        }
        match &share.spare {
            Some(spare) => share.lease.refill(spare, shard, reserved),
            None => false,
        }
    }

    /// With exact peaks: gives what the heap's leases hold beyond what they keep back to the
    /// spare headroom, without the pool's lock.
    #[cold]
    #[inline(never)]
    pub(super) fn give_back(&self, lease: &mut Lease, share: &mut ClientShare, shard: usize) {
        if lease.hoards() {
            lease.give_back(&self.spare, shard);
        }
        if let (true, Some(spare)) = (share.lease.hoards(), &share.spare) {
            share.lease.give_back(spare, shard);
        }
    }

    /// An allocation on a thread heap that its fast path could not make.
    #[cold]
    #[inline(never)]
    pub(in crate::pool) fn heap_allocate_slow(&self, ask: &Ask, owned: bool) -> Result<u64, Error> {
        if let Some(Some(addr)) = self.on_thread_heap(ask.stream, |heap| {
            self.heap_allocate_merging(heap, ask, owned)
        }) {
            return Ok(addr);
        }
        let mut state = self.lock()?;
        if !state.parked.is_empty() {
            // The heaps do not stop for parked blocks: they come back here.
            self.reclaim_parked(&mut state);
        }
        let req = AllocRequest::new(ask.size, ask.align).on(ask.stream);
        let result = match self.usable_thread_heap(ask.stream) {
            Some(heap) => self.heap_allocate_locked(&mut state, &heap, ask, owned),
            None => self.allocate_general(&mut state, ask.client, &req, ask.stream, owned, None),
        };
        let result = self.unlock_and_deliver(state, result);
        if result.is_ok() {
            return result;
        }
        self.allocate_failed(ask.client, req, owned, result)
    }

    /// A heap at its bound whose fast path found no block: merges what waits in its reuse
    /// cache, the oldest half at a time, and looks again, as
    /// [`heap_allocate_locked`](Self::heap_allocate_locked) would, but under the heap's own
    /// lock alone. Merging is the heap's own work, often hundreds of blocks; under the pool's
    /// lock it made the other heaps' slow paths (leases, serial numbers, spans) wait for it:
    /// with eight threads in the pool benchmark, merges took about 85% of the instructions run
    /// under that lock. `None` (the heap as it was, but for what was merged) where the heap
    /// is within its bound (it takes a new span instead), needs more lease or serial numbers,
    /// or finds nothing after merging: the locked path decides.
    #[cold]
    #[inline(never)]
    fn heap_allocate_merging(&self, heap: &ThreadHeap, ask: &Ask, owned: bool) -> Option<u64> {
        let (mut guard, reserved, _) = self.heap_guard(heap, ask)?;
        let h = &mut *guard;
        let share = h.clients.get_mut(ask.client as usize)?;
        if h.retired || h.serials.0 == h.serials.1 || h.tlsf.cached().1 == 0 {
            return None;
        }
        // (With exact peaks, from the spare headroom, as the fast path does.)
        let fits = h.lease.fits(reserved) && share.lease.fits(reserved);
        if !(fits || self.refill(&mut h.lease, share, h.shard, reserved)) {
            return None;
        }
        // (The bound changes under the pool's lock only as heaps come and go; a stale one
        // decides no more than whether to merge or to ask for a span.)
        let bound = self.heap_bound() as u64;
        if h.tlsf.free_bytes() + self.span_bytes(bound) <= bound {
            return None;
        }
        let (size, align) = (reserved as u64, ask.align as u64);
        let high_water = h.high_water.max((h.lease.used + reserved) as u64);
        h.tlsf
            .set_cache_limit(self.heap_cache_limit(high_water, bound));
        let taken = h.tlsf.allocate(size, align);
        let (block, addr) = taken.or_else(|| merge_cache_for(h, size, align))?;
        // A growable region's chunks are mapped under the pool's lock: the locked path finds
        // the block again and maps it.
        if self.growable && !self.chunks.covers(addr, size) {
            h.tlsf.free(block);
            return None;
        }
        let share = &mut h.clients[ask.client as usize];
        HeapState::count(&mut h.lease, share, &mut h.serials, ask, reserved);
        h.record(ask, owned, block, addr);
        h.high_water = high_water;
        Some(addr)
    }

    /// With the pool's lock held: an allocation on `heap`, with more lease, serial numbers or
    /// a new span as needed; the general path (on the pool's own index) where the heap cannot
    /// serve, which decides and reports as without heaps.
    pub(in crate::pool) fn heap_allocate_locked(
        &self,
        state: &mut State,
        heap: &Arc<ThreadHeap>,
        ask: &Ask,
        owned: bool,
    ) -> Result<u64, Error> {
        let general = |state: &mut State| {
            let req = AllocRequest {
                size: ask.size,
                align: ask.align,
                stream: Some(ask.stream),
                tag: None,
            };
            self.allocate_general(state, ask.client, &req, ask.stream, owned, None)
        };
        if self.flags.load(Ordering::Relaxed) & HEAP_SLOW != 0 {
            return general(state);
        }
        let Some(reserved) = reserved_bytes(ask.size).filter(|&r| r <= self.capacity) else {
            return general(state);
        };
        // During a graph reservation's capture on the heap's stream, the stream's requests take
        // the pool's index, which knows captures (see `open_graph`): the heap takes no span.
        if heap.stream != self.home
            && state.heaps_barred_on(heap.stream, || self.capturing(heap.stream))
        {
            return general(state);
        }
        let mut guard = heap.state.lock_wait();
        let h = &mut *guard;
        if h.retired {
            drop(guard);
            return general(state);
        }
        let client = ask.client as usize;
        if h.clients.len() <= client {
            h.clients.resize(client + 1, ClientShare::default());
        }
        if h.serials.0 == h.serials.1 {
            h.serials = (state.next_serial, state.next_serial + SERIAL_BATCH);
            state.next_serial += SERIAL_BATCH;
        }
        if self.exact_peaks {
            // What the heap keeps follows the peak and the number of heaps.
            h.lease.keep = keep(state.counts.peak, state.heaps.len());
            if h.clients[client].spare.is_some() {
                let c = &state.clients[client];
                h.clients[client].lease.keep = keep(c.counts.peak, c.heaps);
            }
        }
        // The block first: a lease may raise a peak, which only an allocation may do.
        let (size, align) = (reserved as u64, ask.align as u64);
        let hits = h.tlsf.reused();
        let bound = self.heap_bound() as u64;
        // The mark counts this request once it is made: a refused one was never in use.
        let high_water = h.high_water.max((h.lease.used + reserved) as u64);
        h.tlsf
            .set_cache_limit(self.heap_cache_limit(high_water, bound));
        let mut taken = h.tlsf.allocate(size, align);
        // Within its bound a heap grows (a span: one visit here); at its bound it merges what
        // waits in its cache, the oldest half at a time, and looks again.
        // Home-stream heaps step aside where nothing serves the request and the pool's index
        // has no room for a span (see `HeapBar`), unless every thread gets a heap: such a
        // heap takes no smaller span, and after merging its cache does not look again.
        let home = self.heap_stream(self.home);
        let step_aside = heap.stream == home
            && self.flags.load(Ordering::Relaxed) & EAGER == 0
            && (state.heap_bar.most <= FEW_HEAPS || state.counts.peak > self.capacity / 2);
        // A span from the pool's index for the request; `short`: whether heaps step aside.
        let span = |state: &mut State, h: &mut HeapState, short: &mut bool| {
            self.add_span(state, heap, h, size, align, step_aside.then_some(short))
        };
        let mut short = false;
        if taken.is_none() && h.tlsf.free_bytes() + self.span_bytes(bound) <= bound {
            taken = span(state, h, &mut short);
        }
        if taken.is_none() {
            taken = merge_cache_for(h, size, align);
        }
        if taken.is_none() && !short {
            taken = span(state, h, &mut short);
        }
        let Some((block, addr)) = taken else {
            drop(guard);
            if short {
                self.step_aside(state);
            }
            return general(state);
        };
        // A growable region: memory behind the block before anything is counted (a request
        // that fails raises no peak).
        let mapped = self.growable && !self.chunks.covers(addr, size);
        let (block, addr) = if mapped {
            match self.heap_map_block(state, h, block, addr, size, align) {
                Ok(taken) => taken,
                Err(error) => {
                    h.tlsf.forget_reused(hits);
                    drop(guard);
                    // Out of memory for new chunks: the general path looks again with every
                    // heap's mapped free memory given back, and decides.
                    if let Error::OutOfMemory { .. } = error {
                        return general(state);
                    }
                    return Err(self.allocation_failed(state, ask, None, error));
                }
            }
        } else {
            (block, addr)
        };
        if !h.clients[client].lease.fits(reserved)
            && !self.grant_client(state, heap, h, ask.client, reserved)
        {
            // Over the quota: the general path takes every lease back and says so exactly.
            if mapped {
                // A block split from a free one (a cached block is mapped): merged back, and
                // what was mapped for it is unmapped again, so that a refused request maps
                // nothing. (Only chunks inside the block's span: no other heap and not the
                // pool's index allocate there, and this heap is locked.)
                h.tlsf.free(block);
                let within = h
                    .spans
                    .iter()
                    .find(|s| s.addr <= addr && addr - s.addr < s.size);
                if let Some(span) = within {
                    // SAFETY: the block is merged back; the span is this heap's (the pool's
                    // index and other heaps allocate elsewhere), and the heap has been locked
                    // since the `ensure` that mapped for the block, with the pool's lock held:
                    // no other block in the span was handed out since, nor can be before both
                    // locks are released.
                    unsafe { state.mapping.undo_last(addr, size, (span.addr, span.size)) };
                }
            } else {
                h.tlsf.release(block);
            }
            h.tlsf.forget_reused(hits);
            drop(guard);
            return general(state);
        }
        // The pool's lease is always granted: the block is there, so the bytes are.
        if !h.lease.fits(reserved) {
            self.grant_pool(state, heap, h, reserved);
        }
        let share = &mut h.clients[client];
        HeapState::count(&mut h.lease, share, &mut h.serials, ask, reserved);
        h.record(ask, owned, block, addr);
        h.high_water = high_water;
        Ok(addr)
    }

    /// Maps the memory behind a block of a heap whose chunks are not all mapped, as
    /// [`map_block`](Shared::map_block) does for the pool's index: when that fails, the block
    /// goes back to the heap's index; if freed blocks wait in the heap's reuse cache (all of
    /// them mapped), they are merged and the request looks once more. When that fails too,
    /// the heap is as it was (but for the merged cache) and the error fails the request.
    #[cold]
    #[inline(never)]
    pub(super) fn heap_map_block(
        &self,
        state: &mut State,
        h: &mut HeapState,
        block: u32,
        addr: u64,
        size: u64,
        align: u64,
    ) -> Result<(u32, u64), Error> {
        let Err(error) = state.mapping.ensure(addr, size) else {
            return Ok((block, addr));
        };
        h.tlsf.free(block);
        if h.tlsf.cached().1 == 0 {
            return Err(error);
        }
        h.tlsf.flush();
        let Some((block, addr)) = h.tlsf.allocate(size, align) else {
            return Err(error);
        };
        if !self.chunks.covers(addr, size) {
            if let Err(error) = state.mapping.ensure(addr, size) {
                h.tlsf.free(block);
                return Err(error);
            }
        }
        Ok((block, addr))
    }

    /// Takes a span for `heap` from the pool's index, large enough for `size` bytes at
    /// `align`, and allocates those there. Where the index has no room for a span of the
    /// usual size, it takes one just large enough for the request, if there is room; but a
    /// heap that may step aside (`short` given, see `HeapBar`) sets it instead when the index
    /// has fewer free bytes than [`SHORT_SPANS`] such spans, and when the smaller one does
    /// not fit either.
    pub(super) fn add_span(
        &self,
        state: &mut State,
        heap: &Arc<ThreadHeap>,
        h: &mut HeapState,
        size: u64,
        align: u64,
        short: Option<&mut bool>,
    ) -> Option<(u32, u64)> {
        let fit = tlsf::guaranteed_fit(size, align)?;
        // A heap of another stream hands the span's blocks out on its stream: as for any block
        // of the pool's index handed out for another stream, that stream first waits for the
        // home stream's frees (when it cannot, the request goes the general way, which says
        // why).
        if let Some(streams) = &self.streams {
            if heap.stream != self.home {
                self.order_after_home(state, &**streams, heap.stream, self.home)
                    .ok()?;
            }
        }
        let mut span = self.span_bytes(self.heap_bound() as u64).max(fit);
        // A block taken from the pool's index, for a thread heap.
        let mut taken = state.tlsf.allocate(span, GRANULE);
        if taken.is_none() {
            state.tlsf.flush();
            taken = state.tlsf.allocate(span, GRANULE);
        }
        // Near the capacity (the index's free bytes under `SHORT_SPANS` spans), a heap that
        // may step aside takes no smaller span: the index is short (see `HeapBar`). Elsewhere
        // (free bytes in pieces smaller than a span) it takes one just large enough.
        if taken.is_none() && state.tlsf.free_bytes() < SHORT_SPANS * span {
            if let Some(short) = short {
                *short = true;
                return None;
            }
        }
        if taken.is_none() && span > fit {
            span = fit;
            // A block taken from the pool's index, for a thread heap.
            taken = state.tlsf.allocate(span, GRANULE);
        }
        let Some((block, addr)) = taken else {
            // Not even that: short too.
            if let Some(short) = short {
                *short = true;
            }
            return None;
        };
        let first = h.tlsf.add_span(addr, span);
        h.spans.push(Span {
            addr,
            size: span,
            first,
            block,
        });
        state.spans.insert(addr, (span, heap.clone()));
        self.spans_changed();
        h.tlsf.allocate(size, align)
    }

    /// The common case of a free on a thread heap: a live allocation of the heap that `caller`
    /// may free. `None` sends the free on (to the pool's fast path, then the general path);
    /// `Some(true)` when the heap keeps more free bytes than it should (see
    /// [`shrink`](Self::shrink)).
    #[inline(always)]
    pub(in crate::pool) fn heap_deallocate_fast(
        &self,
        heap: &ThreadHeap,
        caller: Option<u32>,
        addr: u64,
        from_slice: bool,
    ) -> Option<bool> {
        let mut guard = heap.state.try_guard()?;
        self.heap_free_locked(&mut guard, caller, addr, from_slice)
    }

    /// A free on a heap whose lock the caller holds (its own thread's, or another thread's
    /// free, see `remote`): a live allocation of the heap that `caller` may free, with no sink
    /// on. `None` changes nothing; `Some(true)` when the heap keeps more free bytes or lease
    /// than it should (see [`shrink`](Self::shrink)).
    #[inline(always)]
    pub(super) fn heap_free_locked(
        &self,
        h: &mut HeapState,
        caller: Option<u32>,
        addr: u64,
        from_slice: bool,
    ) -> Option<bool> {
        // A free made after a sink was switched on is logged (see `set_sink`); with `PAUSE`,
        // another thread waits for this lock with the pool's.
        if self.flags.load(Ordering::Relaxed) & (SINK | PAUSE) != 0 {
            return None;
        }
        let (slot, block) = h.live.find_entry(addr)?;
        let live = h.meta[block as usize];
        if (live.owned && !from_slice) || caller.is_some_and(|caller| caller != live.client) {
            return None;
        }
        h.live.remove_at(slot);
        let reserved = h.tlsf.release(block) as usize;
        h.uncount(&live, reserved);
        Some(self.after_free(h, live.client))
    }

    /// What follows every free on a heap, of a block of `client`'s: a heap gives back leases
    /// it does not use, now and then, with exact peaks to the spare headroom (here, without
    /// the pool's lock). Whether it should [`shrink`](Self::shrink): it keeps more free bytes
    /// than its bound, or without exact peaks more lease than it keeps.
    #[inline(always)]
    fn after_free(&self, h: &mut HeapState, client: u32) -> bool {
        let over = h.tlsf.free_bytes() > self.heap_bound() as u64;
        let share = &mut h.clients[client as usize];
        let hoarding = if self.exact_peaks {
            if h.lease.hoards() || share.lease.hoards() {
                self.give_back(&mut h.lease, share, h.shard);
            }
            false
        } else {
            // (`keep` is set by every grant without exact peaks, see `lease_keep`.)
            h.lease.hoards() || share.lease.hoards()
        };
        over || hoarding
    }

    /// After a free on `heap` under the pool's lock, what the heap's own free does afterwards
    /// ([`after_free`](Self::after_free), then [`shrink`](Self::shrink) where it says so). (A
    /// free that found the heap's own path closed, by a sink or by [`PAUSE`], would otherwise
    /// leave them until the heap's next free of its own.) No shrink for a heap of another
    /// stream: giving its blocks back records an event, a call into the stream runtime that
    /// this path makes with no heap locked.
    pub(in crate::pool) fn settle_locked(
        &self,
        state: &mut State,
        heap: &Arc<ThreadHeap>,
        h: &mut HeapState,
        client: u32,
    ) {
        let other_stream = self.streams.is_some() && heap.stream != self.home;
        if self.after_free(h, client) && !other_stream {
            self.shrink_locked(state, heap, h);
        }
    }
}

/// Merges what waits in a heap's reuse cache, the oldest half at a time, until a block of
/// `size` bytes at `align` is found (taken) or the cache is empty.
fn merge_cache_for(h: &mut HeapState, size: u64, align: u64) -> Option<(u32, u64)> {
    while h.tlsf.cached().1 > 0 {
        let half = h.tlsf.cached().0.div_ceil(2);
        h.tlsf.evict_oldest(half);
        if let Some(taken) = h.tlsf.allocate(size, align) {
            return Some(taken);
        }
    }
    None
}
