//! An image pipeline whose every buffer lives in one [`Frame`] arena, planned for the largest
//! frame it takes ([`MAX_SIZE`], 3840 × 2160) and run on each image at its own size.
//!
//! Stages, in order (each one reads the previous one's output):
//!
//! | stage | reads | writes | definition |
//! | --- | --- | --- | --- |
//! | [`Stage::Grayscale`] | `rgb` | `gray` | `y = 77 r + 150 g + 29 b` (integer BT.601 luma, weights /256), `gray = y / 65280` in `[0, 1]` |
//! | [`Stage::BlurHorizontal`] | `gray` | `scratch` | 5-tap binomial `[1 4 6 4 1] / 16` (the discrete Gaussian with σ = 1) along rows, clamp-to-edge |
//! | [`Stage::BlurVertical`] | `scratch` | `blurred` | the same taps along columns |
//! | [`Stage::Sobel`] | `blurred` | `magnitude` | 3×3 Sobel `gx`, `gy`, clamp-to-edge, `sqrt(gx² + gy²)` |
//! | [`Stage::Histogram`] | `magnitude` | `hist` | 256 bins of [`magnitude_bin`]: `min(255, trunc(64 · m))` |
//! | [`Stage::Otsu`] | `hist` | `threshold` | Otsu's threshold over the bins, see [`host::otsu_threshold`] |
//! | [`Stage::Mask`] | `magnitude`, `threshold` | `mask` | `255` where `magnitude_bin(m) > threshold`, else `0` |
//!
//! Two layouts hold the buffers: [`Frame`], where every buffer has bytes of its own, and
//! [`FrameStaged`], planned with stages so that buffers whose live ranges never meet share
//! bytes (60% less memory); on it each stage reaches its buffers only through its own stage
//! views ([`host::run_frame_staged`], and `cuda::PipelineKernels::run_frame_staged`), and the
//! results are bit-identical to [`Frame`]'s. [`Frame`] is the one pipeline layout of the
//! workspace: the example, the benchmarks and the tests all use it; [`FramePaged`] holds the
//! same buffers on separate 2 MiB pages, for the benchmark's diagnostics.
//!
//! **Sizes.** The layouts are planned at compile time for [`MAX_PIXELS`] pixels (3840 × 2160,
//! 4K UHD); an image of any size up to that many pixels runs at its own size. Each stage takes
//! the image's width and height and uses the first `width · height` elements of every buffer
//! (the views cut to the image: [`host::run_frame`] and `cuda::PipelineKernels::run_frame`
//! check that every buffer holds at least that many and touch nothing beyond). An image larger
//! than the maximum is downscaled to fit, keeping its aspect ratio ([`ImageSize::fit`],
//! [`image::resample`]). [`FRAME_SIZE`] (1920 × 1080) is the size of the synthetic test frame
//! and of the benchmark's main rows.
//!
//! [`host`] is the reference implementation (plain Rust, always compiled); `cuda` (feature
//! `cuda`) runs the same stages as PTX kernels. The floating-point stages are written so the
//! two agree bit for bit: the same operations in the same order, every one of them a single
//! IEEE-754 round-to-nearest operation (no fused multiply-add, no approximate division or square
//! root, no flush-to-zero). The integer stages are exact by construction.

pub mod host;
pub mod image;

#[cfg(feature = "cuda")]
pub mod cuda;

use devarena::{DeviceLayout, Error, ViewKind};

