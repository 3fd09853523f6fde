//! Setup: making every buffer of a layout four ways (one `cuMemAlloc` each, one
//! `cuMemAllocAsync` each, one `cuMemAlloc` of `SIZE`, one arena), and freeing them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaStream, result};
use devarena::backend::cuda::CudaBackend;
use devarena::{Arena, Backend, DeviceLayout, Error, LayoutBuilder, RuntimeLayout};
use devarena_kernels::pipeline::Frame;
use devarena_kernels::pipeline::cuda::driver_error;
use devarena_kernels::pipeline::image::{DEFAULT_SEED, SplitMix64};

use crate::driver::{FRAME, RawBuffers, field_sizes, median, sync};
use crate::report::{Target, esc, us};

mod test_layouts {
    // The 1000-field layout of the GPU tests, shared as source: this crate cannot depend on the
    // test crate, which depends on it.
    include!("../../../tests/src/many_fields.rs");
}
use test_layouts::Many;

/// Warm-up rounds before the measured ones.
const WARMUP_ROUNDS: usize = 3;

/// One setup measurement: (setup, teardown).
type Measure<'a> = Box<dyn FnMut() -> Result<(Duration, Duration), Error> + 'a>;

/// A way of making every buffer of a layout, in the order the variants take turns.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Method {
    PerBuffer,
    PerBufferAsync,
    /// One `cuMemAlloc` of the layout's `SIZE`: the ratios' baseline.
    One,
    Arena,
}

impl Method {
    const ALL: [Method; 4] = [
        Method::PerBuffer,
        Method::PerBufferAsync,
        Method::One,
        Method::Arena,
    ];

    fn name(self) -> &'static str {
        match self {
            Method::PerBuffer => "N × cuMemAlloc",
            Method::PerBufferAsync => "N × cuMemAllocAsync",
            Method::One => "1 × cuMemAlloc (SIZE)",
            Method::Arena => "arena (one allocation)",
        }
    }
}

/// One row of the setup table.
pub struct SetupRow {
    layout: &'static str,
    method: Method,
    buffers: usize,
    bytes: usize,
    /// Median setup and teardown.
    times: (Duration, Duration),
}

/// The four methods on each layout (the pipeline's `Frame`, 1000 buffers built at run time,
/// the GPU tests' 1000-field layout), one layout at a time in [`interleaved`] rounds.
pub fn measure(
    stream: &Arc<CudaStream>,
    backend: &CudaBackend,
    rounds: usize,
) -> Result<Vec<SetupRow>, Error> {
    let many = many_buffers_layout()?;
    let many_sizes: Vec<usize> = many.fields().iter().map(|f| f.size).collect();
    let (frame_sizes, test_sizes) = (field_sizes(Frame::FIELDS), field_sizes(Many::FIELDS));
    let mut rows = four_methods(
        stream,
        rounds,
        FRAME,
        &frame_sizes,
        Frame::SIZE,
        Box::new(|| arena_setup::<Frame>(backend)),
    )?;
    rows.extend(four_methods(
        stream,
        rounds,
        "1000 buffers",
        &many_sizes,
        many.size(),
        Box::new(|| runtime_arena_setup(backend, many.size(), many.align())),
    )?);
    rows.extend(four_methods(
        stream,
        rounds,
        "1000 small buffers",
        &test_sizes,
        Many::SIZE,
        Box::new(|| arena_setup::<Many>(backend)),
    )?);
    Ok(rows)
}

/// A layout of 1000 buffers: sizes 16 B … 192 KiB (log-uniform), alignments 1 … 4096.
fn many_buffers_layout() -> Result<RuntimeLayout, Error> {
    let mut rng = SplitMix64::new(DEFAULT_SEED);
    let mut b = LayoutBuilder::new("ThousandBuffers");
    for i in 0..1000 {
        let magnitude = 4 + rng.next_u64() % 14; // 2^4 … 2^17
        let len = (1usize << magnitude) + (rng.next_u64() % (1 << magnitude)) as usize / 2;
        b = b.array_aligned::<u8>(format!("b{i}"), len, 1 << (i % 13));
    }
    b.build()
}

