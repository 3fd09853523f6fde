//! Fuzz target `layout`: `LayoutBuilder` with any fields, alignments, size limits, stages and
//! live ranges; then, for layouts that fit in a few MiB, a `DynArena` and its views.
//!
//! A layout that builds must keep every promise of the planner: `SIZE` a multiple of `ALIGN`
//! and within `max_bytes`, every field aligned to its alignment (at least its element's, exactly
//! its own when it asked for one) and inside `SIZE`, fields that are live in a common stage
//! disjoint, `SIZE` at least the lower bound the plan reports. A layout that does not build is
//! an `Error::Plan` whose message names the layout. Nothing panics.
//!
//! The arena's views must have the field's length and address, be refused for an element type
//! that does not divide the field or is misaligned, be refused for two fields that share bytes,
//! and hold what was written through them: every field live in a stage is filled with its own
//! byte and read back intact.

use devarena::plan::FieldSpec;
use devarena::{DynArena, Error, LayoutBuilder, LiveRange, RuntimeLayout};

use super::input::Input;

/// Fields per layout at most.
const MAX_FIELDS: usize = 12;
/// Stages at most in the common case (the planner's cost grows with them); one layout with
/// stages in 64 asks for one of [`HUGE_STAGES`] instead.
const MAX_STAGES: usize = 64;
/// Stage counts far past the common case, up to and past the planner's limit (which once was
/// missing: see `tests/extremes.rs`), where `build` must plan or refuse with `Error::Plan`.
const HUGE_STAGES: [usize; 6] = [
    65,
    1 << 12,
    1 << 20,
    devarena::plan::MAX_STAGES,
    devarena::plan::MAX_STAGES + 1,
    usize::MAX,
];
/// Arenas are made only for layouts up to this size (the host memory is really allocated).
const MAX_ARENA: usize = 4 << 20;

/// One field as the builder got it.
#[derive(Debug, Clone)]
struct Asked {
    name: String,
    elem_size: usize,
    elem_align: usize,
    len: usize,
    align: Option<usize>,
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let name = input.string(8);
    let mut builder = LayoutBuilder::new(name.clone());
    let struct_align = (input.u8() % 4 == 0).then(|| input.align());
    if let Some(align) = struct_align {
        builder = builder.align(align);
    }
    let max_bytes = if input.bool() {
        input.size(1 << 24)
    } else {
        usize::MAX
    };
    builder = builder.max_bytes(max_bytes);
    let stages = match input.u8() {
        128 => input.pick(&HUGE_STAGES),
        s if s % 4 == 0 => 1 + input.below(MAX_STAGES),
        _ => 0,
    };
    if stages > 0 {
        builder = builder.stages(stages);
    }
    let mut asked = Vec::new();
    let n = input.below(MAX_FIELDS + 1);
    for i in 0..n {
        let field_name = if input.u8() % 8 == 0 {
            input.string(3)
        } else {
            format!("f{i}")
        };
        let len = input.size(1 << 16);
        let own_align = (input.u8() % 4 == 0).then(|| input.align());
        let (spec, ty) = match input.u8() % 8 {
            0 => (FieldSpec::of::<u8>(len), "u8"),
            1 => (FieldSpec::of::<u16>(len), "u16"),
            2 => (FieldSpec::of::<f32>(len), "f32"),
            3 => (FieldSpec::of::<u64>(len), "u64"),
            4 => (FieldSpec::of::<u128>(len), "u128"),
            5 => (FieldSpec::of::<[u8; 3]>(len), "[u8; 3]"),
            6 => {
                let size = input.size(1 << 12);
                let align = 1 << input.below(13);
                (FieldSpec::nested(size, align), "Nested")
            }
            _ => {
                let elem_size = input.size(64);
                let elem_align = input.align();
                (FieldSpec::array(elem_size, elem_align, len), "Raw")
            }
        };
        let spec = match own_align {
            Some(a) => spec.with_align(a),
            None => spec,
        };
        asked.push(Asked {
            name: field_name.clone(),
            elem_size: spec.elem_size,
            elem_align: spec.elem_align,
            len: spec.len,
            align: spec.align,
        });
        builder = builder.field(field_name, ty, spec);
        if stages > 0 && input.bool() {
            // Within the stages and just past them (`below` reaches 65,535 at most).
            let first = input.below(stages.saturating_add(1));
            let last = first.saturating_add(input.below(stages.saturating_add(1)));
            builder = builder.live(first, last.saturating_sub(input.below(2)));
        }
    }
    match builder.build() {
        Ok(layout) => check_layout(&layout, &asked, max_bytes, stages, &mut input),
        Err(Error::Plan { error, message }) => {
            assert!(
                message.contains(&name),
                "{message:?} does not name `{name}`"
            );
            if let Some(field) = error.field {
                assert!(field < asked.len(), "{error:?}");
            }
        }
        Err(other) => panic!("a layout that does not build must be Error::Plan: {other:?}"),
    }
}

