//! Plans a static memory allocation problem in the field's CSV format (MiniMalloc's) with
//! `LayoutBuilder::search`.
//!
//!     cargo run --release -p devarena --example plan_csv -- \
//!         --input F.csv --output O.csv [--capacity BYTES] [--budget-ms MS]
//!
//! Input: a header `id,lower,upper,size` (in any order; other columns are ignored), then one
//! buffer per row, of `size` bytes, live over the half-open `[lower, upper)`. Two buffers
//! conflict when their intervals meet. Output: the same rows (and header) with an `offset`
//! column appended. The command prints one line:
//!
//!     height H peak P ratio R time_ms T
//!
//! `H` is the end of the highest buffer, `P` the peak of live bytes (a lower bound on any
//! plan), `R = H / P`, `T` the planning time. With `--capacity` the search stops as soon as a
//! plan fits (and the command fails if none is found within the budget, or at once if the
//! capacity is below the peak); without it, the search keeps lowering the plan until it
//! reaches the peak or the budget (default 60,000 ms) runs out. Every plan written is first checked by `devarena::plan::validate`.
//!
//! Times map to stages directly when the largest `upper` is at most `plan::MAX_STAGES` (the
//! search's preorders then see how long each buffer lives), else through their rank among the
//! distinct times.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use devarena::plan::{self, Placed};
use devarena::{Budget, LayoutBuilder, LiveRange};

#[path = "minimalloc/csv.rs"]
mod csv;
use csv::{parse, peak};

struct Args {
    input: String,
    output: String,
    capacity: Option<u64>,
    budget_ms: u64,
}

fn usage() -> String {
    "usage: plan_csv --input F.csv --output O.csv [--capacity BYTES] [--budget-ms MS]".into()
}

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let (mut input, mut output, mut capacity, mut budget_ms) = (None, None, None, 60_000);
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| format!("{flag} needs a value\n{}", usage()))
        };
        match flag.as_str() {
            "--input" => input = Some(value()?),
            "--output" => output = Some(value()?),
            "--capacity" => {
                let v = value()?;
                capacity = Some(
                    v.parse()
                        .map_err(|_| format!("--capacity {v}: not a number of bytes"))?,
                );
            }
            "--budget-ms" => {
                let v = value()?;
                budget_ms = v
                    .parse()
                    .map_err(|_| format!("--budget-ms {v}: not a number of milliseconds"))?;
            }
            "--help" | "-h" => return Err(usage()),
            other => return Err(format!("unknown argument `{other}`\n{}", usage())),
        }
    }
    Ok(Args {
        input: input.ok_or_else(|| format!("--input is required\n{}", usage()))?,
        output: output.ok_or_else(|| format!("--output is required\n{}", usage()))?,
        capacity,
        budget_ms,
    })
}

/// A capacity under the peak of live bytes: no plan fits it, so the search is not run (it would
/// spend the whole budget looking).
fn under_peak(capacity: Option<u64>, rows: &[csv::Row]) -> Result<(), String> {
    match capacity {
        Some(c) if c < peak(rows) => Err(format!(
            "--capacity {c} is below the peak of live bytes, {}: no plan fits",
            peak(rows)
        )),
        _ => Ok(()),
    }
}