/// Width of the default frame (the synthetic test frame, the benchmark's main size).
pub const WIDTH: usize = 1920;
/// Height of the default frame.
pub const HEIGHT: usize = 1080;
/// Pixels of the default frame.
pub const PIXELS: usize = WIDTH * HEIGHT;
/// The largest frame the layouts are planned for: 3840 × 2160 (4K UHD). Any image of at most
/// [`MAX_PIXELS`] pixels and [`MAX_ROWS`] rows runs at its own size, a portrait 2160 × 3840
/// one too; [`ImageSize::fit`] downscales a larger one.
pub const MAX_SIZE: ImageSize = ImageSize {
    width: 3840,
    height: 2160,
};
/// Pixels every buffer of the layouts has room for: [`MAX_SIZE`]'s.
pub const MAX_PIXELS: usize = MAX_SIZE.pixels();
/// Block shape of the 2-D kernels (blur, Sobel): 32 × 8 threads.
pub(crate) const BLOCK_2D: (u32, u32) = (32, 8);
/// Most rows one launch of the 2-D kernels covers: a grid is at most 65,535 blocks high.
pub const MAX_ROWS: usize = 65_535 * BLOCK_2D.1 as usize;
/// Histogram bins.
pub const HIST_BINS: usize = 256;
/// Histogram bins per unit of gradient magnitude: bin `b` holds magnitudes in
/// `[b / 64, (b + 1) / 64)`, the last bin everything from `255 / 64` up. A power of two, so
/// scaling a magnitude is exact.
pub const HIST_SCALE: f32 = 64.0;
/// The blur's taps, `[1 4 6 4 1] / 16`: exact in binary floating point.
pub const BLUR_TAPS: [f32; 5] = [0.0625, 0.25, 0.375, 0.25, 0.0625];
/// The Gaussian σ the blur approximates (a binomial kernel of `n + 1` taps has variance `n / 4`).
pub const BLUR_SIGMA: f32 = 1.0;
/// Integer luma weights for red, green and blue, out of 256 (ITU-R BT.601: 0.299, 0.587, 0.114).
pub const LUMA_WEIGHTS: [u32; 3] = [77, 150, 29];
/// `255 · 256`: the largest weighted luma sum, which grayscale maps to `1.0`.
pub const LUMA_DIVISOR: f32 = 65280.0;

/// The default frame: 1920 × 1080.
pub const FRAME_SIZE: ImageSize = ImageSize {
    width: WIDTH,
    height: HEIGHT,
};

/// Every buffer of the pipeline, for one frame of up to [`MAX_PIXELS`] pixels, in one
/// allocation.
///
/// The stage buffers, the blur's scratch buffer, the histogram and the threshold all live here:
/// after the arena is made, running a frame of any size up to the maximum allocates nothing.
/// A frame of `width · height` pixels uses the first `width · height` elements of each image
/// buffer.
///
/// The struct is a plan, never a value: its fields are only ever reached through an arena's
/// views.
#[derive(Debug, DeviceLayout)]
#[layout(max_bytes = 192 << 20)]
#[allow(dead_code)]
pub struct Frame {
    /// Input, 8-bit RGB interleaved.
    rgb: [u8; MAX_PIXELS * 3],
    /// Luma in `[0, 1]`.
    gray: [f32; MAX_PIXELS],
    /// The blur's intermediate (horizontal pass).
    scratch: [f32; MAX_PIXELS],
    /// The blurred luma.
    blurred: [f32; MAX_PIXELS],
    /// Sobel gradient magnitude.
    magnitude: [f32; MAX_PIXELS],
    /// Histogram of the magnitude's bins.
    hist: [u32; HIST_BINS],
    /// Otsu's threshold (a bin index), written by the device so the mask stage needs no host
    /// round trip.
    threshold: [u32; 1],
    /// Binary edge mask: 0 or 255.
    mask: [u8; MAX_PIXELS],
}

/// The alignment of every [`FramePaged`] buffer: the 2 MiB page that sizes over 2 MiB take on
/// the target GPU, so each buffer starts a page of its own, as a separate `cuMemAlloc` of it
/// would.
pub const PAGE_ALIGN: usize = 2 << 20;

/// [`Frame`]'s buffers, each on a 2 MiB page of its own: a diagnostic layout, not one to run a
/// pipeline on (it spends up to 2 MiB of padding per buffer).
///
/// Separate `cuMemAlloc`s of the frame's buffers land on separate pages; one [`Frame`] arena
/// packs them. Running a frame on both tells how much of a difference in frame time is the
/// buffers' placement rather than the arena (the pipeline benchmark's "every field 2
/// MiB-aligned" row). Same fields, same order, same sizes as [`Frame`]:
///
/// ```
/// use devarena::DeviceLayout;
/// use devarena_kernels::pipeline::{Frame, FramePaged, PAGE_ALIGN};
///
/// assert_eq!(FramePaged::FIELDS.len(), Frame::FIELDS.len());
/// for (paged, frame) in FramePaged::FIELDS.iter().zip(Frame::FIELDS) {
///     assert_eq!((paged.name, paged.size), (frame.name, frame.size));
///     assert_eq!(paged.offset % PAGE_ALIGN, 0);
/// }
/// ```
#[derive(Debug, DeviceLayout)]
#[layout(align = PAGE_ALIGN)]
#[allow(dead_code)]
pub struct FramePaged {
    /// As [`Frame`]'s.
    rgb: [u8; MAX_PIXELS * 3],
    /// As [`Frame`]'s.
    gray: [f32; MAX_PIXELS],
    /// As [`Frame`]'s.
    scratch: [f32; MAX_PIXELS],
    /// As [`Frame`]'s.
    blurred: [f32; MAX_PIXELS],
    /// As [`Frame`]'s.
    magnitude: [f32; MAX_PIXELS],
    /// As [`Frame`]'s.
    hist: [u32; HIST_BINS],
    /// As [`Frame`]'s.
    threshold: [u32; 1],
    /// As [`Frame`]'s.
    mask: [u8; MAX_PIXELS],
}

