//! The reference implementation of every stage, in plain Rust: the host backend's pipeline and
//! what the device kernels are tested against.
//!
//! Every function checks its buffer sizes and returns [`Error::InvalidArgument`] naming the
//! stage, the buffer and the numbers; none allocates. Floating-point expressions are written
//! one IEEE operation at a time in the order `cuda/pipeline.cu` uses (Rust never fuses a
//! multiply and an add on its own), so the device computes the same bits.

use std::time::{Duration, Instant};

use devarena::backend::DirectViews;
use devarena::{Arena, Error, HostMut};

use super::{
    BLUR_TAPS, FrameBuffers, FrameOutputs, FrameStaged, FrameStagedStages, HIST_BINS, ImageSize,
    LUMA_DIVISOR, LUMA_WEIGHTS, Stage, check_len, check_room, copy_out, image_prefix,
    image_prefix_mut, invalid, magnitude_bin,
};

/// RGB (8-bit, interleaved) to luma in `[0, 1]`:
/// `gray = (77 r + 150 g + 29 b) / 65280`.
///
/// The weighted sum is an exact integer; the one division rounds to nearest. Black maps to
/// exactly `0.0`, white to exactly `1.0`.
pub fn rgb_to_gray(size: ImageSize, rgb: &[u8], gray: &mut [f32]) -> Result<(), Error> {
    const STAGE: &str = "grayscale";
    size.check(STAGE)?;
    check_len(STAGE, "rgb", rgb.len(), size.pixels() * 3, Some(size))?;
    check_len(STAGE, "gray", gray.len(), size.pixels(), Some(size))?;
    let [wr, wg, wb] = LUMA_WEIGHTS;
    for (g, px) in gray.iter_mut().zip(rgb.chunks_exact(3)) {
        let y = wr * px[0] as u32 + wg * px[1] as u32 + wb * px[2] as u32;
        *g = y as f32 / LUMA_DIVISOR;
    }
    Ok(())
}

/// One 5-tap blur sum, `t0·a + t1·b + t2·c + t3·d + t4·e`, accumulated left to right.
#[inline(always)]
fn taps(a: f32, b: f32, c: f32, d: f32, e: f32) -> f32 {
    let [t0, t1, t2, t3, t4] = BLUR_TAPS;
    let mut s = t0 * a;
    s += t1 * b;
    s += t2 * c;
    s += t3 * d;
    s += t4 * e;
    s
}

/// The blur's pass along rows: `dst[x] = Σ taps[k] · src[clamp(x + k − 2)]`, clamp-to-edge.
pub fn blur_horizontal(size: ImageSize, src: &[f32], dst: &mut [f32]) -> Result<(), Error> {
    const STAGE: &str = "blur (rows)";
    size.check(STAGE)?;
    check_len(STAGE, "src", src.len(), size.pixels(), Some(size))?;
    check_len(STAGE, "dst", dst.len(), size.pixels(), Some(size))?;
    let w = size.width;
    let last = w as isize - 1;
    // Pixels whose five taps all lie inside the row take the fast path; the others clamp.
    let interior = if w >= 5 { 2..w - 2 } else { 0..0 };
    for (row, out) in src.chunks_exact(w).zip(dst.chunks_exact_mut(w)) {
        for (o, t) in out[interior.clone()].iter_mut().zip(row.windows(5)) {
            *o = taps(t[0], t[1], t[2], t[3], t[4]);
        }
        for x in (0..interior.start).chain(interior.end..w) {
            let at = |dx: isize| row[(x as isize + dx).clamp(0, last) as usize];
            out[x] = taps(at(-2), at(-1), at(0), at(1), at(2));
        }
    }
    Ok(())
}

