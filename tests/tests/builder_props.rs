//! Property tests of the run-time `LayoutBuilder` against a reference planner written here, plus
//! its errors, plus agreement with the derive.
//!
//! The reference below is deliberately naive and independent of `devarena::plan`: it works in
//! `u128`, so it needs no checked arithmetic, and rounds up with division instead of masks.

use devarena::plan::{FieldSpec, PlanErrorKind};
use devarena::{DeviceLayout, Error, LayoutBuilder, RuntimeLayout};
use devarena_kernels::pipeline::{Frame, HIST_BINS, MAX_PIXELS};
use devarena_tests::fixtures::Mixed;
use proptest::prelude::*;

/// One field as the reference sees it.
#[derive(Clone, Debug)]
struct RefField {
    elem_size: usize,
    elem_align: usize,
    len: usize,
    align: Option<usize>,
}

/// A whole layout as the reference sees it.
#[derive(Clone, Debug)]
struct RefLayout {
    align: Option<usize>,
    fields: Vec<RefField>,
}

/// What the reference planner computes: (offset, size, align) per field, SIZE, ALIGN.
#[derive(Debug, PartialEq, Eq)]
struct RefPlan {
    slots: Vec<(usize, usize, usize)>,
    size: usize,
    align: usize,
}

fn round_up(v: u128, a: u128) -> u128 {
    v.div_ceil(a) * a
}

/// The placement rule, straight from its description. `None` when the layout does not fit in
/// `usize` (the generators below only make valid alignments).
fn reference(layout: &RefLayout) -> Option<RefPlan> {
    let default = layout.align.unwrap_or(256);
    let mut end: u128 = 0;
    let mut max_align = if layout.fields.is_empty() { default } else { 1 };
    let mut slots = Vec::new();
    for f in &layout.fields {
        let align = match f.align {
            Some(a) => a,
            None => default.max(f.elem_align),
        };
        let size = f.elem_size as u128 * f.len as u128;
        let offset = round_up(end, align as u128);
        end = offset + size;
        if end > usize::MAX as u128 {
            return None;
        }
        max_align = max_align.max(align);
        slots.push((offset as usize, size as usize, align));
    }
    let size = round_up(end, max_align as u128);
    if size > usize::MAX as u128 {
        return None;
    }
    Some(RefPlan {
        slots,
        size: size as usize,
        align: max_align,
    })
}

fn build(layout: &RefLayout) -> Result<RuntimeLayout, Error> {
    let mut b = LayoutBuilder::new("Random");
    if let Some(a) = layout.align {
        b = b.align(a);
    }
    for (i, f) in layout.fields.iter().enumerate() {
        let mut spec = FieldSpec::array(f.elem_size, f.elem_align, f.len);
        if let Some(a) = f.align {
            spec = spec.with_align(a);
        }
        b = b.field(
            format!("f{i}"),
            format!("e{}x{}", f.elem_size, f.elem_align),
            spec,
        );
    }
    b.build()
}

/// An element: alignment 1..64, size a multiple of it (as for every Rust type).
fn element() -> impl Strategy<Value = (usize, usize)> {
    (0u32..=6, 1usize..=8).prop_map(|(a, k)| (k << a, 1usize << a))
}

fn field() -> impl Strategy<Value = RefField> {
    (element(), 1usize..=5000, prop::option::of(0u32..=12)).prop_map(
        |((elem_size, elem_align), len, extra)| RefField {
            elem_size,
            elem_align,
            len,
            // A field alignment at or above the element's: elem_align << extra.
            align: extra.map(|e| elem_align << e),
        },
    )
}

