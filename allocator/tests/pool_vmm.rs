//! Growable pools on the host stand-in for a device's virtual memory: memory mapped on demand,
//! never twice, given back only where no live byte is, failures that change nothing, stream
//! order before unmapping, the release threshold, and the statistics.

mod within;
use within::within;

use std::sync::{Arc, Mutex};

use devarena::backend::{HostVirtualMemory, VirtualMemory, VmCall};
use devarena::pool::{
    AllocRequest, EventSink, ManualStreams, PoolAction, PoolEvent, PoolStats, RegionKind,
    StreamEvent, StreamId, StreamSync, Tracking, reserved_bytes,
};
use devarena::{Error, Pool};
use proptest::prelude::*;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
/// The stand-in's chunk in most tests.
const CHUNK: usize = 64 * KIB;

fn growable(capacity: usize) -> (Pool, Arc<HostVirtualMemory>) {
    let vm = Arc::new(HostVirtualMemory::new(CHUNK).unwrap());
    let pool = Pool::builder(capacity)
        .name("grow")
        .build_mapped(vm.clone())
        .unwrap();
    (pool, vm)
}

fn maps(vm: &HostVirtualMemory) -> usize {
    vm.calls()
        .iter()
        .filter(|c| matches!(c, VmCall::Map { .. }))
        .count()
}

fn unmapped(vm: &HostVirtualMemory) -> Vec<(u64, usize)> {
    vm.calls()
        .iter()
        .filter_map(|c| match *c {
            VmCall::Unmap { addr, bytes } => Some((addr, bytes)),
            _ => None,
        })
        .collect()
}

/// The chunks (as `(start, end)` offsets in chunks) that `addr..addr + size` touches.
fn chunk_span(pool: &Pool, addr: u64, size: usize) -> (u64, u64) {
    let off = addr - pool.base();
    (
        off / CHUNK as u64,
        (off + size.max(1) as u64 - 1) / CHUNK as u64,
    )
}

#[test]
fn nothing_is_mapped_until_an_allocation_reaches_it() {
    let (pool, vm) = growable(64 * MIB);
    assert_eq!(pool.region_kind(), RegionKind::Growable);
    assert_eq!(pool.backend_name(), "host-vm");
    assert!(pool.is_host());
    assert_eq!(pool.capacity(), 64 * MIB);
    let s = pool.stats();
    assert_eq!((s.mapped, s.peak_mapped, s.chunk, s.maps), (0, 0, CHUNK, 0));
    assert_eq!(
        vm.calls(),
        [VmCall::Reserve {
            base: pool.base(),
            bytes: 64 * MIB
        }]
    );
    assert_eq!(vm.mapped_bytes(), 0);

    // 1000 bytes: the first chunk.
    let a = pool.allocate(1000, 0).unwrap();
    assert!(vm.is_mapped(a, 1000));
    assert_eq!(pool.stats().mapped, CHUNK);
    // More small blocks inside that chunk map nothing more.
    let small: Vec<u64> = (0..20).map(|_| pool.allocate(2000, 0).unwrap()).collect();
    assert_eq!(maps(&vm), 1);
    // A block of 5 chunks and a bit: the chunks it touches, in one run.
    let b = pool.allocate(5 * CHUNK + 100, 0).unwrap();
    assert!(vm.is_mapped(b, 5 * CHUNK + 100));
    assert_eq!(maps(&vm), 2);
    let s = pool.stats();
    assert_eq!(s.mapped, vm.mapped_bytes());
    assert_eq!(s.maps as usize * CHUNK, s.mapped);
    assert!(s.mapped <= s.in_use + 2 * CHUNK, "{s}");
    for x in small {
        pool.deallocate(x).unwrap();
    }
    pool.deallocate(a).unwrap();
    pool.deallocate(b).unwrap();
}

#[test]
fn a_failed_map_merges_the_reuse_cache_and_looks_again() {
    let (pool, vm) = growable(64 * MIB);
    // Four blocks of 1 MiB map 4 MiB; freed, they wait whole in the reuse cache.
    let blocks: Vec<u64> = (0..4).map(|_| pool.allocate(MIB, 0).unwrap()).collect();
    for &b in &blocks {
        pool.deallocate(b).unwrap();
    }
    assert_eq!(vm.mapped_bytes(), 4 * MIB);
    // 3 MiB (another size class) fits in no free block as they stand: the pool would grow,
    // but the device is out of memory. Merged, the cached blocks hold it.
    vm.fail_maps(0, 1);
    let c = pool.allocate(3 * MIB, 0).unwrap();
    assert_eq!(c, blocks[0]);
    assert_eq!(vm.mapped_bytes(), 4 * MIB);
    let calls = vm.calls();
    assert!(
        matches!(calls.last(), Some(VmCall::MapFailed { .. })),
        "{calls:?}"
    );
    let s = pool.stats();
    assert_eq!((s.mapped, s.failures, s.live), (4 * MIB, 0, 1));
    // Without cached blocks to merge, the pool gives its free chunk (the fourth MiB) back to
    // the device and maps the request's chunks: with one map failing, that succeeds.
    vm.fail_maps(0, 1);
    let d = pool.allocate(3 * MIB, 0).unwrap();
    assert!(vm.is_mapped(d, 3 * MIB));
    let s = pool.stats();
    assert_eq!((s.mapped, s.unmaps), (6 * MIB, (MIB / CHUNK) as u64));
    // With every map failing, the failure is the request's.
    vm.fail_maps(0, usize::MAX);
    assert!(matches!(
        pool.allocate(3 * MIB, 0),
        Err(Error::OutOfMemory { .. })
    ));
    vm.fail_maps(0, 0);
    pool.deallocate(c).unwrap();
    pool.deallocate(d).unwrap();
}

/// What the event sink saw: each event's action and error.
type Seen = Arc<Mutex<Vec<(PoolAction, Option<String>)>>>;

/// An event sink that records each event's action and error, and what it saw.
fn recording_sink() -> (Seen, Arc<dyn EventSink>) {
    let seen: Seen = Arc::default();
    let sink = {
        let seen = seen.clone();
        move |e: &PoolEvent<'_>| {
            seen.lock()
                .unwrap()
                .push((e.action, e.error.map(|err| err.to_string())))
        }
    };
    (seen, Arc::new(sink))
}

