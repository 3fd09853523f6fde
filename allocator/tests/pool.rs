//! The runtime pool against its contract: a reference model under random sequences, caps and
//! quotas, statistics, tracking and leak reports, the event log, stream ordering, typed slices,
//! threads.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Once};

use devarena::pool::{
    AllocRequest, CSV_HEADER, CsvEventLog, LogEvents, ManualStreams, PoolAction, PoolEvent,
    PoolStats, StreamId, Tracking, guaranteed_fit, reserved_bytes,
};
use devarena::{
    Allocation, Backend, BackendStats, Error, HostBackend, HostBase, HostMut, HostRef, MemoryKind,
    Pool, PoolClient, PoolSlice,
};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------------
// Helpers.

/// Captures `log` records so tests can read what the pool logged.
struct Capture;

static LOGS: Mutex<Vec<(log::Level, String)>> = Mutex::new(Vec::new());

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        LOGS.lock()
            .unwrap()
            .push((record.level(), format!("{}", record.args())));
    }
    fn flush(&self) {}
}

static CAPTURE: Capture = Capture;

fn capture_logs() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        log::set_logger(&CAPTURE).expect("no other logger in this test binary");
        log::set_max_level(log::LevelFilter::Trace);
    });
}

/// Logged lines that contain `needle` (tests run in parallel: each uses its own pool name).
fn logs_containing(needle: &str) -> Vec<(log::Level, String)> {
    LOGS.lock()
        .unwrap()
        .iter()
        .filter(|(_, line)| line.contains(needle))
        .cloned()
        .collect()
}

/// Host memory under another backend name: a pool on it is not host-accessible, like a device
/// pool, but the test can still run anywhere.
#[derive(Debug, Clone, Default)]
struct DeviceLike(HostBackend);

// SAFETY: every method delegates to `HostBackend`, which upholds the contract.
unsafe impl Backend for DeviceLike {
    type Mut = HostMut;
    type Ref = HostRef;

    fn name(&self) -> &'static str {
        "device-like"
    }
    // Claiming device memory for host memory is the safe direction: nothing above the backend
    // touches it from the host.
    fn memory(&self) -> MemoryKind {
        MemoryKind::Device
    }
    fn allocate(&self, bytes: usize, align: usize) -> Result<Allocation, Error> {
        self.0.allocate(bytes, align)
    }
    unsafe fn deallocate(&self, allocation: &Allocation) -> Result<(), Error> {
        // SAFETY: forwarded from the caller.
        unsafe { self.0.deallocate(allocation) }
    }
    unsafe fn base_mut<'a>(&'a self, allocation: &Allocation) -> HostBase<'a> {
        // SAFETY: forwarded from the caller.
        unsafe { self.0.base_mut(allocation) }
    }
    unsafe fn base_ref<'a>(&'a self, allocation: &Allocation) -> HostBase<'a> {
        // SAFETY: forwarded from the caller.
        unsafe { self.0.base_ref(allocation) }
    }
    fn stats(&self) -> BackendStats {
        self.0.stats()
    }
}

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn handles_are_send_and_sync() {
    assert_send_sync::<Pool>();
    assert_send_sync::<PoolClient>();
    assert_send_sync::<PoolSlice<f32>>();
}

// ---------------------------------------------------------------------------------------------
// The reference model.

const CAP: usize = 256 << 20;
const QUOTAS: [usize; 3] = [usize::MAX, 96 << 20, 160 << 20];

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        client: usize,
        size: usize,
        align: usize,
    },
    Free {
        pick: usize,
        through_pool: bool,
    },
    DoubleFree {
        pick: usize,
    },
    Foreign {
        offset: u64,
    },
    WrongClient {
        pick: usize,
    },
}

/// Sizes from 1 B to 64 MiB, spread evenly over the powers of two; sometimes 0; often one of a
/// few sizes that recur.
fn size_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![
        1 => Just(0usize),
        // Sizes that recur, so that freed blocks are reused whole.
        6 => prop::sample::select(vec![1000usize, 5000, 70_000, 1 << 20, (3 << 20) + 7]),
        20 => (0u32..26, any::<usize>()).prop_map(|(bits, r)| {
            let lo = 1usize << bits;
            lo + r % lo
        }),
    ]
}

/// Mostly valid alignments (0 and powers of two up to 4096), sometimes not.
fn align_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![
        2 => Just(0usize),
        12 => (0u32..=12).prop_map(|b| 1usize << b),
        1 => prop::sample::select(vec![3usize, 6, 768, 8192, 1 << 20, usize::MAX]),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (0usize..3, size_strategy(), align_strategy())
            .prop_map(|(client, size, align)| Op::Alloc { client, size, align }),
        8 => (any::<usize>(), any::<bool>())
            .prop_map(|(pick, through_pool)| Op::Free { pick, through_pool }),
        1 => any::<usize>().prop_map(|pick| Op::DoubleFree { pick }),
        1 => (0u64..(CAP as u64 + (1 << 20))).prop_map(|offset| Op::Foreign { offset }),
        1 => any::<usize>().prop_map(|pick| Op::WrongClient { pick }),
    ]
}

#[derive(Debug, Clone, Copy)]
struct Block {
    reserved: usize,
    size: usize,
    client: usize,
}

#[derive(Debug, Default)]
struct Model {
    base: u64,
    live: BTreeMap<u64, Block>,
    freed: Vec<u64>,
    in_use: [usize; 3],
    requested: [usize; 3],
    allocations: u64,
    frees: u64,
    failures: u64,
    peak: usize,
}

impl Model {
    fn in_use(&self) -> usize {
        self.in_use.iter().sum()
    }

    /// The free runs between live blocks: with coalescing, exactly the pool's free blocks.
    fn gaps(&self) -> Vec<usize> {
        let mut gaps = Vec::new();
        let mut at = self.base;
        for (&addr, block) in &self.live {
            if addr > at {
                gaps.push((addr - at) as usize);
            }
            at = addr + block.reserved as u64;
        }
        let end = self.base + CAP as u64;
        if end > at {
            gaps.push((end - at) as usize);
        }
        gaps
    }

