//! The derive's compile-time search run natively on MiniMalloc CSVs: `plan::plan_as_derive`,
//! the same const fns and work as the compiler's (`plan::improve_slots`, `COMPILE_TIME_STEPS`
//! calls of `COMPILE_TIME_WORK` each, from the four-ordering greedy plan) on the layout
//! `tests/compile-dsa.sh` derives from each file, so the plans equal the compiler's. (The
//! `tune_schedule` example runs other schedules.)
//!
//!     cargo run --release -p devarena --example compile_time_csv -- F.csv [G.csv ...]
//!
//! Prints, per file, the greedy plan's and the searched plan's `SIZE / 1,048,576`, and each
//! plan is checked by `plan::validate`.

use std::process::ExitCode;

use devarena::plan::{self, FieldSpec, LayoutSpec, Placed, Slot};

// The reader `plan_csv` uses (this example needs only the numbers of each row).
#[allow(dead_code)]
#[path = "minimalloc/csv.rs"]
mod csv;

/// The layout of one CSV (`id,lower,upper,size`, live over `[lower, upper)`), as
/// `tests/compile-dsa.sh` writes it: align 1, one stage per distinct time.
fn load(path: &str) -> Result<(LayoutSpec, Vec<FieldSpec>), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let (_, rows) = csv::parse(&text).map_err(|e| format!("{path}: {e}"))?;
    let rows: Vec<(u64, u64, usize)> = rows
        .iter()
        .map(|r| (r.lower, r.upper, r.size as usize))
        .collect();
    let mut times: Vec<u64> = rows.iter().flat_map(|r| [r.0, r.1]).collect();
    times.sort_unstable();
    times.dedup();
    let rank = |t: u64| times.partition_point(|&x| x < t);
    let layout = LayoutSpec::DEFAULT.with_align(1).with_stages(times.len());
    let specs = rows
        .iter()
        .map(|r| FieldSpec::of::<u8>(r.2).with_live(rank(r.0), rank(r.1) - 1))
        .collect();
    Ok((layout, specs))
}

fn run(path: &str) -> Result<(), String> {
    let (layout, specs) = load(path)?;
    let n = specs.len();
    let mut slots = vec![Slot::EMPTY; n];
    let (greedy, totals) =
        plan::plan_as_derive(&layout, &specs, &mut slots).map_err(|e| format!("{path}: {e:?}"))?;
    let placed: Vec<Placed> = slots
        .iter()
        .zip(&specs)
        .map(|(s, f)| Placed {
            offset: s.offset,
            size: s.size,
            align: s.align,
            live: f.live,
        })
        .collect();
    plan::validate(&placed, totals.size).map_err(|v| format!("{path}: invalid plan: {v}"))?;
    let mib = |b: usize| b as f64 / 1_048_576.0;
    println!(
        "{path}: fields {n} greedy {:.4} searched {:.4}",
        mib(greedy.size),
        mib(totals.size)
    );
    Ok(())
}

fn main() -> ExitCode {
    let files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() {
        eprintln!("usage: compile_time_csv F.csv [G.csv ...]");
        return ExitCode::FAILURE;
    }
    for f in &files {
        if let Err(e) = run(f) {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