/// A leak report without its ages (`0.001s`), which differ between two reports of the same
/// allocations taken a moment apart.
fn without_ages(report: &str) -> String {
    report
        .split_whitespace()
        .filter(|w| {
            !w.strip_suffix('s')
                .is_some_and(|n| n.contains('.') && n.parse::<f64>().is_ok())
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A request that the device has no memory for fails and changes nothing but the mapping:
/// the free chunks the pool held mapped went back to the device before the last try.
#[test]
fn a_failed_map_fails_the_request_and_changes_nothing_but_the_free_chunks() {
    let (seen, sink) = recording_sink();
    let vm = Arc::new(HostVirtualMemory::new(CHUNK).unwrap());
    let pool = Pool::builder(64 * MIB)
        .name("oom")
        .tracking(Tracking::Tags)
        .events(sink.clone())
        .build_mapped(vm.clone())
        .unwrap();
    let client = pool.client("model", usize::MAX);
    let keep = client
        .allocate_with(AllocRequest::new(3 * CHUNK, 0).tag("weights"))
        .unwrap();
    let freed = pool.allocate(CHUNK, 0).unwrap();
    pool.deallocate(freed).unwrap();

    let before = (pool.stats(), pool.client_stats(), vm.mapped_chunks());
    let report_before = pool.leak_report().to_string();
    // Every map fails: the request's first placement, and the one after the freed block in
    // the reuse cache is merged.
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
    // Only the failure was counted, and the freed chunk (the fourth) was unmapped; every
    // block, every other counter and every other chunk are as they were.
    let after = (pool.stats(), pool.client_stats(), vm.mapped_chunks());
    assert_eq!(after.0.failures, before.0.failures + 1);
    assert_eq!(after.1[1].failures, before.1[1].failures + 1);
    assert_eq!(
        (after.0.mapped, after.0.unmaps),
        (before.0.mapped - CHUNK, before.0.unmaps + 1)
    );
    let as_before = PoolStats {
        failures: before.0.failures,
        mapped: before.0.mapped,
        unmaps: before.0.unmaps,
        ..after.0
    };
    assert_eq!(as_before, before.0);
    let freed_chunk = (pool.base() + 3 * CHUNK as u64, CHUNK);
    assert!(before.2.contains(&freed_chunk));
    let others: Vec<_> = before
        .2
        .iter()
        .copied()
        .filter(|&c| c != freed_chunk)
        .collect();
    assert_eq!(after.2, others);
    // (The report's ages move with the clock: compared without them.)
    assert_eq!(
        without_ages(&pool.leak_report().to_string()),
        without_ages(&report_before)
    );
    // The freed chunk 3 is mapped: the request needed chunks 4..=12.
    assert!(vm.calls().contains(&VmCall::MapFailed {
        addr: pool.base() + 4 * CHUNK as u64,
        chunk: CHUNK,
        count: 9
    }));
    // The event log has the failure with its reason.
    let last = seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(last.0, PoolAction::AllocateFailure);
    assert!(last.1.unwrap().contains("simulated out of memory"));

    // The pool keeps serving: the same request succeeds once the device has room.
    let big = client.allocate(10 * CHUNK, 0).unwrap();
    assert!(vm.is_mapped(big, 10 * CHUNK));
    assert_eq!(pool.leak_report().leaks.len(), 2);
    client.deallocate(big).unwrap();
    client.deallocate(keep).unwrap();
}

#[test]
fn trim_gives_back_only_chunks_without_a_live_byte_and_keeps_live_data() {
    let (pool, vm) = growable(64 * MIB);
    // Blocks of 40 KiB .. 200 KiB: some share chunks, some span several.
    let sizes = [
        40 * KIB,
        100 * KIB,
        200 * KIB,
        64 * KIB,
        40 * KIB,
        150 * KIB,
        70 * KIB,
    ];
    let mut slices: Vec<_> = sizes
        .iter()
        .map(|&s| pool.alloc_slice::<u8>(s).unwrap())
        .collect();
    for (i, s) in slices.iter_mut().enumerate() {
        s.as_mut_slice().unwrap().fill(i as u8 + 1);
    }
    // Free every other one.
    let mut kept = Vec::new();
    for (i, s) in slices.into_iter().enumerate() {
        if i % 2 == 0 {
            drop(s);
        } else {
            kept.push((i, s));
        }
    }
    let mapped_before = pool.stats().mapped;
    let released = pool.trim().unwrap();
    assert!(released > 0);
    assert_eq!(pool.stats().mapped, mapped_before - released);
    assert_eq!(pool.stats().mapped, vm.mapped_bytes());

    // Live data untouched; every chunk a live block touches is still mapped.
    for (i, s) in &kept {
        assert!(vm.is_mapped(s.addr(), s.len()));
        assert!(
            s.as_slice().unwrap().iter().all(|&b| b == *i as u8 + 1),
            "block {i}"
        );
    }
    // Every unmapped chunk lies outside every live block, and every chunk still mapped
    // touches one (nothing free was left behind).
    let live: Vec<(u64, u64)> = kept
        .iter()
        .map(|(_, s)| chunk_span(&pool, s.addr(), reserved_bytes(s.len()).unwrap()))
        .collect();
    for (addr, bytes) in unmapped(&vm) {
        assert_eq!(bytes, CHUNK);
        let c = (addr - pool.base()) / CHUNK as u64;
        assert!(
            !live.iter().any(|&(a, b)| a <= c && c <= b),
            "chunk {c} held live bytes"
        );
    }
    for (addr, _) in vm.mapped_chunks() {
        let c = (addr - pool.base()) / CHUNK as u64;
        assert!(
            live.iter().any(|&(a, b)| a <= c && c <= b),
            "chunk {c} stayed mapped"
        );
    }
    // A second trim finds nothing; the freed memory is mapped again when used.
    assert_eq!(pool.trim().unwrap(), 0);
    drop(kept);
    assert_eq!(pool.trim().unwrap(), mapped_before - released);
    assert_eq!(vm.mapped_bytes(), 0);
    let s = pool.stats();
    assert_eq!((s.mapped, s.peak_mapped), (0, mapped_before));
    assert_eq!(s.maps, s.unmaps);
    let again = pool.alloc_slice::<u8>(100 * KIB).unwrap();
    assert!(vm.is_mapped(again.addr(), again.len()));
    // Fresh memory holds no promised value: the stand-in fills it on every map.
    assert!(
        again
            .as_slice()
            .unwrap()
            .iter()
            .all(|&b| b == HostVirtualMemory::MAPPED_FILL)
    );
}

#[test]
fn trim_waits_for_the_home_stream_and_leaves_parked_blocks_mapped() {
    const HOME: StreamId = StreamId(1);
    const OTHER: StreamId = StreamId(2);
    let vm = Arc::new(HostVirtualMemory::new(CHUNK).unwrap());
    let streams = Arc::new(ManualStreams::new());
    let pool = Pool::builder(64 * MIB)
        .streams(streams.clone(), HOME)
        .build_mapped(vm.clone())
        .unwrap();
    // Two blocks of the pool's index, one freed on the home stream, one on another stream
    // (which parks it until an event there completes).
    let home_block = pool.allocate(4 * CHUNK, 0).unwrap();
    let other_block = pool.allocate(4 * CHUNK, 0).unwrap();
    pool.deallocate(home_block).unwrap();
    pool.deallocate_on(other_block, OTHER).unwrap();
    assert_eq!(pool.stats().pending, 4 * CHUNK);

    // The home stream's free may still be in use by queued work: trim waits for the home
    // stream first. The other stream's event has not completed: its block stays mapped.
    assert_eq!(pool.trim().unwrap(), 4 * CHUNK);
    assert_eq!(streams.synchronized(), [HOME]);
    assert!(!vm.is_mapped(home_block, 4 * CHUNK));
    assert!(vm.is_mapped(other_block, 4 * CHUNK));
    // Once the other stream has passed the free, the block is free and goes too.
    streams.complete(OTHER);
    assert_eq!(pool.trim().unwrap(), 4 * CHUNK);
    assert_eq!(vm.mapped_bytes(), 0);
    assert_eq!(pool.stats().pending, 0);

    // A stream runtime that cannot synchronize: nothing is unmapped, the error comes back,
    // and the pool keeps serving.
    let a = pool.allocate(CHUNK, 0).unwrap();
    pool.deallocate(a).unwrap();
    let broken = Error::Driver {
        call: "cuStreamSynchronize",
        name: "CUDA_ERROR_LAUNCH_FAILED".into(),
        text: "unspecified launch failure".into(),
        code: 719,
    };
    streams.fail_with(Some(broken.clone()));
    assert_eq!(pool.trim().unwrap_err(), broken);
    assert_eq!(vm.mapped_bytes(), CHUNK);
    streams.fail_with(None);
    assert_eq!(pool.trim().unwrap(), CHUNK);
}

#[test]
fn synchronize_applies_the_release_threshold() {
    const HOME: StreamId = StreamId(7);
    let vm = Arc::new(HostVirtualMemory::new(CHUNK).unwrap());
    let streams = Arc::new(ManualStreams::new());
    let pool = Pool::builder(64 * MIB)
        .streams(streams.clone(), HOME)
        .release_threshold(3 * CHUNK)
        .build_mapped(vm.clone())
        .unwrap();
    assert_eq!(pool.release_threshold(), 3 * CHUNK);
    let a = pool.allocate(10 * CHUNK, 0).unwrap();
    // Nothing free: nothing to give back.
    assert_eq!(pool.synchronize().unwrap(), 0);
    pool.deallocate(a).unwrap();
    assert_eq!(pool.synchronize().unwrap(), 7 * CHUNK);
    assert_eq!(vm.mapped_bytes(), 3 * CHUNK);
    // The chunks that stay are the lowest: where the next allocation goes.
    assert_eq!(vm.mapped_chunks()[0].0, pool.base());
    let b = pool.allocate(3 * CHUNK, 0).unwrap();
    assert_eq!(b, pool.base());
    assert_eq!(pool.stats().maps, 10);
    pool.deallocate(b).unwrap();
    pool.set_release_threshold(0);
    assert_eq!(pool.synchronize().unwrap(), 3 * CHUNK);
    assert!(streams.synchronized().iter().all(|&s| s == HOME));
    // The default keeps everything mapped.
    let (default, _) = growable(MIB);
    assert_eq!(default.release_threshold(), usize::MAX);
    let c = default.allocate(CHUNK, 0).unwrap();
    default.deallocate(c).unwrap();
    assert_eq!(default.synchronize().unwrap(), 0);
}

#[test]
fn a_classic_region_holds_its_capacity_and_trims_nothing() {
    let pool = Pool::builder(4 * MIB).build_host().unwrap();
    assert_eq!(pool.region_kind(), RegionKind::Classic);
    let s = pool.stats();
    assert_eq!(
        (s.mapped, s.peak_mapped, s.chunk, s.maps, s.unmaps),
        (4 * MIB, 4 * MIB, 4 * MIB, 0, 0)
    );
    let a = pool.allocate(MIB, 0).unwrap();
    pool.deallocate(a).unwrap();
    assert_eq!(pool.trim().unwrap(), 0);
    assert_eq!(pool.synchronize().unwrap(), 0);
    assert_eq!(pool.stats().mapped, 4 * MIB);
}

#[test]
fn region_settings_that_cannot_hold_are_errors_at_build() {
    let err = Pool::builder(MIB)
        .name("p")
        .region(RegionKind::Growable)
        .build_host()
        .unwrap_err();
    assert!(err.to_string().contains("cannot grow a region"), "{err}");
    let vm = HostVirtualMemory::new(CHUNK).unwrap();
    let err = Pool::builder(MIB)
        .region(RegionKind::Classic)
        .build_mapped(vm)
        .unwrap_err();
    assert!(err.to_string().contains("makes no classic region"), "{err}");
    let vm = HostVirtualMemory::new(CHUNK).unwrap();
    let err = Pool::builder(MIB)
        .chunk(3 * CHUNK)
        .build_mapped(vm)
        .unwrap_err();
    assert!(err.to_string().contains("196608"), "{err}");
    // A region past the most a pool indexes (whose map of chunks, a bit each, the host
    // could not hold either): an error before anything is reserved.
    let vm = Arc::new(HostVirtualMemory::new(4 * KIB).unwrap());
    let err = Pool::builder(1 << 62)
        .name("huge")
        .chunk(4 * KIB)
        .build_mapped(vm.clone())
        .unwrap_err();
    assert!(
        err.to_string().contains(
            "pool `huge`: a capacity of 4611686018427387904 bytes is over the most a pool \
             indexes, 824633720832 bytes"
        ),
        "{err}"
    );
    assert_eq!(vm.calls(), []);
    // A larger chunk than the granularity is fine.
    let vm = Arc::new(HostVirtualMemory::new(CHUNK).unwrap());
    let pool = Pool::builder(MIB)
        .chunk(4 * CHUNK)
        .build_mapped(vm.clone())
        .unwrap();
    let a = pool.allocate(1, 0).unwrap();
    assert_eq!(vm.mapped_chunks(), [(pool.base(), 4 * CHUNK)]);
    pool.deallocate(a).unwrap();
    // The capacity is not a multiple of the chunk: the reservation rounds up.
    let vm = Arc::new(HostVirtualMemory::new(CHUNK).unwrap());
    let pool = Pool::builder(CHUNK + 256).build_mapped(vm.clone()).unwrap();
    assert_eq!(pool.capacity(), CHUNK + 256);
    assert_eq!(
        vm.calls()[0],
        VmCall::Reserve {
            base: pool.base(),
            bytes: 2 * CHUNK
        }
    );
    let a = pool.allocate(CHUNK, 0).unwrap();
    let b = pool.allocate(256, 0).unwrap();
    assert_eq!(vm.mapped_bytes(), 2 * CHUNK);
    // Still the hard cap.
    assert!(matches!(
        pool.allocate(1, 0),
        Err(Error::PoolExhausted { .. })
    ));
    pool.deallocate(a).unwrap();
    pool.deallocate(b).unwrap();
    assert_eq!(pool.trim().unwrap(), 2 * CHUNK);
}

#[test]
fn the_last_handle_unmaps_everything_and_frees_the_reservation() {
    let vm = Arc::new(HostVirtualMemory::new(CHUNK).unwrap());
    let pool = Pool::builder(8 * MIB)
        .log_leaks_on_drop(false)
        .build_mapped(vm.clone())
        .unwrap();
    let base = pool.base();
    let slice = pool.alloc_slice::<u32>(40_000).unwrap();
    let _leaked = pool.allocate(3 * CHUNK, 0).unwrap();
    drop(pool);
    // A slice keeps the region alive.
    assert!(vm.mapped_bytes() > 0);
    assert!(slice.as_slice().is_ok());
    drop(slice);
    let calls = vm.calls();
    assert_eq!(
        calls.last(),
        Some(&VmCall::FreeReservation {
            base,
            bytes: 8 * MIB
        })
    );
    assert!(calls.contains(&VmCall::Synchronize));
    assert_eq!(vm.mapped_bytes(), 0);
}

#[test]
fn a_shared_virtual_memory_serves_two_pools() {
    let vm = Arc::new(HostVirtualMemory::new(CHUNK).unwrap());
    let a = Pool::builder(MIB).build_mapped(vm.clone()).unwrap();
    let b = Pool::builder(MIB).build_mapped(vm.clone()).unwrap();
    assert!(a.base() + MIB as u64 <= b.base() || b.base() + MIB as u64 <= a.base());
    let x = a.allocate(1000, 0).unwrap();
    let y = b.allocate(1000, 0).unwrap();
    assert_eq!(vm.mapped_bytes(), 2 * CHUNK);
    a.deallocate(x).unwrap();
    b.deallocate(y).unwrap();
    assert_eq!(vm.granularity(), CHUNK);
}

/// The chunks each live block touches. A block holds its size class (`reserved_bytes`), not
/// just what was asked for.
fn spans_of(pool: &Pool, live: &[(u64, usize)]) -> Vec<(u64, u64)> {
    live.iter()
        .map(|&(a, s)| chunk_span(pool, a, reserved_bytes(s).unwrap()))
        .collect()
}

/// One step of the random workload.
#[derive(Debug, Clone)]
enum Op {
    Alloc(usize, usize),
    Free(usize),
    Trim(usize),
    FailNextMap,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (256usize..=600 * KIB, prop_oneof![Just(0usize), Just(512), Just(4096)])
            .prop_map(|(s, a)| Op::Alloc(s, a)),
        4 => any::<usize>().prop_map(Op::Free),
        1 => (0usize..=4).prop_map(|k| Op::Trim(k * CHUNK)),
        1 => Just(Op::FailNextMap),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Whatever the order of allocations, frees, trims and failed maps: every live block's
    /// chunks are mapped, nothing is mapped twice (the stand-in would refuse it and the
    /// allocation fail), the counters agree with the stand-in, and after a full trim every
    /// mapped chunk holds a live byte.
    #[test]
    fn random_workloads_keep_the_mapping_exact(ops in prop::collection::vec(op_strategy(), 1..120)) {
        let (pool, vm) = growable(16 * MIB);
        let mut live: Vec<(u64, usize)> = Vec::new();
        let mut fail_armed = false;
        for op in ops {
            match op {
                Op::Alloc(size, align) => match pool.allocate(size, align) {
                    Ok(addr) => {
                        prop_assert!(vm.is_mapped(addr, size.max(1)));
                        // (An armed failure waits for the next map: this one may have
                        // needed none.)
                        live.push((addr, size));
                    }
                    Err(Error::OutOfMemory { detail: Some("simulated out of memory"), .. }) => {
                        prop_assert!(fail_armed, "a map failed that was not told to");
                        fail_armed = false;
                    }
                    Err(Error::PoolExhausted { .. }) => {}
                    Err(other) => prop_assert!(false, "unexpected error {other:?}"),
                },
                Op::Free(pick) if !live.is_empty() => {
                    let (addr, _) = live.swap_remove(pick % live.len());
                    pool.deallocate(addr).unwrap();
                }
                Op::Free(_) => {}
                Op::Trim(keep) => {
                    let before = pool.stats().mapped;
                    let released = pool.trim_to(keep).unwrap();
                    let after = pool.stats().mapped;
                    prop_assert_eq!(after, before - released);
                    // Down to `keep`, or as far as free chunks allow: then every chunk left
                    // holds a live byte.
                    if after > keep {
                        let spans = spans_of(&pool, &live);
                        for (addr, _) in vm.mapped_chunks() {
                            let c = (addr - pool.base()) / CHUNK as u64;
                            prop_assert!(spans.iter().any(|&(a, b)| a <= c && c <= b));
                        }
                    }
                }
                Op::FailNextMap => {
                    vm.fail_maps(0, 1);
                    fail_armed = true;
                }
            }
            let s = pool.stats();
            prop_assert_eq!(s.mapped, vm.mapped_bytes());
            prop_assert_eq!(s.mapped, (s.maps - s.unmaps) as usize * CHUNK);
            prop_assert!(s.peak_mapped >= s.mapped);
            for &(addr, size) in &live {
                prop_assert!(vm.is_mapped(addr, reserved_bytes(size).unwrap()));
            }
        }
        vm.fail_maps(0, 0);
        pool.trim().unwrap();
        let spans = spans_of(&pool, &live);
        for (addr, _) in vm.mapped_chunks() {
            let c = (addr - pool.base()) / CHUNK as u64;
            prop_assert!(spans.iter().any(|&(a, b)| a <= c && c <= b), "chunk {} kept without a live byte", c);
        }
        for (addr, _) in live {
            pool.deallocate(addr).unwrap();
        }
        pool.trim().unwrap();
        prop_assert_eq!(vm.mapped_bytes(), 0);
    }
}

/// Each of `threads` threads churns its own heap of a growable pool (every thread a heap):
/// `live` allocations, each operation freeing one and allocating another, sizes log-uniform
/// in [256 B, `max`]. Returns the pool's statistics after the threads joined, and the most
/// bytes each thread had in use (its blocks' sizes), added up: unlike the pool's peak, which
/// depends on how the threads' operations interleave, a figure of the threads' own sequences.
fn churn_on_heaps(threads: usize, live: usize, ops: usize, max: usize) -> (PoolStats, usize) {
    let capacity = (2 * threads * live * max).next_power_of_two();
    let vm = Arc::new(HostVirtualMemory::new(CHUNK).unwrap());
    let pool = Pool::builder(capacity)
        .name("churn")
        .eager_thread_heaps(true)
        .build_mapped(vm)
        .unwrap();
    // Every thread holds its allocations from before the first operation to after the last
    // one: the heaps' footprints add up whatever the scheduler does.
    let together = std::sync::Barrier::new(threads);
    let heap_peaks = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (pool, together) = (&pool, &together);
                s.spawn(move || {
                    let mut rng = 0x9E37_79B9_7F4A_7C15u64
                        ^ (t as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
                    let mut next = move || {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        rng
                    };
                    let span = (max / 256).ilog2() as f64;
                    let size = move |r: u64| {
                        let x = (r >> 11) as f64 / (1u64 << 53) as f64;
                        (256.0 * (x * span).exp2()) as usize
                    };
                    let reserved = |size: usize| reserved_bytes(size).unwrap();
                    let mut held: Vec<(u64, usize)> = (0..live)
                        .map(|_| {
                            let size = size(next());
                            (pool.allocate(size, 256).unwrap(), reserved(size))
                        })
                        .collect();
                    let mut in_use: usize = held.iter().map(|&(_, r)| r).sum();
                    let mut peak = in_use;
                    together.wait();
                    for _ in 0..ops {
                        let victim = (next() % live as u64) as usize;
                        pool.deallocate(held[victim].0).unwrap();
                        in_use -= held[victim].1;
                        let size = size(next());
                        held[victim] = (pool.allocate(size, 256).unwrap(), reserved(size));
                        in_use += held[victim].1;
                        peak = peak.max(in_use);
                    }
                    together.wait();
                    for (a, _) in held {
                        pool.deallocate(a).unwrap();
                    }
                    peak
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    (pool.stats(), heap_peaks)
}

/// A heap's reuse cache on a growable region holds no more than the heap has had in use:
/// bounded by the capacity alone (half a heap's share of it), the freed blocks waiting there
/// for a request of their own size pushed new sizes to fresh addresses, and eight heaps kept
/// 4.1–4.2× their peaks in use, added up, mapped in this test (2.3–2.7× with the bound). The
/// figure compared is the threads' own peaks: the pool's peak moves with how the threads
/// interleave (34–45 MiB on a loaded two-core machine, as low as what they hold at the start),
/// the mapped bytes far less.
#[test]
fn heaps_on_a_growable_region_map_memory_in_proportion_to_their_use() {
    let (s, heap_peaks) = churn_on_heaps(8, 32, 4000, MIB);
    assert_eq!((s.allocations, s.frees, s.in_use), (8 * 4032, 8 * 4032, 0));
    assert!(s.peak <= heap_peaks);
    assert!(
        s.mapped * 3 <= 10 * heap_peaks,
        "{} KiB mapped for heaps whose peaks in use add up to {} KiB: {:.2}× (at most 3.33× \
         expected; the pool's peak: {} KiB)",
        s.mapped >> 10,
        heap_peaks >> 10,
        s.mapped as f64 / heap_peaks as f64,
        s.peak >> 10
    );
}

/// A thread heap takes its block, and maps its memory, before it asks for the client's lease:
/// a request the quota refuses there unmaps what it mapped (the heap's span is its own, so
/// nothing else can have reached those chunks). Before, the chunks stayed mapped.
#[test]
fn a_request_over_quota_on_a_thread_heap_maps_nothing() {
    let vm = Arc::new(HostVirtualMemory::new(CHUNK).unwrap());
    let pool = Pool::builder(64 * MIB)
        .name("quota-heap")
        .eager_thread_heaps(true)
        .build_mapped(vm.clone())
        .unwrap();
    let client = pool.client("small", 8 * CHUNK);
    let keep = client.allocate(6 * CHUNK, 0).unwrap();
    let before = (pool.stats(), pool.client_stats(), vm.mapped_chunks());
    let calls = vm.calls().len();
    let err = client.allocate(4 * CHUNK, 0).unwrap_err();
    match &err {
        Error::PoolExhausted {
            limit, requested, ..
        } => assert_eq!((*limit, *requested), ("quota", 4 * CHUNK)),
        other => panic!("expected the quota to refuse, got {other:?}"),
    }
    // The request mapped the block's chunks, then unmapped them again.
    let unmaps = vm.calls()[calls..]
        .iter()
        .filter(|c| matches!(c, VmCall::Unmap { .. }))
        .count();
    assert_eq!(unmaps, 4);
    // Only the failure and the calls made were counted: the chunks mapped, the most ever
    // mapped and every other figure are as they were.
    let after = (pool.stats(), pool.client_stats(), vm.mapped_chunks());
    assert_eq!(after.2, before.2);
    assert_eq!(after.0.failures, before.0.failures + 1);
    assert_eq!(
        (after.0.maps, after.0.unmaps),
        (before.0.maps + 4, before.0.unmaps + 4)
    );
    assert_eq!(
        PoolStats {
            failures: before.0.failures,
            maps: before.0.maps,
            unmaps: before.0.unmaps,
            ..after.0
        },
        before.0
    );
    assert_eq!(after.1[1].failures, before.1[1].failures + 1);
    // The pool goes on serving: within the quota the same request maps its memory.
    client.deallocate(keep).unwrap();
    let big = client.allocate(4 * CHUNK, 0).unwrap();
    assert!(vm.is_mapped(big, 4 * CHUNK));
    client.deallocate(big).unwrap();
}

/// A virtual-memory backend whose calls panic or call back into their pool on demand (the
/// backend is user code, as a stream runtime is).
mod misbehaving_backend {
    use super::*;
    use devarena::backend::MemoryKind;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{OnceLock, Weak};
    use std::time::Duration;

    #[derive(Default)]
    struct Hooks {
        panic_reserve: AtomicBool,
        panic_map: AtomicBool,
        panic_unmap: AtomicBool,
        /// `map` asks this pool for its statistics, or allocates from it, first.
        stats_from_map: OnceLock<Weak<Pool>>,
        allocate_from_map: OnceLock<Weak<Pool>>,
        /// What the allocation made from `map` returned.
        inner: Mutex<Option<Result<u64, Error>>>,
        /// With `panic_map` or `panic_unmap`: the panic's payload is a [`CallsBack`] on this
        /// pool instead of a message.
        payload_calls_back: OnceLock<Weak<Pool>>,
        /// What the payload's allocation returned when it was dropped.
        payload_got: Mutex<Option<Result<u64, Error>>>,
    }

    /// A panic payload that calls its pool back when it is dropped: it allocates, then asks
    /// for statistics.
    struct CallsBack(Weak<Pool>, Arc<Hooks>);

    impl Drop for CallsBack {
        fn drop(&mut self) {
            if let Some(pool) = self.0.upgrade() {
                *self.1.payload_got.lock().unwrap() = Some(pool.allocate(256, 0));
                let _ = pool.stats();
            }
        }
    }

    impl Hooks {
        /// Panics with `message`, or with a [`CallsBack`] payload where one is asked for.
        fn panic(self: &Arc<Self>, message: &str) -> ! {
            if let Some(pool) = self.payload_calls_back.get() {
                std::panic::panic_any(CallsBack(pool.clone(), self.clone()));
            }
            panic!("{message}");
        }
    }

    struct Vm {
        inner: HostVirtualMemory,
        hooks: Arc<Hooks>,
    }

    // SAFETY: every call that maps, unmaps or reserves is the host stand-in's, which keeps the
    // contract; the hooks panic or call the pool before anything changes.
    unsafe impl VirtualMemory for Vm {
        fn name(&self) -> &'static str {
            "flaky-vm"
        }
        fn memory(&self) -> MemoryKind {
            self.inner.memory()
        }
        fn granularity(&self) -> usize {
            self.inner.granularity()
        }
        fn reserve(&self, bytes: usize) -> Result<u64, Error> {
            if self.hooks.panic_reserve.load(Ordering::SeqCst) {
                panic!("reserve panics");
            }
            self.inner.reserve(bytes)
        }
        unsafe fn free_reservation(&self, base: u64, bytes: usize) -> Result<(), Error> {
            // SAFETY: the caller's guarantee, passed on.
            unsafe { self.inner.free_reservation(base, bytes) }
        }
        unsafe fn map(&self, addr: u64, chunk: usize, count: usize) -> Result<(), Error> {
            if let Some(pool) = self.hooks.stats_from_map.get().and_then(Weak::upgrade) {
                let _ = pool.stats();
            }
            if let Some(pool) = self.hooks.allocate_from_map.get().and_then(Weak::upgrade) {
                *self.hooks.inner.lock().unwrap() = Some(pool.allocate(256, 0));
            }
            if self.hooks.panic_map.load(Ordering::SeqCst) {
                self.hooks.panic("map panics");
            }
            // SAFETY: the caller's guarantee, passed on.
            unsafe { self.inner.map(addr, chunk, count) }
        }
        unsafe fn unmap(&self, addr: u64, chunk: usize) -> Result<(), Error> {
            if self.hooks.panic_unmap.load(Ordering::SeqCst) {
                self.hooks.panic("unmap panics");
            }
            // SAFETY: the caller's guarantee, passed on.
            unsafe { self.inner.unmap(addr, chunk) }
        }
    }

    fn pool(eager_heaps: bool) -> (Arc<Pool>, Arc<Hooks>) {
        let hooks = Arc::new(Hooks::default());
        let vm = Vm {
            inner: HostVirtualMemory::new(4096).unwrap(),
            hooks: hooks.clone(),
        };
        let pool = Pool::builder(MIB)
            .name("flaky")
            .eager_thread_heaps(eager_heaps)
            .build_mapped(vm)
            .unwrap();
        (Arc::new(pool), hooks)
    }

    /// Runs `f` on a thread of its own and waits up to 10 s for it: a hang fails the test
    /// instead of stopping it.
    fn within_10s<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the call hung: the backend's call back into the pool waits for ever")
    }

    /// A panic in `map` is the allocation's error, and the pool loses nothing: the block goes
    /// back, and the whole capacity can be allocated afterwards. (Before, the panic unwound
    /// out of `allocate` with the block taken out of the free lists for good.)
    #[test]
    fn a_panic_in_map_fails_the_request_and_loses_nothing() {
        for eager_heaps in [false, true] {
            let (pool, hooks) = pool(eager_heaps);
            let small = pool.allocate(1000, 0).unwrap();
            let before = pool.stats();
            hooks.panic_map.store(true, Ordering::SeqCst);
            let err = pool.allocate(20_000, 0).unwrap_err();
            hooks.panic_map.store(false, Ordering::SeqCst);
            assert_eq!(
                err.to_string(),
                "pool `flaky`: the virtual-memory backend `flaky-vm` panicked \
                 in `map`: map panics",
                "heaps: {eager_heaps}"
            );
            let after = pool.stats();
            assert_eq!((after.in_use, after.live), (before.in_use, before.live));
            assert_eq!(after.mapped, before.mapped, "heaps: {eager_heaps}");
            pool.deallocate(small).unwrap();
            // Every byte is back: the whole capacity in one block.
            let whole = pool.allocate(MIB, 0).unwrap();
            pool.deallocate(whole).unwrap();
            let s = pool.stats();
            assert_eq!((s.free, s.in_use, s.live), (MIB, 0, 0), "{s}");
        }
    }

    /// A `map` that asks its pool for statistics: the call is abandoned and the allocation
    /// fails with why, instead of waiting for ever for the lock its own thread holds. A `map`
    /// that allocates gets an error and the allocation that called it goes on.
    #[test]
    fn a_map_that_calls_back_into_its_pool_gets_an_error_not_a_hang() {
        for eager_heaps in [false, true] {
            let (pool, hooks) = pool(eager_heaps);
            let _ = hooks.stats_from_map.set(Arc::downgrade(&pool));
            let p = pool.clone();
            let err = within_10s(move || p.allocate(20_000, 0)).unwrap_err();
            assert!(
                err.to_string().contains(
                    "pool `flaky` was asked for statistics from inside its own stream runtime's \
                     callback or virtual-memory backend"
                ),
                "{err}"
            );
            let s = pool.stats();
            assert_eq!((s.in_use, s.live, s.free), (0, 0, MIB), "{s}");
        }
        let (pool, hooks) = pool(false);
        let _ = hooks.allocate_from_map.set(Arc::downgrade(&pool));
        let p = pool.clone();
        let outer = within_10s(move || p.allocate(20_000, 0)).unwrap();
        let inner = hooks.inner.lock().unwrap().take().unwrap().unwrap_err();
        assert!(
            inner.to_string().contains(
                "pool `flaky` was called from its own stream runtime's callback or \
                           virtual-memory backend"
            ),
            "{inner}"
        );
        assert_eq!(pool.stats().live, 1);
        pool.deallocate(outer).unwrap();
    }

    /// A panic in `unmap` stops a trim with an error; the chunk stays mapped and counted, and
    /// the next trim gives it back.
    #[test]
    fn a_panic_in_unmap_stops_a_trim_with_an_error() {
        let (pool, hooks) = pool(false);
        let a = pool.allocate(100_000, 0).unwrap();
        pool.deallocate(a).unwrap();
        let mapped = pool.stats().mapped;
        assert!(mapped >= 100_000);
        hooks.panic_unmap.store(true, Ordering::SeqCst);
        let err = pool.trim().unwrap_err();
        hooks.panic_unmap.store(false, Ordering::SeqCst);
        assert!(
            err.to_string()
                .contains("panicked in `unmap`: unmap panics"),
            "{err}"
        );
        assert_eq!(pool.stats().mapped, mapped);
        assert_eq!(pool.trim().unwrap(), mapped);
        assert_eq!(pool.stats().mapped, 0);
    }

    /// A panic in `map` or `unmap` whose payload calls the pool back when it is dropped: the
    /// pool drops the payload while this thread still holds its lock (and, on a heap, the
    /// heap's), where a call back gets an error instead of waiting; the request or the trim
    /// fails with the backend's panic and the pool loses nothing. (Before, the payload was
    /// dropped after the call's callback frame had ended, and its allocation waited for ever
    /// for the lock its own thread held.)
    #[test]
    fn a_panic_payload_that_calls_back_when_dropped_gets_an_error_not_a_hang() {
        let called_back = "pool `flaky` was called from its own stream runtime's callback or \
                           virtual-memory backend";
        for eager_heaps in [false, true] {
            let (pool, hooks) = pool(eager_heaps);
            let _ = hooks.payload_calls_back.set(Arc::downgrade(&pool));
            hooks.panic_map.store(true, Ordering::SeqCst);
            let p = pool.clone();
            let err = within_10s(move || p.allocate(20_000, 0)).unwrap_err();
            hooks.panic_map.store(false, Ordering::SeqCst);
            assert!(err.to_string().contains("panicked in `map`"), "{err}");
            let got = hooks.payload_got.lock().unwrap().take();
            let inner = got.expect("the payload was dropped").unwrap_err();
            assert!(inner.to_string().contains(called_back), "{inner}");
            let s = pool.stats();
            assert_eq!((s.in_use, s.live, s.free), (0, 0, MIB), "{s}");
            let whole = pool.allocate(MIB, 0).unwrap();
            pool.deallocate(whole).unwrap();
        }
        let (pool, hooks) = pool(false);
        let _ = hooks.payload_calls_back.set(Arc::downgrade(&pool));
        let a = pool.allocate(100_000, 0).unwrap();
        pool.deallocate(a).unwrap();
        let mapped = pool.stats().mapped;
        hooks.panic_unmap.store(true, Ordering::SeqCst);
        let p = pool.clone();
        let err = within_10s(move || p.trim()).unwrap_err();
        hooks.panic_unmap.store(false, Ordering::SeqCst);
        assert!(err.to_string().contains("panicked in `unmap`"), "{err}");
        let got = hooks.payload_got.lock().unwrap().take();
        let inner = got.expect("the payload was dropped").unwrap_err();
        assert!(inner.to_string().contains(called_back), "{inner}");
        assert_eq!(pool.stats().mapped, mapped);
        assert_eq!(pool.trim().unwrap(), mapped);
        assert_eq!(pool.stats().mapped, 0);
    }

    /// A panic in `reserve` fails the build with an error.
    #[test]
    fn a_panic_in_reserve_fails_the_build() {
        let hooks = Arc::new(Hooks::default());
        hooks.panic_reserve.store(true, Ordering::SeqCst);
        let vm = Vm {
            inner: HostVirtualMemory::new(4096).unwrap(),
            hooks,
        };
        let err = Pool::builder(MIB)
            .name("flaky")
            .build_mapped(vm)
            .map(drop)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("panicked in `reserve`: reserve panics"),
            "{err}"
        );
    }
}

/// When the device has no memory left for new chunks, a request is served from mapped memory
/// that another thread's heap holds free before it fails: the heaps give their spans back once,
/// as before a refusal for capacity, and the request looks again. (Before, it failed with
/// `OutOfMemory` while a heap of a waiting thread held 8 MiB mapped and free.)
#[test]
fn out_of_device_memory_takes_mapped_memory_back_from_heaps_first() {
    for on_heap in [false, true] {
        let vm = Arc::new(HostVirtualMemory::new(CHUNK).unwrap());
        let pool = Pool::builder(64 * MIB)
            .name("oom-heaps")
            .eager_thread_heaps(true)
            .build_mapped(vm.clone())
            .unwrap();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        std::thread::scope(|s| {
            let pool = &pool;
            let other = s.spawn(move || {
                // Its heap maps 8 MiB for a block, which it frees and keeps.
                let a = pool.allocate(8 * MIB, 0).unwrap();
                pool.deallocate(a).unwrap();
                ready_tx.send(()).unwrap();
                let _ = release_rx.recv();
            });
            ready_rx.recv().unwrap();
            let mapped = pool.stats().mapped;
            assert!(mapped >= 8 * MIB);
            // No map succeeds from now on: only mapped memory can serve.
            vm.fail_maps(0, usize::MAX);
            let request = if on_heap {
                pool.allocate(4 * MIB, 0)
            } else {
                // This thread on the pool's own index (tracking sends it there).
                pool.set_tracking(Tracking::Tags);
                pool.allocate(4 * MIB, 0)
            };
            let addr = request.unwrap_or_else(|e| panic!("heaps: {on_heap}: {e}"));
            assert!(vm.is_mapped(addr, 4 * MIB));
            assert_eq!(pool.stats().mapped, mapped);
            pool.deallocate(addr).unwrap();
            vm.fail_maps(0, 0);
            drop(release_tx);
            other.join().unwrap();
        });
    }
}

/// When the device has no memory left for new chunks, a request is served by mapped free
/// memory wherever it lies: the index's search, which looks at sizes only, may pick a free
/// block whose chunks are not mapped while a mapped one elsewhere fits. (Before, the request
/// failed with `OutOfMemory` beside 8 MiB mapped and free.)
#[test]
fn out_of_device_memory_finds_mapped_free_memory_the_size_search_passed_by() {
    for (reuse, eager) in [(false, false), (true, false), (false, true), (true, true)] {
        let vm = Arc::new(HostVirtualMemory::new(CHUNK).unwrap());
        let mut builder = Pool::builder(12 * MIB)
            .name("oom-mapped")
            .eager_thread_heaps(eager);
        if !reuse {
            builder = builder.reuse(0, 0);
        }
        let pool = builder.build_mapped(vm.clone()).unwrap();
        // 8 MiB mapped and freed, then a small block after it: what is left at the end of the
        // region (about 4 MiB, its first chunk mapped) is the free block that the search for
        // 3 MiB picks, its size class being the smaller one.
        let a = pool.allocate(8 * MIB, 0).unwrap();
        let b = pool.allocate(256, 0).unwrap();
        pool.deallocate(a).unwrap();
        let mapped = pool.stats().mapped;
        vm.fail_maps(0, usize::MAX);
        let c = pool
            .allocate(3 * MIB, 0)
            .unwrap_or_else(|e| panic!("reuse {reuse} eager {eager}: {e}"));
        assert!(vm.is_mapped(c, 3 * MIB));
        assert!(
            c >= a && c + 3 * MIB as u64 <= a + 8 * MIB as u64,
            "{c:#x} {a:#x}"
        );
        assert_eq!(pool.stats().mapped, mapped);
        // The rest of the mapped block serves too, and then its last MiB.
        let d = pool.allocate(4 * MIB, 0).unwrap();
        assert!(vm.is_mapped(d, 4 * MIB));
        let e = pool.allocate(MIB, 0).unwrap();
        assert!(vm.is_mapped(e, MIB));
        // Nothing mapped holds another MiB: the error, and the pool as it was.
        let err = pool.allocate(MIB, 0).unwrap_err();
        assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
        assert_eq!(pool.stats().mapped, mapped);
        for x in [b, c, d, e] {
            pool.deallocate(x).unwrap();
        }
        vm.fail_maps(0, 0);
        let s = pool.stats();
        assert_eq!((s.in_use, s.live), (0, 0));
        let all = pool.allocate(12 * MIB, 0).unwrap();
        pool.deallocate(all).unwrap();
    }
}

/// The same where the capacity is not a multiple of the chunk: the refused block's last chunk
/// reaches past the capacity, into the reservation that holds no block, and is unmapped too.
/// (Before, it stayed mapped.)
#[test]
fn a_request_over_quota_on_a_thread_heap_maps_nothing_at_the_end_of_the_region() {
    // 11.75 chunks: a block of 4 chunks, then one of 7.75 (a size of its own class) to the end.
    let capacity = 47 * CHUNK / 4;
    let vm = Arc::new(HostVirtualMemory::new(CHUNK).unwrap());
    let pool = Pool::builder(capacity)
        .name("quota-heap-end")
        .eager_thread_heaps(true)
        .reuse(0, 0)
        .build_mapped(vm.clone())
        .unwrap();
    let client = pool.client("small", 8 * CHUNK);
    let keep = client.allocate(4 * CHUNK, 0).unwrap();
    let before = (vm.mapped_chunks(), pool.stats().mapped);
    let calls = vm.calls().len();
    let tail = capacity - 4 * CHUNK;
    assert_eq!(reserved_bytes(tail), Some(tail));
    let err = client.allocate(tail, 0).unwrap_err();
    assert!(
        matches!(&err, Error::PoolExhausted { limit, .. } if *limit == "quota"),
        "{err:?}"
    );
    let (maps, unmaps) = vm.calls()[calls..]
        .iter()
        .fold((0, 0), |(m, u), c| match c {
            VmCall::Map { .. } => (m + 1, u),
            VmCall::Unmap { .. } => (m, u + 1),
            _ => (m, u),
        });
    assert!(
        maps > 0,
        "the request mapped its block before the quota refused it"
    );
    assert_eq!(
        unmaps, 8,
        "chunks 4 to 11, the last one reaching past the capacity"
    );
    assert_eq!((vm.mapped_chunks(), pool.stats().mapped), before);
    client.deallocate(keep).unwrap();
    let all = pool.allocate(capacity, 0).unwrap();
    assert!(vm.is_mapped(all, capacity));
    pool.deallocate(all).unwrap();
}

/// Twelve blocks of 1 MiB on `pool`, every other one freed (6 MiB mapped and free, no 2 MiB
/// of it in one piece), then `vm`'s device made full at the 12 MiB mapped: the six blocks kept
/// and the six freed.
fn full_device_in_pieces(pool: &Pool, vm: &HostVirtualMemory) -> (Vec<u64>, Vec<u64>) {
    let blocks: Vec<u64> = (0..12).map(|_| pool.allocate(MIB, 0).unwrap()).collect();
    let kept = blocks.iter().copied().step_by(2).collect();
    let freed: Vec<u64> = blocks.iter().copied().skip(1).step_by(2).collect();
    for &b in &freed {
        pool.deallocate(b).unwrap();
    }
    assert_eq!(pool.stats().mapped, 12 * MIB);
    vm.set_memory_limit(Some(12 * MIB));
    (kept, freed)
}

/// A growable pool whose device has no memory left for a request gives the free chunks it
/// holds mapped back to the device and maps the request's: memory stranded in free blocks
/// that no single request can use serves, as a caching allocator empties its cache before it
/// fails. (Before, a 4 MiB request failed with `OutOfMemory` while the pool held 6 MiB mapped
/// and free, in pieces of 1 MiB.) The home stream is waited for first (queued work may still
/// use freed blocks); while it captures a graph, nothing is given back and the request fails.
#[test]
fn out_of_device_memory_gives_free_chunks_back_and_maps_the_request() {
    for (eager, reuse, with_streams) in [
        (false, false, false),
        (false, true, false),
        (true, true, false),
        (false, true, true),
        (true, false, true),
    ] {
        let case = format!("eager {eager} reuse {reuse} streams {with_streams}");
        let vm = Arc::new(HostVirtualMemory::new(CHUNK).unwrap());
        let streams = Arc::new(ManualStreams::new());
        let home = StreamId(7);
        let mut builder = Pool::builder(64 * MIB)
            .name("oom-trim")
            .eager_thread_heaps(eager);
        if !reuse {
            builder = builder.reuse(0, 0);
        }
        if with_streams {
            builder = builder.streams(streams.clone(), home);
        }
        let pool = builder.build_mapped(vm.clone()).unwrap();
        // 12 blocks of 1 MiB, every other one freed: 6 MiB mapped and free, no 2 MiB of it
        // in one piece. Then the device is full.
        let (kept, _) = full_device_in_pieces(&pool, &vm);
        let mut synced = streams.synchronized().len();
        if with_streams {
            // While the home stream captures, nothing is unmapped: the request fails.
            streams.begin_capture(home);
            let err = pool.allocate(4 * MIB, 0).unwrap_err();
            assert!(matches!(err, Error::OutOfMemory { .. }), "{case}: {err}");
            assert_eq!(pool.stats().mapped, 12 * MIB, "{case}");
            assert_eq!(streams.synchronized().len(), synced, "{case}");
            streams.end_capture(home);
            // Nor while the request's own stream captures (the capture's request waits for
            // the home stream's frees, as it does anyway, but nothing is unmapped).
            let side = StreamId(9);
            let unmaps = pool.stats().unmaps;
            streams.begin_capture(side);
            let err = pool
                .allocate_for_capture(AllocRequest::new(4 * MIB, 0).on(side))
                .unwrap_err();
            assert!(matches!(err, Error::OutOfMemory { .. }), "{case}: {err}");
            let s = pool.stats();
            assert_eq!((s.mapped, s.unmaps), (12 * MIB, unmaps), "{case}");
            streams.end_capture(side);
            synced = streams.synchronized().len();
        }
        let big = pool
            .allocate(4 * MIB, 0)
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        assert!(vm.is_mapped(big, 4 * MIB), "{case}");
        // The free chunks went back: 6 MiB live and the new 4 MiB mapped.
        let s = pool.stats();
        assert_eq!((s.mapped, s.in_use), (10 * MIB, 10 * MIB), "{case}");
        assert!(s.unmaps >= 6 * MIB as u64 / CHUNK as u64, "{case}: {s:?}");
        if with_streams {
            assert_eq!(streams.synchronized()[synced..], [home], "{case}");
        }
        // The live blocks kept their memory.
        for &b in &kept {
            assert!(vm.is_mapped(b, MIB), "{case}");
        }
        // What the device cannot hold even so still fails, and the pool goes on. Every mapped
        // chunk is live: nothing to give back, so the request waits for no stream.
        let synced = streams.synchronized().len();
        let err = pool.allocate(4 * MIB, 0).unwrap_err();
        assert!(matches!(err, Error::OutOfMemory { .. }), "{case}: {err}");
        assert_eq!(streams.synchronized().len(), synced, "{case}");
        assert_eq!(
            pool.stats().failures,
            1 + 2 * u64::from(with_streams),
            "{case}"
        );
        let small = pool.allocate(MIB, 0).unwrap();
        assert!(vm.is_mapped(small, MIB), "{case}");
        for b in kept.into_iter().chain([big, small]) {
            pool.deallocate(b).unwrap();
        }
        vm.set_memory_limit(None);
        let s = pool.stats();
        assert_eq!((s.in_use, s.live), (0, 0), "{case}");
        let all = pool.allocate(64 * MIB, 0).unwrap();
        pool.deallocate(all).unwrap();
    }
}

/// What the trim for a request may not touch: a graph reservation's blocks (one freed during
/// the capture and held, one live, then the held one parked until the graph's event) and a
/// block freed on another stream whose event is pending all stay mapped while the request's
/// trim gives the free chunks around them back.
#[test]
fn out_of_device_memory_gives_back_no_chunk_of_a_graph_or_a_parked_block() {
    for eager in [false, true] {
        let vm = Arc::new(HostVirtualMemory::new(CHUNK).unwrap());
        let streams = Arc::new(ManualStreams::new());
        let (home, g, other) = (StreamId(1), StreamId(2), StreamId(3));
        let pool = Pool::builder(64 * MIB)
            .eager_thread_heaps(eager)
            .streams(streams.clone(), home)
            .log_leaks_on_drop(false)
            .build_mapped(vm.clone())
            .unwrap();
        let graph = pool.graph_reservation(g).unwrap();
        streams.begin_capture(g);
        let held = graph.allocate(MIB, 0).unwrap();
        let live = graph.allocate(MIB, 0).unwrap();
        pool.deallocate_on(held, g).unwrap();
        streams.end_capture(g);
        let blocks: Vec<u64> = (0..10).map(|_| pool.allocate(MIB, 0).unwrap()).collect();
        let parked = blocks[1];
        pool.deallocate_on(parked, other).unwrap();
        for &b in blocks.iter().skip(3).step_by(2) {
            pool.deallocate(b).unwrap();
        }
        vm.set_memory_limit(Some(pool.stats().mapped));
        let big = pool.allocate(4 * MIB, 0).unwrap();
        assert!(pool.stats().unmaps > 0, "eager {eager}");
        for b in [held, live, parked] {
            assert!(vm.is_mapped(b, MIB), "eager {eager}: {b:#x} unmapped");
        }
        // Released, the held block parks until the graph's event: still mapped after a trim
        // for another request and a failure.
        graph.release().unwrap();
        pool.deallocate(big).unwrap();
        let big = pool.allocate(4 * MIB, 0).unwrap();
        assert!(pool.allocate(5 * MIB, 0).is_err());
        for b in [held, live, parked] {
            assert!(vm.is_mapped(b, MIB), "eager {eager}: {b:#x} unmapped");
        }
        let s = pool.stats();
        assert_eq!(
            (s.mapped, s.failures),
            (vm.mapped_bytes(), 1),
            "eager {eager}"
        );
        pool.deallocate(big).unwrap();
        pool.deallocate_on(live, g).unwrap();
        for &b in blocks.iter().step_by(2) {
            pool.deallocate(b).unwrap();
        }
        streams.complete_all();
        pool.reclaim().unwrap();
        vm.set_memory_limit(None);
        let s = pool.stats();
        assert_eq!((s.in_use, s.live, s.pending), (0, 0, 0), "{s:?}");
    }
}

/// A stream runtime whose home stream runs host functions (as `cuLaunchHostFunc` does):
/// `synchronize` waits for another thread to run what was queued. The functions hold the pool
/// and this runtime weakly (the pool holds the runtime: a strong reference in its queue would
/// make a cycle that keeps both alive after the test, which LeakSanitizer reports).
struct HostFunctions {
    inner: ManualStreams,
    queue: Mutex<Vec<Box<dyn FnOnce() + Send>>>,
    /// How many times `synchronize` was called.
    waits: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for HostFunctions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostFunctions")
    }
}

impl StreamSync for HostFunctions {
    fn record(&self, stream: StreamId) -> Result<Box<dyn StreamEvent>, Error> {
        self.inner.record(stream)
    }
    fn order_after(&self, waiter: StreamId, producer: StreamId) -> Result<(), Error> {
        self.inner.order_after(waiter, producer)
    }
    fn is_capturing(&self, stream: StreamId) -> Result<bool, Error> {
        self.inner.is_capturing(stream)
    }
    fn synchronize(&self, stream: StreamId) -> Result<(), Error> {
        self.waits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let work: Vec<_> = std::mem::take(&mut *self.queue.lock().unwrap());
        if !work.is_empty() {
            std::thread::spawn(move || work.into_iter().for_each(|f| f()))
                .join()
                .unwrap();
        }
        self.inner.synchronize(stream)
    }
}

/// A [`HostFunctions`] runtime with nothing queued.
fn host_functions() -> Arc<HostFunctions> {
    Arc::new(HostFunctions {
        inner: ManualStreams::new(),
        queue: Mutex::new(Vec::new()),
        waits: std::sync::atomic::AtomicUsize::new(0),
    })
}

/// The trim for a request that found the device full waits for the home stream without the
/// pool's lock, as `trim` does: a host function queued there that frees a block runs. (Before,
/// the wait was made with the lock held and the host function waited for it for ever.)
#[test]
fn out_of_device_memory_waits_for_the_home_stream_without_the_lock() {
    let vm = Arc::new(HostVirtualMemory::new(CHUNK).unwrap());
    let rt = host_functions();
    let pool = Arc::new(
        Pool::builder(64 * MIB)
            .streams(rt.clone(), StreamId(1))
            .log_leaks_on_drop(false)
            .build_mapped(vm.clone())
            .unwrap(),
    );
    let (kept, _) = full_device_in_pieces(&pool, &vm);
    let (p, x) = (Arc::downgrade(&pool), kept[1]);
    rt.queue.lock().unwrap().push(Box::new(move || {
        if let Some(p) = p.upgrade() {
            p.deallocate(x).unwrap();
        }
    }));
    let p = pool.clone();
    let r = within(10, move || {
        p.allocate(6 * MIB, 0).map_err(|e| e.to_string())
    });
    let addr = r
        .expect("the request's trim never returned: its host function waits for the pool's lock")
        .unwrap();
    assert!(vm.is_mapped(addr, 6 * MIB));
    let s = pool.stats();
    assert_eq!((s.live, s.failures), (6 - 1 + 1, 0));
}

/// Queues on `rt`'s home stream a host function that frees `blocks[0]` there and queues the
/// next one, for the rest: every wait for the home stream runs one of them, which frees.
fn queue_frees_in_turn(rt: &Arc<HostFunctions>, pool: &Arc<Pool>, blocks: Vec<u64>) {
    let Some((&first, rest)) = blocks.split_first() else {
        return;
    };
    let (next_rt, p, rest) = (Arc::downgrade(rt), Arc::downgrade(pool), rest.to_vec());
    rt.queue.lock().unwrap().push(Box::new(move || {
        let (Some(next_rt), Some(p)) = (next_rt.upgrade(), p.upgrade()) else {
            return;
        };
        p.deallocate(first).unwrap();
        queue_frees_in_turn(&next_rt, &p, rest);
    }));
}

/// A trim while frees on the home stream keep coming (a host function queued there frees a
/// block, and queues another that does the same) never waits for the home stream with the
/// pool's lock held: those frees are parked behind an event on the home stream while the trim
/// waits, so the trim does not have to look again. (Before, each free sent the trim round
/// again, and after three tries it waited with the lock held; the host function then waited
/// for the lock for ever.) The chunks free when the wait began go back; the blocks freed
/// during it come back once their events complete, and the next trim gives them back too.
#[test]
fn a_trim_while_the_home_stream_keeps_freeing_never_waits_with_the_lock_held() {
    let vm = Arc::new(HostVirtualMemory::new(CHUNK).unwrap());
    let rt = host_functions();
    let pool = Arc::new(
        Pool::builder(64 * MIB)
            .streams(rt.clone(), StreamId(1))
            .reuse(0, 0)
            .log_leaks_on_drop(false)
            .build_mapped(vm.clone())
            .unwrap(),
    );
    // Six live blocks of one chunk each, a seventh freed: one chunk free to give back.
    let blocks: Vec<u64> = (0..7).map(|_| pool.allocate(CHUNK, 0).unwrap()).collect();
    pool.deallocate(blocks[6]).unwrap();
    queue_frees_in_turn(&rt, &pool, blocks[..6].to_vec());
    let p = pool.clone();
    let trimmed = within(10, move || p.trim().map_err(|e| e.to_string()))
        .expect("the trim never returned: it waited for the home stream with the lock held");
    assert_eq!(trimmed.unwrap(), CHUNK);
    assert!(!vm.is_mapped(blocks[6], CHUNK));
    // The block freed while the trim waited: parked until its event on the home stream (which
    // the wait completed) and reclaimed, not unmapped under queued work.
    assert!(vm.is_mapped(blocks[0], CHUNK));
    let s = pool.stats();
    assert_eq!((s.live, s.pending), (5, CHUNK));
    // Each later trim runs one more host function; in the end every block is freed and every
    // chunk given back.
    let p = pool.clone();
    let rest = within(10, move || {
        let mut unmapped = 0;
        for _ in 0..8 {
            unmapped += p.trim().unwrap();
        }
        unmapped
    })
    .expect("a later trim never returned");
    assert_eq!(rest, 6 * CHUNK);
    let s = pool.stats();
    assert_eq!((s.live, s.pending, s.mapped), (0, 0, 0));
}

/// A graph's allocation on another stream first waits for the home stream past its frees
/// (so that the capturing stream need not wait for it). While frees on the home stream keep
/// coming from host functions queued there, that wait is still made without the pool's lock:
/// the frees made during it park behind an event on the home stream. (Before, each one sent
/// the wait round again, and the third was made with the lock held: the host function then
/// waited for the lock for ever.)
#[test]
fn a_graph_allocation_while_the_home_stream_keeps_freeing_never_waits_with_the_lock_held() {
    let rt = host_functions();
    let pool = Arc::new(
        Pool::builder(MIB)
            .streams(rt.clone(), StreamId(1))
            .reuse(0, 0)
            .log_leaks_on_drop(false)
            .build_host()
            .unwrap(),
    );
    let graph = pool.graph_reservation(StreamId(2)).unwrap();
    let blocks: Vec<u64> = (0..6).map(|_| pool.allocate(4 * KIB, 0).unwrap()).collect();
    pool.deallocate(blocks[5]).unwrap();
    queue_frees_in_turn(&rt, &pool, blocks[..5].to_vec());
    let allocated = within(10, move || {
        let addr = graph.allocate(4 * KIB, 0).map_err(|e| e.to_string());
        (addr, graph)
    })
    .expect(
        "the graph's allocation never returned: it waited for the home stream with the lock held",
    );
    let (addr, graph) = allocated;
    // A block freed before the wait, or the one freed during it, whose event the wait
    // completed.
    let addr = addr.unwrap();
    assert!(addr == blocks[5] || addr == blocks[0], "{addr:#x}");
    assert_eq!(pool.stats().live, 5);
    drop(graph);
}

/// A graph's allocation during its capture that finds the pool's index full gives the thread
/// heaps back; blocks freed on the home stream reach the index that way, and the capturing
/// stream, which cannot wait for the home stream, needs the host to wait for it. That wait is
/// made once the pool's lock is released, and the request made again: a host function queued
/// on the home stream that frees a block runs. (Before, the wait was made with the lock held:
/// the host function waited for the lock, and the allocation never returned.)
#[test]
fn a_capture_allocation_that_gives_heaps_back_waits_for_the_home_stream_without_the_lock() {
    const HOME: StreamId = StreamId(1);
    const GRAPH: StreamId = StreamId(7);
    // Everything on a thread of its own (its heap's destructor would wait for the lock too).
    let r = within(10, || {
        let rt = host_functions();
        let pool = Arc::new(
            Pool::builder(64 * KIB)
                .streams(rt.clone(), HOME)
                .thread_heaps(MIB)
                .eager_thread_heaps(true)
                .log_leaks_on_drop(false)
                .build_host()
                .unwrap(),
        );
        // A block of the pool's own index that a host function on the home stream frees.
        let x = pool
            .allocate_for_capture(devarena::pool::AllocRequest::new(4096, 0).on(HOME))
            .unwrap();
        // This thread's home heap takes spans and keeps their blocks free after the frees.
        let mine: Vec<u64> = (0..48).map(|_| pool.allocate(1024, 0).unwrap()).collect();
        for a in mine {
            pool.deallocate(a).unwrap();
        }
        let graph = pool.graph_reservation(GRAPH).unwrap();
        rt.inner.begin_capture(GRAPH);
        let p = Arc::downgrade(&pool);
        rt.queue.lock().unwrap().push(Box::new(move || {
            if let Some(p) = p.upgrade() {
                p.deallocate(x).unwrap();
            }
        }));
        // Needs the heap's spans back: the index alone cannot serve it.
        let r = graph.allocate(40 * KIB, 0).map_err(|e| e.to_string());
        rt.inner.end_capture(GRAPH);
        let s = pool.stats();
        (r, s.live, s.failures, rt.inner.refused())
    });
    let (r, live, failures, refused) = r.expect(
        "the graph's allocation never returned: it waited for the home stream with the lock \
         held, and the host function queued there waited for the lock",
    );
    assert!(r.is_ok(), "{r:?}");
    // The graph's block alone is live (the host function freed `x`); nothing failed, and
    // nothing was asked of the capturing stream.
    assert_eq!((live, failures), (1, 0));
    assert!(refused.is_empty(), "{refused:?}");
}

/// Queues on `rt`'s home stream `n` host functions in turn, each of which runs a thread that
/// allocates and frees on the home stream through a heap of its own and ends: its heap's free
/// blocks reach the pool's index as the thread ends, without an event of their own.
fn queue_heap_give_backs(rt: &Arc<HostFunctions>, pool: &Arc<Pool>, n: usize) {
    if n == 0 {
        return;
    }
    let (next_rt, p) = (Arc::downgrade(rt), Arc::downgrade(pool));
    rt.queue.lock().unwrap().push(Box::new(move || {
        let (Some(next_rt), Some(p)) = (next_rt.upgrade(), p.upgrade()) else {
            return;
        };
        let q = p.clone();
        std::thread::spawn(move || {
            let a = q.allocate(1024, 0).unwrap();
            q.deallocate(a).unwrap();
        })
        .join()
        .unwrap();
        queue_heap_give_backs(&next_rt, &p, n - 1);
    }));
}

/// Queues on `rt`'s home stream `n` host functions in turn, each of which frees a block of
/// `bytes` on the home stream and then asks for `bytes` there again, which the pool of
/// `pool_bytes` serves only with that block: during a wait for the home stream the free
/// parks the block behind an event there, and the request takes it back at once (the home
/// stream's own order covers the reuse), without an event of its own.
fn queue_home_take_backs(rt: &Arc<HostFunctions>, pool: &Arc<Pool>, n: usize, bytes: usize) {
    if n == 0 {
        return;
    }
    let (next_rt, p) = (Arc::downgrade(rt), Arc::downgrade(pool));
    rt.queue.lock().unwrap().push(Box::new(move || {
        let (Some(next_rt), Some(p)) = (next_rt.upgrade(), p.upgrade()) else {
            return;
        };
        let a = p.allocate(bytes, 0).unwrap();
        p.deallocate(a).unwrap();
        let b = p.allocate(bytes, 0).unwrap();
        p.deallocate(b).unwrap();
        queue_home_take_backs(&next_rt, &p, n - 1, bytes);
    }));
}

/// What [`capture_allocation_overtaken`] returns.
struct Overtaken {
    /// The graph's allocation (its error as text).
    result: Result<u64, String>,
    /// The pool's failures.
    failures: u64,
    /// What the capturing stream was refused.
    refused: Vec<(&'static str, StreamId)>,
    /// How many times the home stream was waited for.
    waits: usize,
}

/// A graph's allocation, waiting for the home stream (outside the lock) after a free there,
/// with its wait made `overtaken` (see below) each time by work queued on the home stream;
/// the result, the pool's failures, what the capturing stream was refused and how many
/// times the home stream was waited for.
fn capture_allocation_overtaken(
    overtaken: impl FnOnce(&Arc<HostFunctions>, &Arc<Pool>) + Send + 'static,
    builder: devarena::pool::PoolBuilder,
) -> Overtaken {
    const HOME: StreamId = StreamId(1);
    const GRAPH: StreamId = StreamId(7);
    let r = within(10, || {
        let rt = host_functions();
        let pool = Arc::new(
            builder
                .streams(rt.clone(), HOME)
                .log_leaks_on_drop(false)
                .build_host()
                .unwrap(),
        );
        let graph = pool.graph_reservation(GRAPH).unwrap();
        // A free on the home stream, of a block of the pool's own index, that the capture has
        // not waited for yet.
        let x = pool
            .allocate_for_capture(devarena::pool::AllocRequest::new(4096, 0).on(HOME))
            .unwrap();
        pool.deallocate(x).unwrap();
        overtaken(&rt, &pool);
        rt.inner.begin_capture(GRAPH);
        let r = graph.allocate(4096, 0).map_err(|e| e.to_string());
        rt.inner.end_capture(GRAPH);
        let waits = rt.waits.load(std::sync::atomic::Ordering::SeqCst);
        Overtaken {
            result: r,
            failures: pool.stats().failures,
            refused: rt.inner.refused(),
            waits,
        }
    });
    r.expect("the graph's allocation never returned: it waited with the lock held")
}

/// A graph's allocation whose wait for the home stream (outside the lock) is overtaken, each
/// of three times, by blocks freed there that the home stream takes back for requests that
/// would fail without them fails with an error rather than waiting a fourth time with the
/// pool's lock held.
#[test]
fn a_capture_allocation_whose_waits_keep_being_overtaken_fails_instead_of_waiting_locked() {
    let Overtaken {
        result: r,
        failures,
        refused,
        waits,
    } = capture_allocation_overtaken(
        |rt, pool| queue_home_take_backs(rt, pool, 8, 768 * KIB),
        Pool::builder(MIB).thread_heaps(0),
    );
    let error = r.unwrap_err();
    assert!(error.contains("kept reaching the pool"), "{error}");
    assert_eq!((failures, waits), (1, 3));
    assert!(refused.is_empty(), "{refused:?}");
}

/// Thread heaps given back during the waits of a graph's allocation (their threads exit,
/// eight times over) park their free blocks behind an event on the home stream instead of
/// overtaking the wait: the allocation is served after one wait. (Before, it failed after
/// three.)
#[test]
fn a_capture_allocation_is_served_while_heaps_are_given_back_during_its_wait() {
    let Overtaken {
        result: r,
        failures,
        refused,
        waits,
    } = capture_allocation_overtaken(
        |rt, pool| queue_heap_give_backs(rt, pool, 8),
        Pool::builder(MIB).eager_thread_heaps(true),
    );
    r.unwrap();
    assert_eq!((failures, waits), (0, 1));
    assert!(refused.is_empty(), "{refused:?}");
}

/// A pool on a growable region of 64 MiB with the stream runtime `rt` (home stream 1), as
/// `builder` makes it, with a block of four chunks allocated and freed.
fn trim_pool(rt: &Arc<HostFunctions>, builder: devarena::pool::PoolBuilder) -> Arc<Pool> {
    let vm = Arc::new(HostVirtualMemory::new(CHUNK).unwrap());
    let pool = Arc::new(
        builder
            .streams(rt.clone(), StreamId(1))
            .log_leaks_on_drop(false)
            .build_mapped(vm)
            .unwrap(),
    );
    let a = pool.allocate(4 * CHUNK, 0).unwrap();
    pool.deallocate(a).unwrap();
    pool
}

/// A trim whose waits for the home stream are overtaken, each of three times, by blocks freed
/// there that the home stream takes back for requests that would fail without them gives up
/// (unmaps nothing) rather than waiting a fourth time with the pool's lock held; the next
/// trim, with nothing overtaking it, gives the free chunks back.
#[test]
fn a_trim_whose_waits_keep_being_overtaken_gives_up_instead_of_waiting_locked() {
    let rt = host_functions();
    let pool = trim_pool(&rt, Pool::builder(64 * MIB).thread_heaps(0));
    queue_home_take_backs(&rt, &pool, 3, 48 * MIB);
    let p = pool.clone();
    let trimmed = within(10, move || p.trim().map_err(|e| e.to_string()))
        .expect("the trim never returned: it waited for the home stream with the lock held");
    assert_eq!(trimmed.unwrap(), 0);
    assert!(rt.queue.lock().unwrap().is_empty());
    let p = pool.clone();
    let trimmed = within(10, move || p.trim().unwrap()).expect("the second trim never returned");
    assert!(trimmed >= 4 * CHUNK, "{trimmed}");
    assert_eq!(pool.stats().live, 0);
}

/// A thread heap given back during a trim's wait (its thread exits) parks its free blocks
/// behind an event on the home stream instead of overtaking the wait: the trim waits once and
/// unmaps what was free when its wait began (before, it looked again, three times, and gave
/// up); what the heap gave back comes back once its event completes, and a later trim gives
/// it back too.
#[test]
fn a_trim_waits_once_while_heaps_are_given_back_during_its_wait() {
    let rt = host_functions();
    let pool = trim_pool(&rt, Pool::builder(64 * MIB).eager_thread_heaps(true));
    queue_heap_give_backs(&rt, &pool, 3);
    let p = pool.clone();
    let first = within(10, move || p.trim().map_err(|e| e.to_string()))
        .expect("the trim never returned: it waited for the home stream with the lock held")
        .unwrap();
    let waits = rt.waits.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(waits, 1, "the trim waited {waits} times");
    let parked = pool.stats().pending;
    assert!(parked > 0, "nothing the heap gave back was parked");
    pool.reclaim().unwrap();
    let mut trimmed = first;
    while !rt.queue.lock().unwrap().is_empty() {
        trimmed += pool.trim().unwrap();
        pool.reclaim().unwrap();
    }
    trimmed += pool.trim().unwrap();
    assert!(trimmed >= 4 * CHUNK, "{trimmed}");
    let s = pool.stats();
    assert_eq!((s.live, s.pending, s.mapped), (0, 0, 0), "{s:?}");
}

/// How [`Flaky`]'s `synchronize` or `is_capturing` misbehaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Misbehaviour {
    None,
    SyncFails,
    SyncPanics,
    SyncReadsStats,
    SyncAllocates,
    CaptureQueryFails,
    CaptureQueryPanics,
}

/// A stream runtime that misbehaves on demand; what it allocated from its pool.
#[derive(Debug)]
struct Flaky {
    inner: ManualStreams,
    how: Mutex<Misbehaviour>,
    pool: Mutex<Option<devarena::PoolClient>>,
    allocated: Mutex<Vec<u64>>,
}

impl StreamSync for Flaky {
    fn record(&self, stream: StreamId) -> Result<Box<dyn StreamEvent>, Error> {
        self.inner.record(stream)
    }
    fn order_after(&self, waiter: StreamId, producer: StreamId) -> Result<(), Error> {
        self.inner.order_after(waiter, producer)
    }
    fn is_capturing(&self, stream: StreamId) -> Result<bool, Error> {
        let how = *self.how.lock().unwrap();
        match how {
            Misbehaviour::CaptureQueryFails => Err(Error::InvalidArgument {
                what: "is_capturing failed (test)".into(),
            }),
            Misbehaviour::CaptureQueryPanics => panic!("is_capturing panicked (test)"),
            _ => self.inner.is_capturing(stream),
        }
    }
    fn synchronize(&self, stream: StreamId) -> Result<(), Error> {
        let client = self.pool.lock().unwrap().clone();
        let how = *self.how.lock().unwrap();
        match how {
            Misbehaviour::SyncFails => {
                return Err(Error::InvalidArgument {
                    what: "synchronize failed (test)".into(),
                });
            }
            Misbehaviour::SyncPanics => panic!("synchronize panicked (test)"),
            Misbehaviour::SyncReadsStats => {
                let _ = client.map(|c| c.pool_stats());
            }
            Misbehaviour::SyncAllocates => {
                if let Some(Ok(a)) = client.map(|c| c.allocate(256, 0)) {
                    self.allocated.lock().unwrap().push(a);
                }
            }
            _ => {}
        }
        self.inner.synchronize(stream)
    }
}

/// A stream runtime that fails, panics or calls back into the pool while a request's trim
/// waits for the home stream: the request is served where the trim could be made, and fails
/// with `OutOfMemory` where not (never with the runtime's error), one failure counted, the
/// pool consistent and serving.
#[test]
fn a_stream_runtime_that_misbehaves_during_the_trim_leaves_the_request_its_own_error() {
    for eager in [false, true] {
        for how in [
            Misbehaviour::SyncFails,
            Misbehaviour::SyncPanics,
            Misbehaviour::SyncReadsStats,
            Misbehaviour::SyncAllocates,
            Misbehaviour::CaptureQueryFails,
            Misbehaviour::CaptureQueryPanics,
        ] {
            let case = format!("eager {eager} {how:?}");
            let vm = Arc::new(HostVirtualMemory::new(CHUNK).unwrap());
            let rt = Arc::new(Flaky {
                inner: ManualStreams::new(),
                how: Mutex::new(Misbehaviour::None),
                pool: Mutex::new(None),
                allocated: Mutex::new(Vec::new()),
            });
            let pool = Pool::builder(64 * MIB)
                .eager_thread_heaps(eager)
                .streams(rt.clone(), StreamId(1))
                .log_leaks_on_drop(false)
                .build_mapped(vm.clone())
                .unwrap();
            *rt.pool.lock().unwrap() = Some(pool.own_client().clone());
            let (kept, _) = full_device_in_pieces(&pool, &vm);
            let before = pool.stats();
            *rt.how.lock().unwrap() = how;
            let result = pool.allocate(4 * MIB, 0);
            *rt.how.lock().unwrap() = Misbehaviour::None;
            let after = pool.stats();
            match &result {
                Ok(a) => assert!(vm.is_mapped(*a, 4 * MIB), "{case}"),
                Err(Error::OutOfMemory { .. }) => {
                    assert_eq!(after.failures, before.failures + 1, "{case}")
                }
                Err(other) => panic!("{case}: the runtime's error reached the request: {other}"),
            }
            // Served where the trim could wait for the home stream.
            let served = matches!(
                how,
                Misbehaviour::SyncReadsStats | Misbehaviour::SyncAllocates
            );
            assert_eq!(result.is_ok(), served, "{case}: {result:?}");
            assert_eq!(after.mapped, vm.mapped_bytes(), "{case}");
            for &b in &kept {
                assert!(vm.is_mapped(b, MIB), "{case}");
            }
            let mut extra: Vec<u64> = std::mem::take(&mut *rt.allocated.lock().unwrap());
            extra.extend(result.ok());
            for b in extra {
                pool.deallocate(b).unwrap();
            }
            // With the runtime well again, the request is served.
            let big = pool
                .allocate(4 * MIB, 0)
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            pool.deallocate(big).unwrap();
            *rt.pool.lock().unwrap() = None;
            for b in kept {
                pool.deallocate(b).unwrap();
            }
            let s = pool.stats();
            assert_eq!(
                (s.in_use, s.live, s.mapped),
                (0, 0, vm.mapped_bytes()),
                "{case}"
            );
        }
    }
}

/// With an event sink: a request whose trim waits for the home stream logs one allocation
/// when it is served after the trim and one failure when it is not, never both, and the
/// events of the frees before it come first.
#[test]
fn a_request_served_after_the_trim_logs_no_failure() {
    let (seen, sink) = recording_sink();
    let vm = Arc::new(HostVirtualMemory::new(CHUNK).unwrap());
    let streams = Arc::new(ManualStreams::new());
    let pool = Pool::builder(64 * MIB)
        .events(sink.clone())
        .streams(streams.clone(), StreamId(1))
        .build_mapped(vm.clone())
        .unwrap();
    let (kept, _) = full_device_in_pieces(&pool, &vm);
    seen.lock().unwrap().clear();
    let big = pool.allocate(4 * MIB, 0).unwrap();
    assert_eq!(*seen.lock().unwrap(), [(PoolAction::Allocate, None)]);
    assert_eq!(pool.stats().failures, 0);
    // Nothing left to give back: one failure, logged once.
    seen.lock().unwrap().clear();
    let err = pool.allocate(8 * MIB, 0).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
    let log = seen.lock().unwrap().clone();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0].0, PoolAction::AllocateFailure);
    assert_eq!(pool.stats().failures, 1);
    pool.deallocate(big).unwrap();
    for b in kept {
        pool.deallocate(b).unwrap();
    }
}

