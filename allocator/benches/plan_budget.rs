//! How well `LayoutBuilder::search` keeps its time budget on large layouts: network-shaped
//! instances (those of `plan_scale`) and instances of long-lived, heavily overlapping buffers,
//! searched with small time budgets, against `build()` (the four greedy orderings, no budget)
//! in the same run.
//!
//!     cargo bench -p devarena --bench plan_budget [-- --buffers 100000] [--runs 3]
//!         [--budgets-ms 0,100] [--longest 300]
//!
//! Columns: the planning time (median over the runs, building the `LayoutBuilder` excluded),
//! the time over the budget, the plan's size over `build()`'s and over the peak of live bytes
//! (a lower bound), and how the search ended (`SearchStats::end`). Every plan is checked by
//! `devarena::plan::validate` before it counts.

use std::time::{Duration, Instant};

use devarena::plan;
use devarena::{Budget, LayoutBuilder, RuntimeLayout};

mod common;
use common::{Buffer, activations, builder, check, long_lived};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The layout `make` builds, planned `runs` times by `plan`: the median time in ms and the
/// last plan.
fn time(
    runs: usize,
    make: &dyn Fn() -> LayoutBuilder,
    plan: &dyn Fn(LayoutBuilder) -> RuntimeLayout,
) -> (f64, RuntimeLayout) {
    let mut times = vec![];
    let mut last = None;
    for _ in 0..runs {
        let b = make();
        let t0 = Instant::now();
        let layout = plan(b);
        times.push(t0.elapsed().as_secs_f64() * 1e3);
        check(&layout);
        last = Some(layout);
    }
    (median(&mut times), last.expect("at least one run"))
}

fn main() {
    let mut n = 100_000usize;
    let mut runs = 3usize;
    let mut budgets = vec![0u64, 100];
    let mut longest = 300.0f64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .unwrap_or_else(|| panic!("{name} needs a value"))
        };
        match a.as_str() {
            "--buffers" => n = value("--buffers").parse().expect("a number of buffers"),
            "--runs" => runs = value("--runs").parse().expect("a number of runs"),
            "--longest" => longest = value("--longest").parse().expect("a number of stages"),
            "--budgets-ms" => {
                budgets = value("--budgets-ms")
                    .split(',')
                    .map(|s| s.parse().expect("a budget in ms"))
                    .collect()
            }
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    let runs = runs.max(1);
    println!("plan_budget: {n} buffers, medians of {runs} runs, align 256");
    println!(
        "{:>6} {:>9} | {:>9} {:>9} | {:>9} {:>9} {:>8} {:>8} | {:>6}  end",
        "shape", "conflicts", "build ms", "/ peak", "budget", "ms", "over ms", "/ build", "/ peak"
    );
    let shapes: [(&str, (Vec<Buffer>, usize)); 2] = [
        ("net", activations(n, 1)),
        ("long", long_lived(n, longest, 1)),
    ];
    for (name, (buffers, stages)) in &shapes {
        let make = || builder("Large", buffers, *stages);
        let (build_ms, built) = time(runs, &make, &|b| b.build().expect("plans"));
        let peak = built.totals().peak_live_bound as f64;
        let conflicts = {
            let layout = plan::LayoutSpec::DEFAULT.with_stages(*stages);
            let specs: Vec<plan::FieldSpec> = buffers
                .iter()
                .map(|b| plan::FieldSpec::of::<u8>(b.size).with_live(b.first, b.last))
                .collect();
            let slots: Vec<plan::Slot> = built
                .fields()
                .iter()
                .map(|f| plan::Slot {
                    offset: 0,
                    size: f.size,
                    align: f.align,
                })
                .collect();
            let mut scratch = vec![0; plan::scratch_len(specs.len())];
            plan::measure(&layout, &specs, &slots, &mut scratch).conflicts
        };
        for &ms in &budgets {
            let budget = Budget::time(Duration::from_millis(ms));
            let (search_ms, searched) = time(runs, &make, &|b| b.search(budget).expect("plans"));
            let stats = searched.search_stats().expect("a searched layout");
            println!(
                "{:>6} {:>9} | {:>9.1} {:>9.4} | {:>9} {:>9.1} {:>8.1} {:>8.4} | {:>6.4}  {:?}",
                name,
                conflicts,
                build_ms,
                built.size() as f64 / peak,
                ms,
                search_ms,
                (search_ms - ms as f64).max(0.0),
                searched.size() as f64 / built.size() as f64,
                searched.size() as f64 / peak,
                stats.end,
            );
        }
    }
    println!(
        "'over ms': the median time past the budget; '/ build': the plan's size over build()'s; \
         '/ peak': over the peak of live bytes (1.0 is optimal)"
    );
}
