//! The pool shared by threads, with thread heaps: a reference model on one thread and on
//! four, threads that exit or outlive their pool, the hard cap and quotas with bytes sitting in
//! other threads' heaps, leak reports, the event log, streams, slices and tracking.
//!
//! Thread heaps normally appear only where threads meet on the pool's lock; most tests here
//! build pools with `eager_thread_heaps(true)` so that every thread has one from its first
//! allocation, and what they check does not depend on timing.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Barrier, Mutex, mpsc};

use devarena::backend::{HostVirtualMemory, VmCall};
use devarena::pool::{
    AllocRequest, FreeRequest, ManualStreams, PoolAction, PoolEvent, PoolSlice, PoolStats,
    StreamEvent, StreamId, StreamSync, Tracking, guaranteed_fit,
};
use devarena::{Error, Pool, PoolClient};

/// Loops run a hundredth of their steps under Miri (`scripts/miri.sh`), which runs each step
/// thousands of times slower.
const MIRI_SCALE: usize = if cfg!(miri) { 100 } else { 1 };

mod rng;
use rng::Rng;

/// The bytes a request takes, computed independently of the pool: 256-byte granules, then
/// (from 32 granules on) a multiple of 1/32 of the size's power of two.
fn class_rounded(size: usize) -> usize {
    let units = size.max(1).div_ceil(256);
    if units < 32 {
        return units * 256;
    }
    let step = 1usize << (units.ilog2() - 5);
    units.div_ceil(step) * step * 256
}

/// The largest request whose reserved bytes are at most `bytes` (a multiple of 256).
fn fit_down(bytes: usize) -> usize {
    let mut size = bytes;
    while class_rounded(size) > bytes {
        size -= 256;
    }
    size
}

/// Fills client `client`'s quota exactly (one large block, then 256-byte ones); the blocks.
fn fill_quota(client: &PoolClient, quota: usize) -> Vec<u64> {
    let room = quota - client.stats().in_use;
    let mut blocks = vec![client.allocate(fit_down(room), 0).unwrap()];
    while client.stats().in_use < quota {
        blocks.push(client.allocate(256, 0).unwrap());
    }
    blocks
}

#[derive(Debug, Clone, Copy)]
struct Block {
    reserved: usize,
    size: usize,
    client: usize,
}

/// The reference: live blocks by address and every count, by client (the pool's own client
/// is 0).
#[derive(Debug)]
struct Model {
    base: u64,
    capacity: usize,
    quotas: Vec<usize>,
    live: BTreeMap<u64, Block>,
    in_use: Vec<usize>,
    requested: Vec<usize>,
    peak: Vec<usize>,
    pool_peak: usize,
    allocations: Vec<u64>,
    frees: Vec<u64>,
    failures: Vec<u64>,
}

impl Model {
    fn new(pool: &Pool, quotas: &[usize]) -> Self {
        let n = quotas.len();
        Model {
            base: pool.base(),
            capacity: pool.capacity(),
            quotas: quotas.to_vec(),
            live: BTreeMap::new(),
            in_use: vec![0; n],
            requested: vec![0; n],
            peak: vec![0; n],
            pool_peak: 0,
            allocations: vec![0; n],
            frees: vec![0; n],
            failures: vec![0; n],
        }
    }

    fn in_use(&self) -> usize {
        self.in_use.iter().sum()
    }

    /// A new live block: inside the region, aligned, overlapping no other.
    fn allocated(&mut self, addr: u64, size: usize, align: usize, client: usize) {
        let reserved = class_rounded(size);
        assert!(addr >= self.base && addr + reserved as u64 <= self.base + self.capacity as u64);
        assert_eq!(addr % align.max(256) as u64, 0, "alignment {align}");
        if let Some((&prev, b)) = self.live.range(..addr).next_back() {
            assert!(
                prev + b.reserved as u64 <= addr,
                "{addr:#x} overlaps {prev:#x}"
            );
        }
        if let Some((&next, _)) = self.live.range(addr..).next() {
            assert!(
                addr + reserved as u64 <= next,
                "{addr:#x} overlaps {next:#x}"
            );
        }
        self.live.insert(
            addr,
            Block {
                reserved,
                size,
                client,
            },
        );
        self.in_use[client] += reserved;
        self.requested[client] += size;
        self.allocations[client] += 1;
        self.peak[client] = self.peak[client].max(self.in_use[client]);
        self.pool_peak = self.pool_peak.max(self.in_use());
        assert!(self.in_use[client] <= self.quotas[client]);
    }

    fn freed(&mut self, addr: u64) -> Block {
        let b = self.live.remove(&addr).expect("a live block");
        self.in_use[b.client] -= b.reserved;
        self.requested[b.client] -= b.size;
        self.frees[b.client] += 1;
        b
    }

    /// The free runs between live blocks: with every heap given back, the pool's free blocks.
    fn gaps(&self) -> Vec<usize> {
        let mut gaps = Vec::new();
        let mut at = self.base;
        for (&addr, b) in &self.live {
            if addr > at {
                gaps.push((addr - at) as usize);
            }
            at = addr + b.reserved as u64;
        }
        let end = self.base + self.capacity as u64;
        if end > at {
            gaps.push((end - at) as usize);
        }
        gaps
    }

    /// Every count of the pool and its clients, the free blocks, the leak report.
    fn check(&self, pool: &Pool, exact_peaks: bool) {
        self.check_peaks(pool, exact_peaks.then_some(0));
    }

    /// [`check`](Self::check), the peaks exact (`Some(0)`), not checked (`None`), or at
    /// least the peak reached and at most `slack` above it.
    fn check_peaks(&self, pool: &Pool, slack: Option<usize>) {
        let exact_peaks = slack == Some(0);
        let clients = pool.client_stats();
        for (c, s) in clients.iter().enumerate() {
            let got = (
                s.in_use,
                s.requested,
                s.allocations,
                s.frees,
                s.failures,
                s.live,
            );
            let want = (
                self.in_use[c],
                self.requested[c],
                self.allocations[c],
                self.frees[c],
                self.failures[c],
                self.allocations[c] - self.frees[c],
            );
            assert_eq!(got, want, "client {}", s.name);
            assert!(s.peak <= s.quota && s.peak >= s.in_use, "client {}", s.name);
            if exact_peaks {
                assert_eq!(s.peak, self.peak[c], "peak of client {}", s.name);
            }
            if let Some(slack) = slack {
                assert!(s.peak >= self.peak[c] && s.peak <= self.peak[c] + slack);
            }
        }
        let report = pool.leak_report();
        let leaked: Vec<(u64, usize, usize)> = report
            .leaks
            .iter()
            .map(|l| (l.addr, l.size, l.reserved))
            .collect();
        let live: Vec<(u64, usize, usize)> = self
            .live
            .iter()
            .map(|(&a, b)| (a, b.size, b.reserved))
            .collect();
        assert_eq!(leaked, live);
        let stats = pool.stats();
        let gaps = self.gaps();
        assert_eq!(
            (stats.in_use, stats.live, stats.free, stats.free_blocks),
            (
                self.in_use(),
                self.live.len() as u64,
                self.capacity - self.in_use(),
                gaps.len()
            )
        );
        assert_eq!(stats.largest_free, gaps.iter().copied().max().unwrap_or(0));
        assert_eq!(
            (stats.allocations, stats.frees, stats.failures),
            (
                self.allocations.iter().sum(),
                self.frees.iter().sum(),
                self.failures.iter().sum()
            )
        );
        assert_eq!(stats.requested, self.requested.iter().sum::<usize>());
        assert!(stats.peak <= self.capacity && stats.peak >= stats.in_use);
        if exact_peaks {
            assert_eq!(stats.peak, self.pool_peak, "the pool's peak");
        }
        if let Some(slack) = slack {
            assert!(stats.peak >= self.pool_peak && stats.peak <= self.pool_peak + slack);
        }
    }
}

/// Checks a failed allocation of `size` at `align` for client `c` against the model: which
/// limit, and the figures (the free ones with every heap given back).
fn check_refusal(model: &Model, err: &Error, c: usize, size: usize, align: usize) {
    let Error::PoolExhausted {
        requested,
        limit,
        limit_bytes,
        in_use,
        free,
        largest_free,
        pending,
        ..
    } = err
    else {
        panic!("unexpected error {err}");
    };
    let reserved = class_rounded(size);
    let gaps = model.gaps();
    let largest = gaps.iter().copied().max().unwrap_or(0);
    assert_eq!(*requested, size);
    assert_eq!(
        (*free, *largest_free, *pending),
        (model.capacity - model.in_use(), largest, 0)
    );
    if model.in_use[c] + reserved > model.quotas[c] {
        assert_eq!(
            (*limit, *limit_bytes, *in_use),
            ("quota", model.quotas[c], model.in_use[c])
        );
    } else {
        assert_eq!((*limit, *limit_bytes), ("capacity", model.capacity));
        assert_eq!(*in_use, model.in_use());
        let fit = guaranteed_fit(size, align).unwrap();
        assert!(
            largest < fit,
            "failed with a free block of {largest} >= {fit}"
        );
    }
}

const QUOTAS: [usize; 3] = [usize::MAX, 3 << 20, 5 << 20];

fn clients(pool: &Pool) -> Vec<PoolClient> {
    vec![
        pool.own_client().clone(),
        pool.client("a", QUOTAS[1]),
        pool.client("b", QUOTAS[2]),
    ]
}

/// `ops` random allocations and frees on one thread, checked against the model (with exact
/// peaks) every `check_every` operations and at every failure.
fn run_model(pool: &Pool, model: &mut Model, clients: &[PoolClient], seed: u64, ops: usize) {
    run_model_peaks(pool, model, clients, seed, ops, Some(0));
}

/// [`run_model`] with the peaks checked as [`Model::check_peaks`] does.
fn run_model_peaks(
    pool: &Pool,
    model: &mut Model,
    clients: &[PoolClient],
    seed: u64,
    ops: usize,
    slack: Option<usize>,
) {
    let mut rng = Rng(seed);
    let mut failures = 0;
    for step in 0..ops {
        let mine: Vec<u64> = model.live.keys().copied().collect();
        if rng.below(100) < 55 || mine.is_empty() {
            let c = rng.below(clients.len() as u64) as usize;
            let size = rng.size(512 << 10);
            let align = rng.align();
            match clients[c].allocate(size, align) {
                Ok(addr) => model.allocated(addr, size, align, c),
                Err(err) => {
                    model.failures[c] += 1;
                    check_refusal(model, &err, c, size, align);
                    failures += 1;
                }
            }
        } else {
            let addr = mine[rng.below(mine.len() as u64) as usize];
            let b = model.live[&addr];
            if rng.below(2) == 0 {
                pool.deallocate(addr).unwrap();
            } else {
                clients[b.client].deallocate(addr).unwrap();
            }
            model.freed(addr);
        }
        if step % 211 == 0 {
            model.check_peaks(pool, slack);
        }
    }
    assert!(failures > 0, "the workload reaches the limits");
}

#[test]
fn one_thread_on_a_heap_matches_the_model_exactly() {
    // Every count, every refusal (with its figures) and both peaks as a pool without heaps
    // would give them; between the checks (which give the heap back) the heap serves.
    let pool = Pool::builder(8 << 20)
        .name("model-heap")
        .eager_thread_heaps(true)
        .log_leaks_on_drop(false)
        .build_host()
        .unwrap();
    let clients = clients(&pool);
    let mut model = Model::new(&pool, &QUOTAS);
    run_model(&pool, &mut model, &clients, 0x1234_5678, 20_000);
    assert_eq!(pool.thread_heaps(), 1);
    model.check(&pool, true);
    assert!(pool.stats().reused > 0);
}

#[test]
fn peaks_that_count_leases_are_bounds_and_every_other_count_stays_exact() {
    // `exact_peaks(false)`: a peak may count the headroom a heap holds (a chunk beyond its
    // need, and up to three chunks before it gives some back; a chunk is 1/256 of the
    // capacity, or twice the largest request up to 1/32 of the capacity, here 1/32: requests
    // go up to 512 KiB): at least the peak reached and not far above it. Quotas, refusals and
    // every other count stay exact.
    let capacity = 8 << 20;
    let pool = Pool::builder(capacity)
        .name("leased-peaks")
        .eager_thread_heaps(true)
        .exact_peaks(false)
        .log_leaks_on_drop(false)
        .build_host()
        .unwrap();
    let clients = clients(&pool);
    let mut model = Model::new(&pool, &QUOTAS);
    let slack = 3 * capacity / 32;
    run_model_peaks(&pool, &mut model, &clients, 0x5eed, 20_000, Some(slack));
    model.check_peaks(&pool, Some(slack));
}

#[test]
fn bytes_in_an_idle_threads_heap_count_for_the_cap_and_the_quotas() {
    // Another thread allocates and frees for the same clients, then waits with its heap full
    // of free spans and unused leases, and with live allocations in it. This thread's requests
    // must succeed whenever they would with that heap given back, refuse exactly where a
    // quota or the capacity says so, and free the other thread's allocations.
    let pool = Pool::builder(8 << 20)
        .name("idle-heap")
        .eager_thread_heaps(true)
        .log_leaks_on_drop(false)
        .build_host()
        .unwrap();
    let clients = clients(&pool);
    let mut model = Model::new(&pool, &QUOTAS);
    let (to_main, from_other) = mpsc::channel();
    let (to_other, from_main) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        // Moved in: a failure below drops it, and the other thread stops waiting.
        let to_other = to_other;
        let other_clients = clients.clone();
        // Joined explicitly: a thread's heaps go back in its thread-local destructors, which
        // a scope's implicit join does not wait for.
        let other = s.spawn(move || {
            let mut rng = Rng(99);
            let mut live = Vec::new();
            for _ in 0..3000 {
                let c = rng.below(3) as usize;
                if let Ok(addr) = other_clients[c].allocate(rng.size(64 << 10), 0) {
                    live.push((addr, c));
                }
                if live.len() > 40 {
                    let (addr, c) = live.swap_remove(rng.below(live.len() as u64) as usize);
                    other_clients[c].deallocate(addr).unwrap();
                }
            }
            // Keep a few live; report them (with their sizes, from the leak report).
            while live.len() > 5 {
                let (addr, c) = live.pop().unwrap();
                other_clients[c].deallocate(addr).unwrap();
            }
            to_main.send(live).unwrap();
            // An error here: the main thread failed and dropped its sender.
            let _ = from_main.recv();
        });
        let kept: Vec<(u64, usize)> = from_other.recv().unwrap();
        assert_eq!(pool.thread_heaps(), 1);
        // The other thread's counts and live blocks enter the model as they are.
        let report = pool.leak_report();
        for (c, s) in pool.client_stats().iter().enumerate() {
            model.allocations[c] = s.allocations;
            model.frees[c] = s.frees;
            model.failures[c] = s.failures;
            model.peak[c] = s.peak;
        }
        model.pool_peak = pool.stats().peak;
        for &(addr, c) in &kept {
            let leak = report.leaks.iter().find(|l| l.addr == addr).unwrap();
            model.live.insert(
                addr,
                Block {
                    reserved: leak.reserved,
                    size: leak.size,
                    client: c,
                },
            );
            model.in_use[c] += leak.reserved;
            model.requested[c] += leak.size;
        }
        to_other.send(()).unwrap();
        other.join().unwrap();
    });
    assert_eq!(pool.thread_heaps(), 0, "the other thread exited");
    model.check(&pool, false);
    // Again with the other thread alive and idle, its heap full.
    let (to_main, from_other) = mpsc::channel();
    let (to_other, from_main) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let to_other = to_other;
        let other_clients = clients.clone();
        let other = s.spawn(move || {
            let mut rng = Rng(7);
            for _ in 0..2000 {
                let c = 1 + rng.below(2) as usize;
                let a = other_clients[c].allocate(rng.size(256 << 10), 0).unwrap();
                let b = other_clients[c].allocate(rng.size(256 << 10), 0).unwrap();
                other_clients[c].deallocate(a).unwrap();
                other_clients[c].deallocate(b).unwrap();
            }
            to_main.send(()).unwrap();
            // An error here: the main thread failed and dropped its sender.
            let _ = from_main.recv();
        });
        from_other.recv().unwrap();
        // The other thread's pairs, counted without giving its heap back (which `stats` or a
        // failure would do).
        for (c, stats) in pool.client_stats().iter().enumerate().skip(1) {
            assert_eq!(
                stats.allocations - stats.frees,
                model.allocations[c] - model.frees[c]
            );
            model.allocations[c] = stats.allocations;
            model.frees[c] = stats.frees;
        }
        // Without a check first (which would give the other heap back): the quota of each
        // client is there whole, though the other heap holds leases of both.
        for (c, client) in clients.iter().enumerate().skip(1) {
            assert_eq!(client.stats().in_use, model.in_use[c]);
            let blocks = fill_quota(client, model.quotas[c]);
            let report = pool.leak_report();
            for &addr in &blocks {
                let leak = report.leaks.iter().find(|l| l.addr == addr).unwrap();
                model.allocated(addr, leak.size, 0, c);
            }
            let err = client.allocate(1, 0).unwrap_err();
            model.failures[c] += 1;
            check_refusal(&model, &err, c, 1, 0);
            for addr in blocks {
                client.deallocate(addr).unwrap();
                model.freed(addr);
            }
        }
        // And everything free is there for one request, though the other heap holds spans.
        let largest = model.gaps().into_iter().max().unwrap();
        let size = fit_down(largest);
        let big = pool.allocate(size, 0).unwrap();
        model.allocated(big, size, 0, 0);
        pool.deallocate(big).unwrap();
        model.freed(big);
        run_model(&pool, &mut model, &clients, 0xfeed, 6000);
        to_other.send(()).unwrap();
        other.join().unwrap();
    });
    for addr in model.live.keys().copied().collect::<Vec<_>>() {
        pool.deallocate(addr).unwrap();
        model.freed(addr);
    }
    model.check(&pool, false);
    assert_eq!(pool.stats().largest_free, 8 << 20);
}

