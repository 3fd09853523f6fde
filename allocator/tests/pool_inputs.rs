//! Adversarial inputs to the pool's public API on host pools: sizes and alignments at their
//! edges, typed slices whose byte counts overflow, frees of addresses that are not live
//! allocations, quotas and builder settings at their limits, trims and reservations at odd
//! moments. Every call must return `Ok` or an error naming the thing and the numbers, and
//! leave the pool exact: after each refusal the statistics add up and, once everything is
//! freed, the whole capacity can be allocated again.

use std::sync::Arc;

use devarena::backend::{HostVirtualMemory, MemoryKind, VirtualMemory};
use devarena::pool::{
    AllocRequest, BLOCK_GRANULE, FreeRequest, MAX_POOL_CAPACITY, ManualStreams, PoolBuilder,
    StreamId, reserved_bytes,
};
use devarena::{Element, Error, Pool};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------------
// Helpers.

/// The largest request whose size class fits in `capacity` (a multiple of 256).
fn largest_request(capacity: usize) -> usize {
    // Size classes are monotone: search down from the capacity in granules.
    let mut size = capacity;
    while reserved_bytes(size).is_none_or(|r| r > capacity) {
        size -= 256;
    }
    size
}

/// The pool holds nothing: its counters say so, its free memory is one block of the whole
/// capacity, and that block can be allocated (as one request, and as 256-byte blocks up to the
/// last one, for small pools) and freed again.
fn assert_whole(pool: &Pool) {
    let stats = pool.stats();
    assert_eq!(
        (stats.live, stats.in_use, stats.requested, stats.pending),
        (0, 0, 0, 0),
        "{stats}"
    );
    assert_eq!(stats.allocations, stats.frees, "{stats}");
    assert_eq!(stats.free, stats.capacity, "{stats}");
    assert_eq!(stats.largest_free, stats.capacity, "{stats}");
    assert_eq!(stats.free_blocks, 1, "{stats}");
    assert_eq!(stats.quarantined, 0, "{stats}");

    let size = largest_request(pool.capacity());
    let a = pool.allocate(size, 0).expect("the largest request fits");
    assert!(pool.contains(a));
    pool.deallocate(a).unwrap();

    if pool.capacity() <= 1 << 20 {
        let blocks = pool.capacity() / 256;
        let addrs: Vec<u64> = (0..blocks)
            .map(|i| {
                pool.allocate(1, 0)
                    .unwrap_or_else(|e| panic!("block {i} of {blocks}: {e}"))
            })
            .collect();
        assert!(matches!(
            pool.allocate(0, 0),
            Err(Error::PoolExhausted {
                limit: "capacity",
                ..
            })
        ));
        assert_eq!(pool.stats().in_use, pool.capacity());
        for a in addrs {
            pool.deallocate(a).unwrap();
        }
    }
    let stats = pool.stats();
    assert_eq!((stats.live, stats.in_use), (0, 0), "{stats}");
    assert_eq!(stats.largest_free, stats.capacity, "{stats}");
}

/// `err` is an `InvalidArgument` whose message contains every one of `words`.
fn assert_invalid(err: Error, words: &[&str]) {
    let message = err.to_string();
    assert!(
        matches!(err, Error::InvalidArgument { .. }),
        "not an InvalidArgument: {err:?}"
    );
    for word in words {
        assert!(message.contains(word), "`{word}` missing from: {message}");
    }
}

/// A pool of each kind the probes run on: classic, growable, growable with heaps for every
/// thread.
fn pools(capacity: usize) -> Vec<(&'static str, Pool)> {
    vec![
        ("classic", Pool::host(capacity).unwrap()),
        (
            "growable",
            Pool::builder(capacity)
                .build_mapped(HostVirtualMemory::new(4096).unwrap())
                .unwrap(),
        ),
        (
            "eager heaps",
            Pool::builder(capacity)
                .eager_thread_heaps(true)
                .build_host()
                .unwrap(),
        ),
        (
            "no reuse",
            Pool::builder(capacity).reuse(0, 0).build_host().unwrap(),
        ),
    ]
}

// ---------------------------------------------------------------------------------------------
// Sizes.

#[test]
fn sizes_at_the_edges() {
    let capacity = 1 << 20;
    for (kind, pool) in pools(capacity) {
        // Sizes that fit.
        for size in [0, 1, 255, 256, 257, capacity - 1, capacity] {
            let a = pool
                .allocate(size, 0)
                .unwrap_or_else(|e| panic!("{kind}: {size}: {e}"));
            assert_eq!(a % 256, 0);
            assert!(pool.contains(a));
            assert_eq!(pool.stats().requested, size, "{kind}");
            pool.deallocate(a).unwrap();
        }
        // Sizes that do not: refused for capacity, with the request named.
        for size in [
            capacity + 1,
            capacity + 256,
            usize::MAX / 2,
            usize::MAX - 256,
            usize::MAX - 255,
            usize::MAX - 1,
            usize::MAX,
        ] {
            let err = pool.allocate(size, 0).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::PoolExhausted { limit: "capacity", requested, .. } if requested == size
                ),
                "{kind}: {size}: {err:?}"
            );
            assert!(err.to_string().contains(&size.to_string()), "{err}");
            for align in [0, 4096] {
                assert!(pool.allocate(size, align).is_err());
            }
        }
        assert_eq!(pool.stats().failures, 7 * 3, "{kind}");
        assert_whole(&pool);
    }
}

