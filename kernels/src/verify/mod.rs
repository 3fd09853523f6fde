//! The hardware verifier: PTX kernels that prove, on a real GPU, that every view of an arena
//! keeps its alignment promise and that no two views overlap. Any `#[derive(DeviceLayout)]`
//! layout will do; here, the image pipeline's:
//!
//! ```no_run
//! use devarena::Arena;
//! use devarena::backend::cuda::{cuda_stream, CudaBackend};
//! use devarena_kernels::pipeline::Frame;
//!
//! let stream = cuda_stream(0)?;
//! let mut arena = Arena::<Frame, _>::new_in(CudaBackend::new(stream))?;
//! let report = devarena_kernels::verify(&mut arena)?; // overwrites the arena's contents
//! println!("{report}");
//! assert!(report.passed());
//! # Ok::<(), devarena::Error>(())
//! ```
//!
//! A layout with stages shares bytes between fields whose live ranges never meet, so the
//! overlap check runs per stage instead: [`verify_stages`] checks, for every stage, that the
//! fields live in it are aligned and overlap none of each other, and shows on the device that
//! the fields the plan lets share bytes do share them.
//!
//! # Safe and raw entry points
//!
//! The kernels write the memory they check. The safe entry points ([`verify`],
//! [`verify_stages`], [`Verifier::verify`], [`Verifier::verify_stages`]) take the arena by
//! `&mut`, so no view of it exists while the device writes it, and they return only after every
//! kernel they queued has finished (on success and on error), so the views made afterwards see
//! memory the verifier no longer touches. They take device memory only
//! ([`VerifyTarget`]: device and managed arenas).
//!
//! The raw entry points ([`Verifier::alignment`], [`Verifier::disjoint`], [`Verifier::tma`],
//! [`Verifier::run`], [`Verifier::run_stages`]) take [`Region`]s, whose addresses the caller
//! chooses, and are `unsafe`: the caller promises that the regions are device memory it owns
//! and nothing else uses while the call runs.
//!
//! Every byte a kernel reads was written before, by the verifier itself or by the caller:
//! compute-sanitizer's initcheck finds no read of uninitialised device memory.

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg, sys,
};
use cudarc::nvrtc::Ptx;
use devarena::backend::cuda::{
    CudaBackend, ManagedBackend, describe_device, driver_error, synchronize_stream,
};
use devarena::{Arena, Backend, DeviceLayout, Disjoint, Error, LiveRange};

mod report;

pub use report::{
    AlignmentCheck, FieldReport, Region, Report, SharedBytes, StagesReport, TmaCheck,
};

/// PTX of the alignment and overlap kernels (`kernels/cuda/verify.cu`, compute_75).
pub const VERIFY_PTX: &str = include_str!("../../ptx/verify.ptx");
/// PTX of the Hopper bulk-tensor round trip (`kernels/cuda/tma.cu`, sm_90).
pub const TMA_PTX: &str = include_str!("../../ptx/tma.ptx");

/// Largest box the TMA kernel moves (its shared buffer).
const TMA_BOX_MAX: usize = 256;
/// Largest extent a tensor map is encoded over (1 GiB).
const TMA_MAP_MAX: u64 = 1 << 30;

/// A tensor map as a kernel parameter (`const __grid_constant__ CUtensorMap`).
#[repr(transparent)]
#[derive(Clone, Copy)]
struct TensorMapArg(sys::CUtensorMap);
// SAFETY: `CUtensorMap` is 128 plain bytes that the kernel receives by value.
unsafe impl DeviceRepr for TensorMapArg {}

/// The loaded verification kernels.
#[derive(Debug)]
pub struct Verifier {
    stream: Arc<CudaStream>,
    alignment: CudaFunction,
    fill: CudaFunction,
    check: CudaFunction,
    tma: Option<CudaFunction>,
    device: String,
}

