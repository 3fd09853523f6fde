use devarena::plan::*;
fn main() {
    let budgets: Vec<u64> = std::env::var("B").unwrap_or("500,1000,2000,4000,8000".into()).split(',').map(|s| s.parse().unwrap()).collect();
    let goal = match std::env::var("G").as_deref() { Ok("s") => Goal::Smallest, _ => Goal::Descend };
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
        let t = plan_into(&layout, &specs, &mut slots, &mut scratch).unwrap();
        let mut line = format!("{} greedy {:.3}", &path[path.len()-13..path.len()-12], t.size as f64 / 1048576.0);
        for &b in &budgets {
            let sizes = measure(&layout, &specs, &slots, &mut scratch);
            let mut s2 = vec![0; sizes.scratch_len()];
            let mut eng = Engine::new(&layout, &specs, &slots, &sizes, &mut s2);
            eng.set_incumbent(&slots.iter().map(|s| s.offset).collect::<Vec<_>>());
            let mut search = Search::new(goal, t.size, t.peak_live_bound, t.align);
            while eng.nodes() < b { let left = b - eng.nodes(); match search.step(&mut eng, &specs, layout.stages, left) { Step::Working => {}, _ => break } }
            line += &format!(" {}:{:.3}", b, search.size() as f64 / 1048576.0);
        }
        println!("{line}");
    }
}
