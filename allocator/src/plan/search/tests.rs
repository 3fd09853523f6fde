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

fn check(b: &[(usize, usize, usize, usize)], stages: usize) {
    let layout = LayoutSpec::DEFAULT.with_align(1).with_stages(stages);
    let specs: Vec<FieldSpec> = b
        .iter()
        .map(|&(s, a, f, l)| FieldSpec::of::<u8>(s.max(1)).with_align(a).with_live(f, l))
        .collect();
    let slots: Vec<Slot> = b
        .iter()
        .map(|&(size, align, _, _)| Slot {
            offset: 0,
            size,
            align,
        })
        .collect();
    let n = b.len();
    let mut head = vec![0; crate::plan::scratch_len(n)];
    let sizes = measure(&layout, &specs, &slots, &mut head);
    let mut scratch = vec![0; sizes.scratch_len()];
    let mut engine = Engine::new(&layout, &specs, &slots, &sizes, &mut scratch);
    let opt = brute_force(b);
    for p in Preorder::ALL {
        engine.set_preorder(p, &specs, stages);
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
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut next = |m: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % m as u64) as usize
    };
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
