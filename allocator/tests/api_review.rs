//! Adversarial inputs to the public API outside the pool: run-time layouts and their search,
//! the planner's entry points, reports and the host stand-in for virtual memory. Each call
//! must give `Ok` or an `Err` (never a panic or a hang), and a plan it gives must be valid.

use devarena::plan::{
    FieldSpec, LayoutSpec, LiveRange, Placed, Slot, Strategy, alias_into, place_with,
    plan_as_derive, scratch_len, validate,
};
use devarena::{Budget, LayoutBuilder, RuntimeLayout};

/// Pseudo-random numbers (xorshift): `next(m)` is below `m`.
fn rng(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |m| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % m
    }
}

fn assert_valid(layout: &RuntimeLayout) {
    let placed: Vec<Placed> = layout.fields().iter().map(Placed::from).collect();
    assert_eq!(validate(&placed, layout.size()), Ok(()), "{layout:?}");
    assert_eq!(layout.size() % layout.align(), 0);
}

/// Staged layouts of huge buffers (each an eighth to a half of the address space) plan, search
/// and report without overflowing: a valid plan or an error.
#[test]
fn huge_staged_layouts_plan_and_search_without_overflow() {
    let mut next = rng(0x9E37_79B9_7F4A_7C15);
    let (mut planned, mut refused, mut searched) = (0, 0, 0);
    for round in 0..300 {
        let n = 1 + next(6) as usize;
        let stages = 1 + next(5) as usize;
        let mut b = LayoutBuilder::new("Huge")
            .align(1 << next(31))
            .stages(stages);
        for i in 0..n {
            let size = match next(4) {
                0 => usize::MAX >> (1 + next(3)),
                1 => (usize::MAX >> (1 + next(3))) - next(1 << 20) as usize,
                2 => 1 + next(1 << 12) as usize,
                _ => usize::MAX / (2 + next(6) as usize),
            };
            let (first, last) = (next(stages as u64) as usize, next(stages as u64) as usize);
            b = b
                .array_aligned::<u8>(format!("f{i}"), size, 1 << next(31))
                .live(first.min(last), first.max(last));
        }
        match b.clone().build() {
            Ok(l) => {
                assert_valid(&l);
                planned += 1;
                let _ = l.report().to_string();
            }
            Err(e) => {
                assert!(e.to_string().contains("Huge"), "{e}");
                refused += 1;
            }
        }
        // A time budget of zero (the first plan alone: the best-fit sweep or the unaliased
        // plan) and a small one (cut wherever the clock says) take the sweep's path too.
        let budgets = [
            Budget::nodes(2_000),
            Budget::nodes(500).until_size(0),
            Budget::time(std::time::Duration::ZERO),
            Budget::time(std::time::Duration::from_micros(200)),
        ];
        for budget in budgets {
            match b.clone().search(budget) {
                Ok(l) => {
                    assert_valid(&l);
                    searched += usize::from(l.search_stats().is_some_and(|s| s.nodes > 0));
                }
                Err(e) => assert!(e.to_string().contains("Huge"), "round {round}: {e}"),
            }
        }
    }
    assert!(
        planned > 10 && refused > 10 && searched > 10,
        "{planned} {refused} {searched}"
    );
}

/// `plan_as_derive` (the derive's search, run at run time) on the same huge layouts.
#[test]
fn huge_layouts_plan_as_the_derive_does_without_overflow() {
    let mut next = rng(0x2545_F491_4F6C_DD1D);
    let mut planned = 0;
    for _ in 0..200 {
        let n = 1 + next(6) as usize;
        let stages = 1 + next(5) as usize;
        let layout = LayoutSpec::DEFAULT
            .with_align(1 << next(31))
            .with_stages(stages);
        let specs: Vec<FieldSpec> = (0..n)
            .map(|_| {
                let size = match next(3) {
                    0 => usize::MAX >> (1 + next(3)),
                    1 => 1 + next(1 << 12) as usize,
                    _ => usize::MAX / (2 + next(6) as usize),
                };
                let (a, b) = (next(stages as u64) as usize, next(stages as u64) as usize);
                FieldSpec::of::<u8>(size)
                    .with_align(1 << next(31))
                    .with_live(a.min(b), a.max(b))
            })
            .collect();
        let mut slots = vec![Slot::EMPTY; n];
        if let Ok((_, totals)) = plan_as_derive(&layout, &specs, &mut slots) {
            let placed: Vec<Placed> = slots
                .iter()
                .zip(&specs)
                .map(|(s, f)| Placed::of(s, f.live))
                .collect();
            assert_eq!(validate(&placed, totals.size), Ok(()));
            planned += 1;
        }
    }
    assert!(planned > 10, "{planned}");
}