    fn check(&self, pool: &Pool) {
        let gaps = self.gaps();
        let largest = gaps.iter().copied().max().unwrap_or(0);
        let stats = pool.stats();
        let expected = PoolStats {
            capacity: CAP,
            in_use: self.in_use(),
            requested: self.requested.iter().sum(),
            peak: self.peak,
            allocations: self.allocations,
            frees: self.frees,
            failures: self.failures,
            live: self.live.len() as u64,
            free: gaps.iter().sum(),
            pending: 0,
            quarantined: 0,
            largest_free: largest,
            free_blocks: gaps.len(),
            // How many requests a cached block served depends on the order of the frees.
            reused: stats.reused,
            // A classic region: mapped whole, one chunk.
            mapped: CAP,
            peak_mapped: CAP,
            chunk: CAP,
            maps: 0,
            unmaps: 0,
        };
        assert_eq!(stats, expected);
        assert!(stats.reused <= stats.allocations);
        assert_eq!(stats.free, CAP - stats.in_use);
        let fragmentation = if stats.free == 0 {
            0.0
        } else {
            1.0 - largest as f64 / stats.free as f64
        };
        assert_eq!(stats.fragmentation(), fragmentation);
        let clients = pool.client_stats();
        for (i, c) in clients.iter().enumerate() {
            assert_eq!(c.in_use, self.in_use[i], "client {}", c.name);
            assert_eq!(c.requested, self.requested[i], "client {}", c.name);
            assert!(c.in_use <= c.quota);
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
    }
}

fn unchanged<T>(pool: &Pool, f: impl FnOnce() -> T) -> T {
    let before = (pool.stats(), pool.client_stats());
    let out = f();
    assert_eq!(
        (pool.stats(), pool.client_stats()),
        before,
        "a rejected call changed the pool"
    );
    out
}

/// The bytes a request takes, computed independently of the pool: 256-byte granules, then (from
/// 32 granules on) a multiple of 1/32 of the size's power of two.
fn class_rounded(size: usize) -> usize {
    let units = size.max(1).div_ceil(256);
    if units < 32 {
        return units * 256;
    }
    let step = 1usize << (units.ilog2() - 5);
    units.div_ceil(step) * step * 256
}

/// Runs `ops` on a pool and the model side by side. `check_every_op`: compare the statistics
/// after every operation (which merges the reuse cache each time, as [`Pool::stats`] does), or
/// only at the end and where a call fails (so that freed blocks wait in the cache and are
/// reused in between).
fn run_model(ops: &[Op], check_every_op: bool) {
    let pool = Pool::builder(CAP)
        .name("model")
        .log_leaks_on_drop(false)
        .build_host()
        .unwrap();
    let clients = [
        pool.own_client().clone(),
        pool.client("a", QUOTAS[1]),
        pool.client("b", QUOTAS[2]),
    ];
    let names = ["model", "a", "b"];
    let mut m = Model {
        base: pool.base(),
        ..Model::default()
    };
    assert_eq!(pool.base() % 256, 0);
    for op in ops {
        match *op {
            Op::Alloc {
                client,
                size,
                align,
            } => {
                let result = clients[client].allocate(size, align);
                let valid_align = align == 0 || (align.is_power_of_two() && align <= 4096);
                if !valid_align {
                    let Err(Error::InvalidArgument { what }) = &result else {
                        panic!("alignment {align} accepted: {result:?}");
                    };
                    assert!(what.contains(&align.to_string()), "{what}");
                    assert!(what.contains(names[client]), "{what}");
                    m.failures += 1;
                    m.check(&pool);
                    continue;
                }
                let reserved = reserved_bytes(size).unwrap();
                assert_eq!(reserved, class_rounded(size));
                let shown_align = if align == 0 { 256 } else { align };
                let over_quota = m.in_use[client] + reserved > QUOTAS[client];
                match result {
                    Ok(addr) => {
                        assert!(!over_quota, "quota of client {client} not enforced");
                        assert!(addr >= m.base && addr + reserved as u64 <= m.base + CAP as u64);
                        assert_eq!(addr % shown_align.max(256) as u64, 0, "alignment {align}");
                        if let Some((&prev, b)) = m.live.range(..addr).next_back() {
                            assert!(prev + b.reserved as u64 <= addr, "overlaps {prev:#x}");
                        }
                        if let Some((&next, _)) = m.live.range(addr..).next() {
                            assert!(addr + reserved as u64 <= next, "overlaps {next:#x}");
                        }
                        m.live.insert(
                            addr,
                            Block {
                                reserved,
                                size,
                                client,
                            },
                        );
                        m.freed.retain(|&a| a != addr);
                        m.in_use[client] += reserved;
                        m.requested[client] += size;
                        m.allocations += 1;
                        m.peak = m.peak.max(m.in_use());
                    }
                    Err(Error::PoolExhausted {
                        client: who,
                        requested,
                        align: err_align,
                        limit,
                        limit_bytes,
                        in_use,
                        free,
                        largest_free,
                        pending,
                    }) => {
                        let gaps = m.gaps();
                        let largest = gaps.iter().copied().max().unwrap_or(0);
                        assert_eq!(who, names[client]);
                        assert_eq!((requested, err_align), (size, shown_align));
                        assert_eq!(
                            (free, largest_free, pending),
                            (CAP - m.in_use(), largest, 0)
                        );
                        if reserved > CAP {
                            assert_eq!((limit, limit_bytes, in_use), ("capacity", CAP, m.in_use()));
                        } else if over_quota {
                            assert_eq!(
                                (limit, limit_bytes, in_use),
                                ("quota", QUOTAS[client], m.in_use[client])
                            );
                        } else {
                            assert_eq!((limit, limit_bytes, in_use), ("capacity", CAP, m.in_use()));
                            // The pool's promise: a free block of the guaranteed fit is found.
                            let fit = guaranteed_fit(size, align).unwrap();
                            assert!(
                                largest < fit,
                                "failed with a free block of {largest} >= guaranteed fit {fit}"
                            );
                        }
                        m.failures += 1;
                    }
                    Err(other) => panic!("unexpected error {other}"),
                }
            }
            Op::Free { pick, through_pool } => {
                let Some((&addr, &block)) = m.live.iter().nth(pick % m.live.len().max(1)) else {
                    continue;
                };
                if through_pool {
                    pool.deallocate(addr).unwrap();
                } else {
                    clients[block.client].deallocate(addr).unwrap();
                }
                m.live.remove(&addr);
                m.freed.push(addr);
                m.in_use[block.client] -= block.reserved;
                m.requested[block.client] -= block.size;
                m.frees += 1;
            }
            Op::DoubleFree { pick } => {
                let Some(&addr) = m.freed.get(pick % m.freed.len().max(1)) else {
                    continue;
                };
                let err = unchanged(&pool, || pool.deallocate(addr)).unwrap_err();
                assert_eq!(
                    err,
                    Error::UnknownAddress {
                        addr,
                        client: "model".into()
                    }
                );
            }
            Op::Foreign { offset } => {
                let addr = m.base + offset;
                if m.live.contains_key(&addr) {
                    continue;
                }
                let err = unchanged(&pool, || clients[1].deallocate(addr)).unwrap_err();
                assert_eq!(
                    err,
                    Error::UnknownAddress {
                        addr,
                        client: "a".into()
                    }
                );
                assert!(err.to_string().contains(&format!("{addr:#x}")));
            }
            Op::WrongClient { pick } => {
                let Some((&addr, &block)) = m.live.iter().nth(pick % m.live.len().max(1)) else {
                    continue;
                };
                let other = (block.client + 1) % 3;
                let err = unchanged(&pool, || clients[other].deallocate(addr)).unwrap_err();
                let Error::InvalidArgument { what } = &err else {
                    panic!("{err:?}");
                };
                assert!(what.contains(names[other]) && what.contains(names[block.client]));
            }
        }
        if check_every_op {
            m.check(&pool);
        }
    }
    m.check(&pool);
    // Everything back: one free block of the whole capacity.
    for &addr in m.live.keys() {
        pool.deallocate(addr).unwrap();
    }
    let stats = pool.stats();
    assert_eq!((stats.in_use, stats.requested, stats.live), (0, 0, 0));
    assert_eq!((stats.largest_free, stats.free_blocks), (CAP, 1));
    assert_eq!(stats.fragmentation(), 0.0);
    assert_eq!(stats.frees, m.frees + m.live.len() as u64);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn random_sequences_match_the_reference_model(ops in prop::collection::vec(op_strategy(), 1..300)) {
        run_model(&ops, true);
    }

    #[test]
    fn random_sequences_with_reuse_match_the_reference_model(
        ops in prop::collection::vec(op_strategy(), 1..300)
    ) {
        run_model(&ops, false);
    }
}

// ---------------------------------------------------------------------------------------------
// The contract, case by case.

#[test]
fn zero_size_requests_get_unique_freeable_blocks() {
    let pool = Pool::host(4096).unwrap();
    let addrs: Vec<u64> = (0..16).map(|_| pool.allocate(0, 0).unwrap()).collect();
    let mut sorted = addrs.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 16, "zero-size addresses are unique");
    assert!(addrs.iter().all(|&a| a % 256 == 0 && pool.contains(a)));
    let stats = pool.stats();
    assert_eq!((stats.in_use, stats.requested, stats.live), (4096, 0, 16));
    // The pool is full: a zero-size request is a real request.
    assert!(matches!(
        pool.allocate(0, 0),
        Err(Error::PoolExhausted {
            limit: "capacity",
            ..
        })
    ));
    for a in addrs {
        pool.deallocate(a).unwrap();
    }
    assert_eq!(pool.stats().largest_free, 4096);
}

#[test]
fn alignment_zero_means_256_and_bad_alignments_name_the_number() {
    let pool = Pool::builder(1 << 20).name("aligns").build_host().unwrap();
    for align in [0, 1, 2, 64, 256, 512, 1024, 2048, 4096] {
        let a = pool.allocate(100, align).unwrap();
        assert_eq!(a % align.max(256) as u64, 0, "align {align}");
        pool.deallocate(a).unwrap();
    }
    for align in [3usize, 12, 8192, 1 << 30] {
        let err = pool.allocate(100, align).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::InvalidArgument { .. }));
        assert!(
            msg.contains(&align.to_string()) && msg.contains("aligns"),
            "{msg}"
        );
        assert!(msg.contains("4096"), "{msg}");
    }
    let stats = pool.stats();
    assert_eq!((stats.allocations, stats.failures, stats.live), (9, 4, 0));
}

#[test]
fn the_largest_alignment_on_a_fragmented_pool() {
    // Blocks of 256 B everywhere except a few holes: a 4096-aligned request must land on a
    // 4096 boundary with its padding returned to the free lists.
    let pool = Pool::host(64 * 4096).unwrap();
    let small: Vec<u64> = (0..3).map(|_| pool.allocate(256, 0).unwrap()).collect();
    let big = pool.allocate(3 * 4096, 4096).unwrap();
    assert_eq!(big % 4096, 0);
    assert!(big > small[2]);
    // The padding in front of `big` is free and reusable.
    let stats = pool.stats();
    assert_eq!(stats.in_use, 3 * 256 + 3 * 4096);
    assert_eq!(stats.free, 64 * 4096 - stats.in_use);
    assert_eq!(stats.free_blocks, if big == small[2] + 256 { 1 } else { 2 });
    // The padding in front of `big` (where the region's base alignment puts it) is one free
    // block of its own, handed out again to a request of its size.
    let padding = (big - (small[2] + 256)) as usize;
    assert!(padding < 4096);
    let filler = pool.allocate(padding.max(256), 0).unwrap();
    if padding > 0 {
        assert_eq!(filler, small[2] + 256, "the padding is handed out again");
    }
    for a in small.into_iter().chain([big, filler]) {
        pool.deallocate(a).unwrap();
    }
    assert_eq!(pool.stats().free_blocks, 1);
}