/// The same buffers as [`Frame`], planned with stages: buffers whose live ranges never meet
/// share bytes, and the pipeline reaches each buffer only through the views of the stages it
/// is live in (`arena.gray_mut()`, `arena.blur_rows_mut()`, ...: see [`FrameStagedStages`]).
///
/// | stage | runs | live buffers |
/// | --- | --- | --- |
/// | `decode` | the input lands in `rgb` | `rgb` |
/// | `gray` | [`Stage::Grayscale`] | `rgb`, `gray` |
/// | `blur_rows` | [`Stage::BlurHorizontal`] | `gray`, `scratch` |
/// | `blur_columns` | [`Stage::BlurVertical`] | `scratch`, `blurred` |
/// | `sobel` | [`Stage::Sobel`] | `blurred`, `magnitude` |
/// | `threshold` | [`Stage::Histogram`], [`Stage::Otsu`] | `magnitude`, `hist`, `threshold` |
/// | `mask` | [`Stage::Mask`] | `magnitude`, `threshold`, `mask` |
///
/// At most two full-frame float buffers are live at once, so the plan needs about 40% of
/// [`Frame`]'s bytes:
///
/// ```
/// use devarena::DeviceLayout;
/// use devarena_kernels::pipeline::{Frame, FrameStaged, MAX_PIXELS};
///
/// assert_eq!(FrameStaged::UNALIASED_SIZE, Frame::SIZE);
/// assert_eq!(FrameStaged::PEAK_LIVE_BOUND, 2 * MAX_PIXELS * 4); // e.g. gray + scratch
/// assert_eq!(FrameStaged::SIZE, FrameStaged::PEAK_LIVE_BOUND); // the plan reaches the bound
/// ```
///
/// A frame's input must be written again every frame (stage `decode`): its bytes are reused
/// by later stages. [`host::run_frame_staged`] and (feature `cuda`)
/// `PipelineKernels::run_frame_staged` run a frame on it.
#[derive(Debug, DeviceLayout)]
#[layout(
    max_bytes = 80 << 20,
    stages(decode, gray, blur_rows, blur_columns, sobel, threshold, mask)
)]
#[allow(dead_code)]
pub struct FrameStaged {
    /// Input, 8-bit RGB interleaved: written by `decode`, read by `gray`.
    #[layout(live = decode..=gray)]
    rgb: [u8; MAX_PIXELS * 3],
    /// Luma in `[0, 1]`.
    #[layout(live = gray..=blur_rows)]
    gray: [f32; MAX_PIXELS],
    /// The blur's intermediate (horizontal pass).
    #[layout(live = blur_rows..=blur_columns)]
    scratch: [f32; MAX_PIXELS],
    /// The blurred luma.
    #[layout(live = blur_columns..=sobel)]
    blurred: [f32; MAX_PIXELS],
    /// Sobel gradient magnitude: read by the histogram and by the mask.
    #[layout(live = sobel..=mask)]
    magnitude: [f32; MAX_PIXELS],
    /// Histogram of the magnitude's bins.
    #[layout(live = threshold)]
    hist: [u32; HIST_BINS],
    /// Otsu's threshold (a bin index), read by the mask stage on the device.
    #[layout(live = threshold..=mask)]
    threshold: [u32; 1],
    /// Binary edge mask: 0 or 255.
    #[layout(live = mask)]
    mask: [u8; MAX_PIXELS],
}