fn layout() -> impl Strategy<Value = RefLayout> {
    (
        prop::option::of((0u32..=12).prop_map(|e| 1usize << e)),
        prop::collection::vec(field(), 0..12),
    )
        .prop_map(|(align, fields)| RefLayout { align, fields })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn builder_plans_like_the_reference(l in layout()) {
        let expected = reference(&l).expect("the generators make layouts that fit");
        let got = build(&l).expect("a valid layout plans");

        // The same numbers as the reference, field for field.
        let slots: Vec<_> = got.fields().iter().map(|f| (f.offset, f.size, f.align)).collect();
        prop_assert_eq!(&slots, &expected.slots);
        prop_assert_eq!(got.size(), expected.size);
        prop_assert_eq!(got.align(), expected.align);

        // And the invariants, checked directly.
        prop_assert!(got.align().is_power_of_two());
        prop_assert_eq!(got.size() % got.align(), 0);
        for (f, spec) in got.fields().iter().zip(&l.fields) {
            prop_assert!(f.align.is_power_of_two());
            prop_assert!(f.align >= spec.elem_align, "{} below its element", f.name);
            prop_assert_eq!(f.offset % f.align, 0, "{} misaligned", &f.name);
            prop_assert!(f.offset + f.size <= got.size(), "{} outside SIZE", &f.name);
            prop_assert!(got.align() >= f.align);
        }
        for (i, a) in got.fields().iter().enumerate() {
            for b in &got.fields()[i + 1..] {
                prop_assert!(
                    a.offset + a.size <= b.offset,
                    "{} and {} overlap or are out of order", &a.name, &b.name
                );
            }
        }
        let requested: usize = got.fields().iter().map(|f| f.size).sum();
        prop_assert_eq!(got.totals().requested, requested);
        prop_assert_eq!(got.totals().unaliased_size, got.size());
    }

    #[test]
    fn max_bytes_is_a_limit(l in layout(), slack in 0usize..3) {
        let size = reference(&l).unwrap().size;
        let mut b = LayoutBuilder::new("Limited").max_bytes(size + slack);
        if let Some(a) = l.align {
            b = b.align(a);
        }
        for (i, f) in l.fields.iter().enumerate() {
            let mut spec = FieldSpec::array(f.elem_size, f.elem_align, f.len);
            if let Some(a) = f.align {
                spec = spec.with_align(a);
            }
            b = b.field(format!("f{i}"), "t", spec);
        }
        // At or above SIZE: accepted.
        prop_assert_eq!(b.clone().build().unwrap().size(), size);
        // One byte below SIZE: refused, with both numbers.
        if size > 0 {
            let err = b.max_bytes(size - 1).build().unwrap_err();
            let (kind, message) = plan_error(err);
            prop_assert_eq!(kind, PlanErrorKind::OverMaxBytes { size, max_bytes: size - 1 });
            prop_assert!(message.contains("`Limited`"), "{}", message);
            prop_assert!(message.contains(&format!("needs {size} bytes")), "{}", message);
            prop_assert!(message.contains(&format!("limit of {}", size - 1)), "{}", message);
        }
    }

    #[test]
    fn non_power_of_two_field_align_is_refused(
        bad in (3usize..1_000_000).prop_filter("not a power of two", |a| !a.is_power_of_two()),
        before in 0usize..4,
    ) {
        let mut b = LayoutBuilder::new("Frame");
        for i in 0..before {
            b = b.array::<u8>(format!("ok{i}"), 10);
        }
        let (kind, message) = plan_error(b.array_aligned::<f32>("gray", 16, bad).build().unwrap_err());
        prop_assert_eq!(kind, PlanErrorKind::AlignNotPowerOfTwo { align: bad });
        prop_assert!(message.starts_with("layout `Frame`, field `gray` (f32): "), "{}", message);
        prop_assert!(message.contains(&format!("alignment {bad} ")), "{}", message);
    }

    #[test]
    fn align_below_element_is_refused(shift in 1u32..=4) {
        // [u64; 4] asks for 8 >> shift (4, 2, 1, or 0 when shift is 4).
        let align = 8usize >> shift;
        let err = LayoutBuilder::new("Frame")
            .array::<u8>("rgb", 3)
            .array_aligned::<u64>("sums", 4, align)
            .build()
            .unwrap_err();
        let (kind, message) = plan_error(err);
        if align == 0 {
            prop_assert_eq!(kind, PlanErrorKind::AlignNotPowerOfTwo { align: 0 });
        } else {
            prop_assert_eq!(kind, PlanErrorKind::AlignBelowElement { align, elem_align: 8 });
            prop_assert!(message.contains("field `sums` (u64)"), "{}", message);
            prop_assert!(
                message.contains(&format!("alignment {align} is below the element's own alignment of 8")),
                "{}", message
            );
        }
    }
}

