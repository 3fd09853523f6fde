//! The mapping on the host stand-in: what is mapped when, what a failure undoes, what a trim
//! gives back.

use alloc::boxed::Box;
use alloc::string::ToString;
use alloc::sync::Arc;
use alloc::vec::Vec;

use super::Mapping;
use crate::Error;
use crate::backend::{HostVirtualMemory, VmCall};

const CHUNK: usize = 4096;

/// A mapping of `capacity` bytes in 4 KiB chunks, and the stand-in under it.
fn mapping(capacity: usize) -> (Mapping, Arc<HostVirtualMemory>) {
    let vm = Arc::new(HostVirtualMemory::new(CHUNK).unwrap());
    let (mapping, _, _) = Mapping::reserve("test", Box::new(vm.clone()), capacity, None).unwrap();
    (mapping, vm)
}

/// [`Mapping::trim`] of ranges the test declares free.
fn trim(
    m: &mut Mapping,
    free: impl Iterator<Item = (u64, u64)>,
    keep: usize,
) -> Result<usize, Error> {
    // SAFETY: nothing uses the memory of these mappings: the tests write none of it, queue
    // no device work, and hand out no block of it.
    unsafe { m.trim(free, keep) }
}

/// The calls after the reservation.
fn calls_after_reserve(vm: &HostVirtualMemory) -> Vec<VmCall> {
    vm.calls().into_iter().skip(1).collect()
}

#[test]
fn a_classic_region_covers_everything_and_trims_nothing() {
    let m = Mapping::whole(1 << 20, 64 << 20);
    assert!(m.covers(1 << 20, 256));
    assert!(m.covers((1 << 20) + (64 << 20) - 256, 256));
    assert!(m.covers(1 << 20, 64 << 20));
    let stats = m.stats();
    assert_eq!(
        (stats.mapped, stats.peak_mapped, stats.chunk),
        (64 << 20, 64 << 20, 64 << 20)
    );
    assert!(!m.is_growable());
    let mut m = m;
    assert_eq!(trim(&mut m, [(1 << 20, 64 << 20)].into_iter(), 0), Ok(0));
    assert_eq!(m.ensure(1 << 20, 4096), Ok(()));
}

#[test]
fn chunks_are_mapped_on_demand_in_runs_and_never_twice() {
    let (mut m, vm) = mapping(64 * CHUNK);
    let base = m.base();
    assert_eq!(
        vm.calls()[0],
        VmCall::Reserve {
            base,
            bytes: 64 * CHUNK
        }
    );
    assert!(!m.covers(base, 256));
    // 256 bytes inside chunk 2: that chunk alone.
    let a = base + 2 * CHUNK as u64 + 512;
    m.ensure(a, 256).unwrap();
    assert!(m.covers(a, 256));
    assert!(!m.covers(base, 256));
    // Chunks 1..=4: chunk 2 is mapped, so two runs, 1 and 3..=4.
    m.ensure(base + CHUNK as u64 + 256, 3 * CHUNK as u64)
        .unwrap();
    let chunk = CHUNK;
    assert_eq!(
        calls_after_reserve(&vm),
        [
            VmCall::Map {
                addr: base + 2 * chunk as u64,
                chunk,
                count: 1
            },
            VmCall::Map {
                addr: base + chunk as u64,
                chunk,
                count: 1
            },
            VmCall::Map {
                addr: base + 3 * chunk as u64,
                chunk,
                count: 2
            },
        ]
    );
    // Covered now: no call at all.
    m.ensure(base + CHUNK as u64, 4 * CHUNK as u64).unwrap();
    assert_eq!(calls_after_reserve(&vm).len(), 3);
    assert!(vm.is_mapped(base + CHUNK as u64, 4 * CHUNK));
    let stats = m.stats();
    assert_eq!((stats.mapped, stats.maps, stats.unmaps), (4 * CHUNK, 4, 0));
    assert_eq!(vm.mapped_bytes(), 4 * CHUNK);
}

