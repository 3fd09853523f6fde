//! A deterministic synthetic test frame (gradients, shapes, noise) whose shape borders are
//! known, so a test can check that edges appear where they should; the 8-bit images the example
//! writes as PNGs; and the bilinear resampling that brings an input larger than the maximum
//! frame down to a size that fits ([`ImageSize::fit`]).

use devarena::Error;

use super::{FrameOutputs, ImageSize, check_len, magnitude_bin};

/// The seed of the example's default frame.
pub const DEFAULT_SEED: u64 = 0x5eed_f00d_dec0_de01;

/// Noise amplitude: every channel gets a uniform integer offset in `[-NOISE, NOISE]`.
pub const NOISE: i32 = 10;

/// SplitMix64: a tiny, well-mixed, fixed-seed generator (Steele, Lea and Flood, 2014).
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator starting at `seed`.
    pub const fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform integer in `[-amplitude, amplitude]` (`amplitude` ≥ 0).
    pub fn symmetric(&mut self, amplitude: i32) -> i32 {
        let span = (2 * amplitude + 1) as u64;
        // Multiply-shift: unbiased enough for test noise, and no division.
        (((self.next_u64() >> 32) * span) >> 32) as i32 - amplitude
    }
}

/// A flat-coloured shape of the synthetic frame, in pixel coordinates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Shape {
    /// Pixels with `x0 ≤ x < x1` and `y0 ≤ y < y1`.
    Rect {
        /// Left edge (inclusive).
        x0: usize,
        /// Top edge (inclusive).
        y0: usize,
        /// Right edge (exclusive).
        x1: usize,
        /// Bottom edge (exclusive).
        y1: usize,
        /// Fill colour.
        rgb: [u8; 3],
    },
    /// Pixels whose centre lies within `inner ≤ distance < outer` of `(cx, cy)`; a disc when
    /// `inner` is 0.
    Ring {
        /// Centre x.
        cx: f32,
        /// Centre y.
        cy: f32,
        /// Inner radius (0 for a disc).
        inner: f32,
        /// Outer radius.
        outer: f32,
        /// Fill colour.
        rgb: [u8; 3],
    },
}

impl Shape {
    /// Whether the pixel `(x, y)` belongs to the shape.
    pub fn contains(&self, x: usize, y: usize) -> bool {
        match *self {
            Shape::Rect { x0, y0, x1, y1, .. } => (x0..x1).contains(&x) && (y0..y1).contains(&y),
            Shape::Ring {
                cx,
                cy,
                inner,
                outer,
                ..
            } => {
                let d = ((x as f32 - cx).powi(2) + (y as f32 - cy).powi(2)).sqrt();
                d >= inner && d < outer
            }
        }
    }

    /// The fill colour.
    pub fn rgb(&self) -> [u8; 3] {
        match *self {
            Shape::Rect { rgb, .. } | Shape::Ring { rgb, .. } => rgb,
        }
    }

    /// Distance from the pixel centre `(x, y)` to the nearest border of the shape, in pixels
    /// (0 on the border).
    pub fn border_distance(&self, x: usize, y: usize) -> f32 {
        let (px, py) = (x as f32 + 0.5, y as f32 + 0.5);
        match *self {
            Shape::Rect { x0, y0, x1, y1, .. } => {
                let (x0, y0, x1, y1) = (x0 as f32, y0 as f32, x1 as f32, y1 as f32);
                let dx = (px - x0).abs().min((px - x1).abs());
                let dy = (py - y0).abs().min((py - y1).abs());
                let in_x = (x0..=x1).contains(&px);
                let in_y = (y0..=y1).contains(&py);
                match (in_x, in_y) {
                    (true, true) => dx.min(dy),
                    (true, false) => dy,
                    (false, true) => dx,
                    (false, false) => (dx * dx + dy * dy).sqrt(),
                }
            }
            Shape::Ring {
                cx,
                cy,
                inner,
                outer,
                ..
            } => {
                // `contains` tests integer pixel coordinates against the centre.
                let d = ((x as f32 - cx).powi(2) + (y as f32 - cy).powi(2)).sqrt();
                let to_outer = (d - outer).abs();
                if inner > 0.0 {
                    to_outer.min((d - inner).abs())
                } else {
                    to_outer
                }
            }
        }
    }