/// The planner's verdict and message out of a builder error.
fn plan_error(err: Error) -> (PlanErrorKind, String) {
    match err {
        Error::Plan { error, message } => {
            // Display is the message.
            assert_eq!(
                Error::Plan {
                    error,
                    message: message.clone()
                }
                .to_string(),
                message
            );
            (error.kind, message)
        }
        other => panic!("expected Error::Plan, got {other:?}"),
    }
}

#[test]
fn struct_align_not_a_power_of_two_is_refused() {
    let err = LayoutBuilder::new("Frame")
        .align(48)
        .array::<u8>("rgb", 3)
        .build()
        .unwrap_err();
    let Error::Plan { error, message } = err else {
        panic!("expected Error::Plan")
    };
    assert_eq!(error.field, None);
    assert_eq!(error.kind, PlanErrorKind::AlignNotPowerOfTwo { align: 48 });
    assert_eq!(
        message,
        "layout `Frame`: alignment 48 is not a power of two between 1 and 2^30"
    );
}

#[test]
fn alignment_zero_is_refused_not_ignored() {
    // Zero is not "no request": it is an alignment, and not a power of two.
    let (kind, message) = plan_error(
        LayoutBuilder::new("Frame")
            .align(0)
            .array::<u8>("rgb", 3)
            .build()
            .unwrap_err(),
    );
    assert_eq!(kind, PlanErrorKind::AlignNotPowerOfTwo { align: 0 });
    assert!(
        message.starts_with("layout `Frame`: alignment 0 "),
        "{message}"
    );
    let (kind, message) = plan_error(
        LayoutBuilder::new("Frame")
            .array_aligned::<u8>("rgb", 3, 0)
            .build()
            .unwrap_err(),
    );
    assert_eq!(kind, PlanErrorKind::AlignNotPowerOfTwo { align: 0 });
    assert!(
        message.contains("field `rgb` (u8): alignment 0 "),
        "{message}"
    );
}

#[test]
fn alignment_over_the_limit_is_refused() {
    let (kind, _) = plan_error(
        LayoutBuilder::new("Frame")
            .array_aligned::<u8>("rgb", 3, 1 << 31)
            .build()
            .unwrap_err(),
    );
    assert_eq!(kind, PlanErrorKind::AlignNotPowerOfTwo { align: 1 << 31 });
    // 2^30 itself is allowed.
    let l = LayoutBuilder::new("Frame")
        .array_aligned::<u8>("rgb", 3, 1 << 30)
        .build()
        .unwrap();
    assert_eq!(l.align(), 1 << 30);
}

#[test]
fn zero_length_is_refused() {
    let (kind, message) = plan_error(
        LayoutBuilder::new("Frame")
            .array::<u8>("rgb", 30)
            .array::<f32>("gray", 0)
            .build()
            .unwrap_err(),
    );
    assert_eq!(kind, PlanErrorKind::ZeroLength);
    assert_eq!(
        message,
        "layout `Frame`, field `gray` (f32): a buffer of 0 elements gets no memory; give it at \
         least one element"
    );
}

#[test]
fn size_overflow_is_refused() {
    let len = usize::MAX / 4; // times 8 bytes overflows
    let (kind, message) = plan_error(
        LayoutBuilder::new("Huge")
            .array::<u64>("big", len)
            .build()
            .unwrap_err(),
    );
    assert_eq!(kind, PlanErrorKind::SizeOverflow { elem_size: 8, len });
    assert_eq!(
        message,
        "layout `Huge`, field `big` (u64): size overflows usize: 4611686018427387903 elements of \
         8 bytes exceed 18446744073709551615 bytes"
    );
}