/// A request no larger than the capacity that its size class takes past it is refused; the
/// error must say why with the numbers that decide it (the bytes the request takes), not
/// claim that `capacity` bytes exceed a capacity of `capacity` bytes with all of it free.
#[test]
fn a_request_rounded_past_the_capacity_names_what_it_takes() {
    let capacity = (1 << 20) + 256;
    let pool = Pool::host(capacity).unwrap();
    let reserved = reserved_bytes(capacity).unwrap();
    assert!(reserved > capacity);
    let err = pool.allocate(capacity, 0).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains(&reserved.to_string()),
        "the bytes the request takes, {reserved}, missing from: {message}"
    );
    assert_whole(&pool);

    // The same for a quota, and for a size past every class.
    let client = pool.client("small", 300);
    let message = client.allocate(257, 0).unwrap_err().to_string();
    assert!(
        message.contains("512 bytes with its size class"),
        "{message}"
    );
    assert!(message.contains("quota of 300"), "{message}");
    let message = pool.allocate(usize::MAX, 0).unwrap_err().to_string();
    assert!(message.contains("past usize"), "{message}");
    // A request that is its own class says nothing more.
    let message = client.allocate(4096, 0).unwrap_err().to_string();
    assert!(message.contains("4096 bytes (align 256)"), "{message}");
    assert_whole(&pool);
}

// ---------------------------------------------------------------------------------------------
// Alignments.

#[test]
fn alignments_at_the_edges() {
    for (kind, pool) in pools(1 << 20) {
        for align in [0, 1, 2, 8, 64, 128, 256, 512, 4096] {
            let a = pool
                .allocate(100, align)
                .unwrap_or_else(|e| panic!("{kind}: align {align}: {e}"));
            assert_eq!(a % 256, 0, "{kind}: align {align}");
            assert_eq!(a % align.max(1) as u64, 0, "{kind}: align {align}");
            pool.deallocate(a).unwrap();
        }
        for align in [
            3,
            255,
            257,
            4095,
            8192,
            1 << 20,
            1 << 63,
            usize::MAX,
            usize::MAX - 1,
        ] {
            for size in [0, 1, 1 << 20, usize::MAX] {
                let err = pool.allocate(size, align).unwrap_err();
                assert_invalid(err, &[&align.to_string(), "alignment", pool.name()]);
            }
        }
        assert_eq!(pool.stats().failures, 9 * 4, "{kind}");
        assert_whole(&pool);
    }
}

// ---------------------------------------------------------------------------------------------
// Typed slices.

/// An element aligned past what a pool hands out.
#[derive(Clone, Copy)]
#[repr(C, align(8192))]
struct Page([u8; 8192]);
// SAFETY: plain bytes, no padding (the size is a multiple of the alignment), every bit pattern
// valid.
unsafe impl Element for Page {}

#[test]
fn typed_slices_at_the_edges() {
    for (kind, pool) in pools(1 << 20) {
        // `len * size_of::<T>()` overflows: refused with the numbers, nothing allocated.
        let err = pool.alloc_slice::<u64>(usize::MAX / 4).unwrap_err();
        assert_invalid(err, &[&(usize::MAX / 4).to_string(), "u64", "overflows"]);
        let err = pool.alloc_slice::<u128>(usize::MAX / 8).unwrap_err();
        assert_invalid(err, &["u128", "overflows"]);
        // Fits in usize, not in the pool.
        let err = pool.alloc_slice::<u64>(usize::MAX / 8).unwrap_err();
        assert!(
            matches!(err, Error::PoolExhausted { .. }),
            "{kind}: {err:?}"
        );
        // One past the capacity.
        let err = pool.alloc_slice::<u8>((1 << 20) + 1).unwrap_err();
        assert!(
            matches!(err, Error::PoolExhausted { .. }),
            "{kind}: {err:?}"
        );
        // An element aligned past the pool's largest alignment.
        let err = pool.alloc_slice::<Page>(1).unwrap_err();
        assert_invalid(err, &["8192"]);

        // Zero-length slices: a block each, distinct, empty.
        let mut e = pool.alloc_slice::<u32>(0).unwrap();
        let f = pool.alloc_slice::<u32>(0).unwrap();
        assert!(e.is_empty() && e.as_slice().unwrap().is_empty());
        assert!(e.as_mut_slice().unwrap().is_empty());
        assert_ne!(e.addr(), f.addr());
        assert_eq!((e.num_bytes(), pool.stats().in_use), (0, 512));

        // Zero-sized elements: any length is zero bytes.
        let z = pool.alloc_slice::<[u64; 0]>(usize::MAX).unwrap();
        assert_eq!((z.len(), z.num_bytes()), (usize::MAX, 0));
        assert_eq!(z.as_slice().unwrap().len(), usize::MAX);

        // The whole capacity as one slice.
        let mut all = pool
            .alloc_slice::<u8>(largest_request((1 << 20) - 768))
            .unwrap();
        all.as_mut_slice().unwrap().fill(7);
        drop((e, f, z));
        all.free().unwrap();
        assert_whole(&pool);
    }
}

// ---------------------------------------------------------------------------------------------
// Frees.

