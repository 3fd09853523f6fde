//! The host pipeline on the synthetic 1080p frame, in a `Frame` arena on the host backend:
//! what comes out must be a real edge map of the shapes that went in.

use devarena::{Arena, HostBackend};
use devarena_kernels::pipeline::image::{DEFAULT_SEED, fnv1a, shapes, synthetic_frame};
use devarena_kernels::pipeline::{
    FRAME_SIZE, Frame, FrameBuffers, HEIGHT, HIST_BINS, PIXELS, WIDTH, host, magnitude_bin,
};

/// Runs `frames` frames of the synthetic input on a fresh arena; returns the arena, its
/// backend and the threshold of the last frame.
fn run(frames: usize) -> (Arena<Frame>, HostBackend, u32) {
    let backend = HostBackend::new();
    let mut arena = Arena::<Frame>::new_in(backend.clone()).unwrap();
    let mut views = arena.views_mut();
    synthetic_frame(FRAME_SIZE, DEFAULT_SEED, views.rgb).unwrap();
    let mut threshold = 0;
    for _ in 0..frames {
        threshold = host::run_frame(FRAME_SIZE, FrameBuffers::from(&mut views)).unwrap();
    }
    (arena, backend, threshold)
}

/// A fingerprint of every stage's output.
fn fingerprint(arena: &Arena<Frame>) -> u64 {
    let v = arena.views();
    let floats = [v.gray, v.scratch, v.blurred, v.magnitude];
    fnv1a(
        floats
            .iter()
            .flat_map(|b| b.iter().flat_map(|x| x.to_le_bytes()))
            .chain(v.hist.iter().flat_map(|c| c.to_le_bytes()))
            .chain(v.threshold[0].to_le_bytes())
            .chain(v.mask.iter().copied()),
    )
}

#[test]
fn host_pipeline_finds_the_shapes() {
    let (arena, backend, threshold) = run(2);
    let v = arena.views();

    // One allocation, made at setup; two frames added none.
    let stats = backend.stats();
    assert_eq!((stats.allocations, stats.frees), (1, 0));
    assert_eq!(stats.live_bytes, <Frame as devarena::DeviceLayout>::SIZE);

    // The mask is binary; the histogram counts every pixel; the threshold lies inside the
    // histogram's occupied range and is what Otsu gives for it.
    assert!(v.mask.iter().all(|&m| m == 0 || m == 255));
    assert_eq!(v.hist.iter().map(|&c| c as u64).sum::<u64>(), PIXELS as u64);
    let occupied: Vec<usize> = (0..HIST_BINS).filter(|&b| v.hist[b] > 0).collect();
    let (lo, hi) = (occupied[0], *occupied.last().unwrap());
    assert!(hi > lo + 10, "magnitudes span bins {lo}..={hi} only");
    assert!(
        (lo..hi).contains(&(threshold as usize)),
        "threshold {threshold} outside the occupied bins {lo}..={hi}"
    );
    assert_eq!(v.threshold[0], threshold);
    assert_eq!(host::otsu_threshold(v.hist).unwrap(), threshold);
    let edges = v.mask.iter().filter(|&&m| m == 255).count();
    assert_eq!(
        edges,
        v.magnitude
            .iter()
            .filter(|&&m| magnitude_bin(m) > threshold)
            .count()
    );

    // Every shape's border is found: each sampled border point has an edge pixel within one
    // pixel.
    let mask = |x: usize, y: usize| v.mask[y * WIDTH + x];
    for shape in shapes(FRAME_SIZE) {
        let points = shape.border_points(400);
        let missed: Vec<_> = points
            .iter()
            .filter(|&&(x, y)| {
                !(y.saturating_sub(1)..=(y + 1).min(HEIGHT - 1)).any(|yy| {
                    (x.saturating_sub(1)..=(x + 1).min(WIDTH - 1)).any(|xx| mask(xx, yy) == 255)
                })
            })
            .collect();
        assert!(missed.is_empty(), "{shape:?}: no edge near {missed:?}");
    }

    // Away from every border (4 pixels or more) there are no edges: the gradient background
    // and the noise stay below the threshold.
    let shapes = shapes(FRAME_SIZE);
    let mut far = 0usize;
    let mut false_edges = Vec::new();
    for y in 0..HEIGHT {
        for x in 0..WIDTH {
            if shapes.iter().all(|s| s.border_distance(x, y) >= 4.0) {
                far += 1;
                if mask(x, y) == 255 {
                    false_edges.push((x, y));
                }
            }
        }
    }
    assert!(
        far > PIXELS * 9 / 10,
        "only {far} pixels are away from borders"
    );
    assert!(
        false_edges.is_empty(),
        "{} edges away from any border, e.g. {:?}",
        false_edges.len(),
        &false_edges[..false_edges.len().min(5)]
    );
    // And the edges are thin: a few pixels per unit of border length.
    assert!(edges < PIXELS / 20, "{edges} edge pixels");
}

#[test]
fn host_pipeline_is_deterministic() {
    let (a, _, ta) = run(1);
    let (b, _, tb) = run(1);
    assert_eq!(ta, tb);
    assert_eq!(fingerprint(&a), fingerprint(&b));
    // A frame run twice on the same buffers gives the same result as one run: no state leaks
    // from one frame into the next (the histogram is rebuilt, the scratch buffer rewritten).
    let (c, _, tc) = run(2);
    assert_eq!(tc, ta);
    assert_eq!(fingerprint(&c), fingerprint(&a));
}