#[test]
fn offset_overflow_is_refused() {
    let half = usize::MAX / 2 + 1; // 2^63: each fits, two do not
    let (kind, message) = plan_error(
        LayoutBuilder::new("Huge")
            .array::<u8>("first", half)
            .array::<u8>("second", half)
            .build()
            .unwrap_err(),
    );
    assert_eq!(
        kind,
        PlanErrorKind::OffsetOverflow {
            offset: half,
            size: half,
            align: 256
        }
    );
    assert!(message.starts_with("layout `Huge`, field `second` (u8): offset overflows usize: "));
    assert!(
        message.contains("9223372036854775808 bytes at alignment 256"),
        "{message}"
    );
    // Rounding the end up to an alignment can overflow too: the fields end at usize::MAX.
    let (kind, message) = plan_error(
        LayoutBuilder::new("Huge")
            .align(1)
            .array::<u8>("first", half)
            .array::<u8>("second", half - 1)
            .array_aligned::<u8>("paged", 1, 4096)
            .build()
            .unwrap_err(),
    );
    assert_eq!(
        kind,
        PlanErrorKind::OffsetOverflow {
            offset: usize::MAX,
            size: 1,
            align: 4096
        }
    );
    assert!(message.contains("field `paged`"), "{message}");
}

#[test]
fn size_round_up_overflow_is_refused() {
    let half = usize::MAX / 2 + 1;
    let err = LayoutBuilder::new("Huge")
        .align(1)
        .array::<u8>("first", half)
        .array_aligned::<u8>("second", half - 256, 256)
        .array::<u8>("tail", 255)
        .build()
        .unwrap_err();
    let Error::Plan { error, message } = err else {
        panic!("expected Error::Plan")
    };
    assert_eq!(error.field, None);
    assert_eq!(
        message,
        "layout `Huge`: size overflows usize: the fields end at byte 18446744073709551615, which \
         cannot be rounded up to the layout's alignment of 256 bytes"
    );
}

// ---- the derive and the builder agree -------------------------------------------------------

fn assert_same<L: DeviceLayout>(built: &RuntimeLayout) {
    assert_eq!(built.name(), L::NAME);
    assert_eq!(built.size(), L::SIZE);
    assert_eq!(built.align(), L::ALIGN);
    assert_eq!(built.fields().len(), L::FIELDS.len());
    for (b, d) in built.fields().iter().zip(L::FIELDS) {
        assert_eq!(
            (b.name.as_str(), b.offset, b.size, b.align),
            (d.name, d.offset, d.size, d.align)
        );
    }
    assert_eq!(built.report(), devarena::LayoutReport::of::<L>());
}

#[test]
fn derive_and_builder_agree_on_the_pipeline_frame() {
    let built = LayoutBuilder::new("Frame")
        .array::<u8>("rgb", MAX_PIXELS * 3)
        .array::<f32>("gray", MAX_PIXELS)
        .array::<f32>("scratch", MAX_PIXELS)
        .array::<f32>("blurred", MAX_PIXELS)
        .array::<f32>("magnitude", MAX_PIXELS)
        .array::<u32>("hist", HIST_BINS)
        .array::<u32>("threshold", 1)
        .array::<u8>("mask", MAX_PIXELS)
        .build()
        .unwrap();
    assert_same::<Frame>(&built);
}

#[test]
fn derive_and_builder_agree_on_mixed_alignments() {
    let built = LayoutBuilder::new("Mixed")
        .align(1)
        .array_aligned::<u8>("a", 3, 1)
        .array_aligned::<u16>("b", 3, 2)
        .array_aligned::<u8>("c", 5, 8)
        .array_aligned::<f32>("d", 3, 16)
        .array_aligned::<u8>("e", 1, 512)
        .array_aligned::<u8>("f", 10, 4096)
        .array::<u8>("g", 7)
        .array::<u64>("h", 2)
        .build()
        .unwrap();
    assert_same::<Mixed>(&built);
}

#[test]
fn builder_nests_a_derived_layout() {
    use devarena_tests::fixtures::{Inner, Middle};
    let built = LayoutBuilder::new("Middle")
        .array::<u8>("head", 100)
        .nested::<Inner>("inner")
        .array::<u16>("tail", 50)
        .build()
        .unwrap();
    assert_same::<Middle>(&built);
}

// ---- bad input: an `Err` naming the field and the numbers, never a panic or a hang ---------

