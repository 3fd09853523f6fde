//! Thread heaps: a heap of its own for each thread that found the pool's lock taken, so that
//! threads sharing a pool stop serializing on that lock.
//!
//! A thread heap is an index ([`Tlsf`]) over *spans*, pieces of the region it took from the
//! pool's index, each one used block there. The thread allocates and frees in its spans under a
//! lock of its own, which only it takes in the common case, so the pool's lock and the cache
//! lines of the pool's state stay out of its way. A thread that never meets another on the
//! pool's lock never gets one (unless the pool gives every thread one, `eager_thread_heaps`):
//! a pool used by one thread at a time works as it did without them, block for block.
//!
//! What users rely on holds exactly, heaps or not:
//!
//! * **The hard cap.** Before a request fails, every heap, other threads' included, gives its
//!   spans back ([`Shared::dissolve`]): a span nothing uses goes back whole; any other is cut in
//!   the pool's index into the blocks the heap made, live ones at their addresses, free ones
//!   merged with their free neighbours. Afterwards the pool's index is what it would be had it
//!   made every block itself, so a request that would succeed with every heap given back does
//!   succeed.
//! * **Quotas and the peak.** A heap allocates within *leases*, one for the pool and one per
//!   client ([`Lease`]): bytes it may hold without asking. The pool counts leases as in use
//!   and keeps `in_use ≤ peak` (and `peak ≤ quota` for a client), so an allocation within a
//!   lease can set no new peak and pass no quota. Headroom that no heap holds is leased to a
//!   [`Spare`] (the pool's, and one per client), counted as in use like any lease: a heap
//!   short of lease takes what it needs from the spare, and a little more to keep, with one
//!   compare-and-swap and without the pool's lock, and gives back to it what it holds beyond
//!   a few times that (the amount kept follows the peak and the number of heaps). Moving
//!   headroom between a heap and a spare changes no count. Where the spare runs short the
//!   heap asks the pool; where the headroom under the peak is gone, the pool first takes back
//!   every lease's unused part and the spare, with every heap that may touch them locked
//!   (heaps touch a spare only under their own lock), and only then raises the peak (to
//!   exactly what is in use) or refuses the quota; the headroom left goes to the spare. Every
//!   path that needs exact counts (statistics, a refusal, the pool's own index where the
//!   counts leave no headroom) drains the spares the same way, or draws from them. Without
//!   exact peaks (`exact_peaks(false)`), a heap takes a chunk of headroom beyond its need,
//!   raising the peak where there is none, and gives back what it holds beyond two chunks to
//!   the pool: the peaks count leases, quotas stay exact.
//! * **Statistics, leak reports, the event log.** Counts that add up (bytes, allocations,
//!   frees) are kept per heap and summed with every heap locked; the free blocks are described
//!   after every heap gave its spans back. Leak reports list every heap's live allocations.
//!   Tracking, event sinks, parked blocks and streams other than the home stream take the
//!   general path under the pool's lock, as before; a heap serves only home-stream requests
//!   while none of those is on, and checks that under its own lock, which
//!   [`set_sink`](Shared::set_sink) takes once after switching a sink on.
//! * **Stream order.** A heap's blocks are freed and handed out again on the home stream only;
//!   a free on another stream parks the block as before, and it returns to its heap when its
//!   event completes. Blocks reach the pool's index, and so other streams, only when spans go
//!   back, which counts as a home-stream free.
//! * **Growable regions.** A span is addresses: memory is mapped under it as blocks reach new
//!   chunks. The heap's fast path checks the chunk bits of each block it takes without the
//!   pool's lock ([`ChunkMap`](super::vmm::ChunkMap)); where a chunk is missing it gives the
//!   block back and maps under the pool's lock in
//!   [`heap_allocate_locked`](Shared::heap_allocate_locked), before anything is counted. A trim gives every heap back
//!   first and unmaps only chunks inside free blocks of the pool's index (never inside a span),
//!   so a chunk under a heap's span stays mapped while the heap holds the span.
//! * **Thread exit and pool drop.** The thread's heaps live in a thread-local list that holds
//!   each pool weakly: when the thread exits, each heap of a pool still alive is given back. A
//!   pool dropped first empties its heaps; the list then holds only an empty heap, dropped when
//!   the thread exits or looks up another pool.
//!
//! Locks are taken in one order: the pool's lock, then heap locks. A thread's fast path holds
//! only its own heap's lock (and touches a spare with atomic operations, which wait for no
//! one); every other path that locks a heap holds the pool's lock first, so no two threads
//! wait for each other's locks in opposite orders. No callback runs while a heap is locked by
//! its own thread's fast path.

use alloc::sync::{Arc, Weak};
use alloc::vec::Vec;
use core::cell::{Cell, RefCell};
use core::sync::atomic::Ordering;

use super::addr_map::AddrMap;
use super::counters::{Counters, Lease, Spare};
use super::engine::{Ask, HEAPS, Live, SINK, SLOW, Shared, State, grow_meta};
use super::lock::{Lock, LockGuard};
use super::tlsf::{self, GRANULE, Piece, Tlsf};
use super::{AllocRequest, reserved_bytes};
use crate::error::Error;

/// Serial numbers a heap takes from the pool at a time (numbers are for leak reports: gaps
/// are harmless, a visit to the pool's lock for them is not).
const SERIAL_BATCH: u64 = 1 << 16;
/// With exact peaks a heap keeps `1 / (KEEP_SHARE * heaps)` of the peak as headroom when it
/// takes or gives back headroom (at least [`MIN_KEEP`]): a sixteenth of what every heap
/// could keep together at [`GIVE_BACK`](super::counters::GIVE_BACK) times that, so that the
/// spare headroom rarely runs out while heaps rarely have to take or give.
const KEEP_SHARE: usize = 8;
const MIN_KEEP: usize = 64 << 10;
/// A heap takes spans of `1 / SPANS_PER_CAPACITY` of the capacity, within
/// `MIN_SPAN..=MAX_SPAN` and at most half its bound (a request may need more).
const SPANS_PER_CAPACITY: usize = 16;
const MIN_SPAN: usize = 64 << 10;
const MAX_SPAN: usize = 1 << 30;

