//! The planner's search, at run time (`LayoutBuilder::search`) and at compile time (the
//! derive's `plan::improve_step` chain, run here through `plan::plan_as_derive`: the same
//! `const fn`s and work): never larger than the four-ordering greedy plan, never larger than the
//! unaliased plan, and every plan checked by the independent validator `plan::validate`.

use devarena::plan::{self, FieldSpec, LayoutSpec, LiveRange, Placed, Slot};
use devarena::{Budget, DeviceLayout, LayoutBuilder, RuntimeLayout};
use devarena_kernels::pipeline::FrameStaged;
use proptest::prelude::*;

/// One buffer of a generated instance.
#[derive(Clone, Debug)]
struct Buf {
    size: usize,
    align: usize,
    first: usize,
    last: usize,
}

/// Up to 40 buffers of 1 B … 4 KiB, alignments 1 … 64, over up to 12 stages.
fn instance() -> impl Strategy<Value = (usize, Vec<Buf>)> {
    (1usize..=12).prop_flat_map(|stages| {
        let buf = (1usize..=4096, 0u32..=6, 0..stages, 0..stages).prop_map(|(size, a, x, y)| Buf {
            size,
            align: 1 << a,
            first: x.min(y),
            last: x.max(y),
        });
        (Just(stages), prop::collection::vec(buf, 1..=40))
    })
}

fn builder(stages: usize, bufs: &[Buf]) -> LayoutBuilder {
    let mut b = LayoutBuilder::new("Generated").align(1).stages(stages);
    for (i, x) in bufs.iter().enumerate() {
        b = b
            .array_aligned::<u8>(format!("b{i}"), x.size, x.align)
            .live(x.first, x.last);
    }
    b
}

/// The validator's verdict on a run-time plan, and its size against the unaliased plan.
fn check(layout: &RuntimeLayout) -> Result<(), TestCaseError> {
    let placed: Vec<Placed> = layout.fields().iter().map(Placed::from).collect();
    if let Err(v) = plan::validate(&placed, layout.size()) {
        return Err(TestCaseError::fail(format!("invalid plan: {v}")));
    }
    prop_assert!(layout.size() <= layout.totals().unaliased_size);
    prop_assert!(layout.size() >= layout.totals().peak_live_bound);
    Ok(())
}

/// The compile-time search on a plan of any length: the derive's steps, run here.
fn compile_time_plan(stages: usize, bufs: &[Buf]) -> (Vec<Slot>, plan::Totals, plan::Totals) {
    let layout = LayoutSpec::DEFAULT.with_align(1).with_stages(stages);
    let specs: Vec<FieldSpec> = bufs
        .iter()
        .map(|b| {
            FieldSpec::of::<u8>(b.size)
                .with_align(b.align)
                .with_live(b.first, b.last)
        })
        .collect();
    let mut slots = vec![Slot::EMPTY; specs.len()];
    let (greedy, totals) = plan::plan_as_derive(&layout, &specs, &mut slots).expect("valid");
    (slots, greedy, totals)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// `search` is never larger than `build` (the four-ordering greedy), nor than the
    /// unaliased plan, and both are valid; `end` agrees with the sizes.
    #[test]
    fn search_never_loses_to_the_greedy_plan((stages, bufs) in instance()) {
        let greedy = builder(stages, &bufs).build().unwrap();
        let searched = builder(stages, &bufs).search(Budget::nodes(2_000)).unwrap();
        check(&greedy)?;
        check(&searched)?;
        prop_assert!(searched.size() <= greedy.size());
        let stats = searched.search_stats().unwrap();
        // The start: the greedy orderings' plan, or the best-fit sweep's where smaller.
        prop_assert!(stats.greedy_size <= greedy.size());
        prop_assert!(searched.size() <= stats.greedy_size);
        prop_assert!(stats.lower >= searched.totals().peak_live_bound);
        prop_assert!(searched.size() >= stats.lower);
        if stats.optimal {
            prop_assert_eq!(searched.size(), stats.lower);
        }
        prop_assert_eq!(stats.optimal, stats.end == devarena::SearchEnd::Optimal);
        if stats.end == devarena::SearchEnd::Budget {
            prop_assert_eq!(stats.nodes, 2_000);
        }
    }

    /// The derive's search (the same const fns, run here) is never larger than the greedy
    /// plan it starts from, nor than the unaliased plan, and is valid.
    #[test]
    fn compile_time_search_never_loses_to_the_greedy_plan((stages, bufs) in instance()) {
        let (slots, greedy, totals) = compile_time_plan(stages, &bufs);
        let built = builder(stages, &bufs).build().unwrap();
        prop_assert_eq!(greedy.size, built.size());
        prop_assert!(totals.size <= greedy.size);
        prop_assert!(totals.size <= totals.unaliased_size);
        prop_assert!(totals.size >= totals.peak_live_bound);
        let placed: Vec<Placed> = slots
            .iter()
            .zip(&bufs)
            .map(|(s, b)| Placed::of(s, LiveRange::new(b.first, b.last)))
            .collect();
        if let Err(v) = plan::validate(&placed, totals.size) {
            return Err(TestCaseError::fail(format!("invalid plan: {v}")));
        }
    }
}

