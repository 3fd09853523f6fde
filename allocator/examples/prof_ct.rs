use devarena::plan::{self, Engine, FieldSpec, LayoutSpec, Preorder, Slot};
#[allow(dead_code)]
#[path = "minimalloc/csv.rs"]
mod csv;
fn load(path: &str) -> (LayoutSpec, Vec<FieldSpec>) {
    let text = std::fs::read_to_string(path).unwrap();
    let (_, rows) = csv::parse(&text).unwrap();
    let rows: Vec<(u64, u64, usize)> = rows.iter().map(|r| (r.lower, r.upper, r.size as usize)).collect();
    let mut times: Vec<u64> = rows.iter().flat_map(|r| [r.0, r.1]).collect();
    times.sort_unstable(); times.dedup();
    let rank = |t: u64| times.partition_point(|&x| x < t);
    let layout = LayoutSpec::DEFAULT.with_align(1).with_stages(times.len());
    let specs = rows.iter().map(|r| FieldSpec::of::<u8>(r.2).with_live(rank(r.0), rank(r.1) - 1)).collect();
    (layout, specs)
}
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let (layout, specs) = load(&a[1]);
    let p = match a[2].as_str() { "wat" => Preorder::Wat, "taw" => Preorder::Taw, _ => Preorder::Twa };
    let fl = a[3] == "1"; let permille: usize = a[4].parse().unwrap();
    let n = specs.len();
    let mut slots = vec![Slot::EMPTY; n];
    let mut head = vec![0; plan::scratch_len(n)];
    let t = plan::plan_into(&layout, &specs, &mut slots, &mut head).unwrap();
    let sizes = plan::measure(&layout, &specs, &slots, &mut head);
    let mut scratch = vec![0; sizes.scratch_len()];
    let mut e = Engine::new(&layout, &specs, &slots, &sizes, &mut scratch);
    e.set_preorder(p, &specs, layout.stages); e.set_reorder_parts(false); e.set_waiting_floors(fl);
    e.set_work_stop(2_000_000);
    let o = e.run(t.peak_live_bound * permille / 1000, u64::MAX);
    println!("{:?} work {} nodes {} prof {:?}", o, e.work(), e.nodes(), e.prof.iter().map(|x| x / 1000).collect::<Vec<_>>());
}