/// The blur's pass along columns: `dst[y] = Σ taps[k] · src[clamp(y + k − 2)]`, clamp-to-edge.
pub fn blur_vertical(size: ImageSize, src: &[f32], dst: &mut [f32]) -> Result<(), Error> {
    const STAGE: &str = "blur (columns)";
    size.check(STAGE)?;
    check_len(STAGE, "src", src.len(), size.pixels(), Some(size))?;
    check_len(STAGE, "dst", dst.len(), size.pixels(), Some(size))?;
    let (w, h) = (size.width, size.height);
    let row = |y: isize| {
        let y = y.clamp(0, h as isize - 1) as usize;
        &src[y * w..(y + 1) * w]
    };
    for (y, out) in dst.chunks_exact_mut(w).enumerate() {
        let y = y as isize;
        let (r0, r1, r2, r3, r4) = (row(y - 2), row(y - 1), row(y), row(y + 1), row(y + 2));
        for (x, o) in out.iter_mut().enumerate() {
            *o = taps(r0[x], r1[x], r2[x], r3[x], r4[x]);
        }
    }
    Ok(())
}

/// Separable Gaussian blur (σ = 1, taps `[1 4 6 4 1] / 16`, clamp-to-edge): rows from `src`
/// into `scratch`, then columns from `scratch` into `dst`.
pub fn gaussian_blur(
    size: ImageSize,
    src: &[f32],
    scratch: &mut [f32],
    dst: &mut [f32],
) -> Result<(), Error> {
    blur_horizontal(size, src, scratch)?;
    blur_vertical(size, scratch, dst)
}

/// Sobel gradient magnitude, clamp-to-edge:
///
/// ```text
/// gx = ((tr + 2·mr) + br) − ((tl + 2·ml) + bl)      (t/m/b: row above/at/below,
/// gy = ((bl + 2·bc) + br) − ((tl + 2·tc) + tr)       l/c/r: column left/at/right)
/// magnitude = sqrt(gx·gx + gy·gy)
/// ```
///
/// For luma in `[0, 1]` the magnitude lies in `[0, 4√2]`.
pub fn sobel_magnitude(size: ImageSize, src: &[f32], magnitude: &mut [f32]) -> Result<(), Error> {
    const STAGE: &str = "sobel";
    size.check(STAGE)?;
    check_len(STAGE, "src", src.len(), size.pixels(), Some(size))?;
    check_len(
        STAGE,
        "magnitude",
        magnitude.len(),
        size.pixels(),
        Some(size),
    )?;
    let (w, h) = (size.width, size.height);
    let row = |y: isize| {
        let y = y.clamp(0, h as isize - 1) as usize;
        &src[y * w..(y + 1) * w]
    };
    for (y, out) in magnitude.chunks_exact_mut(w).enumerate() {
        let y = y as isize;
        let (top, mid, bot) = (row(y - 1), row(y), row(y + 1));
        // Columns 1..w-1 read three whole columns; the first and last clamp.
        if w >= 3 {
            let windows = top.windows(3).zip(mid.windows(3)).zip(bot.windows(3));
            for (m, ((t, c), b)) in out[1..w - 1].iter_mut().zip(windows) {
                *m = sobel_pixel([t[0], t[1], t[2]], [c[0], c[2]], [b[0], b[1], b[2]]);
            }
        }
        for x in [0, w - 1] {
            let l = x.saturating_sub(1);
            let r = (x + 1).min(w - 1);
            out[x] = sobel_pixel(
                [top[l], top[x], top[r]],
                [mid[l], mid[r]],
                [bot[l], bot[x], bot[r]],
            );
        }
    }
    Ok(())
}

/// The Sobel magnitude of one pixel from its neighbours: the row above (left, centre, right),
/// its own row (left, right) and the row below.
#[inline(always)]
fn sobel_pixel([tl, tc, tr]: [f32; 3], [ml, mr]: [f32; 2], [bl, bc, br]: [f32; 3]) -> f32 {
    let gx = ((tr + 2.0 * mr) + br) - ((tl + 2.0 * ml) + bl);
    let gy = ((bl + 2.0 * bc) + br) - ((tl + 2.0 * tc) + tr);
    (gx * gx + gy * gy).sqrt()
}