/// The plan of a derived layout, checked by the validator.
fn check_derived<L: DeviceLayout>() {
    let placed: Vec<Placed> = L::FIELDS
        .iter()
        .zip(L::LIVE)
        .map(|(f, &live)| Placed {
            offset: f.offset,
            size: f.size,
            align: f.align,
            live,
        })
        .collect();
    if let Err(v) = plan::validate(&placed, L::SIZE) {
        panic!("{}: invalid plan: {v}", L::NAME);
    }
    assert!(L::SIZE <= L::UNALIASED_SIZE, "{}", L::NAME);
    assert!(L::SIZE >= L::PEAK_LIVE_BOUND, "{}", L::NAME);
    assert_eq!(L::SIZE % L::ALIGN, 0, "{}", L::NAME);
}

/// A layout the greedy planner misses: 24 bytes by every ordering, 21 at best (stage 2 holds
/// `a`, `e` and `f`).
#[derive(DeviceLayout)]
#[layout(align = 1, stages = 4)]
#[allow(dead_code)]
struct Tight {
    #[layout(live = 1..=3)]
    a: [u8; 5],
    #[layout(live = 0..=0)]
    b: [u8; 9],
    #[layout(live = 0..=1)]
    c: [u8; 1],
    #[layout(live = 3..=3)]
    d: [u8; 6],
    #[layout(live = 2..=3)]
    e: [u8; 7],
    #[layout(live = 0..=2)]
    f: [u8; 9],
}

/// The layout of `Tight` (above) as a runtime builder: the greedy plan misses the bound by 3.
fn tight() -> LayoutBuilder {
    LayoutBuilder::new("Tight")
        .align(1)
        .stages(4)
        .array::<u8>("a", 5)
        .live(1, 3)
        .array::<u8>("b", 9)
        .live(0, 0)
        .array::<u8>("c", 1)
        .live(0, 1)
        .array::<u8>("d", 6)
        .live(3, 3)
        .array::<u8>("e", 7)
        .live(2, 3)
        .array::<u8>("f", 9)
        .live(0, 2)
}

#[test]
fn the_derive_searches_past_the_greedy_plan() {
    let greedy = tight().build().unwrap();
    assert_eq!(greedy.size(), 24);
    assert_eq!(Tight::PEAK_LIVE_BOUND, 21);
    assert_eq!(Tight::SIZE, 21, "the compile-time search reaches the bound");
    check_derived::<Tight>();
}

/// A generic layout with stages keeps the greedy plan (its search would need an array length
/// named by its parameters).
#[derive(DeviceLayout)]
#[layout(align = 1, stages = 4)]
#[allow(dead_code)]
struct TightGeneric<const N: usize> {
    #[layout(live = 1..=3)]
    a: [u8; N],
    #[layout(live = 0..=0)]
    b: [u8; 9],
    #[layout(live = 0..=1)]
    c: [u8; 1],
    #[layout(live = 3..=3)]
    d: [u8; 6],
    #[layout(live = 2..=3)]
    e: [u8; 7],
    #[layout(live = 0..=2)]
    f: [u8; 9],
}

#[test]
fn generic_layouts_keep_the_greedy_plan() {
    assert_eq!(TightGeneric::<5>::SIZE, 24);
    check_derived::<TightGeneric<5>>();
    check_derived::<TightGeneric<64>>();
}

#[test]
fn derived_plans_are_valid() {
    check_derived::<Tight>();
    check_derived::<FrameStaged>();
    check_derived::<devarena_tests::fixtures::Mixed>();
    check_derived::<devarena_tests::Many>();
}

