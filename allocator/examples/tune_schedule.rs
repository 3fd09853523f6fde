//! The derive's compile-time search with another schedule of tries, run natively on
//! MiniMalloc CSVs through the same const fns (`plan::improve_slots_with`, from the
//! four-ordering greedy plan, in `STEPS` calls of `WORK` units each): a quick way to try a
//! schedule before changing `COMPILE_TIME_TRIES` and building the derives.
//!
//!     SCHED=1200:twa:0:350000,1140:twa:1:600000 STEPS=4 WORK=175000 \
//!         cargo run --release -p devarena --example tune_schedule -- F.csv [G.csv ...]
//!
//! Each try of `SCHED` is `permille:preorder:inference:work`: the capacity in thousandths of
//! the lower bound (0 for a dive below the best plan), the preorder (`wat`, `taw`, `twa`,
//! `swat`, `staw`, `stwa`), 1 to use the lowest waiting offsets in spatial inference, and
//! the work the try may take (for a dive, per field squared). Prints each file's
//! `SIZE / 1,048,576` and the work spent, then the median and the worst; each plan is checked
//! by `plan::validate`.

use std::process::ExitCode;

use devarena::plan::{self, Preorder, Schedule, Slot, Try};

// The reader `plan_csv` uses (this example needs only the numbers of each row).
#[allow(dead_code)]
#[path = "minimalloc/csv.rs"]
mod csv;
#[path = "minimalloc/derived.rs"]
mod derived;

/// One try of `SCHED`.
fn parse_try(s: &str) -> Result<Try, String> {
    let f: Vec<&str> = s.split(':').collect();
    let bad = || format!("try {s:?}: want permille:preorder:inference:work");
    if f.len() != 4 {
        return Err(bad());
    }
    let preorder = match f[1] {
        "wat" => Preorder::Wat,
        "taw" => Preorder::Taw,
        "twa" => Preorder::Twa,
        "swat" => Preorder::SectionWat,
        "staw" => Preorder::SectionTaw,
        "stwa" => Preorder::SectionTwa,
        _ => return Err(bad()),
    };
    let permille = f[0].parse().map_err(|_| bad())?;
    let work = f[3].parse().map_err(|_| bad())?;
    Ok((permille, preorder, f[2] == "1", work))
}

fn var<T: std::str::FromStr>(name: &str, default: T) -> Result<T, String> {
    match std::env::var(name) {
        Ok(v) => v.parse().map_err(|_| format!("{name}={v:?}: not a number")),
        Err(_) => Ok(default),
    }
}

fn run() -> Result<(), String> {
    let sched = std::env::var("SCHED").map_err(|_| "SCHED is not set".to_string())?;
    let tries = sched
        .split(',')
        .map(parse_try)
        .collect::<Result<Vec<Try>, String>>()?;
    let steps: usize = var("STEPS", plan::COMPILE_TIME_STEPS)?;
    let work: u64 = var("WORK", plan::COMPILE_TIME_WORK)?;
    let files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() {
        return Err("usage: SCHED=... tune_schedule F.csv [G.csv ...]".into());
    }
    let mut ratios = Vec::new();
    for path in &files {
        let (layout, specs) = derived::load(path)?;
        let n = specs.len();
        let mut slots = vec![Slot::EMPTY; n];
        let mut head = vec![0; plan::scratch_len(n)];
        let mut totals = plan::plan_into(&layout, &specs, &mut slots, &mut head)
            .map_err(|e| format!("{path}: {e:?}"))?;
        let sizes = plan::measure(&layout, &specs, &slots, &mut head);
        let mut scratch = vec![0; plan::scratch_len(n) + sizes.scratch_len()];
        let mut schedule = Schedule::START;
        for _ in 0..steps {
            plan::improve_slots_with(
                &tries,
                &layout,
                &specs,
                &mut slots,
                &mut totals,
                &mut schedule,
                work,
                &mut scratch,
            );
        }
        derived::validate(path, &slots, &specs, totals.size)?;
        let ratio = totals.size as f64 / 1_048_576.0;
        println!("{path}: {ratio:.4} work {}", schedule.work());
        ratios.push(ratio);
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "median {:.4} worst {:.4}",
        ratios[ratios.len() / 2],
        ratios[ratios.len() - 1]
    );
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