#[test]
fn blocks_across_64_chunk_words_are_checked_chunk_by_chunk() {
    let (mut m, vm) = mapping(200 * CHUNK);
    let base = m.base();
    // Chunks 60..=70 straddle the first and second words of the bitmap.
    let (addr, bytes) = (base + 60 * CHUNK as u64, 11 * CHUNK as u64);
    assert!(!m.covers(addr, bytes));
    m.ensure(addr + 5 * CHUNK as u64, CHUNK as u64).unwrap(); // chunk 65 alone
    assert!(!m.covers(addr, bytes));
    m.ensure(addr, bytes).unwrap();
    assert!(m.covers(addr, bytes));
    assert!(!m.covers(addr, bytes + 1));
    assert_eq!(vm.mapped_bytes(), 11 * CHUNK);
    // The last chunk of the region.
    let last = base + 199 * CHUNK as u64;
    m.ensure(last, CHUNK as u64).unwrap();
    assert!(m.covers(last, CHUNK as u64));
}

#[test]
fn a_failed_run_undoes_the_runs_mapped_before_it() {
    let (mut m, vm) = mapping(64 * CHUNK);
    let base = m.base();
    let chunk = CHUNK;
    m.ensure(base + 2 * chunk as u64, 1).unwrap();
    let before = m.stats();
    // Chunks 0..=4 need runs 0..=1 and 3..=4: the first maps, the second fails.
    vm.fail_maps(1, 1);
    let err = m.ensure(base, 5 * chunk as u64).unwrap_err();
    assert!(
        matches!(
            err,
            Error::OutOfMemory {
                detail: Some("simulated out of memory"),
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        calls_after_reserve(&vm)[1..],
        [
            VmCall::Map {
                addr: base,
                chunk,
                count: 2
            },
            VmCall::MapFailed {
                addr: base + 3 * chunk as u64,
                chunk,
                count: 2
            },
            VmCall::Unmap {
                addr: base,
                bytes: chunk
            },
            VmCall::Unmap {
                addr: base + chunk as u64,
                bytes: chunk
            },
        ]
    );
    // As it was, but for the counted calls: only chunk 2 is mapped.
    assert_eq!(vm.mapped_chunks(), [(base + 2 * chunk as u64, chunk)]);
    let after = m.stats();
    assert_eq!(
        (after.mapped, after.peak_mapped),
        (before.mapped, before.peak_mapped)
    );
    assert_eq!(
        (after.maps, after.unmaps),
        (before.maps + 2, before.unmaps + 2)
    );
    assert!(!m.covers(base, 1));
    // And it maps once the device has room again.
    m.ensure(base, 5 * chunk as u64).unwrap();
    assert!(m.covers(base, 5 * chunk as u64));
    assert_eq!(vm.mapped_bytes(), 5 * chunk);
}

#[test]
fn a_trim_unmaps_only_chunks_entirely_inside_free_blocks() {
    let (mut m, vm) = mapping(16 * CHUNK);
    let base = m.base();
    let c = CHUNK as u64;
    m.ensure(base, 16 * c).unwrap();
    // Free: 0.5 .. 3.5 chunks (whole chunks 1, 2), 5 .. 7 (5, 6), 9.25 .. 9.75 (none),
    // 12 .. 16 (12..=15).
    let free = [
        (base + c / 2, 3 * c),
        (base + 5 * c, 2 * c),
        (base + 9 * c + c / 4, c / 2),
        (base + 12 * c, 4 * c),
    ];
    assert_eq!(trim(&mut m, free.into_iter(), 0), Ok(8 * CHUNK));
    let unmapped: Vec<u64> = calls_after_reserve(&vm)
        .into_iter()
        .filter_map(|call| match call {
            VmCall::Unmap { addr, .. } => Some((addr - base) / c),
            _ => None,
        })
        .collect();
    // Highest address first.
    assert_eq!(unmapped, [15, 14, 13, 12, 6, 5, 2, 1]);
    for chunk in [0, 3, 4, 7, 8, 9, 10, 11] {
        assert!(vm.is_mapped(base + chunk * c, CHUNK), "chunk {chunk}");
    }
    let stats = m.stats();
    assert_eq!(
        (stats.mapped, stats.peak_mapped, stats.unmaps),
        (8 * CHUNK, 16 * CHUNK, 8)
    );
    // Nothing more to give back from the same free blocks; unmapped chunks are skipped.
    assert_eq!(trim(&mut m, free.into_iter(), 0), Ok(0));
}

#[test]
fn a_trim_keeps_what_the_threshold_asks_for() {
    let (mut m, vm) = mapping(16 * CHUNK);
    let base = m.base();
    m.ensure(base, 16 * CHUNK as u64).unwrap();
    let all_free = [(base, 16 * CHUNK as u64)];
    assert_eq!(trim(&mut m, all_free.into_iter(), 16 * CHUNK), Ok(0));
    assert_eq!(
        trim(&mut m, all_free.into_iter(), 6 * CHUNK + 1),
        Ok(10 * CHUNK)
    );
    assert_eq!(m.mapped_bytes(), 6 * CHUNK);
    // The low chunks stay.
    assert_eq!(
        vm.mapped_chunks().last().unwrap().0,
        base + 5 * CHUNK as u64
    );
    assert_eq!(trim(&mut m, all_free.into_iter(), 0), Ok(6 * CHUNK));
    assert_eq!(vm.mapped_bytes(), 0);
}

#[test]
fn the_reservation_past_the_capacity_goes_with_the_last_free_block() {
    // 10.5 chunks of capacity: 11 reserved, the last one half past the capacity.
    let capacity = 10 * CHUNK + CHUNK / 2;
    let (mut m, vm) = mapping(capacity);
    let base = m.base();
    assert_eq!(
        vm.calls()[0],
        VmCall::Reserve {
            base,
            bytes: 11 * CHUNK
        }
    );
    m.ensure(base + 10 * CHUNK as u64, 256).unwrap();
    let free = [(base + 10 * CHUNK as u64, (CHUNK / 2) as u64)];
    assert_eq!(trim(&mut m, free.into_iter(), 0), Ok(CHUNK));
    assert_eq!(vm.mapped_bytes(), 0);
}

#[test]
fn dropping_a_mapping_whose_wait_fails_leaves_its_chunks_mapped() {
    let (mut m, vm) = mapping(8 * CHUNK);
    let base = m.base();
    m.ensure(base + CHUNK as u64, 2 * CHUNK as u64).unwrap();
    vm.fail_synchronize(true);
    drop(m);
    // Work queued on the device may still reach the chunks: no unmap, no free of the
    // reservation, only the wait that failed.
    assert_eq!(vm.calls().last(), Some(&VmCall::Synchronize));
    assert!(
        !vm.calls()
            .iter()
            .any(|c| matches!(c, VmCall::Unmap { .. } | VmCall::FreeReservation { .. }))
    );
    assert_eq!(vm.mapped_bytes(), 2 * CHUNK);
    assert!(vm.is_mapped(base + CHUNK as u64, 2 * CHUNK));
}

#[test]
fn dropping_a_mapping_waits_unmaps_and_frees_the_reservation() {
    let (mut m, vm) = mapping(8 * CHUNK);
    let base = m.base();
    m.ensure(base + CHUNK as u64, 2 * CHUNK as u64).unwrap();
    drop(m);
    let calls = vm.calls();
    let n = calls.len();
    assert_eq!(
        calls[n - 4..],
        [
            VmCall::Synchronize,
            VmCall::Unmap {
                addr: base + CHUNK as u64,
                bytes: CHUNK
            },
            VmCall::Unmap {
                addr: base + 2 * CHUNK as u64,
                bytes: CHUNK
            },
            VmCall::FreeReservation {
                base,
                bytes: 8 * CHUNK
            },
        ]
    );
    assert_eq!(vm.mapped_bytes(), 0);
}

#[test]
fn chunk_sizes_are_checked_when_the_region_is_reserved() {
    let vm = || Box::new(HostVirtualMemory::new(CHUNK).unwrap());
    let err = Mapping::reserve("p", vm(), 1 << 20, Some(CHUNK / 2))
        .err()
        .unwrap();
    assert!(
        err.to_string()
            .contains("2048 bytes is not a power of two of at least"),
        "{err}"
    );
    let err = Mapping::reserve("p", vm(), 1 << 20, Some(3 * CHUNK))
        .err()
        .unwrap();
    assert!(err.to_string().contains("12288"), "{err}");
    let (m, _, _) = Mapping::reserve("p", vm(), 1 << 20, Some(4 * CHUNK)).unwrap();
    assert_eq!(m.stats().chunk, 4 * CHUNK);
    let err = Mapping::reserve("p", vm(), usize::MAX - 256, None)
        .err()
        .unwrap();
    assert!(err.to_string().contains("overflows"), "{err}");
}

#[test]
fn a_mapped_start_lies_in_one_run_of_mapped_chunks_inside_the_block() {
    let (mut m, _vm) = mapping(256 * CHUNK);
    let base = m.base();
    let at = |chunk: u64| base + chunk * CHUNK as u64;
    // Mapped: chunks 2, 4..=5, 10..=13, and 70..=72 (across a word of bits).
    for (first, count) in [(2, 1), (4, 2), (10, 4), (70, 3)] {
        m.ensure(at(first), count * CHUNK as u64).unwrap();
    }
    let c = CHUNK as u64;
    // A block over all of them: the lowest run that holds the size.
    assert_eq!(m.mapped_start(base, 256 * c, 256, 256), Some(at(2)));
    assert_eq!(m.mapped_start(base, 256 * c, c + 256, 256), Some(at(4)));
    assert_eq!(m.mapped_start(base, 256 * c, 3 * c, 256), Some(at(10)));
    assert_eq!(m.mapped_start(base, 256 * c, 4 * c, 256), Some(at(10)));
    assert_eq!(m.mapped_start(base, 256 * c, 4 * c + 256, 256), None);
    // Against every candidate start, granule by granule, for blocks, sizes and alignments
    // across the runs and their edges.
    let mapped = |chunk: u64| [2, 4, 5, 10, 11, 12, 13, 70, 71, 72].contains(&chunk);
    for (first, len) in [
        (0, 256),
        (1, 12),
        (4, 1),
        (9, 70),
        (11, 3),
        (69, 5),
        (71, 2),
    ] {
        for offset in [0, 256, c - 256] {
            let (addr, bytes) = (at(first) + offset, len * c - offset);
            for size in [256, c - 256, c, c + 256, 2 * c, 3 * c, 4 * c] {
                for align in [256, c, 2 * c, 8 * c] {
                    let expected = (addr..addr + bytes).step_by(256).find(|&s| {
                        s % align == 0
                            && s + size <= addr + bytes
                            && (s..s + size).step_by(256).all(|g| mapped((g - base) / c))
                    });
                    let got = m.mapped_start(addr, bytes, size, align);
                    assert_eq!(
                        got, expected,
                        "block {addr:#x}+{bytes} size {size} align {align}"
                    );
                }
            }
        }
    }
    // A block that starts inside a run or ends inside one: only its own part counts.
    assert_eq!(
        m.mapped_start(at(11) + 512, 40 * c, 2 * c, 256),
        Some(at(11) + 512)
    );
    assert_eq!(m.mapped_start(at(11) + 512, 40 * c, 3 * c, 256), None);
    assert_eq!(m.mapped_start(at(60), 11 * c, c, 256), Some(at(70)));
    assert_eq!(m.mapped_start(at(60), 11 * c, c + 256, 256), None);
    // A block smaller than the size, and one with nothing mapped.
    assert_eq!(m.mapped_start(at(10), c, 2 * c, 256), None);
    assert_eq!(m.mapped_start(at(20), 40 * c, 256, 256), None);
    // A classic region: the block's own aligned start.
    let whole = Mapping::whole(1 << 20, 64 << 20);
    assert_eq!(
        whole.mapped_start((1 << 20) + 256, 8192, 4096, 4096),
        Some((1 << 20) + 4096)
    );
    assert_eq!(whole.mapped_start((1 << 20) + 256, 4096, 4096, 4096), None);
}

#[test]
fn free_chunks_are_the_mapped_ones_wholly_inside_a_free_block() {
    let (mut m, _vm) = mapping(16 * CHUNK);
    let base = m.base();
    let c = CHUNK as u64;
    m.ensure(base + 2 * c, 3 * c).unwrap();
    // Free blocks that only touch mapped chunks, or hold unmapped ones whole: nothing.
    assert!(!m.holds_free_chunks([(base + 2 * c + 256, c)].into_iter()));
    assert!(!m.holds_free_chunks([(base, 2 * c), (base + 5 * c, 11 * c)].into_iter()));
    assert!(!m.holds_free_chunks(core::iter::empty()));
    // One mapped chunk wholly inside a free block.
    assert!(m.holds_free_chunks([(base, 2 * c), (base + 3 * c, c)].into_iter()));
    assert!(m.holds_free_chunks([(base + 2 * c - 256, c + 512)].into_iter()));
    // What a trim of the same blocks unmaps.
    assert_eq!(
        trim(&mut m, [(base + 3 * c - 256, 2 * c + 256)].into_iter(), 0),
        Ok(2 * CHUNK)
    );
    assert!(!m.holds_free_chunks([(base + 3 * c - 256, 2 * c + 256)].into_iter()));
    // A classic region has none.
    let whole = Mapping::whole(1 << 20, 64 << 20);
    assert!(!whole.holds_free_chunks([(1 << 20, 64 << 20)].into_iter()));
}
