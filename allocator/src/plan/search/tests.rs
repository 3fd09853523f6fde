extern crate std;
use super::*;
use std::vec;
use std::vec::Vec;

/// The smallest end over every order of placing each buffer at the lowest aligned offset
/// above the conflicting buffers placed before it: the optimum (every plan pushes down
/// into such a one).
fn brute_force(b: &[(usize, usize, usize, usize)]) -> usize {
    fn go(
        b: &[(usize, usize, usize, usize)],
        placed: &mut Vec<(usize, usize)>,
        used: &mut Vec<bool>,
        best: &mut usize,
    ) {
        if placed.len() == b.len() {
            let end = placed.iter().map(|&(i, o)| o + b[i].0).max().unwrap_or(0);
            *best = (*best).min(end);
            return;
        }
        for i in 0..b.len() {
            if used[i] {
                continue;
            }
            let (size, align, first, last) = b[i];
            let mut at = 0;
            for &(j, o) in placed.iter() {
                let (s2, _, f2, l2) = b[j];
                if first <= l2 && f2 <= last && s2 > 0 && size > 0 {
                    at = at.max(o + s2);
                }
            }
            let at = at.next_multiple_of(align);
            used[i] = true;
            placed.push((i, at));
            go(b, placed, used, best);
            placed.pop();
            used[i] = false;
        }
    }
    let mut best = usize::MAX;
    go(b, &mut Vec::new(), &mut vec![false; b.len()], &mut best);
    best
}

/// The fields of `(size, align, first stage, last stage)` tuples, and their slots, unplaced.
fn fields(b: &[(usize, usize, usize, usize)]) -> (Vec<FieldSpec>, Vec<Slot>) {
    let specs = b
        .iter()
        .map(|&(s, a, f, l)| FieldSpec::of::<u8>(s.max(1)).with_align(a).with_live(f, l))
        .collect();
    let slots = b
        .iter()
        .map(|&(size, align, _, _)| Slot {
            offset: 0,
            size,
            align,
        })
        .collect();
    (specs, slots)
}

fn check(b: &[(usize, usize, usize, usize)], stages: usize) {
    let layout = LayoutSpec::DEFAULT.with_align(1).with_stages(stages);
    let (specs, slots) = fields(b);
    let n = b.len();
    let mut head = vec![0; crate::plan::scratch_len(n)];
    let sizes = measure(&layout, &specs, &slots, &mut head);
    let mut scratch = vec![0; sizes.scratch_len()];
    let mut engine = Engine::new(&layout, &specs, &slots, &sizes, &mut scratch);
    let opt = brute_force(b);
    for (k, p) in Preorder::ALL.into_iter().enumerate() {
        engine.set_preorder(p, &specs, stages);
        // With and without the lowest waiting offsets: both prune soundly.
        engine.set_waiting_floors(k % 2 == 0);
        match engine.run(opt, u64::MAX) {
            Outcome::Found { end } => {
                assert!(end <= opt, "{b:?}: found {end} above {opt}");
                let off = engine.offsets();
                for i in 0..n {
                    assert_eq!(off[i] % b[i].1, 0, "{b:?}: misaligned");
                    assert!(off[i] + b[i].0 <= end);
                    for j in 0..i {
                        let meet = b[i].2 <= b[j].3 && b[j].2 <= b[i].3;
                        let overlap = off[i] < off[j] + b[j].0 && off[j] < off[i] + b[i].0;
                        assert!(!(meet && overlap), "{b:?}: {i} and {j} overlap");
                    }
                }
            }
            other => panic!("{b:?} {p:?}: {other:?} at the optimum {opt}"),
        }
        if opt > 0 {
            assert_eq!(
                engine.run(opt - 1, u64::MAX),
                Outcome::Infeasible,
                "{b:?} {p:?} below the optimum {opt}"
            );
        }
    }
}

#[test]
fn finds_the_optimum_and_proves_nothing_is_lower() {
    let mut next = crate::plan::test_rng(0x2545_F491_4F6C_DD1Du64);
    for _ in 0..400 {
        let stages = 1 + next(6);
        let n = 1 + next(6);
        let b: Vec<_> = (0..n)
            .map(|_| {
                let (x, y) = (next(stages), next(stages));
                (next(9), 1 << next(3), x.min(y), x.max(y))
            })
            .collect();
        check(&b, stages);
    }
}