fn run() -> Result<bool, String> {
    let args = parse_args()?;
    let text = std::fs::read_to_string(&args.input)
        .map_err(|e| format!("cannot read {}: {e}", args.input))?;
    let (header, rows) = parse(&text).map_err(|e| format!("{}: {e}", args.input))?;
    under_peak(args.capacity, &rows).map_err(|e| format!("{}: {e}", args.input))?;
    let to_usize = |v: u64, what: &str| {
        usize::try_from(v).map_err(|_| format!("{what} {v} does not fit in this machine's usize"))
    };
    // Stages: the times themselves when they fit, else their ranks.
    let max_upper = rows.iter().map(|r| r.upper).max().unwrap_or(0);
    let ranks: Option<Vec<u64>> = (max_upper > plan::MAX_STAGES as u64).then(|| {
        let mut t: Vec<u64> = rows.iter().flat_map(|r| [r.lower, r.upper]).collect();
        t.sort_unstable();
        t.dedup();
        t
    });
    let stage = |t: u64| match &ranks {
        Some(r) => r.binary_search(&t).unwrap_or(0),
        None => t as usize,
    };
    let stages = match &ranks {
        Some(r) => r.len(),
        None => max_upper as usize,
    };

    let start = Instant::now();
    let mut b = LayoutBuilder::new(args.input.as_str())
        .align(1)
        .stages(stages);
    for r in &rows {
        b = b
            .array::<u8>(r.id.as_str(), to_usize(r.size, "size")?)
            .live(stage(r.lower), stage(r.upper) - 1);
    }
    let mut budget = Budget::time(Duration::from_millis(args.budget_ms));
    if let Some(c) = args.capacity {
        budget = budget.until_size(to_usize(c, "capacity")?);
    }
    let layout = b.search(budget).map_err(|e| e.to_string())?;
    let time_ms = start.elapsed().as_millis();

    let placed: Vec<Placed> = layout.fields().iter().map(Placed::from).collect();
    let height = placed.iter().map(|p| p.offset + p.size).max().unwrap_or(0);
    let limit = args.capacity.map_or(height, |c| c as usize).max(height);
    // Checked in the input's own times, independently of the mapping to stages: buffers that
    // meet in time never share bytes.
    let times: Vec<Placed> = rows
        .iter()
        .zip(&placed)
        .map(|(r, p)| Placed {
            live: LiveRange::new(r.lower as usize, r.upper as usize - 1),
            ..*p
        })
        .collect();
    plan::validate(&times, limit).map_err(|v| format!("the plan is not valid: {v}"))?;

    let mut out = format!("{header},offset\n");
    for (r, p) in rows.iter().zip(&placed) {
        out += &format!("{},{}\n", r.text, p.offset);
    }
    std::fs::write(&args.output, out).map_err(|e| format!("cannot write {}: {e}", args.output))?;

    let peak = peak(&rows);
    let ratio = if peak == 0 {
        1.0
    } else {
        height as f64 / peak as f64
    };
    println!("height {height} peak {peak} ratio {ratio:.4} time_ms {time_ms}");
    match args.capacity {
        Some(c) if height as u64 > c => {
            eprintln!(
                "plan_csv: the best plan found needs {height} bytes, over the capacity of {c}"
            );
            Ok(false)
        }
        _ => Ok(true),
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(2),
        Err(e) => {
            eprintln!("plan_csv: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    /// The error for `text`, which must be one.
    fn error(text: &str) -> String {
        match parse(text) {
            Ok(_) => panic!("accepted: {text:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn reads_the_rows_in_any_column_order() {
        let (header, rows) = parse("size,id,upper,lower,note\n8,a,3,1,x\n\n4,b,2,0,y\n").unwrap();
        assert_eq!(header, "size,id,upper,lower,note");
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].lower, rows[0].upper, rows[0].size), (1, 3, 8));
        assert_eq!((rows[1].id.as_str(), rows[1].size), ("b", 4));
        assert_eq!(super::peak(&rows), 12);
    }

    #[test]
    fn a_missing_column_names_the_line() {
        let e = error("id,lower,size\n0,1,8\n");
        assert!(e.starts_with("line 1:") && e.contains("`upper`"), "{e}");
        let e = error("id,lower,upper,size\n0,0,4,8\n1,0,4\n");
        assert!(e.starts_with("line 3:") && e.contains("3 columns"), "{e}");
    }

    #[test]
    fn a_negative_or_non_numeric_value_names_the_line() {
        let e = error("id,lower,upper,size\n0,0,4,8\n1,-2,4,8\n");
        assert!(
            e.starts_with("line 3:") && e.contains("lower `-2` is negative"),
            "{e}"
        );
        let e = error("id,lower,upper,size\n0,0,4,8\n\n1,0,4,eight\n");
        assert!(
            e.starts_with("line 4:") && e.contains("size `eight`"),
            "{e}"
        );
        let e = error("id,lower,upper,size\n0,0,4.5,8\n");
        assert!(e.starts_with("line 2:") && e.contains("upper `4.5`"), "{e}");
    }

    #[test]
    fn an_empty_live_range_names_the_line() {
        let e = error("id,lower,upper,size\n0,0,4,8\n1,4,4,8\n");
        assert!(
            e.starts_with("line 3:") && e.contains("upper 4 is not after lower 4"),
            "{e}"
        );
        let e = error("id,lower,upper,size\n0,5,4,8\n");
        assert!(e.starts_with("line 2:"), "{e}");
    }

    #[test]
    fn a_zero_size_names_the_line() {
        let e = error("id,lower,upper,size\n0,0,4,8\n1,0,4,0\n");
        assert!(e.starts_with("line 3:") && e.contains("size is 0"), "{e}");
    }

    #[test]
    fn other_bad_input_is_an_error_too() {
        assert!(error("").contains("empty"));
        let e = error("id,lower,upper,size\n7,0,4,8\n7,1,2,3\n");
        assert!(e.starts_with("line 3:") && e.contains("twice"), "{e}");
        let e = error("id,lower,upper,size\n,0,4,8\n");
        assert!(e.starts_with("line 2:") && e.contains("empty"), "{e}");
        let e = error("id,lower,upper,size\n0,0,99999999999999999999999,8\n");
        assert!(e.starts_with("line 2:"), "{e}");
    }

    #[test]
    fn a_capacity_under_the_peak_is_refused_before_the_search() {
        let (_, rows) = parse("id,lower,upper,size\n0,0,4,8\n1,2,6,8\n2,4,9,1\n").unwrap();
        let e = super::under_peak(Some(15), &rows).unwrap_err();
        assert!(
            e.contains("--capacity 15") && e.contains("peak of live bytes, 16"),
            "{e}"
        );
        assert!(super::under_peak(Some(16), &rows).is_ok());
        assert!(super::under_peak(None, &rows).is_ok());
    }

    #[test]
    fn a_byte_order_mark_is_skipped() {
        let (header, rows) = parse("\u{feff}id,lower,upper,size\r\n0,0,4,8\r\n").unwrap();
        assert_eq!(header, "id,lower,upper,size");
        assert_eq!((rows[0].id.as_str(), rows[0].size), ("0", 8));
    }

    #[test]
    fn a_column_named_twice_is_an_error() {
        let e = error("id,lower,upper,size,size\n0,0,4,8,9\n");
        assert!(
            e.starts_with("line 1:") && e.contains("2 `size` columns"),
            "{e}"
        );
    }
}
