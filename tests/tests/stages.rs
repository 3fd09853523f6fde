//! Compile-time memory planning with stages: buffers whose live ranges never meet share bytes,
//! and per-stage views keep every buffer out of reach outside its live range.

use devarena::plan::{FieldSpec, Slot, Strategy as PlanStrategy, place_with, scratch_len};
use devarena::{Arena, DeviceLayout, HostBackend, LayoutBuilder, LayoutReport, LiveRange};
use proptest::prelude::*;

/// The classic five-buffer case: sizes 10..50, live 0–1, 1–2, 2–3, 3–4, 0–1.
#[derive(DeviceLayout)]
#[layout(align = 1, stages = 5)]
struct Five {
    #[layout(live = 0..=1)]
    a: [u8; 10],
    #[layout(live = 1..=2)]
    b: [u8; 20],
    #[layout(live = 2..=3)]
    c: [u8; 30],
    #[layout(live = 3..=4)]
    d: [u8; 40],
    #[layout(live = 0..=1)]
    e: [u8; 50],
}

#[test]
fn five_buffers_reach_the_bound_greedy_by_size_does_not() {
    // Stage loads: 60, 80, 50, 70, 40: the bound is 80.
    assert_eq!(Five::PEAK_LIVE_BOUND, 80);
    assert_eq!(Five::SIZE, 80);
    assert_eq!(Five::UNALIASED_SIZE, 150);
    // Greedy by size alone (TensorFlow Lite Micro's planner) needs 90.
    let specs: Vec<FieldSpec> = [(10, 0, 1), (20, 1, 2), (30, 2, 3), (40, 3, 4), (50, 0, 1)]
        .iter()
        .map(|&(n, a, b)| FieldSpec::of::<u8>(n).with_live(a, b))
        .collect();
    let slots: Vec<Slot> = specs
        .iter()
        .map(|s| Slot {
            offset: 0,
            size: s.len,
            align: 1,
        })
        .collect();
    let (mut placed, mut scratch) = (vec![0; 5], vec![0; scratch_len(5)]);
    assert_eq!(
        place_with(
            PlanStrategy::BySize,
            &specs,
            &slots,
            &mut placed,
            &mut scratch
        ),
        Ok(90)
    );
    // The runtime builder plans the same.
    let mut b = LayoutBuilder::new("Five").align(1).stages(5);
    for (i, s) in specs.iter().enumerate() {
        b = b.field(format!("f{i}"), "u8", *s);
    }
    let rt = b.build().unwrap();
    assert_eq!(rt.size(), Five::SIZE);
    let placed: Vec<devarena::plan::Placed> = rt.fields().iter().map(Into::into).collect();
    devarena::plan::validate(&placed, rt.size()).unwrap();
    let derived: Vec<usize> = Five::FIELDS.iter().map(|f| f.offset).collect();
    let built: Vec<usize> = rt.fields().iter().map(|f| f.offset).collect();
    assert_eq!(derived, built);
}

/// A pipeline with named stages, default alignment 256.
#[derive(DeviceLayout)]
#[layout(stages(decode, blur, edges, output))]
struct Pipe {
    #[layout(live = decode..=blur)]
    rgb: [u8; 64 * 64 * 3],
    #[layout(live = decode..=edges)]
    gray: [f32; 64 * 64],
    #[layout(live = blur)]
    scratch: [f32; 64 * 64],
    #[layout(live = blur..=edges)]
    blurred: [f32; 64 * 64],
    #[layout(live = edges..=output)]
    magnitude: [f32; 64 * 64],
    #[layout(live = output)]
    mask: [u8; 64 * 64],
    hist: [u32; 256], // live throughout
}

fn conflicting_pairs_apart<L: DeviceLayout>() {
    for (i, a) in L::FIELDS.iter().enumerate() {
        assert_eq!(a.offset % a.align, 0, "{} aligned", a.name);
        assert!(a.end() <= L::SIZE, "{} inside", a.name);
        for (j, b) in L::FIELDS.iter().enumerate().skip(i + 1) {
            if L::LIVE[i].meets(&L::LIVE[j]) {
                assert!(
                    a.end() <= b.offset || b.end() <= a.offset,
                    "{} and {} are live together but overlap",
                    a.name,
                    b.name
                );
            }
        }
    }
}