/// An event sink that calls the pool while it takes the event of a request served after its
/// trim: the sink's own request, on a full device, gets a trim of its own. (Before, it was
/// still taken for the request made again, failed at once and was counted.)
#[test]
fn a_sinks_request_during_a_request_made_again_gets_its_own_trim() {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicBool, Ordering};

    // The pool weakly: the pool holds its sink, and a strong reference would make a cycle
    // that keeps the pool alive after the test (LeakSanitizer reports it).
    let pool_cell: Arc<OnceLock<std::sync::Weak<Pool>>> = Arc::new(OnceLock::new());
    let kept_cell: Arc<OnceLock<Vec<u64>>> = Arc::new(OnceLock::new());
    let armed = Arc::new(AtomicBool::new(false));
    let got: Arc<Mutex<Option<Result<u64, Error>>>> = Arc::default();
    let sink = {
        let (pool_cell, kept_cell, armed, got) = (
            pool_cell.clone(),
            kept_cell.clone(),
            armed.clone(),
            got.clone(),
        );
        move |e: &PoolEvent<'_>| {
            if e.action == PoolAction::Allocate
                && e.size == 6 * MIB
                && armed.swap(false, Ordering::SeqCst)
            {
                let pool = pool_cell.get().and_then(std::sync::Weak::upgrade).unwrap();
                let kept = kept_cell.get().unwrap();
                pool.deallocate(kept[1]).unwrap();
                pool.deallocate(kept[2]).unwrap();
                *got.lock().unwrap() = Some(pool.allocate(2 * MIB, 0));
            }
        }
    };
    let vm = Arc::new(HostVirtualMemory::new(CHUNK).unwrap());
    let pool = Arc::new(
        Pool::builder(64 * MIB)
            .streams(Arc::new(ManualStreams::new()), StreamId(1))
            .events(Arc::new(sink))
            .log_leaks_on_drop(false)
            .build_mapped(vm.clone())
            .unwrap(),
    );
    let (kept, _) = full_device_in_pieces(&pool, &vm);
    let _ = pool_cell.set(Arc::downgrade(&pool));
    let _ = kept_cell.set(kept);
    armed.store(true, Ordering::SeqCst);
    // Served after its trim: 6 MiB live and 6 MiB mapped for it, the device full.
    let big = pool.allocate(6 * MIB, 0).unwrap();
    let theirs = got.lock().unwrap().take().expect("the sink ran");
    let theirs = theirs.unwrap_or_else(|e| panic!("the sink's request: {e}"));
    assert!(vm.is_mapped(theirs, 2 * MIB) && vm.is_mapped(big, 6 * MIB));
    assert_eq!(pool.stats().failures, 0);
}

