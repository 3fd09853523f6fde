//! Thread heaps: a heap of its own for each thread that found the pool's lock taken (and,
//! once one has, for every thread that allocates on the pool), one for each stream it
//! allocates on, so that threads sharing a pool stop serializing on that lock; and a heap for
//! each stream other than the home stream that a thread allocates on, from its first request
//! there, so that its blocks are reused there without events.
//!
//! A thread heap is an index ([`Tlsf`]) over *spans*, pieces of the region it took from the
//! pool's index, each one used block there. The thread allocates and frees in its spans under a
//! lock of its own, which only it takes in the common case, so the pool's lock and the cache
//! lines of the pool's state stay out of its way. Until a thread meets another on the
//! pool's lock, or allocates on another stream, no thread gets one (unless the pool gives every
//! thread one, `eager_thread_heaps`): a pool used by one thread at a time on its home stream
//! works as it did without them, block for block. From then on, while any thread has a heap,
//! a thread without one gets one at its next allocation: left on the pool's index it would
//! look for its heap first on every call, and hold the pool's lock that the heaps' slow paths
//! need.
//!
//! What users rely on holds exactly, heaps or not:
//!
//! * **The hard cap.** Before a request fails, every heap, other threads' included, gives its
//!   spans back ([`Shared::dissolve`]): a span nothing uses goes back whole; any other is cut in
//!   the pool's index into the blocks the heap made, live ones at their addresses, free ones
//!   merged with their free neighbours. Afterwards the pool's index is what it would be had it
//!   made every block itself, so a request that would succeed with every heap given back does
//!   succeed. Near the capacity the home-stream heaps step aside for a while ([`HeapBar`];
//!   with more than [`FEW_HEAPS`] of them, once the peak has passed half the capacity). (A
//!   heap of a stream other than the home stream gives its free blocks back once the home
//!   stream waits for its stream; the free blocks such heaps gave back parked before, see
//!   the stream order below, are taken the same way,
//!   [`Shared::order_given_back`]. Only where that wait cannot be made, a stream capturing a
//!   graph, do they stay parked.)
//! * **Quotas and the peak.** A heap allocates within *leases*, one for the pool and one per
//!   client ([`Lease`]): bytes it may hold without asking. The pool counts leases as in use
//!   and keeps `in_use ≤ peak` (and `peak ≤ quota` for a client), so an allocation within a
//!   lease can set no new peak and pass no quota. Headroom that no heap holds is leased to a
//!   [`Spare`] (the pool's, and one per client), counted as in use like any lease: a heap
//!   short of lease takes what it needs from the spare, and a little more to keep, with one
//!   compare-and-swap and without the pool's lock (on its own shard of the spare where that
//!   holds enough, else on another's), and gives back to it what it holds beyond
//!   a few times that (the amount kept follows the peak and the number of heaps). Moving
//!   headroom between a heap and a spare changes no count. Where the spare runs short the
//!   heap asks the pool; where the headroom under the peak is gone, the pool first takes back
//!   every lease's unused part and the spare, with every heap that may touch them locked
//!   (heaps touch a spare only under their own lock), and only then raises the peak (to
//!   exactly what is in use) or refuses the quota; the headroom left goes to the spare. Every
//!   path that needs exact counts (a refusal, the pool's own index where the counts leave no
//!   headroom) drains the spares the same way, or draws from them; statistics count what
//!   the leases and spares hold unused as not in use, and take nothing back. Without
//!   exact peaks (`exact_peaks(false)`), a heap takes a chunk of headroom beyond its need
//!   (1/256 of the capacity, or twice the largest request it served, up to 1/32 of the
//!   capacity, if that is more), raising the peak where there is none, and gives back what it
//!   holds beyond three chunks to the pool: the peaks count leases, quotas stay exact.
//! * **Statistics, leak reports, the event log.** Counts that add up (bytes, allocations,
//!   frees) are kept per heap and summed with every heap locked; the free blocks are described
//!   from the pool's index and every heap's spans together, as they would be with every span
//!   given back and every reuse cache merged (blocks that touch count as one), while nothing
//!   is given back: a thread that reads statistics while others work does not take their
//!   heaps and caches away. Leak reports list every heap's live allocations.
//!   Tracking and event sinks take the general path under the pool's lock, as before; a heap
//!   serves only while neither is on, and checks that under its own lock, which
//!   [`set_sink`](Shared::set_sink) takes once after switching a sink on. Parked blocks do
//!   not stop the heaps: a heap's slow path takes them back, as the general path does.
//! * **Stream order.** A heap serves one stream ([`ThreadHeap::stream`]): the home stream, or
//!   with a stream runtime any other stream the thread allocates on (a heap for each). Its
//!   blocks are freed and handed out again on that stream only, at once, as the pool's index
//!   does for the home stream; a free on any other stream parks the block, and it returns to
//!   its heap when its event completes. A heap of another stream takes a span only after its
//!   stream waited for the home stream's frees since its last wait (what the general path does
//!   before it hands a block of the pool's index to another stream, see `add_span`). Blocks
//!   reach the pool's index, and so other streams, only when spans go back: a home-stream
//!   heap's count as home-stream frees; another stream's are either made home-stream frees by
//!   a wait of the home stream for the heap's stream (before a refusal, a trim), or parked
//!   until an event on the heap's stream completes (see [`Shared::give_back_mode`]).
//! * **Growable regions.** A span is addresses: memory is mapped under it as blocks reach new
//!   chunks. The heap's fast path checks the chunk bits of each block it takes without the
//!   pool's lock ([`ChunkMap`](super::vmm::ChunkMap)); where a chunk is missing it gives the
//!   block back and maps under the pool's lock in
//!   [`heap_allocate_locked`](Shared::heap_allocate_locked), before anything is counted. A trim gives every heap back
//!   first and unmaps only chunks inside free blocks of the pool's index (never inside a span),
//!   so a chunk under a heap's span stays mapped while the heap holds the span. There a heap's
//!   reuse cache holds no more than the most the heap has had in use
//!   ([`Shared::heap_cache_limit`]), so that what a heap maps follows its use.
//! * **Frees from other threads.** A thread that frees a block of another thread's heap (a
//!   data-loader thread allocates, a consumer frees) finds the heap in a copy of the pool's
//!   map of spans readable without the pool's lock ([`SpanDirectory`]) and frees the block
//!   under that heap's lock alone, with the checks and counts of the general path; the copy
//!   is only a hint, checked against the heap's live allocations (see [`remote`]), and is
//!   rebuilt lazily: after spans change, the first such free goes to the pool's lock, which
//!   brings the copy up to date. Frees the copy cannot place, and every free a heap cannot
//!   take (a sink, another stream, a refusal), go to the pool's lock as before.
//! * **Thread exit and pool drop.** The thread's heaps live in a thread-local list that holds
//!   each pool weakly: when the thread exits, each heap of a pool still alive is given back. A
//!   pool dropped first empties its heaps; the list then holds only an empty heap, dropped when
//!   the thread exits or looks up another pool.
//!
//! Locks are taken in one order: the pool's lock, then heap locks. A thread's fast path holds
//! only its own heap's lock (and touches a spare with atomic operations, which wait for no
//! one), and a free from another thread only the lock of the block's heap, neither waiting
//! for any other lock while it holds its own; every other path that locks a heap holds the
//! pool's lock first, so no two threads wait for each other's locks in opposite orders. (The
//! span directory's read locks are held by no one who waits for another lock, and its
//! writers hold the pool's lock.) No callback runs while a heap is locked by its own thread's
//! fast path or by another thread's free.

