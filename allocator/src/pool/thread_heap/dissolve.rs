//! Giving spans back: a heap shrinking to its bound, and every heap dissolving into the
//! pool's index (before a refusal, a trim, a thread's exit), live blocks kept at their addresses.

use alloc::sync::Arc;
use alloc::vec::Vec;

use super::{ClientShare, HeapState, ThreadHeap};
use crate::pool::counters::Lease;
use crate::pool::engine::{Shared, State, grow_meta};
use crate::pool::stream::{SharedEvent, StreamId};
use crate::pool::tlsf::Piece;

/// How the free blocks of a heap's spans reach the pool's index (see
/// [`Shared::give_back_mode`]).
pub(super) enum GiveBack {
    /// Free at once: the heap serves the home stream, or the home stream waits for its own.
    Free,
    /// Parked until the event, on the heap's stream, completes.
    Park(SharedEvent),
    /// A home-stream heap's free blocks given back while a wait for the home stream runs
    /// outside the lock ([`State::home_fences`](crate::pool::engine::State)): parked behind an
    /// event recorded on the home stream now, which that wait does not cover, as a free on the
    /// home stream is then; a request that would fail without them takes them back at once
    /// (see [`Shared::take_fenced`]). Freed at once instead, they
    /// would move the home stream's epoch and send the waiting side round again: an
    /// allocation for a capturing stream failed after three waits in each of which a thread
    /// exited.
    Fenced(SharedEvent),
}

impl Shared {
    /// Gives back what a heap keeps beyond its bound: spans nothing uses, whole; then the
    /// spans with the most free bytes, in pieces. Without exact peaks, also its leases'
    /// headroom beyond what they keep ([`lease_keep`](Shared::lease_keep)).
    #[cold]
    #[inline(never)]
    pub(in crate::pool) fn shrink(&self, stream: StreamId) {
        let Some(heap) = self.thread_heap(stream) else {
            return;
        };
        let heap = &heap;
        let Ok(mut state) = self.lock() else {
            return;
        };
        let mut guard = heap.state.lock_wait();
        self.shrink_locked(&mut state, heap, &mut guard);
    }

    /// [`shrink`](Self::shrink), with the pool's lock and `heap`'s held.
    pub(in crate::pool) fn shrink_locked(
        &self,
        state: &mut State,
        heap: &Arc<ThreadHeap>,
        h: &mut HeapState,
    ) {
        if h.retired {
            return;
        }
        if !self.exact_peaks {
            // Leases beyond what they keep go back (see `lease_keep`).
            let back = h.lease.slack().saturating_sub(h.lease.keep);
            h.lease.cap -= back;
            state.counts.unlease(back);
            for (c, share) in h.clients.iter_mut().enumerate() {
                let back = share.lease.slack().saturating_sub(share.lease.keep);
                share.lease.cap -= back;
                state.clients[c].counts.unlease(back);
            }
        }
        let bound = self.heap_bound() as u64;
        if h.tlsf.free_bytes() <= bound {
            return;
        }
        h.tlsf.flush();
        let mode = self.give_back_mode(heap, false, true, state.home_fences > 0);
        let target = bound / 2;
        let mut i = 0;
        while i < h.spans.len() && h.tlsf.free_bytes() > target {
            let span = h.spans[i];
            if h.tlsf.take_span(span.first) {
                h.spans.swap_remove(i);
                state.spans.remove(&span.addr);
                self.give_back_block(state, heap, span.block, span.size, &mode);
            } else {
                i += 1;
            }
        }
        while h.tlsf.free_bytes() > target && !h.spans.is_empty() {
            let i = (0..h.spans.len())
                .max_by_key(|&i| h.span_free(i))
                .unwrap_or(0);
            self.dissolve_span(state, heap, h, i, &mode);
        }
        self.spans_changed();
        if self.streams.is_some() && matches!(mode, GiveBack::Free) {
            // Blocks freed on the home stream (or ordered before it) reach the pool's index.
            state.home_epoch += 1;
        }
    }

    /// How the free blocks of `heap`'s spans reach the pool's index when it gives them back.
    /// The pool's index hands its blocks out as blocks freed on the home stream (see
    /// [`stream`](crate::pool::stream)), so a heap of the home stream (or any heap without a
    /// stream runtime) gives them back as they are. A heap of another stream: with `order`
    /// (a request would fail, or a trim, for want of them) the home stream is made to wait for
    /// the heap's stream and they are free at once, a wait the driver adds and that blocks no
    /// thread; otherwise, or when that wait cannot be made (a stream capturing a graph), they
    /// are parked until an event on the heap's stream completes, recorded now, or at the first
    /// look once the stream no longer captures.
    /// (`free`: whether the spans hold free bytes; without them nothing needs either.)
    /// `fenced`: a wait for the home stream runs outside the lock (see [`GiveBack::Fenced`]).
    pub(super) fn give_back_mode(
        &self,
        heap: &ThreadHeap,
        order: bool,
        free: bool,
        fenced: bool,
    ) -> GiveBack {
        let Some(streams) = &self.streams else {
            return GiveBack::Free;
        };
        if heap.stream == self.home && free && fenced {
            // (Where no event can be recorded, they are freed: the waiting side looks again.)
            if let Ok(event) = self.record_event(&**streams, self.home) {
                return GiveBack::Fenced(SharedEvent::new(
                    streams.clone(),
                    self.home,
                    Some(event),
                    self.state.id(),
                ));
            }
        }
        if heap.stream == self.home || !free {
            return GiveBack::Free;
        }
        if order
            && self
                .stream_call("order_after", || {
                    streams.order_after(self.home, heap.stream)
                })
                .is_ok()
        {
            return GiveBack::Free;
        }
        let event = self.record_event(&**streams, heap.stream).ok();
        GiveBack::Park(SharedEvent::new(
            streams.clone(),
            heap.stream,
            event,
            self.state.id(),
        ))
    }

