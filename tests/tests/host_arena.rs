//! The host arena: one allocation per arena, every view at its planned offset, a distinct
//! pattern written into every view survives intact, and the allocation is freed exactly once.

use devarena::{Arena, Backend, DeviceLayout, Error, HostBackend};
use devarena_kernels::pipeline::{Frame, MAX_PIXELS};
use devarena_tests::fixtures::{Empty, Inner, Middle, Outer};

/// A value that names its field and its index: any overlap or misplaced view changes it.
fn tag(field: u32, index: usize) -> u32 {
    (field << 24) ^ index as u32
}

/// Start address of a slice, for comparison with `arena.addr() + offset`.
fn addr<T>(s: &[T]) -> u64 {
    s.as_ptr() as u64
}

/// Checks that a view of `len` elements of `T` starts at `base + offset` and ends inside
/// `base + size`.
fn assert_placed<T>(view: &[T], base: u64, offset: usize, size: usize, name: &str) {
    assert_eq!(
        addr(view),
        base + offset as u64,
        "{name} is not at its offset"
    );
    let end = offset + std::mem::size_of_val(view);
    assert!(end <= size, "{name} ends at {end}, past SIZE {size}");
    assert_eq!(addr(view) % std::mem::align_of::<T>() as u64, 0, "{name}");
}

#[test]
fn pipeline_frame_views_hold_distinct_patterns() {
    let backend = HostBackend::new();
    {
        let mut arena = Arena::<Frame>::new_in(backend.clone()).unwrap();
        assert_eq!(arena.size(), Frame::SIZE);
        assert_eq!(arena.allocation().align, Frame::ALIGN);
        assert_eq!(arena.addr() % Frame::ALIGN as u64, 0);
        let stats = backend.stats();
        assert_eq!((stats.allocations, stats.frees), (1, 0));
        assert_eq!(stats.live_bytes, Frame::SIZE);

        let base = arena.addr();
        let size = Frame::SIZE;
        let o = Frame::OFFSETS;
        let v = arena.views_mut();
        assert_eq!(
            [
                v.rgb.len(),
                v.gray.len(),
                v.scratch.len(),
                v.blurred.len(),
                v.magnitude.len(),
                v.hist.len(),
                v.threshold.len(),
                v.mask.len()
            ],
            [
                MAX_PIXELS * 3,
                MAX_PIXELS,
                MAX_PIXELS,
                MAX_PIXELS,
                MAX_PIXELS,
                256,
                1,
                MAX_PIXELS
            ]
        );
        assert_placed(v.rgb, base, o.rgb, size, "rgb");
        assert_placed(v.gray, base, o.gray, size, "gray");
        assert_placed(v.scratch, base, o.scratch, size, "scratch");
        assert_placed(v.blurred, base, o.blurred, size, "blurred");
        assert_placed(v.magnitude, base, o.magnitude, size, "magnitude");
        assert_placed(v.hist, base, o.hist, size, "hist");
        assert_placed(v.threshold, base, o.threshold, size, "threshold");
        assert_placed(v.mask, base, o.mask, size, "mask");

        // The host backend hands out zeroed memory.
        assert!(v.rgb.iter().all(|&b| b == 0));
        assert!(v.hist.iter().all(|&b| b == 0));
        assert!(v.mask.iter().all(|&b| b == 0));

        // Write everything first, then read everything: a view that overlapped another would
        // have been overwritten by it.
        for (j, x) in v.rgb.iter_mut().enumerate() {
            *x = (j % 251) as u8;
        }
        for (fi, view) in [1, 2, 3, 4]
            .into_iter()
            .zip([v.gray, v.scratch, v.blurred, v.magnitude])
        {
            for (j, x) in view.iter_mut().enumerate() {
                *x = f32::from_bits(tag(fi, j));
            }
        }
        for (fi, view) in [5, 6].into_iter().zip([v.hist, v.threshold]) {
            for (j, x) in view.iter_mut().enumerate() {
                *x = tag(fi, j);
            }
        }
        for (j, x) in v.mask.iter_mut().enumerate() {
            *x = (j % 241) as u8 ^ 0x5a;
        }

        let r = arena.views();
        assert!(r.rgb.iter().enumerate().all(|(j, &x)| x == (j % 251) as u8));
        for (fi, view) in [1, 2, 3, 4]
            .into_iter()
            .zip([r.gray, r.scratch, r.blurred, r.magnitude])
        {
            let bad = view
                .iter()
                .enumerate()
                .filter(|&(j, x)| x.to_bits() != tag(fi, j))
                .count();
            assert_eq!(bad, 0, "field {fi}: {bad} elements changed");
        }
        for (fi, view) in [5, 6].into_iter().zip([r.hist, r.threshold]) {
            assert!(
                view.iter().enumerate().all(|(j, &x)| x == tag(fi, j)),
                "field {fi}"
            );
        }
        assert!(
            r.mask
                .iter()
                .enumerate()
                .all(|(j, &x)| x == (j % 241) as u8 ^ 0x5a)
        );

        // Still one allocation: views borrow, they do not allocate.
        assert_eq!(backend.stats().allocations, 1);
    }
    let stats = backend.stats();
    assert_eq!((stats.allocations, stats.frees, stats.failures), (1, 1, 0));
    assert_eq!(stats.live_bytes, 0);
    assert_eq!(stats.peak_bytes, Frame::SIZE);
    assert_eq!(stats.live_allocations(), 0);
}

