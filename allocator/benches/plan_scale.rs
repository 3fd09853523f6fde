//! The planner at the scale of a network's activations: generated instances of 1,000 to
//! 30,000 buffers, planned by `LayoutBuilder::build` (the greedy planner) and by
//! `LayoutBuilder::search` with a time budget, against greedy-by-size alone (TensorFlow Lite
//! Micro's planner) as the baseline, all in the same run.
//!
//!     cargo bench -p devarena --bench plan_scale [-- --buffers 1000,10000,30000] [--seeds 3]
//!         [--budget-ms 2000]
//!
//! An instance is a chain of operations (one stage each), shaped like a network's forward
//! pass: every operation writes an output read by the next one or two (short-lived), half of
//! them use a workspace live in their own stage only, one in twenty starts a skip connection
//! read 5 to 200 operations later, and one in five hundred makes a buffer that lives to the
//! end (a saved activation, a cache). Sizes follow the network's resolution, which shrinks
//! and grows in blocks: log-uniform from 128 B to 512 MiB around each block's size.
//! Alignment 256 bytes (what `cudaMalloc` gives).
//!
//! Every plan is checked by `devarena::plan::validate` (conflicting buffers never overlap,
//! offsets aligned, everything within the plan's size) before it is timed into the table.
//! Columns: the ratio of the plan's size to the peak of live bytes (`PEAK_LIVE_BOUND`, a lower
//! bound on any plan; median and worst over the seeds) and the planning time (median; the
//! search's includes the greedy plan it starts from; neither includes building the
//! `LayoutBuilder`). The stages and peak columns are the last seed's.

use std::time::{Duration, Instant};

use devarena::plan::{self, FieldSpec, LayoutSpec, Placed, Slot, Strategy};
use devarena::{Budget, LiveRange};

mod common;
use common::{Buffer, activations, builder, check};

/// Greedy by size alone, through the same planner code: the baseline.
fn by_size(buffers: &[Buffer], stages: usize) -> (usize, Duration) {
    let t0 = Instant::now();
    let layout = LayoutSpec::DEFAULT.with_stages(stages);
    let specs: Vec<FieldSpec> = buffers
        .iter()
        .map(|b| FieldSpec::of::<u8>(b.size).with_live(b.first, b.last))
        .collect();
    let n = specs.len();
    let slots: Vec<Slot> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| plan::check_field(&layout, i, s).expect("generated fields are valid"))
        .collect();
    let mut placed = vec![0; n];
    let mut scratch = vec![0; plan::scratch_len(n)];
    let end = plan::place_with(Strategy::BySize, &specs, &slots, &mut placed, &mut scratch)
        .expect("no overflow");
    let elapsed = t0.elapsed();
    let checked: Vec<Placed> = (0..n)
        .map(|i| Placed {
            offset: placed[i],
            size: slots[i].size,
            align: slots[i].align,
            live: LiveRange::new(buffers[i].first, buffers[i].last),
        })
        .collect();
    if let Err(v) = plan::validate(&checked, end) {
        panic!("invalid greedy-by-size plan: {v}");
    }
    (end.next_multiple_of(plan::CUDA_ALIGN), elapsed)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let mut sizes = vec![1_000usize, 10_000, 30_000];
    let mut seeds = 3u64;
    let mut budget_ms = 2_000u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--buffers" => {
                sizes = args
                    .next()
                    .expect("--buffers N,N,..")
                    .split(',')
                    .map(|s| s.parse().expect("a number of buffers"))
                    .collect()
            }
            "--seeds" => seeds = args.next().expect("--seeds N").parse().expect("a number"),
            "--budget-ms" => {
                budget_ms = args
                    .next()
                    .expect("--budget-ms MS")
                    .parse()
                    .expect("a number")
            }
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    println!(
        "plan_scale: network-shaped instances, {seeds} seeds each, align 256; medians; \
         search budget {budget_ms} ms"
    );
    println!(
        "{:>8} {:>7} {:>9} | {:>8} {:>8} | {:>8} {:>8} {:>8} | {:>8} {:>8} {:>8} | {:>7}",
        "buffers",
        "stages",
        "peak MiB",
        "by size",
        "ms",
        "build()",
        "worst",
        "ms",
        "search",
        "worst",
        "ms",
        "vs base"
    );
    for &n in &sizes {
        let (mut base_r, mut base_t, mut build_r, mut build_t, mut search_r, mut search_t) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        let (mut stages_seen, mut peak_seen) = (0, 0.0);
        for seed in 0..seeds {
            let (buffers, stages) = activations(n, seed + 1);
            let (base, t) = by_size(&buffers, stages);

            let t0 = Instant::now();
            let built = builder("Activations", &buffers, stages)
                .build()
                .expect("plans");
            let tb = t0.elapsed();
            check(&built);
            let peak = built.totals().peak_live_bound as f64;

            let t0 = Instant::now();
            let searched = builder("Activations", &buffers, stages)
                .search(Budget::time(Duration::from_millis(budget_ms)))
                .expect("plans");
            let ts = t0.elapsed();
            check(&searched);
            assert!(searched.size() <= built.size(), "the search never loses");

            base_r.push(base as f64 / peak);
            base_t.push(t.as_secs_f64() * 1e3);
            build_r.push(built.size() as f64 / peak);
            build_t.push(tb.as_secs_f64() * 1e3);
            search_r.push(searched.size() as f64 / peak);
            search_t.push(ts.as_secs_f64() * 1e3);
            stages_seen = stages;
            peak_seen = peak / (1 << 20) as f64;
        }
        let worst = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
        let (build_w, search_w) = (worst(&build_r), worst(&search_r));
        let (b, s) = (median(&mut base_r), median(&mut search_r));
        println!(
            "{:>8} {:>7} {:>9.0} | {:>8.4} {:>8.1} | {:>8.4} {:>8.4} {:>8.1} | {:>8.4} {:>8.4} {:>8.1} | {:>7.4}",
            n,
            stages_seen,
            peak_seen,
            b,
            median(&mut base_t),
            median(&mut build_r),
            build_w,
            median(&mut build_t),
            s,
            search_w,
            median(&mut search_t),
            s / b
        );
    }
    println!(
        "ratios: plan size / peak of live bytes (1.0 is optimal); 'vs base': search's ratio \
         over greedy-by-size's"
    );
}