#[test]
fn capacity_is_a_hard_cap_and_the_error_names_the_numbers() {
    let pool = Pool::builder(1 << 20).name("cap").build_host().unwrap();
    let model = pool.client("model-a", usize::MAX);
    // 608 KiB is a size class of its own (a multiple of 1/32 of 512 KiB): it takes exactly that.
    let a = model.allocate(608 << 10, 0).unwrap();
    let err = model.allocate(500 << 10, 512).unwrap_err();
    assert_eq!(
        err,
        Error::PoolExhausted {
            client: "model-a".into(),
            requested: 500 << 10,
            align: 512,
            limit: "capacity",
            limit_bytes: 1 << 20,
            in_use: 608 << 10,
            free: 416 << 10,
            largest_free: 416 << 10,
            pending: 0,
        }
    );
    let msg = err.to_string();
    for needle in [
        "model-a", "512000", "1048576", "622592", "425984", "capacity",
    ] {
        assert!(msg.contains(needle), "{needle} missing from: {msg}");
    }
    // Nothing already allocated was disturbed.
    assert_eq!(pool.leak_report().leaks[0].addr, a);
    assert_eq!(pool.stats().in_use, 608 << 10);
    // A request larger than the whole pool.
    let err = pool.allocate(usize::MAX, 0).unwrap_err();
    assert!(matches!(
        err,
        Error::PoolExhausted {
            limit: "capacity",
            requested: usize::MAX,
            ..
        }
    ));
}

#[test]
fn quotas_share_a_pool_and_name_the_client() {
    // Two models sharing one pool, each capped below the pool.
    let pool = Pool::host(4 << 20).unwrap();
    let detector = pool.client("detector", 3 << 20);
    let classifier = pool.client("classifier", 2 << 20);
    let d = detector.allocate(3 << 20, 0).unwrap();
    let err = detector.allocate(1, 0).unwrap_err();
    assert_eq!(
        err,
        Error::PoolExhausted {
            client: "detector".into(),
            requested: 1,
            align: 256,
            limit: "quota",
            limit_bytes: 3 << 20,
            in_use: 3 << 20,
            free: 1 << 20,
            largest_free: 1 << 20,
            pending: 0,
        }
    );
    assert!(err.to_string().contains("its quota"));
    // The other client still gets what the pool has left, but not its whole quota.
    let c = classifier.allocate(1 << 20, 0).unwrap();
    let err = classifier.allocate(256, 0).unwrap_err();
    assert!(
        matches!(err, Error::PoolExhausted { ref client, limit: "capacity", .. } if client == "classifier")
    );
    let stats = detector.stats();
    assert_eq!(
        (stats.in_use, stats.peak, stats.failures, stats.live),
        (3 << 20, 3 << 20, 1, 1)
    );
    assert_eq!(classifier.stats().failures, 1);
    assert_eq!(detector.name(), "detector");
    detector.deallocate(d).unwrap();
    classifier.deallocate(c).unwrap();
    // Clones share the client.
    let clone = detector.clone();
    let x = clone.allocate(1 << 20, 0).unwrap();
    assert_eq!(detector.stats().in_use, 1 << 20);
    detector.deallocate(x).unwrap();
    assert_eq!(pool.client_stats().len(), 3);
}

#[test]
fn capacity_rounds_down_and_tiny_capacities_are_errors() {
    let pool = Pool::host(1000).unwrap();
    assert_eq!(pool.capacity(), 768);
    assert_eq!(pool.stats().largest_free, 768);
    let err = Pool::builder(255).name("tiny").build_host().unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("tiny") && msg.contains("255") && msg.contains("256"),
        "{msg}"
    );
}

#[test]
fn statistics_are_exact_on_a_known_pattern() {
    let pool = Pool::host(8 << 20).unwrap();
    let blocks: Vec<u64> = (0..4)
        .map(|_| pool.allocate((1 << 20) - 100, 0).unwrap())
        .collect();
    pool.deallocate(blocks[0]).unwrap();
    pool.deallocate(blocks[2]).unwrap();
    let s = pool.stats();
    assert_eq!(s.in_use, 2 << 20);
    assert_eq!(s.requested, 2 * ((1 << 20) - 100));
    assert_eq!(s.rounding_overhead(), 200);
    assert_eq!(s.peak, 4 << 20);
    assert_eq!((s.allocations, s.frees, s.live), (4, 2, 2));
    // Free: hole 0 (1 MiB), hole 2 (1 MiB), tail (4 MiB).
    assert_eq!(
        (s.free, s.free_blocks, s.largest_free),
        (6 << 20, 3, 4 << 20)
    );
    assert!((s.fragmentation() - (1.0 - 4.0 / 6.0)).abs() < 1e-12);
    let text = s.to_string();
    assert!(text.contains("2097152 of 8388608 bytes in use"), "{text}");
    // Freeing the middle block joins everything back.
    pool.deallocate(blocks[1]).unwrap();
    pool.deallocate(blocks[3]).unwrap();
    let s = pool.stats();
    assert_eq!(
        (s.free_blocks, s.largest_free, s.peak),
        (1, 8 << 20, 4 << 20)
    );
}

#[test]
fn double_free_and_foreign_addresses_change_nothing() {
    let pool = Pool::builder(1 << 20).name("strict").build_host().unwrap();
    let a = pool.allocate(1000, 0).unwrap();
    let b = pool.allocate(1000, 0).unwrap();
    pool.deallocate(a).unwrap();
    for addr in [a, b + 256, b + 1, 0, u64::MAX, pool.base() + (1 << 20)] {
        let err = unchanged(&pool, || pool.deallocate(addr)).unwrap_err();
        assert_eq!(
            err,
            Error::UnknownAddress {
                addr,
                client: "strict".into()
            }
        );
    }
    pool.deallocate(b).unwrap();
}