#[test]
fn four_threads_a_million_operations_on_heaps_without_overlap_and_exact_after_joining() {
    million(true);
}

#[test]
fn four_threads_a_million_operations_meeting_on_the_lock() {
    // Heaps only where threads meet on the pool's lock: some threads allocate in the pool's
    // own index while others hold leases.
    million(false);
}

/// A block handed to another thread to free: address, size, alignment, client (0: the
/// allocating thread's own, 1: the shared one).
type Handed = (u64, usize, usize, usize);

fn million(eager: bool) {
    million_with(eager, true, Memory::Classic);
}

#[test]
fn four_threads_a_million_operations_with_peaks_that_count_leases() {
    million_with(true, false, Memory::Classic);
}

#[test]
fn four_threads_a_million_operations_on_heaps_on_a_growable_region() {
    // As above on addresses mapped in 64 KiB chunks as blocks reach them, mostly from the
    // heaps, while one thread trims and another applies a release threshold now and then:
    // every block is mapped from its allocation to its free, a slice keeps what was written
    // into it (a chunk mapped or unmapped under it would be filled over), and at the end a
    // trim gives everything back.
    million_with(true, true, Memory::Growable);
}

#[test]
fn four_threads_a_million_operations_meeting_on_the_lock_of_a_growable_region() {
    million_with(false, true, Memory::Growable);
}

/// Where a test pool's memory comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Memory {
    /// One host allocation of the capacity.
    Classic,
    /// The host stand-in for a device's virtual memory, mapped on demand in 64 KiB chunks.
    Growable,
}

fn million_with(eager: bool, exact_peaks: bool, memory: Memory) {
    // 250,000 allocations and frees on each of four threads: sizes up to 64 KiB, every
    // alignment, each thread's own client and a shared one under a quota, slices, frees of
    // other threads' blocks, now and then a leak report or statistics (every heap locked for
    // a moment) while the others run, and refusals for capacity (every heap gives its spans
    // back). A shared model sees each block between the pool's
    // answer and its free: two live blocks never overlap. After joining, every count is exact.
    const THREADS: usize = 4;
    const OPS: usize = 250_000 / MIRI_SCALE;
    let capacity = 24 << 20;
    let builder = Pool::builder(capacity)
        .name("million")
        .eager_thread_heaps(eager)
        .exact_peaks(exact_peaks)
        .thread_heaps(2 << 20)
        .release_threshold(4 << 20)
        .log_leaks_on_drop(false);
    let vm =
        (memory == Memory::Growable).then(|| Arc::new(HostVirtualMemory::new(64 << 10).unwrap()));
    let pool = match &vm {
        Some(vm) => builder.build_mapped(vm.clone()),
        None => builder.build_host(),
    }
    .unwrap();
    let vm = vm.as_deref();
    let shared = pool.client("shared", 4 << 20);
    let own: Vec<PoolClient> = (0..THREADS)
        .map(|t| pool.client(&format!("thread-{t}"), 6 << 20))
        .collect();
    // Live blocks of every thread: address -> (end, thread).
    let model: Mutex<BTreeMap<u64, (u64, usize)>> = Mutex::new(BTreeMap::new());
    // Blocks handed to the next thread to free: (address, client index: 0 own, 1 shared).
    let handoff: Vec<Mutex<Vec<Handed>>> = (0..THREADS).map(|_| Mutex::new(Vec::new())).collect();
    let start = Barrier::new(THREADS);
    // Per thread: (allocations, frees, failures) per client: own, shared (frees of blocks
    // handed to another thread are not counted here).
    let counts: Vec<[[u64; 3]; 2]> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (pool, shared, own) = (&pool, &shared, &own);
                let (model, handoff, start) = (&model, &handoff, &start);
                s.spawn(move || {
                    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1));
                    let clients = [&own[t], shared];
                    // Own live blocks: (address, size, align, client index); slices apart.
                    let mut live: Vec<(u64, usize, usize, usize)> = Vec::new();
                    let mut slices: Vec<PoolSlice<u8>> = Vec::new();
                    let mut counts = [[0u64; 3]; 2];
                    let insert = |addr: u64, size: usize| {
                        let end = addr + class_rounded(size) as u64;
                        let mut m = model.lock().unwrap();
                        if let Some((&prev, &(prev_end, who))) = m.range(..addr).next_back() {
                            assert!(prev_end <= addr, "{addr:#x} overlaps {prev:#x} of {who}");
                        }
                        if let Some((&next, &(_, who))) = m.range(addr..).next() {
                            assert!(end <= next, "{addr:#x} overlaps {next:#x} of {who}");
                        }
                        m.insert(addr, (end, t));
                    };
                    let remove = |addr: u64| {
                        let (end, _) = model.lock().unwrap().remove(&addr).unwrap();
                        // Mapped until its free, trims or not.
                        if let Some(vm) = vm {
                            assert!(vm.is_mapped(addr, (end - addr) as usize), "{addr:#x}");
                        }
                    };
                    // What a slice holds on a growable region: its thread's byte.
                    let mark = t as u8 + 1;
                    start.wait();
                    for op in 0..OPS {
                        let r = rng.below(1000);
                        if r < 480 && live.len() < 300 {
                            let c = (rng.below(4) == 0) as usize;
                            let (size, align) = (rng.size(64 << 10), rng.align());
                            match clients[c].allocate(size, align) {
                                Ok(addr) => {
                                    assert_eq!(addr % align.max(256) as u64, 0);
                                    if let Some(vm) = vm {
                                        assert!(vm.is_mapped(addr, class_rounded(size)));
                                    }
                                    insert(addr, size);
                                    live.push((addr, size, align, c));
                                    counts[c][0] += 1;
                                }
                                Err(Error::PoolExhausted { limit, .. }) => {
                                    assert!(limit == "quota" || limit == "capacity");
                                    counts[c][2] += 1;
                                }
                                Err(e) => panic!("{e}"),
                            }
                        } else if r < 500 && slices.len() < 8 {
                            let len = rng.size(8 << 10);
                            if let Ok(mut slice) = own[t].alloc_slice::<u8>(len) {
                                if vm.is_some() {
                                    slice.as_mut_slice().unwrap().fill(mark);
                                }
                                insert(slice.addr(), len);
                                slices.push(slice);
                                counts[0][0] += 1;
                            } else {
                                counts[0][2] += 1;
                            }
                        } else if r < 510 && !slices.is_empty() {
                            let slice = slices.swap_remove(rng.below(slices.len() as u64) as usize);
                            // Only the slice frees its block.
                            assert!(pool.deallocate(slice.addr()).is_err());
                            if vm.is_some() {
                                assert!(slice.as_slice().unwrap().iter().all(|&b| b == mark));
                            }
                            remove(slice.addr());
                            drop(slice);
                            counts[0][1] += 1;
                        } else if r < 530 && !live.is_empty() {
                            // To the next thread, which frees it.
                            let block = live.swap_remove(rng.below(live.len() as u64) as usize);
                            handoff[(t + 1) % THREADS].lock().unwrap().push(block);
                        } else if r < 560 {
                            let given: Vec<_> = core::mem::take(&mut *handoff[t].lock().unwrap());
                            for (addr, size, _, c) in given {
                                remove(addr);
                                // The previous thread's own client, or the shared one.
                                let owner = match c {
                                    0 => &own[(t + THREADS - 1) % THREADS],
                                    _ => shared,
                                };
                                owner
                                    .deallocate_with(FreeRequest::new(addr).size(size))
                                    .unwrap();
                            }
                        } else if !live.is_empty() {
                            let (addr, _, _, c) =
                                live.swap_remove(rng.below(live.len() as u64) as usize);
                            remove(addr);
                            clients[c].deallocate(addr).unwrap();
                            counts[c][1] += 1;
                        }
                        if vm.is_some() && op % (20_000 / MIRI_SCALE) == 20_000 / MIRI_SCALE - 1 {
                            // Memory back while the other threads allocate on their heaps.
                            match t {
                                0 => drop(pool.trim().unwrap()),
                                1 => drop(pool.synchronize().unwrap()),
                                _ => {}
                            }
                        }
                        if op % (60_000 / MIRI_SCALE) == 60_000 / MIRI_SCALE - 1 {
                            if t % 2 == 0 {
                                let s = pool.stats();
                                assert!(s.in_use <= capacity && s.peak <= capacity);
                            } else {
                                assert!(!pool.leak_report().is_empty() || live.is_empty());
                            }
                        }
                    }
                    for (addr, _, _, c) in live.drain(..) {
                        remove(addr);
                        clients[c].deallocate(addr).unwrap();
                        counts[c][1] += 1;
                    }
                    for slice in slices.drain(..) {
                        if vm.is_some() {
                            assert!(slice.as_slice().unwrap().iter().all(|&b| b == mark));
                        }
                        remove(slice.addr());
                        drop(slice);
                        counts[0][1] += 1;
                    }
                    counts
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Blocks handed off and not freed yet: freed now.
    let mut handed = 0u64;
    for queue in &handoff {
        for (addr, _, _, _) in queue.lock().unwrap().drain(..) {
            pool.deallocate(addr).unwrap();
            model.lock().unwrap().remove(&addr);
            handed += 1;
        }
    }
    assert!(model.lock().unwrap().is_empty());
    assert_eq!(pool.thread_heaps(), 0, "every thread gave its heap back");
    assert!(pool.stats().reused > 0);
    let allocations: u64 = counts.iter().map(|c| c[0][0] + c[1][0]).sum();
    let failures: u64 = counts.iter().map(|c| c[0][2] + c[1][2]).sum();
    let s = pool.stats();
    assert_eq!(
        (s.allocations, s.frees, s.failures),
        (allocations, allocations, failures)
    );
    // Requests made, not requests served: how many fail for capacity depends on how many
    // blocks the other threads hold at that moment (handed-off blocks wait for a thread that
    // may not be running), which on a busy machine reached 195,000 of about 490,000.
    assert!(
        allocations + failures > 400_000 / MIRI_SCALE as u64 && handed > 0,
        "{allocations} + {failures} {handed}"
    );
    assert_eq!((s.in_use, s.requested, s.live), (0, 0, 0));
    assert_eq!(
        (s.free, s.free_blocks, s.largest_free),
        (capacity, 1, capacity)
    );
    assert!(s.peak <= capacity);
    let stats = pool.client_stats();
    let by_name: HashMap<&str, _> = stats.iter().map(|c| (c.name.as_str(), c)).collect();
    let sh = by_name["shared"];
    let shared_allocations: u64 = counts.iter().map(|c| c[1][0]).sum();
    assert_eq!(
        (sh.allocations, sh.frees, sh.in_use),
        (shared_allocations, shared_allocations, 0)
    );
    assert_eq!(sh.failures, counts.iter().map(|c| c[1][2]).sum::<u64>());
    assert!(sh.peak <= 4 << 20 && sh.peak > 0);
    for (t, c) in counts.iter().enumerate() {
        let own = by_name[format!("thread-{t}").as_str()];
        let got = (own.allocations, own.frees, own.failures, own.in_use);
        assert_eq!(got, (c[0][0], c[0][0], c[0][2], 0));
        assert!(own.peak <= 6 << 20);
    }
    if let Some(vm) = vm {
        let s = pool.stats();
        assert!(s.maps > 0 && s.unmaps > 0, "{s}");
        assert_eq!((s.mapped, s.live), (vm.mapped_bytes(), 0));
        // Nothing live, no heap: every chunk goes back.
        assert_eq!(pool.trim().unwrap(), s.mapped);
        assert_eq!((vm.mapped_bytes(), pool.stats().mapped), (0, 0));
    }
}

/// Statistics read while four threads' heaps hold live blocks, free blocks in their spans
/// and blocks in their reuse caches (and the pool's index holds some of each too): the heaps
/// are left as they are, and every figure is what the statistics say once a refusal has made
/// every heap give its spans back and every cache merge.
#[test]
fn statistics_leave_every_heap_as_it_is_and_describe_it_as_given_back() {
    for (seed, eager, exact_peaks) in [(1, true, true), (2, true, false), (3, false, true)] {
        let capacity = 128 << 20;
        let pool = Pool::builder(capacity)
            .name("stats-in-place")
            .eager_thread_heaps(eager)
            .exact_peaks(exact_peaks)
            .log_leaks_on_drop(false)
            .build_host()
            .unwrap();
        let threads = 4;
        let paused = Barrier::new(threads + 1);
        let resumed = Barrier::new(threads + 1);
        // Without eager heaps, made before any thread has a heap: the pool's index holds a
        // live block and a cached one (with them, the main thread's heap does).
        let own = pool.allocate(3 << 20, 0).unwrap();
        let cached = pool.allocate(5000, 0).unwrap();
        pool.deallocate(cached).unwrap();
        std::thread::scope(|s| {
            for t in 0..threads {
                let (pool, paused, resumed) = (&pool, &paused, &resumed);
                s.spawn(move || {
                    let client = pool.client(&format!("t{t}"), usize::MAX);
                    let mut rng = Rng(seed * 1000 + t as u64 + 1);
                    let mut live = Vec::new();
                    for _ in 0..400 {
                        if live.len() < 24 && rng.below(3) != 0 || live.is_empty() {
                            let size = rng.size(1 << 20);
                            live.push(client.allocate(size, rng.align()).unwrap());
                        } else {
                            let at = rng.below(live.len() as u64) as usize;
                            client.deallocate(live.swap_remove(at)).unwrap();
                        }
                    }
                    paused.wait();
                    resumed.wait();
                    for addr in live {
                        client.deallocate(addr).unwrap();
                    }
                });
            }
            paused.wait();
            // Checked while the threads wait; they are let go whatever the outcome, so that a
            // failed check fails the test instead of leaving them waiting.
            let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                // (Without eager heaps, a thread has one only if it met another on the pool's
                // lock.)
                let heaps = pool.thread_heaps();
                assert!(!eager || heaps > threads, "seed {seed}: {heaps} heaps");
                let live = live_blocks(&pool);
                let first = pool.stats();
                // Nothing was given back or merged: the heaps, and what they hold, are where
                // they were, and the block cached before the look is taken whole again (a
                // heap given back, or a cache merged, would have merged it). With eager heaps
                // that block waits in the main thread's own heap, which no other thread used.
                // (Without them it lies in the pool's index, whose cache the other threads'
                // frees may have cycled through, and the main thread may get a heap.)
                assert_eq!(pool.thread_heaps(), heaps);
                assert_eq!(live_blocks(&pool), live);
                let reuse = eager;
                if reuse {
                    assert_eq!(pool.allocate(5000, 0).unwrap(), cached, "seed {seed}");
                    pool.deallocate(cached).unwrap();
                }
                let seen = pool.stats();
                let more = u64::from(reuse);
                assert_eq!(
                    seen,
                    PoolStats {
                        allocations: first.allocations + more,
                        frees: first.frees + more,
                        reused: first.reused + more,
                        ..first
                    },
                    "seed {seed}: the block cached before the first look was not reused whole"
                );
                let clients = pool.client_stats();
                let in_use: usize = live.iter().map(|&(_, reserved)| reserved).sum();
                assert_eq!((seen.in_use, seen.live), (in_use, live.len() as u64));
                assert_eq!(seen.free, capacity - in_use - seen.pending);
                // A request that cannot succeed makes every heap give its spans back and merges
                // every cache before it fails: then the free blocks exist as described.
                assert!(pool.allocate(capacity, 0).is_err());
                let merged = pool.stats();
                assert_eq!(
                    merged,
                    PoolStats {
                        failures: seen.failures + 1,
                        ..seen
                    },
                    "seed {seed}: statistics before and after the heaps gave their spans back"
                );
                assert_eq!(live_blocks(&pool), live);
                let after: Vec<_> = pool.client_stats();
                assert_eq!(after[0].failures, clients[0].failures + 1);
                assert_eq!(after[1..], clients[1..]);
            }));
            resumed.wait();
            if let Err(panic) = checked {
                std::panic::resume_unwind(panic);
            }
            pool.deallocate(own).unwrap();
        });
        let s = pool.stats();
        assert_eq!((s.live, s.in_use, s.free_blocks), (0, 0, 1), "seed {seed}");
        assert_eq!(s.largest_free, capacity);
    }
}