#[test]
fn named_stages_plan_and_share() {
    assert_eq!(Pipe::STAGES, 4);
    assert_eq!(Pipe::LIVE[2], LiveRange::new(1, 1));
    assert_eq!(Pipe::LIVE[6], LiveRange::ALL);
    conflicting_pairs_apart::<Pipe>();
    conflicting_pairs_apart::<Five>();
    const { assert!(Pipe::PEAK_LIVE_BOUND <= Pipe::SIZE && Pipe::SIZE < Pipe::UNALIASED_SIZE) };
    // Stage `blur` holds rgb, gray, scratch, blurred and hist: the bound.
    let blur = 64 * 64 * 3 + 3 * 64 * 64 * 4 + 1024;
    assert_eq!(Pipe::PEAK_LIVE_BOUND, blur);
    assert_eq!(
        Pipe::SIZE,
        Pipe::PEAK_LIVE_BOUND,
        "this layout plans at the bound"
    );
    let report = LayoutReport::of::<Pipe>();
    let table = report.to_string();
    println!("{table}");
    assert!(table.contains("live") && table.contains("shares bytes with"));
    assert!(table.contains(&format!("PEAK_LIVE_BOUND {}", Pipe::PEAK_LIVE_BOUND)));
    let mask = report.rows.iter().find(|r| r.name == "mask").unwrap();
    assert!(
        !mask.shares_with.is_empty(),
        "mask reuses bytes of an earlier buffer"
    );
    // Named stages show by name, in the table and in the stage × address picture.
    assert_eq!(Pipe::STAGE_NAMES, ["decode", "blur", "edges", "output"]);
    assert!(table.contains("decode..=edges") && table.contains(" output "));
    let svg = report.to_svg();
    assert!(svg.contains(">edges<") && svg.contains(&format!("SIZE {}", Pipe::SIZE)));
    // Numbered stages show by number.
    let five = LayoutReport::of::<Five>().to_svg();
    assert!(five.contains(">stage 4<"));
}

#[test]
fn stage_views_carry_data_through_the_stages() {
    use PipeStages as _;
    let backend = HostBackend::new();
    let mut arena = Arena::<Pipe>::new_in(backend.clone()).unwrap();
    {
        let s = arena.decode_mut();
        for (i, px) in s.rgb.iter_mut().enumerate() {
            *px = (i % 251) as u8;
        }
        for (i, g) in s.gray.iter_mut().enumerate() {
            *g = i as f32;
        }
        s.hist.fill(1);
    }
    {
        let s = arena.blur_mut();
        // What decode wrote is still there for the fields live in both stages.
        assert!(s.rgb.iter().enumerate().all(|(i, &p)| p == (i % 251) as u8));
        assert!(s.gray.iter().enumerate().all(|(i, &g)| g == i as f32));
        s.scratch.copy_from_slice(s.gray);
        for (b, x) in s.blurred.iter_mut().zip(s.scratch.iter()) {
            *b = x * 2.0;
        }
    }
    {
        let s = arena.stage_mut::<2>();
        assert!(
            s.blurred
                .iter()
                .enumerate()
                .all(|(i, &b)| b == 2.0 * i as f32)
        );
        for (m, (g, b)) in s
            .magnitude
            .iter_mut()
            .zip(s.gray.iter().zip(s.blurred.iter()))
        {
            *m = b - g;
        }
    }
    {
        let s = arena.output_mut();
        for (k, m) in s.mask.iter_mut().zip(s.magnitude.iter()) {
            *k = if *m > 1000.0 { 255 } else { 0 };
        }
        s.hist[0] = s.mask.iter().filter(|&&k| k == 255).count() as u32;
    }
    let out = arena.output();
    assert_eq!(out.hist[0], (64 * 64 - 1001) as u32);
    assert_eq!(out.hist[1], 1, "hist lives throughout");
    assert_eq!(backend.stats().allocations, 1);
    assert_eq!(arena.size(), Pipe::SIZE);
}

#[test]
fn every_stage_hands_out_disjoint_views() {
    let mut arena = Arena::<Five>::new().unwrap();
    macro_rules! fill_and_check {
        ($s:literal, $($f:ident = $v:literal),*) => {{
            let s = arena.stage_mut::<$s>();
            $( s.$f.fill($v); )*
            $( assert!(s.$f.iter().all(|&x| x == $v), "stage {} field {}", $s, stringify!($f)); )*
        }};
    }
    fill_and_check!(0, a = 1, e = 2);
    fill_and_check!(1, a = 3, b = 4, e = 5);
    fill_and_check!(2, b = 6, c = 7);
    fill_and_check!(3, c = 8, d = 9);
    fill_and_check!(4, d = 10);
}