#[test]
fn frees_of_what_is_not_a_live_allocation() {
    for (kind, pool) in pools(1 << 20) {
        let other = Pool::host(1 << 20).unwrap();
        let a = pool.allocate(1000, 0).unwrap();
        let b = pool.allocate(5000, 4096).unwrap();
        let theirs = other.allocate(1000, 0).unwrap();
        let base = pool.base();
        let end = base + pool.capacity() as u64;
        let before = pool.stats();
        for addr in [
            0,
            1,
            base - 1,
            base + 1,
            a + 1,
            a + 256,
            a + 768,
            b - 256,
            b + 4096,
            end - 256,
            end,
            end + 256,
            theirs,
            u64::MAX,
            u64::MAX - 255,
        ] {
            let err = pool.deallocate(addr).unwrap_err();
            assert!(
                matches!(err, Error::UnknownAddress { addr: got, .. } if got == addr),
                "{kind}: {addr:#x}: {err:?}"
            );
            assert!(err.to_string().contains(&format!("{addr:#x}")), "{err}");
            for stream in [StreamId(0), StreamId(7), StreamId(u64::MAX)] {
                assert!(pool.deallocate_on(addr, stream).is_err(), "{kind}");
            }
            assert!(pool.own_client().deallocate(addr).is_err());
            assert!(
                pool.deallocate_with(FreeRequest::new(addr).size(usize::MAX))
                    .is_err()
            );
        }
        let after = pool.stats();
        assert_eq!(
            (after.live, after.in_use, after.frees),
            (before.live, before.in_use, before.frees),
            "{kind}"
        );
        // The wrong size: refused, the block stays.
        for size in [0, 999, 1001, 1024, usize::MAX] {
            let err = pool
                .deallocate_with(FreeRequest::new(a).size(size))
                .unwrap_err();
            assert!(err.to_string().contains("1000"), "{kind}: {err}");
        }
        assert_eq!(pool.stats().live, 2);
        pool.deallocate_with(FreeRequest::new(a).size(1000))
            .unwrap();
        // Twice.
        assert!(matches!(
            pool.deallocate(a),
            Err(Error::UnknownAddress { .. })
        ));
        pool.deallocate(b).unwrap();
        assert!(pool.deallocate(b).is_err());
        other.deallocate(theirs).unwrap();
        assert_whole(&pool);
    }
}

#[test]
fn frees_by_the_wrong_client() {
    for (kind, pool) in pools(1 << 20) {
        let alice = pool.client("alice", 1 << 19);
        let bob = pool.client("bob", usize::MAX);
        let a = alice.allocate(3000, 0).unwrap();
        let err = bob.deallocate(a).unwrap_err();
        assert_invalid(err, &["alice", "bob"]);
        assert!(bob.deallocate_on(a, StreamId(3)).is_err());
        assert!(bob.deallocate_with(FreeRequest::new(a).size(3000)).is_err());
        assert_eq!(alice.stats().in_use, 3072, "{kind}");
        // A slice's block: only the slice frees it.
        let s = bob.alloc_slice::<u8>(10).unwrap();
        assert!(pool.deallocate(s.addr()).is_err());
        assert!(bob.deallocate(s.addr()).is_err());
        assert!(alice.deallocate(s.addr()).is_err());
        assert_eq!(pool.stats().live, 2, "{kind}");
        drop(s);
        // The pool frees any client's.
        pool.deallocate(a).unwrap();
        assert_eq!((alice.stats().in_use, bob.stats().in_use), (0, 0));
        assert_whole(&pool);
    }
}

// ---------------------------------------------------------------------------------------------
// Clients and quotas.

#[test]
fn quotas_at_the_edges() {
    for (kind, pool) in pools(1 << 20) {
        let none = pool.client("none", 0);
        let one = pool.client("one", 1);
        let block = pool.client("block", 256);
        let all = pool.client("all", usize::MAX);
        for c in [&none, &one] {
            let err = c.allocate(0, 0).unwrap_err();
            assert!(
                matches!(err, Error::PoolExhausted { limit: "quota", .. }),
                "{kind}: {err:?}"
            );
            assert!(err.to_string().contains(&c.name()), "{err}");
            assert!(c.alloc_slice::<u8>(0).is_err());
        }
        let a = block.allocate(256, 0).unwrap();
        assert!(block.allocate(0, 0).is_err());
        let b: Vec<u64> = (0..(1 << 20) / 256 - 1)
            .map(|_| all.allocate(1, 0).unwrap())
            .collect();
        let err = all.allocate(1, 0).unwrap_err();
        assert!(
            matches!(
                err,
                Error::PoolExhausted {
                    limit: "capacity",
                    ..
                }
            ),
            "{kind}: {err:?}"
        );
        assert!(all.allocate(usize::MAX, 0).is_err());
        block.deallocate(a).unwrap();
        for b in b {
            all.deallocate(b).unwrap();
        }
        let stats = pool.client_stats();
        assert_eq!(stats.len(), 5);
        assert!(stats.iter().all(|c| c.in_use == 0));
        assert_whole(&pool);
    }
}

#[test]
fn many_clients() {
    let pool = Pool::host(1 << 20).unwrap();
    let clients: Vec<_> = (0..4096)
        .map(|i| pool.client(&format!("c{i}"), 256 * (i % 3)))
        .collect();
    let mut addrs = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        match c.allocate(1, 0) {
            Ok(a) => addrs.push((i, a)),
            Err(e) => assert!(i % 3 == 0 || addrs.len() == 4096, "{i}: {e}"),
        }
    }
    // Freed by another client: refused; by its own: done.
    for &(i, a) in &addrs {
        assert!(clients[(i + 1) % 4096].deallocate(a).is_err());
        clients[i].deallocate(a).unwrap();
    }
    assert_eq!(pool.client_stats().len(), 4097);
    assert_whole(&pool);
}