#[test]
fn pools_beyond_four_gib() {
    // 6 GiB of address space; the memory comes from `calloc` and is never touched here.
    let pool = match Pool::host(6 << 30) {
        Ok(pool) => pool,
        Err(Error::OutOfMemory { .. }) => {
            println!("skipped: the host refused 6 GiB of address space");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let big = pool.allocate(5 << 30, 0).unwrap();
    // 992 MiB and 32 MiB are size classes: they take exactly that.
    let rest = pool.allocate((1 << 30) - (1 << 25), 0).unwrap();
    assert_eq!((big, rest), (pool.base(), pool.base() + (5 << 30)));
    let s = pool.stats();
    assert_eq!(
        (s.in_use, s.free, s.largest_free),
        ((6 << 30) - (1 << 25), 1 << 25, 1 << 25)
    );
    let last = pool.allocate(1 << 25, 0).unwrap();
    assert_eq!(last, pool.base() + (6 << 30) - (1 << 25));
    assert!(pool.allocate(1, 0).is_err());
    pool.deallocate(big).unwrap();
    assert_eq!(pool.stats().largest_free, 5 << 30);
    pool.deallocate(last).unwrap();
    pool.deallocate(rest).unwrap();
    assert_eq!(pool.stats().largest_free, 6 << 30);
}

#[test]
fn the_region_is_one_allocation_freed_when_the_last_handle_goes() {
    let backend = DeviceLike::default();
    let pool = Pool::new_in(backend.clone(), 1 << 20).unwrap();
    assert_eq!(pool.backend_name(), "device-like");
    assert!(!pool.is_host());
    let client = pool.client("late", usize::MAX);
    let addrs: Vec<u64> = (0..100)
        .map(|_| client.allocate(1000, 0).unwrap())
        .collect();
    assert_eq!(backend.stats().allocations, 1, "one region, sub-allocated");
    drop(pool);
    assert_eq!(backend.stats().frees, 0, "a client keeps the region alive");
    for a in addrs {
        client.deallocate(a).unwrap();
    }
    drop(client);
    let s = backend.stats();
    assert_eq!((s.allocations, s.frees, s.live_bytes), (1, 1, 0));
}

// ---------------------------------------------------------------------------------------------
// Typed slices.

#[test]
fn slices_free_on_drop_and_read_back_on_a_host_pool() {
    let pool = Pool::host(1 << 20).unwrap();
    let client = pool.client("slices", usize::MAX);
    let mut a = client.alloc_slice::<f64>(1000).unwrap();
    assert_eq!((a.len(), a.num_bytes(), a.addr() % 256), (1000, 8000, 0));
    a.as_mut_slice()
        .unwrap()
        .iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x = i as f64 * 0.5);
    assert_eq!(a.as_slice().unwrap()[999], 499.5);
    // Only the slice frees its block.
    let err = unchanged(&pool, || pool.deallocate(a.addr())).unwrap_err();
    assert!(err.to_string().contains("PoolSlice"), "{err}");
    let empty = pool.alloc_slice::<u32>(0).unwrap();
    assert!(empty.is_empty() && empty.as_slice().unwrap().is_empty());
    assert_eq!(pool.stats().live, 2);
    drop(empty);
    a.free().unwrap();
    assert_eq!(pool.stats().live, 0);
    assert_eq!(client.stats().frees, 1);
    let err = pool.alloc_slice::<u64>(usize::MAX / 4).unwrap_err();
    assert!(err.to_string().contains("overflows"), "{err}");
}

#[test]
fn slices_of_a_device_pool_are_not_host_memory() {
    let pool = Pool::new_in(DeviceLike::default(), 1 << 20).unwrap();
    let mut s = pool.alloc_slice::<u8>(64).unwrap();
    let err = s.as_mut_slice().unwrap_err();
    assert!(err.to_string().contains("device-like"), "{err}");
    assert!(s.as_slice().is_err());
}

// ---------------------------------------------------------------------------------------------
// Threads.

#[test]
fn threads_share_a_pool_without_overlap() {
    // Under Miri (`scripts/miri.sh`), which checks every access to the blocks' bytes for a
    // data race, fewer and smaller steps.
    let (steps, sizes) = if cfg!(miri) {
        (60, 2000)
    } else {
        (3000, 20_000)
    };
    let pool = Pool::host(16 << 20).unwrap();
    let shared = pool.client("shared", 2 << 20);
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let own = pool.client(&format!("thread-{t}"), 3 << 20);
            let shared = shared.clone();
            s.spawn(move || {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ t as u64;
                let mut live: Vec<(PoolSlice<u8>, u8)> = Vec::new();
                for step in 0..steps {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let size = 1 + (x % sizes) as usize;
                    let client = if x % 3 == 0 { &shared } else { &own };
                    if live.len() < 40 && x % 5 != 0 {
                        if let Ok(mut slice) = client.alloc_slice::<u8>(size) {
                            let tag = t.wrapping_mul(61).wrapping_add(step as u8);
                            slice.as_mut_slice().unwrap().fill(tag);
                            live.push((slice, tag));
                        }
                    } else if !live.is_empty() {
                        let (slice, tag) = live.swap_remove((x >> 32) as usize % live.len());
                        // Nobody else wrote into this block while it was ours.
                        assert!(slice.as_slice().unwrap().iter().all(|&b| b == tag));
                        drop(slice);
                    }
                }
                for (slice, tag) in live {
                    assert!(slice.as_slice().unwrap().iter().all(|&b| b == tag));
                }
                let stats = own.stats();
                assert!(stats.peak <= 3 << 20 && stats.in_use == 0);
            });
        }
    });
    let s = pool.stats();
    assert_eq!(
        (s.in_use, s.live, s.largest_free, s.free_blocks),
        (0, 0, 16 << 20, 1)
    );
    assert_eq!(s.allocations, s.frees);
    let shared_stats = shared.stats();
    assert!(shared_stats.peak <= 2 << 20 && shared_stats.allocations > 0);
}

// ---------------------------------------------------------------------------------------------
// Tracking, leak reports, the event log.

#[inline(never)]
fn allocate_weights(client: &PoolClient) -> u64 {
    client
        .allocate_with(AllocRequest::new(1000, 0).tag("weights"))
        .unwrap()
}

#[test]
fn leak_report_names_clients_tags_and_backtraces() {
    capture_logs();
    let pool = Pool::builder(1 << 20)
        .name("leaky")
        .tracking(Tracking::Backtraces)
        .build_host()
        .unwrap();
    let loader = pool.client("loader", usize::MAX);
    let a = allocate_weights(&loader);
    pool.set_tracking(Tracking::Tags);
    let b = pool
        .allocate_with(AllocRequest::new(300, 512).tag("scratch"))
        .unwrap();
    pool.set_tracking(Tracking::Off);
    assert_eq!(pool.tracking(), Tracking::Off);
    let c = pool
        .allocate_with(AllocRequest::new(1, 0).tag("ignored"))
        .unwrap();

    let report = pool.leak_report();
    assert_eq!(report.pool, "leaky");
    assert_eq!(report.leaks.len(), 3);
    let by_addr = |addr| report.leaks.iter().find(|l| l.addr == addr).unwrap();
    let (la, lb, lc) = (by_addr(a), by_addr(b), by_addr(c));
    assert_eq!(
        (la.client.as_str(), la.tag.as_deref()),
        ("loader", Some("weights"))
    );
    assert_eq!((la.size, la.reserved, la.serial), (1000, 1024, 1));
    let trace = la
        .backtrace
        .as_deref()
        .expect("a backtrace in Backtraces mode");
    assert!(trace.contains("allocate_weights"), "{trace}");
    assert_eq!(
        (lb.client.as_str(), lb.tag.as_deref()),
        ("leaky", Some("scratch"))
    );
    assert!(lb.backtrace.is_none() && lb.age.is_some());
    assert_eq!((lc.tag.as_deref(), lc.age, lc.serial), (None, None, 3));
    assert_eq!(
        (report.reserved_bytes(), report.requested_bytes()),
        (1024 + 512 + 256, 1301)
    );
    let text = report.to_string();
    assert!(
        text.starts_with(
            "pool `leaky`: 3 live allocation(s), 1792 bytes reserved (1301 requested)"
        ),
        "{text}"
    );
    for needle in ["loader", "weights", "scratch", &format!("{a:#x}")] {
        assert!(text.contains(needle), "{needle} missing from:\n{text}");
    }
    loader.deallocate(a).unwrap();
    drop(loader);
    // Dropping the pool with live allocations logs the report.
    drop(pool);
    let logged = logs_containing("pool `leaky`");
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_eq!(logged[0].0, log::Level::Warn);
    assert!(logged[0].1.contains("2 live allocation(s)") && logged[0].1.contains("scratch"));
}

#[test]
fn a_clean_pool_logs_no_leaks() {
    capture_logs();
    let pool = Pool::builder(1 << 20)
        .name("clean-pool")
        .build_host()
        .unwrap();
    let a = pool.allocate(10, 0).unwrap();
    pool.deallocate(a).unwrap();
    assert!(pool.leak_report().is_empty());
    drop(pool);
    assert!(logs_containing("clean-pool").is_empty());
}

type Seen = (
    PoolAction,
    u64,
    usize,
    usize,
    String,
    Option<String>,
    Option<String>,
);

#[test]
fn the_event_log_reaches_a_callback_in_order() {
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let sink = {
        let seen = seen.clone();
        move |e: &PoolEvent<'_>| {
            assert_eq!(e.pool, "events");
            seen.lock().unwrap().push((
                e.action,
                e.addr,
                e.size,
                e.reserved,
                e.client.to_string(),
                e.tag.map(str::to_string),
                e.error.map(|err| err.to_string()),
            ))
        }
    };
    let pool = Pool::builder(1 << 20)
        .name("events")
        .tracking(Tracking::Tags)
        .events(Arc::new(sink))
        .build_host()
        .unwrap();
    let c = pool.client("cam", 4096);
    let a = c
        .allocate_with(AllocRequest::new(1000, 0).tag("frame"))
        .unwrap();
    pool.deallocate(a).unwrap();
    let _ = c.allocate(8192, 0).unwrap_err();
    let _ = c.allocate(10, 3).unwrap_err();
    pool.set_events(None);
    let b = c.allocate(10, 0).unwrap();
    c.deallocate(b).unwrap();

    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert_eq!(
        seen[0],
        (
            PoolAction::Allocate,
            a,
            1000,
            1024,
            "cam".into(),
            Some("frame".into()),
            None
        )
    );
    assert_eq!(
        seen[1],
        (
            PoolAction::Free,
            a,
            1000,
            1024,
            "cam".into(),
            Some("frame".into()),
            None
        )
    );
    assert_eq!(
        (seen[2].0, seen[2].1, seen[2].2),
        (PoolAction::AllocateFailure, 0, 8192)
    );
    assert!(seen[2].6.as_deref().unwrap().contains("quota of 4096"));
    assert!(seen[3].6.as_deref().unwrap().contains("alignment 3"));
}

/// What the tracking test keeps of each event: action, address, tag.
type Tagged = (PoolAction, u64, Option<String>);