use alloc::sync::{Arc, Weak};
use alloc::vec::Vec;
use core::cell::{Cell, RefCell};
use core::sync::atomic::Ordering;

use super::addr_map::AddrMap;
use super::counters::{Lease, SPARE_SHARDS, Spare};
use super::engine::{Ask, HEAPS, Live, Shared, State, grown_meta};
use super::lock::{Lock, LockGuard};
use super::stream::StreamId;
use super::tlsf::{GRANULE, Tlsf};

// The rooms of the heaps: their allocation and free paths, the leases of the pool's headroom,
// and giving spans back. The heaps' state, the thread-local list and their life cycle live
// here.
mod dissolve;
mod leases;
mod paths;
mod remote;

pub(super) use remote::SpanDirectory;

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

/// Home-stream heaps step aside near the capacity. Where a heap of the home stream can serve a
/// request neither from its spans, nor after merging its reuse cache, nor from a new span,
/// because the pool's index has no room left for one and fewer free bytes than
/// [`SHORT_SPANS`] spans (or no room even for a span just large enough for the request),
/// every heap of the home stream is given back for good (as at its thread's exit: live blocks
/// stay at their addresses, in the pool's index) and the request goes to the pool's index.
/// For the next `len` allocations (serial numbers: one each while no heap takes batches) no
/// thread gets a heap for the home stream, and the pool's index serves them, as in a pool
/// without heaps (with no heap left at all, a request takes the pool's own fast path at once). Afterwards a thread finds its old heap
/// retired when it next asks for one, and gets a new one.
///
/// Why: heaps split the free memory among themselves and the pool's index, and each part
/// fragments on its own. Near the capacity, a heap whose span the index cannot give merges its
/// reuse cache again and again (taking smaller spans, the size of one request), requests find
/// nothing, give every heap back and take spans again: in `pool_pairs` with two threads (peak
/// in use about 100 MiB), a pool of 256 MiB took 97–104 ns a pair and one of 192 MiB 355–385
/// ns, where the same pool without heaps took 78 and 91–104 ns; stepping aside, 81–90 and
/// 87–92 ns (`BENCHMARKS.md`). A bar doubles the last one ([`BAR_MIN`]`..=`[`BAR_MAX`]
/// allocations) unless the heaps ran more than [`BAR_QUIET`] since the last one ended (as a
/// thread that asked for a heap found); then it is the shortest again. Pools that give every
/// thread a heap (`eager_thread_heaps`) keep them, and heaps of other streams stay (a free
/// there without a heap records an event).
///
/// A pool that has had more than [`FEW_HEAPS`] home-stream heaps at once steps aside only
/// once its peak has passed half its capacity. Its threads then share one lock for a while
/// (on an H100 host no slower than heaps near the capacity: eight threads at 416–448 MiB took
/// 2.5–3.3 µs a pair, against 2.0–5.0 µs on heaps that stayed); heaps that stay there
/// fragment the free memory until requests fail that the pool's one index serves: in
/// `pool_pairs` with eight threads (peak in use about 260 MiB) on the development machine, a
/// pool of 384 MiB failed an allocation in 26 of 32 runs with heaps that stayed and in 7 of
/// 32 with heaps that step aside; at 400 MiB in 21 of 32 against 1 of 32. Stepping aside
/// fails no more often than the pool's one index alone (`thread_heaps(0)`): 7 against 8 of 30
/// runs at 384 MiB, 1 against 2 of 30 at 400 MiB (`BENCHMARKS.md`). A pool whose use never
/// reached half its capacity has room: where its index looks short there, heaps hold the free
/// memory in their spans and nothing fails (eight threads at 768 MiB for a peak of 260–310
/// MiB would step aside three or four times a run, for nothing).
#[derive(Default)]
pub(in crate::pool) struct HeapBar {
    /// The serial number up to which home-stream heaps stay away (none below it).
    pub(super) until: u64,
    /// How long the last bar was, in allocations (0: there was none).
    pub(super) len: u64,
    /// When a thread that asked for a heap first found the last bar over.
    pub(super) ended: Option<std::time::Instant>,
    /// The most home-stream heaps the pool has had at once.
    pub(super) most: usize,
}