/// Counts the magnitudes per bin ([`magnitude_bin`]) into `hist` (256 counters, overwritten).
pub fn histogram(magnitude: &[f32], hist: &mut [u32]) -> Result<(), Error> {
    const STAGE: &str = "histogram";
    check_len(STAGE, "hist", hist.len(), HIST_BINS, None)?;
    if magnitude.len() > u32::MAX as usize {
        return Err(invalid(format!(
            "{STAGE}: {} magnitudes overflow the 32-bit bin counters",
            magnitude.len()
        )));
    }
    // Four interleaved partial histograms break the dependency between consecutive pixels
    // that land in the same bin (most of them do).
    let mut partial = [[0u32; HIST_BINS]; 4];
    let mut quads = magnitude.chunks_exact(4);
    for q in &mut quads {
        for (p, &m) in partial.iter_mut().zip(q) {
            p[magnitude_bin(m) as usize] += 1;
        }
    }
    for (p, &m) in partial.iter_mut().zip(quads.remainder()) {
        p[magnitude_bin(m) as usize] += 1;
    }
    for (b, h) in hist.iter_mut().enumerate() {
        *h = partial.iter().map(|p| p[b]).sum();
    }
    Ok(())
}

/// Otsu's threshold: the bin `t` that maximises the between-class variance of the classes
/// `bins ≤ t` and `bins > t`; ties go to the smallest `t`.
///
/// With `N` pixels of bin-index sum `S`, and `w0`, `s0` the count and bin-index sum of the
/// bins `≤ t`, the variance is proportional to
/// `(S·w0 − N·s0)² / (w0 · (N − w0))`, evaluated in `f64` in exactly that order (the device
/// does the same). A histogram with fewer than two non-empty bins has no threshold that splits
/// it; the result is then 255, which marks no pixel as an edge.
///
/// ```
/// use devarena_kernels::pipeline::host::otsu_threshold;
/// let mut hist = [0u32; 256];
/// hist[10] = 500;
/// hist[200] = 300;
/// let t = otsu_threshold(&hist)?;
/// assert_eq!(t, 10); // the first split that separates the two modes
/// # Ok::<(), devarena::Error>(())
/// ```
pub fn otsu_threshold(hist: &[u32]) -> Result<u32, Error> {
    check_len("otsu", "hist", hist.len(), HIST_BINS, None)?;
    let n: u64 = hist.iter().map(|&c| c as u64).sum();
    let s: u64 = hist
        .iter()
        .enumerate()
        .map(|(i, &c)| i as u64 * c as u64)
        .sum();
    let (n_f, s_f) = (n as f64, s as f64);
    let (mut w0, mut s0) = (0u64, 0u64);
    let (mut best, mut best_t) = (-1.0f64, 255u32);
    for (t, &c) in hist.iter().enumerate() {
        w0 += c as u64;
        s0 += t as u64 * c as u64;
        let w1 = n - w0;
        if w0 == 0 || w1 == 0 {
            continue;
        }
        let num = s_f * w0 as f64 - n_f * s0 as f64;
        let var = num * num / (w0 as f64 * w1 as f64);
        if var > best {
            best = var;
            best_t = t as u32;
        }
    }
    Ok(best_t)
}

/// The binary edge mask: `255` where `magnitude_bin(m) > threshold`, else `0`.
pub fn edge_mask(magnitude: &[f32], threshold: u32, mask: &mut [u8]) -> Result<(), Error> {
    check_len("mask", "mask", mask.len(), magnitude.len(), None)?;
    for (o, &m) in mask.iter_mut().zip(magnitude) {
        *o = if magnitude_bin(m) > threshold { 255 } else { 0 };
    }
    Ok(())
}