/// The names of [`FrameStaged`]'s stages, in order.
pub const FRAME_STAGED_STAGES: [&str; 7] = [
    "decode",
    "gray",
    "blur_rows",
    "blur_columns",
    "sobel",
    "threshold",
    "mask",
];

/// Every stage output of one frame, copied out: what the PNGs are made of and what tests
/// compare. On an aliased arena each buffer is copied in the last stage it is live in, before
/// its bytes are reused.
#[derive(Debug, Clone)]
pub struct FrameOutputs {
    /// The size of the frame.
    pub size: ImageSize,
    /// Luma.
    pub gray: Vec<f32>,
    /// The blur's intermediate.
    pub scratch: Vec<f32>,
    /// Blurred luma.
    pub blurred: Vec<f32>,
    /// Gradient magnitude.
    pub magnitude: Vec<f32>,
    /// Histogram.
    pub hist: Vec<u32>,
    /// Otsu's threshold.
    pub threshold: u32,
    /// Edge mask.
    pub mask: Vec<u8>,
}

impl FrameOutputs {
    /// Zeroed buffers for a frame of `size` (made once; copying into them allocates nothing).
    ///
    /// # Panics
    ///
    /// As `vec!`, when the buffers of `size` cannot be allocated (a size past what
    /// [`ImageSize::check`] allows, say): [`try_new`](Self::try_new) returns an error instead.
    pub fn new(size: ImageSize) -> Self {
        let n = size.pixels();
        FrameOutputs {
            size,
            gray: vec![0.0; n],
            scratch: vec![0.0; n],
            blurred: vec![0.0; n],
            magnitude: vec![0.0; n],
            hist: vec![0; HIST_BINS],
            threshold: 0,
            mask: vec![0; n],
        }
    }

    /// [`new`](Self::new), with an error naming the size where `size` is refused by
    /// [`ImageSize::check`] or its buffers cannot be allocated.
    pub fn try_new(size: ImageSize) -> Result<Self, Error> {
        size.check("frame outputs")?;
        let n = size.pixels();
        let refused = |what: &str| {
            invalid(format!(
                "frame outputs: the {what} buffer of a {size} frame ({n} pixels) cannot be \
                 allocated"
            ))
        };
        fn zeroed<T: Clone + Default>(n: usize) -> Option<Vec<T>> {
            let mut v = Vec::new();
            v.try_reserve_exact(n).ok()?;
            v.resize(n, T::default());
            Some(v)
        }
        Ok(FrameOutputs {
            size,
            gray: zeroed(n).ok_or_else(|| refused("gray"))?,
            scratch: zeroed(n).ok_or_else(|| refused("scratch"))?,
            blurred: zeroed(n).ok_or_else(|| refused("blurred"))?,
            magnitude: zeroed(n).ok_or_else(|| refused("magnitude"))?,
            hist: vec![0; HIST_BINS],
            threshold: 0,
            mask: zeroed(n).ok_or_else(|| refused("mask"))?,
        })
    }