#[test]
fn a_thread_that_exits_gives_its_heap_back() {
    let pool = Pool::builder(4 << 20)
        .name("exiting")
        .eager_thread_heaps(true)
        .thread_heaps(1 << 20)
        .log_leaks_on_drop(false)
        .build_host()
        .unwrap();
    let client = pool.client("worker", 2 << 20);
    let kept = std::thread::scope(|s| {
        s.spawn(|| {
            let mut rng = Rng(5);
            let mut live = Vec::new();
            for _ in 0..2000 {
                live.push(client.allocate(rng.size(32 << 10), 0).unwrap());
                if live.len() > 20 {
                    let addr = live.swap_remove(rng.below(live.len() as u64) as usize);
                    client.deallocate(addr).unwrap();
                }
            }
            assert_eq!(pool.thread_heaps(), 1);
            for addr in live.drain(3..) {
                client.deallocate(addr).unwrap();
            }
            live
        })
        .join()
        .unwrap()
    });
    // The thread's heap went back when it exited: its live blocks are the pool's now, its
    // unused lease is no longer counted, its spans are free.
    assert_eq!(pool.thread_heaps(), 0);
    let report = pool.leak_report();
    assert_eq!(report.leaks.len(), 3);
    assert_eq!(report.leaks.iter().map(|l| l.addr).collect::<Vec<_>>(), {
        let mut k = kept.clone();
        k.sort();
        k
    });
    let held: usize = report.leaks.iter().map(|l| l.reserved).sum();
    let c = client.stats();
    assert_eq!((c.in_use, c.live, c.allocations - c.frees), (held, 3, 3));
    // The quota is there to the byte, and no further.
    let blocks = fill_quota(&client, 2 << 20);
    assert_eq!(client.stats().peak, 2 << 20);
    let err = client.allocate(1, 0).unwrap_err();
    assert!(
        matches!(err, Error::PoolExhausted { limit: "quota", in_use, .. } if in_use == 2 << 20)
    );
    for addr in blocks.into_iter().chain(kept) {
        client.deallocate(addr).unwrap();
    }
    let c = client.stats();
    let s = pool.stats();
    assert_eq!(
        (s.in_use, s.live, s.free_blocks, s.largest_free),
        (0, 0, 1, 4 << 20)
    );
    assert_eq!(
        (s.allocations, s.frees, c.in_use),
        (c.allocations, c.allocations, 0)
    );
}

#[test]
fn a_pool_dropped_while_threads_hold_heaps_frees_its_region_once() {
    // A thread keeps its heap (with live blocks) past the pool; then uses another pool, and
    // exits. Nothing leaks, nothing is freed twice, nothing crashes.
    let first = Pool::builder(1 << 20)
        .name("dropped-first")
        .eager_thread_heaps(true)
        .log_leaks_on_drop(false)
        .build_host()
        .unwrap();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (dropped_tx, dropped_rx) = mpsc::channel::<()>();
    let worker = first.own_client().clone();
    drop(first);
    let handle = std::thread::spawn(move || {
        let a = worker.allocate(1000, 0).unwrap();
        let b = worker.allocate(5000, 0).unwrap();
        worker.deallocate(a).unwrap();
        ready_tx.send(b).unwrap();
        drop(worker);
        dropped_rx.recv().unwrap();
        // The first pool is gone; its heap in this thread's list is empty. Another pool works
        // (and the list forgets the dead one).
        let second = Pool::builder(1 << 20)
            .name("second")
            .eager_thread_heaps(true)
            .build_host()
            .unwrap();
        let c = second.allocate(300, 0).unwrap();
        second.deallocate(c).unwrap();
        assert_eq!(second.thread_heaps(), 1);
        second.stats()
    });
    let _live_in_heap = ready_rx.recv().unwrap();
    // The worker dropped its client: the pool is gone now, with a block live in the heap.
    dropped_tx.send(()).unwrap();
    let stats = handle.join().unwrap();
    assert_eq!((stats.allocations, stats.frees, stats.in_use), (1, 1, 0));
}

#[test]
fn live_blocks_of_heaps_are_in_the_leak_report() {
    let pool = Pool::builder(1 << 20)
        .name("leaky-heaps")
        .eager_thread_heaps(true)
        .log_leaks_on_drop(false)
        .build_host()
        .unwrap();
    let client = pool.client("loader", usize::MAX);
    let addrs: Vec<u64> = std::thread::scope(|s| {
        s.spawn(|| {
            let v: Vec<u64> = (0..4)
                .map(|i| client.allocate(1000 * (i + 1), 0).unwrap())
                .collect();
            // Still this thread's: the report lists them with their client, sizes, serials.
            let report = pool.leak_report();
            assert_eq!(report.leaks.len(), 4);
            v
        })
        .join()
        .unwrap()
    });
    let report = pool.leak_report();
    let mut want = addrs.clone();
    want.sort();
    assert_eq!(
        report.leaks.iter().map(|l| l.addr).collect::<Vec<_>>(),
        want
    );
    assert!(report.leaks.iter().all(|l| l.client == "loader"));
    let mut serials: Vec<u64> = report.leaks.iter().map(|l| l.serial).collect();
    serials.sort();
    serials.dedup();
    assert_eq!(serials.len(), 4, "serial numbers are unique");
    assert_eq!(report.reserved_bytes(), 1024 + 2048 + 3072 + 4096);
}

#[test]
fn the_event_log_sees_every_allocation_of_every_heap_in_order() {
    // Threads with heaps allocate and free while a sink is switched on: every event after the
    // switch is logged, and per address the log alternates allocate, free, allocate, ...: a
    // free is never logged after the allocation that reuses its block.
    let log: Arc<Mutex<Vec<(PoolAction, u64)>>> = Arc::default();
    let pool = Pool::builder(4 << 20)
        .name("events-heaps")
        .eager_thread_heaps(true)
        .log_leaks_on_drop(false)
        .build_host()
        .unwrap();
    let switched = Barrier::new(5);
    let done: Vec<(u64, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                let (pool, switched) = (&pool, &switched);
                s.spawn(move || {
                    let mut rng = Rng(t + 11);
                    let mut live: Vec<u64> = Vec::new();
                    let mut after = (0, 0);
                    for phase in 0..2 {
                        if phase == 1 {
                            switched.wait();
                        }
                        for _ in 0..3000 {
                            if live.len() < 30 && rng.below(2) == 0 {
                                live.push(pool.allocate(rng.size(16 << 10), 0).unwrap());
                                after.0 += phase;
                            } else if !live.is_empty() {
                                let addr = live.swap_remove(rng.below(live.len() as u64) as usize);
                                pool.deallocate(addr).unwrap();
                                after.1 += phase;
                            }
                        }
                        if phase == 0 {
                            switched.wait();
                        }
                    }
                    for addr in live {
                        pool.deallocate(addr).unwrap();
                        after.1 += 1;
                    }
                    after
                })
            })
            .collect();
        // Every thread has finished its first phase: switch the sink on, then let them go.
        switched.wait();
        let sink = {
            let log = log.clone();
            move |e: &PoolEvent<'_>| log.lock().unwrap().push((e.action, e.addr))
        };
        pool.set_events(Some(Arc::new(sink)));
        switched.wait();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let log = log.lock().unwrap();
    let allocations: u64 = done.iter().map(|d| d.0).sum();
    let frees: u64 = done.iter().map(|d| d.1).sum();
    let logged_allocations = log.iter().filter(|e| e.0 == PoolAction::Allocate).count() as u64;
    let logged_frees = log.iter().filter(|e| e.0 == PoolAction::Free).count() as u64;
    assert_eq!((logged_allocations, logged_frees), (allocations, frees));
    let mut live: HashMap<u64, bool> = HashMap::new();
    for &(action, addr) in log.iter() {
        let was = live.insert(addr, action == PoolAction::Allocate);
        match action {
            PoolAction::Allocate => assert_ne!(was, Some(true), "{addr:#x} handed out twice"),
            // A block allocated before the switch may be freed after it.
            PoolAction::Free => assert_ne!(was, Some(false), "{addr:#x} freed twice in a row"),
            PoolAction::AllocateFailure => unreachable!(),
        }
    }
}

#[test]
fn blocks_of_a_heap_freed_on_another_stream_wait_for_their_event() {
    const HOME: StreamId = StreamId(1);
    const OTHER: StreamId = StreamId(2);
    let streams = Arc::new(ManualStreams::new());
    let pool = Arc::new(
        Pool::builder(1 << 20)
            .name("heap-streams")
            .eager_thread_heaps(true)
            .streams(streams.clone(), HOME)
            .log_leaks_on_drop(false)
            .build_host()
            .unwrap(),
    );
    {
        let (pool, streams) = (pool.clone(), streams.clone());
        on_exiting_thread(move || {
            // On the home stream: served by the heap, reused at once, no event.
            let a = pool.allocate(64 << 10, 0).unwrap();
            pool.deallocate(a).unwrap();
            assert_eq!(pool.allocate(64 << 10, 0).unwrap(), a);
            assert_eq!(pool.thread_heaps(), 1);
            assert!(streams.waits().is_empty());
            // Freed on another stream: parked until its event completes, even for the heap.
            pool.deallocate_on(a, OTHER).unwrap();
            assert_eq!(streams.pending(OTHER), 1);
            for _ in 0..20 {
                let b = pool.allocate(64 << 10, 0).unwrap();
                assert_ne!(b, a, "a parked block is not handed out");
                pool.deallocate(b).unwrap();
            }
            assert_eq!(pool.stats().pending, 64 << 10);
            streams.complete(OTHER);
            assert_eq!(pool.reclaim().unwrap(), 64 << 10);
            assert_eq!(pool.stats().pending, 0);
            // Statistics leave the heap as it is.
            let c = pool.allocate(4096, 0).unwrap();
            pool.deallocate(c).unwrap();
            let s = pool.stats();
            assert_eq!((s.in_use, s.free, s.free_blocks), (0, 1 << 20, 1));
            assert_eq!(pool.thread_heaps(), 1);
            // The heap's home-stream frees reach the pool's index when it gives its spans
            // back (here, before a request for the whole pool): another stream then waits for
            // the home stream first.
            let all = pool.allocate(1 << 20, 0).unwrap();
            pool.deallocate(all).unwrap();
            assert!(streams.waits().is_empty());
            // (Served by the thread's heap for the other stream, from a span of the pool's
            // index.)
            let d = pool.allocate_on(4096, 0, OTHER).unwrap();
            assert_eq!(streams.waits(), vec![(OTHER, HOME)]);
            assert_eq!(pool.thread_heaps(), 2);
            pool.deallocate_on(d, OTHER).unwrap();
            assert_eq!(
                streams.pending(OTHER),
                0,
                "freed on its heap's stream: no event"
            );
            streams.complete_all();
            pool.reclaim().unwrap();
        });
    }
    // The heap for the other stream went back when the thread exited: its blocks wait for
    // the other stream to be done with them.
    assert_eq!(pool.thread_heaps(), 0);
    assert!(pool.stats().pending > 0);
    assert_eq!(streams.pending(OTHER), 1);
    streams.complete(OTHER);
    assert!(pool.reclaim().unwrap() > 0);
    let s = pool.stats();
    assert_eq!(
        (s.in_use, s.pending, s.free_blocks, s.largest_free),
        (0, 0, 1, 1 << 20)
    );
}

#[test]
fn slices_tracking_and_frees_from_other_threads_with_heaps() {
    let pool = Pool::builder(4 << 20)
        .name("heap-rules")
        .eager_thread_heaps(true)
        .log_leaks_on_drop(false)
        .build_host()
        .unwrap();
    let a = pool.client("a", usize::MAX);
    let b = pool.client("b", usize::MAX);
    let (to_main, from_worker) = mpsc::channel();
    let (to_worker, from_main) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let to_worker = to_worker;
        let a = &a;
        s.spawn(move || {
            let plain = a.allocate(3000, 0).unwrap();
            let mut slice = a.alloc_slice::<u32>(100).unwrap();
            slice.as_mut_slice().unwrap().fill(7);
            to_main.send((plain, slice)).unwrap();
            // Alive, with the blocks in its heap, while the main thread frees them.
            // An error here: the main thread failed and dropped its sender.
            let _ = from_main.recv();
        });
        let (plain, slice) = from_worker.recv().unwrap();
        assert_eq!(pool.thread_heaps(), 1);
        // Another thread's blocks, by the rules: only the slice frees its block, only its
        // client (or the pool) frees the other, a size check catches a wrong size, and a
        // second free is an unknown address.
        let err = pool.deallocate(slice.addr()).unwrap_err();
        assert!(err.to_string().contains("PoolSlice"), "{err}");
        let err = b.deallocate(plain).unwrap_err();
        assert!(err.to_string().contains("belongs to client `a`"), "{err}");
        assert!(
            a.deallocate_with(FreeRequest::new(plain).size(2999))
                .is_err()
        );
        assert_eq!(slice.as_slice().unwrap()[99], 7);
        a.deallocate_with(FreeRequest::new(plain).size(3000))
            .unwrap();
        assert_eq!(
            a.deallocate(plain).unwrap_err(),
            Error::UnknownAddress {
                addr: plain,
                client: "a".into()
            }
        );
        drop(slice);
        assert_eq!(a.stats().live, 0);
        to_worker.send(()).unwrap();
    });
    // Tracking on: allocations take the general path and keep their tags, heaps or not.
    pool.set_tracking(Tracking::Tags);
    let tagged = std::thread::scope(|s| {
        s.spawn(|| {
            pool.allocate_with(AllocRequest::new(500, 0).tag("kv"))
                .unwrap()
        })
        .join()
        .unwrap()
    });
    let report = pool.leak_report();
    assert_eq!(report.leaks.len(), 1);
    assert_eq!(
        (report.leaks[0].addr, report.leaks[0].tag.as_deref()),
        (tagged, Some("kv"))
    );
    pool.deallocate(tagged).unwrap();
    let s = pool.stats();
    assert_eq!(
        (s.live, s.allocations, s.frees, s.largest_free),
        (0, 3, 3, 4 << 20)
    );
}