/// The four methods of one layout of buffers `sizes` and plan size `size`, `arena` its arena.
fn four_methods<'a>(
    stream: &'a Arc<CudaStream>,
    rounds: usize,
    layout: &'static str,
    sizes: &'a [usize],
    size: usize,
    arena: Measure<'a>,
) -> Result<Vec<SetupRow>, Error> {
    let mut variants: [Measure<'a>; 4] = [
        Box::new(move || setup_sync(sizes)),
        Box::new(move || setup_async(stream, sizes)),
        Box::new(move || setup_one(size)),
        arena,
    ];
    let times = interleaved(rounds, &mut variants)?;
    let requested = sizes.iter().sum();
    Ok(Method::ALL
        .into_iter()
        .zip(times)
        .map(|(method, times)| {
            let (buffers, bytes) = match method {
                Method::PerBuffer | Method::PerBufferAsync => (sizes.len(), requested),
                Method::One | Method::Arena => (1, size),
            };
            SetupRow {
                layout,
                method,
                buffers,
                bytes,
                times,
            }
        })
        .collect())
}

/// Runs every variant once per round, starting each round one variant further on, so slow
/// drift (clocks, the driver's caches) spreads evenly; medians of `rounds` rounds after
/// [`WARMUP_ROUNDS`].
fn interleaved(
    rounds: usize,
    variants: &mut [Measure<'_>],
) -> Result<Vec<(Duration, Duration)>, Error> {
    let n = variants.len();
    let mut samples = vec![(Vec::with_capacity(rounds), Vec::with_capacity(rounds)); n];
    for round in 0..WARMUP_ROUNDS + rounds {
        for k in 0..n {
            let v = (round + k) % n;
            let (setup, teardown) = variants[v]()?;
            if round >= WARMUP_ROUNDS {
                samples[v].0.push(setup);
                samples[v].1.push(teardown);
            }
        }
    }
    Ok(samples
        .into_iter()
        .map(|(mut s, mut t)| (median(&mut s), median(&mut t)))
        .collect())
}

/// One `cuMemAlloc` of `size`, then its `cuMemFree`: each call timed on its own.
fn setup_one(size: usize) -> Result<(Duration, Duration), Error> {
    let start = Instant::now();
    // SAFETY: a plain allocation in the current context; freed below.
    let p = unsafe { result::malloc_sync(size) };
    let setup = start.elapsed();
    let p = p.map_err(|e| driver_error("cuMemAlloc", e))?;
    let start = Instant::now();
    // SAFETY: allocated above, freed once, never used.
    let freed = unsafe { result::free_sync(p) };
    let teardown = start.elapsed();
    freed.map_err(|e| driver_error("cuMemFree", e))?;
    Ok((setup, teardown))
}

/// One arena of `L` on `backend`, then its free: timed as [`setup_one`] times its calls.
fn arena_setup<L: DeviceLayout>(backend: &CudaBackend) -> Result<(Duration, Duration), Error> {
    let backend = backend.clone();
    let start = Instant::now();
    let arena = Arena::<L, _>::new_in(backend);
    let setup = start.elapsed();
    let arena = arena?;
    let start = Instant::now();
    let freed = arena.free();
    let teardown = start.elapsed();
    freed?;
    Ok((setup, teardown))
}

/// One backend allocation of `bytes` at `align` (the arena of a run-time layout), then its
/// free: timed as [`setup_one`] times its calls.
fn runtime_arena_setup(
    backend: &CudaBackend,
    bytes: usize,
    align: usize,
) -> Result<(Duration, Duration), Error> {
    let start = Instant::now();
    let a = backend.allocate(bytes, align);
    let setup = start.elapsed();
    let a = a?;
    let start = Instant::now();
    // SAFETY: allocated just above by this backend, freed once; no view was made.
    let freed = unsafe { backend.deallocate(&a) };
    let teardown = start.elapsed();
    freed?;
    Ok((setup, teardown))
}

/// N × `cuMemAlloc`, then N × `cuMemFree`.
fn setup_sync(sizes: &[usize]) -> Result<(Duration, Duration), Error> {
    let start = Instant::now();
    let buffers = RawBuffers::alloc(sizes)?;
    let setup = start.elapsed();
    let start = Instant::now();
    buffers.free()?;
    Ok((setup, start.elapsed()))
}

/// N × `cuMemAllocAsync` and a synchronize, then N × `cuMemFreeAsync` and a synchronize.
fn setup_async(stream: &Arc<CudaStream>, sizes: &[usize]) -> Result<(Duration, Duration), Error> {
    let s = stream.cu_stream();
    let mut ptrs = Vec::with_capacity(sizes.len());
    let start = Instant::now();
    for &size in sizes {
        // SAFETY: a stream-ordered allocation on `stream`, freed below on the same stream.
        match unsafe { result::malloc_async(s, size) } {
            Ok(p) => ptrs.push(p),
            Err(e) => {
                for &p in &ptrs {
                    // SAFETY: allocated above on this stream, freed once.
                    let _ = unsafe { result::free_async(p, s) };
                }
                return Err(driver_error("cuMemAllocAsync", e));
            }
        }
    }
    sync(stream)?;
    let setup = start.elapsed();
    let start = Instant::now();
    for p in ptrs {
        // SAFETY: allocated above on this stream, freed once, never used.
        unsafe { result::free_async(p, s) }.map_err(|e| driver_error("cuMemFreeAsync", e))?;
    }
    sync(stream)?;
    Ok((setup, start.elapsed()))
}

/// The median setup time of `method` in `group` (one layout's rows).
fn setup_of(group: &[SetupRow], method: Method) -> Option<Duration> {
    group.iter().find(|r| r.method == method).map(|r| r.times.0)
}

fn groups(rows: &[SetupRow]) -> impl Iterator<Item = &[SetupRow]> {
    rows.chunk_by(|a, b| a.layout == b.layout)
}

/// Arena setup ≤ 1.1 × one `cuMemAlloc` of the same size, per layout.
pub fn targets(rows: &[SetupRow]) -> Vec<Target> {
    groups(rows)
        .filter_map(|group| {
            let one = setup_of(group, Method::One)?;
            let arena = setup_of(group, Method::Arena)?;
            let ratio = us(arena) / us(one);
            Some(Target {
                what: format!("{}: arena setup / 1 × cuMemAlloc (SIZE)", group[0].layout),
                value: format!("{ratio:.3} ({:.1} / {:.1} µs)", us(arena), us(one)),
                target: "≤ 1.10",
                met: ratio <= 1.10,
            })
        })
        .collect()
}

pub fn print(rows: &[SetupRow]) {
    println!("setup: making every buffer of a layout (teardown: freeing them)");
    println!(
        "{:<24} {:<24} {:>8} {:>12} {:>12} {:>13} {:>14} {:>9}",
        "layout",
        "method",
        "buffers",
        "bytes",
        "setup µs",
        "teardown µs",
        "× 1 cuMemAlloc",
        "× arena"
    );
    for group in groups(rows) {
        let ratio = |s: Duration, method| {
            setup_of(group, method).map_or("-".into(), |b| format!("{:.2}", us(s) / us(b)))
        };
        for (i, r) in group.iter().enumerate() {
            let layout = if i == 0 { r.layout } else { "" };
            let (s, t) = r.times;
            println!(
                "{:<24} {:<24} {:>8} {:>12} {:>12.1} {:>13.1} {:>14} {:>9}",
                layout,
                r.method.name(),
                r.buffers,
                r.bytes,
                us(s),
                us(t),
                ratio(s, Method::One),
                ratio(s, Method::Arena)
            );
        }
    }
}

pub fn json(r: &SetupRow) -> String {
    format!(
        "{{\"layout\":\"{}\",\"method\":\"{}\",\"buffers\":{},\"bytes\":{},\"setup_us\":{:.3},\"teardown_us\":{:.3}}}",
        esc(r.layout),
        esc(r.method.name()),
        r.buffers,
        r.bytes,
        us(r.times.0),
        us(r.times.1)
    )
}