fn check_layout(
    layout: &RuntimeLayout,
    asked: &[Asked],
    max_bytes: usize,
    stages: usize,
    input: &mut Input<'_>,
) {
    let totals = layout.totals();
    assert!(layout.align().is_power_of_two(), "{totals:?}");
    assert_eq!(layout.size() % layout.align(), 0, "{totals:?}");
    assert!(layout.size() <= max_bytes, "{totals:?} over {max_bytes}");
    assert!(layout.size() >= totals.peak_live_bound, "{totals:?}");
    assert_eq!(layout.stages(), stages);
    let fields = layout.fields();
    assert_eq!(fields.len(), asked.len());
    let mut requested = 0usize;
    for (f, a) in fields.iter().zip(asked) {
        assert_eq!(f.name, a.name);
        assert_eq!(Some(f.size), a.elem_size.checked_mul(a.len), "{f:?}");
        requested += f.size;
        assert!(f.align.is_power_of_two(), "{f:?}");
        assert!(f.align <= layout.align(), "{f:?}");
        assert!(
            f.align >= a.elem_align,
            "{f:?} below its element's alignment"
        );
        if let Some(own) = a.align {
            assert_eq!(f.align, own, "{f:?} asked for {own}");
        }
        assert_eq!(f.offset % f.align, 0, "{f:?}");
        assert!(
            f.offset
                .checked_add(f.size)
                .is_some_and(|end| end <= layout.size()),
            "{f:?} outside SIZE {}",
            layout.size()
        );
        if stages == 0 {
            assert_eq!(f.live, LiveRange::ALL);
        } else {
            assert!(
                f.live.first <= f.live.last && f.live.first < stages,
                "{f:?}"
            );
        }
    }
    assert_eq!(totals.requested, requested);
    for (i, a) in fields.iter().enumerate() {
        for b in &fields[i + 1..] {
            let share = a.size != 0
                && b.size != 0
                && a.offset < b.offset + b.size
                && b.offset < a.offset + a.size;
            assert!(
                !(share && a.live.meets(&b.live)),
                "{a:?} and {b:?} are live together and share bytes"
            );
        }
    }
    if layout.size() <= MAX_ARENA {
        check_arena(layout.clone(), stages, input);
    }
}

fn check_arena(layout: RuntimeLayout, stages: usize, input: &mut Input<'_>) {
    let mut arena = DynArena::new(layout.clone()).expect("a few MiB of host memory");
    let base = arena.addr();
    assert_eq!(base % layout.align() as u64, 0);
    let fields = layout.fields();
    // Fields reachable by name: the first of each name.
    let reachable: Vec<usize> = (0..fields.len())
        .filter(|&i| fields[..i].iter().all(|f| f.name != fields[i].name))
        .collect();
    // Views of every type at the right address, or refused for the right reason.
    for &i in &reachable {
        let f = &fields[i];
        let view = arena
            .view::<u8>(&f.name)
            .expect("every field is whole bytes");
        assert_eq!(view.len(), f.size);
        assert_eq!(view.as_ptr() as u64, base + f.offset as u64);
        let fits = f.size % 4 == 0 && (base + f.offset as u64) % 4 == 0;
        match arena.view::<u32>(&f.name) {
            Ok(words) => {
                assert!(fits, "{f:?} viewed as u32");
                assert_eq!(words.len(), f.size / 4);
            }
            Err(Error::InvalidArgument { what }) => {
                assert!(!fits, "{f:?}: {what}");
                assert!(what.contains(&f.name), "{what:?}");
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    assert!(arena.view::<u8>("no such field \u{1}").is_err());
    // Two fields at once: refused exactly when they share bytes or a name.
    if reachable.len() >= 2 {
        let a = &fields[reachable[input.below(reachable.len())]];
        let b = &fields[reachable[input.below(reachable.len())]];
        let share = a.name == b.name
            || (a.size != 0
                && b.size != 0
                && a.offset < b.offset + b.size
                && b.offset < a.offset + a.size);
        let (an, bn) = (a.name.clone(), b.name.clone());
        match arena.views_mut::<u8, 2>([&an, &bn]) {
            Ok([x, y]) => {
                assert!(!share, "{an} and {bn} share bytes");
                x.fill(1);
                y.fill(2);
                assert!(x.iter().all(|&v| v == 1));
            }
            Err(Error::InvalidArgument { .. }) => assert!(share, "{an} and {bn} refused"),
            Err(other) => panic!("{other:?}"),
        }
    }
    // Fill every field live in one stage with its own byte, then read them all back.
    let stage = if stages == 0 { 0 } else { input.below(stages) };
    let live: Vec<usize> = reachable
        .iter()
        .copied()
        .filter(|&i| fields[i].live.contains(stage))
        .collect();
    for &i in &live {
        let view = arena.view_mut::<u8>(&fields[i].name).expect("a field");
        view.fill(i as u8 ^ 0x5a);
    }
    for &i in &live {
        let view = arena.view::<u8>(&fields[i].name).expect("a field");
        assert!(
            view.iter().all(|&v| v == i as u8 ^ 0x5a),
            "field `{}` overwritten by another field live in stage {stage}",
            fields[i].name
        );
    }
}