fn drv(call: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Error {
    move |e| driver_error(call, e)
}

/// The byte the fill kernel writes at offset `j` of region `i` (same arithmetic as
/// `tag_byte` in `kernels/cuda/verify.cu`).
pub fn tag_byte(i: u32, j: u64) -> u8 {
    let mut h = i.wrapping_add(1).wrapping_mul(2_654_435_761);
    h ^= (j as u32).wrapping_mul(0x9E37_79B1).wrapping_add(h >> 15);
    (h ^ (h >> 8) ^ (h >> 16) ^ (h >> 24)) as u8
}

/// Device memory the verifier's kernels may write: the backends of the arenas that the safe
/// entry points accept, with the stream their work is ordered on. Implemented for
/// [`CudaBackend`] (device memory, `cuMemAlloc` or stream-ordered) and [`ManagedBackend`]
/// (managed memory); sealed, because a backend whose memory the device cannot address (host
/// memory) would make a safe call launch kernels on addresses the device does not own.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not device memory the verifier's kernels may write",
    label = "the verifier runs on device arenas",
    note = "verify an arena on `CudaBackend` or `ManagedBackend`"
)]
pub trait VerifyTarget: Backend + sealed::Sealed {
    /// The stream the arena's work is ordered on.
    fn stream(&self) -> &Arc<CudaStream>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for devarena::backend::cuda::CudaBackend {}
    impl Sealed for devarena::backend::cuda::ManagedBackend {}
}

impl VerifyTarget for CudaBackend {
    fn stream(&self) -> &Arc<CudaStream> {
        CudaBackend::stream(self)
    }
}

impl VerifyTarget for ManagedBackend {
    fn stream(&self) -> &Arc<CudaStream> {
        ManagedBackend::stream(self)
    }
}

impl Verifier {
    /// Loads the kernels on `stream`'s device (the TMA kernel only on sm_90 and newer).
    pub fn new(stream: &Arc<CudaStream>) -> Result<Self, Error> {
        let ctx = stream.context();
        let module = ctx
            .load_module(Ptx::from_src(VERIFY_PTX))
            .map_err(drv("cuModuleLoadData"))?;
        let load = |name: &str| {
            module
                .load_function(name)
                .map_err(drv("cuModuleGetFunction"))
        };
        let (major, _) = ctx
            .compute_capability()
            .map_err(drv("cuDeviceGetAttribute"))?;
        let tma = if major >= 9 {
            let m = ctx
                .load_module(Ptx::from_src(TMA_PTX))
                .map_err(drv("cuModuleLoadData"))?;
            Some(
                m.load_function("tma_roundtrip")
                    .map_err(drv("cuModuleGetFunction"))?,
            )
        } else {
            None
        };
        Ok(Verifier {
            stream: stream.clone(),
            alignment: load("verify_alignment")?,
            fill: load("verify_fill")?,
            check: load("verify_check")?,
            tma,
            device: describe_device(stream)?,
        })
    }

    /// The device the kernels run on.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Runs every check on every field of a device arena (see [`verify`]), on this verifier's
    /// stream. Overwrites the arena's contents, hence the `&mut`; returns once every kernel it
    /// queued has finished.
    ///
    /// The verifier's stream first waits for the work queued on the arena's stream, so any
    /// stream of the arena's context will do; an arena of another context is an
    /// [`Error::InvalidArgument`].
    pub fn verify<L: DeviceLayout + Disjoint, B: VerifyTarget>(
        &self,
        arena: &mut Arena<L, B>,
    ) -> Result<Report, Error> {
        self.order_after(arena)?;
        let regions = regions(arena);
        // SAFETY: the regions are the fields of the arena, inside its one live device
        // allocation (`VerifyTarget`: memory the device addresses), which the `&mut` borrow
        // keeps alive and away from every other user for the whole call; the verifier's stream
        // waits for the arena's earlier work (`order_after`), and `run` returns after its
        // kernels have finished.
        unsafe { self.run(arena.addr(), regions) }
    }

