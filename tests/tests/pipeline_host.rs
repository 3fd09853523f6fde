//! The host pipeline on the synthetic 1080p frame, in a `Frame` arena (planned for 3840×2160)
//! on the host backend: what comes out must be a real edge map of the shapes that went in. The
//! same pipeline on the aliased `FrameStaged` arena, whose later stages reuse the bytes of dead
//! buffers: its outputs must be bit-identical to the unaliased run's. And images of other sizes
//! (1×1, odd sizes, a 5000×3000 one downscaled to fit): each runs at its own size in the
//! arenas, touches nothing beyond its frame, and gives the bits of a run on buffers of exactly
//! its size.

use devarena::{Arena, DeviceLayout, HostBackend, LayoutReport};
use devarena_kernels::pipeline::image::{
    DEFAULT_SEED, fnv1a, output_images, resample, shapes, synthetic_frame,
};
use devarena_kernels::pipeline::{
    FRAME_SIZE, FRAME_STAGED_STAGES, Frame, FrameBuffers, FrameOutputs, FrameStaged, HEIGHT,
    HIST_BINS, ImageSize, MAX_PIXELS, MAX_SIZE, PIXELS, Stage, WIDTH, host, magnitude_bin,
};

/// Runs `frames` frames of the synthetic input on a fresh arena; returns the arena, its
/// backend and the threshold of the last frame.
fn run(frames: usize) -> (Arena<Frame>, HostBackend, u32) {
    let backend = HostBackend::new();
    let mut arena = Arena::<Frame>::new_in(backend.clone()).unwrap();
    let mut views = arena.views_mut();
    synthetic_frame(FRAME_SIZE, DEFAULT_SEED, &mut views.rgb[..PIXELS * 3]).unwrap();
    let mut threshold = 0;
    for _ in 0..frames {
        threshold = host::run_frame(FRAME_SIZE, FrameBuffers::from(&mut views)).unwrap();
    }
    (arena, backend, threshold)
}

/// A fingerprint of every stage's output (the frame's part of each buffer).
fn fingerprint(arena: &Arena<Frame>) -> u64 {
    let v = arena.views();
    let floats = [v.gray, v.scratch, v.blurred, v.magnitude];
    fnv1a(
        floats
            .iter()
            .flat_map(|b| b[..PIXELS].iter().flat_map(|x| x.to_le_bytes()))
            .chain(v.hist.iter().flat_map(|c| c.to_le_bytes()))
            .chain(v.threshold[0].to_le_bytes())
            .chain(v.mask[..PIXELS].iter().copied()),
    )
}

