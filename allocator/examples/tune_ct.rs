//! Tuning harness: the derive's search with another schedule, on MiniMalloc CSVs.
//! SCHED="0:taw:0:2,1200:twa:0:400000,..." (permille:preorder:floors:work) STEPS=2 WORK=400000
use devarena::plan::{self, FieldSpec, LayoutSpec, Preorder, Schedule, Slot, Try};
#[allow(dead_code)]
#[path = "minimalloc/csv.rs"]
mod csv;

fn load(path: &str) -> (LayoutSpec, Vec<FieldSpec>) {
    let text = std::fs::read_to_string(path).unwrap();
    let (_, rows) = csv::parse(&text).unwrap();
    let rows: Vec<(u64, u64, usize)> = rows.iter().map(|r| (r.lower, r.upper, r.size as usize)).collect();
    let mut times: Vec<u64> = rows.iter().flat_map(|r| [r.0, r.1]).collect();
    times.sort_unstable();
    times.dedup();
    let rank = |t: u64| times.partition_point(|&x| x < t);
    let layout = LayoutSpec::DEFAULT.with_align(1).with_stages(times.len());
    let specs = rows.iter().map(|r| FieldSpec::of::<u8>(r.2).with_live(rank(r.0), rank(r.1) - 1)).collect();
    (layout, specs)
}

fn pre(s: &str) -> Preorder {
    match s {
        "wat" => Preorder::Wat, "taw" => Preorder::Taw, "twa" => Preorder::Twa,
        "swat" => Preorder::SectionWat, "staw" => Preorder::SectionTaw, "stwa" => Preorder::SectionTwa,
        _ => panic!("preorder {s}"),
    }
}

fn main() {
    let sched = std::env::var("SCHED").unwrap();
    let tries: Vec<Try> = sched.split(',').map(|t| {
        let f: Vec<&str> = t.split(':').collect();
        (f[0].parse().unwrap(), pre(f[1]), f[2] == "1", f[3].parse().unwrap())
    }).collect();
    let steps: usize = std::env::var("STEPS").map(|s| s.parse().unwrap()).unwrap_or(2);
    let work: u64 = std::env::var("WORK").map(|s| s.parse().unwrap()).unwrap_or(400_000);
    let mut ratios = vec![];
    let mut line = String::new();
    for path in std::env::args().skip(1) {
        let (layout, specs) = load(&path);
        let n = specs.len();
        let mut slots = vec![Slot::EMPTY; n];
        let mut head = vec![0; plan::scratch_len(n)];
        let mut totals = plan::plan_into(&layout, &specs, &mut slots, &mut head).unwrap();
        let sizes = plan::measure(&layout, &specs, &slots, &mut head);
        let mut scratch = vec![0; plan::scratch_len(n) + sizes.scratch_len()];
        let mut schedule = Schedule::START;
        for _ in 0..steps {
            plan::improve_slots_with(&tries, &layout, &specs, &mut slots, &mut totals, &mut schedule, work, &mut scratch);
        }
        let r = totals.size as f64 / 1048576.0;
        let name = path.rsplit('/').next().unwrap().chars().next().unwrap();
        if std::env::var("W").is_ok() { line += &format!("{name} {r:.4} {} ", schedule.work()); } else { line += &format!("{name} {r:.4}  "); }
        ratios.push(r);
    }
    ratios.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("{line}| median {:.4} worst {:.4}", ratios[ratios.len() / 2], ratios[ratios.len() - 1]);
}