// ---------------------------------------------------------------------------------------------
// Builder settings.

#[test]
fn capacities_at_the_edges() {
    for capacity in [0, 1, 255] {
        let err = Pool::host(capacity).unwrap_err();
        assert_invalid(err, &[&capacity.to_string(), "256"]);
        let err = Pool::builder(capacity)
            .build_mapped(HostVirtualMemory::new(4096).unwrap())
            .unwrap_err();
        assert_invalid(err, &[&capacity.to_string()]);
    }
    for capacity in [256, 257, 511, 512, 4097, 65536 + 100] {
        let pool = Pool::host(capacity).unwrap();
        assert_eq!(pool.capacity(), capacity & !255);
        assert_whole(&pool);
        let pool = Pool::builder(capacity)
            .build_mapped(HostVirtualMemory::new(4096).unwrap())
            .unwrap();
        assert_eq!(pool.capacity(), capacity & !255);
        assert_whole(&pool);
    }
}

/// Capacities past the most a pool indexes ([`MAX_POOL_CAPACITY`]): refused by the builder
/// before anything is reserved, in an error that names the pool, the capacity and the most.
#[test]
fn capacities_past_the_most_name_the_pool() {
    for capacity in [
        usize::MAX,
        usize::MAX - 255,
        usize::MAX - 256,
        usize::MAX / 2 + 1,
        isize::MAX as usize,
        1 << 62,
        MAX_POOL_CAPACITY + BLOCK_GRANULE,
    ] {
        let err = Pool::builder(capacity)
            .name("huge")
            .build_host()
            .unwrap_err();
        let words = [
            "huge",
            &capacity.to_string(),
            &MAX_POOL_CAPACITY.to_string(),
        ];
        assert_invalid(err, &words);
        let err = Pool::builder(capacity)
            .name("huge")
            .build_mapped(HostVirtualMemory::new(4096).unwrap())
            .unwrap_err();
        assert_invalid(err, &words);
    }
    // The most itself, as addresses on virtual memory with nothing mapped: a pool that
    // serves (or, where the host refuses that much address space, out of memory).
    match Pool::builder(MAX_POOL_CAPACITY + BLOCK_GRANULE - 1)
        .name("most")
        .build_mapped(HostVirtualMemory::new(2 << 20).unwrap())
    {
        Ok(pool) => {
            assert_eq!(pool.capacity(), MAX_POOL_CAPACITY);
            let a = pool.allocate(1 << 20, 0).unwrap();
            pool.deallocate(a).unwrap();
            assert_whole(&pool);
        }
        Err(err) => assert!(
            matches!(err, Error::OutOfMemory { requested, .. } if requested >= MAX_POOL_CAPACITY),
            "{err:?}"
        ),
    }
}

/// Virtual memory that has no address space to give: its refusal becomes the build's error,
/// naming the pool and the capacity.
struct NoAddressSpace;

// SAFETY: `reserve` never succeeds, so there is no reservation for the other calls to be
// about; they refuse too.
unsafe impl VirtualMemory for NoAddressSpace {
    fn name(&self) -> &'static str {
        "no-address-space"
    }
    fn memory(&self) -> MemoryKind {
        MemoryKind::Host
    }
    fn granularity(&self) -> usize {
        4096
    }
    fn reserve(&self, bytes: usize) -> Result<u64, Error> {
        Err(Error::InvalidArgument {
            what: format!("no room for {bytes} bytes of addresses"),
        })
    }
    unsafe fn free_reservation(&self, _: u64, _: usize) -> Result<(), Error> {
        Err(nothing_reserved())
    }
    unsafe fn map(&self, _: u64, _: usize, _: usize) -> Result<(), Error> {
        Err(nothing_reserved())
    }
    unsafe fn unmap(&self, _: u64, _: usize) -> Result<(), Error> {
        Err(nothing_reserved())
    }
}

fn nothing_reserved() -> Error {
    Error::InvalidArgument {
        what: "nothing reserved".to_string(),
    }
}

#[test]
fn capacities_the_backend_refuses_name_the_pool() {
    for capacity in [1 << 20, MAX_POOL_CAPACITY] {
        let err = Pool::builder(capacity)
            .name("refused")
            .build_mapped(NoAddressSpace)
            .unwrap_err();
        assert_invalid(
            err,
            &[
                "refused",
                &capacity.to_string(),
                "no room for",
                "cannot be reserved",
            ],
        );
    }
}

#[test]
fn chunks_at_the_edges() {
    let vm = || HostVirtualMemory::new(4096).unwrap();
    for chunk in [0, 1, 255, 256, 2048, 4095, 4097, 12288, usize::MAX] {
        let err = Pool::builder(1 << 20)
            .chunk(chunk)
            .build_mapped(vm())
            .unwrap_err();
        assert_invalid(err, &[&chunk.to_string(), "4096"]);
    }
    // A chunk as large as or larger than the capacity: one chunk, the rest of it unused.
    for chunk in [1 << 20, 1 << 21, 1 << 24] {
        let pool = Pool::builder(1 << 20)
            .chunk(chunk)
            .build_mapped(vm())
            .unwrap();
        let a = pool.allocate(1, 0).unwrap();
        assert_eq!(pool.stats().mapped, chunk);
        pool.deallocate(a).unwrap();
        assert_eq!(pool.trim().unwrap(), chunk);
        assert_whole(&pool);
    }
    // A capacity that is no multiple of the chunk.
    let pool = Pool::builder(3 * 4096 + 256)
        .chunk(8192)
        .build_mapped(vm())
        .unwrap();
    let a = pool.allocate(3 * 4096 + 256, 0).unwrap();
    assert_eq!(pool.stats().mapped, 16384);
    pool.deallocate(a).unwrap();
    assert_whole(&pool);
    // A chunk so large that its reservation cannot be made.
    for chunk in [1 << 62, 1 << 63] {
        let err = Pool::builder(1 << 20)
            .chunk(chunk)
            .build_mapped(vm())
            .unwrap_err();
        assert!(err.to_string().contains(&chunk.to_string()), "{err}");
    }
    // Granularities the stand-in refuses.
    for granularity in [0, 1, 255, 257, 1 << 31] {
        assert_invalid(
            HostVirtualMemory::new(granularity).unwrap_err(),
            &[&granularity.to_string()],
        );
    }
}