    /// A free block of the pool's index that held free bytes of `heap`: freed, or parked, as
    /// `mode` says.
    fn give_back_block(
        &self,
        state: &mut State,
        heap: &ThreadHeap,
        block: u32,
        size: u64,
        mode: &GiveBack,
    ) {
        match mode {
            GiveBack::Free => {
                state.tlsf.free(block);
            }
            GiveBack::Park(event) => {
                let parked = event.park(block, size as usize, false);
                self.park_entry(state, heap.stream, parked);
            }
            GiveBack::Fenced(event) => {
                let parked = event.park(block, size as usize, true);
                self.park_entry(state, self.home, parked);
            }
        }
    }

    /// Gives span `i` of `heap` back in pieces (the heap's cache flushed): its blocks become
    /// blocks of the pool's index, the free ones merged there (or parked, as `mode` says);
    /// live allocations in it carry on in the pool's index, at their addresses, with their
    /// counts; parked blocks wait there.
    pub(super) fn dissolve_span(
        &self,
        state: &mut State,
        heap: &Arc<ThreadHeap>,
        h: &mut HeapState,
        i: usize,
        mode: &GiveBack,
    ) {
        let span = h.spans.swap_remove(i);
        state.spans.remove(&span.addr);
        let mut pieces: Vec<Piece> = Vec::new();
        h.tlsf.export_span(span.first, &mut pieces);
        debug_assert_eq!(pieces.iter().map(|p| p.size).sum::<u64>(), span.size);
        // Free pieces to be parked are carved as used blocks.
        let parking = matches!(mode, GiveBack::Park(_) | GiveBack::Fenced(_));
        let park: Vec<bool> = pieces
            .iter_mut()
            .map(|p| {
                let park = p.free && parking;
                p.free &= !park;
                park
            })
            .collect();
        let mut carved = Vec::new();
        state.tlsf.carve(span.block, &pieces, &mut carved);
        let mut moved = Vec::new();
        for ((p, &block), &park) in pieces.iter().zip(&carved).zip(&park) {
            if park {
                self.give_back_block(state, heap, block, p.size, mode);
                continue;
            }
            if p.free {
                continue;
            }
            let reserved = p.size as usize;
            match h.live.find(p.addr) {
                Some(slot) if h.live.value_at(slot) == p.block => {
                    let live = h.meta[p.block as usize];
                    h.live.remove_at(slot);
                    // Its bytes move from the heap's leases to the pool's own counts (both in
                    // `in_use`).
                    h.lease.used -= reserved;
                    h.lease.cap -= reserved;
                    state.counts.leased -= reserved;
                    let share = &mut h.clients[live.client as usize];
                    share.lease.used -= reserved;
                    share.lease.cap -= reserved;
                    share.requested -= live.size;
                    let counts = &mut state.clients[live.client as usize].counts;
                    counts.leased -= reserved;
                    counts.requested += live.size;
                    state.live.insert_new(p.addr, block);
                    if state.meta.len() <= block as usize {
                        grow_meta(&mut state.meta, block as usize);
                    }
                    state.meta[block as usize] = live;
                }
                // Parked (or set aside for good): it stays used, now in the pool's index.
                _ => moved.push((p.block, block)),
            }
        }
        if !moved.is_empty() {
            for (_, queue) in state.parked.iter_mut() {
                for parked in queue.iter_mut() {
                    let Some(owner) = &parked.heap else {
                        continue;
                    };
                    if !Arc::ptr_eq(owner, heap) {
                        continue;
                    }
                    if let Some(&(_, block)) = moved.iter().find(|(from, _)| *from == parked.block)
                    {
                        parked.heap = None;
                        parked.block = block;
                    }
                }
            }
        }
    }