/// A reference check of a plan, independent of the planner: conflicting fields apart, every
/// offset aligned, the bound below the size and the size below the unaliased size.
fn check_plan(specs: &[(usize, usize, usize, usize)], stages: usize) -> Result<(), TestCaseError> {
    let mut b = LayoutBuilder::new("random").align(1).stages(stages);
    for (i, &(size, align, first, last)) in specs.iter().enumerate() {
        b = b
            .field(
                format!("f{i}"),
                "u8",
                FieldSpec::of::<u8>(size).with_align(align),
            )
            .live(first, last);
    }
    let layout = b.build().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let placed: Vec<devarena::plan::Placed> = layout.fields().iter().map(Into::into).collect();
    if let Err(v) = devarena::plan::validate(&placed, layout.size()) {
        return Err(TestCaseError::fail(format!("plan::validate: {v}")));
    }
    let t = layout.totals();
    let f = layout.fields();
    for (i, a) in f.iter().enumerate() {
        prop_assert_eq!(a.offset % a.align, 0);
        prop_assert_eq!(a.align, specs[i].1);
        prop_assert!(a.offset + a.size <= t.size);
        for b in &f[i + 1..] {
            if a.live.meets(&b.live) {
                prop_assert!(a.offset + a.size <= b.offset || b.offset + b.size <= a.offset);
            }
        }
    }
    // The bound, computed here without the planner: per stage, the live sizes side by side.
    let align = specs.iter().map(|s| s.1).max().unwrap_or(1);
    let mut bound = 0;
    for stage in 0..stages {
        let live: Vec<_> = specs
            .iter()
            .filter(|s| s.2 <= stage && stage <= s.3)
            .collect();
        if let Some(m) = live.iter().map(|s| s.1).min() {
            let rounded: Vec<usize> = live.iter().map(|s| s.0.next_multiple_of(m)).collect();
            let slack = live
                .iter()
                .zip(&rounded)
                .map(|(s, r)| r - s.0)
                .max()
                .unwrap_or(0);
            let need = (rounded.iter().sum::<usize>() - slack).next_multiple_of(align);
            bound = bound.max(need);
        }
    }
    prop_assert_eq!(t.peak_live_bound, bound);
    prop_assert!(
        t.peak_live_bound <= t.size,
        "bound {} > size {}",
        t.peak_live_bound,
        t.size
    );
    prop_assert!(t.size <= t.unaliased_size);
    prop_assert_eq!(t.size % t.align, 0);
    Ok(())
}