#[test]
fn reuse_and_heap_settings_at_the_edges() {
    let err = Pool::builder(1 << 20)
        .reuse(usize::MAX, 0)
        .build_host()
        .unwrap_err();
    assert_invalid(err, &[&usize::MAX.to_string()]);
    type Settings = fn() -> PoolBuilder;
    let builders: Vec<(&str, Settings)> = vec![
        ("reuse 0 bytes", || Pool::builder(1 << 20).reuse(2048, 0)),
        ("reuse 1 block", || {
            Pool::builder(1 << 20).reuse(1, usize::MAX)
        }),
        ("reuse most", || {
            Pool::builder(1 << 20).reuse(devarena::pool::MAX_REUSE_BLOCKS, usize::MAX)
        }),
        ("heaps 0", || {
            Pool::builder(1 << 20)
                .thread_heaps(0)
                .eager_thread_heaps(true)
        }),
        ("heaps 1", || {
            Pool::builder(1 << 20)
                .thread_heaps(1)
                .eager_thread_heaps(true)
        }),
        ("heaps max", || {
            Pool::builder(1 << 20)
                .thread_heaps(usize::MAX)
                .eager_thread_heaps(true)
        }),
        ("heaps max, inexact peaks", || {
            Pool::builder(1 << 20)
                .thread_heaps(usize::MAX)
                .exact_peaks(false)
                .eager_thread_heaps(true)
        }),
        ("threshold 0", || {
            Pool::builder(1 << 20).release_threshold(0)
        }),
        ("threshold 1", || {
            Pool::builder(1 << 20).release_threshold(1)
        }),
    ];
    for (kind, builder) in builders {
        for pool in [
            builder().build_host().unwrap(),
            builder()
                .build_mapped(HostVirtualMemory::new(4096).unwrap())
                .unwrap(),
        ] {
            // A mixed workload on two threads, then the pool must be whole.
            std::thread::scope(|s| {
                for t in 0..2usize {
                    let pool = &pool;
                    s.spawn(move || {
                        let mut live = Vec::new();
                        for i in 0..2000usize {
                            let size = (i * 7919 + t * 104729) % 70000;
                            if let Ok(a) = pool.allocate(size, 256 << (i % 5)) {
                                live.push(a);
                            }
                            if i % 3 == 0 && !live.is_empty() {
                                pool.deallocate(live.swap_remove(i % live.len()))
                                    .unwrap_or_else(|e| panic!("{kind}: {e}"));
                            }
                            if i % 500 == 0 {
                                pool.synchronize().unwrap();
                            }
                        }
                        for a in live {
                            pool.deallocate(a).unwrap();
                        }
                    });
                }
            });
            pool.trim().unwrap();
            assert_whole(&pool);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Trims, synchronizes and reclaims at odd moments.

#[test]
fn trims_at_odd_moments() {
    let vm = Arc::new(HostVirtualMemory::new(4096).unwrap());
    let pool = Pool::builder(1 << 20).build_mapped(vm.clone()).unwrap();
    // On an empty pool.
    assert_eq!(pool.trim().unwrap(), 0);
    assert_eq!(pool.trim_to(usize::MAX).unwrap(), 0);
    assert_eq!(pool.synchronize().unwrap(), 0);
    assert_eq!(pool.reclaim().unwrap(), 0);
    // With everything in use.
    let a = pool.allocate(1 << 20, 0).unwrap();
    assert_eq!(pool.trim().unwrap(), 0);
    pool.set_release_threshold(0);
    assert_eq!(pool.synchronize().unwrap(), 0);
    assert_eq!(vm.mapped_bytes(), 1 << 20);
    pool.deallocate(a).unwrap();
    // keep past what is mapped, then 1 byte.
    assert_eq!(pool.trim_to(usize::MAX).unwrap(), 0);
    assert_eq!(pool.trim_to(8191).unwrap(), (1 << 20) - 4096);
    assert_eq!(pool.trim_to(1).unwrap(), 4096);
    assert_eq!(pool.trim_to(0).unwrap(), 0);
    assert_eq!(vm.mapped_bytes(), 0);
    pool.set_release_threshold(usize::MAX);
    assert_eq!(pool.release_threshold(), usize::MAX);
    // Between a map failure and the next request.
    vm.fail_maps(0, 1);
    assert!(matches!(
        pool.allocate(5000, 0),
        Err(Error::OutOfMemory { .. })
    ));
    assert_eq!(pool.trim().unwrap(), 0);
    // While thread heaps hold spans.
    let heaps = Pool::builder(1 << 20)
        .eager_thread_heaps(true)
        .build_mapped(HostVirtualMemory::new(4096).unwrap())
        .unwrap();
    let b = heaps.allocate(10000, 0).unwrap();
    assert!(heaps.thread_heaps() >= 1);
    heaps.trim().unwrap();
    heaps.deallocate(b).unwrap();
    heaps.trim().unwrap();
    assert_whole(&heaps);
    assert_whole(&pool);
    // On a classic pool: nothing to give back.
    let classic = Pool::host(1 << 20).unwrap();
    let c = classic.allocate(1, 0).unwrap();
    assert_eq!(classic.trim().unwrap(), 0);
    assert_eq!(classic.synchronize().unwrap(), 0);
    classic.deallocate(c).unwrap();
    assert_whole(&classic);
}

// ---------------------------------------------------------------------------------------------
// Streams and graph reservations (host side, `ManualStreams`).

fn stream_pool(capacity: usize) -> (Arc<ManualStreams>, Pool) {
    let streams = Arc::new(ManualStreams::new());
    let pool = Pool::builder(capacity)
        .streams(streams.clone(), StreamId(1))
        .build_host()
        .unwrap();
    (streams, pool)
}

#[test]
fn frees_on_the_wrong_stream() {
    let (streams, pool) = stream_pool(1 << 20);
    let a = pool.allocate_on(1000, 0, StreamId(2)).unwrap();
    // Freed on a third stream: parked until that stream's work is done, then free.
    pool.deallocate_on(a, StreamId(3)).unwrap();
    assert!(pool.deallocate_on(a, StreamId(2)).is_err());
    // (With the stream's thread heap given back, its free span waits for the stream too.)
    assert!(pool.stats().pending >= 1024);
    streams.complete_all();
    pool.reclaim().unwrap();
    // Every stream id, the extremes included.
    for stream in [StreamId(0), StreamId(u64::MAX)] {
        let b = pool.allocate_on(100, 0, stream).unwrap();
        pool.deallocate_on(b, stream).unwrap();
    }
    // Statistics count the streams' thread heaps' free spans as free, and leave the heaps.
    let stats = pool.stats();
    assert_eq!(
        (stats.live, stats.pending, stats.free),
        (0, 0, stats.capacity)
    );
    streams.complete_all();
    pool.reclaim().unwrap();
    assert_whole(&pool);
}

/// A thread on many streams gets a heap for each: more streams than spans fit in the region
/// must still serve every request that fits, and leave the pool whole.
#[test]
fn many_streams_on_one_thread() {
    let (streams, pool) = stream_pool(1 << 20);
    let mut live = Vec::new();
    for i in 0..300u64 {
        let stream = StreamId(10 + i);
        let a = pool
            .allocate_on(1000, 0, stream)
            .unwrap_or_else(|e| panic!("stream {i}: {e}"));
        live.push((a, stream));
        if i % 2 == 0 {
            let (a, stream) = live.swap_remove(0);
            pool.deallocate_on(a, stream).unwrap();
        }
    }
    assert_eq!(pool.stats().live, 150);
    for (a, stream) in live {
        pool.deallocate_on(a, stream).unwrap();
    }
    pool.stats();
    streams.complete_all();
    pool.reclaim().unwrap();
    assert_whole(&pool);
}

#[test]
fn graph_reservations_misused() {
    let (streams, pool) = stream_pool(1 << 20);
    let g = StreamId(5);
    // Two reservations on one stream; one on the home stream.
    let r1 = pool.graph_reservation(g).unwrap();
    let r2 = pool.graph_reservation(g).unwrap();
    let rh = pool.graph_reservation(StreamId(1)).unwrap();
    let a = r1.allocate(1000, 0).unwrap();
    let b = r2.allocate(0, 4096).unwrap();
    let h = rh.allocate(300, 0).unwrap();
    // Bad requests: named, nothing taken.
    assert_invalid(r1.allocate(1, 3).unwrap_err(), &["3"]);
    assert!(matches!(
        r1.allocate(usize::MAX, 0),
        Err(Error::PoolExhausted { .. })
    ));
    assert_invalid(
        r1.allocate_with(AllocRequest::new(1, 0).on(StreamId(6)))
            .unwrap_err(),
        &["5", "6"],
    );
    assert!(r1.alloc_slice::<u64>(usize::MAX / 4).is_err());
    // A graph block freed twice, or by another reservation's client.
    let other = pool.client("other", usize::MAX);
    pool.deallocate_on(a, g).unwrap();
    assert!(pool.deallocate_on(a, g).is_err());
    assert!(other.deallocate(b).is_err());
    assert_eq!(r1.stats().held, 1);
    // A slice that outlives its reservation, and the reservation that outlives the pool.
    let s = r2.alloc_slice::<u32>(10).unwrap();
    drop(r2);
    drop(s);
    pool.deallocate(b).unwrap();
    pool.deallocate(h).unwrap();
    rh.release().unwrap();
    let (streams2, pool2) = stream_pool(1 << 20);
    let r3 = pool2.graph_reservation(g).unwrap();
    let c = r3.allocate(100, 0).unwrap();
    let client = r3.client().clone();
    drop(pool2);
    client.deallocate_on(c, g).unwrap();
    assert_eq!(r3.stats().held, 1);
    r3.release().unwrap();
    streams2.complete_all();
    drop(client);
    // Released: the held block returns.
    r1.release().unwrap();
    streams.complete_all();
    pool.reclaim().unwrap();
    assert_whole(&pool);
}

#[test]
fn graph_reservations_without_a_stream_runtime() {
    for (kind, pool) in pools(1 << 20) {
        // Every stream is the home stream: a reservation for any id works as one for it.
        let r = pool.graph_reservation(StreamId(9)).unwrap();
        let a = r.allocate(1000, 0).unwrap();
        let s = r.alloc_slice::<u8>(100).unwrap();
        assert_invalid(r.allocate(0, 100).unwrap_err(), &["100"]);
        assert!(r.allocate(usize::MAX, 0).is_err());
        pool.deallocate(a).unwrap();
        drop(s);
        assert_eq!(r.stats().held, 2, "{kind}");
        assert!(pool.allocate(largest_request(1 << 20), 0).is_err());
        drop(r);
        pool.reclaim().unwrap();
        assert_whole(&pool);
    }
}

#[test]
fn allocations_for_capture_at_the_edges() {
    let (streams, pool) = stream_pool(1 << 20);
    let g = StreamId(4);
    for align in [3, 8192, usize::MAX] {
        let err = pool
            .allocate_for_capture(AllocRequest::new(10, align).on(g))
            .unwrap_err();
        assert_invalid(err, &[&align.to_string()]);
    }
    for size in [(1 << 20) + 1, usize::MAX] {
        assert!(matches!(
            pool.allocate_for_capture(AllocRequest::new(size, 0).on(g)),
            Err(Error::PoolExhausted { .. })
        ));
    }
    let zero = pool.client("zero", 0);
    assert!(
        zero.allocate_for_capture(AllocRequest::new(0, 0).on(g))
            .is_err()
    );
    streams.begin_capture(g);
    let a = pool
        .allocate_for_capture(AllocRequest::new(0, 4096).on(g))
        .unwrap();
    assert_eq!(a % 4096, 0);
    streams.end_capture(g);
    pool.deallocate_on(a, g).unwrap();
    assert!(pool.deallocate_on(a, g).is_err());
    streams.complete_all();
    pool.reclaim().unwrap();
    assert_whole(&pool);
}

/// Clients are never forgotten: each `Pool::client` call adds an entry (its name, quota and
/// counters) that stays after every handle to the client is gone, so a program that makes a
/// client per request grows the pool's bookkeeping (and every statistics call) without bound.
/// A client lives as long as its pool, with its counters (`client_stats` reports a client
/// after its handles are gone, which is how a finished tenant's use is read): each
/// `Pool::client` call makes a new one, as documented there, so clients are made once per
/// tenant. Ten thousand short-lived clients are ten thousand entries, each exact.
#[test]
fn clients_outlive_their_handles_with_their_counters() {
    let pool = Pool::host(1 << 20).unwrap();
    for i in 0..10_000 {
        let c = pool.client(&format!("request-{i}"), 1 << 16);
        let a = c.allocate(100, 0).unwrap();
        c.deallocate(a).unwrap();
    }
    let clients = pool.client_stats();
    assert_eq!(clients.len(), 10_001);
    assert_eq!(clients[1].name, "request-0");
    assert!(
        clients[1..]
            .iter()
            .all(|c| c.allocations == 1 && c.frees == 1 && c.in_use == 0),
        "every client's counters"
    );
}

/// Threads on heaps of their own free each other's blocks, twice at once, with the wrong
/// client and at addresses inside blocks: every block is freed exactly once, every other call
/// is refused, and the counts add up.
#[test]
fn racing_frees_on_thread_heaps() {
    use std::sync::Barrier;
    use std::sync::atomic::{AtomicUsize, Ordering};
    for eager in [false, true] {
        let pool = Pool::builder(4 << 20)
            .eager_thread_heaps(eager)
            .build_host()
            .unwrap();
        let clients = [pool.client("a", usize::MAX), pool.client("b", 1 << 21)];
        let rounds = 200;
        let barrier = Barrier::new(4);
        let freed = AtomicUsize::new(0);
        let shared: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for t in 0..4usize {
                let (pool, clients, barrier, freed, shared) =
                    (&pool, &clients, &barrier, &freed, &shared);
                s.spawn(move || {
                    for round in 0..rounds {
                        // Threads 0 and 2 allocate; all four then race to free the blocks.
                        if t % 2 == 0 {
                            let c = &clients[(round + t) % 2];
                            let mut v = shared.lock().unwrap();
                            for i in 0..4 {
                                if let Ok(a) = c.allocate(300 * (i + 1) + round, 0) {
                                    v.push(a);
                                }
                            }
                        }
                        barrier.wait();
                        let addrs = shared.lock().unwrap().clone();
                        for &a in &addrs {
                            // Inside the block, by the other client: refused.
                            assert!(pool.deallocate(a + 256).is_err());
                            let _ = clients[t % 2].deallocate(a);
                            if pool.deallocate(a).is_ok() {
                                freed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        barrier.wait();
                        if t == 0 {
                            shared.lock().unwrap().clear();
                        }
                        barrier.wait();
                    }
                });
            }
        });
        let stats = pool.stats();
        // Each block freed once: by its client (not counted above) or by the pool.
        assert_eq!(stats.allocations, stats.frees, "{stats}");
        assert!(freed.load(Ordering::Relaxed) as u64 <= stats.frees);
        assert!(pool.client_stats().iter().all(|c| c.in_use == 0));
        assert_whole(&pool);
    }
}

// ---------------------------------------------------------------------------------------------
// A random mix of valid and invalid calls against a model.

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        size: usize,
        align: usize,
        client: usize,
    },
    Slice {
        len: usize,
    },
    Free {
        index: usize,
        client: Option<usize>,
    },
    FreeBogus {
        offset: u64,
    },
    FreeSized {
        index: usize,
        size: usize,
    },
    Trim {
        keep: usize,
    },
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        0usize..600,
        0usize..(1 << 18),
        Just((1 << 20) - 1),
        Just(1 << 20),
        (1usize << 20)..usize::MAX,
        Just(usize::MAX),
    ]
}