    /// Copies every stage output of a frame of `self.size` out of a frame's buffers (host
    /// slices holding at least that frame: the first `pixels` elements are copied).
    pub fn copy_from<B8, BF, BU>(&mut self, b: &FrameBuffers<'_, B8, BF, BU>) -> Result<(), Error>
    where
        B8: AsRef<[u8]> + ?Sized,
        BF: AsRef<[f32]> + ?Sized,
        BU: AsRef<[u32]> + ?Sized,
    {
        let size = self.size;
        let copy_image = |name: &str, dst: &mut [f32], src: &[f32]| {
            copy_out(
                name,
                dst,
                image_prefix("outputs", name, src, dst.len(), size)?,
            )
        };
        copy_image("gray", &mut self.gray, b.gray.as_ref())?;
        copy_image("scratch", &mut self.scratch, b.scratch.as_ref())?;
        copy_image("blurred", &mut self.blurred, b.blurred.as_ref())?;
        copy_image("magnitude", &mut self.magnitude, b.magnitude.as_ref())?;
        copy_out("hist", &mut self.hist, b.hist.as_ref())?;
        check_len("outputs", "threshold", b.threshold.as_ref().len(), 1, None)?;
        self.threshold = b.threshold.as_ref()[0];
        let mask = image_prefix("outputs", "mask", b.mask.as_ref(), self.mask.len(), size)?;
        copy_out("mask", &mut self.mask, mask)
    }

    /// The first difference from `other`, bit for bit (floats compared by their bits, so
    /// `-0.0 ≠ 0.0` and NaNs compare by payload), naming the buffer and the element; `None`
    /// when the two are bit-identical.
    pub fn first_difference(&self, other: &FrameOutputs) -> Option<String> {
        fn floats(name: &str, a: &[f32], b: &[f32]) -> Option<String> {
            if a.len() != b.len() {
                return Some(format!("`{name}`: {} vs {} elements", a.len(), b.len()));
            }
            let i = a
                .iter()
                .zip(b)
                .position(|(x, y)| x.to_bits() != y.to_bits())?;
            Some(format!("`{name}`[{i}]: {:e} vs {:e}", a[i], b[i]))
        }
        fn ints<T: PartialEq + core::fmt::Debug>(name: &str, a: &[T], b: &[T]) -> Option<String> {
            if a.len() != b.len() {
                return Some(format!("`{name}`: {} vs {} elements", a.len(), b.len()));
            }
            let i = a.iter().zip(b).position(|(x, y)| x != y)?;
            Some(format!("`{name}`[{i}]: {:?} vs {:?}", a[i], b[i]))
        }
        if self.size != other.size {
            return Some(format!("size: {} vs {}", self.size, other.size));
        }
        floats("gray", &self.gray, &other.gray)
            .or_else(|| floats("scratch", &self.scratch, &other.scratch))
            .or_else(|| floats("blurred", &self.blurred, &other.blurred))
            .or_else(|| floats("magnitude", &self.magnitude, &other.magnitude))
            .or_else(|| ints("hist", &self.hist, &other.hist))
            .or_else(|| ints("threshold", &[self.threshold], &[other.threshold]))
            .or_else(|| ints("mask", &self.mask, &other.mask))
    }
}

/// The width and height of an image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ImageSize {
    /// Pixels per row.
    pub width: usize,
    /// Rows.
    pub height: usize,
}

impl ImageSize {
    /// A size; see [`check`](Self::check) for the limits.
    pub const fn new(width: usize, height: usize) -> Self {
        ImageSize { width, height }
    }

    /// `width · height` (saturating; [`check`](Self::check) rejects sizes where it saturates).
    pub const fn pixels(&self) -> usize {
        self.width.saturating_mul(self.height)
    }

    /// Whether the pipeline runs an image of this size as it is: at most [`MAX_PIXELS`] pixels
    /// (the layouts' room) and [`MAX_ROWS`] rows (one launch of the 2-D kernels).
    pub const fn fits(&self) -> bool {
        self.pixels() <= MAX_PIXELS && self.height <= MAX_ROWS
    }

    /// The size the pipeline runs an image of this size at: its own when it
    /// [`fits`](Self::fits), else the largest size of the same aspect ratio that fits (both
    /// sides scaled by one factor and rounded down, each at least 1). An empty size stays
    /// empty (and is refused by [`check`](Self::check)).
    ///
    /// ```
    /// use devarena_kernels::pipeline::{ImageSize, MAX_PIXELS};
    ///
    /// assert_eq!(ImageSize::new(1, 1).fit(), ImageSize::new(1, 1));
    /// assert_eq!(ImageSize::new(2160, 3840).fit(), ImageSize::new(2160, 3840)); // fits as it is
    /// let fitted = ImageSize::new(5000, 3000).fit();
    /// assert_eq!(fitted, ImageSize::new(3718, 2230));
    /// assert!(fitted.pixels() <= MAX_PIXELS);
    /// ```
    pub fn fit(self) -> ImageSize {
        if self.width == 0 || self.height == 0 || self.fits() {
            return self;
        }
        let (w, h) = (self.width as f64, self.height as f64);
        let scale = (MAX_PIXELS as f64 / (w * h))
            .sqrt()
            .min(MAX_ROWS as f64 / h)
            .min(MAX_PIXELS as f64 / w);
        let mut fitted = ImageSize::new(
            ((w * scale) as usize).clamp(1, self.width),
            ((h * scale) as usize).clamp(1, self.height),
        );
        // The square root may round up by an ulp: step the longer side down until it fits.
        while !fitted.fits() {
            if fitted.height > MAX_ROWS || fitted.height > fitted.width {
                fitted.height -= 1;
            } else {
                fitted.width -= 1;
            }
        }
        fitted
    }