#[test]
fn tracking_switched_between_allocation_and_free_keeps_each_record() {
    // Allocations made with tracking on and off, freed after it was switched the other way,
    // with the block of a tracked allocation reused by an untracked one: each event and the
    // leak report show what was recorded when that allocation was made, and nothing of the
    // allocation that held its block before.
    let seen: Arc<Mutex<Vec<Tagged>>> = Arc::default();
    let sink = {
        let seen = seen.clone();
        move |e: &PoolEvent<'_>| {
            seen.lock()
                .unwrap()
                .push((e.action, e.addr, e.tag.map(str::to_string)))
        }
    };
    let pool = Pool::builder(1 << 20)
        .tracking(Tracking::Tags)
        .events(Arc::new(sink))
        .build_host()
        .unwrap();
    let a = pool
        .allocate_with(AllocRequest::new(4096, 0).tag("a"))
        .unwrap();
    pool.set_tracking(Tracking::Off);
    let b = pool
        .allocate_with(AllocRequest::new(512, 0).tag("b"))
        .unwrap();
    pool.deallocate(a).unwrap();
    // The same size again: the block `a` had (the region's first).
    let c = pool.allocate(4096, 0).unwrap();
    assert_eq!(c, a);
    pool.set_tracking(Tracking::Tags);
    pool.deallocate(b).unwrap();
    let d = pool
        .allocate_with(AllocRequest::new(100, 0).tag("d"))
        .unwrap();

    let report = pool.leak_report();
    let tags: Vec<_> = report
        .leaks
        .iter()
        .map(|l| (l.addr, l.tag.clone(), l.age.is_some()))
        .collect();
    let mut expected = vec![(c, None, false), (d, Some("d".to_string()), true)];
    expected.sort();
    assert_eq!(tags, expected);
    let stats = pool.stats();
    assert_eq!(
        (stats.live, stats.in_use, stats.requested),
        (2, 4096 + 256, 4196)
    );
    assert_eq!(
        *seen.lock().unwrap(),
        vec![
            (PoolAction::Allocate, a, Some("a".to_string())),
            (PoolAction::Allocate, b, None),
            (PoolAction::Free, a, Some("a".to_string())),
            (PoolAction::Allocate, c, None),
            (PoolAction::Free, b, None),
            (PoolAction::Allocate, d, Some("d".to_string())),
        ]
    );
    pool.deallocate(c).unwrap();
    pool.deallocate(d).unwrap();
    assert!(pool.leak_report().is_empty());
}

/// Splits `HH:MM:SS.ffffff` and checks its ranges.
fn check_time(field: &str) {
    let (hms, micros) = field.split_once('.').expect("a fraction");
    assert_eq!(micros.len(), 6, "{field}");
    let parts: Vec<u32> = hms.split(':').map(|p| p.parse().unwrap()).collect();
    assert_eq!(parts.len(), 3, "{field}");
    assert!(parts[0] < 24 && parts[1] < 60 && parts[2] < 60, "{field}");
    micros.parse::<u32>().unwrap();
}

#[test]
fn the_csv_log_uses_rmm_replay_columns() {
    let csv = Arc::new(CsvEventLog::new(Vec::new()).unwrap());
    let home = StreamId(0x7f00_1234);
    let streams = Arc::new(ManualStreams::new());
    let pool = Pool::builder(1 << 20)
        .events(csv.clone())
        .streams(streams, home)
        .build_host()
        .unwrap();
    let a = pool.allocate(1000, 0).unwrap();
    let b = pool.allocate_on(77, 0, StreamId(0x42)).unwrap();
    pool.deallocate(a).unwrap();
    pool.deallocate_on(b, StreamId(0x42)).unwrap();
    let _ = pool.allocate(2 << 20, 0).unwrap_err();
    drop(pool);
    let text = String::from_utf8(Arc::try_unwrap(csv).unwrap().into_inner().unwrap()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], CSV_HEADER);
    assert_eq!(CSV_HEADER, "Thread,Time,Action,Pointer,Size,Stream");
    let rows: Vec<Vec<&str>> = lines[1..].iter().map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 5);
    let expect = [
        ("allocate", a, 1000, home.0),
        ("allocate", b, 77, 0x42),
        ("free", a, 1000, home.0),
        ("free", b, 77, 0x42),
        ("allocate failure", 0, 2 << 20, home.0),
    ];
    for (row, (action, addr, size, stream)) in rows.iter().zip(expect) {
        assert_eq!(row.len(), 6, "{row:?}");
        row[0].parse::<u64>().expect("a thread number");
        assert_eq!(row[0], rows[0][0], "one thread");
        check_time(row[1]);
        assert_eq!(row[2], action);
        assert_eq!(
            u64::from_str_radix(row[3].trim_start_matches("0x"), 16).unwrap(),
            addr
        );
        assert_eq!(row[4].parse::<usize>().unwrap(), size);
        assert_eq!(row[5], format!("{stream:#x}"));
    }
}

/// Runs `f` on a thread of its own; fails the test when it has not returned within 20 s
/// (a deadlock), rather than hanging the run.
fn returns_in_time<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    });
    match rx.recv_timeout(std::time::Duration::from_secs(20)) {
        Ok(Ok(value)) => value,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("{what}: no return within 20 s (a deadlock)"),
    }
}

/// The rows of a CSV log: action, address, size.
fn csv_rows(text: &str) -> Vec<(String, u64, usize)> {
    text.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let addr = u64::from_str_radix(f[3].trim_start_matches("0x"), 16).unwrap();
            (f[2].to_string(), addr, f[4].parse().unwrap())
        })
        .collect()
}

/// The closure that `with_writer` lends the CSV log's writer to may use the pool that logs
/// there: the rows of what it did are written once it returns, in order. (Before, the pool's
/// delivery of the event waited for the log's lock, which the same thread held: the call never
/// returned.)
/// A `with_writer` closure that panics after using the pool: the panic comes back to the
/// caller, and the rows deferred while the closure held the writer are written as the writer
/// is released, as on return (before, they waited for the log's next use).
#[test]
fn a_panicking_with_writer_closure_writes_the_rows_it_deferred() {
    /// A writer whose bytes the test reads without the log.
    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let out = Arc::new(Mutex::new(Vec::new()));
    let csv = Arc::new(CsvEventLog::new(Shared(out.clone())).unwrap());
    let pool = Pool::builder(1 << 20)
        .events(csv.clone())
        .build_host()
        .unwrap();
    let mut b = 0;
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        csv.with_writer(|_| {
            b = pool.allocate(2000, 0).unwrap();
            pool.deallocate(b).unwrap();
            panic!("the closure fails");
        })
    }));
    let payload = panicked.unwrap_err();
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"the closure fails"));
    let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
    let rows = csv_rows(&text);
    assert_eq!(rows.len(), 2, "{text}");
    assert_eq!((rows[0].0.as_str(), rows[0].1), ("allocate", b), "{text}");
    assert_eq!((rows[1].0.as_str(), rows[1].1), ("free", b), "{text}");
}

#[test]
fn the_csv_logs_writer_closure_may_use_the_pool_it_logs() {
    let text = returns_in_time("a pool call inside with_writer", || {
        let csv = Arc::new(CsvEventLog::new(Vec::new()).unwrap());
        let pool = Pool::builder(1 << 20)
            .events(csv.clone())
            .build_host()
            .unwrap();
        let a = pool.allocate(1000, 0).unwrap();
        let (b, written) = csv
            .with_writer(|w| {
                let b = pool.allocate(2000, 0).unwrap();
                pool.deallocate(b).unwrap();
                // Nested calls that need the writer: refused, not a deadlock.
                let nested = csv.with_writer(|_| ()).unwrap_err();
                assert_eq!(nested.kind(), std::io::ErrorKind::Deadlock);
                assert_eq!(
                    csv.flush().unwrap_err().kind(),
                    std::io::ErrorKind::Deadlock
                );
                (b, w.len())
            })
            .unwrap();
        // Inside the closure the writer held the header and the first row only.
        assert_eq!(
            csv_rows(
                &String::from_utf8(csv.with_writer(|w| w[..written].to_vec()).unwrap()).unwrap()
            )
            .len(),
            1
        );
        pool.deallocate(a).unwrap();
        csv.flush().unwrap();
        let text = csv
            .with_writer(|w| String::from_utf8(w.clone()).unwrap())
            .unwrap();
        (text, a, b)
    });
    let (text, a, b) = text;
    let rows = csv_rows(&text);
    let expect = [
        ("allocate", a, 1000),
        ("allocate", b, 2000),
        ("free", b, 2000),
        ("free", a, 1000),
    ];
    assert_eq!(rows.len(), expect.len(), "{text}");
    for (row, (action, addr, size)) in rows.iter().zip(expect) {
        assert_eq!(
            (row.0.as_str(), row.1, row.2),
            (action, addr, size),
            "{text}"
        );
    }
}