#[test]
fn host_pipeline_finds_the_shapes() {
    let (arena, backend, threshold) = run(2);
    let v = arena.views();
    let (mask, magnitude) = (&v.mask[..PIXELS], &v.magnitude[..PIXELS]);

    // One allocation, made at setup; two frames added none.
    let stats = backend.stats();
    assert_eq!((stats.allocations, stats.frees), (1, 0));
    assert_eq!(stats.live_bytes, <Frame as devarena::DeviceLayout>::SIZE);

    // The mask is binary; the histogram counts every pixel; the threshold lies inside the
    // histogram's occupied range and is what Otsu gives for it.
    assert!(mask.iter().all(|&m| m == 0 || m == 255));
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
    let edges = mask.iter().filter(|&&m| m == 255).count();
    assert_eq!(
        edges,
        magnitude
            .iter()
            .filter(|&&m| magnitude_bin(m) > threshold)
            .count()
    );

    // Every shape's border is found: each sampled border point has an edge pixel within one
    // pixel.
    let mask = |x: usize, y: usize| mask[y * WIDTH + x];
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

/// The synthetic input.
fn input() -> Vec<u8> {
    let mut rgb = vec![0u8; PIXELS * 3];
    synthetic_frame(FRAME_SIZE, DEFAULT_SEED, &mut rgb).unwrap();
    rgb
}

/// The outputs of one frame on the unaliased `Frame` arena.
fn unaliased_outputs(input: &[u8]) -> FrameOutputs {
    let mut arena = Arena::<Frame>::new().unwrap();
    let mut views = arena.views_mut();
    views.rgb[..input.len()].copy_from_slice(input);
    let t = host::run_frame(FRAME_SIZE, FrameBuffers::from(&mut views)).unwrap();
    let mut out = FrameOutputs::new(FRAME_SIZE);
    out.copy_from(&FrameBuffers::from(&mut views)).unwrap();
    assert_eq!(out.threshold, t);
    out
}

#[test]
fn the_staged_layout_aliases_along_the_data_flow() {
    let size = FrameStaged::SIZE;
    let unaliased = FrameStaged::UNALIASED_SIZE;
    let bound = FrameStaged::PEAK_LIVE_BOUND;
    // The same buffers as `Frame`, which is what the unaliased size must come to.
    assert_eq!(unaliased, Frame::SIZE);
    assert_eq!(
        FrameStaged::FIELDS
            .iter()
            .map(|f| f.size)
            .collect::<Vec<_>>(),
        Frame::FIELDS.iter().map(|f| f.size).collect::<Vec<_>>()
    );
    // At most two full-frame float buffers are ever live together: the bound is two of them,
    // and the plan reaches it.
    assert_eq!(bound, 2 * MAX_PIXELS * 4);
    assert_eq!(size, bound);
    assert!(
        unaliased - size > unaliased / 2,
        "saves {} bytes",
        unaliased - size
    );
    assert_eq!(FrameStaged::STAGES, FRAME_STAGED_STAGES.len());

    // Fields live together never overlap; some fields of different stages do share bytes.
    let f = FrameStaged::FIELDS;
    let live = FrameStaged::LIVE;
    let mut shared = Vec::new();
    for i in 0..f.len() {
        assert_eq!(f[i].offset % 256, 0, "{} aligned", f[i].name);
        assert!(f[i].end() <= size);
        for j in i + 1..f.len() {
            let overlap = f[i].offset < f[j].end() && f[j].offset < f[i].end();
            if live[i].meets(&live[j]) {
                assert!(
                    !overlap,
                    "{} and {} are live together",
                    f[i].name, f[j].name
                );
            } else if overlap {
                shared.push((f[i].name, f[j].name));
            }
        }
    }
    assert!(shared.len() >= 3, "shared pairs: {shared:?}");

    // The report tells the same story.
    let report = LayoutReport::of::<FrameStaged>();
    let table = report.to_string();
    assert!(table.contains("shares bytes with"), "{table}");
    assert!(
        table.contains(&format!("PEAK_LIVE_BOUND {bound}")),
        "{table}"
    );
    let svg = report.to_svg();
    assert!(svg.contains(">mask<") && svg.contains(&format!("UNALIASED_SIZE {unaliased}")));
}

#[test]
fn aliased_pipeline_is_bit_identical_to_the_unaliased_one() {
    let input = input();
    let reference = unaliased_outputs(&input);

    let backend = HostBackend::new();
    let mut arena = Arena::<FrameStaged>::new_in(backend.clone()).unwrap();
    let mut out = FrameOutputs::new(FRAME_SIZE);
    let mut timed = Vec::new();
    let decode = |rgb: &mut [u8]| {
        rgb.copy_from_slice(&input);
        Ok(())
    };
    let t = host::run_frame_staged(&mut arena, FRAME_SIZE, decode, Some(&mut out), |s, _| {
        timed.push(s)
    })
    .unwrap();
    assert_eq!(timed, Stage::ALL, "every stage ran once, in order");
    assert_eq!(t, reference.threshold);
    if let Some(d) = out.first_difference(&reference) {
        panic!("aliased output differs from the unaliased run: {d}");
    }
    // Every PNG the example writes, byte for byte.
    for ((name, a), (_, b)) in output_images(&out)
        .iter()
        .zip(output_images(&reference).iter())
    {
        assert!(a == b, "{name} differs");
    }
    // The result is a real edge map, not an empty one.
    let edges = out.mask.iter().filter(|&&m| m == 255).count();
    assert!(edges > 1000 && edges < PIXELS / 20, "{edges} edges");

    // Bytes really are reused: a buffer of a later stage sits on `gray`'s bytes.
    let gray_at = FrameStaged::FIELDS
        .iter()
        .find(|f| f.name == "gray")
        .unwrap();
    let reuser = FrameStaged::FIELDS
        .iter()
        .zip(FrameStaged::LIVE)
        .find(|(f, l)| {
            f.name != "gray" && l.first > 2 && f.offset < gray_at.end() && gray_at.offset < f.end()
        })
        .map(|(f, _)| f.name);
    assert!(reuser.is_some(), "a later buffer takes over gray's bytes");

    // More frames on the same arena: the same bits (no state survives from one frame to the
    // next, although every frame reuses the bytes of the one before), and no allocation.
    for _ in 0..2 {
        let mut again = FrameOutputs::new(FRAME_SIZE);
        let decode = |rgb: &mut [u8]| {
            rgb.copy_from_slice(&input);
            Ok(())
        };
        host::run_frame_staged(&mut arena, FRAME_SIZE, decode, Some(&mut again), |_, _| {})
            .unwrap();
        assert_eq!(again.first_difference(&reference), None);
    }
    let stats = backend.stats();
    assert_eq!((stats.allocations, stats.frees), (1, 0));
    assert_eq!(stats.live_bytes, FrameStaged::SIZE);
}

#[test]
fn aliased_pipeline_reports_errors_without_running() {
    let mut arena = Arena::<FrameStaged>::new().unwrap();
    let mut small = FrameOutputs::new(devarena_kernels::pipeline::ImageSize::new(64, 64));
    let e = host::run_frame_staged(
        &mut arena,
        FRAME_SIZE,
        |_| Ok(()),
        Some(&mut small),
        |_, _| {},
    )
    .unwrap_err();
    assert!(e.to_string().contains("64×64"), "{e}");
    // A failing decode stops the frame before any stage.
    let mut ran = 0;
    let e = host::run_frame_staged(
        &mut arena,
        FRAME_SIZE,
        |_| {
            Err(devarena::Error::InvalidArgument {
                what: "corrupt input".into(),
            })
        },
        None,
        |_, _| ran += 1,
    )
    .unwrap_err();
    assert!(e.to_string().contains("corrupt input"), "{e}");
    assert_eq!(ran, 0);
}

/// The outputs of one frame of `input` (of `size`) on buffers of exactly that size: what a run
/// in the arenas, whose buffers have room for the largest frame, must match bit for bit.
fn exact_outputs(size: ImageSize, input: &[u8]) -> FrameOutputs {
    let n = size.pixels();
    let (mut rgb, mut gray, mut scratch, mut blurred, mut magnitude) = (
        input.to_vec(),
        vec![0.0f32; n],
        vec![0.0f32; n],
        vec![0.0f32; n],
        vec![0.0f32; n],
    );
    let (mut hist, mut threshold, mut mask) = (vec![0u32; HIST_BINS], vec![0u32; 1], vec![0u8; n]);
    let mut b = FrameBuffers {
        rgb: &mut rgb,
        gray: &mut gray,
        scratch: &mut scratch,
        blurred: &mut blurred,
        magnitude: &mut magnitude,
        hist: &mut hist,
        threshold: &mut threshold,
        mask: &mut mask,
    };
    host::run_frame(size, b.reborrow()).unwrap();
    let mut out = FrameOutputs::new(size);
    out.copy_from(&b).unwrap();
    out
}

/// Elements just past a frame that a run must leave untouched (set to a sentinel first).
const GUARD: usize = 4096;

/// Sets `GUARD` elements after the first `n` of `buffer` to `sentinel`.
fn guard<T: Copy>(buffer: &mut [T], n: usize, sentinel: T) {
    let end = (n + GUARD).min(buffer.len());
    buffer[n..end].fill(sentinel);
}

/// Whether the `GUARD` elements after the first `n` of `buffer` still hold `sentinel`.
fn guarded<T: Copy + PartialEq>(buffer: &[T], n: usize, sentinel: T) -> bool {
    let end = (n + GUARD).min(buffer.len());
    buffer[n..end].iter().all(|&x| x == sentinel)
}

#[test]
fn images_of_other_sizes_run_at_their_own_size() {
    let backend = HostBackend::new();
    let mut frame = Arena::<Frame>::new_in(backend.clone()).unwrap();
    let mut staged = Arena::<FrameStaged>::new_in(backend.clone()).unwrap();
    let setup = backend.stats();
    let sentinel = f32::from_bits(0x7fc0_dead); // a NaN no stage writes
    for (w, h) in [
        (1, 1),
        (2, 1),
        (1, 2),
        (3, 2),
        (5, 5),
        (7, 3),
        (257, 131),
        (1023, 7),
        (33, 1000),
    ] {
        let size = ImageSize::new(w, h);
        let n = size.pixels();
        let mut input = vec![0u8; n * 3];
        synthetic_frame(size, DEFAULT_SEED ^ n as u64, &mut input).unwrap();
        let reference = exact_outputs(size, &input);

        // The unaliased arena: the views cut to the frame, nothing beyond it touched.
        let mut v = frame.views_mut();
        v.rgb[..3 * n].copy_from_slice(&input);
        guard(v.rgb, 3 * n, 0xa5);
        for b in [
            &mut *v.gray,
            &mut *v.scratch,
            &mut *v.blurred,
            &mut *v.magnitude,
        ] {
            guard(b, n, sentinel);
        }
        guard(v.mask, n, 0xa5);
        let t = host::run_frame(size, FrameBuffers::from(&mut v)).unwrap();
        let mut out = FrameOutputs::new(size);
        out.copy_from(&FrameBuffers::from(&mut v)).unwrap();
        assert_eq!(out.threshold, t);
        assert_eq!(
            out.first_difference(&reference),
            None,
            "{size}, Frame arena"
        );
        assert!(guarded(v.rgb, 3 * n, 0xa5), "{size}: rgb past the frame");
        for (name, b) in [
            ("gray", &*v.gray),
            ("scratch", &*v.scratch),
            ("blurred", &*v.blurred),
            ("magnitude", &*v.magnitude),
        ] {
            let same = |x: f32| x.to_bits() == sentinel.to_bits();
            let end = (n + GUARD).min(b.len());
            assert!(
                b[n..end].iter().all(|&x| same(x)),
                "{size}: {name} past the frame"
            );
        }
        assert!(guarded(v.mask, n, 0xa5), "{size}: mask past the frame");
        assert_eq!(
            out.hist.iter().map(|&c| c as usize).sum::<usize>(),
            n,
            "{size}: every pixel counted once"
        );

        // The aliased arena: the same bits.
        let mut out = FrameOutputs::new(size);
        let decode = |rgb: &mut [u8]| {
            assert_eq!(rgb.len(), 3 * n, "decode gets the input cut to the frame");
            rgb.copy_from_slice(&input);
            Ok(())
        };
        host::run_frame_staged(&mut staged, size, decode, Some(&mut out), |_, _| {}).unwrap();
        assert_eq!(
            out.first_difference(&reference),
            None,
            "{size}, FrameStaged"
        );

        // The PNGs are the image's size.
        for (name, image) in output_images(&out) {
            assert_eq!(image.len(), n, "{size}: {name}");
        }
    }
    // A 1×1 image has one pixel of no gradient: no edge, and no threshold that splits it.
    let one = exact_outputs(ImageSize::new(1, 1), &[10, 20, 30]);
    assert_eq!(
        (one.magnitude[0], one.threshold, one.mask[0]),
        (0.0, 255, 0)
    );
    assert_eq!(backend.stats().allocations, setup.allocations);
}

#[test]
fn a_frame_larger_than_the_arena_is_an_error_naming_the_buffer() {
    let mut arena = Arena::<Frame>::new().unwrap();
    let too_big = ImageSize::new(4000, 3000);
    assert!(!too_big.fits());
    let e = host::run_frame(too_big, FrameBuffers::from(&mut arena.views_mut())).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "frame: `rgb` holds {} elements, a 4000×3000 image needs 36000000",
            MAX_PIXELS * 3
        )
    );
    let mut staged = Arena::<FrameStaged>::new().unwrap();
    let e = host::run_frame_staged(&mut staged, too_big, |_| Ok(()), None, |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("a 4000×3000 image needs"), "{e}");
}