/// Runs every stage on one frame of `size`; returns Otsu's threshold (also stored in
/// `buffers.threshold[0]`).
///
/// Every image buffer must hold at least the frame (`3 · pixels` bytes of `rgb`, `pixels`
/// elements of the others): the stages run on the first `pixels` elements of each, so buffers
/// planned for a larger frame ([`Frame`](super::Frame)'s) serve any smaller one, and nothing
/// beyond the frame is touched.
pub fn run_frame<B8, BF, BU>(
    size: ImageSize,
    buffers: FrameBuffers<'_, B8, BF, BU>,
) -> Result<u32, Error>
where
    B8: AsRef<[u8]> + AsMut<[u8]> + ?Sized,
    BF: AsRef<[f32]> + AsMut<[f32]> + ?Sized,
    BU: AsRef<[u32]> + AsMut<[u32]> + ?Sized,
{
    run_frame_timed(size, buffers, |_, _| {})
}

/// [`run_frame`], reporting each stage's wall-clock time to `on_stage` as it finishes.
pub fn run_frame_timed<B8, BF, BU>(
    size: ImageSize,
    b: FrameBuffers<'_, B8, BF, BU>,
    mut on_stage: impl FnMut(Stage, Duration),
) -> Result<u32, Error>
where
    B8: AsRef<[u8]> + AsMut<[u8]> + ?Sized,
    BF: AsRef<[f32]> + AsMut<[f32]> + ?Sized,
    BU: AsRef<[u32]> + AsMut<[u32]> + ?Sized,
{
    const STAGE: &str = "frame";
    size.check(STAGE)?;
    let n = size.pixels();
    // The views cut to the frame: every stage below sees exactly the frame's elements.
    let rgb = image_prefix(STAGE, "rgb", b.rgb.as_ref(), 3 * n, size)?;
    let gray = image_prefix_mut(STAGE, "gray", b.gray.as_mut(), n, size)?;
    let scratch = image_prefix_mut(STAGE, "scratch", b.scratch.as_mut(), n, size)?;
    let blurred = image_prefix_mut(STAGE, "blurred", b.blurred.as_mut(), n, size)?;
    let magnitude = image_prefix_mut(STAGE, "magnitude", b.magnitude.as_mut(), n, size)?;
    let mask = image_prefix_mut(STAGE, "mask", b.mask.as_mut(), n, size)?;
    let hist = b.hist.as_mut();
    let threshold = b.threshold.as_mut();
    check_len("otsu", "threshold", threshold.len(), 1, None)?;
    let on = &mut on_stage;
    time(Stage::Grayscale, on, || rgb_to_gray(size, rgb, gray))?;
    time(Stage::BlurHorizontal, on, || {
        blur_horizontal(size, gray, scratch)
    })?;
    time(Stage::BlurVertical, on, || {
        blur_vertical(size, scratch, blurred)
    })?;
    time(Stage::Sobel, on, || {
        sobel_magnitude(size, blurred, magnitude)
    })?;
    time(Stage::Histogram, on, || histogram(magnitude, hist))?;
    threshold[0] = time(Stage::Otsu, on, || otsu_threshold(hist))?;
    let t = threshold[0];
    time(Stage::Mask, on, || edge_mask(magnitude, t, mask))?;
    Ok(t)
}

/// Runs `f` and reports its wall-clock time for `stage`.
fn time<R>(
    stage: Stage,
    on_stage: &mut impl FnMut(Stage, Duration),
    f: impl FnOnce() -> Result<R, Error>,
) -> Result<R, Error> {
    let start = Instant::now();
    let r = f()?;
    on_stage(stage, start.elapsed());
    Ok(r)
}

