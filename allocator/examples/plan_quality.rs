//! Plan quality of the aliasing planner: on random instances (up to 64 buffers, sizes 1 B …
//! 16 MiB log-uniform, alignments 1 … 4096, live ranges over up to 32 stages), the ratio of the
//! planned `SIZE` to the lower bound `PEAK_LIVE_BOUND`, for the planner (every strategy, the
//! smallest kept) beside greedy-by-size alone (TensorFlow Lite Micro's planner).
//!
//!     cargo run --release -p devarena --example plan_quality [-- --instances 1000 --seed 7]
//!
//! `--instances` is 1 to 100,000,000; a bad or unknown argument is an error.

use devarena::LayoutBuilder;
use devarena::plan::{FieldSpec, Placed, Slot, Strategy, place_with, scratch_len, validate};

/// xorshift64*: a small deterministic generator, so the instances are the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

struct Instance {
    stages: usize,
    fields: Vec<(usize, usize, usize, usize)>, // size, align, first, last
}

fn instance(rng: &mut Rng) -> Instance {
    let stages = 1 + rng.below(32) as usize;
    let n = 1 + rng.below(64) as usize;
    let fields = (0..n)
        .map(|_| {
            // log-uniform in [1 B, 16 MiB]
            let size = (2f64.powf(rng.below(24_000) as f64 / 1000.0)) as usize;
            let align = 1usize << rng.below(13);
            let a = rng.below(stages as u64) as usize;
            let b = rng.below(stages as u64) as usize;
            (size.max(1), align, a.min(b), a.max(b))
        })
        .collect();
    Instance { stages, fields }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Most instances a run takes (a few per millisecond: hours of work).
const MAX_INSTANCES: u64 = 100_000_000;

/// `--instances` and `--seed` from `args` (without the program's name), or why not.
fn parse_args(args: &[String]) -> Result<(usize, u64), String> {
    let usage = "usage: plan_quality [--instances N] [--seed S]";
    let (mut instances, mut seed) = (1000, 7);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = match flag.as_str() {
            "--instances" | "--seed" => {
                it.next().ok_or(format!("{flag} needs a value\n{usage}"))?
            }
            other => return Err(format!("unknown argument `{other}`\n{usage}")),
        };
        let v: u64 = value
            .parse()
            .map_err(|_| format!("{flag} {value}: not a whole number"))?;
        if flag == "--seed" {
            seed = v;
        } else if (1..=MAX_INSTANCES).contains(&v) {
            instances = v as usize;
        } else {
            return Err(format!("--instances {v}: want 1 to {MAX_INSTANCES}"));
        }
    }
    Ok((instances, seed))
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (instances, seed) = match parse_args(&args) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("plan_quality: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let mut rng = Rng(seed | 1);

    let mut planner = Vec::with_capacity(instances);
    let mut by_size = Vec::with_capacity(instances);
    let mut at_bound = 0;
    for _ in 0..instances {
        let inst = instance(&mut rng);
        let mut b = LayoutBuilder::new("random").align(1).stages(inst.stages);
        for (i, &(size, align, first, last)) in inst.fields.iter().enumerate() {
            b = b
                .field(
                    format!("f{i}"),
                    "u8",
                    FieldSpec::of::<u8>(size).with_align(align),
                )
                .live(first, last);
        }
        let layout = b.build().expect("random instances are valid");
        let checked: Vec<Placed> = layout.fields().iter().map(Placed::from).collect();
        validate(&checked, layout.size()).expect("plan::validate accepts the plan");
        let t = layout.totals();
        // Greedy by size alone, on the same sizes, alignments and live ranges.
        let specs: Vec<FieldSpec> = inst
            .fields
            .iter()
            .map(|&(size, align, first, last)| {
                FieldSpec::of::<u8>(size)
                    .with_align(align)
                    .with_live(first, last)
            })
            .collect();
        let slots: Vec<Slot> = layout
            .fields()
            .iter()
            .map(|f| Slot {
                offset: 0,
                size: f.size,
                align: f.align,
            })
            .collect();
        let mut placed = vec![0; specs.len()];
        let mut scratch = vec![0; scratch_len(specs.len())];
        let end = place_with(Strategy::BySize, &specs, &slots, &mut placed, &mut scratch).unwrap();
        let greedy = end.div_ceil(t.align) * t.align;
        let checked: Vec<Placed> = (0..specs.len())
            .map(|i| Placed {
                offset: placed[i],
                size: slots[i].size,
                align: slots[i].align,
                live: specs[i].live,
            })
            .collect();
        validate(&checked, greedy).expect("plan::validate accepts greedy by size");
        planner.push(t.size as f64 / t.peak_live_bound as f64);
        by_size.push(greedy as f64 / t.peak_live_bound as f64);
        if t.size <= t.peak_live_bound.next_multiple_of(t.align) {
            at_bound += 1;
        }
        assert!(t.peak_live_bound <= t.size && t.size <= t.unaliased_size);
    }
    let (pm, pw) = (percentile(&mut planner, 0.5), percentile(&mut planner, 1.0));
    let p90 = percentile(&mut planner, 0.9);
    let (gm, gw) = (percentile(&mut by_size, 0.5), percentile(&mut by_size, 1.0));
    let g90 = percentile(&mut by_size, 0.9);
    println!("plan quality: SIZE / PEAK_LIVE_BOUND over {instances} random instances");
    println!("(up to 64 buffers, 1 B … 16 MiB, align 1 … 4096, up to 32 stages)");
    println!(
        "{:<34} {:>8} {:>8} {:>8}",
        "planner", "median", "p90", "worst"
    );
    println!(
        "{:<34} {:>8.4} {:>8.4} {:>8.4}",
        "devarena (all strategies)", pm, p90, pw
    );
    println!(
        "{:<34} {:>8.4} {:>8.4} {:>8.4}",
        "greedy by size alone (TFLM)", gm, g90, gw
    );
    println!("instances planned at the bound (rounded to ALIGN): {at_bound} of {instances}");
    std::process::ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::parse_args;

    fn args(a: &str) -> Result<(usize, u64), String> {
        parse_args(&a.split_whitespace().map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn reads_the_flags_and_refuses_what_it_cannot_run() {
        assert_eq!(args(""), Ok((1000, 7)));
        assert_eq!(args("--seed 3 --instances 12"), Ok((12, 3)));
        // No instance: no median (it indexed an empty list); too many: no memory for them.
        assert!(args("--instances 0").unwrap_err().contains("--instances 0"));
        let e = args("--instances 18446744073709551615").unwrap_err();
        assert!(e.contains("want 1 to"), "{e}");
        // Garbage and unknown flags were ignored in silence.
        assert!(
            args("--instances abc")
                .unwrap_err()
                .contains("--instances abc")
        );
        assert!(args("--seed -1").unwrap_err().contains("--seed -1"));
        assert!(args("--bogus 3").unwrap_err().contains("`--bogus`"));
        assert!(args("--seed").unwrap_err().contains("needs a value"));
    }
}