/// A run cut off by its work limit again and again, the engine suspended and reattached to
/// its scratch space each time (as the derive's constants do), ends as one uncut run does:
/// the same answer, offsets, nodes and work.
#[test]
fn a_run_cut_into_pieces_ends_as_an_uncut_one() {
    let mut next = crate::plan::test_rng(0x9E37_79B9_7F4A_7C15u64);
    let (mut cut_runs, mut kinds) = (0, [0; 3]);
    for case in 0..200 {
        let stages = 2 + next(12);
        let n = 2 + next(24);
        let layout = LayoutSpec::DEFAULT.with_align(1).with_stages(stages);
        // Sizes off their alignments: the most bytes live at once is often out of reach.
        let sized: Vec<(usize, usize, usize, usize)> = (0..n)
            .map(|_| {
                let (x, y) = (next(stages), next(stages));
                (1 + next(100), 1 << (3 * next(3)), x.min(y), x.max(y))
            })
            .collect();
        // (Sizes here are at least 1: `fields` changes none.)
        let (specs, slots) = fields(&sized);
        let mut head = vec![0; crate::plan::scratch_len(n)];
        let sizes = measure(&layout, &specs, &slots, &mut head);
        let preorder = Preorder::ALL[case % 6];
        let floors = case % 4 < 2;
        // A tight capacity, at or a little above the most bytes live at once, so that runs
        // search and backtrack.
        let peak = (0..stages)
            .map(|t| {
                let live = sized.iter().filter(|&&(_, _, f, l)| f <= t && t <= l);
                live.map(|&(size, _, _, _)| size).sum::<usize>()
            })
            .max()
            .unwrap_or(0);
        let cap = if case % 3 == 0 {
            peak
        } else {
            peak + next(peak / 8 + 1)
        };
        let whole = {
            let mut scratch = vec![0; sizes.scratch_len()];
            let mut e = Engine::new(&layout, &specs, &slots, &sizes, &mut scratch);
            e.set_preorder(preorder, &specs, stages);
            e.set_waiting_floors(floors);
            let o = e.run(cap, 20_000);
            (o, e.offsets().to_vec(), e.nodes(), e.work())
        };
        let mut scratch = vec![0; sizes.scratch_len()];
        let (mut outcome, mut saved) = {
            let mut e = Engine::new(&layout, &specs, &slots, &sizes, &mut scratch);
            e.set_preorder(preorder, &specs, stages);
            e.set_waiting_floors(floors);
            let piece = 1 + next(200) as u64;
            e.set_work_stop(e.work() + piece);
            (e.run(cap, 20_000), e.suspend())
        };
        let mut pieces = 1;
        while outcome == Outcome::OutOfNodes && saved.work() < whole.3 {
            let mut e = Engine::reattach(&layout, &specs, &slots, &mut scratch, &saved);
            let piece = 1 + next(200) as u64;
            e.set_work_stop(e.work() + piece);
            outcome = e.resume();
            saved = e.suspend();
            pieces += 1;
        }
        let e = Engine::reattach(&layout, &specs, &slots, &mut scratch, &saved);
        let cut = (outcome, e.offsets().to_vec(), e.nodes(), e.work());
        if pieces > 1 {
            cut_runs += 1;
        }
        kinds[match whole.0 {
            Outcome::Found { .. } => 0,
            Outcome::Infeasible => 1,
            Outcome::OutOfNodes => 2,
        }] += 1;
        if let Outcome::Found { .. } = whole.0 {
            assert_eq!(cut.1, whole.1, "case {case}: offsets after {pieces} pieces");
        }
        assert_eq!(
            (cut.0, cut.2, cut.3),
            (whole.0, whole.2, whole.3),
            "case {case}: answer, nodes and work after {pieces} pieces"
        );
    }
    // The cases cut runs that find plans and runs that prove there is none.
    assert!(
        cut_runs >= 100 && kinds[0] >= 20 && kinds[1] >= 20,
        "{cut_runs} {kinds:?}"
    );
}

/// A layout without fields: without stages it still has its one section, which the scratch
/// sized by `scratch_len(0)` must hold (it held two entries of the ten the index takes).
#[test]
fn measure_and_search_an_empty_layout() {
    for stages in [0, 3] {
        let layout = LayoutSpec::DEFAULT.with_align(1).with_stages(stages);
        let mut head = vec![0; crate::plan::scratch_len(0)];
        let sizes = measure(&layout, &[], &[], &mut head);
        assert_eq!((sizes.buffers, sizes.conflicts, sizes.spanned), (0, 0, 0));
        let mut scratch = vec![0; sizes.scratch_len()];
        let mut engine = Engine::new(&layout, &[], &[], &sizes, &mut scratch);
        assert!(matches!(engine.run(0, u64::MAX), Outcome::Found { end: 0 }));
    }
}

/// `measure`'s sweep counts exactly the pairs of buffers whose live ranges meet (zero-size
/// buffers meet none) and the sections each spans, against a count of every pair, on
/// pseudo-random layouts with and without stages.
#[test]
fn measure_counts_every_conflicting_pair() {
    let mut next = crate::plan::test_rng(0x0123_4567_89AB_CDEFu64);
    for round in 0..300 {
        let n = next(80);
        let stages = if round % 10 == 0 { 0 } else { 1 + next(30) };
        let specs: Vec<FieldSpec> = (0..n)
            .map(|_| {
                let size = if next(8) == 0 { 0 } else { 1 + next(100) };
                let spec = if size == 0 {
                    FieldSpec::nested(0, 1)
                } else {
                    FieldSpec::of::<u8>(size)
                };
                if stages == 0 {
                    spec
                } else {
                    let (a, b) = (next(stages), next(stages));
                    spec.with_live(a.min(b), a.max(b))
                }
            })
            .collect();
        let slots: Vec<Slot> = specs
            .iter()
            .map(|s| Slot {
                offset: 0,
                size: s.elem_size * s.len,
                align: 1,
            })
            .collect();
        let layout = LayoutSpec::DEFAULT.with_stages(stages);
        let mut head = vec![0; crate::plan::scratch_len(n)];
        let sizes = measure(&layout, &specs, &slots, &mut head);
        let mut want = 0;
        for i in 0..n {
            for j in 0..i {
                let both = slots[i].size > 0 && slots[j].size > 0;
                want += (both && specs[i].live.meets(&specs[j].live)) as usize;
            }
        }
        assert_eq!(sizes.conflicts, want, "round {round}");
        assert_eq!(sizes.buffers, n);
        let (lo, hi) = head.split_at(n);
        let spanned: usize = (0..n).map(|b| hi[b] - lo[b]).sum();
        assert_eq!(sizes.spanned, spanned, "round {round}");
    }
}