/// The shortest and longest [`HeapBar`], in allocations, and how long heaps must run without
/// a bar for the next one to be the shortest again.
const BAR_MIN: u64 = 1 << 12;
const BAR_MAX: u64 = 1 << 22;
const BAR_QUIET: std::time::Duration = std::time::Duration::from_secs(1);
/// Heaps that may step aside do so only while the pool's index holds fewer free bytes than
/// this many spans (see [`HeapBar`]): with more, in pieces smaller than a span, the pool is
/// fragmented, not full, and a heap takes a span just large enough for its request.
pub(super) const SHORT_SPANS: u64 = 4;
/// A pool that has had more home-stream heaps than this at once steps aside only once its
/// peak has passed half its capacity, see [`HeapBar`]: many threads' heaps hold so much of
/// the free memory in their spans that the index looks short long before anything fails.
pub(super) const FEW_HEAPS: usize = 2;

impl HeapBar {
    /// Whether home-stream heaps stay away for now.
    pub(in crate::pool) fn on(&self, next_serial: u64) -> bool {
        next_serial < self.until
    }

    /// A thread asks for a home-stream heap while no bar is on: notes when the last bar was
    /// first found over.
    pub(in crate::pool) fn note_over(&mut self) {
        if self.len > 0 && self.ended.is_none() {
            self.ended = Some(std::time::Instant::now());
        }
    }
}