    /// Rejects empty images and images whose byte sizes or pixel counts do not fit the `u32`
    /// counters and indices the stages use.
    pub fn check(&self, stage: &str) -> Result<(), Error> {
        let bytes = self
            .width
            .checked_mul(self.height)
            .and_then(|p| p.checked_mul(3));
        if self.width == 0 || self.height == 0 {
            return Err(invalid(format!(
                "{stage}: image of {}×{} pixels is empty",
                self.width, self.height
            )));
        }
        match bytes {
            Some(b) if b <= u32::MAX as usize => Ok(()),
            _ => Err(invalid(format!(
                "{stage}: image of {}×{} pixels is too large: at most {} RGB bytes are supported",
                self.width,
                self.height,
                u32::MAX
            ))),
        }
    }
}

impl core::fmt::Display for ImageSize {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}×{}", self.width, self.height)
    }
}

/// A pipeline stage, in execution order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// RGB to luma.
    Grayscale,
    /// The blur's pass along rows.
    BlurHorizontal,
    /// The blur's pass along columns.
    BlurVertical,
    /// Sobel gradient magnitude.
    Sobel,
    /// 256-bin histogram of the magnitude's bins.
    Histogram,
    /// Otsu's threshold from the histogram.
    Otsu,
    /// Binary edge mask.
    Mask,
}

impl Stage {
    /// Every stage, in execution order.
    pub const ALL: [Stage; 7] = [
        Stage::Grayscale,
        Stage::BlurHorizontal,
        Stage::BlurVertical,
        Stage::Sobel,
        Stage::Histogram,
        Stage::Otsu,
        Stage::Mask,
    ];

    /// A short name for tables.
    pub const fn name(self) -> &'static str {
        match self {
            Stage::Grayscale => "grayscale",
            Stage::BlurHorizontal => "blur (rows)",
            Stage::BlurVertical => "blur (columns)",
            Stage::Sobel => "sobel",
            Stage::Histogram => "histogram",
            Stage::Otsu => "otsu",
            Stage::Mask => "mask",
        }
    }

    /// Position in [`Stage::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// The histogram bin of a gradient magnitude: `min(255, trunc(64 · m))`.
///
/// The scale is a power of two, so `64 · m` is exact; the host and the device compute the same
/// bin for the same magnitude. Negative values and NaN fall in bin 0, `+∞` in bin 255.
///
/// ```
/// use devarena_kernels::pipeline::magnitude_bin;
/// assert_eq!(magnitude_bin(0.0), 0);
/// assert_eq!(magnitude_bin(1.0 / 64.0), 1);
/// assert_eq!(magnitude_bin(0.999 / 64.0), 0);
/// assert_eq!(magnitude_bin(4.0), 255);
/// ```
#[inline]
pub fn magnitude_bin(magnitude: f32) -> u32 {
    // `clamp` keeps NaN, which the saturating `as` then maps to 0 (as the device's
    // `__float2uint_rz` does); `as` truncates toward zero. Going through `i32` lets the
    // compiler vectorize the conversion.
    (magnitude * HIST_SCALE).clamp(0.0, 255.0) as i32 as u32
}

/// Every buffer of one frame, borrowed: what the host and device pipelines run on.
///
/// The type parameters are the buffer types per element type: `Vec<u8>` or `&mut [u8]` on the
/// host, device slices or views with `cuda`. Make one from an arena's views with `From`:
///
/// ```
/// use devarena::Arena;
/// use devarena_kernels::pipeline::{Frame, FrameBuffers, FRAME_SIZE, host};
///
/// let mut arena = Arena::<Frame>::new()?;
/// let mut views = arena.views_mut();
/// views.rgb.fill(128);
/// let threshold = host::run_frame(FRAME_SIZE, FrameBuffers::from(&mut views))?;
/// assert_eq!(threshold, 255); // a flat image has no edges
/// assert!(views.mask.iter().all(|&m| m == 0));
/// # Ok::<(), devarena::Error>(())
/// ```
#[derive(Debug)]
pub struct FrameBuffers<'f, B8: ?Sized, BF: ?Sized, BU: ?Sized> {
    /// Input RGB, `3 · pixels` bytes.
    pub rgb: &'f mut B8,
    /// Luma, `pixels` floats.
    pub gray: &'f mut BF,
    /// The blur's intermediate, `pixels` floats.
    pub scratch: &'f mut BF,
    /// Blurred luma, `pixels` floats.
    pub blurred: &'f mut BF,
    /// Gradient magnitude, `pixels` floats.
    pub magnitude: &'f mut BF,
    /// Histogram, 256 counters.
    pub hist: &'f mut BU,
    /// Otsu's threshold, one counter.
    pub threshold: &'f mut BU,
    /// Edge mask, `pixels` bytes.
    pub mask: &'f mut B8,
}