/// The error of a panicking backend call names the backend: asked for its name there,
/// outside the catch, a backend whose `name` then panics too (its state poisoned by the panic
/// in `map`, say) unwound out of `allocate` with the block taken out of the free lists. The
/// name is asked once, when the region is reserved.
mod a_backend_whose_name_panics {
    use super::*;
    use devarena::backend::MemoryKind;
    use std::sync::atomic::{AtomicBool, Ordering};

    struct Vm {
        inner: HostVirtualMemory,
        broken: AtomicBool,
    }

    // SAFETY: every call that maps, unmaps or reserves is the host stand-in's; `map` panics
    // before it maps anything.
    unsafe impl VirtualMemory for Vm {
        fn name(&self) -> &'static str {
            if self.broken.swap(false, Ordering::SeqCst) {
                panic!("name panics once its state is poisoned");
            }
            "poisoned-vm"
        }
        fn memory(&self) -> MemoryKind {
            self.inner.memory()
        }
        fn granularity(&self) -> usize {
            self.inner.granularity()
        }
        fn reserve(&self, bytes: usize) -> Result<u64, Error> {
            self.inner.reserve(bytes)
        }
        unsafe fn free_reservation(&self, base: u64, bytes: usize) -> Result<(), Error> {
            // SAFETY: passed on.
            unsafe { self.inner.free_reservation(base, bytes) }
        }
        unsafe fn map(&self, addr: u64, chunk: usize, count: usize) -> Result<(), Error> {
            if count > 1 && !self.broken.load(Ordering::SeqCst) && addr != 0 {
                // Only the first large map panics (and poisons `name`).
                static ONCE: AtomicBool = AtomicBool::new(false);
                if !ONCE.swap(true, Ordering::SeqCst) {
                    self.broken.store(true, Ordering::SeqCst);
                    panic!("map panics");
                }
            }
            // SAFETY: passed on.
            unsafe { self.inner.map(addr, chunk, count) }
        }
        unsafe fn unmap(&self, addr: u64, chunk: usize) -> Result<(), Error> {
            // SAFETY: passed on.
            unsafe { self.inner.unmap(addr, chunk) }
        }
    }

    /// Asked at the build, through the same catch: a `name` that panics is an error of the
    /// build, not an unwind out of it.
    #[test]
    fn a_name_that_panics_at_the_build_is_an_error() {
        let vm = Vm {
            inner: HostVirtualMemory::new(4096).unwrap(),
            broken: AtomicBool::new(true),
        };
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Pool::builder(MIB).build_mapped(vm).map(drop)
        }));
        let err = built.expect("the build unwound").unwrap_err();
        assert!(err.to_string().contains("panicked in `name`"), "{err}");
    }

    #[test]
    fn a_name_that_panics_after_a_map_panic_loses_no_block() {
        let vm = Vm {
            inner: HostVirtualMemory::new(4096).unwrap(),
            broken: AtomicBool::new(false),
        };
        let pool = Pool::builder(MIB)
            .name("poisoned")
            .thread_heaps(0)
            .build_mapped(vm)
            .unwrap();
        let first =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.allocate(200_000, 0)));
        let whole = pool.allocate(MIB, 0);
        let s = pool.stats();
        assert!(whole.is_ok(), "the capacity is not all there: {s}");
        assert!(
            matches!(first, Ok(Err(_))),
            "allocate unwound into its caller: {}",
            if first.is_err() { "panic" } else { "returned" }
        );
    }
}