    /// Points on the border, `n` of them, spread evenly (pixel coordinates).
    pub fn border_points(&self, n: usize) -> Vec<(usize, usize)> {
        let mut points = Vec::with_capacity(n);
        match *self {
            Shape::Rect { x0, y0, x1, y1, .. } => {
                let (w, h) = (x1.saturating_sub(x0), y1.saturating_sub(y0));
                if w == 0 || h == 0 {
                    // An empty rectangle (the frame's shapes at a size of a few pixels).
                    return points;
                }
                let perimeter = 2 * (w + h);
                for i in 0..n {
                    let p = i * perimeter / n;
                    points.push(if p < w {
                        (x0 + p, y0)
                    } else if p < w + h {
                        (x1 - 1, y0 + p - w)
                    } else if p < 2 * w + h {
                        (x1 - 1 - (p - w - h), y1 - 1)
                    } else {
                        (x0, y1 - 1 - (p - 2 * w - h))
                    });
                }
            }
            Shape::Ring {
                cx,
                cy,
                inner,
                outer,
                ..
            } => {
                let radii: &[f32] = if inner > 0.0 {
                    &[inner, outer]
                } else {
                    &[outer]
                };
                for i in 0..n {
                    let r = radii[i % radii.len()];
                    let a = i as f32 * core::f32::consts::TAU / n as f32;
                    points.push((
                        (cx + r * a.cos()).round() as usize,
                        (cy + r * a.sin()).round() as usize,
                    ));
                }
            }
        }
        points
    }
}

/// The shapes of the synthetic frame of `size`, placed in proportion to it, painted in this
/// order (later shapes cover earlier ones; they do not overlap at any size).
pub fn shapes(size: ImageSize) -> [Shape; 4] {
    let (w, h) = (size.width as f32, size.height as f32);
    let px = |f: f32, total: f32| (f * total).round() as usize;
    [
        // A near-white rectangle.
        Shape::Rect {
            x0: px(0.08, w),
            y0: px(0.12, h),
            x1: px(0.30, w),
            y1: px(0.46, h),
            rgb: [245, 240, 228],
        },
        // A near-black disc.
        Shape::Ring {
            cx: 0.52 * w,
            cy: 0.33 * h,
            inner: 0.0,
            outer: 0.18 * h,
            rgb: [18, 22, 34],
        },
        // A yellow rectangle.
        Shape::Rect {
            x0: px(0.70, w),
            y0: px(0.55, h),
            x1: px(0.93, w),
            y1: px(0.88, h),
            rgb: [250, 214, 40],
        },
        // A dark red ring.
        Shape::Ring {
            cx: 0.30 * w,
            cy: 0.74 * h,
            inner: 0.08 * h,
            outer: 0.17 * h,
            rgb: [120, 12, 20],
        },
    ]
}

/// The background colour at `(x, y)`: red rises left to right, green top to bottom.
fn background(size: ImageSize, x: usize, y: usize) -> [u8; 3] {
    // In u64: `x · 80` overflows a u32 past 53 million columns.
    let fx = x as u64 * 80 / (size.width.max(2) as u64 - 1);
    let fy = y as u64 * 60 / (size.height.max(2) as u64 - 1);
    [(70 + fx) as u8, (80 + fy) as u8, 120]
}

/// Writes the synthetic frame into `rgb` (8-bit RGB, interleaved): a smooth two-axis gradient,
/// the [`shapes`], and uniform noise of ±[`NOISE`] per channel from [`SplitMix64`] seeded with
/// `seed`. The same size and seed give the same bytes on every machine.
pub fn synthetic_frame(size: ImageSize, seed: u64, rgb: &mut [u8]) -> Result<(), Error> {
    size.check("synthetic frame")?;
    check_len(
        "synthetic frame",
        "rgb",
        rgb.len(),
        size.pixels() * 3,
        Some(size),
    )?;
    let shapes = shapes(size);
    let mut rng = SplitMix64::new(seed);
    for (i, px) in rgb.chunks_exact_mut(3).enumerate() {
        let (x, y) = (i % size.width, i / size.width);
        let base = shapes
            .iter()
            .rev()
            .find(|s| s.contains(x, y))
            .map_or_else(|| background(size, x, y), Shape::rgb);
        for (out, c) in px.iter_mut().zip(base) {
            *out = (c as i32 + rng.symmetric(NOISE)).clamp(0, 255) as u8;
        }
    }
    Ok(())
}