/// `alias_into` and `place_with` take their specs and slots as given: a live range whose
/// first stage is after its last is refused or planned, not a panic.
#[test]
fn alias_into_and_place_with_take_inverted_live_ranges_without_panicking() {
    let layout = LayoutSpec::DEFAULT.with_align(1).with_stages(4);
    let specs = [
        FieldSpec::of::<u8>(8).with_live(3, 1),
        FieldSpec::of::<u8>(8).with_live(0, 3),
    ];
    let mut slots = [Slot {
        offset: 0,
        size: 8,
        align: 1,
    }; 2];
    let mut scratch = vec![0; scratch_len(2)];
    let result = alias_into(&layout, &specs, &mut slots, 1, &mut scratch);
    assert!(result.is_err(), "{result:?}: {slots:?}");
    let mut placed = [0; 2];
    let result = place_with(
        Strategy::ByDuration,
        &specs,
        &slots,
        &mut placed,
        &mut scratch,
    );
    assert!(result.is_err(), "{result:?}: {placed:?}");
}

/// `alias_into` with a slot alignment that is not a power of two: refused, not a misaligned
/// plan or a panic.
#[test]
fn alias_into_refuses_bad_slot_alignments() {
    let layout = LayoutSpec::DEFAULT.with_align(1).with_stages(2);
    let specs = [FieldSpec::of::<u8>(10), FieldSpec::of::<u8>(8)];
    for align in [0, 3, 24, 1 << 40] {
        let mut slots = [
            Slot {
                offset: 0,
                size: 10,
                align: 1,
            },
            Slot {
                offset: 0,
                size: 8,
                align,
            },
        ];
        let mut scratch = vec![0; scratch_len(2)];
        let result = alias_into(&layout, &specs, &mut slots, 1, &mut scratch);
        assert!(result.is_err(), "align {align}: {result:?} {slots:?}");
    }
}

/// A live range that the report's stages do not cover draws, not panics.
#[test]
fn report_of_parts_outside_the_stages_draws() {
    let totals = devarena::plan::Totals {
        size: 512,
        align: 256,
        requested: 300,
        unaliased_size: 512,
        peak_live_bound: 256,
    };
    let fields = [
        (
            "a",
            "u8",
            Slot {
                offset: 0,
                size: 100,
                align: 256,
            },
            LiveRange::new(5, 7),
        ),
        (
            "b",
            "u8",
            Slot {
                offset: 256,
                size: 200,
                align: 256,
            },
            LiveRange::new(1, 0),
        ),
        (
            "c",
            "u8",
            Slot {
                offset: usize::MAX - 10,
                size: 100,
                align: 1,
            },
            LiveRange::ALL,
        ),
    ];
    let report = devarena::LayoutReport::from_parts("Parts", 2, totals, fields);
    assert!(report.to_svg().starts_with("<svg"));
    assert!(report.to_string().contains("Parts"));
    let _ = report.padding_bytes();
}

/// The host stand-in's `is_mapped` answers for a range that runs past the end of the address
/// space (no byte of it is mapped).
#[test]
fn host_vm_is_mapped_past_the_end_of_the_address_space() {
    let vm = devarena::backend::HostVirtualMemory::new(4096).unwrap();
    assert!(!vm.is_mapped(u64::MAX - 1, 16));
    assert!(!vm.is_mapped(u64::MAX, 2));
}

/// A snapshot of a backend's counters taken while another thread allocates and frees can hold
/// more frees than allocations (the counters are read one by one): no overflow.
#[test]
fn backend_stats_with_more_frees_than_allocations() {
    let stats = devarena::BackendStats {
        allocations: 4,
        frees: 5,
        ..Default::default()
    };
    assert_eq!(stats.live_allocations(), 0);
    let backend = devarena::HostBackend::new();
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let backend = backend.clone();
            std::thread::spawn(move || {
                use devarena::Backend;
                for _ in 0..2_000 {
                    let a = backend.allocate(64, 256).unwrap();
                    // SAFETY: allocated just above on this backend, freed once, never viewed.
                    unsafe { backend.deallocate(&a).unwrap() };
                }
            })
        })
        .collect();
    for _ in 0..20_000 {
        assert!(backend.stats().live_allocations() <= 2);
    }
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(backend.stats().live_allocations(), 0);
}