#[test]
fn without_reuse_and_without_heaps() {
    // `reuse(0, 0)`: heaps merge every free at once too; `thread_heaps(0)`: no heaps at all.
    for (reuse, heaps) in [(false, 1 << 20), (true, 0)] {
        let mut builder = Pool::builder(4 << 20)
            .eager_thread_heaps(true)
            .thread_heaps(heaps)
            .log_leaks_on_drop(false);
        if !reuse {
            builder = builder.reuse(0, 0);
        }
        let pool = builder.build_host().unwrap();
        std::thread::scope(|s| {
            for t in 0..3u64 {
                let pool = &pool;
                s.spawn(move || {
                    let mut rng = Rng(t + 3);
                    let mut live = Vec::new();
                    for _ in 0..2000 {
                        live.push(pool.allocate(rng.size(16 << 10), 0).unwrap());
                        if live.len() > 10 {
                            pool.deallocate(live.swap_remove(0)).unwrap();
                        }
                    }
                    for addr in live {
                        pool.deallocate(addr).unwrap();
                    }
                    if heaps == 0 {
                        assert_eq!(pool.thread_heaps(), 0);
                    } else {
                        assert!(pool.thread_heaps() >= 1);
                    }
                });
            }
        });
        let s = pool.stats();
        assert_eq!((s.allocations, s.frees, s.in_use), (6000, 6000, 0));
        assert_eq!((s.free_blocks, s.largest_free), (1, 4 << 20));
        if !reuse {
            assert_eq!(s.reused, 0);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Thread heaps on a growable region (the host stand-in for a device's virtual memory).

/// The stand-in's chunk in the tests below.
const CHUNK: usize = 64 << 10;

/// A growable pool of `capacity` bytes over a fresh stand-in, every thread on a heap.
fn growable_with_heaps(name: &str, capacity: usize) -> (Pool, Arc<HostVirtualMemory>) {
    let vm = Arc::new(HostVirtualMemory::new(CHUNK).unwrap());
    let pool = Pool::builder(capacity)
        .name(name)
        .eager_thread_heaps(true)
        .log_leaks_on_drop(false)
        .build_mapped(vm.clone())
        .unwrap();
    (pool, vm)
}

/// The chunks (their addresses) that blocks `(address, bytes)` touch.
fn chunks_touched(pool: &Pool, blocks: &[(u64, usize)]) -> Vec<(u64, usize)> {
    let chunk = CHUNK as u64;
    let mut chunks: Vec<u64> = blocks
        .iter()
        .flat_map(|&(addr, bytes)| {
            let first = (addr - pool.base()) / chunk;
            let last = (addr - pool.base() + bytes as u64 - 1) / chunk;
            (first..=last).map(|c| pool.base() + c * chunk)
        })
        .collect();
    chunks.sort_unstable();
    chunks.dedup();
    chunks.into_iter().map(|c| (c, CHUNK)).collect()
}

/// The live blocks of the pool, `(address, reserved bytes)` (from the leak report, which
/// gives no heap back).
fn live_blocks(pool: &Pool) -> Vec<(u64, usize)> {
    pool.leak_report()
        .leaks
        .iter()
        .map(|l| (l.addr, l.reserved))
        .collect()
}

#[test]
fn one_thread_on_a_heap_of_a_growable_region_matches_the_model_exactly() {
    // As on a classic region: every count, refusal and peak; and what is mapped is what the
    // stand-in says, each live block inside it.
    let (pool, vm) = growable_with_heaps("model-heap-vm", 8 << 20);
    let clients = clients(&pool);
    let mut model = Model::new(&pool, &QUOTAS);
    run_model(&pool, &mut model, &clients, 0x1234_5678, 20_000);
    assert_eq!(pool.thread_heaps(), 1);
    model.check(&pool, true);
    for (&addr, b) in &model.live {
        assert!(vm.is_mapped(addr, b.reserved));
    }
    let s = pool.stats();
    assert_eq!(s.mapped, vm.mapped_bytes());
    assert!(s.maps > 0);
}

#[test]
fn heaps_on_a_growable_region_map_what_their_blocks_reach_from_several_threads() {
    // Four threads, each on its heap, allocate while the others do: every block is mapped when
    // the pool hands it out, no chunk is mapped twice (the stand-in refuses that), and nothing
    // is mapped that no block reaches. Freed and given back, every chunk can be trimmed.
    const THREADS: usize = 4;
    let (pool, vm) = growable_with_heaps("grow-heaps", 64 << 20);
    let start = Barrier::new(THREADS);
    let (to_main, from_threads) = mpsc::channel();
    let (release_tx, release_rx): (Vec<_>, Vec<_>) =
        (0..THREADS).map(|_| mpsc::channel::<()>()).unzip();
    std::thread::scope(|s| {
        let handles: Vec<_> = release_rx
            .into_iter()
            .enumerate()
            .map(|(t, release)| {
                let (pool, vm, start, to_main) = (&pool, &vm, &start, to_main.clone());
                s.spawn(move || {
                    let mut rng = Rng(0xC0FFEE + t as u64);
                    let mut live = Vec::new();
                    start.wait();
                    for _ in 0..200 {
                        let size = rng.size(300 << 10);
                        let addr = pool.allocate(size, rng.align()).unwrap();
                        assert!(vm.is_mapped(addr, class_rounded(size)));
                        live.push((addr, class_rounded(size)));
                    }
                    to_main.send(live.clone()).unwrap();
                    // An error here: the main thread failed and dropped its sender.
                    let _ = release.recv();
                    for (addr, _) in live {
                        pool.deallocate(addr).unwrap();
                    }
                })
            })
            .collect();
        drop(to_main);
        let mut blocks: Vec<(u64, usize)> = (0..THREADS)
            .flat_map(|_| from_threads.recv().unwrap())
            .collect();
        assert_eq!(blocks.len(), THREADS * 200);
        assert_eq!(pool.thread_heaps(), THREADS);
        blocks.sort_unstable();
        for pair in blocks.windows(2) {
            assert!(pair[0].0 + pair[0].1 as u64 <= pair[1].0, "{pair:x?}");
        }
        // Nothing was freed: the chunks mapped are exactly those the blocks reach, each mapped
        // by one call.
        assert_eq!(vm.mapped_chunks(), chunks_touched(&pool, &blocks));
        let mapped_by_calls: usize = vm
            .calls()
            .iter()
            .map(|c| match *c {
                VmCall::Map { count, .. } => count,
                _ => 0,
            })
            .sum();
        assert_eq!(mapped_by_calls * CHUNK, vm.mapped_bytes());
        for release in release_tx {
            release.send(()).unwrap();
        }
        for h in handles {
            h.join().unwrap();
        }
    });
    assert_eq!(pool.thread_heaps(), 0);
    let s = pool.stats();
    assert_eq!((s.live, s.in_use, s.mapped), (0, 0, vm.mapped_bytes()));
    assert_eq!(pool.trim().unwrap(), s.mapped);
    assert_eq!(vm.mapped_bytes(), 0);
}

#[test]
fn a_failed_map_on_a_heap_fails_the_request_and_changes_nothing() {
    let (pool, vm) = growable_with_heaps("oom-heap", 64 << 20);
    let client = pool.client("model", usize::MAX);
    // The heap's first span starts at the region's start, and so does its first block.
    let keep = client.allocate(3 * CHUNK, 0).unwrap();
    assert_eq!((keep, pool.thread_heaps()), (pool.base(), 1));
    // (The client's statistics, the leak report and the stand-in are read with the heap in
    // place.)
    let before = (
        client.stats(),
        vm.mapped_chunks(),
        pool.leak_report().to_string(),
    );
    // Every map fails: the heap's, and the pool's index's after every heap gave its spans
    // back (mapped free memory there could have served).
    vm.fail_maps(0, usize::MAX);
    let err = client.allocate(10 * CHUNK, 0).unwrap_err();
    vm.fail_maps(0, 0);
    match &err {
        Error::OutOfMemory {
            backend, detail, ..
        } => {
            assert_eq!(*backend, "host-vm");
            assert_eq!(*detail, Some("simulated out of memory"));
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    assert!(vm.calls().contains(&VmCall::MapFailed {
        addr: pool.base() + 3 * CHUNK as u64,
        chunk: CHUNK,
        count: 10
    }));
    // Only the failure was counted; the client, the live blocks and the mapping are as they
    // were, and the heap is still there (its spans given back, as before any refusal).
    let after = (
        client.stats(),
        vm.mapped_chunks(),
        pool.leak_report().to_string(),
    );
    assert_eq!(after.0.failures, before.0.failures + 1);
    let failures_as_before = devarena::pool::ClientStats {
        failures: before.0.failures,
        ..after.0.clone()
    };
    assert_eq!(failures_as_before, before.0);
    assert_eq!((&after.1, &after.2), (&before.1, &before.2));
    assert_eq!(pool.thread_heaps(), 1);

    // The heap keeps serving: the same request succeeds once the device has room, at the
    // same address (the block went back to the heap's index, merged).
    let big = client.allocate(10 * CHUNK, 0).unwrap();
    assert_eq!(big, pool.base() + 3 * CHUNK as u64);
    assert!(vm.is_mapped(big, 10 * CHUNK));
    // Freed, `big` waits whole in the heap's reuse cache. A request of another size class
    // would map new chunks; that fails, so the heap merges its cache and finds mapped memory.
    client.deallocate(big).unwrap();
    let mapped = vm.mapped_bytes();
    vm.fail_maps(0, 1);
    let c = client.allocate(5 * CHUNK, 0).unwrap();
    assert_eq!(c, big);
    assert_eq!(vm.mapped_bytes(), mapped);
    assert!(matches!(vm.calls().last(), Some(VmCall::MapFailed { .. })));
    assert_eq!(client.stats().failures, before.0.failures + 1);
    // Without cached blocks to merge, the failure is the request's, after the pool gave the
    // chunks no live block touches (the 5 that `c` left of `big`) back to the device.
    vm.fail_maps(0, usize::MAX);
    assert!(matches!(
        client.allocate(20 * CHUNK, 0),
        Err(Error::OutOfMemory { .. })
    ));
    vm.fail_maps(0, 0);
    assert_eq!(client.stats().failures, before.0.failures + 2);
    let mapped = mapped - 5 * CHUNK;
    assert_eq!(vm.mapped_bytes(), mapped);
    assert!(vm.is_mapped(c, 5 * CHUNK) && vm.is_mapped(keep, 3 * CHUNK));
    client.deallocate(c).unwrap();
    client.deallocate(keep).unwrap();
    let s = pool.stats();
    assert_eq!((s.live, s.in_use, s.failures, s.mapped), (0, 0, 2, mapped));
    assert_eq!((s.free_blocks, s.largest_free), (1, 64 << 20));
}

#[test]
fn trim_gives_every_heap_back_and_keeps_what_live_blocks_touch() {
    // Three threads fill slices on their heaps, free some, and wait with their heaps (spans,
    // cached blocks, leases) in place. A trim then gives back every chunk no live block
    // touches, and nothing else; the slices keep what was written into them, and the heaps
    // carry on afterwards, mapping again as they need.
    const THREADS: usize = 3;
    let (pool, vm) = growable_with_heaps("trim-heaps", 64 << 20);
    let (to_main, from_threads) = mpsc::channel();
    let (go_tx, go_rx): (Vec<_>, Vec<_>) = (0..THREADS).map(|_| mpsc::channel::<()>()).unzip();
    std::thread::scope(|s| {
        let handles: Vec<_> = go_rx
            .into_iter()
            .enumerate()
            .map(|(t, go)| {
                let (pool, vm, to_main) = (&pool, &vm, to_main.clone());
                s.spawn(move || {
                    let mark = 0x10 + t as u8;
                    let mut rng = Rng(0xABCD + t as u64);
                    let mut slices: Vec<PoolSlice<u8>> = Vec::new();
                    for i in 0..300 {
                        let mut slice = pool.alloc_slice::<u8>(rng.size(200 << 10)).unwrap();
                        slice.as_mut_slice().unwrap().fill(mark);
                        slices.push(slice);
                        if i % 3 == 2 {
                            slices.swap_remove(rng.below(slices.len() as u64) as usize);
                        }
                    }
                    to_main.send(()).unwrap();
                    // An error here: the main thread failed and dropped its sender.
                    if go.recv().is_err() {
                        return;
                    }
                    for slice in &slices {
                        assert!(slice.as_slice().unwrap().iter().all(|&b| b == mark));
                    }
                    // On after the trim: new spans, mapped again where blocks reach.
                    for _ in 0..200 {
                        let size = rng.size(200 << 10);
                        let mut slice = pool.alloc_slice::<u8>(size).unwrap();
                        assert!(vm.is_mapped(slice.addr(), size));
                        slice.as_mut_slice().unwrap().fill(mark);
                        slices.push(slice);
                        let gone = slices.swap_remove(rng.below(slices.len() as u64) as usize);
                        assert!(gone.as_slice().unwrap().iter().all(|&b| b == mark));
                    }
                })
            })
            .collect();
        drop(to_main);
        for _ in 0..THREADS {
            from_threads.recv().unwrap();
        }
        assert_eq!(pool.thread_heaps(), THREADS);
        let live = live_blocks(&pool);
        assert_eq!(live.len(), THREADS * 200);
        let mapped = vm.mapped_bytes();
        let keep = chunks_touched(&pool, &live);
        assert!(
            keep.len() * CHUNK < mapped,
            "freed blocks left chunks to give back"
        );
        assert_eq!(pool.trim().unwrap(), mapped - keep.len() * CHUNK);
        assert_eq!(vm.mapped_chunks(), keep);
        assert_eq!(pool.stats().mapped, vm.mapped_bytes());
        assert_eq!(live_blocks(&pool), live);
        for go in go_tx {
            go.send(()).unwrap();
        }
        for h in handles {
            h.join().unwrap();
        }
    });
    assert_eq!(pool.thread_heaps(), 0);
    let s = pool.stats();
    assert_eq!((s.live, s.in_use), (0, 0));
    assert_eq!(pool.trim().unwrap(), s.mapped);
    assert_eq!(vm.mapped_bytes(), 0);
}

#[test]
fn peaks_stay_exact_while_heaps_pass_headroom_among_themselves() {
    // Four threads on heaps share one client. In turns, every thread allocates (the sums only
    // grow) or every thread frees (they only shrink), so that after each turn the peak of the
    // pool and of the client is known exactly: the largest sum after a turn of allocations.
    // Between turns the heaps hold headroom, give it back to the spare and take it from
    // there, and take each other's back: the peaks read between turns (without giving the
    // heaps back) and the pool's (giving them back, now and then) are exact throughout.
    // (Nothing panics between the barriers: a failure is recorded and reported at the end.)
    const THREADS: usize = 4;
    const TURNS: usize = 300;
    let pool = Pool::builder(256 << 20)
        .name("exact-peaks")
        .eager_thread_heaps(true)
        .log_leaks_on_drop(false)
        .build_host()
        .unwrap();
    let client = pool.client("all", usize::MAX);
    let held: Vec<std::sync::atomic::AtomicUsize> = (0..THREADS)
        .map(|_| std::sync::atomic::AtomicUsize::new(0))
        .collect();
    let failures: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let turn = Barrier::new(THREADS + 1);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (client, held, turn, failures) = (&client, &held, &turn, &failures);
            s.spawn(move || {
                let mut rng = Rng(0x7E57 + t as u64);
                let mut live: Vec<(u64, usize)> = Vec::new();
                for n in 0..TURNS {
                    if n % 2 == 0 {
                        // Some threads take much, some little: headroom moves between heaps.
                        let count = rng.below(if (n / 2 + t) % 3 == 0 { 40 } else { 6 });
                        for _ in 0..count {
                            let size = rng.size(1 << 20);
                            match client.allocate(size, 0) {
                                Ok(addr) => live.push((addr, class_rounded(size))),
                                Err(e) => failures.lock().unwrap().push(format!("turn {n}: {e}")),
                            }
                        }
                    } else {
                        let keep = rng.below(live.len() as u64 + 1) as usize;
                        for (addr, _) in live.drain(keep..) {
                            if let Err(e) = client.deallocate(addr) {
                                failures.lock().unwrap().push(format!("turn {n}: {e}"));
                            }
                        }
                    }
                    let bytes = live.iter().map(|&(_, r)| r).sum();
                    held[t].store(bytes, std::sync::atomic::Ordering::SeqCst);
                    turn.wait();
                    turn.wait();
                }
                for (addr, _) in live {
                    let _ = client.deallocate(addr);
                }
            });
        }
        let mut peak = 0;
        for n in 0..TURNS {
            turn.wait();
            let in_use: usize = held
                .iter()
                .map(|h| h.load(std::sync::atomic::Ordering::SeqCst))
                .sum();
            peak = peak.max(in_use);
            let c = client.stats();
            if (c.in_use, c.peak) != (in_use, peak) {
                let seen = (c.in_use, c.peak);
                failures.lock().unwrap().push(format!(
                    "turn {n}: the client has (in use, peak) {seen:?}, not {:?}",
                    (in_use, peak)
                ));
            }
            if n % 25 == 24 {
                let s = pool.stats();
                if (s.in_use, s.peak) != (in_use, peak) {
                    let seen = (s.in_use, s.peak);
                    failures.lock().unwrap().push(format!(
                        "turn {n}: the pool has (in use, peak) {seen:?}, not {:?}",
                        (in_use, peak)
                    ));
                }
            }
            turn.wait();
        }
    });
    assert_eq!(failures.into_inner().unwrap(), Vec::<String>::new());
    let s = pool.stats();
    assert_eq!((s.in_use, s.live), (0, 0));
    assert!(s.peak > 0 && s.peak == client.stats().peak);
}

#[test]
fn once_a_thread_has_a_heap_a_thread_without_one_gets_one() {
    // This thread allocates first, alone: on the pool's own index, without a heap. Two other
    // threads then share the pool until one of them has met the other on its lock and has a
    // heap; they keep their heaps while this thread allocates again, which must now give it a
    // heap of its own (left on the pool's index, it would look for a heap first on every call
    // and hold the lock that the heaps' slow paths need). Every count stays exact.
    let pool = Pool::builder(8 << 20)
        .name("late-heap")
        .log_leaks_on_drop(false)
        .build_host()
        .unwrap();
    let first = pool.allocate(4096, 0).unwrap();
    assert_eq!(pool.thread_heaps(), 0);
    let start = std::sync::Barrier::new(2);
    let heaps_before = std::thread::scope(|s| {
        let (parked_tx, parked_rx) = mpsc::channel();
        let mut releases = Vec::new();
        let workers: Vec<_> = (0..2u64)
            .map(|t| {
                let (release_tx, release_rx) = mpsc::channel::<()>();
                releases.push(release_tx);
                let (pool, parked_tx, start) = (&pool, parked_tx.clone(), &start);
                s.spawn(move || {
                    let mut rng = Rng(t + 11);
                    let mut live = Vec::new();
                    // Both run until one has met the other on the lock: within a few thousand
                    // calls on an idle machine with two cores, later on a loaded one (a bound
                    // in calls let one thread finish before the other ran, now and then, under
                    // a loaded CI). The deadline only keeps a broken pool from looping for
                    // ever.
                    start.wait();
                    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
                    for i in 0u64.. {
                        live.push(pool.allocate(rng.size(16 << 10), 0).unwrap());
                        if live.len() > 8 {
                            pool.deallocate(live.swap_remove(0)).unwrap();
                        }
                        if i % 64 == 0
                            && (pool.thread_heaps() > 0 || std::time::Instant::now() > deadline)
                        {
                            break;
                        }
                    }
                    parked_tx.send(()).unwrap();
                    // Kept (with whatever heap it has) until the main thread has allocated.
                    let _ = release_rx.recv();
                    for addr in live {
                        pool.deallocate(addr).unwrap();
                    }
                })
            })
            .collect();
        parked_rx.recv().unwrap();
        parked_rx.recv().unwrap();
        let heaps = pool.thread_heaps();
        assert!(
            heaps >= 1,
            "two threads sharing the pool never met on its lock"
        );
        let second = pool.allocate(4096, 0).unwrap();
        assert_eq!(
            pool.thread_heaps(),
            heaps + 1,
            "this thread got a heap once another thread had one"
        );
        // One allocation on the pool's index, one in this thread's heap: both free.
        pool.deallocate(first).unwrap();
        pool.deallocate(second).unwrap();
        drop(releases);
        for w in workers {
            w.join().unwrap();
        }
        heaps
    });
    assert!(heaps_before >= 1);
    let s = pool.stats();
    assert_eq!(s.allocations, s.frees);
    assert_eq!(s.in_use, 0);
    assert!(pool.leak_report().leaks.is_empty());
    assert_eq!((s.free_blocks, s.largest_free), (1, 8 << 20));
}

#[test]
fn leased_peaks_fill_to_the_capacity_while_other_heaps_hold_leases() {
    // `exact_peaks(false)`: each heap's lease holds headroom beyond its need, and a peak counts
    // those leases. Three threads allocate and free once, so that their heaps hold unused
    // headroom and spans, and wait; this thread then fills the pool. Every block the capacity
    // holds is handed out (the cap is hard with leases elsewhere), and the peak says the
    // capacity: neither more (other heaps' leases never count past what can be in use) nor
    // less.
    const CAPACITY: usize = 4 << 20;
    const BLOCK: usize = 128 << 10;
    let pool = Pool::builder(CAPACITY)
        .name("leased-full")
        .eager_thread_heaps(true)
        .exact_peaks(false)
        .log_leaks_on_drop(false)
        .build_host()
        .unwrap();
    std::thread::scope(|s| {
        let (ready_tx, ready_rx) = mpsc::channel();
        let mut releases = Vec::new();
        let others: Vec<_> = (0..3)
            .map(|_| {
                let (release_tx, release_rx) = mpsc::channel::<()>();
                releases.push(release_tx);
                let (pool, ready_tx) = (&pool, ready_tx.clone());
                s.spawn(move || {
                    let a = pool.allocate(BLOCK, 0).unwrap();
                    pool.deallocate(a).unwrap();
                    ready_tx.send(()).unwrap();
                    let _ = release_rx.recv();
                })
            })
            .collect();
        for _ in 0..3 {
            ready_rx.recv().unwrap();
        }
        assert_eq!(pool.thread_heaps(), 3);
        let mut live = Vec::new();
        while let Ok(addr) = pool.allocate(BLOCK, 0) {
            live.push(addr);
        }
        // Every block the capacity holds was handed out (the refusal came with every heap's
        // spans and leases given back).
        assert_eq!(live.len(), CAPACITY / BLOCK);
        let s = pool.stats();
        assert_eq!(s.in_use, CAPACITY);
        assert_eq!(
            s.peak, CAPACITY,
            "peak {} of a {CAPACITY}-byte pool",
            s.peak
        );
        for addr in live {
            pool.deallocate(addr).unwrap();
        }
        drop(releases);
        for t in others {
            t.join().unwrap();
        }
    });
    let s = pool.stats();
    assert_eq!((s.in_use, s.peak), (0, CAPACITY));
}

/// The same with this thread's allocations on the pool's own index (tracking on sends them
/// there) while another heap holds a lease larger than its use: the lease's headroom counts
/// in the peak, which must still never be reported above the capacity. (Before, the pool's
/// peak and its own client's read 65 MiB of a 64 MiB pool.)
#[test]
fn leased_peaks_on_the_pools_own_index_stay_within_the_capacity() {
    const CAPACITY: usize = 64 << 20;
    let pool = Pool::builder(CAPACITY)
        .name("leased-index")
        .eager_thread_heaps(true)
        .exact_peaks(false)
        .log_leaks_on_drop(false)
        .build_host()
        .unwrap();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let pool = &pool;
        let other = s.spawn(move || {
            // Its heap keeps its span and a lease of the block and headroom beyond it.
            let a = pool.allocate(3 << 20, 0).unwrap();
            pool.deallocate(a).unwrap();
            ready_tx.send(()).unwrap();
            let _ = release_rx.recv();
        });
        ready_rx.recv().unwrap();
        pool.set_tracking(Tracking::Tags);
        let mut live = Vec::new();
        while let Ok(addr) = pool.allocate(1 << 20, 0) {
            live.push(addr);
        }
        assert_eq!(live.len(), CAPACITY >> 20);
        let s = pool.stats();
        assert_eq!((s.in_use, s.peak), (CAPACITY, CAPACITY));
        let own = &pool.client_stats()[0];
        assert_eq!((own.in_use, own.peak), (CAPACITY, CAPACITY));
        for addr in live {
            pool.deallocate(addr).unwrap();
        }
        drop(release_tx);
        other.join().unwrap();
    });
}

// ---------------------------------------------------------------------------------------------
// Heaps for streams other than the home stream.

const HOME: StreamId = StreamId(1);

/// A pool on `streams` (home stream [`HOME`]) where every thread gets a heap at once.
fn stream_pool(name: &str, capacity: usize, streams: Arc<dyn StreamSync>) -> Pool {
    stream_pool_with(name, capacity, streams, true)
}

/// A pool on `streams` as built by default: a thread gets a heap for another stream at its
/// first request there, and for the home stream once some thread has a heap.
fn default_stream_pool(name: &str, capacity: usize, streams: Arc<dyn StreamSync>) -> Pool {
    stream_pool_with(name, capacity, streams, false)
}

fn stream_pool_with(
    name: &str,
    capacity: usize,
    streams: Arc<dyn StreamSync>,
    eager: bool,
) -> Pool {
    Pool::builder(capacity)
        .name(name)
        .eager_thread_heaps(eager)
        .streams(streams, HOME)
        .log_leaks_on_drop(false)
        .build_host()
        .unwrap()
}

/// Completes every event, takes the blocks back, and returns the statistics.
fn drained(pool: &Pool, streams: &ManualStreams) -> PoolStats {
    streams.complete_all();
    pool.reclaim().unwrap();
    pool.stats()
}

/// Asserts that nothing is live, in use or pending once every event completed, and that the
/// whole `capacity` is one free block.
fn assert_all_free(pool: &Pool, streams: &ManualStreams, capacity: usize) {
    let stats = drained(pool, streams);
    assert_eq!(
        (stats.live, stats.in_use, stats.pending, stats.largest_free),
        (0, 0, 0, capacity)
    );
}

/// Runs `body` while another thread holds its heap for `stream` with 1 MiB freed there (the
/// heap stays with that thread, its blocks free, until `body` returns).
fn with_free_stream_heap(pool: &Pool, stream: StreamId, body: impl FnOnce()) {
    std::thread::scope(|s| {
        let (ready, is_ready) = mpsc::channel();
        // Dropped when `body` returns or panics: the thread then exits.
        let (finish, finished) = mpsc::channel::<()>();
        s.spawn(move || {
            let a = pool.allocate_on(1 << 20, 0, stream).unwrap();
            pool.deallocate_on(a, stream).unwrap();
            ready.send(()).unwrap();
            let _ = finished.recv();
        });
        is_ready.recv().unwrap();
        body();
        drop(finish);
    });
}

#[test]
fn a_thread_on_its_own_stream_reuses_its_blocks_on_it_without_events() {
    const S: StreamId = StreamId(7);
    let streams = Arc::new(ManualStreams::new());
    let pool = stream_pool("own-stream", 16 << 20, streams.clone());
    std::thread::scope(|s| {
        s.spawn(|| {
            let a = pool.allocate_on(64 << 10, 0, S).unwrap();
            assert_eq!(
                pool.thread_heaps(),
                1,
                "a heap for the stream, none for home"
            );
            pool.deallocate_on(a, S).unwrap();
            // Freed on the stream it serves: handed out again at once, on that stream.
            assert_eq!(pool.allocate_on(64 << 10, 0, S).unwrap(), a);
            pool.deallocate_on(a, S).unwrap();
            assert_eq!(streams.pending(S), 0, "no event recorded");
            // Statistics count its span's free bytes as free (a request on the home stream
            // that needs them has the home stream wait for `S`) and leave the heap as it is.
            let stats = pool.stats();
            assert_eq!(
                (stats.in_use, stats.pending, stats.free, stats.free_blocks),
                (0, 0, 16 << 20, 1)
            );
            assert_eq!(pool.thread_heaps(), 1);
            assert!(streams.waits().is_empty());
            assert_eq!(pool.allocate_on(64 << 10, 0, S).unwrap(), a);
            pool.deallocate_on(a, S).unwrap();
        });
    });
}

#[test]
fn a_block_of_a_stream_heap_freed_on_the_home_stream_waits_for_it() {
    const S: StreamId = StreamId(7);
    let streams = Arc::new(ManualStreams::new());
    let pool = stream_pool("home-free", 16 << 20, streams.clone());
    std::thread::scope(|s| {
        s.spawn(|| {
            let a = pool.allocate_on(64 << 10, 0, S).unwrap();
            // The home stream may still use it: parked, even though the home stream's frees
            // are reusable at once elsewhere.
            pool.deallocate(a).unwrap();
            assert_eq!(streams.pending(HOME), 1);
            for _ in 0..20 {
                let b = pool.allocate_on(64 << 10, 0, S).unwrap();
                assert_ne!(b, a, "a parked block is not handed out");
                pool.deallocate_on(b, S).unwrap();
            }
            streams.complete(HOME);
            assert_eq!(pool.reclaim().unwrap(), 64 << 10);
            // Back in its heap: the stream's requests get it again.
            let mut seen = false;
            let mut held = Vec::new();
            for _ in 0..64 {
                let b = pool.allocate_on(64 << 10, 0, S).unwrap();
                seen |= b == a;
                held.push(b);
            }
            assert!(seen);
            for b in held {
                pool.deallocate_on(b, S).unwrap();
            }
        });
    });
}

#[test]
fn a_thread_alone_on_another_stream_gets_a_heap_for_it() {
    // A pool as built by default: no thread has a heap, none met another on the lock.
    const S: StreamId = StreamId(7);
    let streams = Arc::new(ManualStreams::new());
    let pool = default_stream_pool("alone", 16 << 20, streams.clone());
    // The home stream on the pool's own index, as always; a home free since `S` last waited.
    let h = pool.allocate(4096, 0).unwrap();
    pool.deallocate(h).unwrap();
    assert_eq!(pool.thread_heaps(), 0);
    // The first request on `S` gets this thread a heap for `S`, whose span `S` takes after
    // waiting for the home stream's free.
    let a = pool.allocate_on(64 << 10, 0, S).unwrap();
    assert_eq!(pool.thread_heaps(), 1);
    assert_eq!(streams.waits(), vec![(S, HOME)]);
    // Freed on `S`: handed out again there at once, without an event.
    pool.deallocate_on(a, S).unwrap();
    assert_eq!(pool.allocate_on(64 << 10, 0, S).unwrap(), a);
    pool.deallocate_on(a, S).unwrap();
    assert_eq!(streams.pending(S), 0, "no event recorded");
    assert_eq!(streams.waits().len(), 1, "no other wait");
    // The home stream goes on (on a heap of its own now that the thread has one).
    let h = pool.allocate(4096, 0).unwrap();
    pool.deallocate(h).unwrap();
    assert_eq!(pool.thread_heaps(), 2);
    // Every count as without heaps; the heap of `S` gave back its span, which waits for `S`.
    let stats = pool.stats();
    assert_eq!(
        (stats.allocations, stats.frees, stats.in_use, stats.live),
        (4, 4, 0, 0)
    );
    assert_eq!(stats.pending + stats.free, 16 << 20);
    let stats = drained(&pool, &streams);
    assert_eq!((stats.pending, stats.largest_free), (0, 16 << 20));
}

#[test]
fn a_stream_capturing_a_graph_gets_no_heap_until_its_capture_ends() {
    const S: StreamId = StreamId(7);
    let streams = Arc::new(ManualStreams::new());
    let pool = default_stream_pool("capture-no-heap", 16 << 20, streams.clone());
    streams.begin_capture(S);
    // The pool's own index serves the capture (nothing freed on home: no wait to refuse).
    let a = pool.allocate_on(4096, 0, S).unwrap();
    assert_eq!(pool.thread_heaps(), 0);
    // A home free since: an ordinary request of the capturing stream would make it wait,
    // which the capture forbids; refused, and still no heap.
    let h = pool.allocate(4096, 0).unwrap();
    pool.deallocate(h).unwrap();
    let err = pool.allocate_on(4096, 0, S).unwrap_err();
    assert!(err.to_string().contains("capturing"), "{err}");
    assert_eq!(streams.refused(), vec![("order_after", S)]);
    assert_eq!(pool.thread_heaps(), 0);
    streams.end_capture(S);
    // After the capture: the stream's next request gets it a heap.
    let b = pool.allocate_on(4096, 0, S).unwrap();
    assert_eq!(pool.thread_heaps(), 1);
    pool.deallocate_on(b, S).unwrap();
    pool.deallocate_on(a, S).unwrap();
    assert_all_free(&pool, &streams, 16 << 20);
}

/// A graph reservation on a stream stops every thread's heap for the stream, not only the
/// calling thread's: during the capture another thread's plain free on the stream is refused
/// (its event would be captured) and no block of the stream is handed out again by a heap.
/// Before, that thread's heap took the free and handed the block out again at once, while the
/// graph may replay work that used it. After the reservation, the thread's heap serves again.
#[test]
fn a_graph_reservation_stops_other_threads_heaps_for_its_stream_during_the_capture() {
    const S: StreamId = StreamId(7);
    let streams = Arc::new(ManualStreams::new());
    let pool = default_stream_pool("capture-other-thread", 16 << 20, streams.clone());
    std::thread::scope(|s| {
        let (to_main, from_worker) = mpsc::channel::<(bool, u64)>();
        let (to_worker, from_main) = mpsc::channel::<()>();
        let pool = &pool;
        s.spawn(move || {
            // A heap for `S` on this thread, with a live block.
            let x = pool.allocate_on(64 << 10, 0, S).unwrap();
            to_main.send((true, x)).unwrap();
            // During the capture: free `x` on `S` (refused), allocate on `S`.
            from_main.recv().unwrap();
            let freed = pool.deallocate_on(x, S).is_ok();
            let y = pool.allocate_on(64 << 10, 0, S).unwrap();
            to_main.send((freed, y)).unwrap();
            // After it: both freed on `S`, and the heap serves the stream again.
            from_main.recv().unwrap();
            pool.deallocate_on(x, S).unwrap();
            pool.deallocate_on(y, S).unwrap();
            let z = pool.allocate_on(64 << 10, 0, S).unwrap();
            pool.deallocate_on(z, S).unwrap();
            to_main.send((true, z)).unwrap();
        });
        let (_, x) = from_worker.recv().unwrap();
        assert_eq!(pool.thread_heaps(), 1);
        let graph = pool.graph_reservation(S).unwrap();
        streams.begin_capture(S);
        to_worker.send(()).unwrap();
        let (freed, y) = from_worker.recv().unwrap();
        assert!(
            !freed,
            "a plain free on the capturing stream was taken by another thread's heap{}",
            if y == x {
                ", and its block handed out again during the capture"
            } else {
                ""
            }
        );
        assert_ne!(y, x);
        assert_eq!(pool.stats().live, 2);
        streams.end_capture(S);
        drop(graph);
        to_worker.send(()).unwrap();
        from_worker.recv().unwrap();
    });
    // The worker gives its heap back in its thread-local destructors, which the end of the
    // scope need not wait for: its free blocks of `S` are parked then.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while pool.thread_heaps() > 0 && std::time::Instant::now() < deadline {
        std::thread::yield_now();
    }
    streams.complete_all();
    let _ = pool.reclaim();
    let stats = pool.stats();
    assert_eq!(
        (stats.live, stats.in_use, stats.pending),
        (0, 0, 0),
        "{stats}"
    );
}