/// Runs one frame of `size` on an aliased [`FrameStaged`] arena; returns Otsu's threshold.
///
/// Every stage reaches its buffers only through the views of its own stage
/// (`arena.gray_mut()`, `arena.blur_rows_mut()`, ...), which hold exactly the buffers live in
/// it, each cut to the frame's elements: the borrow checker keeps every buffer out of reach
/// outside its live range, so reusing the bytes of dead buffers cannot change a result. The
/// bits computed are those of [`run_frame`] on an unaliased [`Frame`](super::Frame).
///
/// `decode` writes the frame's input (`3 · pixels` bytes of RGB) in stage `decode`; the
/// input's bytes are reused by later stages, so every frame starts by decoding. With
/// `outputs` (made for `size`), each stage output is copied out in the last stage it is live
/// in. `on_stage` gets each stage's wall-clock time as it finishes (decoding and copying out
/// are not timed).
///
/// ```
/// use devarena::Arena;
/// use devarena_kernels::pipeline::{FrameOutputs, FrameStaged, ImageSize, host};
///
/// let mut arena = Arena::<FrameStaged>::new()?;
/// let size = ImageSize::new(640, 480);
/// let mut out = FrameOutputs::new(size);
/// let decode = |rgb: &mut [u8]| {
///     rgb.fill(128);
///     Ok(())
/// };
/// let t = host::run_frame_staged(&mut arena, size, decode, Some(&mut out), |_, _| {})?;
/// assert_eq!(t, 255); // a flat image has no edges
/// assert!(out.mask.iter().all(|&m| m == 0));
/// # Ok::<(), devarena::Error>(())
/// ```
pub fn run_frame_staged<B: DirectViews<Mut = HostMut>>(
    arena: &mut Arena<FrameStaged, B>,
    size: ImageSize,
    decode: impl FnOnce(&mut [u8]) -> Result<(), Error>,
    mut outputs: Option<&mut FrameOutputs>,
    mut on_stage: impl FnMut(Stage, Duration),
) -> Result<u32, Error> {
    const STAGE: &str = "frame";
    size.check(STAGE)?;
    if let Some(o) = &outputs {
        if o.size != size {
            return Err(invalid(format!(
                "outputs: made for a {} image, the frame is {size}",
                o.size
            )));
        }
    }
    let n = size.pixels();
    // Every image buffer of `FrameStaged` has room for `MAX_PIXELS` pixels: checked here through
    // `rgb` and `gray`, the cuts below (`..3 * n`, `..n`) stay inside every buffer.
    check_room(STAGE, "rgb", arena.decode_mut().rgb.len(), 3 * n, size)?;
    check_room(STAGE, "gray", arena.gray_mut().gray.len(), n, size)?;
    let on = &mut on_stage;

    decode(&mut arena.decode_mut().rgb[..3 * n])?;

    let s = arena.gray_mut();
    time(Stage::Grayscale, on, || {
        rgb_to_gray(size, &s.rgb[..3 * n], &mut s.gray[..n])
    })?;

    let s = arena.blur_rows_mut();
    let (gray, scratch) = (&s.gray[..n], &mut s.scratch[..n]);
    time(Stage::BlurHorizontal, on, || {
        blur_horizontal(size, gray, scratch)
    })?;
    if let Some(o) = outputs.as_deref_mut() {
        copy_out("gray", &mut o.gray, gray)?;
    }

    let s = arena.blur_columns_mut();
    let (scratch, blurred) = (&s.scratch[..n], &mut s.blurred[..n]);
    time(Stage::BlurVertical, on, || {
        blur_vertical(size, scratch, blurred)
    })?;
    if let Some(o) = outputs.as_deref_mut() {
        copy_out("scratch", &mut o.scratch, scratch)?;
    }

    let s = arena.sobel_mut();
    let (blurred, magnitude) = (&s.blurred[..n], &mut s.magnitude[..n]);
    time(Stage::Sobel, on, || {
        sobel_magnitude(size, blurred, magnitude)
    })?;
    if let Some(o) = outputs.as_deref_mut() {
        copy_out("blurred", &mut o.blurred, blurred)?;
    }

    let s = arena.threshold_mut();
    let magnitude = &s.magnitude[..n];
    time(Stage::Histogram, on, || histogram(magnitude, s.hist))?;
    check_len("otsu", "threshold", s.threshold.len(), 1, None)?;
    s.threshold[0] = time(Stage::Otsu, on, || otsu_threshold(s.hist))?;
    if let Some(o) = outputs.as_deref_mut() {
        copy_out("hist", &mut o.hist, s.hist)?;
    }

    let s = arena.mask_mut();
    let threshold = s.threshold[0];
    let (magnitude, mask) = (&s.magnitude[..n], &mut s.mask[..n]);
    time(Stage::Mask, on, || edge_mask(magnitude, threshold, mask))?;
    if let Some(o) = outputs {
        copy_out("magnitude", &mut o.magnitude, magnitude)?;
        o.threshold = threshold;
        copy_out("mask", &mut o.mask, mask)?;
    }
    Ok(threshold)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(w: usize, h: usize) -> ImageSize {
        ImageSize::new(w, h)
    }

    #[test]
    fn grayscale_weights_and_extremes() {
        let rgb = [
            0, 0, 0, 255, 255, 255, 255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30,
        ];
        let mut gray = [0.0f32; 6];
        rgb_to_gray(size(6, 1), &rgb, &mut gray).unwrap();
        assert_eq!(gray[0], 0.0);
        assert_eq!(gray[1], 1.0);
        assert_eq!(gray[2], (77 * 255) as f32 / 65280.0);
        assert_eq!(gray[3], (150 * 255) as f32 / 65280.0);
        assert_eq!(gray[4], (29 * 255) as f32 / 65280.0);
        assert_eq!(gray[5], (77 * 10 + 150 * 20 + 29 * 30) as f32 / 65280.0);
        // Close to the BT.601 weights.
        assert!((gray[2] - 0.299).abs() < 0.002 && (gray[3] - 0.587).abs() < 0.002);
    }

    #[test]
    fn blur_taps_sum_to_one_and_match_a_gaussian() {
        assert_eq!(BLUR_TAPS.iter().sum::<f32>(), 1.0);
        let g: Vec<f64> = (-2..=2)
            .map(|x: i32| (-(x * x) as f64 / 2.0).exp())
            .collect();
        let total: f64 = g.iter().sum();
        for (t, g) in BLUR_TAPS.iter().zip(&g) {
            assert!((*t as f64 - g / total).abs() < 0.03, "{t} vs {}", g / total);
        }
    }

    #[test]
    fn blur_preserves_a_constant_image() {
        let s = size(7, 5);
        for c in [0.5f32, 0.0, 1.0, 0.123_456_7] {
            let src = vec![c; s.pixels()];
            let mut scratch = vec![0.0; s.pixels()];
            let mut dst = vec![0.0; s.pixels()];
            gaussian_blur(s, &src, &mut scratch, &mut dst).unwrap();
            for &v in &dst {
                // Exact for dyadic values; a few ulps otherwise.
                assert!((v - c).abs() <= c * 4.0 * f32::EPSILON, "{v} vs {c}");
            }
            if c == 0.5 || c == 1.0 {
                assert!(dst.iter().all(|&v| v == c));
            }
        }
    }

    #[test]
    fn blur_of_an_impulse_is_the_outer_product_of_the_taps() {
        let s = size(9, 9);
        let mut src = vec![0.0f32; 81];
        src[4 * 9 + 4] = 1.0;
        let (mut scratch, mut dst) = (vec![0.0; 81], vec![0.0; 81]);
        gaussian_blur(s, &src, &mut scratch, &mut dst).unwrap();
        for y in 0..9 {
            for x in 0..9 {
                let w = |i: usize| {
                    if (2..=6).contains(&i) {
                        BLUR_TAPS[i - 2]
                    } else {
                        0.0
                    }
                };
                assert_eq!(dst[y * 9 + x], w(x) * w(y), "at ({x}, {y})");
            }
        }
        assert_eq!(dst.iter().sum::<f32>(), 1.0);
    }

    #[test]
    fn blur_clamps_to_the_edge() {
        // A step at the left border: clamping repeats the first column, so the left edge is
        // blurred against itself and stays 1.
        let s = size(6, 1);
        let src = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let mut dst = [0.0f32; 6];
        blur_horizontal(s, &src, &mut dst).unwrap();
        assert_eq!(dst, [0.6875, 0.3125, 0.0625, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn sobel_on_a_vertical_step_edge() {
        // Columns 0..4 are 0, columns 4..8 are 1: |gx| = 4 on both sides of the step.
        let s = size(8, 5);
        let src: Vec<f32> = (0..40)
            .map(|i| if i % 8 >= 4 { 1.0 } else { 0.0 })
            .collect();
        let mut mag = vec![-1.0; 40];
        sobel_magnitude(s, &src, &mut mag).unwrap();
        for y in 0..5 {
            let row = &mag[y * 8..(y + 1) * 8];
            assert_eq!(row, [0.0, 0.0, 0.0, 4.0, 4.0, 0.0, 0.0, 0.0], "row {y}");
        }
    }

    #[test]
    fn sobel_on_a_horizontal_step_and_a_diagonal_ramp() {
        let s = size(4, 6);
        let src: Vec<f32> = (0..24)
            .map(|i| if i / 4 >= 3 { 0.5 } else { 0.0 })
            .collect();
        let mut mag = vec![0.0; 24];
        sobel_magnitude(s, &src, &mut mag).unwrap();
        for (i, &m) in mag.iter().enumerate() {
            let want = if i / 4 == 2 || i / 4 == 3 { 2.0 } else { 0.0 };
            assert_eq!(m, want, "pixel {i}");
        }
        // A ramp f(x, y) = x + y: gx = gy = 8 inside, magnitude 8√2.
        let s = size(5, 5);
        let src: Vec<f32> = (0..25).map(|i| ((i % 5) + (i / 5)) as f32).collect();
        let mut mag = vec![0.0; 25];
        sobel_magnitude(s, &src, &mut mag).unwrap();
        assert_eq!(mag[2 * 5 + 2], (128.0f32).sqrt());
    }

    #[test]
    fn histogram_counts_every_pixel_once() {
        let mag = [0.0, 0.01, 1.0 / 64.0, 0.5, 0.5, 100.0, 3.99];
        let mut hist = vec![7u32; 256];
        histogram(&mag, &mut hist).unwrap();
        assert_eq!(hist.iter().sum::<u32>(), mag.len() as u32);
        assert_eq!(hist[0], 2);
        assert_eq!(hist[1], 1);
        assert_eq!(hist[32], 2);
        assert_eq!(hist[255], 2);
    }

    #[test]
    fn otsu_separates_a_bimodal_histogram() {
        // Two gaussian-ish modes around bins 40 and 170.
        let mut hist = [0u32; 256];
        for d in 0..=10u32 {
            let c = 100 - d * 9;
            hist[(40 - d) as usize] += c;
            hist[(40 + d) as usize] += c;
            hist[(170 - d) as usize] += c / 2;
            hist[(170 + d) as usize] += c / 2;
        }
        let t = otsu_threshold(&hist).unwrap();
        assert!(
            (50..160).contains(&t),
            "threshold {t} must fall between the modes"
        );
        // Nothing lies between the modes, so every t in 50..160 splits the same way; ties go to
        // the first.
        assert_eq!(t, 50);
    }

    #[test]
    fn otsu_by_brute_force() {
        // A lopsided three-mode histogram, against the textbook definition in f64.
        let mut hist = [0u32; 256];
        for (i, h) in hist.iter_mut().enumerate() {
            let x = i as f64;
            let v = 900.0 * (-(x - 20.0).powi(2) / 50.0).exp()
                + 300.0 * (-(x - 90.0).powi(2) / 200.0).exp()
                + 120.0 * (-(x - 200.0).powi(2) / 80.0).exp();
            *h = v as u32;
        }
        let total: f64 = hist.iter().map(|&c| c as f64).sum();
        let mean: f64 = hist
            .iter()
            .enumerate()
            .map(|(i, &c)| i as f64 * c as f64)
            .sum::<f64>()
            / total;
        let (mut best, mut best_t) = (0.0, 0);
        for t in 0..255 {
            let w0: f64 = hist[..=t].iter().map(|&c| c as f64).sum::<f64>() / total;
            let m0: f64 = hist[..=t]
                .iter()
                .enumerate()
                .map(|(i, &c)| i as f64 * c as f64)
                .sum::<f64>()
                / total;
            if w0 <= 0.0 || w0 >= 1.0 {
                continue;
            }
            let var = (mean * w0 - m0).powi(2) / (w0 * (1.0 - w0));
            if var > best {
                best = var;
                best_t = t as u32;
            }
        }
        assert_eq!(otsu_threshold(&hist).unwrap(), best_t);
    }

    #[test]
    fn otsu_degenerate_histograms() {
        let mut hist = [0u32; 256];
        assert_eq!(otsu_threshold(&hist).unwrap(), 255);
        hist[7] = 1000;
        assert_eq!(otsu_threshold(&hist).unwrap(), 255);
        hist[9] = 1;
        assert_eq!(otsu_threshold(&hist).unwrap(), 7);
        let e = otsu_threshold(&hist[..100]).unwrap_err();
        assert!(e.to_string().contains("holds 100 elements"), "{e}");
    }

    #[test]
    fn mask_is_binary_and_follows_the_bins() {
        let mag = [0.0, 10.0 / 64.0, 10.5 / 64.0, 11.0 / 64.0, 5.0];
        let mut mask = [1u8; 5];
        edge_mask(&mag, 10, &mut mask).unwrap();
        assert_eq!(mask, [0, 0, 0, 255, 255]);
    }

    #[test]
    fn wrong_sizes_are_errors_that_name_the_buffer() {
        let s = size(4, 4);
        let e = rgb_to_gray(s, &[0; 47], &mut [0.0; 16]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "grayscale: `rgb` holds 47 elements, a 4×4 image needs 48"
        );
        let e = sobel_magnitude(s, &[0.0; 16], &mut [0.0; 15]).unwrap_err();
        assert!(e.to_string().contains("`magnitude` holds 15"), "{e}");
        let e = edge_mask(&[0.0; 3], 0, &mut [0; 4]).unwrap_err();
        assert!(e.to_string().contains("`mask` holds 4"), "{e}");
        let e = histogram(&[0.0; 3], &mut [0; 255]).unwrap_err();
        assert!(e.to_string().contains("must hold 256"), "{e}");
    }

    #[test]
    fn a_whole_small_frame_finds_a_square() {
        // A bright 8×8 square on a dark 24×24 image.
        let s = size(24, 24);
        let mut rgb = vec![20u8; s.pixels() * 3];
        for y in 8..16 {
            for x in 8..16 {
                rgb[(y * 24 + x) * 3..][..3].fill(220);
            }
        }
        let n = s.pixels();
        let (mut gray, mut scratch, mut blurred, mut magnitude) =
            (vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; n]);
        let (mut hist, mut threshold, mut mask) = (vec![0u32; 256], vec![0u32; 1], vec![0u8; n]);
        let t = run_frame(
            s,
            FrameBuffers {
                rgb: &mut rgb,
                gray: &mut gray,
                scratch: &mut scratch,
                blurred: &mut blurred,
                magnitude: &mut magnitude,
                hist: &mut hist,
                threshold: &mut threshold,
                mask: &mut mask,
            },
        )
        .unwrap();
        assert_eq!(threshold[0], t);
        assert_eq!(hist.iter().sum::<u32>(), n as u32);
        // The square's border is an edge, its centre and the far background are not.
        for i in 8..16 {
            for (x, y) in [(i, 8), (i, 15), (8, i), (15, i)] {
                assert_eq!(mask[y * 24 + x], 255, "border ({x}, {y})");
            }
        }
        for (x, y) in [(11, 11), (12, 12), (0, 0), (23, 23), (0, 23), (2, 12)] {
            assert_eq!(mask[y * 24 + x], 0, "({x}, {y})");
        }
    }
}