/// The stage map draws at most 256 columns: a layout with a million stages (the builder takes up
/// to 2^24) gives a picture the size of its buffers' list, not 150 bytes a stage (164 MB here
/// before), and every buffer is still drawn over the columns of its stages.
#[test]
fn stage_map_of_many_stages_stays_small() {
    let stages = 1 << 20;
    let layout = LayoutBuilder::new("Long")
        .stages(stages)
        .array::<u8>("a", 256)
        .live(0, stages - 1)
        .array::<u8>("b", 256)
        .live(stages / 2, stages / 2)
        .build()
        .unwrap();
    let svg = layout.report().to_svg();
    assert!(svg.len() < 1 << 16, "{} bytes of SVG", svg.len());
    // 4096 stages to a column; `a` spans all 256 columns, `b` one, the 129th.
    assert!(svg.contains("(4096 to a column)"), "{svg}");
    assert!(svg.contains(">0–4095<") && svg.contains(">1044480–1048575<"));
    assert!(svg.contains("width=\"30716.0\""), "{svg}");
    assert!(
        svg.contains("x=\"15452.0\"") && svg.contains("width=\"116.0\""),
        "{svg}"
    );
    // Few stages: one column each, as before.
    let few = LayoutBuilder::new("Few")
        .stages(3)
        .array::<u8>("a", 256)
        .live(0, 2)
        .build()
        .unwrap()
        .report()
        .to_svg();
    assert!(
        few.contains(">stage 2<") && !few.contains("to a column"),
        "{few}"
    );
}

/// `Search` rounds the capacities it asks for down to its alignment: one of 0 counts as 1
/// instead of dividing by zero, and the search still improves on the greedy plan.
#[test]
fn a_search_with_an_alignment_of_zero_runs() {
    use devarena::plan::{Engine, Goal, Search, Step, measure, plan_into};
    let mut next = rng(0x2545_F491_4F6C_DD1D);
    let mut improved = 0;
    for _ in 0..200 {
        // Small instances at alignment 1 where the greedy plan is above the lower bound.
        let stages = 2 + next(6) as usize;
        let spec = LayoutSpec::DEFAULT.with_align(1).with_stages(stages);
        let specs: Vec<FieldSpec> = (0..8 + next(10))
            .map(|_| {
                let (a, b) = (next(stages as u64) as usize, next(stages as u64) as usize);
                FieldSpec::of::<u8>(1 + next(100) as usize).with_live(a.min(b), a.max(b))
            })
            .collect();
        let mut slots = vec![Slot::EMPTY; specs.len()];
        let mut head = vec![0; scratch_len(specs.len())];
        let totals = plan_into(&spec, &specs, &mut slots, &mut head).unwrap();
        if totals.size == totals.peak_live_bound {
            continue;
        }
        let sizes = measure(&spec, &specs, &slots, &mut head);
        let mut scratch = vec![0; sizes.scratch_len()];
        let mut engine = Engine::new(&spec, &specs, &slots, &sizes, &mut scratch);
        let offsets: Vec<usize> = slots.iter().map(|s| s.offset).collect();
        engine.set_incumbent(&offsets);
        for goal in [Goal::Smallest, Goal::AtMost(totals.size - 1)] {
            let mut search = Search::new(goal, totals.size, totals.peak_live_bound, 0);
            for _ in 0..100_000 {
                if search.step(&mut engine, &specs, spec.stages, 1_000) == Step::Finished {
                    break;
                }
            }
            assert!(search.size() <= totals.size);
            improved += usize::from(search.size() < totals.size);
            let placed: Vec<Placed> = specs
                .iter()
                .zip(slots.iter().zip(engine.offsets()))
                .map(|(s, (slot, &offset))| Placed::of(&Slot { offset, ..*slot }, s.live))
                .collect();
            assert_eq!(validate(&placed, search.size()), Ok(()));
        }
    }
    assert!(improved > 0);
}