/// One thread's heap for one pool.
pub(super) struct ThreadHeap {
    pub(super) state: Lock<HeapState>,
}

/// A thread heap as the pool lists it.
pub(super) struct HeapEntry {
    pub(super) heap: Arc<ThreadHeap>,
    /// The clients whose leases it has held since it was last given back: only these heaps
    /// are locked to take a client's leases back.
    pub(super) clients: Vec<u32>,
}

impl State {
    /// The pool's entry of `heap`.
    fn entry(&mut self, heap: &Arc<ThreadHeap>) -> Option<&mut HeapEntry> {
        self.heaps.iter_mut().find(|e| Arc::ptr_eq(&e.heap, heap))
    }
}

/// A span: a block of the pool's index that a heap uses as a region of its own.
#[derive(Debug, Clone, Copy)]
pub(super) struct Span {
    pub(super) addr: u64,
    pub(super) size: u64,
    /// Its first block in the heap's index (stable while the span is there).
    pub(super) first: u32,
    /// Its block in the pool's index.
    pub(super) block: u32,
}

/// A heap's share of one client: its lease and the counts of its allocations.
#[derive(Debug, Clone, Default)]
pub(super) struct ClientShare {
    pub(super) lease: Lease,
    pub(super) requested: usize,
    pub(super) allocations: u64,
    pub(super) frees: u64,
    /// The client's spare headroom, once the heap is listed as holding its leases (with
    /// exact peaks).
    pub(super) spare: Option<Arc<Spare>>,
}

/// Everything behind a heap's lock.
pub(super) struct HeapState {
    pub(super) tlsf: Tlsf,
    /// Address of every live allocation made in the heap → its block.
    pub(super) live: AddrMap,
    /// The live allocation in each block (indexed like the heap's blocks).
    pub(super) meta: Vec<Live>,
    pub(super) spans: Vec<Span>,
    /// The pool's lease.
    pub(super) lease: Lease,
    /// Each client's share, by client id (grown on demand).
    pub(super) clients: Vec<ClientShare>,
    /// Serial numbers the heap may give: `next..end`.
    pub(super) serials: (u64, u64),
    /// Given back for good (its thread exited, or the pool is being dropped).
    pub(super) retired: bool,
}

impl HeapState {
    fn new(base: u64, capacity: usize, cache_blocks: usize, cache_bytes: u64) -> Self {
        HeapState {
            tlsf: Tlsf::empty(base, capacity as u64, cache_blocks, cache_bytes),
            live: AddrMap::with_capacity(64),
            meta: Vec::new(),
            spans: Vec::new(),
            lease: Lease::default(),
            clients: Vec::new(),
            serials: (0, 0),
            retired: false,
        }
    }

    /// Counts an allocation of `reserved` bytes for `ask` in the leases (the pool's and the
    /// client's share) and takes its serial number (left in `serials.0 - 1`).
    #[inline(always)]
    fn count(
        lease: &mut Lease,
        share: &mut ClientShare,
        serials: &mut (u64, u64),
        ask: &Ask,
        reserved: usize,
    ) {
        lease.used += reserved;
        share.lease.used += reserved;
        share.requested += ask.size;
        share.allocations += 1;
        serials.0 += 1;
    }

    /// Records a counted allocation in `block` at `addr` for `ask`: address map and what is
    /// known about it.
    #[inline(always)]
    fn record(&mut self, ask: &Ask, owned: bool, block: u32, addr: u64) {
        let serial = self.serials.0 - 1;
        self.live.insert_new(addr, block);
        let slot = block as usize;
        if self.meta.len() <= slot {
            grow_meta(&mut self.meta, slot);
        }
        let entry = &mut self.meta[slot];
        entry.size = ask.size;
        entry.serial = serial;
        entry.stream = ask.stream;
        entry.client = ask.client;
        entry.align = ask.align as u16;
        entry.owned = owned;
        entry.tracked = false;
    }

    /// Removes the live allocation in `block` (out of the address map already) from the
    /// counts; `reserved`: its block's size.
    #[inline(always)]
    pub(super) fn uncount(&mut self, live: &Live, reserved: usize) {
        self.lease.used -= reserved;
        let share = &mut self.clients[live.client as usize];
        share.lease.used -= reserved;
        share.requested -= live.size;
        share.frees += 1;
    }

    /// Checks the heap's index against its spans (tests).
    #[cfg(test)]
    pub(super) fn check(&self) {
        let spans: Vec<(u64, u64)> = self.spans.iter().map(|s| (s.addr, s.size)).collect();
        self.tlsf.check_spans(&spans);
    }

    /// Free bytes in span `i` (the cache flushed).
    fn span_free(&self, i: usize) -> u64 {
        let mut pieces = Vec::new();
        self.tlsf.span_blocks(self.spans[i].first, &mut pieces);
        pieces.iter().filter(|p| p.free).map(|p| p.size).sum()
    }
}

// ---------------------------------------------------------------------------------------------
// The thread-local list of a thread's heaps.

/// A heap of this thread: the pool it belongs to, held weakly so that the list keeps no pool
/// alive.
struct Entry {
    pool: u64,
    shared: Weak<Shared>,
    heap: Arc<ThreadHeap>,
}