#[test]
fn nested_views_sit_at_nested_offsets() {
    let backend = HostBackend::new();
    {
        let mut arena = Arena::<Outer>::new_in(backend.clone()).unwrap();
        let base = arena.addr();
        assert_eq!(base % Outer::ALIGN as u64, 0);
        let size = Outer::SIZE;
        let (o, m, i) = (Outer::OFFSETS, Middle::OFFSETS, Inner::OFFSETS);
        let v = arena.views_mut();
        assert_placed(v.flag, base, o.flag, size, "flag");
        assert_placed(v.middle.head, base, o.middle + m.head, size, "middle.head");
        assert_placed(
            v.middle.inner.coeffs,
            base,
            o.middle + m.inner + i.coeffs,
            size,
            "middle.inner.coeffs",
        );
        assert_placed(v.middle.tail, base, o.middle + m.tail, size, "middle.tail");
        assert_placed(
            v.inner.coeffs,
            base,
            o.inner + i.coeffs,
            size,
            "inner.coeffs",
        );
        assert_placed(v.last, base, o.last, size, "last");
        // The nested layout keeps its own alignment inside the outer one.
        assert_eq!(addr(v.middle.inner.coeffs) % Inner::ALIGN as u64, 0);

        v.flag[0] = tag(0, 0);
        v.middle
            .head
            .iter_mut()
            .enumerate()
            .for_each(|(j, x)| *x = j as u8 ^ 0x5a);
        v.middle
            .inner
            .coeffs
            .iter_mut()
            .enumerate()
            .for_each(|(j, x)| *x = f32::from_bits(tag(2, j)));
        v.middle
            .tail
            .iter_mut()
            .enumerate()
            .for_each(|(j, x)| *x = 0x3000 + j as u16);
        v.inner
            .coeffs
            .iter_mut()
            .enumerate()
            .for_each(|(j, x)| *x = f32::from_bits(tag(4, j)));
        v.last[0] = 0xee;

        let r = arena.views();
        assert_eq!(r.flag, [tag(0, 0)]);
        assert!(
            r.middle
                .head
                .iter()
                .enumerate()
                .all(|(j, &x)| x == j as u8 ^ 0x5a)
        );
        assert!(
            r.middle
                .inner
                .coeffs
                .iter()
                .enumerate()
                .all(|(j, x)| x.to_bits() == tag(2, j))
        );
        assert!(
            r.middle
                .tail
                .iter()
                .enumerate()
                .all(|(j, &x)| x == 0x3000 + j as u16)
        );
        assert!(
            r.inner
                .coeffs
                .iter()
                .enumerate()
                .all(|(j, x)| x.to_bits() == tag(4, j))
        );
        assert_eq!(r.last, [0xee]);
        assert_eq!(backend.stats().allocations, 1);
    }
    assert_eq!((backend.stats().allocations, backend.stats().frees), (1, 1));
}

#[test]
fn free_releases_once_and_skips_drop() {
    let backend = HostBackend::new();
    let arena = Arena::<Middle>::new_in(backend.clone()).unwrap();
    assert_eq!(backend.stats().live_bytes, Middle::SIZE);
    arena.free().unwrap();
    let stats = backend.stats();
    assert_eq!((stats.allocations, stats.frees), (1, 1));
    assert_eq!(stats.live_bytes, 0);
}

#[test]
fn many_arenas_one_allocation_each() {
    let backend = HostBackend::new();
    let arenas: Vec<_> = (0..5)
        .map(|_| Arena::<Middle>::new_in(backend.clone()).unwrap())
        .collect();
    assert_eq!(backend.stats().allocations, 5);
    assert_eq!(backend.stats().live_bytes, 5 * Middle::SIZE);
    // Distinct, non-overlapping allocations.
    let mut spans: Vec<(u64, u64)> = arenas
        .iter()
        .map(|a| (a.addr(), a.addr() + a.size() as u64))
        .collect();
    spans.sort_unstable();
    assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0));
    drop(arenas);
    assert_eq!(backend.stats().frees, 5);
    assert_eq!(backend.stats().peak_bytes, 5 * Middle::SIZE);
}

#[test]
fn zero_size_layout() {
    let backend = HostBackend::new();
    {
        let mut arena = Arena::<Empty>::new_in(backend.clone()).unwrap();
        assert_eq!(arena.size(), 0);
        assert_eq!(arena.fields().len(), 0);
        // No bytes, but an aligned, non-null address.
        assert_ne!(arena.addr(), 0);
        assert_eq!(arena.addr() % Empty::ALIGN as u64, 0);
        let _views = arena.views_mut();
        let stats = backend.stats();
        assert_eq!((stats.allocations, stats.live_bytes), (1, 0));
    }
    assert_eq!(backend.stats().frees, 1);
}

#[test]
fn arena_new_uses_a_fresh_host_backend() {
    let mut arena = Arena::<Inner>::new().unwrap();
    arena.views_mut().coeffs[9] = 9.0;
    assert_eq!(arena.views().coeffs[9], 9.0);
    assert_eq!(arena.backend().stats().allocations, 1);
    assert_eq!(arena.backend().name(), "host");
    assert_eq!(arena.fields(), Inner::FIELDS);
    let debug = format!("{arena:?}");
    assert!(
        debug.contains("Inner") && debug.contains("size: 1024"),
        "{debug}"
    );
}

#[test]
fn host_backend_refuses_bad_requests_without_panicking() {
    let backend = HostBackend::new();
    // An alignment that is not a power of two.
    let err = backend.allocate(64, 48).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    assert!(err.to_string().contains("48"), "{err}");
    // A size that cannot be a Rust allocation at all (over isize::MAX).
    let err = backend.allocate(usize::MAX - 64, 256).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    let stats = backend.stats();
    assert_eq!(
        (stats.allocations, stats.failures, stats.live_bytes),
        (0, 2, 0)
    );
}