/// A CSV log's writer that uses a second pool logging to the same log while it writes: a
/// block of 300 bytes allocated and freed at every `every`-th row it writes, `uses` times.
struct PoolUsingWriter {
    out: Arc<Mutex<Vec<u8>>>,
    /// Weak: the pool logs here, so a strong reference would make a cycle that keeps the
    /// pools and the log alive after the test (LeakSanitizer reports it).
    other: std::sync::Weak<std::sync::OnceLock<Pool>>,
    uses: usize,
    every: usize,
    rows: usize,
}

impl std::io::Write for PoolUsingWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.contains(&b'\n') {
            self.rows += 1;
            if self.uses > 0 && self.rows % self.every == 0 {
                // (Gone once the test dropped the second pool: nothing left to use.)
                if let Some(other) = self.other.upgrade() {
                    self.uses -= 1;
                    let pool = other.get().unwrap();
                    pool.deallocate(pool.allocate(300, 0).unwrap()).unwrap();
                }
            }
        }
        self.out.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Two pools of `capacity` bytes logging to one CSV log whose writer uses the second; the
/// writer's output.
#[allow(clippy::type_complexity)]
fn two_pools_on_one_log(
    capacity: usize,
) -> (
    Arc<CsvEventLog<PoolUsingWriter>>,
    Pool,
    Arc<std::sync::OnceLock<Pool>>,
    Arc<Mutex<Vec<u8>>>,
) {
    let out = Arc::new(Mutex::new(Vec::new()));
    let other = Arc::new(std::sync::OnceLock::new());
    let csv = Arc::new(
        CsvEventLog::new(PoolUsingWriter {
            out: out.clone(),
            other: Arc::downgrade(&other),
            uses: 0,
            every: 1,
            rows: 0,
        })
        .unwrap(),
    );
    let first = Pool::builder(capacity)
        .name("first")
        .events(csv.clone())
        .build_host()
        .unwrap();
    let _ = other.set(
        Pool::builder(capacity)
            .name("second")
            .events(csv.clone())
            .build_host()
            .unwrap(),
    );
    (csv, first, other, out)
}

/// A writer that uses a pool logging to the same CSV log (two pools share the log; the first
/// one's event is being written when the writer allocates from the second): the second pool's
/// rows follow. (Before, the second pool's delivery waited for the log's lock, which the same
/// thread held.)
#[test]
fn the_csv_logs_writer_may_use_a_pool_that_logs_there_too() {
    let (text, a) = returns_in_time("a pool call inside the CSV log's writer", || {
        let (csv, first, _other, out) = two_pools_on_one_log(1 << 20);
        csv.with_writer(|w| w.uses = 1).unwrap();
        let a = first.allocate(1000, 0).unwrap();
        first.deallocate(a).unwrap();
        csv.flush().unwrap();
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        (text, a)
    });
    let rows = csv_rows(&text);
    let actions: Vec<(&str, usize)> = rows.iter().map(|r| (r.0.as_str(), r.2)).collect();
    assert_eq!(
        actions,
        [
            ("allocate", 1000),
            ("allocate", 300),
            ("free", 300),
            ("free", 1000)
        ],
        "{text}"
    );
    assert_eq!((rows[0].1, rows[3].1), (a, a));
}

/// A `with_writer` closure that waits for another thread using the pool: that thread's rows
/// wait for the closure rather than the thread for the writer. (Before, the other thread waited
/// for the log's lock and the closure for the thread, for ever.)
#[test]
fn the_csv_logs_writer_closure_may_wait_for_a_thread_that_uses_the_pool() {
    let (text, addr) = returns_in_time("a with_writer closure waiting for a thread", || {
        let csv = Arc::new(CsvEventLog::new(Vec::new()).unwrap());
        let pool = Pool::builder(1 << 20)
            .events(csv.clone())
            .build_host()
            .unwrap();
        let addr = csv
            .with_writer(|_| {
                std::thread::scope(|s| {
                    s.spawn(|| {
                        let a = pool.allocate(100, 0).unwrap();
                        pool.deallocate(a).unwrap();
                        a
                    })
                    .join()
                    .unwrap()
                })
            })
            .unwrap();
        let text = csv
            .with_writer(|w| String::from_utf8(w.clone()).unwrap())
            .unwrap();
        (text, addr)
    });
    let rows = csv_rows(&text);
    assert_eq!(
        rows,
        [
            ("allocate".to_string(), addr, 100),
            ("free".to_string(), addr, 100)
        ],
        "{text}"
    );
}

/// A writer that uses a pool logging to the same log for the rows it writes, twice in a row:
/// the rows that writing deferred rows defers are written too, before the call returns, so a
/// log dropped without `into_inner` has them all.
#[test]
fn rows_a_writer_causes_while_writing_deferred_rows_are_written() {
    let (text, events) = returns_in_time("a writer using a pool that logs there", || {
        let (csv, first, other, out) = two_pools_on_one_log(1 << 20);
        csv.with_writer(|w| w.uses = 2).unwrap();
        first.allocate(1000, 0).unwrap();
        let s = other.get().unwrap().stats();
        let events = 1 + s.allocations + s.frees;
        drop(first);
        drop(csv);
        drop(other);
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        (text, events)
    });
    assert_eq!(events, 5);
    let rows = csv_rows(&text);
    let sizes: Vec<usize> = rows.iter().map(|r| r.2).collect();
    assert_eq!(sizes, [1000, 300, 300, 300, 300], "{text}");
}

/// Two pools logging to one CSV log from three threads, a fourth thread that uses both pools
/// inside `with_writer` closures and flushes, and a writer that now and then uses one of the
/// pools itself: no call waits for ever, and replayed pool by pool the log has every row, each
/// allocation at an address that is free, each free of a live one.
#[test]
fn the_csv_log_under_threads_keeps_every_row_in_order() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

    let (text, pools) = returns_in_time("threads sharing a CSV log", || {
        let (csv, first, other, out) = two_pools_on_one_log(4 << 20);
        csv.with_writer(|w| (w.uses, w.every) = (usize::MAX, 97))
            .unwrap();
        let pools = [&first, other.get().unwrap()];
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..3u64)
                .map(|t| {
                    s.spawn(move || {
                        let mut x = t + 1;
                        let mut mine: Vec<(u64, usize)> = Vec::new();
                        for _ in 0..20_000 {
                            x = x
                                .wrapping_mul(6364136223846793005)
                                .wrapping_add(1442695040888963407);
                            let which = (x >> 63) as usize;
                            if mine.len() < 20 && (x >> 40) & 1 == 0 {
                                let size = 256 + (x >> 20) as usize % 4000;
                                if let Ok(a) = pools[which].allocate(size, 0) {
                                    mine.push((a, which));
                                }
                            } else if let Some((a, which)) = mine.pop() {
                                pools[which].deallocate(a).unwrap();
                            }
                        }
                        for (a, which) in mine {
                            pools[which].deallocate(a).unwrap();
                        }
                    })
                })
                .collect();
            s.spawn(|| {
                while !stop.load(Relaxed) {
                    csv.with_writer(|w| {
                        let a = pools[0].allocate(1000, 0).unwrap();
                        let b = pools[1].allocate(700, 0).unwrap();
                        pools[0].deallocate(a).unwrap();
                        pools[1].deallocate(b).unwrap();
                        w.rows
                    })
                    .unwrap();
                    csv.flush().unwrap();
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
            });
            for w in workers {
                w.join().unwrap();
            }
            stop.store(true, Relaxed);
        });
        csv.with_writer(|w| w.uses = 0).unwrap();
        csv.flush().unwrap();
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        let pools = pools.map(|p| (p.base(), p.capacity(), p.stats()));
        (text, pools)
    });
    let mut live: [BTreeMap<u64, usize>; 2] = [BTreeMap::new(), BTreeMap::new()];
    let mut counts = [(0u64, 0u64); 2];
    for (row, (action, addr, size)) in csv_rows(&text).into_iter().enumerate() {
        let k = pools
            .iter()
            .position(|(base, cap, _)| addr >= *base && addr < base + *cap as u64)
            .unwrap();
        match action.as_str() {
            "allocate" => {
                assert!(
                    live[k].insert(addr, size).is_none(),
                    "row {row}: {addr:#x} allocated twice"
                );
                counts[k].0 += 1;
            }
            "free" => {
                assert_eq!(
                    live[k].remove(&addr),
                    Some(size),
                    "row {row}: {addr:#x} not live"
                );
                counts[k].1 += 1;
            }
            other => panic!("row {row}: {other}"),
        }
    }
    for k in 0..2 {
        assert!(live[k].is_empty(), "pool {k}: {:?}", live[k]);
        assert_eq!(
            counts[k],
            (pools[k].2.allocations, pools[k].2.frees),
            "pool {k}: rows lost"
        );
    }
}