/// Between a graph reservation's opening and its capture (no graph allocation yet), no heap
/// serves its stream: a heap made then would serve the capture without asking whether the
/// stream captures.
#[test]
fn a_graph_reservation_keeps_heaps_off_its_stream_until_its_capture_is_over() {
    const S: StreamId = StreamId(7);
    let streams = Arc::new(ManualStreams::new());
    let pool = default_stream_pool("reservation-window", 16 << 20, streams.clone());
    let graph = pool.graph_reservation(S).unwrap();
    // Before the capture: plain requests on `S` take the pool's index.
    let before = pool.allocate_on(4096, 0, S).unwrap();
    assert_eq!(pool.thread_heaps(), 0);
    streams.begin_capture(S);
    let g = graph.allocate(4096, 0).unwrap();
    let during = pool.allocate_on(4096, 0, S).unwrap();
    assert_eq!(pool.thread_heaps(), 0);
    streams.end_capture(S);
    let after = pool.allocate_on(4096, 0, S).unwrap();
    assert_eq!(pool.thread_heaps(), 1);
    for a in [before, during, after, g] {
        pool.deallocate_on(a, S).unwrap();
    }
    drop(graph);
    assert_all_free(&pool, &streams, 16 << 20);
}

/// A graph allocation made before the capture (the graph's static buffers), then a warm-up on
/// the graph's stream, then the capture: heaps stay off the stream until the pool sees the
/// capture end, so no heap serves the capture's plain requests. (A first version ended the bar
/// at the first graph allocation: the warm-up made a heap, which then took the capture's plain
/// free and handed the block out again at once.)
#[test]
fn a_graph_allocation_before_the_capture_lets_no_heap_serve_the_capture() {
    const S: StreamId = StreamId(7);
    let streams = Arc::new(ManualStreams::new());
    let pool = default_stream_pool("alloc-before-capture", 16 << 20, streams.clone());
    let graph = pool.graph_reservation(S).unwrap();
    // The graph's input, allocated for it before the capture.
    let input = graph.allocate(4096, 0).unwrap();
    // A warm-up on `S` before the capture.
    let warm = pool.allocate_on(4096, 0, S).unwrap();
    pool.deallocate_on(warm, S).unwrap();
    streams.begin_capture(S);
    let served = plain_requests_during_the_capture(&pool, S, || streams.end_capture(S));
    pool.deallocate_on(input, S).unwrap();
    drop(graph);
    assert_eq!(served, None, "during the capture a heap served S");
}