/// This thread's heaps, and the one looked up last.
struct ThreadHeaps {
    /// The pool looked up last and this thread's heap for it (null: none). The heap is one of
    /// `all`'s: `last` is reset before entries leave `all`.
    last: Cell<(u64, *const ThreadHeap)>,
    all: RefCell<Vec<Entry>>,
}

impl Drop for ThreadHeaps {
    fn drop(&mut self) {
        // The thread exits: each heap goes back to its pool, if the pool is still there.
        for entry in self.all.get_mut().drain(..) {
            if let Some(shared) = entry.shared.upgrade() {
                shared.retire(&entry.heap);
            }
        }
    }
}

std::thread_local! {
    static THREAD_HEAPS: ThreadHeaps = const {
        ThreadHeaps {
            last: Cell::new((0, core::ptr::null())),
            all: RefCell::new(Vec::new()),
        }
    };
}

/// Runs `f` on the calling thread's heap for pool `pool`; `None` when it has none (or is
/// exiting, or `reentrant` says it is inside a callback of that pool, where the pool must fail
/// instead).
#[inline(always)]
fn with_current<R>(
    pool: u64,
    reentrant: impl FnOnce() -> bool,
    f: impl FnOnce(&ThreadHeap) -> R,
) -> Option<R> {
    THREAD_HEAPS
        .try_with(|t| {
            let (id, heap) = t.last.get();
            let heap = if id == pool {
                heap
            } else {
                lookup(t, pool, reentrant)?
            };
            // SAFETY: `heap` comes from `Arc::as_ptr` of the `Arc` in an entry of `t.all`
            // (see `lookup` and `register`), and that entry stays in the list while `f`
            // runs: entries leave it only in `lookup`, for pools that are gone (this one is
            // not: the caller is a call on it), and when the thread exits (it is running).
            Some(f(unsafe { &*heap }))
        })
        .ok()
        .flatten()
}

/// Finds this thread's heap for `pool` in its list and makes it the one looked up last;
/// `None` (and nothing looked up last) when there is none, or inside a callback of that pool.
#[cold]
#[inline(never)]
fn lookup(
    t: &ThreadHeaps,
    pool: u64,
    reentrant: impl FnOnce() -> bool,
) -> Option<*const ThreadHeap> {
    t.last.set((0, core::ptr::null()));
    if reentrant() {
        return None;
    }
    let mut all = t.all.try_borrow_mut().ok()?;
    // Heaps of pools that are gone are empty: forget them.
    all.retain(|e| e.shared.strong_count() > 0);
    let heap = Arc::as_ptr(&all.iter().find(|e| e.pool == pool)?.heap);
    t.last.set((pool, heap));
    Some(heap)
}

/// This thread's heap for `pool`, shared (for the paths that keep it).
#[cold]
#[inline(never)]
fn current_arc(pool: u64) -> Option<Arc<ThreadHeap>> {
    THREAD_HEAPS
        .try_with(|t| {
            let all = t.all.try_borrow().ok()?;
            all.iter().find(|e| e.pool == pool).map(|e| e.heap.clone())
        })
        .ok()
        .flatten()
}

/// Adds `heap` to the calling thread's list; `false` when the thread is exiting.
fn register(pool: u64, shared: Weak<Shared>, heap: &Arc<ThreadHeap>) -> bool {
    THREAD_HEAPS
        .try_with(|t| {
            let Ok(mut all) = t.all.try_borrow_mut() else {
                return false;
            };
            all.push(Entry {
                pool,
                shared,
                heap: heap.clone(),
            });
            t.last.set((pool, Arc::as_ptr(heap)));
            true
        })
        .unwrap_or(false)
}

/// Forgets the heap looked up last, so that the next call of this thread looks its list up
/// (which fails inside a callback).
pub(super) fn forget_current() {
    let _ = THREAD_HEAPS.try_with(|t| t.last.set((0, core::ptr::null())));
}

/// A thread heap of a pool, its lock held.
pub(super) struct Locked<'a> {
    pub(super) state: LockGuard<'a, HeapState>,
}

// ---------------------------------------------------------------------------------------------
// The heap paths of the pool.

/// The headroom a heap keeps of a peak of `peak` bytes that `heaps` heaps share (see
/// [`KEEP_SHARE`]).
fn keep(peak: usize, heaps: usize) -> usize {
    (peak / (KEEP_SHARE * heaps.max(1))).max(MIN_KEEP)
}

impl Shared {
    /// A heap's share of the free bytes the heaps may keep.
    #[inline(always)]
    fn heap_bound(&self) -> usize {
        self.heap_bound.load(Ordering::Relaxed)
    }

    /// Shares the heaps' bound among the heaps there are now.
    fn share_heap_bytes(&self, state: &State) {
        let share = self.heap_bytes / state.heaps.len().max(1);
        self.heap_bound.store(share, Ordering::Relaxed);
    }

    /// The size of the next span for a heap whose bound is `bound`.
    fn span_bytes(&self, bound: u64) -> u64 {
        let granule = GRANULE - 1;
        ((self.capacity / SPANS_PER_CAPACITY).clamp(MIN_SPAN, MAX_SPAN) as u64)
            .min(bound / 2)
            .max(GRANULE)
            & !granule
    }

    /// Runs `f` on the calling thread's heap for this pool, if it has one.
    #[inline(always)]
    pub(super) fn on_thread_heap<R>(&self, f: impl FnOnce(&ThreadHeap) -> R) -> Option<R> {
        with_current(self.id, || self.state.in_callback(), f)
    }

    /// The calling thread's heap for this pool, shared (slow paths).
    pub(super) fn thread_heap(&self) -> Option<Arc<ThreadHeap>> {
        current_arc(self.id)
    }