#[test]
fn the_csv_log_writes_a_file() {
    let path = std::env::temp_dir().join(format!("devarena-pool-{}.csv", std::process::id()));
    let csv = Arc::new(CsvEventLog::create(&path).unwrap());
    let pool = Pool::builder(1 << 20)
        .events(csv.clone())
        .build_host()
        .unwrap();
    let a = pool.allocate(5, 0).unwrap();
    pool.deallocate(a).unwrap();
    csv.flush().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(text.lines().count(), 3, "{text}");
    assert!(
        text.lines()
            .nth(2)
            .unwrap()
            .contains(&format!(",free,{a:#x},5,0x0"))
    );
}

#[test]
fn log_events_reach_the_log_facade() {
    capture_logs();
    let pool = Pool::builder(1 << 20)
        .name("logged-pool")
        .events(Arc::new(LogEvents))
        .build_host()
        .unwrap();
    let a = pool.allocate(100, 0).unwrap();
    pool.deallocate(a).unwrap();
    let _ = pool.allocate(4 << 20, 0).unwrap_err();
    let logged = logs_containing("pool `logged-pool`");
    assert_eq!(logged.len(), 3, "{logged:?}");
    assert_eq!(logged[0].0, log::Level::Debug);
    assert!(logged[0].1.contains("allocate") && logged[0].1.contains(&format!("{a:#x}")));
    assert!(logged[1].1.contains("free"));
    assert_eq!(logged[2].0, log::Level::Warn);
    assert!(logged[2].1.contains("allocate failure") && logged[2].1.contains("capacity"));
}

// ---------------------------------------------------------------------------------------------
// Stream ordering, with a host stand-in whose events complete when the test says so.

const HOME: StreamId = StreamId(1);
const OTHER: StreamId = StreamId(2);
const THIRD: StreamId = StreamId(3);

/// A pool on its own index alone: these tests are about how the index orders streams (events,
/// parked blocks, waits). With thread heaps (the default) a thread's requests on another
/// stream go to a heap of that stream instead, tested in `pool_threads.rs`.
fn stream_pool(capacity: usize) -> (Pool, Arc<ManualStreams>) {
    let streams = Arc::new(ManualStreams::new());
    let pool = Pool::builder(capacity)
        .name("streams")
        .thread_heaps(0)
        .streams(streams.clone(), HOME)
        .build_host()
        .unwrap();
    (pool, streams)
}

/// A pool of memory a device reaches, dropped after blocks were freed on another stream,
/// waits for that stream, and for its home stream, before its region goes back: work queued
/// there may still use them (a classic CUDA region's `cuMemFree` waits for the home stream of
/// its backend only, which need not be the runtime's). Whether the free
/// parked the block behind an event (the pool's index) or went to the stream's thread heap,
/// which takes no event. A host pool waits for nothing.
#[test]
fn a_device_pool_dropped_after_frees_on_another_stream_waits_for_it() {
    for heaps in [false, true] {
        for slice in [false, true] {
            let streams = Arc::new(ManualStreams::new());
            let mut builder = Pool::builder(1 << 20)
                .log_leaks_on_drop(false)
                .streams(streams.clone(), HOME);
            if !heaps {
                builder = builder.thread_heaps(0);
            }
            let pool = builder.build_in(DeviceLike::default()).unwrap();
            if slice {
                drop(
                    pool.own_client()
                        .alloc_slice_on::<u32>(1024, OTHER)
                        .unwrap(),
                );
            } else {
                let a = pool.allocate_on(4096, 0, OTHER).unwrap();
                pool.deallocate_on(a, OTHER).unwrap();
            }
            let home = pool.allocate(4096, 0).unwrap();
            pool.deallocate(home).unwrap();
            assert_eq!(
                (pool.thread_heaps() > 0, pool.stats().pending),
                (heaps, if heaps { 0 } else { 4096 }),
                "heaps {heaps}"
            );
            assert!(streams.synchronized().is_empty());
            drop(pool);
            let mut waited = streams.synchronized();
            waited.sort_unstable();
            let mut want = [HOME, OTHER];
            want.sort_unstable();
            assert_eq!(waited, want, "heaps {heaps} slice {slice}");
        }
    }
    let (pool, streams) = stream_pool(1 << 20);
    let a = pool.allocate_on(4096, 0, OTHER).unwrap();
    pool.deallocate_on(a, OTHER).unwrap();
    drop(pool);
    assert!(streams.synchronized().is_empty(), "host memory");
}

#[test]
fn a_block_freed_on_the_home_stream_is_reused_at_once() {
    let (pool, streams) = stream_pool(4096);
    assert_eq!(pool.home_stream(), HOME);
    let a = pool.allocate(4096, 0).unwrap();
    pool.deallocate_on(a, HOME).unwrap();
    assert_eq!(pool.allocate(4096, 0).unwrap(), a);
    assert_eq!(streams.pending(HOME), 0, "no event needed");
    assert!(streams.waits().is_empty());
}

#[test]
fn a_block_freed_on_another_stream_waits_for_its_event() {
    let (pool, streams) = stream_pool(8192);
    let a = pool.allocate_on(8192, 0, OTHER).unwrap();
    pool.deallocate_on(a, OTHER).unwrap();
    assert_eq!(streams.pending(OTHER), 1);
    let s = pool.stats();
    assert_eq!(
        (s.in_use, s.pending, s.free, s.live, s.frees),
        (0, 8192, 0, 0, 1)
    );
    // Not reusable yet, on any stream; the error says why.
    let err = pool.allocate(256, 0).unwrap_err();
    assert!(matches!(err, Error::PoolExhausted { pending: 8192, .. }));
    assert!(
        err.to_string()
            .contains("8192 bytes freed and waiting for stream events"),
        "{err}"
    );
    assert!(pool.allocate_on(256, 0, OTHER).is_err());
    assert_eq!(pool.reclaim().unwrap(), 0);
    // The event completes: the next allocation takes the block back.
    streams.complete(OTHER);
    assert_eq!(pool.allocate(8192, 0).unwrap(), a);
    assert_eq!(pool.stats().pending, 0);
}

#[test]
fn parked_blocks_come_back_in_stream_order_and_by_reclaim() {
    let (pool, streams) = stream_pool(1 << 20);
    let a = pool.allocate(1024, 0).unwrap();
    let b = pool.allocate(2048, 0).unwrap();
    let c = pool.allocate(4096, 0).unwrap();
    pool.deallocate_on(a, OTHER).unwrap();
    pool.deallocate_on(b, THIRD).unwrap();
    pool.deallocate_on(c, OTHER).unwrap();
    assert_eq!(pool.stats().pending, 1024 + 2048 + 4096);
    streams.complete(THIRD);
    assert_eq!(pool.reclaim().unwrap(), 2048);
    streams.complete(OTHER);
    assert_eq!(pool.reclaim().unwrap(), 1024 + 4096);
    let s = pool.stats();
    assert_eq!((s.pending, s.free_blocks, s.largest_free), (0, 1, 1 << 20));
}

#[test]
fn another_stream_waits_for_the_home_stream_after_home_frees() {
    let (pool, streams) = stream_pool(1 << 20);
    // No home-stream free yet: nothing to wait for.
    let x = pool.allocate_on(1000, 0, OTHER).unwrap();
    assert!(streams.waits().is_empty());
    let h = pool.allocate(1000, 0).unwrap();
    pool.deallocate(h).unwrap(); // home stream: reusable at once, by any stream...
    let y = pool.allocate_on(1000, 0, OTHER).unwrap(); // ...after `OTHER` waits for `HOME`
    assert_eq!(streams.waits(), vec![(OTHER, HOME)]);
    let z = pool.allocate_on(1000, 0, OTHER).unwrap(); // no new home free: no new wait
    let w = pool.allocate_on(1000, 0, THIRD).unwrap();
    assert_eq!(streams.waits(), vec![(OTHER, HOME), (THIRD, HOME)]);
    for addr in [x, y, z, w] {
        pool.deallocate(addr).unwrap();
    }
    let v = pool.allocate_on(1000, 0, OTHER).unwrap();
    assert_eq!(streams.waits().len(), 3);
    pool.deallocate(v).unwrap();
}