/// During a capture on `stream`: a block allocated there, freed there (refused: its event
/// would be captured), allocated again; then `end_capture`, and the blocks freed. `None` where
/// no heap served the capture, else what did happen: (the plain free was accepted, the block
/// was handed out again at once, the heaps there were).
fn plain_requests_during_the_capture(
    pool: &Pool,
    stream: StreamId,
    end_capture: impl FnOnce(),
) -> Option<(bool, bool, usize)> {
    let x = pool.allocate_on(4096, 0, stream).unwrap();
    let freed = pool.deallocate_on(x, stream);
    let y = pool.allocate_on(4096, 0, stream).unwrap();
    end_capture();
    let heaps = pool.thread_heaps();
    if freed.is_err() {
        pool.deallocate_on(x, stream).unwrap();
    }
    pool.deallocate_on(y, stream).unwrap();
    (freed.is_ok() || y == x).then_some((freed.is_ok(), y == x, heaps))
}

/// Two reservations on one stream, both opened before their captures (one graph per batch
/// size, say): no heap serves the second capture. (A first version took a plain request during
/// the first capture as the second reservation's capture too, and let heaps back after it.)
#[test]
fn two_reservations_on_one_stream_the_second_capture_gets_no_heap() {
    const S: StreamId = StreamId(7);
    let streams = Arc::new(ManualStreams::new());
    let pool = default_stream_pool("two-reservations", 16 << 20, streams.clone());
    let g1 = pool.graph_reservation(S).unwrap();
    let g2 = pool.graph_reservation(S).unwrap();
    // Capture 1 (g1's): a graph allocation and a plain request on S.
    streams.begin_capture(S);
    let a = g1.allocate(4096, 0).unwrap();
    let p = pool.allocate_on(4096, 0, S).unwrap();
    streams.end_capture(S);
    // Between the captures: a plain request on S.
    let q = pool.allocate_on(4096, 0, S).unwrap();
    pool.deallocate_on(p, S).unwrap();
    pool.deallocate_on(q, S).unwrap();
    // Capture 2 (g2's).
    streams.begin_capture(S);
    let b = g2.allocate(4096, 0).unwrap();
    let served = plain_requests_during_the_capture(&pool, S, || streams.end_capture(S));
    for z in [a, b] {
        pool.deallocate_on(z, S).unwrap();
    }
    drop((g1, g2));
    assert_eq!(served, None, "during g2's capture a heap served S");
}

/// `ManualStreams` with faults: `is_capturing` fails while `flaky` is set; once
/// `capture_at_record` is set, the next record begins a capture on its stream first, as a
/// capture another thread begins between the pool's "is it capturing?" and its record (the
/// record is refused, as `CudaStreams::record` refuses when it asks again after recording);
/// while `failing_records` is set, every record fails (counted in `failed_records`).
#[derive(Debug, Default)]
struct FlakyCapturing {
    inner: ManualStreams,
    flaky: std::sync::atomic::AtomicBool,
    capture_at_record: std::sync::atomic::AtomicBool,
    failing_records: std::sync::atomic::AtomicBool,
    failed_records: std::sync::atomic::AtomicUsize,
}

impl StreamSync for FlakyCapturing {
    fn record(&self, stream: StreamId) -> Result<Box<dyn StreamEvent>, Error> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.capture_at_record.swap(false, SeqCst) {
            self.inner.begin_capture(stream);
        }
        if self.failing_records.load(SeqCst) {
            self.failed_records.fetch_add(1, SeqCst);
            return Err(Error::Driver {
                call: "cuEventRecord",
                name: "CUDA_ERROR_UNKNOWN".into(),
                text: "injected".into(),
                code: 999,
            });
        }
        self.inner.record(stream)
    }
    fn order_after(&self, waiter: StreamId, producer: StreamId) -> Result<(), Error> {
        self.inner.order_after(waiter, producer)
    }
    fn is_capturing(&self, stream: StreamId) -> Result<bool, Error> {
        if self.flaky.load(std::sync::atomic::Ordering::Acquire) {
            return Err(Error::Driver {
                call: "cuStreamIsCapturing",
                name: "CUDA_ERROR_UNKNOWN".into(),
                text: "injected".into(),
                code: 999,
            });
        }
        self.inner.is_capturing(stream)
    }
    fn synchronize(&self, stream: StreamId) -> Result<(), Error> {
        self.inner.synchronize(stream)
    }
}

/// An `is_capturing` that fails before the capture keeps heaps off the stream and notes
/// nothing: no heap serves the capture. (A first version took the error as "seen capturing",
/// and the next answer, before the capture, as its end.)
#[test]
fn an_is_capturing_error_before_the_capture_lets_no_heap_serve_it() {
    const S: StreamId = StreamId(7);
    let streams = Arc::new(FlakyCapturing::default());
    let pool = default_stream_pool("flaky-is-capturing", 16 << 20, streams.clone());
    let graph = pool.graph_reservation(S).unwrap();
    streams
        .flaky
        .store(true, std::sync::atomic::Ordering::Release);
    let w1 = pool.allocate_on(4096, 0, S);
    streams
        .flaky
        .store(false, std::sync::atomic::Ordering::Release);
    let w2 = pool.allocate_on(4096, 0, S).unwrap();
    if let Ok(w1) = w1 {
        pool.deallocate_on(w1, S).unwrap();
    }
    pool.deallocate_on(w2, S).unwrap();
    streams.inner.begin_capture(S);
    let g = graph.allocate(4096, 0).unwrap();
    let served = plain_requests_during_the_capture(&pool, S, || streams.inner.end_capture(S));
    pool.deallocate_on(g, S).unwrap();
    drop(graph);
    assert_eq!(served, None, "during the capture a heap served S");
}

#[test]
fn a_graph_reservation_gives_back_the_threads_heap_for_its_stream() {
    const S: StreamId = StreamId(7);
    let streams = Arc::new(ManualStreams::new());
    let pool = default_stream_pool("reservation", 16 << 20, streams.clone());
    // Warmed up on `S`: a heap for it, which reuses its frees there at once.
    let x = pool.allocate_on(64 << 10, 0, S).unwrap();
    let y = pool.allocate_on(64 << 10, 0, S).unwrap();
    pool.deallocate_on(y, S).unwrap();
    assert_eq!(pool.thread_heaps(), 1);
    // A graph on `S`: the heap goes back before the capture, its free span parked until `S`
    // passes an event recorded now, its live block (`x`) staying where it is.
    let graph = pool.graph_reservation(S).unwrap();
    assert_eq!(pool.thread_heaps(), 0);
    assert_eq!(streams.pending(S), 1);
    streams.begin_capture(S);
    // A plain free on the capturing stream is refused (its event would be captured), and
    // the block stays allocated: without the heap the pool's index takes it.
    let before = pool.stats();
    let err = pool.deallocate_on(x, S).unwrap_err();
    assert!(err.to_string().contains("capturing"), "{err}");
    assert_eq!(pool.stats().live, before.live);
    // The graph's own blocks are served, and no heap comes back during the capture.
    let g = graph.allocate(4096, 0).unwrap();
    let during = pool.allocate_on(4096, 0, S).unwrap();
    assert_eq!(pool.thread_heaps(), 0);
    streams.end_capture(S);
    // After the capture: `x` can go, and the next request on `S` makes a new heap, while the
    // graph (and its reservation) lives on.
    pool.deallocate_on(x, S).unwrap();
    pool.deallocate_on(during, S).unwrap();
    let z = pool.allocate_on(4096, 0, S).unwrap();
    assert_eq!(pool.thread_heaps(), 1);
    pool.deallocate_on(z, S).unwrap();
    pool.deallocate_on(g, S).unwrap();
    drop(graph);
    assert_all_free(&pool, &streams, 16 << 20);
}