    /// Gives every span of `heap` back and folds its counts into the pool's: the heap is empty
    /// afterwards, and everything it held is in the pool's index. (The span directory still
    /// names the heap's spans until the caller publishes them: it is a hint.)
    /// `order`: see [`give_back_mode`](Self::give_back_mode).
    pub(in crate::pool) fn dissolve(
        &self,
        state: &mut State,
        heap: &Arc<ThreadHeap>,
        h: &mut HeapState,
        order: bool,
    ) {
        if !h.spans.is_empty() {
            h.tlsf.flush();
            let fenced = state.home_fences > 0;
            let mode = self.give_back_mode(heap, order, h.tlsf.free_bytes() > 0, fenced);
            while !h.spans.is_empty() {
                let last = h.spans.len() - 1;
                self.dissolve_span(state, heap, h, last, &mode);
            }
            if self.streams.is_some() && matches!(mode, GiveBack::Free) {
                // Blocks freed on the home stream (or ordered before it) reach the pool's
                // index.
                state.home_epoch += 1;
            }
        }
        debug_assert_eq!((h.lease.used, h.live.len()), (0, 0));
        state.counts.unlease(h.lease.cap);
        // What it keeps stays: it is the pool's figure, not the heap's.
        h.lease = Lease {
            keep: h.lease.keep,
            ..Lease::default()
        };
        for (c, share) in h.clients.iter_mut().enumerate() {
            let counts = &mut state.clients[c].counts;
            counts.unlease(share.lease.cap);
            counts.allocations += share.allocations;
            counts.frees += share.frees;
            *share = ClientShare::default();
        }
        state.reused += h.tlsf.take_reused();
        h.serials = (0, 0);
        if let Some(entry) = state.entry(heap) {
            let listed = core::mem::take(&mut entry.clients);
            for c in listed {
                state.clients[c as usize].heaps -= 1;
            }
        }
    }

    /// Gives every heap back ([`dissolve`](Self::dissolve)) and the spare headroom; the heaps
    /// stay with their threads, empty. Every heap stays locked until the spares are drained
    /// (a heap takes from a spare under its own lock only), so that no heap holds a lease
    /// afterwards and every count is the pool's own. `order`: see
    /// [`give_back_mode`](Self::give_back_mode).
    pub(in crate::pool) fn dissolve_all(&self, state: &mut State, order: bool) {
        self.dissolve_where(state, order, |_| true, Self::drain_spares);
    }

    /// Gives back every heap of `stream`, as [`dissolve_all`](Self::dissolve_all) does for
    /// every heap: a graph reservation opens on the stream. The heaps stay with their threads,
    /// empty.
    pub(in crate::pool) fn dissolve_stream_heaps(&self, state: &mut State, stream: StreamId) {
        let key = self.heap_stream(stream);
        self.dissolve_where(state, false, |heap| heap.stream == key, |_, _| {});
    }

    /// [`dissolve`](Self::dissolve)s the heaps `which` picks, all locked at once, publishes the
    /// spans once for all (what a caller of `dissolve` does), and runs `then` before their
    /// locks are released.
    fn dissolve_where(
        &self,
        state: &mut State,
        order: bool,
        which: impl Fn(&ThreadHeap) -> bool,
        then: impl FnOnce(&Self, &mut State),
    ) {
        let heaps: Vec<Arc<ThreadHeap>> = state
            .heaps
            .iter()
            .filter(|e| which(&e.heap))
            .map(|e| e.heap.clone())
            .collect();
        let mut guards = self.lock_heaps(&heaps);
        for (heap, guard) in heaps.iter().zip(guards.iter_mut()) {
            self.dissolve(state, heap, guard, order);
        }
        self.spans_changed();
        then(self, state);
        drop(guards);
    }

    /// Before a request fails for want of them: the free blocks that heaps of other streams
    /// gave back parked (a heap over its bound, a thread's exit, or because a
    /// stream captured then) become free at once wherever the home stream can now be made to
    /// wait for their stream, as a refusal does with the spans heaps still hold. Whether any
    /// did.
    pub(in crate::pool) fn order_given_back(&self, state: &mut State) -> bool {
        let Some(streams) = &self.streams else {
            return false;
        };
        let waiting: Vec<StreamId> = state
            .parked
            .iter()
            .filter(|(_, queue)| queue.iter().any(|p| p.given_back))
            .map(|(stream, _)| *stream)
            .collect();
        let mut freed = false;
        for stream in waiting {
            if self
                .stream_call("order_after", || streams.order_after(self.home, stream))
                .is_err()
            {
                continue;
            }
            let State {
                parked,
                tlsf,
                pending,
                ..
            } = &mut *state;
            if let Some((_, queue)) = parked.iter_mut().find(|(s, _)| *s == stream) {
                queue.retain(|p| {
                    if p.given_back {
                        tlsf.free(p.block);
                        *pending -= p.bytes;
                    }
                    !p.given_back
                });
            }
            state.home_epoch += 1;
            freed = true;
        }
        self.forget_empty_queues(state);
        freed
    }

    /// Takes the spare headroom of the pool and of every client back into their counts
    /// (the caller holds the lock of every heap that may take from them, or there is none).
    pub(super) fn drain_spares(&self, state: &mut State) {
        state.counts.unlease(self.spare.drain());
        for client in state.clients.iter_mut() {
            client.counts.unlease(client.spare.drain());
        }
    }

    /// The heap that holds the span around `addr`, if any.
    pub(in crate::pool) fn span_owner(state: &State, addr: u64) -> Option<Arc<ThreadHeap>> {
        let (&start, (size, heap)) = state.spans.range(..=addr).next_back()?;
        (addr - start < *size).then(|| heap.clone())
    }
}