/// One thread's heap for one pool and one stream.
pub(super) struct ThreadHeap {
    pub(super) state: Lock<HeapState>,
    /// The stream whose requests it serves: the pool's home stream, or (with a stream runtime)
    /// another stream the thread allocates on. Its blocks are freed and handed out again on
    /// this stream only.
    pub(super) stream: StreamId,
    /// Whether its thread's last free was of a block another heap holds (see
    /// [`OwnerHint`]).
    pub(super) frees_elsewhere: OwnerHint,
}

/// A hint its heap's thread alone reads and writes, on cache lines of its own: set when the
/// thread's free found the block in another heap, cleared when one found it in its own. While
/// it is set, the thread's frees look in the span directory first instead of trying its own
/// heap: a thread that frees what another allocated (a consumer that also allocates, or
/// threads handing blocks round a ring) would otherwise take its own heap's lock and read its
/// map on every free, while the thread before it frees into that heap, and the lock's and the
/// map's cache lines would move between the two cores each time. (A stale hint only costs a
/// look in the other place; it decides nothing.)
#[repr(align(128))]
#[derive(Default)]
pub(super) struct OwnerHint(core::sync::atomic::AtomicBool);

impl OwnerHint {
    #[inline(always)]
    pub(super) fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
    #[inline(always)]
    pub(super) fn set(&self, value: bool) {
        // (A load first: the line stays unwritten while the hint does not change.)
        if self.get() != value {
            self.0.store(value, Ordering::Relaxed);
        }
    }
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
    /// The client's spare headroom, once the heap is listed as holding its leases (with
    /// exact peaks).
    pub(super) spare: Option<Arc<Spare>>,
    // (Apart from `requested`, which an allocation and a free update with them: the compiler
    // packed the neighbours' updates into vector operations of 5 instructions for 2.)
    pub(super) allocations: u64,
    pub(super) frees: u64,
}

/// Everything behind a heap's lock.
pub(super) struct HeapState {
    /// The shard of the spares ([`Spare`]) the heap gives to and takes from first.
    pub(super) shard: usize,
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
    /// The most bytes the heap has had in use, as its slow path saw them after the requests
    /// it made (what bounds its reuse cache on a growable region, see
    /// [`Shared::heap_cache_limit`]).
    pub(super) high_water: u64,
}

