//! Footprint: the device memory buffers consume (`cuMemGetInfo` free before − after), one
//! allocation per buffer against one arena.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use devarena::backend::cuda::{CudaBackend, mem_info};
use devarena::{Arena, Backend, DeviceLayout, Error, LayoutBuilder};
use devarena_kernels::pipeline::cuda::driver_error;
use devarena_kernels::pipeline::{Frame, FrameStaged};

use crate::driver::{FRAME, RawBuffers, field_sizes};
use crate::report::{Target, esc};

/// The granularity `cuMemGetInfo` counts in on the target GPU.
const PAGE: usize = 2 << 20;

pub struct FootprintRow {
    what: &'static str,
    method: &'static str,
    requested: usize,
    consumed: usize,
    /// The arena row the group's ratios are taken against.
    baseline: bool,
    /// For an arena row: the plan's `SIZE`, which the footprint must stay within a page of.
    plan_size: Option<usize>,
}

pub fn measure(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    backend: &CudaBackend,
) -> Result<Vec<FootprintRow>, Error> {
    ctx.bind_to_thread()
        .map_err(|e| driver_error("cuCtxSetCurrent", e))?;
    let frame_sizes = field_sizes(Frame::FIELDS);
    let tiny_sizes = vec![100usize; 10_000];
    let tiny = (0..10_000)
        .fold(LayoutBuilder::new("TenThousand"), |b, i| {
            b.array::<u8>(format!("b{i}"), 100)
        })
        .build()?;
    let staged = "FrameStaged (aliased)";
    let mut rows = Vec::from(against_arena(
        stream,
        FRAME,
        &frame_sizes,
        Frame::SIZE,
        || footprint_arena::<Frame>(stream, backend),
    )?);
    rows.push(FootprintRow {
        what: staged,
        method: "arena, aliased (SIZE)",
        requested: FrameStaged::SIZE,
        consumed: footprint_arena::<FrameStaged>(stream, backend)?,
        baseline: true,
        plan_size: Some(FrameStaged::SIZE),
    });
    rows.push(FootprintRow {
        what: staged,
        method: "arena, unaliased Frame (UNALIASED_SIZE)",
        requested: FrameStaged::UNALIASED_SIZE,
        consumed: footprint_arena::<Frame>(stream, backend)?,
        baseline: false,
        plan_size: None,
    });
    rows.extend(against_arena(
        stream,
        "10,000 × 100 B",
        &tiny_sizes,
        tiny.size(),
        || footprint_runtime_arena(stream, backend, tiny.size(), tiny.align()),
    )?);
    Ok(rows)
}

/// The footprints of the buffers `sizes` of a layout of `SIZE` `size`, in turn: one
/// `cuMemAlloc` each, one `cuMemAlloc` of `size`, and the layout's arena (`arena`, the
/// group's baseline).
fn against_arena(
    stream: &CudaStream,
    what: &'static str,
    sizes: &[usize],
    size: usize,
    arena: impl FnOnce() -> Result<usize, Error>,
) -> Result<[FootprintRow; 3], Error> {
    let row = |method, requested, consumed, baseline| FootprintRow {
        what,
        method,
        requested,
        consumed,
        baseline,
        plan_size: baseline.then_some(size),
    };
    Ok([
        row(
            "one cuMemAlloc per buffer",
            sizes.iter().sum(),
            footprint_sync(stream, sizes)?,
            false,
        ),
        row(
            "1 × cuMemAlloc (SIZE)",
            size,
            footprint_sync(stream, &[size])?,
            false,
        ),
        row("arena (one allocation)", size, arena()?, true),
    ])
}

fn free_bytes(stream: &CudaStream) -> Result<usize, Error> {
    mem_info(stream).map(|(free, _)| free)
}

/// Free device bytes before − after making one `cuMemAlloc` per size.
fn footprint_sync(stream: &CudaStream, sizes: &[usize]) -> Result<usize, Error> {
    let before = free_bytes(stream)?;
    let buffers = RawBuffers::alloc(sizes)?;
    let after = free_bytes(stream);
    drop(buffers);
    Ok(before.saturating_sub(after?))
}

/// Free device bytes before − after making an arena of `L`.
fn footprint_arena<L: DeviceLayout>(
    stream: &CudaStream,
    backend: &CudaBackend,
) -> Result<usize, Error> {
    let before = free_bytes(stream)?;
    let arena = Arena::<L, _>::new_in(backend.clone())?;
    let after = free_bytes(stream);
    arena.free()?;
    Ok(before.saturating_sub(after?))
}

/// Free device bytes before − after one backend allocation of `bytes` at `align`.
fn footprint_runtime_arena(
    stream: &CudaStream,
    backend: &CudaBackend,
    bytes: usize,
    align: usize,
) -> Result<usize, Error> {
    let before = free_bytes(stream)?;
    let a = backend.allocate(bytes, align)?;
    let after = free_bytes(stream);
    // SAFETY: allocated just above, freed once; no view was made.
    unsafe { backend.deallocate(&a) }?;
    Ok(before.saturating_sub(after?))
}

/// The arena row of `row`'s group.
fn baseline_of<'r>(rows: &'r [FootprintRow], row: &FootprintRow) -> Option<&'r FootprintRow> {
    rows.iter().find(|r| r.baseline && r.what == row.what)
}

/// Every arena's footprint within one 2 MiB page of its plan's `SIZE`.
pub fn targets(rows: &[FootprintRow]) -> Vec<Target> {
    rows.iter()
        .filter_map(|r| {
            let size = r.plan_size?;
            let off = r.consumed as i64 - size as i64;
            Some(Target {
                what: format!("{}: {} footprint − SIZE", r.what, r.method),
                value: format!("{off:+} bytes ({} − {size})", r.consumed),
                target: "within one 2 MiB page",
                met: off.unsigned_abs() as usize <= PAGE,
            })
        })
        .collect()
}

pub fn print(rows: &[FootprintRow]) {
    println!("footprint: device memory consumed (cuMemGetInfo free before − after)");
    println!(
        "{:<24} {:<40} {:>14} {:>14} {:>10}",
        "buffers", "method", "requested B", "consumed B", "vs arena"
    );
    for group in rows.chunk_by(|a, b| a.what == b.what) {
        for (i, r) in group.iter().enumerate() {
            let what = if i == 0 { r.what } else { "" };
            println!(
                "{:<24} {:<40} {:>14} {:>14} {:>10}",
                what,
                r.method,
                r.requested,
                r.consumed,
                match baseline_of(rows, r) {
                    Some(a) if a.consumed > 0 =>
                        format!("{:.2}", r.consumed as f64 / a.consumed as f64),
                    _ => "-".into(),
                }
            );
        }
    }
    println!("(cuMemGetInfo counts in pages of 2 MiB)");
}

pub fn json(r: &FootprintRow) -> String {
    format!(
        "{{\"buffers\":\"{}\",\"method\":\"{}\",\"requested_bytes\":{},\"consumed_bytes\":{},\"baseline\":{}}}",
        esc(r.what),
        esc(r.method),
        r.requested,
        r.consumed,
        r.baseline
    )
}