    /// The per-stage checks of a device arena whose layout has stages (see
    /// [`verify_stages`]), on this verifier's stream; ordered and returning as
    /// [`Verifier::verify`].
    pub fn verify_stages<L: DeviceLayout, B: VerifyTarget>(
        &self,
        arena: &mut Arena<L, B>,
    ) -> Result<StagesReport, Error> {
        if L::STAGES == 0 {
            return Err(Error::InvalidArgument {
                what: format!(
                    "verify stages: `{}` has no stages (no field shares bytes); verify it with \
                     `verify`",
                    L::NAME
                ),
            });
        }
        self.order_after(arena)?;
        let regions = regions(arena);
        // SAFETY: as in `verify`: the arena's fields, exclusively borrowed for the call.
        unsafe { self.run_stages(L::NAME, arena.addr(), &regions, L::LIVE, L::STAGES) }
    }

    /// Makes the verifier's stream wait for the work queued on the arena's stream.
    fn order_after<L: DeviceLayout, B: VerifyTarget>(
        &self,
        arena: &Arena<L, B>,
    ) -> Result<(), Error> {
        let theirs = arena.backend().stream();
        if theirs.context().cu_ctx() != self.stream.context().cu_ctx() {
            return Err(Error::InvalidArgument {
                what: format!(
                    "verify `{}`: the arena lives in the context of device {}, the verifier in \
                     that of device {}",
                    L::NAME,
                    theirs.context().ordinal(),
                    self.stream.context().ordinal()
                ),
            });
        }
        if theirs.cu_stream() != self.stream.cu_stream() {
            self.stream.join(theirs).map_err(drv("cuStreamWaitEvent"))?;
        }
        Ok(())
    }

    fn upload(&self, v: &[u64]) -> Result<CudaSlice<u64>, Error> {
        self.stream.clone_htod(v).map_err(drv("cuMemcpyHtoDAsync"))
    }

    /// Waits for every kernel the verifier queued, whatever `result` is, so that no kernel of
    /// a call still runs when it returns; the first error wins.
    fn settle<T>(&self, result: Result<T, Error>) -> Result<T, Error> {
        // (The driver's own wait: cudarc's first hands out an error recorded earlier in the
        // context object, without waiting.)
        let synced = synchronize_stream(&self.stream);
        let value = result?;
        synced.map(|()| value)
    }