/// A time budget of zero on a large layout whose buffers live long and overlap heavily
/// (about 170 live at once, 3.7 million conflicting pairs: the greedy orderings alone took
/// seconds in a release build) returns the first plan: valid, searched no further, and
/// saying that the budget ended the search. (How long it takes is `plan_budget`'s to
/// measure: BENCHMARKS.md.)
#[test]
fn a_zero_time_budget_on_a_large_layout_returns_a_valid_plan() {
    use devarena::SearchEnd;
    use std::time::Duration;
    let n = 40_000;
    let stages = n / 2;
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = |m: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % m as u64) as usize
    };
    let mut b = LayoutBuilder::new("Long").stages(stages);
    let mut live = vec![];
    for i in 0..n {
        let first = next(stages);
        let last = (first + next(400)).min(stages - 1);
        b = b
            .array::<u8>(format!("b{i}"), 256 << next(12))
            .live(first, last);
        live.push(LiveRange::new(first, last));
    }
    let layout = b.search(Budget::time(Duration::ZERO)).unwrap();
    let placed: Vec<Placed> = layout.fields().iter().map(Placed::from).collect();
    assert_eq!(plan::validate(&placed, layout.size()), Ok(()));
    // The fields are the ones asked for, with their live ranges, in declaration order.
    assert_eq!(layout.fields().len(), n);
    assert!(layout.fields().iter().zip(&live).all(|(f, l)| f.live == *l));
    let totals = layout.totals();
    assert!(totals.peak_live_bound <= layout.size() && layout.size() < totals.unaliased_size);
    let stats = layout.search_stats().unwrap();
    assert_eq!(stats.end, SearchEnd::Budget, "{stats:?}");
    assert_eq!((stats.nodes, stats.optimal), (0, false));
    assert_eq!(stats.greedy_size, layout.size());
}

/// Under a `max_bytes` limit that `build()` meets, a search whose time budget ran out before
/// the greedy orderings finished can miss it: the error says that the size it names is where
/// the budget stopped, not what the layout needs.
#[test]
fn a_budget_that_runs_out_over_max_bytes_says_so() {
    use std::time::Duration;
    let n = 3_000;
    let mut b = LayoutBuilder::new("Net").stages(n);
    for i in 0..n {
        let len = 1 + (i * 7919) % 50;
        b = b
            .array::<u8>(format!("f{i}"), 256 * (1 + (i * 31) % 9))
            .live(i, (i + len).min(n - 1));
    }
    let built = b.clone().build().unwrap().size();
    let cut = b
        .clone()
        .search(Budget::time(Duration::ZERO))
        .unwrap()
        .size();
    assert!(
        cut > built,
        "the zero budget's plan ({cut}) must be over build()'s ({built})"
    );
    let err = b
        .clone()
        .max_bytes(built)
        .search(Budget::time(Duration::ZERO))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!(
            "needs {cut} bytes, over its max_bytes limit of {built}"
        )) && err.contains("time budget ran out"),
        "{err}"
    );
    // A node budget lets the orderings finish: the same limit is met.
    let met = b.max_bytes(built).search(Budget::nodes(0)).unwrap();
    assert!(met.size() <= built);
}

/// `SearchStats::end` says why the search stopped: a plan proved optimal, a plan within the
/// size asked for, a layout without stages (nothing to search), a spent node budget.
#[test]
fn the_search_says_why_it_stopped() {
    use devarena::SearchEnd;
    let end = |l: &RuntimeLayout| l.search_stats().unwrap().end;
    let best = tight().search(Budget::nodes(100_000)).unwrap();
    assert_eq!((best.size(), end(&best)), (21, SearchEnd::Optimal));
    // The greedy plan (24 bytes) already meets a goal of 24: nothing searched.
    let fits = tight()
        .search(Budget::nodes(100_000).until_size(24))
        .unwrap();
    assert_eq!((fits.size(), end(&fits)), (24, SearchEnd::GoalMet));
    assert_eq!(fits.search_stats().unwrap().nodes, 0);
    let none = tight().search(Budget::nodes(0)).unwrap();
    assert_eq!((none.size(), end(&none)), (24, SearchEnd::Budget));
    // Without stages: 5 bytes, then 300 at 256, rounded up to 768; the bound is 512.
    let flat = LayoutBuilder::new("Flat")
        .align(1)
        .array::<u8>("a", 5)
        .array_aligned::<u8>("b", 300, 256)
        .search(Budget::nodes(100))
        .unwrap();
    assert_eq!((flat.size(), flat.totals().peak_live_bound), (768, 512));
    assert_eq!(end(&flat), SearchEnd::NotSearched);
}

/// With no time for the greedy orderings the search starts from the smaller of the best-fit
/// sweep's plan and the unaliased one, and `greedy_size` says which size that was: here the
/// sweep puts the larger field first and pads the 4-aligned one after it (8 bytes), while
/// declaration order needs no padding (4 bytes).
#[test]
fn a_zero_time_budget_starts_from_the_unaliased_plan_where_it_is_smaller() {
    let layout = LayoutBuilder::new("Padded")
        .align(1)
        .stages(1)
        .array_aligned::<u8>("small", 1, 4)
        .live(0, 0)
        .array_aligned::<u8>("large", 3, 1)
        .live(0, 0)
        .search(Budget::time(std::time::Duration::ZERO))
        .unwrap();
    let stats = layout.search_stats().unwrap();
    assert_eq!(layout.totals().unaliased_size, 4);
    assert_eq!((layout.size(), stats.greedy_size), (4, 4));
    let offsets: Vec<usize> = layout.fields().iter().map(|f| f.offset).collect();
    assert_eq!(offsets, [0, 1]);
}