#[test]
fn a_failing_stream_runtime_disturbs_nothing() {
    let (pool, streams) = stream_pool(1 << 20);
    let a = pool.allocate(1000, 0).unwrap();
    let h = pool.allocate(1000, 0).unwrap();
    pool.deallocate(h).unwrap();
    let broken = Error::Driver {
        call: "cuEventRecord",
        name: "CUDA_ERROR_LAUNCH_FAILED".into(),
        text: "unspecified launch failure".into(),
        code: 719,
    };
    streams.fail_with(Some(broken.clone()));
    // A free on another stream needs an event: it fails and the allocation stays live.
    let err = unchanged(&pool, || pool.deallocate_on(a, OTHER)).unwrap_err();
    assert_eq!(err, broken);
    // An allocation for another stream needs a wait: it fails, counted as a failure only.
    let before = pool.stats();
    assert_eq!(pool.allocate_on(100, 0, OTHER).unwrap_err(), broken);
    let after = pool.stats();
    assert_eq!(
        PoolStats {
            failures: before.failures,
            ..after
        },
        before
    );
    assert_eq!(after.failures, before.failures + 1);
    streams.fail_with(None);
    pool.deallocate_on(a, OTHER).unwrap();
    streams.complete_all();
    assert_eq!(pool.reclaim().unwrap(), 1024);
}

#[test]
fn slices_on_a_stream_are_freed_on_that_stream() {
    let (pool, streams) = stream_pool(1 << 20);
    let client = pool.client("decoder", usize::MAX);
    let s = client.alloc_slice_on::<f32>(256, OTHER).unwrap();
    assert_eq!(s.stream(), OTHER);
    drop(s);
    assert_eq!(streams.pending(OTHER), 1);
    assert_eq!(pool.stats().pending, 1024);
    streams.complete(OTHER);
    let t = client.alloc_slice::<f32>(256).unwrap();
    assert_eq!(t.stream(), HOME);
    assert_eq!(pool.stats().pending, 0);
}

#[test]
fn a_pool_without_a_stream_runtime_treats_all_streams_as_one() {
    let pool = Pool::host(4096).unwrap();
    let a = pool.allocate_on(4096, 0, StreamId(9)).unwrap();
    pool.deallocate_on(a, StreamId(10)).unwrap();
    assert_eq!(pool.allocate(4096, 0).unwrap(), a);
}

#[test]
fn freed_blocks_are_reused_whole_and_merged_before_a_request_would_fail() {
    let pool = Pool::builder(1 << 20).name("reuse").build_host().unwrap();
    // A freed block waits whole for the next request of its size class (2900 and 3000 bytes
    // both take 3072).
    let a = pool.allocate(3000, 0).unwrap();
    let neighbour = pool.allocate(256, 0).unwrap();
    pool.deallocate(a).unwrap();
    let b = pool.allocate(2900, 0).unwrap();
    assert_eq!(b, a);
    let s = pool.stats();
    assert_eq!(
        (s.reused, s.in_use, s.requested),
        (1, 3072 + 256, 2900 + 256)
    );
    // Another class does not take it: the block below `a` stays cached and `c` lies elsewhere.
    pool.deallocate(b).unwrap();
    let c = pool.allocate(5000, 0).unwrap();
    assert_ne!(c, a);
    assert_eq!(pool.stats().reused, 1);
    // Four-KiB blocks fill the pool, then all are freed: most wait in the cache, but a request
    // for everything free must still succeed, with every block merged first. (`stats`
    // describes the free blocks as merged and leaves the cache as it is; a request that
    // cannot succeed merges it, so that the fill starts from one free block.)
    pool.deallocate(c).unwrap();
    pool.deallocate(neighbour).unwrap();
    let s = pool.stats();
    assert_eq!(
        (s.free_blocks, s.largest_free, s.free),
        (1, 1 << 20, 1 << 20)
    );
    assert!(pool.allocate(2 << 20, 0).is_err());
    let mut blocks = Vec::new();
    while let Ok(addr) = pool.allocate(4096, 0) {
        blocks.push(addr);
    }
    assert_eq!(blocks.len(), 256);
    for addr in blocks {
        pool.deallocate(addr).unwrap();
    }
    let all = pool.allocate(1 << 20, 0).unwrap();
    assert_eq!(all, pool.base());
    pool.deallocate(all).unwrap();
    let s = pool.stats();
    assert_eq!((s.free_blocks, s.largest_free, s.in_use), (1, 1 << 20, 0));
    // A cached block is free memory for every client: a quota that was full is free again.
    let small = pool.client("small", 8192);
    let d = small.allocate(8192, 0).unwrap();
    small.deallocate(d).unwrap();
    let e = small.allocate(8192, 0).unwrap();
    assert_eq!((e, small.stats().in_use), (d, 8192));
    small.deallocate(e).unwrap();
}

/// A device pool dropped while a stream it has a heap for captures a graph (a capture begun
/// without a reservation of this pool, another pool's graph say) leaves that stream alone:
/// waiting for it would end the capture (`cuStreamSynchronize` on a capturing stream).
#[test]
fn a_device_pool_dropped_during_a_capture_on_a_heaps_stream_leaves_the_capture_alone() {
    let streams = Arc::new(ManualStreams::new());
    let pool = Pool::builder(1 << 20)
        .log_leaks_on_drop(false)
        .streams(streams.clone(), HOME)
        .build_in(DeviceLike::default())
        .unwrap();
    let a = pool.allocate_on(4096, 0, OTHER).unwrap();
    pool.deallocate_on(a, OTHER).unwrap();
    assert_eq!(pool.thread_heaps(), 1);
    streams.begin_capture(OTHER);
    drop(pool);
    streams.end_capture(OTHER);
    assert!(
        streams.refused().is_empty(),
        "the drop called into the capturing stream: {:?}",
        streams.refused()
    );
}

/// A runtime with CUDA's per-thread default stream (`PTDS`, a different stream on
/// each thread): `synchronize(PTDS)` waits for the calling thread's own stream only, and
/// events record on the calling thread's stream.
#[derive(Debug, Default)]
struct PerThreadStreams {
    events: Mutex<
        Vec<(
            std::thread::ThreadId,
            StreamId,
            Arc<std::sync::atomic::AtomicBool>,
        )>,
    >,
}

const PTDS: StreamId = StreamId(9);

#[derive(Debug)]
struct PtEvent(Arc<std::sync::atomic::AtomicBool>);

impl devarena::pool::StreamEvent for PtEvent {
    fn is_complete(&self) -> Result<bool, Error> {
        Ok(self.0.load(std::sync::atomic::Ordering::Acquire))
    }
}

impl devarena::pool::StreamSync for PerThreadStreams {
    fn record(&self, stream: StreamId) -> Result<Box<dyn devarena::pool::StreamEvent>, Error> {
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        self.events
            .lock()
            .unwrap()
            .push((std::thread::current().id(), stream, done.clone()));
        Ok(Box::new(PtEvent(done)))
    }
    fn order_after(&self, _: StreamId, _: StreamId) -> Result<(), Error> {
        Ok(())
    }
    fn is_per_thread(&self, stream: StreamId) -> bool {
        stream == PTDS
    }
    fn synchronize(&self, stream: StreamId) -> Result<(), Error> {
        let me = std::thread::current().id();
        for (thread, s, done) in self.events.lock().unwrap().iter() {
            if *s == stream && (stream != PTDS || *thread == me) {
                done.store(true, std::sync::atomic::Ordering::Release);
            }
        }
        Ok(())
    }
}

/// A block freed by another thread on the per-thread default stream is parked behind an event
/// on that thread's stream: the drop of a device pool waits for that event, not for the
/// dropping thread's own per-thread stream (which `synchronize` of the handle would wait for).
#[test]
fn a_device_pool_dropped_waits_for_another_threads_per_thread_stream() {
    let streams = Arc::new(PerThreadStreams::default());
    let pool = Pool::builder(1 << 20)
        .log_leaks_on_drop(false)
        .streams(streams.clone(), HOME)
        .build_in(DeviceLike::default())
        .unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let a = pool.allocate_on(4096, 0, PTDS).unwrap();
            pool.deallocate_on(a, PTDS).unwrap();
        });
    });
    assert_eq!(
        pool.stats().pending,
        4096,
        "parked behind the worker's stream"
    );
    let worker_event = streams
        .events
        .lock()
        .unwrap()
        .iter()
        .find(|(t, s, _)| *s == PTDS && *t != std::thread::current().id())
        .map(|(_, _, done)| done.clone())
        .expect("an event on the worker's per-thread stream");
    // The worker's stream finishes 300 ms from now; a drop that waits for it returns after.
    let completer = {
        let done = worker_event.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            done.store(true, std::sync::atomic::Ordering::Release);
        })
    };
    drop(pool);
    let waited = worker_event.load(std::sync::atomic::Ordering::Acquire);
    completer.join().unwrap();
    assert!(
        waited,
        "the region went back before the other thread's per-thread stream finished with the block"
    );
}
