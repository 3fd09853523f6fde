use devarena::plan::*;
fn main() {
    let mult: u64 = std::env::var("M").map(|s| s.parse().unwrap()).unwrap_or(2);
    let factors: Vec<f64> = std::env::var("F").unwrap_or("1.0,1.03,1.06,1.1,1.15".into()).split(',').map(|s| s.parse().unwrap()).collect();
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
        let t = plan_into(&layout, &specs, &mut slots, &mut scratch).unwrap();
        let sizes = measure(&layout, &specs, &slots, &mut scratch);
        let mut s2 = vec![0; sizes.scratch_len()];
        let mut eng = Engine::new(&layout, &specs, &slots, &sizes, &mut s2);
        eng.set_waiting_floors(std::env::var("NOUF").is_err());
        let t0 = std::time::Instant::now();
        let mut best = t.size;
        let mut wins = String::new();
        let stop_on_fail = std::env::var("STOP").is_ok();
        for &f in &factors {
            let cap = (t.peak_live_bound as f64 * f) as usize;
            if cap >= best { continue; }
            let before = best;
            let strat: Vec<(Preorder, bool)> = match std::env::var("S").as_deref() { Ok("3") => vec![(Preorder::Wat, true), (Preorder::Taw, true), (Preorder::Twa, true)], Ok("4") => vec![(Preorder::Wat, true), (Preorder::Taw, true), (Preorder::Twa, true), (Preorder::Twa, false)], _ => Preorder::ALL.iter().flat_map(|&p| [(p, true), (p, false)]).collect() };
            for (p, rr) in strat { {
                if cap >= best { break; }
                eng.set_preorder(p, &specs, layout.stages);
                eng.set_reorder_parts(rr);
                if let Outcome::Found { end } = eng.run(cap, mult * n as u64) { if end < best { best = end; wins += &format!("{f}:{p:?}{} ", if rr {"r"} else {""}); } }
            }}
            if stop_on_fail && best == before { break; }
        }
        let r = best as f64 / 1048576.0;
        ratios.push(r);
        println!("{} greedy {:.3} best {:.3} nodes {} {:.1?} {}", &path[path.len()-13..path.len()-12], t.size as f64 / 1048576.0, r, eng.nodes(), t0.elapsed(), wins);
    }
    ratios.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("median {:.3} worst {:.3}", ratios[ratios.len() / 2], ratios[ratios.len() - 1]);
}