#[test]
fn a_sink_switched_on_and_off_never_gives_a_thread_two_heaps_for_one_stream() {
    // A request that saw a sink on takes the general way; if the sink is off again by the
    // time it looks for a heap, it must find the thread's heap, not make a second one.
    const S: StreamId = StreamId(7);
    let streams = Arc::new(ManualStreams::new());
    let pool = default_stream_pool("toggled-sink", 64 << 20, streams.clone());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let heaps = std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..50_000 / MIRI_SCALE {
                pool.set_events(Some(Arc::new(|_: &PoolEvent<'_>| {})));
                pool.set_events(None);
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        s.spawn(|| {
            let mut most = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let a = pool.allocate_on(4096, 0, S).unwrap();
                pool.deallocate_on(a, S).unwrap();
                // A block the general path made (while the sink was on) is parked on `S` by
                // its free: complete it, or a long run with the sink on parks the whole
                // capacity and the next request fails.
                streams.complete(S);
                most = most.max(pool.thread_heaps());
            }
            most
        })
        .join()
        .unwrap()
    });
    assert!(heaps <= 1, "one thread on one stream: {heaps} heaps");
    let stats = drained(&pool, &streams);
    assert_eq!((stats.live, stats.in_use), (0, 0));
}

#[test]
fn a_thread_exit_parks_a_stream_heaps_free_blocks_and_a_refusal_takes_them_in_order() {
    const S: StreamId = StreamId(7);
    let capacity = 16 << 20;
    let streams = Arc::new(ManualStreams::new());
    let pool = Arc::new(stream_pool("exit-park", capacity, streams.clone()));
    let churn = || {
        let pool = pool.clone();
        on_exiting_thread(move || {
            let a = pool.allocate_on(1 << 20, 0, S).unwrap();
            pool.deallocate_on(a, S).unwrap();
        });
    };
    churn();
    // Given back at the thread's exit: the stream may still use those blocks, and no other
    // stream was made to wait for it.
    let stats = pool.stats();
    assert_eq!((stats.in_use, stats.pending), (0, 1 << 20));
    assert!(streams.waits().is_empty());
    assert_eq!(pool.reclaim().unwrap(), 0);
    streams.complete(S);
    assert_eq!(pool.reclaim().unwrap(), 1 << 20);
    churn();
    assert_eq!(pool.stats().pending, 1 << 20);
    // A request that needs them: rather than fail, the pool makes the home stream wait for
    // the stream and takes them.
    let all = pool.allocate(capacity, 0).unwrap();
    assert_eq!(streams.waits(), vec![(HOME, S)]);
    assert_eq!(pool.stats().pending, 0);
    pool.deallocate(all).unwrap();
}

#[test]
fn a_refusal_makes_the_home_stream_wait_for_a_stream_heap_and_takes_its_blocks() {
    const S: StreamId = StreamId(7);
    let capacity = 16 << 20;
    let streams = Arc::new(ManualStreams::new());
    let pool = stream_pool("refusal-order", capacity, streams.clone());
    with_free_stream_heap(&pool, S, || {
        // The whole capacity, on the home stream: only with the stream heap's blocks. Rather
        // than fail, the pool makes the home stream wait for the heap's stream (no thread
        // blocks) and takes them.
        let all = pool.allocate(capacity, 0).unwrap();
        assert_eq!(streams.waits(), vec![(HOME, S)]);
        assert_eq!((streams.pending(S), pool.stats().pending), (0, 0));
        pool.deallocate(all).unwrap();
    });
}

#[test]
fn a_stream_heap_given_back_while_its_stream_captures_waits_for_the_capture_to_end() {
    const S: StreamId = StreamId(7);
    let capacity = 16 << 20;
    let streams = Arc::new(ManualStreams::new());
    let pool = stream_pool("capture-park", capacity, streams.clone());
    with_free_stream_heap(&pool, S, || {
        streams.begin_capture(S);
        // A refusal cannot make the home stream wait for a capturing stream, nor record an
        // event on it: the heap's blocks are parked, and nothing is asked of the stream
        // until its capture ends.
        assert!(pool.allocate(capacity, 0).is_err());
        assert!(streams.waits().is_empty());
        assert_eq!(pool.stats().pending, 1 << 20);
        assert_eq!(pool.reclaim().unwrap(), 0);
        let refused = streams.refused();
        assert!(refused.contains(&("order_after", S)) && refused.contains(&("record", S)));
        streams.end_capture(S);
        // Recorded at the first look after the capture: done once the stream is.
        assert_eq!(pool.reclaim().unwrap(), 0);
        assert_eq!(streams.pending(S), 1);
        streams.complete(S);
        assert_eq!(pool.reclaim().unwrap(), 1 << 20);
        let all = pool.allocate(capacity, 0).unwrap();
        pool.deallocate(all).unwrap();
    });
}

/// Has the free stream heap of `stream` (see [`with_free_stream_heap`]) give its 1 MiB back
/// while `stream` captures: parked behind an event to record once the capture is over, which
/// it is on return.
fn park_behind_a_lazy_event(pool: &Pool, streams: &ManualStreams, stream: StreamId, all: usize) {
    streams.begin_capture(stream);
    assert!(pool.allocate(all, 0).is_err());
    assert_eq!(pool.stats().pending, 1 << 20);
    streams.end_capture(stream);
}

#[test]
fn a_capture_begun_as_a_given_back_heaps_event_is_recorded_leaves_its_blocks_parked() {
    const S: StreamId = StreamId(7);
    let capacity = 16 << 20;
    let streams = Arc::new(FlakyCapturing::default());
    let pool = stream_pool("capture-at-record", capacity, streams.clone());
    with_free_stream_heap(&pool, S, || {
        park_behind_a_lazy_event(&pool, &streams.inner, S, capacity);
        // The first look after it: not capturing, so it records, but a capture begins in
        // between and the record is refused. The blocks wait on, not set aside.
        streams
            .capture_at_record
            .store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(pool.reclaim().unwrap(), 0);
        assert!(streams.inner.refused().contains(&("record", S)));
        let stats = pool.stats();
        assert_eq!((stats.pending, stats.quarantined), (1 << 20, 0));
        // Recorded at the first look after that capture: done once the stream is.
        streams.inner.end_capture(S);
        assert_eq!(pool.reclaim().unwrap(), 0);
        assert_eq!(streams.inner.pending(S), 1);
        streams.inner.complete(S);
        assert_eq!(pool.reclaim().unwrap(), 1 << 20);
        let all = pool.allocate(capacity, 0).unwrap();
        pool.deallocate(all).unwrap();
    });
    assert_eq!(pool.stats().quarantined, 0);
}

#[test]
fn a_given_back_heaps_event_that_cannot_be_recorded_sets_its_blocks_aside_after_three_tries() {
    use std::sync::atomic::Ordering::SeqCst;
    const S: StreamId = StreamId(7);
    let capacity = 16 << 20;
    let streams = Arc::new(FlakyCapturing::default());
    let pool = stream_pool("failing-records", capacity, streams.clone());
    with_free_stream_heap(&pool, S, || {
        park_behind_a_lazy_event(&pool, &streams.inner, S, capacity);
        // Every record fails, the stream not capturing: the blocks wait through two failed
        // tries and are set aside at the third.
        streams.failing_records.store(true, SeqCst);
        let mut looks = 0;
        while pool.stats().quarantined == 0 && looks < 10 {
            assert_eq!(pool.reclaim().unwrap(), 0);
            looks += 1;
        }
        assert_eq!(
            streams.failed_records.load(SeqCst),
            3,
            "after {looks} looks"
        );
        let stats = pool.stats();
        assert_eq!((stats.pending, stats.quarantined), (0, 1 << 20));
        streams.failing_records.store(false, SeqCst);
    });
}

/// A stream runtime that remembers, on one clock, when streams were made to wait for others
/// and when they were drained: what a model needs to check that a block freed on one stream
/// is handed out for another only once that stream is done with it, or ordered before it.
#[derive(Debug, Default)]
struct Clocked {
    inner: ManualStreams,
    log: Mutex<Clock>,
}

#[derive(Debug, Default)]
struct Clock {
    now: u64,
    /// `(time, waiter, producer)`: work queued on `waiter` after `time` runs after work
    /// queued on `producer` before it.
    waits: Vec<(u64, StreamId, StreamId)>,
    /// `(time, stream)`: work queued on `stream` before `time` has finished.
    drained: Vec<(u64, StreamId)>,
}

impl Clocked {
    fn tick(&self) -> u64 {
        let mut clock = self.log.lock().unwrap();
        clock.now += 1;
        clock.now
    }

    /// Completes every event on `stream`: the stream is drained.
    fn drain(&self, stream: StreamId) {
        let mut clock = self.log.lock().unwrap();
        clock.now += 1;
        let now = clock.now;
        clock.drained.push((now, stream));
        self.inner.complete(stream);
    }

    /// Whether work queued on `to` after `until` runs after the work queued on `from` before
    /// `since` (the same stream; a chain of waits; or a stream on such a chain drained).
    fn ordered(&self, from: StreamId, since: u64, to: StreamId, until: u64) -> bool {
        if from == to {
            return true;
        }
        let clock = self.log.lock().unwrap();
        let mut reached: HashMap<StreamId, u64> = HashMap::from([(from, since)]);
        // (Both logs are in time order: only what happened between `since` and `until`.)
        let waits = &clock.waits[clock.waits.partition_point(|w| w.0 <= since)..];
        for &(t, waiter, producer) in waits.iter().take_while(|w| w.0 < until) {
            if reached.get(&producer).is_some_and(|&r| r < t) {
                reached.entry(waiter).or_insert(t);
            }
        }
        let drained = &clock.drained[clock.drained.partition_point(|d| d.0 <= since)..];
        reached.contains_key(&to)
            || drained
                .iter()
                .take_while(|d| d.0 < until)
                .any(|&(t, s)| reached.get(&s).is_some_and(|&r| r < t))
    }
}

impl StreamSync for Clocked {
    fn record(&self, stream: StreamId) -> Result<Box<dyn StreamEvent>, Error> {
        self.inner.record(stream)
    }
    fn order_after(&self, waiter: StreamId, producer: StreamId) -> Result<(), Error> {
        let mut clock = self.log.lock().unwrap();
        self.inner.order_after(waiter, producer)?;
        clock.now += 1;
        let now = clock.now;
        clock.waits.push((now, waiter, producer));
        Ok(())
    }
    fn synchronize(&self, stream: StreamId) -> Result<(), Error> {
        self.inner.synchronize(stream)?;
        self.drain(stream);
        Ok(())
    }
}

#[test]
fn four_threads_on_their_own_streams_reuse_blocks_only_in_stream_order() {
    // 60,000 operations on each of four threads, each allocating on a stream of its own and
    // now and then on the home stream, freeing mostly on the block's stream and otherwise on
    // the home stream or a neighbour's; streams drained now and then; statistics (every heap
    // locked for a moment), refusals (every heap gives its spans back) and reclaims while the
    // others run. A shared model sees every block:
    // two live blocks never overlap, and a block handed out for a stream was freed on that
    // stream, or the stream it was freed on was drained since, or the new stream was made to
    // wait for it (directly or through others) since. After joining and draining, every count
    // is exact.
    const THREADS: usize = 4;
    const OPS: usize = 60_000 / MIRI_SCALE;
    let stream = |t: usize| StreamId(10 + t as u64);
    let clocked = Arc::new(Clocked::default());
    let capacity = 24 << 20;
    let pool = Pool::builder(capacity)
        .name("stream-order")
        .eager_thread_heaps(true)
        .thread_heaps(4 << 20)
        .streams(clocked.clone(), HOME)
        .log_leaks_on_drop(false)
        .build_host()
        .unwrap();
    // Live blocks: address -> (end, thread).
    let live_model: Mutex<BTreeMap<u64, (u64, usize)>> = Mutex::new(BTreeMap::new());
    // Freed ranges not handed out since: start -> (end, stream freed on, time of the free).
    let freed: Mutex<BTreeMap<u64, (u64, StreamId, u64)>> = Mutex::new(BTreeMap::new());
    let start = Barrier::new(THREADS);
    let counts: Vec<(u64, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (pool, clocked, live_model, freed, start) =
                    (&pool, &*clocked, &live_model, &freed, &start);
                s.spawn(move || {
                    let mut rng = Rng(0xA076_1D64_78BD_642F ^ (t as u64 + 1));
                    let mut live: Vec<(u64, usize, StreamId)> = Vec::new();
                    let (mut allocations, mut frees) = (0u64, 0u64);
                    let handed_out = |addr: u64, size: usize, on: StreamId| {
                        let until = clocked.tick();
                        let end = addr + class_rounded(size) as u64;
                        {
                            let mut m = live_model.lock().unwrap();
                            if let Some((&prev, &(prev_end, who))) = m.range(..addr).next_back() {
                                assert!(prev_end <= addr, "{addr:#x} overlaps {prev:#x} of {who}");
                            }
                            if let Some((&next, &(_, who))) = m.range(addr..).next() {
                                assert!(end <= next, "{addr:#x} overlaps {next:#x} of {who}");
                            }
                            m.insert(addr, (end, t));
                        }
                        let mut f = freed.lock().unwrap();
                        let first = f.range(..addr).next_back().map_or(addr, |(&a, _)| a);
                        let overlapping: Vec<(u64, (u64, StreamId, u64))> = f
                            .range(first..end)
                            .filter(|(_, (e, _, _))| *e > addr)
                            .map(|(&a, &v)| (a, v))
                            .collect();
                        for (a, (e, was, when)) in overlapping {
                            assert!(
                                clocked.ordered(was, when, on, until),
                                "{addr:#x}..{end:#x} handed out for stream {on} overlaps \
                                 {a:#x}..{e:#x}, freed on stream {was} at {when}, with \
                                 nothing ordering {on} after that"
                            );
                            f.remove(&a);
                            if a < addr {
                                f.insert(a, (addr, was, when));
                            }
                            if e > end {
                                f.insert(end, (e, was, when));
                            }
                        }
                    };
                    start.wait();
                    for _ in 0..OPS {
                        let r = rng.below(1000);
                        if r < 500 && live.len() < 200 {
                            let on = if r < 450 { stream(t) } else { HOME };
                            let size = rng.size(64 << 10);
                            match pool.allocate_on(size, 0, on) {
                                Ok(addr) => {
                                    handed_out(addr, size, on);
                                    live.push((addr, size, on));
                                    allocations += 1;
                                }
                                Err(Error::PoolExhausted { .. }) => {}
                                Err(e) => panic!("{e}"),
                            }
                        } else if r < 960 && !live.is_empty() {
                            let (addr, size, on) =
                                live.swap_remove(rng.below(live.len() as u64) as usize);
                            let on = match rng.below(10) {
                                0 => HOME,
                                1 => stream((t + 1) % THREADS),
                                _ => on,
                            };
                            let end = addr + class_rounded(size) as u64;
                            live_model.lock().unwrap().remove(&addr).unwrap();
                            let when = clocked.tick();
                            freed.lock().unwrap().insert(addr, (end, on, when));
                            pool.deallocate_on(addr, on).unwrap();
                            frees += 1;
                        } else if r < 990 {
                            let which = rng.below(THREADS as u64 + 1) as usize;
                            clocked.drain(if which == THREADS {
                                HOME
                            } else {
                                stream(which)
                            });
                        } else if r < 995 {
                            let _ = pool.stats();
                        } else {
                            pool.reclaim().unwrap();
                        }
                    }
                    for (addr, _, on) in live {
                        live_model.lock().unwrap().remove(&addr).unwrap();
                        pool.deallocate_on(addr, on).unwrap();
                        frees += 1;
                    }
                    (allocations, frees)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for t in 0..THREADS {
        clocked.drain(stream(t));
    }
    clocked.drain(HOME);
    pool.reclaim().unwrap();
    let s = pool.stats();
    let allocations: u64 = counts.iter().map(|c| c.0).sum();
    let frees: u64 = counts.iter().map(|c| c.1).sum();
    assert_eq!(allocations, frees);
    assert_eq!(
        (s.in_use, s.pending, s.allocations, s.frees, s.largest_free),
        (0, 0, allocations, frees, capacity)
    );
    // (The heaps' spans and the refusals made streams wait: the model saw orders, not only
    // drains.)
    assert!(!clocked.log.lock().unwrap().waits.is_empty());
}

/// A runtime whose stream 2 is a different stream on each thread (CUDA's per-thread default
/// stream); while its flag is set, asking it whether a stream is one panics.
#[derive(Debug, Default)]
struct PerThread(ManualStreams, std::sync::atomic::AtomicBool);

impl StreamSync for PerThread {
    fn record(&self, stream: StreamId) -> Result<Box<dyn StreamEvent>, Error> {
        self.0.record(stream)
    }
    fn order_after(&self, waiter: StreamId, producer: StreamId) -> Result<(), Error> {
        self.0.order_after(waiter, producer)
    }
    fn is_per_thread(&self, stream: StreamId) -> bool {
        assert!(
            !self.1.load(std::sync::atomic::Ordering::Relaxed),
            "is_per_thread panics"
        );
        stream == StreamId(2)
    }
}

#[test]
fn a_stream_that_is_another_on_each_thread_gets_no_heap() {
    // A heap for it would hand a block one thread freed there to another thread's stream.
    const PER_THREAD: StreamId = StreamId(2);
    let streams = Arc::new(PerThread::default());
    let pool = stream_pool("per-thread", 16 << 20, streams.clone());
    std::thread::scope(|s| {
        s.spawn(|| {
            let home_block = pool.allocate(4096, 0).unwrap();
            pool.deallocate(home_block).unwrap();
            let a = pool.allocate_on(4096, 0, PER_THREAD).unwrap();
            assert_eq!(pool.thread_heaps(), 1, "the home stream's heap only");
            // Freed there: parked until that stream is done, never reused at once.
            pool.deallocate_on(a, PER_THREAD).unwrap();
            assert_eq!(streams.0.pending(PER_THREAD), 1);
            // Every allocation for it waits for the home stream anew (each thread's stream 2
            // is another stream).
            let waits = streams.0.waits().len();
            let b = pool.allocate_on(4096, 0, PER_THREAD).unwrap();
            let c = pool.allocate_on(4096, 0, PER_THREAD).unwrap();
            assert_eq!(streams.0.waits().len(), waits + 2);
            pool.deallocate_on(b, PER_THREAD).unwrap();
            pool.deallocate_on(c, PER_THREAD).unwrap();
        });
    });
    streams.0.complete_all();
    pool.reclaim().unwrap();
    let s = pool.stats();
    assert_eq!((s.in_use, s.pending, s.largest_free), (0, 0, 16 << 20));
}

/// A pool slice may move to another thread and be dropped there: for a stream that is
/// another on each thread, its free would be recorded on the other thread's stream, out of
/// the order of the work queued on it here. Slices for such a stream are refused (raw
/// allocations, freed by the thread that knows the stream, are not); a panic of the runtime
/// there is an error.
#[test]
fn a_slice_for_a_stream_that_is_another_on_each_thread_is_refused() {
    const PER_THREAD: StreamId = StreamId(2);
    let streams = Arc::new(PerThread::default());
    let pool = stream_pool("per-thread-slices", 1 << 20, streams.clone());
    let err = pool
        .own_client()
        .alloc_slice_on::<u32>(16, PER_THREAD)
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument { what } if what.contains("stream 0x2")
            && what.contains("per-thread")),
        "{err}"
    );
    let other = pool
        .own_client()
        .alloc_slice_on::<u32>(16, StreamId(7))
        .unwrap();
    drop(other);
    let raw = pool.allocate_on(64, 0, PER_THREAD).unwrap();
    pool.deallocate_on(raw, PER_THREAD).unwrap();
    streams.1.store(true, std::sync::atomic::Ordering::Relaxed);
    let err = pool
        .own_client()
        .alloc_slice_on::<u32>(16, PER_THREAD)
        .unwrap_err();
    assert!(
        err.to_string().contains("panicked in `is_per_thread`"),
        "{err}"
    );
    streams.1.store(false, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(pool.stats().live, 0);
}

/// The same for a graph reservation, which may be released (its release event recorded on the
/// stream its handle names) on another thread than the capture's.
#[test]
fn a_graph_reservation_for_a_stream_that_is_another_on_each_thread_is_refused() {
    const PER_THREAD: StreamId = StreamId(2);
    let streams = Arc::new(PerThread::default());
    let pool = stream_pool("per-thread-graphs", 1 << 20, streams.clone());
    let err = pool.graph_reservation(PER_THREAD).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument { what } if what.contains("stream 0x2")
            && what.contains("per-thread") && what.contains("graph reservation")),
        "{err}"
    );
    let graph = pool.graph_reservation(StreamId(7)).unwrap();
    let a = graph.allocate(64, 0).unwrap();
    pool.deallocate_on(a, StreamId(7)).unwrap();
    graph.release().unwrap();
    streams.1.store(true, std::sync::atomic::Ordering::Relaxed);
    let err = pool.graph_reservation(PER_THREAD).unwrap_err();
    assert!(
        err.to_string().contains("panicked in `is_per_thread`"),
        "{err}"
    );
    streams.1.store(false, std::sync::atomic::Ordering::Relaxed);
}

#[test]
fn a_per_thread_home_stream_and_a_panicking_runtime_are_errors_not_panics() {
    let err = Pool::builder(1 << 20)
        .name("per-thread-home")
        .streams(Arc::new(PerThread::default()), StreamId(2))
        .build_host()
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("per-thread-home") && text.contains("different stream on each thread"),
        "{text}"
    );
    // A runtime that panics when asked: an error when the pool is built; once built, no heap
    // for the stream and a wait every time, and the calls succeed.
    let streams = Arc::new(PerThread::default());
    streams.1.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(
        Pool::builder(1 << 20)
            .streams(streams.clone(), HOME)
            .build_host()
            .is_err()
    );
    streams.1.store(false, std::sync::atomic::Ordering::Relaxed);
    let pool = stream_pool("panicking-runtime", 16 << 20, streams.clone());
    streams.1.store(true, std::sync::atomic::Ordering::Relaxed);
    std::thread::scope(|s| {
        s.spawn(|| {
            let a = pool.allocate_on(4096, 0, StreamId(7)).unwrap();
            let b = pool.allocate_on(4096, 0, StreamId(7)).unwrap();
            assert_eq!(pool.thread_heaps(), 0);
            assert_eq!(streams.0.waits().len(), 2, "a wait for each allocation");
            pool.deallocate_on(a, StreamId(7)).unwrap();
            pool.deallocate_on(b, StreamId(7)).unwrap();
        });
    });
}

#[test]
fn a_capture_that_needs_blocks_a_stream_heap_gave_back_has_the_host_wait_for_them() {
    // A thread on stream 7 leaves its blocks given back and parked (it exits); a capture on
    // stream 9 then needs them. Stream 9 cannot wait for the home stream: the home stream waits
    // for stream 7, and the host for the home stream, instead.
    const S: StreamId = StreamId(7);
    const CAPTURE: StreamId = StreamId(9);
    let capacity = 16 << 20;
    let streams = Arc::new(ManualStreams::new());
    let pool = Arc::new(stream_pool(
        "capture-after-give-back",
        capacity,
        streams.clone(),
    ));
    {
        let pool = pool.clone();
        on_exiting_thread(move || {
            let a = pool.allocate_on(1 << 20, 0, S).unwrap();
            pool.deallocate_on(a, S).unwrap();
        });
    }
    assert_eq!(pool.stats().pending, 1 << 20);
    streams.begin_capture(CAPTURE);
    let all = pool
        .allocate_for_capture(AllocRequest::new(capacity, 0).on(CAPTURE))
        .unwrap();
    assert!(streams.waits().contains(&(HOME, S)));
    assert!(streams.synchronized().contains(&HOME));
    assert!(streams.refused().is_empty(), "{:?}", streams.refused());
    streams.end_capture(CAPTURE);
    pool.deallocate_on(all, CAPTURE).unwrap();
    streams.complete_all();
    pool.reclaim().unwrap();
    assert_eq!(pool.stats().in_use, 0);
}

/// Runs `f` on a thread of its own and returns once the thread has ended, its thread-local
/// destructors included (they give the thread's heaps back): `join` waits for them, the end of
/// a `std::thread::scope` may not.
fn on_exiting_thread<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    std::thread::spawn(f).join().unwrap()
}

/// Live blocks as `(address, reserved bytes)` never overlap.
fn assert_disjoint(blocks: &mut [(u64, usize)]) {
    blocks.sort_unstable();
    for pair in blocks.windows(2) {
        assert!(
            pair[0].0 + pair[0].1 as u64 <= pair[1].0,
            "blocks {:#x}+{} and {:#x} overlap",
            pair[0].0,
            pair[0].1,
            pair[1].0
        );
    }
}

#[test]
fn a_sink_that_gives_the_threads_heap_back_midway_leaves_one_owner_per_block() {
    // The sink runs on the thread whose heap for `side` was looked up last, outside the
    // pool's lock: it switches itself off, allocates there (the heap, looked up again), opens
    // a graph reservation on `side` (which takes that heap out of the thread's list) and
    // allocates there again (the pool's index, then a new heap). Every block has one owner
    // and the counts add up.
    let side = StreamId(7);
    let streams = Arc::new(ManualStreams::new());
    let pool = Arc::new(default_stream_pool(
        "sink-gives-back",
        8 << 20,
        streams.clone(),
    ));
    let inner: Arc<Mutex<Vec<u64>>> = Arc::default();
    let graph: Arc<Mutex<Option<devarena::pool::GraphReservation>>> = Arc::default();
    let before: Vec<u64> = (0..4)
        .map(|i| pool.allocate_on(1000 * (i + 1), 0, side).unwrap())
        .collect();
    assert_eq!(pool.thread_heaps(), 1);
    let sink = {
        let (pool, inner, graph) = (Arc::downgrade(&pool), inner.clone(), graph.clone());
        move |_: &PoolEvent<'_>| {
            let Some(pool) = pool.upgrade() else { return };
            pool.set_events(None);
            let mut inner = inner.lock().unwrap();
            inner.push(pool.allocate_on(3000, 0, side).unwrap());
            *graph.lock().unwrap() = Some(pool.graph_reservation(side).unwrap());
            inner.push(pool.allocate_on(5000, 0, side).unwrap());
            inner.push(pool.allocate_on(7000, 0, side).unwrap());
        }
    };
    pool.set_events(Some(Arc::new(sink)));
    let home = pool.allocate(2000, 0).unwrap();
    let inner = inner.lock().unwrap().clone();
    assert_eq!(inner.len(), 3, "the sink ran once");
    let after: Vec<u64> = (0..4)
        .map(|_| pool.allocate_on(9000, 0, side).unwrap())
        .collect();
    let sizes = [
        1000, 2000, 3000, 4000, 2000, 3000, 5000, 7000, 9000, 9000, 9000, 9000,
    ];
    let addrs: Vec<u64> = before
        .iter()
        .chain([&home])
        .chain(&inner)
        .chain(&after)
        .copied()
        .collect();
    let mut blocks: Vec<(u64, usize)> = addrs
        .iter()
        .zip(sizes)
        .map(|(&a, s)| (a, class_rounded(s)))
        .collect();
    assert_disjoint(&mut blocks);
    assert_eq!(pool.stats().live, 12);
    for (&a, s) in addrs.iter().zip(sizes) {
        let stream = if a == home { HOME } else { side };
        pool.deallocate_with(FreeRequest::new(a).size(s).on(stream))
            .unwrap();
    }
    drop(graph.lock().unwrap().take());
    drained(&pool, &streams);
    let stats = drained(&pool, &streams);
    assert_eq!((stats.live, stats.in_use, stats.pending), (0, 0, 0));
    assert_eq!(stats.largest_free, 8 << 20);
}