fn align() -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => (0u32..14).prop_map(|s| if s == 13 { 0 } else { 1usize << s }),
        1 => any::<usize>(),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (size(), align(), 0usize..3).prop_map(|(size, align, client)| Op::Alloc { size, align, client }),
        1 => (0usize..(1 << 17)).prop_map(|len| Op::Slice { len }),
        3 => (any::<usize>(), prop::option::of(0usize..3)).prop_map(|(index, client)| Op::Free { index, client }),
        1 => any::<u64>().prop_map(|offset| Op::FreeBogus { offset }),
        1 => (any::<usize>(), size()).prop_map(|(index, size)| Op::FreeSized { index, size }),
        1 => prop_oneof![Just(0usize), Just(usize::MAX), 0usize..(1 << 20)].prop_map(|keep| Op::Trim { keep }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_inputs_leave_the_pool_exact(
        growable in any::<bool>(),
        eager in any::<bool>(),
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let capacity = 1 << 20;
        let builder = Pool::builder(capacity).eager_thread_heaps(eager);
        let pool = if growable {
            builder.build_mapped(HostVirtualMemory::new(4096).unwrap()).unwrap()
        } else {
            builder.build_host().unwrap()
        };
        let clients = [
            pool.client("zero", 0),
            pool.client("small", 64 << 10),
            pool.client("all", usize::MAX),
        ];
        // (addr, size, client)
        let mut live: Vec<(u64, usize, usize)> = Vec::new();
        let mut slices = Vec::new();
        let mut in_use = 0usize;
        for op in ops {
            match op {
                Op::Alloc { size, align, client } => {
                    match clients[client].allocate(size, align) {
                        Ok(addr) => {
                            let a = align.max(256);
                            prop_assert_eq!(addr % a as u64, 0);
                            in_use += reserved_bytes(size).unwrap();
                            live.push((addr, size, client));
                        }
                        Err(err) => {
                            let ok_align = align == 0 || (align.is_power_of_two() && align <= 4096);
                            match err {
                                Error::InvalidArgument { .. } => prop_assert!(!ok_align),
                                Error::PoolExhausted { .. } => prop_assert!(ok_align),
                                other => prop_assert!(false, "{other:?}"),
                            }
                        }
                    }
                }
                Op::Slice { len } => {
                    if let Ok(mut s) = pool.alloc_slice::<u32>(len) {
                        let tag = s.addr() as u32;
                        s.as_mut_slice().unwrap().iter_mut().enumerate().for_each(|(i, x)| *x = tag ^ i as u32);
                        in_use += reserved_bytes(len * 4).unwrap();
                        slices.push(s);
                    }
                }
                Op::Free { index, client } => {
                    if !live.is_empty() {
                        let (addr, size, owner) = live[index % live.len()];
                        let result = match client {
                            None => pool.deallocate(addr),
                            Some(c) => clients[c].deallocate(addr),
                        };
                        if client.is_none_or(|c| c == owner) {
                            prop_assert!(result.is_ok());
                            live.swap_remove(index % live.len());
                            in_use -= reserved_bytes(size).unwrap();
                        } else {
                            prop_assert!(result.is_err());
                        }
                    } else if index % 2 == 0 && !slices.is_empty() {
                        let s = slices.swap_remove(index % slices.len());
                        let tag = s.addr() as u32;
                        // Nothing (a trim, another allocation) touched the elements.
                        prop_assert!(s.as_slice().unwrap().iter().enumerate().all(|(i, &x)| x == tag ^ i as u32));
                        in_use -= reserved_bytes(s.num_bytes()).unwrap();
                        drop(s);
                    }
                }
                Op::FreeBogus { offset } => {
                    let addr = pool.base().wrapping_add(offset % (2 << 20)).wrapping_sub(1 << 19);
                    if !live.iter().any(|l| l.0 == addr) && !slices.iter().any(|s| s.addr() == addr) {
                        prop_assert!(pool.deallocate(addr).is_err());
                    }
                }
                Op::FreeSized { index, size } => {
                    if !live.is_empty() {
                        let i = index % live.len();
                        let (addr, real, _) = live[i];
                        let result = pool.deallocate_with(FreeRequest::new(addr).size(size));
                        prop_assert_eq!(result.is_ok(), size == real);
                        if size == real {
                            live.swap_remove(i);
                            in_use -= reserved_bytes(real).unwrap();
                        }
                    }
                }
                Op::Trim { keep } => {
                    pool.trim_to(keep).unwrap();
                }
            }
            let stats = pool.stats();
            prop_assert_eq!(stats.in_use, in_use);
            prop_assert_eq!(stats.live as usize, live.len() + slices.len());
            prop_assert_eq!(stats.free + stats.in_use, capacity);
        }
        for (addr, _, _) in live {
            pool.deallocate(addr).unwrap();
        }
        drop(slices);
        assert_whole(&pool);
    }
}