    /// The common case on a thread heap: within its leases, a block found in its spans. It
    /// changes nothing unless it allocates; `None` sends the request to
    /// [`heap_allocate_slow`](Self::heap_allocate_slow).
    #[inline(always)]
    pub(super) fn heap_allocate_fast(
        &self,
        heap: &ThreadHeap,
        ask: &Ask,
        owned: bool,
    ) -> Option<u64> {
        let reserved = reserved_bytes(ask.size).filter(|&r| r <= self.capacity)?;
        // Held by another thread only while it takes leases back or gives spans back.
        let mut guard = heap.state.try_guard()?;
        // Checked again under the heap's lock: a sink switched on since is seen here.
        if self.flags.load(Ordering::Relaxed) & SLOW != 0 {
            return None;
        }
        let h = &mut *guard;
        let share = h.clients.get_mut(ask.client as usize)?;
        if h.serials.0 == h.serials.1 {
            return None;
        }
        let fits = h.lease.fits(reserved) && share.lease.fits(reserved);
        if !(fits || self.refill(&mut h.lease, share, reserved)) {
            return None;
        }
        let (block, addr) = h.tlsf.allocate(reserved as u64, ask.align as u64)?;
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

    /// With exact peaks: takes what the heap's leases (the pool's, `share`'s) lack for
    /// `reserved` more bytes from the spare headroom, without the pool's lock; whether both
    /// fit now. (What one of them took stays with it if the other cannot be filled.)
    #[cold]
    #[inline(never)]
    fn refill(&self, lease: &mut Lease, share: &mut ClientShare, reserved: usize) -> bool {
        // (Before the pool first told it what to keep, a heap asks the pool.)
        if !self.exact_peaks || lease.keep == 0 {
            return false;
        }
        if !lease.fits(reserved) && !lease.refill(&self.spare, reserved) {
            return false;
        }
        if share.lease.fits(reserved) {
            return true;
        }
        match &share.spare {
            Some(spare) => share.lease.refill(spare, reserved),
            None => false,
        }
    }

    /// With exact peaks: gives what the heap's leases hold beyond what they keep back to the
    /// spare headroom, without the pool's lock.
    #[cold]
    #[inline(never)]
    fn give_back(&self, lease: &mut Lease, share: &mut ClientShare) {
        if lease.hoards() {
            lease.give_back(&self.spare);
        }
        if let (true, Some(spare)) = (share.lease.hoards(), &share.spare) {
            share.lease.give_back(spare);
        }
    }

    /// With exact peaks and heaps, for an allocation of `reserved` bytes for `client` on the
    /// pool's own index: where the counts leave no headroom for it (the headroom being leased
    /// to the spares), takes some from the spares, with what a heap would keep beyond it, so
    /// that the allocation neither locks every heap nor counts a peak it need not.
    pub(super) fn draw_spare(&self, state: &mut State, client: u32, reserved: usize) {
        let counts = &mut state.counts;
        if !counts.admits(reserved) {
            let more = keep(counts.peak, state.heaps.len() + 1);
            if let Some(taken) = self.spare.take(reserved, more) {
                counts.unlease(taken);
            }
        }
        let c = &mut state.clients[client as usize];
        if !(c.counts.admits(reserved) && c.counts.allows(reserved, c.quota)) {
            let more = keep(c.counts.peak, c.heaps + 1);
            if let Some(taken) = c.spare.take(reserved, more) {
                c.counts.unlease(taken);
            }
        }
    }

    /// An allocation on a thread heap that its fast path could not make.
    #[cold]
    #[inline(never)]
    pub(super) fn heap_allocate_slow(&self, ask: &Ask, owned: bool) -> Result<u64, Error> {
        let mut state = self.lock()?;
        let result = match self.thread_heap() {
            Some(heap) => self.heap_allocate_locked(&mut state, &heap, ask, owned),
            None => {
                let req = AllocRequest::new(ask.size, ask.align).on(ask.stream);
                self.allocate_general(&mut state, ask.client, &req, ask.stream, owned, None)
            }
        };
        self.unlock_and_deliver(state, result)
    }

    /// With the pool's lock held: an allocation on `heap`, with more lease, serial numbers or
    /// a new span as needed; the general path (on the pool's own index) where the heap cannot
    /// serve, which decides and reports as without heaps.
    pub(super) fn heap_allocate_locked(
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
        if self.flags.load(Ordering::Relaxed) & SLOW != 0 {
            return general(state);
        }
        let Some(reserved) = reserved_bytes(ask.size).filter(|&r| r <= self.capacity) else {
            return general(state);
        };
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
        // Half the bound may wait whole for reuse; the rest is room to split from.
        h.tlsf.set_cache_limit((bound / 2).min(self.heap_cache.1));
        let mut taken = h.tlsf.allocate(size, align);
        // Within its bound a heap grows (a span: one visit here); at its bound it merges what
        // waits in its cache, the oldest half at a time, and looks again.
        if taken.is_none() && h.tlsf.free_bytes() + self.span_bytes(bound) <= bound {
            taken = self.add_span(state, heap, h, size, align);
        }
        while taken.is_none() && h.tlsf.cached().1 > 0 {
            let half = h.tlsf.cached().0.div_ceil(2);
            h.tlsf.evict_oldest(half);
            taken = h.tlsf.allocate(size, align);
        }
        if taken.is_none() {
            taken = self.add_span(state, heap, h, size, align);
        }
        let Some((block, addr)) = taken else {
            drop(guard);
            return general(state);
        };
        // A growable region: memory behind the block before anything is counted (a request
        // that fails raises no peak).
        let (block, addr) = if self.growable && !self.chunks.covers(addr, size) {
            match self.heap_map_block(state, h, block, addr, size, align) {
                Ok(taken) => taken,
                Err(error) => {
                    h.tlsf.forget_reused(hits);
                    drop(guard);
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
            h.tlsf.release(block);
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
        Ok(addr)
    }

    /// Maps the memory behind a block of a heap whose chunks are not all mapped, as
    /// [`map_block`](Shared::map_block) does for the pool's index: when that fails, the block
    /// goes back to the heap's index; if freed blocks wait in the heap's reuse cache (all of
    /// them mapped), they are merged and the request looks once more. When that fails too,
    /// the heap is as it was (but for the merged cache) and the error fails the request.
    #[cold]
    #[inline(never)]
    fn heap_map_block(
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
    /// `align`, and allocates those there.
    fn add_span(
        &self,
        state: &mut State,
        heap: &Arc<ThreadHeap>,
        h: &mut HeapState,
        size: u64,
        align: u64,
    ) -> Option<(u32, u64)> {
        let fit = tlsf::guaranteed_fit(size, align)?;
        let mut span = self.span_bytes(self.heap_bound() as u64).max(fit);
        // A block taken from the pool's index, for a thread heap.
        let mut taken = state.tlsf.allocate(span, GRANULE);
        if taken.is_none() {
            state.tlsf.flush();
            taken = state.tlsf.allocate(span, GRANULE);
        }
        if taken.is_none() && span > fit {
            span = fit;
            // A block taken from the pool's index, for a thread heap.
            taken = state.tlsf.allocate(span, GRANULE);
        }
        let (block, addr) = taken?;
        let first = h.tlsf.add_span(addr, span);
        h.spans.push(Span {
            addr,
            size: span,
            first,
            block,
        });
        state.spans.insert(addr, (span, heap.clone()));
        h.tlsf.allocate(size, align)
    }

    /// Leases `heap` enough of the pool's bytes for `reserved` more. Without exact peaks, a
    /// chunk beyond that, raising the peak where it must. With exact peaks: from the spare
    /// headroom where it holds enough; else from the headroom leased to none; else every
    /// heap's unused lease is taken back first (locking each), so that a new peak is exact.
    /// The heap takes its need and what it keeps; the rest of the headroom goes to the spare,
    /// where the heaps find it without the pool's lock.
    fn grant_pool(
        &self,
        state: &mut State,
        heap: &Arc<ThreadHeap>,
        h: &mut HeapState,
        reserved: usize,
    ) {
        let need = h.lease.used + reserved - h.lease.cap;
        if !self.exact_peaks {
            // The peak counts leases: a lease past it raises it.
            let counts = &mut state.counts;
            counts.lease(need + self.lease_chunk);
            counts.peak = counts.peak.max(counts.in_use);
            h.lease.cap += need + self.lease_chunk;
            return;
        }
        let heaps = state.heaps.len();
        h.lease.keep = keep(state.counts.peak, heaps);
        if h.lease.refill(&self.spare, reserved) {
            return;
        }
        if state.counts.headroom() >= need {
            Self::share_headroom(&mut state.counts, &self.spare, &mut h.lease, need);
            return;
        }
        self.with_other_heaps(state, heap, None, |state, others| {
            for o in others.iter_mut() {
                state.counts.unlease(o.lease.slack());
                o.lease.cap = o.lease.used;
            }
            state.counts.unlease(h.lease.slack());
            h.lease.cap = h.lease.used;
            state.counts.unlease(self.spare.drain());
            // Every lease is what its heap uses now and the spare is empty: `in_use` is what
            // is in use, and a new peak is exact.
            let counts = &mut state.counts;
            counts.peak = counts.peak.max(counts.in_use + reserved);
            h.lease.keep = keep(counts.peak, heaps);
            Self::share_headroom(counts, &self.spare, &mut h.lease, reserved);
        });
    }

    /// With exact peaks: leases all the headroom below `counts`' peak (at least `need`):
    /// `need` and what `lease` keeps to the heap, the rest to `spare`.
    fn share_headroom(counts: &mut Counters, spare: &Spare, lease: &mut Lease, need: usize) {
        let headroom = counts.headroom();
        let grant = need + lease.keep.min(headroom - need);
        counts.lease(headroom);
        lease.cap += grant;
        spare.give(headroom - grant);
    }

    /// As [`grant_pool`](Self::grant_pool) for a client's lease; `false` (nothing changed but
    /// unused leases) when `reserved` more bytes would pass the client's quota.
    fn grant_client(
        &self,
        state: &mut State,
        heap: &Arc<ThreadHeap>,
        h: &mut HeapState,
        client: u32,
        reserved: usize,
    ) -> bool {
        let c = client as usize;
        if h.clients[c].spare.is_none() {
            // Listed as holding the client's leases (only such heaps are locked to take them
            // back), with its spare headroom at hand.
            if let Some(entry) = state.entry(heap) {
                entry.clients.push(client);
                state.clients[c].heaps += 1;
                h.clients[c].spare = Some(state.clients[c].spare.clone());
            }
        }
        let share = &mut h.clients[c];
        let need = share.lease.used + reserved - share.lease.cap;
        // The heaps that hold a lease of this client share its headroom.
        let heaps = state.clients[c].heaps;
        let quota = state.clients[c].quota;
        let counts = &mut state.clients[c].counts;
        if !self.exact_peaks && counts.in_use + need <= quota {
            // As for the pool: the client's peak counts its leases (never past its quota).
            let grant = need + self.lease_chunk.min(quota - counts.in_use - need);
            counts.lease(grant);
            counts.peak = counts.peak.max(counts.in_use);
            share.lease.cap += grant;
            return true;
        }
        if self.exact_peaks {
            share.lease.keep = keep(counts.peak, heaps);
            if let Some(spare) = &share.spare {
                if share.lease.refill(spare, reserved) {
                    return true;
                }
            }
        }
        if counts.headroom() >= need {
            match (&share.spare, self.exact_peaks) {
                (Some(spare), true) => {
                    Self::share_headroom(counts, spare, &mut share.lease, need);
                }
                _ => {
                    let extra = (counts.headroom() - need) / heaps.max(1);
                    share.lease.cap += need + extra;
                    counts.lease(need + extra);
                }
            }
            return true;
        }
        self.with_other_heaps(state, heap, Some(client), |state, others| {
            let client = &mut state.clients[c];
            let counts = &mut client.counts;
            for o in others.iter_mut() {
                if let Some(share) = o.clients.get_mut(c) {
                    counts.unlease(share.lease.slack());
                    share.lease.cap = share.lease.used;
                }
            }
            let share = &mut h.clients[c];
            counts.unlease(share.lease.slack());
            share.lease.cap = share.lease.used;
            counts.unlease(client.spare.drain());
            let total = counts.in_use + reserved;
            if total > client.quota {
                return false;
            }
            counts.peak = counts.peak.max(total);
            match (&share.spare, self.exact_peaks) {
                (Some(spare), true) => {
                    share.lease.keep = keep(counts.peak, heaps);
                    Self::share_headroom(counts, spare, &mut share.lease, reserved);
                }
                _ => {
                    let extra = (counts.headroom() - reserved) / heaps.max(1);
                    share.lease.cap += reserved + extra;
                    counts.lease(reserved + extra);
                }
            }
            true
        })
    }

    /// Runs `f` with every heap but `own` locked (with `client`: every heap that may hold a
    /// lease of that client).
    fn with_other_heaps<R>(
        &self,
        state: &mut State,
        own: &Arc<ThreadHeap>,
        client: Option<u32>,
        f: impl FnOnce(&mut State, &mut [LockGuard<'_, HeapState>]) -> R,
    ) -> R {
        let others: Vec<Arc<ThreadHeap>> = state
            .heaps
            .iter()
            .filter(|e| !Arc::ptr_eq(&e.heap, own))
            .filter(|e| client.is_none_or(|c| e.clients.contains(&c)))
            .map(|e| e.heap.clone())
            .collect();
        let mut guards: Vec<_> = others.iter().map(|h| h.state.lock_wait()).collect();
        f(state, &mut guards)
    }

    /// Runs `f` with every heap locked (the caller holds none of their locks).
    pub(super) fn with_heaps<R>(
        &self,
        state: &mut State,
        f: impl FnOnce(&mut State, &mut [Locked<'_>]) -> R,
    ) -> R {
        let heaps: Vec<Arc<ThreadHeap>> = state.heaps.iter().map(|e| e.heap.clone()).collect();
        let mut locked: Vec<Locked<'_>> = heaps
            .iter()
            .map(|heap| Locked {
                state: heap.state.lock_wait(),
            })
            .collect();
        f(state, &mut locked)
    }

    /// Takes back every heap's unused leases and the spare headroom, of the pool and of
    /// `client`, so that `in_use` is what is in use (for as long as the heaps stay locked).
    pub(super) fn revoke(&self, state: &mut State, heaps: &mut [Locked<'_>], client: u32) {
        let c = client as usize;
        state.counts.unlease(self.spare.drain());
        let spare = state.clients[c].spare.drain();
        state.clients[c].counts.unlease(spare);
        for h in heaps.iter_mut() {
            let h = &mut *h.state;
            state.counts.unlease(h.lease.slack());
            h.lease.cap = h.lease.used;
            if let Some(share) = h.clients.get_mut(c) {
                state.clients[c].counts.unlease(share.lease.slack());
                share.lease.cap = share.lease.used;
            }
        }
    }

    /// The common case of a free on a thread heap: a live allocation of the heap that `caller`
    /// may free. `None` sends the free on (to the pool's fast path, then the general path);
    /// `Some(true)` when the heap keeps more free bytes than it should (see
    /// [`shrink`](Self::shrink)).
    #[inline(always)]
    pub(super) fn heap_deallocate_fast(
        &self,
        heap: &ThreadHeap,
        caller: Option<u32>,
        addr: u64,
        from_slice: bool,
    ) -> Option<bool> {
        let mut guard = heap.state.try_guard()?;
        let h = &mut *guard;
        // A free made after a sink was switched on is logged (see `set_sink`).
        if self.flags.load(Ordering::Relaxed) & SINK != 0 {
            return None;
        }
        let slot = h.live.find(addr)?;
        let block = h.live.value_at(slot);
        let live = h.meta[block as usize];
        if (live.owned && !from_slice) || caller.is_some_and(|caller| caller != live.client) {
            return None;
        }
        h.live.remove_at(slot);
        let reserved = h.tlsf.release(block) as usize;
        h.uncount(&live, reserved);
        let over = h.tlsf.free_bytes() > self.heap_bound() as u64;
        let share = &mut h.clients[live.client as usize];
        // A heap gives back leases it does not use, now and then: with exact peaks to the
        // spare headroom (here, without the pool's lock), else to the pool.
        let hoarding = if self.exact_peaks {
            if h.lease.hoards() || share.lease.hoards() {
                self.give_back(&mut h.lease, share);
            }
            false
        } else {
            h.lease.slack() > 2 * self.lease_chunk || share.lease.slack() > 2 * self.lease_chunk
        };
        Some(over || hoarding)
    }

    /// Gives back what a heap keeps beyond its bound: spans nothing uses, whole; then the
    /// spans with the most free bytes, in pieces. Without exact peaks, also its leases'
    /// headroom beyond one chunk.
    #[cold]
    #[inline(never)]
    pub(super) fn shrink(&self) {
        let Some(heap) = self.thread_heap() else {
            return;
        };
        let heap = &heap;
        let Ok(mut state) = self.lock() else {
            return;
        };
        let mut guard = heap.state.lock_wait();
        let h = &mut *guard;
        if h.retired {
            return;
        }
        if !self.exact_peaks {
            // Leases beyond one chunk of headroom go back.
            let chunk = self.lease_chunk;
            let back = h.lease.slack().saturating_sub(chunk);
            h.lease.cap -= back;
            state.counts.unlease(back);
            for (c, share) in h.clients.iter_mut().enumerate() {
                let back = share.lease.slack().saturating_sub(chunk);
                share.lease.cap -= back;
                state.clients[c].counts.unlease(back);
            }
        }
        let bound = self.heap_bound() as u64;
        if h.tlsf.free_bytes() <= bound {
            return;
        }
        h.tlsf.flush();
        let target = bound / 2;
        let mut i = 0;
        while i < h.spans.len() && h.tlsf.free_bytes() > target {
            let span = h.spans[i];
            if h.tlsf.take_span(span.first) {
                h.spans.swap_remove(i);
                state.spans.remove(&span.addr);
                state.tlsf.free(span.block);
            } else {
                i += 1;
            }
        }
        while h.tlsf.free_bytes() > target && !h.spans.is_empty() {
            let i = (0..h.spans.len())
                .max_by_key(|&i| h.span_free(i))
                .unwrap_or(0);
            self.dissolve_span(&mut state, heap, h, i);
        }
        if self.streams.is_some() {
            // Blocks freed on the home stream reach the pool's index.
            state.home_epoch += 1;
        }
    }

    /// Gives span `i` of `heap` back in pieces (the heap's cache flushed): its blocks become
    /// blocks of the pool's index, the free ones merged there; live allocations in it carry on
    /// in the pool's index, at their addresses, with their counts; parked blocks wait there.
    fn dissolve_span(
        &self,
        state: &mut State,
        heap: &Arc<ThreadHeap>,
        h: &mut HeapState,
        i: usize,
    ) {
        let span = h.spans.swap_remove(i);
        state.spans.remove(&span.addr);
        let mut pieces: Vec<Piece> = Vec::new();
        h.tlsf.export_span(span.first, &mut pieces);
        debug_assert_eq!(pieces.iter().map(|p| p.size).sum::<u64>(), span.size);
        let mut carved = Vec::new();
        state.tlsf.carve(span.block, &pieces, &mut carved);
        let mut moved = Vec::new();
        for (p, &block) in pieces.iter().zip(&carved) {
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
    /// afterwards, and everything it held is in the pool's index.
    pub(super) fn dissolve(&self, state: &mut State, heap: &Arc<ThreadHeap>, h: &mut HeapState) {
        if !h.spans.is_empty() {
            h.tlsf.flush();
            while !h.spans.is_empty() {
                let last = h.spans.len() - 1;
                self.dissolve_span(state, heap, h, last);
            }
            if self.streams.is_some() {
                // Blocks freed on the home stream reach the pool's index.
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
    /// afterwards and every count is the pool's own.
    pub(super) fn dissolve_all(&self, state: &mut State) {
        let heaps: Vec<Arc<ThreadHeap>> = state.heaps.iter().map(|e| e.heap.clone()).collect();
        let mut guards: Vec<_> = heaps.iter().map(|h| h.state.lock_wait()).collect();
        for (heap, guard) in heaps.iter().zip(guards.iter_mut()) {
            self.dissolve(state, heap, guard);
        }
        Self::drain_spares(self, state);
        drop(guards);
    }

    /// Takes the spare headroom of the pool and of every client back into their counts
    /// (the caller holds the lock of every heap that may take from them, or there is none).
    fn drain_spares(&self, state: &mut State) {
        state.counts.unlease(self.spare.drain());
        for client in state.clients.iter_mut() {
            client.counts.unlease(client.spare.drain());
        }
    }

    /// The heap that holds the span around `addr`, if any.
    pub(super) fn span_owner(state: &State, addr: u64) -> Option<Arc<ThreadHeap>> {
        let (&start, (size, heap)) = state.spans.range(..=addr).next_back()?;
        (addr - start < *size).then(|| heap.clone())
    }

    /// A new heap for the calling thread, registered with it and with the pool; `None` when
    /// the thread is exiting.
    pub(super) fn new_thread_heap(&self, state: &mut State) -> Option<Arc<ThreadHeap>> {
        let (cache_blocks, cache_bytes) = self.heap_cache;
        let heap = Arc::new(ThreadHeap {
            state: Lock::new(HeapState::new(
                self.base,
                self.capacity,
                cache_blocks,
                cache_bytes,
            )),
        });
        if !register(self.id, self.this.clone(), &heap) {
            return None;
        }
        state.heaps.push(HeapEntry {
            heap: heap.clone(),
            clients: Vec::new(),
        });
        self.share_heap_bytes(state);
        self.flags.fetch_or(HEAPS, Ordering::Relaxed);
        Some(heap)
    }

    /// Gives `heap` back for good: its thread exits.
    pub(super) fn retire(&self, heap: &Arc<ThreadHeap>) {
        let mut state = self.lock_wait();
        {
            let mut guard = heap.state.lock_wait();
            if guard.retired {
                return;
            }
            self.dissolve(&mut state, heap, &mut guard);
            guard.retired = true;
        }
        state.heaps.retain(|e| !Arc::ptr_eq(&e.heap, heap));
        self.share_heap_bytes(&state);
        if state.heaps.is_empty() {
            // No heap left to take from the spares: their headroom is the pool's again.
            self.drain_spares(&mut state);
            self.flags.fetch_and(!HEAPS, Ordering::Relaxed);
        }
    }

    /// Empties every heap for good: the pool is being dropped.
    pub(super) fn drop_heaps(&self) {
        let mut state = self.lock_wait();
        for entry in core::mem::take(&mut state.heaps) {
            let mut guard = entry.heap.state.lock_wait();
            guard.retired = true;
            guard.tlsf = Tlsf::empty(self.base, self.capacity as u64, 0, 0);
            guard.live = AddrMap::with_capacity(0);
            guard.meta = Vec::new();
            guard.spans = Vec::new();
            guard.clients = Vec::new();
        }
        state.spans.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::Pool;

    impl Shared {
        /// Every invariant of the pool's index, the heaps' indices and the spans between them,
        /// with everything locked.
        fn check_heaps(&self) {
            let mut state = self.lock_wait();
            self.with_heaps(&mut state, |state, heaps| {
                state.tlsf.check();
                let mut spans = 0;
                let mut leased = 0;
                for h in heaps.iter() {
                    let h = &*h.state;
                    h.check();
                    leased += h.lease.cap;
                    assert!(h.lease.used <= h.lease.cap);
                    for span in &h.spans {
                        // One used block of the pool's index, listed under its address.
                        assert_eq!(state.tlsf.block_size(span.block), span.size);
                        assert_eq!(state.spans.get(&span.addr).map(|s| s.0), Some(span.size));
                        assert!(state.live.get(span.addr).is_none());
                        spans += 1;
                    }
                    let used: usize = h
                        .live
                        .iter()
                        .map(|(_, b)| h.tlsf.block_size(b) as usize)
                        .sum();
                    assert_eq!(used, h.lease.used);
                    for (c, share) in h.clients.iter().enumerate() {
                        assert!(share.lease.used <= share.lease.cap, "client {c}");
                    }
                }
                assert_eq!(spans, state.spans.len());
                assert_eq!(leased + self.spare.bytes(), state.counts.leased);
                assert!(state.counts.leased <= state.counts.in_use);
                assert!(state.counts.in_use <= state.counts.peak);
                for (c, client) in state.clients.iter().enumerate() {
                    let leased: usize = heaps
                        .iter()
                        .filter_map(|h| h.state.clients.get(c))
                        .map(|s| s.lease.cap)
                        .sum();
                    let leased = leased + client.spare.bytes();
                    assert_eq!(leased, client.counts.leased, "client {c}");
                    let listed = heaps
                        .iter()
                        .filter(|h| h.state.clients.get(c).is_some_and(|s| s.spare.is_some()))
                        .count();
                    assert_eq!(listed, client.heaps, "client {c}");
                    let counts = &client.counts;
                    assert!(counts.leased <= counts.in_use);
                    assert!(counts.in_use <= counts.peak.min(client.quota));
                }
            });
        }
    }

    #[test]
    fn heaps_and_the_pool_agree_while_threads_run() {
        agree_while_threads_run(true);
    }

    #[test]
    fn heaps_and_the_pool_agree_while_threads_run_with_peaks_that_count_leases() {
        agree_while_threads_run(false);
    }

    fn agree_while_threads_run(exact_peaks: bool) {
        // Three threads with heaps allocate and free (sizes that make spans come and go, a
        // client under a quota, frees of each other's blocks); the main thread checks every
        // invariant between the indices, the spans and the leases as they run, and gives the
        // heaps back now and then.
        let pool = Pool::builder(16 << 20)
            .eager_thread_heaps(true)
            .thread_heaps(1 << 20)
            .exact_peaks(exact_peaks)
            .log_leaks_on_drop(false)
            .build_host()
            .unwrap();
        let quota = pool.client("quota", 3 << 20);
        let shared = pool.shared().clone();
        let mailbox: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());
        let running = core::sync::atomic::AtomicUsize::new(3);
        std::thread::scope(|s| {
            for t in 0..3u64 {
                let (pool, quota, mailbox, running) = (&pool, &quota, &mailbox, &running);
                s.spawn(move || {
                    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ t;
                    let mut live = Vec::new();
                    for _ in 0..20_000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let size = 1 + (x % (1 << (8 + x % 12))) as usize;
                        if live.len() < 50 && x % 3 != 0 {
                            let client = if x % 5 == 0 { quota } else { pool.own_client() };
                            if let Ok(addr) = client.allocate(size, 256 << ((x >> 60) % 5)) {
                                live.push((addr, x % 5 == 0));
                            }
                        } else if x % 7 == 0 {
                            let theirs: Vec<u64> = core::mem::take(&mut *mailbox.lock().unwrap());
                            for addr in theirs {
                                pool.deallocate(addr).unwrap();
                            }
                        } else if let Some((addr, _)) = live.pop() {
                            if x % 11 == 0 {
                                mailbox.lock().unwrap().push(addr);
                            } else {
                                pool.deallocate(addr).unwrap();
                            }
                        }
                    }
                    for (addr, _) in live {
                        pool.deallocate(addr).unwrap();
                    }
                    running.fetch_sub(1, Ordering::SeqCst);
                });
            }
            let mut rounds = 0;
            while running.load(Ordering::SeqCst) > 0 {
                shared.check_heaps();
                rounds += 1;
                if rounds % 10 == 0 {
                    let _ = pool.stats();
                }
                std::thread::yield_now();
            }
        });
        for addr in core::mem::take(&mut *mailbox.lock().unwrap()) {
            pool.deallocate(addr).unwrap();
        }
        shared.check_heaps();
        let s = pool.stats();
        assert_eq!((s.in_use, s.live, s.free_blocks), (0, 0, 1));
        assert_eq!(s.allocations, s.frees);
    }
}
