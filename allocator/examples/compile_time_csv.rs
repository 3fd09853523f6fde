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

use devarena::plan::{self, Slot};

// The reader `plan_csv` uses (this example needs only the numbers of each row).
#[allow(dead_code)]
#[path = "minimalloc/csv.rs"]
mod csv;
#[path = "minimalloc/derived.rs"]
mod derived;

fn run(path: &str) -> Result<(), String> {
    let (layout, specs) = derived::load(path)?;
    let n = specs.len();
    let mut slots = vec![Slot::EMPTY; n];
    let (greedy, totals) =
        plan::plan_as_derive(&layout, &specs, &mut slots).map_err(|e| format!("{path}: {e:?}"))?;
    derived::validate(path, &slots, &specs, totals.size)?;
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