// ---------------------------------------------------------------------------------------------
// Storms of threads on one pool, across its settings: thread heaps eager or not, exact or
// leased peaks, classic or growable regions, and heaps for streams of their own. Threads
// allocate and free random sizes and alignments as three clients (two with quotas), free
// blocks other threads allocated, hold typed slices, start short-lived threads that exit with
// blocks live in their heaps, while statistics, client statistics, leak reports and trims run
// and tracking and an event sink are switched on and off. Every allocation is checked against
// a model of the live blocks (no overlap) and the quotas; after the threads are joined the
// pool's counts must be exact, its free memory one block of the whole capacity, and every
// quota fillable to the byte. `STORM_SEEDS` and `STORM_OPS` make a run longer.
mod storm {
    use super::*;

    /// Every live block of every thread, start to end of its size class: an allocation that
    /// overlaps one fails the test.
    #[derive(Default)]
    struct LiveBlocks(Mutex<BTreeMap<u64, u64>>);

    impl LiveBlocks {
        fn insert(&self, addr: u64, size: usize) {
            let end = addr + class_rounded(size) as u64;
            let mut m = self.0.lock().unwrap();
            if let Some((&p, &pe)) = m.range(..=addr).next_back() {
                assert!(pe <= addr, "{addr:#x} overlaps {p:#x}..{pe:#x}");
            }
            if let Some((&n, _)) = m.range(addr..).next() {
                assert!(end <= n, "{addr:#x}..{end:#x} overlaps {n:#x}");
            }
            m.insert(addr, end);
        }

        fn remove(&self, addr: u64) {
            assert!(
                self.0.lock().unwrap().remove(&addr).is_some(),
                "{addr:#x} not live"
            );
        }

        fn is_empty(&self) -> bool {
            self.0.lock().unwrap().is_empty()
        }
    }

    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    enum Mem {
        Classic,
        Growable,
    }

    fn storm(seed: u64, eager: bool, exact: bool, mem: Mem, threads: usize, ops: usize) {
        let capacity = 16 << 20;
        let builder = Pool::builder(capacity)
            .eager_thread_heaps(eager)
            .exact_peaks(exact)
            .thread_heaps(if seed % 2 == 0 { 1 << 20 } else { 8 << 20 })
            .log_leaks_on_drop(false);
        let pool = match mem {
            Mem::Classic => builder.build_host().unwrap(),
            Mem::Growable => builder
                .build_mapped(devarena::backend::HostVirtualMemory::new(64 << 10).unwrap())
                .unwrap(),
        };
        let quota_a = 3 << 20;
        let qa = pool.client("qa", quota_a);
        let qb = pool.client("qb", 5 << 20);
        let clients: Vec<PoolClient> = vec![pool.own_client().clone(), qa.clone(), qb.clone()];
        let quotas = [usize::MAX, quota_a, 5 << 20];
        let model = LiveBlocks::default();
        let mailbox: Mutex<Vec<(u64, usize)>> = Mutex::new(Vec::new());
        let allocs = std::sync::atomic::AtomicU64::new(0);
        let frees = std::sync::atomic::AtomicU64::new(0);
        let start = Barrier::new(threads + 1);
        let running = std::sync::atomic::AtomicUsize::new(threads);
        let insert = |addr: u64, size: usize| model.insert(addr, size);
        let remove = |addr: u64| model.remove(addr);
        std::thread::scope(|s| {
            let mut hs = Vec::new();
            for t in 0..threads {
                let (pool, clients, insert, remove, mailbox, allocs, frees, start, running) = (
                    &pool, &clients, &insert, &remove, &mailbox, &allocs, &frees, &start, &running,
                );
                hs.push(s.spawn(move || {
                    let mut rng = Rng(seed.wrapping_mul(7919) ^ ((t as u64 + 1) * 0x9E37_79B9));
                    start.wait();
                    let mut live: Vec<(u64, usize)> = Vec::new();
                    let mut slices: Vec<PoolSlice<u8>> = Vec::new();
                    let mut op = 0;
                    while op < ops {
                        // Now and then a short-lived thread: allocates, hands some blocks to the
                        // mailbox, frees some, exits with the rest live in its heap (handed too).
                        if rng.below(2000) == 0 {
                            let sub_seed = rng.next();
                            let handed: Vec<(u64, usize)> = std::thread::scope(|s2| {
                                s2.spawn(move || {
                                    let mut r = Rng(sub_seed | 1);
                                    let mut mine = Vec::new();
                                    for _ in 0..200 {
                                        let c = r.below(3) as usize;
                                        let size = r.size(128 << 10);
                                        if let Ok(a) = clients[c].allocate(size, r.align()) {
                                            insert(a, size);
                                            allocs
                                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                            mine.push((a, c));
                                        }
                                        if mine.len() > 20 {
                                            let (a, c) = mine
                                                .swap_remove(r.below(mine.len() as u64) as usize);
                                            remove(a);
                                            clients[c].deallocate(a).unwrap();
                                            frees
                                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                        }
                                    }
                                    mine
                                })
                                .join()
                                .unwrap()
                            });
                            mailbox.lock().unwrap().extend(handed);
                        }
                        op += 1;
                        let r = rng.below(1000);
                        if r < 470 && live.len() < 200 {
                            let c = rng.below(3) as usize;
                            let size = rng.size(256 << 10);
                            let align = rng.align();
                            match clients[c].allocate(size, align) {
                                Ok(a) => {
                                    assert_eq!(a % align.max(256) as u64, 0);
                                    insert(a, size);
                                    allocs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                    live.push((a, c));
                                }
                                Err(Error::PoolExhausted { .. }) => {}
                                Err(e) => panic!("{e}"),
                            }
                        } else if r < 490 && slices.len() < 10 {
                            if let Ok(sl) =
                                clients[rng.below(3) as usize].alloc_slice::<u8>(rng.size(16 << 10))
                            {
                                insert(sl.addr(), sl.len());
                                allocs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                slices.push(sl);
                            }
                        } else if r < 500 && !slices.is_empty() {
                            let sl = slices.swap_remove(rng.below(slices.len() as u64) as usize);
                            remove(sl.addr());
                            drop(sl);
                            frees.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        } else if r < 530 && !live.is_empty() {
                            let b = live.swap_remove(rng.below(live.len() as u64) as usize);
                            mailbox.lock().unwrap().push(b);
                        } else if r < 560 {
                            let theirs: Vec<_> = std::mem::take(&mut *mailbox.lock().unwrap());
                            for (a, c) in theirs {
                                remove(a);
                                clients[c].deallocate(a).unwrap();
                                frees.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                        } else if r < 562 {
                            let s = pool.stats();
                            assert_eq!(
                                s.free + s.in_use + s.pending + s.quarantined,
                                capacity,
                                "{s:?}"
                            );
                            assert!(s.in_use <= capacity && s.peak <= capacity, "{s:?}");
                            if exact {
                                assert!(s.in_use <= s.peak);
                            }
                            assert_eq!(s.live, s.allocations - s.frees);
                            for (c, cs) in pool.client_stats().iter().enumerate() {
                                assert!(cs.in_use <= quotas[c], "{cs:?}");
                                assert!(cs.in_use <= cs.peak, "{cs:?}");
                            }
                        } else if r < 563 && mem == Mem::Growable {
                            let _ = pool.trim().unwrap();
                        } else if r < 564 {
                            let rep = pool.leak_report();
                            let _ = rep.leaks.len();
                        } else if r < 566 && t == 0 && seed % 3 == 1 {
                            // Toggle tracking and a sink while the others work.
                            match rng.below(4) {
                                0 => pool.set_tracking(Tracking::Tags),
                                1 => pool.set_tracking(Tracking::Off),
                                2 => pool.set_events(Some(Arc::new(
                                    |_e: &devarena::pool::PoolEvent<'_>| {},
                                ))),
                                _ => pool.set_events(None),
                            }
                        } else if !live.is_empty() {
                            let (a, c) = live.swap_remove(rng.below(live.len() as u64) as usize);
                            remove(a);
                            clients[c].deallocate(a).unwrap();
                            frees.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                    for (a, c) in live {
                        remove(a);
                        clients[c].deallocate(a).unwrap();
                        frees.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    for sl in slices {
                        remove(sl.addr());
                        drop(sl);
                        frees.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    running.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                }));
            }
            start.wait();
            for h in hs {
                h.join().unwrap();
            }
        });
        for (a, c) in std::mem::take(&mut *mailbox.lock().unwrap()) {
            remove(a);
            clients[c].deallocate(a).unwrap();
            frees.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        assert!(model.is_empty());
        let s = pool.stats();
        let a = allocs.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            (s.allocations, s.frees),
            (a, frees.load(std::sync::atomic::Ordering::Relaxed)),
            "{s:?}"
        );
        assert_eq!(
            (s.in_use, s.requested, s.live, s.pending),
            (0, 0, 0, 0),
            "{s:?}"
        );
        assert_eq!(
            (s.free, s.free_blocks, s.largest_free),
            (capacity, 1, capacity),
            "{s:?}"
        );
        assert_eq!(pool.thread_heaps(), 0);
        for cs in pool.client_stats() {
            assert_eq!((cs.in_use, cs.requested, cs.live), (0, 0, 0), "{cs:?}");
            assert_eq!(cs.allocations, cs.frees, "{cs:?}");
        }
        // The whole capacity in one request.
        let big = pool.allocate(capacity, 0).unwrap();
        pool.deallocate(big).unwrap();
        // A full quota.
        let q = qa.allocate(fit_down(quota_a), 0).unwrap();
        assert!(qa.allocate(1, 0).is_err());
        qa.deallocate(q).unwrap();
    }

    /// Seeds and operations per thread: `STORM_SEEDS` and `STORM_OPS`, or 2 and 20,000.
    fn storm_length() -> (u64, usize) {
        let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse().ok());
        (
            var("STORM_SEEDS").map_or(2, |v: usize| v as u64),
            var("STORM_OPS").unwrap_or(20_000),
        )
    }

    #[test]
    fn storm_matrix() {
        let (seeds, ops) = storm_length();
        for seed in 0..seeds {
            for (eager, exact, mem) in [
                (true, true, Mem::Classic),
                (false, true, Mem::Classic),
                (true, false, Mem::Classic),
                (true, true, Mem::Growable),
                (false, false, Mem::Growable),
            ] {
                eprintln!("seed {seed} eager {eager} exact {exact} {mem:?}");
                storm(seed, eager, exact, mem, 5, ops);
            }
        }
    }

    fn stream_storm(seed: u64, eager: bool, exact: bool, threads: usize, ops: usize) {
        use devarena::pool::{ManualStreams, StreamId};
        let capacity = 16 << 20;
        let streams = Arc::new(ManualStreams::new());
        let home = StreamId(1);
        let pool = Pool::builder(capacity)
            .eager_thread_heaps(eager)
            .exact_peaks(exact)
            .streams(streams.clone(), home)
            .thread_heaps(if seed % 2 == 0 { 1 << 20 } else { 8 << 20 })
            .log_leaks_on_drop(false)
            .build_host()
            .unwrap();
        let qa = pool.client("qa", 3 << 20);
        let clients: Vec<PoolClient> = vec![pool.own_client().clone(), qa.clone()];
        let model = LiveBlocks::default();
        let mailbox: Mutex<Vec<(u64, usize)>> = Mutex::new(Vec::new());
        let insert = |addr: u64, size: usize| model.insert(addr, size);
        let remove = |addr: u64| model.remove(addr);
        std::thread::scope(|s| {
            let mut hs = Vec::new();
            for t in 0..threads {
                let (pool, clients, insert, remove, mailbox, streams) =
                    (&pool, &clients, &insert, &remove, &mailbox, &streams);
                hs.push(s.spawn(move || {
                    let mut rng = Rng(seed.wrapping_mul(7919) ^ ((t as u64 + 1) * 0x9E37_79B9));
                    let mine = [home, StreamId(10 + t as u64), StreamId(99)];
                    let mut live: Vec<(u64, usize)> = Vec::new();
                    for _ in 0..ops {
                        if rng.below(3000) == 0 {
                            let sub_seed = rng.next();
                            let handed: Vec<(u64, usize)> = std::thread::scope(|s2| {
                                s2.spawn(move || {
                                    let mut r = Rng(sub_seed | 1);
                                    let sub = [home, StreamId(50 + t as u64), StreamId(99)];
                                    let mut out = Vec::new();
                                    for _ in 0..100 {
                                        let c = r.below(2) as usize;
                                        let st = sub[r.below(3) as usize];
                                        let size = r.size(64 << 10);
                                        if let Ok(a) = clients[c].allocate_on(size, r.align(), st) {
                                            insert(a, size);
                                            out.push((a, c));
                                        }
                                        if out.len() > 10 {
                                            let (a, c) = out.swap_remove(0);
                                            remove(a);
                                            clients[c]
                                                .deallocate_on(a, sub[r.below(3) as usize])
                                                .unwrap();
                                        }
                                    }
                                    out
                                })
                                .join()
                                .unwrap()
                            });
                            mailbox.lock().unwrap().extend(handed);
                        }
                        let r = rng.below(1000);
                        if r < 480 && live.len() < 150 {
                            let c = rng.below(2) as usize;
                            let size = rng.size(256 << 10);
                            let st = mine[rng.below(3) as usize];
                            match clients[c].allocate_on(size, rng.align(), st) {
                                Ok(a) => {
                                    insert(a, size);
                                    live.push((a, c));
                                }
                                Err(Error::PoolExhausted { .. }) => {}
                                Err(e) => panic!("{e}"),
                            }
                        } else if r < 500 && !live.is_empty() {
                            let b = live.swap_remove(rng.below(live.len() as u64) as usize);
                            mailbox.lock().unwrap().push(b);
                        } else if r < 530 {
                            let theirs: Vec<_> = std::mem::take(&mut *mailbox.lock().unwrap());
                            for (a, c) in theirs {
                                remove(a);
                                clients[c]
                                    .deallocate_on(a, mine[rng.below(3) as usize])
                                    .unwrap();
                            }
                        } else if r < 540 {
                            streams.complete(mine[rng.below(3) as usize]);
                            if rng.below(2) == 0 {
                                let _ = pool.reclaim().unwrap();
                            }
                        } else if r < 542 {
                            let s = pool.stats();
                            assert_eq!(
                                s.free + s.in_use + s.pending + s.quarantined,
                                capacity,
                                "{s:?}"
                            );
                            assert_eq!(s.live, s.allocations - s.frees);
                            assert!(s.peak <= capacity);
                        } else if !live.is_empty() {
                            let (a, c) = live.swap_remove(rng.below(live.len() as u64) as usize);
                            remove(a);
                            clients[c]
                                .deallocate_on(a, mine[rng.below(3) as usize])
                                .unwrap();
                        }
                    }
                    for (a, c) in live {
                        remove(a);
                        clients[c].deallocate(a).unwrap();
                    }
                }));
            }
            for h in hs {
                h.join().unwrap();
            }
        });
        for (a, c) in std::mem::take(&mut *mailbox.lock().unwrap()) {
            remove(a);
            clients[c].deallocate(a).unwrap();
        }
        streams.complete_all();
        pool.reclaim().unwrap();
        let s = pool.stats();
        eprintln!(
            "allocs {} failures {} reused {}",
            s.allocations, s.failures, s.reused
        );
        assert_eq!(
            (s.in_use, s.requested, s.live, s.pending, s.quarantined),
            (0, 0, 0, 0, 0),
            "{s:?}"
        );
        assert_eq!(s.allocations, s.frees);
        assert_eq!(pool.thread_heaps(), 0);
        assert_eq!(
            (s.free, s.free_blocks, s.largest_free),
            (capacity, 1, capacity),
            "{s:?}"
        );
        let big = pool.allocate(capacity, 0).unwrap();
        pool.deallocate(big).unwrap();
    }

    #[test]
    fn stream_storm_matrix() {
        let (seeds, ops) = storm_length();
        for seed in 0..seeds {
            for (eager, exact) in [(true, true), (false, true), (true, false)] {
                eprintln!("seed {seed} eager {eager} exact {exact}");
                stream_storm(seed, eager, exact, 4, ops);
            }
        }
    }
}