    /// Launches the fill kernel: every region's first `sizes[i]` bytes get region `i`'s tag.
    ///
    /// # Safety
    ///
    /// `ptrs` and `sizes` hold `n` entries; every `[ptrs[i], ptrs[i] + sizes[i])` is device
    /// memory the caller owns and nothing else uses until the stream has run the kernel.
    unsafe fn launch_fill(
        &self,
        ptrs: &CudaSlice<u64>,
        sizes: &CudaSlice<u64>,
        n: usize,
        largest: usize,
    ) -> Result<LaunchConfig, Error> {
        let cfg = LaunchConfig {
            grid_dim: (
                (largest.div_ceil(256 * 16)).clamp(1, 1024) as u32,
                n.min(65_535) as u32,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let n32 = n as u32;
        // SAFETY: the kernel writes bytes [ptrs[i], ptrs[i] + sizes[i]) for i < n (the
        // caller's contract) and reads the two arrays, which hold n entries.
        unsafe {
            self.stream
                .launch_builder(&self.fill)
                .arg(ptrs)
                .arg(sizes)
                .arg(&n32)
                .launch(cfg)
        }
        .map_err(drv("cuLaunchKernel(verify_fill)"))?;
        Ok(cfg)
    }

    /// Runs the alignment kernel. A region whose address breaks its promise makes the hardware
    /// fail the launch: that comes back as `Err(Error::Driver { name:
    /// "CUDA_ERROR_MISALIGNED_ADDRESS", .. })`, and the CUDA context is unusable afterwards.
    ///
    /// Each region's first `min(size, 16)` bytes are written with its tag (the bytes of
    /// [`tag_byte`], as [`disjoint`](Self::disjoint) writes them) before the kernel loads and
    /// stores them back, so the kernel reads only bytes the verifier wrote. Returns after the
    /// kernels have finished.
    ///
    /// # Safety
    ///
    /// For every region, `addr..addr + size` must be device memory addressable in this
    /// verifier's context that the caller owns: it stays allocated until the call returns, no
    /// other code reads or writes it while the call runs (work queued earlier on another
    /// stream must have finished, or be ordered before this verifier's stream), and the caller
    /// gives up its first `min(size, 16)` bytes, which are overwritten.
    pub unsafe fn alignment(&self, regions: &[Region]) -> Result<Vec<AlignmentCheck>, Error> {
        let n = regions.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let checked = || -> Result<Vec<AlignmentCheck>, Error> {
            let ptrs = self.upload(&regions.iter().map(|r| r.addr).collect::<Vec<_>>())?;
            let aligns =
                self.upload(&regions.iter().map(|r| r.align as u64).collect::<Vec<_>>())?;
            let sizes = self.upload(&regions.iter().map(|r| r.size as u64).collect::<Vec<_>>())?;
            let heads = self.upload(
                &regions
                    .iter()
                    .map(|r| r.size.min(16) as u64)
                    .collect::<Vec<_>>(),
            )?;
            let mut residues = self
                .stream
                .alloc_zeros::<u64>(n)
                .map_err(drv("cuMemAlloc"))?;
            let mut widths = self
                .stream
                .alloc_zeros::<u32>(n)
                .map_err(drv("cuMemAlloc"))?;
            // SAFETY: the first `min(size, 16)` bytes of every region, which the caller gives
            // up (this function's contract).
            unsafe { self.launch_fill(&ptrs, &heads, n, 16)? };
            let n32 = n as u32;
            // SAFETY: the kernel reads n entries of the three input arrays and writes n entries
            // of the two outputs; each region's access stays inside the first `min(size, 16)`
            // bytes (width <= size, width <= 16), which the fill before it wrote, in stream
            // order.
            unsafe {
                self.stream
                    .launch_builder(&self.alignment)
                    .arg(&ptrs)
                    .arg(&aligns)
                    .arg(&sizes)
                    .arg(&mut residues)
                    .arg(&mut widths)
                    .arg(&n32)
                    .launch(LaunchConfig::for_num_elems(n32))
            }
            .map_err(drv("cuLaunchKernel(verify_alignment)"))?;
            synchronize_stream(&self.stream)?;
            let residues = self
                .stream
                .clone_dtoh(&residues)
                .map_err(drv("cuMemcpyDtoH"))?;
            let widths = self
                .stream
                .clone_dtoh(&widths)
                .map_err(drv("cuMemcpyDtoH"))?;
            Ok(residues
                .into_iter()
                .zip(widths)
                .map(|(residue, access_bytes)| AlignmentCheck {
                    residue,
                    access_bytes,
                })
                .collect())
        };
        self.settle(checked())
    }

    /// Fills every region entirely with its own tag, all at once, then counts per region the
    /// bytes that do not hold its tag: an overlap (or a region reaching into another) shows up
    /// as mismatches. Overwrites the regions; returns after the kernels have finished.
    ///
    /// # Safety
    ///
    /// As [`alignment`](Self::alignment), for every byte of every region: the caller gives up
    /// the regions' contents.
    pub unsafe fn disjoint(&self, regions: &[Region]) -> Result<Vec<u64>, Error> {
        let n = regions.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let checked = || -> Result<Vec<u64>, Error> {
            let ptrs = self.upload(&regions.iter().map(|r| r.addr).collect::<Vec<_>>())?;
            let sizes = self.upload(&regions.iter().map(|r| r.size as u64).collect::<Vec<_>>())?;
            let mut mismatches = self
                .stream
                .alloc_zeros::<u64>(n)
                .map_err(drv("cuMemAlloc"))?;
            let largest = regions.iter().map(|r| r.size).max().unwrap_or(0);
            // SAFETY: every byte of every region, which the caller gives up.
            let cfg = unsafe { self.launch_fill(&ptrs, &sizes, n, largest)? };
            let n32 = n as u32;
            // SAFETY: the kernel reads bytes [addr, addr + size) of every region, which the
            // fill before it wrote (stream order), and adds to n counters.
            unsafe {
                self.stream
                    .launch_builder(&self.check)
                    .arg(&ptrs)
                    .arg(&sizes)
                    .arg(&mut mismatches)
                    .arg(&n32)
                    .launch(cfg)
            }
            .map_err(drv("cuLaunchKernel(verify_check)"))?;
            self.stream
                .clone_dtoh(&mismatches)
                .map_err(drv("cuMemcpyDtoH"))
        };
        self.settle(checked())
    }

    /// For every region aligned to 16 or more and at least 16 bytes long: encodes a 1-D TMA
    /// tensor map over it and moves its first box to shared memory and back, adding 1 to each
    /// byte; then checks on the host that exactly those bytes changed. Expects the regions to
    /// hold the tags of [`disjoint`](Self::disjoint). Returns after the kernels have finished.
    ///
    /// # Safety
    ///
    /// As [`alignment`](Self::alignment), for the first `min(size, 256)` bytes of every region
    /// aligned to 16 or more, which are read and written; they must have been written before
    /// (by [`disjoint`](Self::disjoint), for the check to pass).
    pub unsafe fn tma(&self, regions: &[Region]) -> Result<Vec<TmaCheck>, Error> {
        let checked = || -> Result<Vec<TmaCheck>, Error> {
            let Some(func) = &self.tma else {
                return Ok(vec![
                    TmaCheck::Skipped("needs sm_90 or newer");
                    regions.len()
                ]);
            };
            let mut out = Vec::with_capacity(regions.len());
            for (i, r) in regions.iter().enumerate() {
                if r.align < 16 {
                    out.push(TmaCheck::Skipped("alignment below 16"));
                    continue;
                }
                if r.size < 16 {
                    out.push(TmaCheck::Skipped("smaller than 16 bytes"));
                    continue;
                }
                let box_bytes = (r.size.min(TMA_BOX_MAX)) / 16 * 16;
                let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
                // The map covers at most the region's first GiB: what is checked is the address the
                // tensor starts at, and a 1-D map over more than 2^31 elements faulted the copy
                // engine on an H200 (CUDA_ERROR_ILLEGAL_INSTRUCTION) although the driver encoded it.
                let dims = [(r.size as u64).min(TMA_MAP_MAX)];
                let strides: [u64; 1] = [1];
                let boxes = [box_bytes as u32];
                let elem_strides = [1u32];
                // SAFETY: every pointer addresses an array of `rank` (1) entries; the global
                // address is the region's device address.
                unsafe {
                    sys::cuTensorMapEncodeTiled(
                        map.as_mut_ptr(),
                        sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
                        1,
                        r.addr as usize as *mut std::ffi::c_void,
                        dims.as_ptr(),
                        strides.as_ptr(),
                        boxes.as_ptr(),
                        elem_strides.as_ptr(),
                        sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                        sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
                        sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_NONE,
                        sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
                    )
                }
                .result()
                .map_err(drv("cuTensorMapEncodeTiled"))?;
                // SAFETY: the driver initialised the map.
                let map = TensorMapArg(unsafe { map.assume_init() });
                let box32 = box_bytes as u32;
                let x0 = 0u32;
                // SAFETY: the kernel moves `box_bytes` bytes at the start of the region, which the
                // caller owns, through its own shared memory.
                unsafe {
                    self.stream
                        .launch_builder(func)
                        .arg(&map)
                        .arg(&box32)
                        .arg(&x0)
                        .launch(LaunchConfig {
                            grid_dim: (1, 1, 1),
                            block_dim: (128, 1, 1),
                            shared_mem_bytes: 0,
                        })
                }
                .map_err(drv("cuLaunchKernel(tma_roundtrip)"))?;
                let mut back = vec![0u8; box_bytes + 16.min(r.size - box_bytes)];
                synchronize_stream(&self.stream)?;
                // SAFETY: `back` is no longer than the region, which is live device memory.
                unsafe {
                    cudarc::driver::result::memcpy_dtoh_async(
                        &mut back,
                        r.addr,
                        self.stream.cu_stream(),
                    )
                }
                .map_err(drv("cuMemcpyDtoHAsync"))?;
                synchronize_stream(&self.stream)?;
                let wrong = back
                    .iter()
                    .enumerate()
                    .filter(|&(j, &b)| {
                        let tag = tag_byte(i as u32, j as u64);
                        let want = if j < box_bytes {
                            tag.wrapping_add(1)
                        } else {
                            tag
                        };
                        b != want
                    })
                    .count();
                out.push(if wrong == 0 {
                    TmaCheck::Passed { box_bytes }
                } else {
                    TmaCheck::Failed { wrong }
                });
            }
            Ok(out)
        };
        self.settle(checked())
    }

    /// All three checks over `regions`: the overlap check first (its fill writes every byte),
    /// then the alignment check and the bulk-tensor round trip. Overwrites the regions;
    /// returns after the kernels have finished.
    ///
    /// # Safety
    ///
    /// As [`alignment`](Self::alignment), for every byte of every region: the caller gives up
    /// the regions' contents.
    pub unsafe fn run(&self, base: u64, regions: Vec<Region>) -> Result<Report, Error> {
        // SAFETY: the caller's contract covers the three checks.
        let (mismatches, alignment, tma) = unsafe {
            let mismatches = self.disjoint(&regions)?;
            let alignment = self.alignment(&regions)?;
            // The alignment check rewrote the first bytes of each region with the same tags,
            // so the round trip finds what `disjoint` wrote.
            (mismatches, alignment, self.tma(&regions)?)
        };
        Ok(Report {
            device: self.device.clone(),
            base,
            fields: regions
                .into_iter()
                .zip(alignment)
                .zip(mismatches)
                .zip(tma)
                .map(|(((region, alignment), mismatches), tma)| FieldReport {
                    region,
                    alignment,
                    mismatches,
                    tma,
                })
                .collect(),
        })
    }

    /// The per-stage checks over `regions` (one per field, in declaration order, with the
    /// fields' live ranges): per stage, the overlap and alignment checks over the fields live
    /// in it; then, for every pair of fields whose live ranges never meet and whose regions
    /// overlap, the overlap check over the two, which must see the shared bytes. Overwrites
    /// the regions; returns after the kernels have finished.
    ///
    /// # Safety
    ///
    /// As [`alignment`](Self::alignment), for every byte of every region: the caller gives up
    /// the regions' contents.
    pub unsafe fn run_stages(
        &self,
        layout: &'static str,
        base: u64,
        regions: &[Region],
        live: &[LiveRange],
        stages: usize,
    ) -> Result<StagesReport, Error> {
        if live.len() != regions.len() {
            return Err(Error::InvalidArgument {
                what: format!(
                    "verify stages of `{layout}`: {} live ranges for {} regions",
                    live.len(),
                    regions.len()
                ),
            });
        }
        let mut per_stage = Vec::with_capacity(stages);
        for s in 0..stages {
            let here: Vec<Region> = regions
                .iter()
                .zip(live)
                .filter(|(_, l)| l.contains(s))
                .map(|(r, _)| r.clone())
                .collect();
            // SAFETY: `here` is a subset of `regions`, which the caller's contract covers. The
            // fill runs first so that the alignment kernel reads bytes the verifier wrote.
            let mismatches = unsafe { self.disjoint(&here)? };
            // SAFETY: as above.
            let alignment = unsafe { self.alignment(&here)? };
            per_stage.push(
                here.into_iter()
                    .zip(alignment)
                    .zip(mismatches)
                    .map(|((region, alignment), mismatches)| FieldReport {
                        region,
                        alignment,
                        mismatches,
                        tma: TmaCheck::Skipped("not run per stage"),
                    })
                    .collect(),
            );
        }
        let mut shared = Vec::new();
        for (i, a) in regions.iter().enumerate() {
            for (j, b) in regions.iter().enumerate().skip(i + 1) {
                let (start, end) = (
                    a.offset.max(b.offset),
                    (a.offset + a.size).min(b.offset + b.size),
                );
                if live[i].meets(&live[j]) || start >= end {
                    continue;
                }
                let pair = [a.clone(), b.clone()];
                // SAFETY: two of the caller's regions.
                let mismatches = unsafe { self.disjoint(&pair)? }.iter().sum();
                let (first, second) = if (b.offset, j) < (a.offset, i) {
                    (b, a)
                } else {
                    (a, b)
                };
                shared.push(SharedBytes {
                    first: first.name.clone(),
                    second: second.name.clone(),
                    overlap: end - start,
                    mismatches,
                });
            }
        }
        Ok(StagesReport {
            device: self.device.clone(),
            layout,
            base,
            stages: per_stage,
            shared,
        })
    }
}

/// Verifies a device arena whose layout has stages, stage by stage: in every stage, each field
/// live in it passes the hardware alignment check and overlaps none of the other fields live
/// in it; and every pair of fields the plan lets share bytes (live ranges that never meet) is
/// shown to share them on the device. Overwrites the arena's contents, hence the `&mut`, and
/// returns once every kernel it queued has finished.
///
/// A layout without stages is an [`Error::InvalidArgument`]: [`verify`] checks it whole.
///
/// ```no_run
/// use devarena::backend::cuda::{cuda_stream, CudaBackend};
/// use devarena::{Arena, DeviceLayout};
///
/// #[derive(DeviceLayout)]
/// #[layout(stages = 2)]
/// struct Steps {
///     #[layout(live = 0..=0)]
///     input: [f32; 1 << 20],
///     #[layout(live = 1..=1)]
///     output: [f32; 1 << 20], // shares bytes with `input`
///     hist: [u32; 256],       // live in both stages
/// }
///
/// let mut arena = Arena::<Steps, _>::new_in(CudaBackend::new(cuda_stream(0)?))?;
/// let report = devarena_kernels::verify_stages(&mut arena)?;
/// println!("{report}");
/// assert!(report.passed() && report.shared.len() == 1);
/// # Ok::<(), devarena::Error>(())
/// ```
pub fn verify_stages<L: DeviceLayout, B: VerifyTarget>(
    arena: &mut Arena<L, B>,
) -> Result<StagesReport, Error> {
    Verifier::new(arena.backend().stream())?.verify_stages(arena)
}

/// The regions of every field of an arena, as its plan placed them: plain data (addresses and
/// sizes), for reports and for the raw entry points of [`Verifier`].
pub fn regions<L: DeviceLayout, B: Backend>(arena: &Arena<L, B>) -> Vec<Region> {
    L::FIELDS
        .iter()
        .map(|f| Region {
            name: f.name.to_string(),
            offset: f.offset,
            addr: arena.addr() + f.offset as u64,
            size: f.size,
            align: f.align,
        })
        .collect()
}

/// Runs every check on every field of a device (or managed) arena: the hardware alignment
/// check, the overlap check and (on sm_90) the bulk-tensor round trip. Overwrites the arena's
/// contents, hence the `&mut`, and returns once every kernel it queued has finished.
pub fn verify<L: DeviceLayout + Disjoint, B: VerifyTarget>(
    arena: &mut Arena<L, B>,
) -> Result<Report, Error> {
    Verifier::new(arena.backend().stream())?.verify(arena)
}