impl<B8: ?Sized, BF: ?Sized, BU: ?Sized> FrameBuffers<'_, B8, BF, BU> {
    /// The same buffers, borrowed for a shorter time: run one frame after another on them.
    pub fn reborrow(&mut self) -> FrameBuffers<'_, B8, BF, BU> {
        FrameBuffers {
            rgb: self.rgb,
            gray: self.gray,
            scratch: self.scratch,
            blurred: self.blurred,
            magnitude: self.magnitude,
            hist: self.hist,
            threshold: self.threshold,
            mask: self.mask,
        }
    }
}

impl<'f, 'v, K: ViewKind> From<&'f mut FrameViews<'v, K>>
    for FrameBuffers<'f, K::Slice<'v, u8>, K::Slice<'v, f32>, K::Slice<'v, u32>>
{
    fn from(v: &'f mut FrameViews<'v, K>) -> Self {
        FrameBuffers {
            rgb: &mut v.rgb,
            gray: &mut v.gray,
            scratch: &mut v.scratch,
            blurred: &mut v.blurred,
            magnitude: &mut v.magnitude,
            hist: &mut v.hist,
            threshold: &mut v.threshold,
            mask: &mut v.mask,
        }
    }
}

pub(crate) fn invalid(what: String) -> Error {
    Error::InvalidArgument { what }
}

/// The first `needed` elements of a buffer that holds a frame of `size`: an error naming the
/// stage, the buffer and the numbers when it holds fewer.
pub(crate) fn image_prefix<'b, T>(
    stage: &str,
    buffer: &str,
    src: &'b [T],
    needed: usize,
    size: ImageSize,
) -> Result<&'b [T], Error> {
    check_room(stage, buffer, src.len(), needed, size)?;
    Ok(&src[..needed])
}

/// [`image_prefix`], mutable.
pub(crate) fn image_prefix_mut<'b, T>(
    stage: &str,
    buffer: &str,
    src: &'b mut [T],
    needed: usize,
    size: ImageSize,
) -> Result<&'b mut [T], Error> {
    check_room(stage, buffer, src.len(), needed, size)?;
    Ok(&mut src[..needed])
}

/// Checks that a buffer has room for the `needed` elements of a frame of `size`.
pub(crate) fn check_room(
    stage: &str,
    buffer: &str,
    len: usize,
    needed: usize,
    size: ImageSize,
) -> Result<(), Error> {
    if len >= needed {
        return Ok(());
    }
    Err(invalid(format!(
        "{stage}: `{buffer}` holds {len} elements, a {size} image needs {needed}"
    )))
}

/// Copies a stage output into its `FrameOutputs` buffer (same length, else an error naming it).
pub(crate) fn copy_out<T: Copy>(name: &str, dst: &mut [T], src: &[T]) -> Result<(), Error> {
    check_len("outputs", name, dst.len(), src.len(), None)?;
    dst.copy_from_slice(src);
    Ok(())
}

