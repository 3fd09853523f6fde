use devarena::plan::*;
fn main() {
    let work: u64 = std::env::var("W").map(|s| s.parse().unwrap()).unwrap_or(COMPILE_TIME_WORK);
    let steps: usize = std::env::var("STEPS").map(|s| s.parse().unwrap()).unwrap_or(12);
    let mut ratios = vec![];
    for path in std::env::args().skip(1) {
        let text = std::fs::read_to_string(&path).unwrap();
        let rows: Vec<(usize, usize, usize)> = text.lines().skip(1).map(|l| { let v: Vec<usize> = l.split(',').map(|s| s.trim().parse().unwrap()).collect(); (v[1], v[2], v[3]) }).collect();
        let mut pts: Vec<usize> = rows.iter().flat_map(|r| [r.0, r.1]).collect(); pts.sort(); pts.dedup();
        let idx = |t: usize| pts.binary_search(&t).unwrap();
        let layout = LayoutSpec::DEFAULT.with_align(1).with_stages(pts.len());
        let specs: Vec<FieldSpec> = rows.iter().map(|r| FieldSpec::of::<u8>(r.2).with_live(idx(r.0), idx(r.1) - 1)).collect();
        let n = specs.len();
        let mut slots = vec![Slot::EMPTY; n];
        let mut scratch = vec![0; scratch_len(n)];
        let mut t = plan_into(&layout, &specs, &mut slots, &mut scratch).unwrap();
        let g = t.size;
        let sizes = measure(&layout, &specs, &slots, &mut scratch);
        let mut s2 = vec![0; scratch_len(n) + sizes.scratch_len()];
        let mut sch = Schedule::START;
        let t0 = std::time::Instant::now();
        let mut used = 0;
        while used < steps && !sch.done() {
            improve_slots(&layout, &specs, &mut slots, &mut t, &mut sch, work, &mut s2);
            used += 1;
        }
        let r = t.size as f64 / 1048576.0;
        ratios.push(r);
        println!("{} greedy {:.3} best {:.3} steps {} done {} {:.1?}", &path[path.len()-13..path.len()-12], g as f64 / 1048576.0, r, used, sch.done(), t0.elapsed());
    }
    ratios.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("median {:.3} worst {:.3}", ratios[ratios.len() / 2], ratios[ratios.len() - 1]);
}