impl HeapState {
    fn new(
        base: u64,
        capacity: usize,
        cache_blocks: usize,
        cache_bytes: u64,
        shard: usize,
    ) -> Self {
        HeapState {
            shard,
            tlsf: Tlsf::empty(base, capacity as u64, cache_blocks, cache_bytes),
            live: AddrMap::with_capacity(64),
            meta: Vec::new(),
            spans: Vec::new(),
            lease: Lease::default(),
            clients: Vec::new(),
            serials: (0, 0),
            retired: false,
            high_water: 0,
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
        // (One bounds check: growing in the other branch.)
        let entry = match self.meta.get_mut(slot) {
            Some(entry) => entry,
            None => grown_meta(&mut self.meta, slot),
        };
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
/// alive, and the stream it serves.
struct Entry {
    pool: u64,
    stream: StreamId,
    shared: Weak<Shared>,
    heap: Arc<ThreadHeap>,
}

/// This thread's heaps.
struct ThreadHeaps {
    all: RefCell<Vec<Entry>>,
}

impl Drop for ThreadHeaps {
    fn drop(&mut self) {
        // `LAST` points at a heap the list owns: it goes first.
        forget_current();
        // The thread exits: each heap goes back to its pool, if the pool is still there.
        for entry in self.all.get_mut().drain(..) {
            if let Some(shared) = entry.shared.upgrade() {
                shared.retire(&entry.heap);
            }
        }
    }
}

/// What [`LAST`] holds when it names no heap (pool ids are never 0).
const NO_HEAP: (u64, StreamId, *const ThreadHeap) = (0, StreamId(0), core::ptr::null());

std::thread_local! {
    static THREAD_HEAPS: ThreadHeaps = const {
        ThreadHeaps {
            all: RefCell::new(Vec::new()),
        }
    };
    /// The pool and request stream looked up last and this thread's heap for them
    /// ([`NO_HEAP`]: none). The heap is one of
    /// `THREAD_HEAPS`'s: `LAST` is reset before entries leave that list. A thread-local of its
    /// own, without a destructor, so that reading it is a plain load: the list has one (it
    /// gives the heaps back), which makes every access check whether it is still there.
    static LAST: Cell<(u64, StreamId, *const ThreadHeap)> = const { Cell::new(NO_HEAP) };
}

/// Runs `f` on the calling thread's heap for pool `pool` and a request on stream `stream`
/// (the heap of stream `key()`, see [`Shared::heap_stream`]); `None` when it has none (or is
/// exiting, or `reentrant` says it is inside a callback of that pool, where the pool must fail
/// instead). The heap looked up last is remembered for the request's own stream: the common
/// case compares it alone, without asking `reentrant`. The pool's stream-runtime callbacks
/// forget it first ([`forget_current`]); inside the others (a logger's, a virtual-memory
/// backend's) the heap may serve, which is sound: its paths take its own lock with a try,
/// which fails where a frame further up holds it, and then send the call to the pool's lock,
/// which reports the reentrant call.
#[inline(always)]
fn with_current<R>(
    pool: u64,
    stream: StreamId,
    key: impl FnOnce() -> StreamId,
    reentrant: impl FnOnce() -> bool,
    f: impl FnOnce(&ThreadHeap) -> R,
) -> Option<R> {
    // (`try_with` is a plain load here: `LAST` has no destructor; where thread-locals are
    // kept under OS keys it may fail once the thread's are gone, and then looks nothing up.)
    let (id, last_stream, heap) = LAST.try_with(Cell::get).unwrap_or(NO_HEAP);
    let heap = if id == pool && last_stream == stream {
        heap
    } else {
        lookup(pool, stream, key(), reentrant)?
    };
    // SAFETY: `heap` comes from `Arc::as_ptr` of the `Arc` in an entry of `THREAD_HEAPS`'s
    // list (see `lookup` and `register`, the only writers of a non-null `LAST`, both from
    // inside `THREAD_HEAPS.try_with`, so never once the list is being destroyed), and that
    // entry stays in the list while `f` runs: entries leave it only in `lookup`, for pools
    // that are gone (this one is not: the caller is a call on it; pool ids are never reused
    // and never 0), in `take_current`, which resets `LAST` before it takes an entry out and
    // runs only when a graph reservation is opened or a thread's heap is given back, and
    // when a slow path under the pool's lock drops a heap the pool retired
    // (`usable_thread_heap`, outside any `f`): calls of their own that no `f` makes (the
    // paths run as `f` call no user code but the global allocator, whose own calls on a pool
    // may look up and register heaps, which takes no entry of a live pool out of the list and
    // moves no heap: an entry holds its heap behind an `Arc`), and when the thread exits (the list's destructor
    // resets `LAST` before it empties the list; where `LAST` itself is gone, `try_with` above
    // fails and nothing is looked up).
    Some(f(unsafe { &*heap }))
}

/// Finds this thread's heap for `pool` and stream `key` in its list and makes it the one looked
/// up last for requests on `stream`; `None` (and nothing looked up last) when there is none,
/// or inside a callback of that pool.
#[cold]
#[inline(never)]
fn lookup(
    pool: u64,
    stream: StreamId,
    key: StreamId,
    reentrant: impl FnOnce() -> bool,
) -> Option<*const ThreadHeap> {
    forget_current();
    if reentrant() {
        return None;
    }
    THREAD_HEAPS
        .try_with(|t| {
            let mut all = t.all.try_borrow_mut().ok()?;
            // Heaps of pools that are gone are empty: forget them.
            all.retain(|e| e.shared.strong_count() > 0);
            let entry = all.iter().find(|e| e.pool == pool && e.stream == key)?;
            let heap = Arc::as_ptr(&entry.heap);
            LAST.try_with(|l| l.set((pool, stream, heap))).ok()?;
            Some(heap)
        })
        .ok()
        .flatten()
}

/// This thread's heap for `pool` and `stream`, shared (for the paths that keep it).
#[cold]
#[inline(never)]
fn current_arc(pool: u64, stream: StreamId) -> Option<Arc<ThreadHeap>> {
    THREAD_HEAPS
        .try_with(|t| {
            let all = t.all.try_borrow().ok()?;
            all.iter()
                .find(|e| e.pool == pool && e.stream == stream)
                .map(|e| e.heap.clone())
        })
        .ok()
        .flatten()
}

/// Takes the calling thread's heap for `pool` and `stream` out of its list (nothing looked up
/// last afterwards); `None` when it has none (or is exiting).
fn take_current(pool: u64, stream: StreamId) -> Option<Arc<ThreadHeap>> {
    forget_current();
    THREAD_HEAPS
        .try_with(|t| {
            let mut all = t.all.try_borrow_mut().ok()?;
            let at = all
                .iter()
                .position(|e| e.pool == pool && e.stream == stream)?;
            Some(all.swap_remove(at).heap)
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
                stream: heap.stream,
                shared,
                heap: heap.clone(),
            });
            let _ = LAST.try_with(|l| l.set((pool, heap.stream, Arc::as_ptr(heap))));
            true
        })
        .unwrap_or(false)
}

/// Whether `heap` is the heap looked up last on this thread, for `pool` and requests on
/// `stream` (no lookup: a thread without a heap for them would pay for one on every call).
pub(super) fn is_current(pool: u64, stream: StreamId, heap: *const ThreadHeap) -> bool {
    LAST.try_with(Cell::get)
        .is_ok_and(|(id, last_stream, last)| id == pool && last_stream == stream && last == heap)
}

/// Forgets the heap looked up last, so that the next call of this thread looks its list up
/// (which fails inside a callback).
pub(super) fn forget_current() {
    let _ = LAST.try_with(|l| l.set(NO_HEAP));
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

    /// The most bytes a heap's reuse cache may hold when its bound is `bound`: half the bound
    /// (the rest is room to split from), within the pool's reuse setting. On a growable
    /// region also no more than `high_water`, the most the heap has had in use
    /// ([`HeapState::high_water`], with the request being made; at least [`MIN_SPAN`]):
    /// there every address a heap's blocks ever reached stays mapped while the heap holds
    /// the span, and a cache bounded by the capacity alone let each heap of eight busy threads
    /// in the pool benchmark reach 7× its use, spreading new sizes around blocks that waited
    /// for a request of their own size.
    pub(super) fn heap_cache_limit(&self, high_water: u64, bound: u64) -> u64 {
        let limit = (bound / 2).min(self.heap_cache.1);
        if self.growable {
            limit.min(high_water.max(MIN_SPAN as u64))
        } else {
            limit
        }
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

    /// The stream whose heap serves a request on `stream`: that stream, or the home stream on
    /// a pool without a stream runtime (where all streams are one).
    #[inline(always)]
    pub(super) fn heap_stream(&self, stream: StreamId) -> StreamId {
        if self.streams.is_some() {
            stream
        } else {
            self.home
        }
    }

    /// Runs `f` on the calling thread's heap for this pool and `stream`, if it has one.
    #[inline(always)]
    pub(super) fn on_thread_heap<R>(
        &self,
        stream: StreamId,
        f: impl FnOnce(&ThreadHeap) -> R,
    ) -> Option<R> {
        with_current(
            self.id,
            stream,
            || self.heap_stream(stream),
            || self.state.in_callback(),
            f,
        )
    }

    /// The calling thread's heap for this pool and `stream`, shared (slow paths).
    pub(super) fn thread_heap(&self, stream: StreamId) -> Option<Arc<ThreadHeap>> {
        current_arc(self.id, self.heap_stream(stream))
    }

    /// A new heap for the calling thread and `stream`, registered with it and with the pool;
    /// `None` when the thread is exiting, or when the stream runtime refuses the stream (the
    /// general path then reports why).
    pub(super) fn new_thread_heap(
        &self,
        state: &mut State,
        stream: StreamId,
    ) -> Option<Arc<ThreadHeap>> {
        // An exiting thread (a later thread-local destructor allocating) could not register
        // one: no heap to build and drop on each of its calls.
        THREAD_HEAPS.try_with(|_| ()).ok()?;
        let stream = self.heap_stream(stream);
        if let Some(streams) = &self.streams {
            if stream != self.home {
                // A handle that is another stream on each thread: a heap would hand a block
                // freed there by one thread to another thread's stream.
                let per_thread =
                    self.stream_call("is_per_thread", || Ok(streams.is_per_thread(stream)));
                if per_thread.unwrap_or(true) {
                    return None;
                }
                // Asked once, here: a heap's requests never reach the runtime until it needs
                // a span (see `add_span`).
                self.stream_call("validate", || streams.validate(stream))
                    .ok()?;
                // No heap while a graph reservation on the stream awaits its capture (see
                // `open_graph`) or the stream captures a graph (or cannot say): the general
                // path serves a capture, and the stream gets its heap at a request after it.
                let capturing = self.capturing(stream);
                if state.heaps_barred_on(stream, || capturing) || capturing != Some(false) {
                    return None;
                }
            }
        }
        let (cache_blocks, cache_bytes) = self.heap_cache;
        let heap = Arc::new(ThreadHeap {
            state: Lock::new(HeapState::new(
                self.base,
                self.capacity,
                cache_blocks,
                cache_bytes,
                // Round robin over the heaps there are: threads allocating at once mostly
                // have shards of their own.
                state.heaps.len() % SPARE_SHARDS,
            )),
            stream,
            frees_elsewhere: OwnerHint::default(),
        });
        if !register(self.id, self.this.clone(), &heap) {
            return None;
        }
        state.heaps.push(HeapEntry {
            heap: heap.clone(),
            clients: Vec::new(),
        });
        if stream == self.heap_stream(self.home) {
            let home = state
                .heaps
                .iter()
                .filter(|e| e.heap.stream == stream)
                .count();
            state.heap_bar.most = state.heap_bar.most.max(home);
        }
        self.share_heap_bytes(state);
        self.flags.fetch_or(HEAPS, Ordering::Relaxed);
        Some(heap)
    }

    /// Gives the calling thread's heap for `stream` back for good, if it has one: its spans go
    /// back as at the thread's exit, and a later request of the thread on `stream` makes a new
    /// heap.
    pub(super) fn give_back_thread_heap(&self, stream: StreamId) {
        // (Not from inside a callback of this pool, which holds the pool's lock further up:
        // the caller's own call on the pool reports that.)
        if self.state.in_callback() {
            return;
        }
        if let Some(heap) = take_current(self.id, self.heap_stream(stream)) {
            self.retire(&heap);
        }
    }

    /// The calling thread's heap for `stream`, unless the pool gave it back for good while
    /// its thread kept it ([`step_aside`](Self::step_aside)): that one leaves the thread's
    /// list, and `None`. (With the pool's lock held: a heap's lock is taken after it.)
    pub(super) fn usable_thread_heap(&self, stream: StreamId) -> Option<Arc<ThreadHeap>> {
        let heap = self.thread_heap(stream)?;
        if heap.state.lock_wait().retired {
            take_current(self.id, self.heap_stream(stream));
            return None;
        }
        Some(heap)
    }

    /// The pool's index has no room left for a span: every home-stream heap is given back for
    /// good, and none is made for a while (see [`HeapBar`]). Their threads keep them, retired,
    /// until they next ask for a heap ([`usable_thread_heap`](Self::usable_thread_heap)).
    #[cold]
    #[inline(never)]
    pub(super) fn step_aside(&self, state: &mut State) {
        let bar = &mut state.heap_bar;
        // (A bar not yet found over has just ended: no heap asked in between.)
        let quiet = bar.len == 0 || bar.ended.is_some_and(|t| t.elapsed() > BAR_QUIET);
        bar.len = if quiet {
            BAR_MIN
        } else {
            (bar.len * 2).clamp(BAR_MIN, BAR_MAX)
        };
        bar.ended = None;
        bar.until = state.next_serial.saturating_add(bar.len);
        let home = self.heap_stream(self.home);
        let heaps: Vec<Arc<ThreadHeap>> = state
            .heaps
            .iter()
            .filter(|e| e.heap.stream == home)
            .map(|e| e.heap.clone())
            .collect();
        let mut guards = self.lock_heaps(&heaps);
        for (heap, guard) in heaps.iter().zip(guards.iter_mut()) {
            self.dissolve(state, heap, guard, false);
            guard.retired = true;
        }
        self.spans_changed();
        state
            .heaps
            .retain(|e| !heaps.iter().any(|h| Arc::ptr_eq(h, &e.heap)));
        self.share_heap_bytes(state);
        if state.heaps.is_empty() {
            // No heap left to take from the spares: their headroom is the pool's again.
            self.drain_spares(state);
            self.flags.fetch_and(!HEAPS, Ordering::Relaxed);
        }
        drop(guards);
    }

    /// Gives `heap` back for good: its thread exits (or gives it back).
    pub(super) fn retire(&self, heap: &Arc<ThreadHeap>) {
        let mut state = self.lock_wait("a thread heap back");
        {
            let mut guard = heap.state.lock_wait();
            if guard.retired {
                return;
            }
            self.dissolve(&mut state, heap, &mut guard, false);
            self.spans_changed();
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
        let mut state = self.lock_wait("its thread heaps back");
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
        self.spans_changed();
    }
}

#[cfg(test)]
mod tests;