/// Checks that a buffer holds exactly `expected` elements.
pub(crate) fn check_len(
    stage: &str,
    buffer: &str,
    len: usize,
    expected: usize,
    size: Option<ImageSize>,
) -> Result<(), Error> {
    if len == expected {
        return Ok(());
    }
    let of = match size {
        Some(s) => format!("a {s} image needs {expected}"),
        None => format!("it must hold {expected}"),
    };
    Err(invalid(format!(
        "{stage}: `{buffer}` holds {len} elements, {of}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_outputs_of_a_size_past_the_limits_are_an_error() {
        for (w, h) in [
            (0, 10),
            (usize::MAX, 2),
            (1 << 32, 1 << 32),
            (70_000, 70_000),
        ] {
            let size = ImageSize::new(w, h);
            let Err(err) = FrameOutputs::try_new(size) else {
                panic!("{size}: not refused");
            };
            assert!(err.to_string().contains(&format!("{w}×{h}")), "{err}");
        }
        let ok = FrameOutputs::try_new(ImageSize::new(640, 480)).unwrap();
        assert_eq!(
            (ok.gray.len(), ok.mask.len(), ok.hist.len()),
            (307_200, 307_200, HIST_BINS)
        );
        assert!(ok.gray.iter().chain(&ok.magnitude).all(|&x| x == 0.0) && ok.threshold == 0);
    }

    #[test]
    fn fitting_keeps_the_aspect_ratio_and_the_limits() {
        for (w, h) in [
            (5000, 3000),
            (3000, 5000),
            (3841, 2160),
            (100_000, 100_000),
            (1, 100_000_000),
            (100_000_000, 1),
            (600_000, 2),
            (7, 600_000),
        ] {
            let size = ImageSize::new(w, h);
            let fitted = size.fit();
            assert!(fitted.fits(), "{size} → {fitted}");
            assert!(fitted.width >= 1 && fitted.height >= 1, "{size} → {fitted}");
            assert!(fitted.width <= w && fitted.height <= h, "{size} → {fitted}");
            // The same aspect ratio, up to the rounding of each side (and the 1-pixel floor).
            let (a, b) = (
                w as f64 / h as f64,
                fitted.width as f64 / fitted.height as f64,
            );
            if fitted.width > 100 && fitted.height > 100 {
                assert!((a / b - 1.0).abs() < 0.01, "{size} → {fitted}: {a} vs {b}");
            }
            // Bounded by the pixel count, it uses almost all of it.
            if fitted.width > 100 && fitted.height > 100 && fitted.height < MAX_ROWS {
                assert!(
                    fitted.pixels() * 100 >= MAX_PIXELS * 99,
                    "{size} → {fitted}"
                );
            }
        }
        assert_eq!(MAX_SIZE.fit(), MAX_SIZE);
        assert_eq!(ImageSize::new(0, 7).fit(), ImageSize::new(0, 7));
        assert_eq!(ImageSize::new(1, MAX_ROWS + 1).fit().height, MAX_ROWS);
    }

    #[test]
    fn frame_layout_holds_every_stage_buffer() {
        let names: Vec<_> = Frame::FIELDS.iter().map(|f| f.name).collect();
        assert_eq!(
            names,
            [
                "rgb",
                "gray",
                "scratch",
                "blurred",
                "magnitude",
                "hist",
                "threshold",
                "mask"
            ]
        );
        assert_eq!(Frame::OFFSETS.gray, MAX_PIXELS * 3);
        assert_eq!(Frame::FIELDS[1].size, MAX_PIXELS * 4);
        // Every buffer is a multiple of 256 bytes except `threshold`: the only padding is
        // threshold's rounding up to the next 256-byte boundary.
        let requested: usize = Frame::FIELDS.iter().map(|f| f.size).sum();
        assert_eq!(Frame::SIZE, requested + 252);
        for f in Frame::FIELDS {
            assert_eq!(f.offset % 256, 0, "{} is not 256-byte aligned", f.name);
        }
    }

    #[test]
    fn magnitude_bins_cover_the_range() {
        assert_eq!(magnitude_bin(-1.0), 0);
        assert_eq!(magnitude_bin(f32::NAN), 0);
        assert_eq!(magnitude_bin(f32::INFINITY), 255);
        assert_eq!(magnitude_bin(254.999 / 64.0), 254);
        assert_eq!(magnitude_bin(255.0 / 64.0), 255);
        assert_eq!(magnitude_bin(4.0 * 2f32.sqrt()), 255);
        for b in 0..255u32 {
            assert_eq!(magnitude_bin(b as f32 / 64.0), b);
        }
    }

    #[test]
    fn image_size_limits() {
        assert!(FRAME_SIZE.check("t").is_ok());
        let e = ImageSize::new(0, 5).check("grayscale").unwrap_err();
        assert!(e.to_string().contains("0×5"), "{e}");
        let e = ImageSize::new(1 << 20, 1 << 20).check("sobel").unwrap_err();
        assert!(e.to_string().contains("too large"), "{e}");
    }
}