#[test]
fn an_image_larger_than_the_maximum_is_downscaled_keeping_its_aspect_ratio() {
    let big = ImageSize::new(5000, 3000);
    assert!(!big.fits());
    let fitted = big.fit();
    assert_eq!(fitted, ImageSize::new(3718, 2230));
    assert!(fitted.fits() && fitted.pixels() <= MAX_PIXELS && fitted.width <= 5000);
    let (a, b) = (5000.0 / 3000.0, fitted.width as f64 / fitted.height as f64);
    assert!((a / b - 1.0).abs() < 1e-3, "aspect {a} vs {b}");
    assert_eq!(MAX_SIZE.fit(), MAX_SIZE);

    // A 5000×3000 picture: a dark field with a bright rectangle over its middle third.
    let inside = |x: usize, y: usize| (1667..3333).contains(&x) && (1000..2000).contains(&y);
    let src: Vec<u8> = (0..big.pixels())
        .flat_map(|i| {
            let v = if inside(i % 5000, i / 5000) { 230 } else { 20 };
            [v, v, v]
        })
        .collect();
    let input = resample(&src, big, fitted).unwrap();
    assert_eq!(input.len(), fitted.pixels() * 3);

    let mut arena = Arena::<FrameStaged>::new().unwrap();
    let mut out = FrameOutputs::new(fitted);
    let decode = |rgb: &mut [u8]| {
        rgb.copy_from_slice(&input);
        Ok(())
    };
    host::run_frame_staged(&mut arena, fitted, decode, Some(&mut out), |_, _| {}).unwrap();
    // The rectangle's border is found where the scale puts it, and only there.
    let (w, h) = (fitted.width, fitted.height);
    let scale = w as f64 / 5000.0;
    let at = |v: f64| (v * scale).round() as usize;
    let edge = |x: usize, y: usize| {
        (y.saturating_sub(2)..=(y + 2).min(h - 1)).any(|yy| {
            (x.saturating_sub(2)..=(x + 2).min(w - 1)).any(|xx| out.mask[yy * w + xx] == 255)
        })
    };
    for (x, y) in [
        (at(1667.0), at(1500.0)),
        (at(3333.0), at(1500.0)),
        (at(2500.0), at(1000.0)),
        (at(2500.0), at(2000.0)),
    ] {
        assert!(edge(x, y), "no edge near ({x}, {y}) of the {fitted} frame");
    }
    assert!(!edge(w / 2, h / 2) && !edge(10, 10) && !edge(w - 10, h - 10));
}