#[test]
fn a_stage_count_over_the_limit_is_refused_at_once() {
    use devarena::plan::MAX_STAGES;
    let (kind, message) = plan_error(
        LayoutBuilder::new("Graph")
            .stages(1 << 34)
            .array::<u8>("a", 10)
            .live(0, 3)
            .build()
            .unwrap_err(),
    );
    assert_eq!(
        kind,
        PlanErrorKind::TooManyStages {
            stages: 1 << 34,
            max: MAX_STAGES
        }
    );
    assert_eq!(
        message,
        format!("layout `Graph`: 17179869184 stages are over the limit of {MAX_STAGES} stages")
    );
    // The limit itself plans, and a plan's cost does not grow with the stage count.
    let layout = LayoutBuilder::new("Graph")
        .align(1)
        .stages(MAX_STAGES)
        .array::<u8>("a", 10)
        .live(0, 3)
        .array::<u8>("b", 20)
        .live(4, MAX_STAGES - 1)
        .array::<u8>("c", 30)
        .live(2, 9)
        .build()
        .unwrap();
    assert_eq!(layout.size(), 50);
    assert_eq!(layout.totals().peak_live_bound, 50);
}

#[test]
fn a_duplicate_field_name_is_refused() {
    let (kind, message) = plan_error(
        LayoutBuilder::new("Frame")
            .array::<u8>("rgb", 3)
            .array::<f32>("gray", 4)
            .array::<u16>("rgb", 5)
            .build()
            .unwrap_err(),
    );
    assert_eq!(kind, PlanErrorKind::DuplicateName { first: 0 });
    assert_eq!(
        message,
        "layout `Frame`, field `rgb` (u16): field 2 has the name of field 0; give every field a \
         name of its own"
    );
}

#[test]
fn live_before_any_field_is_refused() {
    let err = LayoutBuilder::new("Frame")
        .stages(4)
        .live(1, 2)
        .array::<u8>("rgb", 3)
        .build()
        .unwrap_err();
    let Error::Plan { error, message } = err else {
        panic!("expected Error::Plan")
    };
    assert_eq!(error.field, None);
    assert_eq!(
        error.kind,
        PlanErrorKind::LiveWithoutField { first: 1, last: 2 }
    );
    assert_eq!(
        message,
        "layout `Frame`: live(1, 2) comes before any field; call it after the field it belongs to"
    );
}

#[test]
fn an_element_alignment_over_the_largest_alignment_is_refused() {
    use devarena::plan::MAX_ALIGN;
    let (kind, message) = plan_error(
        LayoutBuilder::new("Frame")
            .array::<u8>("rgb", 3)
            .field("huge", "Huge", FieldSpec::array(1 << 31, 1 << 31, 1))
            .build()
            .unwrap_err(),
    );
    assert_eq!(
        kind,
        PlanErrorKind::ElementAlignTooLarge {
            elem_align: 1 << 31
        }
    );
    assert_eq!(
        message,
        format!(
            "layout `Frame`, field `huge` (Huge): the element's alignment of 2147483648 bytes is \
             over the largest alignment, {MAX_ALIGN} bytes (2^30)"
        )
    );
    // A nested block asking for too much is refused the same way.
    let (kind, _) = plan_error(
        LayoutBuilder::new("Frame")
            .field("inner", "Inner", FieldSpec::nested(4096, 1 << 40))
            .build()
            .unwrap_err(),
    );
    assert_eq!(
        kind,
        PlanErrorKind::ElementAlignTooLarge {
            elem_align: 1 << 40
        }
    );
}

#[test]
fn a_dyn_arena_of_extreme_layouts_is_an_error_not_a_panic() {
    use devarena::DynArena;
    // Each plans, but no host can allocate it: the arena says so.
    let huge = [
        LayoutBuilder::new("Huge").array::<u8>("a", usize::MAX / 2),
        LayoutBuilder::new("Huge")
            .align(1 << 30)
            .array::<u8>("a", (isize::MAX as usize) - (1 << 30)),
        LayoutBuilder::new("Huge")
            .align(1)
            .stages(3)
            .array::<u8>("a", usize::MAX / 4)
            .live(0, 0)
            .array::<u8>("b", usize::MAX / 4)
            .live(1, 2),
    ];
    for b in huge {
        let layout = b.build().expect("plans");
        let err = DynArena::new(layout.clone()).unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidArgument { .. } | Error::OutOfMemory { .. }
            ),
            "{err:?}"
        );
    }
}