fn instance() -> impl Strategy<Value = (Vec<(usize, usize, usize, usize)>, usize)> {
    (1usize..=32).prop_flat_map(|stages| {
        let field = (0u32..=24, 0u32..=12, 0..stages, 0..stages).prop_map(|(s, a, x, y)| {
            (
                (1usize << s).min(16 << 20) - (s > 2) as usize,
                1usize << a,
                x.min(y),
                x.max(y),
            )
        });
        (proptest::collection::vec(field, 1..=64), Just(stages))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn random_instances_plan_soundly((specs, stages) in instance()) {
        check_plan(&specs, stages)?;
    }
}

#[test]
fn aliasing_leaves_layouts_without_stages_alone() {
    #[derive(DeviceLayout)]
    struct Plain {
        a: [u8; 100],
        b: [f32; 100],
    }
    assert_eq!(Plain::SIZE, Plain::UNALIASED_SIZE);
    assert_eq!(Plain::STAGES, 0);
    assert_eq!(
        Plain::PEAK_LIVE_BOUND,
        256 + 400_usize.next_multiple_of(256)
    );
}

/// The derive refuses stage names whose methods would be `Arena`'s own (`arena.free()` would
/// free the arena): its list of those methods is exactly the public methods of `Arena`'s own
/// impl blocks.
#[test]
fn the_derives_list_of_arena_methods_is_the_arenas() {
    let macro_source = include_str!("../../macros/src/model.rs");
    let start = macro_source
        .find("const ARENA_METHODS: &[&str] = &[")
        .expect("the list in the derive");
    let list = &macro_source[start..];
    let list = &list[list.find("= &[").unwrap() + 4..list.find("];").unwrap()];
    let mut listed: Vec<String> = list
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .collect();
    listed.sort();
    let sources = [
        include_str!("../../allocator/src/arena/mod.rs"),
        include_str!("../../allocator/src/arena/cuda.rs"),
        include_str!("../../allocator/src/arena/graph.rs"),
    ];
    let mut found = Vec::new();
    for source in sources {
        let mut in_arena = false;
        for line in source.lines() {
            if line.starts_with("impl") {
                // `impl<..> Arena<..> {`: not a trait's impl, not another type's.
                in_arena = line.contains("> Arena<") && !line.contains(" for ");
            } else if line.starts_with('}') {
                in_arena = false;
            } else if in_arena && line.starts_with("    pub") {
                // `pub fn`, also `const`, `async`, `unsafe` (not `pub(crate)`: unreachable).
                let mut item = line.trim_start().strip_prefix("pub ").unwrap_or("");
                for qualifier in ["const ", "async ", "unsafe "] {
                    item = item.strip_prefix(qualifier).unwrap_or(item);
                }
                if let Some(rest) = item.strip_prefix("fn ") {
                    let end = rest.find(['(', '<']).unwrap_or(rest.len());
                    found.push(rest[..end].to_string());
                }
            }
        }
    }
    found.sort();
    assert!(found.len() > 20, "{found:?}");
    assert_eq!(found, listed);
}

/// Every field live at once in one stage: no aliasing can help, and the plan is the
/// declaration-order one, as without stages (the greedy orderings are not run: with many
/// fields live together their pairwise conflicts took seconds, for nothing).
#[derive(DeviceLayout)]
#[layout(align = 1, stages = 2)]
struct AllLive {
    #[layout(live = 0..=0)]
    small: [u8; 16],
    #[layout(live = 0..=0)]
    large: [u8; 4096],
    #[layout(live = 0..=1)]
    medium: [u8; 256],
}

#[test]
fn a_layout_whose_fields_are_all_live_at_once_keeps_declaration_order() {
    assert_eq!(AllLive::SIZE, AllLive::UNALIASED_SIZE);
    assert_eq!(AllLive::SIZE, AllLive::PEAK_LIVE_BOUND);
    let offsets: Vec<usize> = AllLive::FIELDS.iter().map(|f| f.offset).collect();
    assert_eq!(offsets, [0, 16, 16 + 4096]);
    // The runtime builder, with many fields: the same, from `build` and from `search`.
    let n = 3000;
    let mut b = LayoutBuilder::new("AllLive").align(1).stages(1);
    for i in 0..n {
        b = b
            .field(format!("f{i}"), "u8", FieldSpec::of::<u8>(1 + i % 7))
            .live(0, 0);
    }
    let expected: Vec<usize> = (0..n)
        .scan(0, |end, i| {
            let at = *end;
            *end += 1 + i % 7;
            Some(at)
        })
        .collect();
    for rt in [
        b.clone().build().unwrap(),
        b.search(devarena::Budget::nodes(0)).unwrap(),
    ] {
        let got: Vec<usize> = rt.fields().iter().map(|f| f.offset).collect();
        assert_eq!(got, expected);
        assert_eq!(rt.size(), expected[n - 1] + 1 + (n - 1) % 7);
    }
}

/// One greedy ordering of a huge layout overflows (largest first: the 1 GiB-aligned bytes no
/// longer fit after the large field) where the declaration order fits: the plan comes from the
/// orderings that fit, in the derive's combination of orderings and in the builder alike.
#[test]
fn an_ordering_that_overflows_gives_way_to_one_that_fits() {
    use devarena::plan::{LayoutSpec, Strategy, plan_with, smaller};
    let big = usize::MAX - (1 << 31) - 4;
    let specs = [
        FieldSpec::of::<u8>(1).with_align(1 << 30),
        FieldSpec::of::<u8>(1).with_align(1 << 30),
        FieldSpec::of::<u8>(big).with_align(1),
    ];
    let layout = LayoutSpec::DEFAULT.with_align(1).with_stages(1);
    const S: usize = 14 * 3 + 200;
    let by_size = plan_with::<3, S>(&layout, &specs, &[Strategy::BySize]);
    let declared = plan_with::<3, S>(&layout, &specs, &[Strategy::Declaration]);
    assert!(by_size.is_err(), "{by_size:?}");
    let declared = declared.unwrap();
    assert_eq!(smaller(by_size, Ok(declared)), Ok(declared));
    assert_eq!(smaller(Ok(declared), by_size), Ok(declared));
    // Every ordering at once: the one that fits.
    let all = devarena::plan::plan::<3, S>(&layout, &specs).unwrap();
    assert_eq!(all.totals.size, declared.totals.size);
    let rt = LayoutBuilder::new("Huge")
        .align(1)
        .stages(1)
        .array_aligned::<u8>("b1", 1, 1 << 30)
        .array_aligned::<u8>("b2", 1, 1 << 30)
        .array_aligned::<u8>("a", big, 1)
        .build()
        .unwrap();
    assert_eq!(rt.size(), declared.totals.size);
    assert_eq!(rt.size(), usize::MAX - (1 << 30) + 1);
}