/// The 8-bit grayscale images of a frame's outputs, as written to PNG files (file name,
/// `width · height` bytes): luma and blurred luma as `round(255 · clamp(v, 0, 1))`, the
/// magnitude as its histogram bin (64 levels per unit of gradient, saturating at 255), and the
/// mask.
pub fn output_images(o: &FrameOutputs) -> [(&'static str, Vec<u8>); 4] {
    let unit = |v: &[f32]| -> Vec<u8> {
        v.iter()
            .map(|&x| (x.clamp(0.0, 1.0) * 255.0).round() as u8)
            .collect()
    };
    [
        ("gray.png", unit(&o.gray)),
        ("blurred.png", unit(&o.blurred)),
        (
            "magnitude.png",
            o.magnitude
                .iter()
                .map(|&m| magnitude_bin(m) as u8)
                .collect(),
        ),
        ("mask.png", o.mask.clone()),
    ]
}

/// Bilinear resampling of 8-bit RGB (interleaved) from `from` to `to`, pixel centres aligned:
/// how an input larger than the layouts' maximum is brought down to [`ImageSize::fit`]'s size.
///
/// ```
/// use devarena_kernels::pipeline::ImageSize;
/// use devarena_kernels::pipeline::image::resample;
///
/// // A horizontal ramp halved: each output pixel averages two input pixels.
/// let src: Vec<u8> = (0..4u8).flat_map(|x| [x * 20; 3]).collect();
/// let out = resample(&src, ImageSize::new(4, 1), ImageSize::new(2, 1))?;
/// assert_eq!(out, [10, 10, 10, 50, 50, 50]);
/// # Ok::<(), devarena::Error>(())
/// ```
pub fn resample(src: &[u8], from: ImageSize, to: ImageSize) -> Result<Vec<u8>, Error> {
    from.check("resample (source)")?;
    to.check("resample (target)")?;
    check_len("resample", "src", src.len(), from.pixels() * 3, Some(from))?;
    let (sw, sh, dw, dh) = (from.width, from.height, to.width, to.height);
    let mut out = vec![0u8; dw * dh * 3];
    let coord = |d: usize, dn: usize, sn: usize| {
        let s = ((d as f32 + 0.5) * sn as f32 / dn as f32 - 0.5).max(0.0);
        // Clamped as an integer: past 2^24, `(sn - 1) as f32` may round up to `sn`.
        let i = (s.floor() as usize).min(sn - 1);
        (i, (i + 1).min(sn - 1), (s - i as f32).clamp(0.0, 1.0))
    };
    let columns: Vec<_> = (0..dw).map(|x| coord(x, dw, sw)).collect();
    for (y, row) in out.chunks_exact_mut(dw * 3).enumerate() {
        let (y0, y1, fy) = coord(y, dh, sh);
        let (top, bottom) = (&src[y0 * sw * 3..][..sw * 3], &src[y1 * sw * 3..][..sw * 3]);
        for (px, &(x0, x1, fx)) in row.chunks_exact_mut(3).zip(&columns) {
            for (c, out) in px.iter_mut().enumerate() {
                let p = |row: &[u8], x: usize| row[x * 3 + c] as f32;
                let t = p(top, x0) * (1.0 - fx) + p(top, x1) * fx;
                let b = p(bottom, x0) * (1.0 - fx) + p(bottom, x1) * fx;
                *out = (t * (1.0 - fy) + b * fy).round() as u8;
            }
        }
    }
    Ok(out)
}

/// FNV-1a over bytes: a stable fingerprint for comparing outputs across runs.
pub fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_the_reference_sequence() {
        // First outputs of SplitMix64 seeded with 0 (the published reference values).
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
    }

    #[test]
    fn noise_is_symmetric_and_bounded() {
        let mut r = SplitMix64::new(1);
        let mut counts = [0u32; 21];
        for _ in 0..21_000 {
            let v = r.symmetric(10);
            assert!((-10..=10).contains(&v));
            counts[(v + 10) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn frame_is_deterministic_and_shows_the_shapes() {
        let size = ImageSize::new(192, 108);
        let mut a = vec![0u8; size.pixels() * 3];
        let mut b = vec![1u8; size.pixels() * 3];
        synthetic_frame(size, 7, &mut a).unwrap();
        synthetic_frame(size, 7, &mut b).unwrap();
        assert_eq!(a, b);
        synthetic_frame(size, 8, &mut b).unwrap();
        assert_ne!(a, b);
        for s in shapes(size) {
            let i = (0..size.pixels())
                .find(|&i| {
                    let (x, y) = (i % size.width, i / size.width);
                    s.contains(x, y) && s.border_distance(x, y) >= 2.0
                })
                .expect("every shape has an interior")
                * 3;
            for (c, want) in a[i..i + 3].iter().zip(s.rgb()) {
                assert!(
                    (*c as i32 - want as i32).abs() <= NOISE,
                    "{s:?} at pixel {i}"
                );
            }
        }
    }

    #[test]
    fn resampling_keeps_flat_colours_and_edges_in_proportion() {
        // A 10×6 image, left half one colour, right half another, brought down to 5×3.
        let from = ImageSize::new(10, 6);
        let src: Vec<u8> = (0..60)
            .flat_map(|i| {
                if i % 10 < 5 {
                    [200, 10, 30]
                } else {
                    [0, 90, 255]
                }
            })
            .collect();
        let out = resample(&src, from, ImageSize::new(5, 3)).unwrap();
        for y in 0..3 {
            let px = |x: usize| &out[(y * 5 + x) * 3..][..3];
            assert_eq!(px(0), [200, 10, 30]);
            assert_eq!(px(1), [200, 10, 30]);
            assert_eq!(px(3), [0, 90, 255]);
            assert_eq!(px(4), [0, 90, 255]);
            // The middle column straddles the edge: halfway.
            assert_eq!(px(2), [100, 50, 143]);
        }
        let same = resample(&src, from, from).unwrap();
        assert_eq!(same, src);
        let e = resample(&src[..59], from, ImageSize::new(5, 3)).unwrap_err();
        assert!(e.to_string().contains("10×6"), "{e}");
    }

    #[test]
    fn resampling_a_row_wider_than_f32_counts_exactly_stays_inside_it() {
        // 2^24 + 4 columns: the last index, 2^24 + 3, rounds up to 2^24 + 4 in f32, so a
        // clamp in f32 let a sample index one past the row.
        let from = ImageSize::new((1 << 24) + 4, 1);
        let src: Vec<u8> = (0..from.pixels())
            .flat_map(|x| [(x % 251) as u8; 3])
            .collect();
        let out = resample(&src, from, from).unwrap();
        assert_eq!(out[out.len() - 3..], src[src.len() - 3..]);
        let to = from.fit();
        let out = resample(&src, from, to).unwrap();
        assert_eq!(out.len(), to.pixels() * 3);
    }

    #[test]
    fn the_gradient_of_a_frame_wider_than_53_million_columns_is_computed() {
        // `x · 80` no longer fits a u32 there.
        let size = ImageSize::new(60_000_001, 70_000_001);
        assert_eq!(background(size, 0, 0), [70, 80, 120]);
        assert_eq!(background(size, 30_000_000, 35_000_000), [110, 110, 120]);
        assert_eq!(
            background(size, size.width - 1, size.height - 1),
            [150, 140, 120]
        );
    }

    #[test]
    fn border_points_of_tiny_frames_lie_on_the_border() {
        for (w, h) in [(1, 1), (2, 1), (1, 9), (3, 3), (7, 5)] {
            for s in shapes(ImageSize::new(w, h)) {
                let points = s.border_points(16);
                if let Shape::Rect { x0, y0, x1, y1, .. } = s {
                    // The rectangle's pixels are its border at these sizes: no points when empty.
                    assert_eq!(points.is_empty(), x0 == x1 || y0 == y1, "{w}×{h}: {s:?}");
                    assert!(points.iter().all(|&(x, y)| s.contains(x, y)), "{s:?}");
                }
                for (x, y) in points {
                    assert!(s.border_distance(x, y) <= 1.5, "{w}×{h}: {s:?} ({x}, {y})");
                }
            }
        }
    }

    #[test]
    fn border_points_lie_on_the_border() {
        for s in shapes(ImageSize::new(1920, 1080)) {
            for (x, y) in s.border_points(64) {
                assert!(s.border_distance(x, y) <= 1.5, "{s:?} ({x}, {y})");
            }
        }
    }
}
