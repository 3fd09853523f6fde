//! Offsets, sizes and alignments of derived layouts, checked against numbers computed by hand.
//!
//! Every expected value is a literal with its arithmetic beside it; none is computed by calling
//! the planner. The rule: a field's alignment is its own `align`, else the struct's, else 256
//! (a struct default below the element's alignment is raised to it); offset = previous end
//! rounded up to that alignment; `ALIGN` = the largest field alignment; `SIZE` = last end
//! rounded up to `ALIGN`.

use devarena::{DeviceLayout, FieldPlacement};
use devarena_kernels::pipeline::Frame;
use devarena_tests::fixtures::{Empty, FrameTiny, FrameVga, Inner, Middle, Mixed, Outer, Padded};
use static_assertions::{const_assert, const_assert_eq};

fn placement(name: &'static str, offset: usize, size: usize, align: usize) -> FieldPlacement {
    FieldPlacement {
        name,
        offset,
        size,
        align,
    }
}

// ---- the pipeline's Frame, planned for 3840×2160 ------------------------------------------------

// MAX_PIXELS = 3840*2160 = 8_294_400. rgb 8_294_400*3 = 24_883_200 B; gray, scratch, blurred and
// magnitude 8_294_400*4 = 33_177_600 B; hist 1024 B; threshold 4 B; mask 8_294_400 B. Every size
// but threshold's is a multiple of 256: the only padding is the 252 bytes after threshold.
const_assert_eq!(Frame::SIZE, 165_889_280); // 24_883_200 + 4 * 33_177_600 + 1024 + 256 + 8_294_400
const_assert_eq!(Frame::ALIGN, 256);
const_assert!(Frame::SIZE % Frame::ALIGN == 0);

#[test]
fn pipeline_frame_offsets() {
    assert_eq!(
        Frame::FIELDS,
        &[
            placement("rgb", 0, 24_883_200, 256),              // 3840*2160*3
            placement("gray", 24_883_200, 33_177_600, 256),    // 24_883_200 = 97_200 * 256
            placement("scratch", 58_060_800, 33_177_600, 256), // 24_883_200 + 33_177_600
            placement("blurred", 91_238_400, 33_177_600, 256), // 58_060_800 + 33_177_600
            placement("magnitude", 124_416_000, 33_177_600, 256), // 91_238_400 + 33_177_600
            placement("hist", 157_593_600, 1024, 256),         // 124_416_000 + 33_177_600
            placement("threshold", 157_594_624, 4, 256),       // 157_593_600 + 1024
            placement("mask", 157_594_880, 8_294_400, 256),    // 157_594_628 rounded up to 256
        ]
    );
    let o = Frame::OFFSETS;
    assert_eq!(
        (
            o.rgb,
            o.gray,
            o.scratch,
            o.blurred,
            o.magnitude,
            o.hist,
            o.threshold,
            o.mask
        ),
        (
            0,
            24_883_200,
            58_060_800,
            91_238_400,
            124_416_000,
            157_593_600,
            157_594_624,
            157_594_880
        )
    );
    assert_eq!(Frame::NAME, "Frame");
    assert_eq!(
        Frame::FIELD_TYPES,
        &["u8", "f32", "f32", "f32", "f32", "u32", "u32", "u8"]
    );
    assert_eq!(Frame::UNALIASED_SIZE, Frame::SIZE);
}

/// Five 1080p-sized buffers with the last one, a histogram, on its own 4 KiB page: padding
/// before it and after it. Defined here for its hand-computed offsets.
#[derive(DeviceLayout)]
struct PagedHistogram {
    rgb: [u8; 1920 * 1080 * 3],
    gray: [f32; 1920 * 1080],
    scratch_a: [f32; 1920 * 1080],
    scratch_b: [f32; 1920 * 1080],
    #[layout(align = 4096)]
    hist: [u32; 256],
}

#[test]
fn a_paged_histogram_is_padded_before_and_after() {
    // scratch_b: 6_220_800 + 2 * 8_294_400 = 22_809_600, end 31_104_000.
    // hist: 31_104_000 / 4096 = 7593.75, so it moves to 7594 * 4096 = 31_105_024.
    assert_eq!(PagedHistogram::OFFSETS.hist, 31_105_024);
    assert_eq!(PagedHistogram::OFFSETS.scratch_b, 22_809_600);
    // ALIGN 4096; end 31_106_048 = 7594.25 pages, so SIZE = 7595 * 4096.
    assert_eq!(PagedHistogram::ALIGN, 4096);
    assert_eq!(PagedHistogram::SIZE, 31_109_120);
}

// ---- mixed alignments 1 .. 4096 --------------------------------------------------------------

const_assert_eq!(Mixed::ALIGN, 4096); // the largest field alignment
const_assert_eq!(Mixed::SIZE, 8192); // fields end at 4136, rounded up to 4096

#[test]
fn mixed_alignments() {
    assert_eq!(
        Mixed::FIELDS,
        &[
            placement("a", 0, 3, 1),        // [u8; 3]
            placement("b", 4, 6, 2),        // 3 rounded up to 2
            placement("c", 16, 5, 8),       // 10 rounded up to 8
            placement("d", 32, 12, 16),     // 21 rounded up to 16
            placement("e", 512, 1, 512),    // 44 rounded up to 512
            placement("f", 4096, 10, 4096), // 513 rounded up to 4096
            placement("g", 4106, 7, 1),     // struct default 1: right after f
            placement("h", 4120, 16, 8), // default 1 raised to align_of::<u64>() = 8: 4113 -> 4120
        ]
    );
    for f in Mixed::FIELDS {
        assert_eq!(f.offset % f.align, 0, "{}", f.name);
    }
}

/// A struct-level default below an element's alignment is raised to it; one above is kept.
#[derive(DeviceLayout)]
#[layout(align = 2)]
struct RaisedDefault {
    bytes: [u8; 1],
    words: [u32; 1],
    longs: [f64; 1],
    shorts: [u16; 1],
}

#[derive(DeviceLayout)]
#[layout(align = 64)]
struct WideDefault {
    bytes: [u8; 1],
    longs: [f64; 1],
}

#[test]
fn struct_default_alignment() {
    let o = RaisedDefault::OFFSETS;
    // bytes@0 (align 2); words: 1 -> 4 (align 4); longs: 8 -> 8 (align 8); shorts: 16 (align 2).
    assert_eq!((o.bytes, o.words, o.longs, o.shorts), (0, 4, 8, 16));
    let aligns: Vec<usize> = RaisedDefault::FIELDS.iter().map(|f| f.align).collect();
    assert_eq!(aligns, [2, 4, 8, 2]);
    assert_eq!((RaisedDefault::SIZE, RaisedDefault::ALIGN), (24, 8)); // 18 -> 24
    // Both fields at 64: longs at 64, end 72, SIZE 128.
    assert_eq!(WideDefault::OFFSETS.longs, 64);
    assert_eq!((WideDefault::SIZE, WideDefault::ALIGN), (128, 64));
}

// ---- nesting ---------------------------------------------------------------------------------

// Inner: 40 bytes at align 1024 -> SIZE 1024.
const_assert_eq!(Inner::SIZE, 1024);
const_assert_eq!(Inner::ALIGN, 1024);
// Middle: head 0..100; inner at 1024 (raised to Inner::ALIGN), end 2048; tail 2048..2148.
const_assert_eq!(Middle::SIZE, 3072); // 2148 rounded up to 1024
const_assert_eq!(Middle::ALIGN, 1024);
// Outer: flag 0..4; middle at 1024, end 4096; inner 4096..5120; last 5120..5121.
const_assert_eq!(Outer::SIZE, 6144); // 5121 rounded up to 1024
const_assert_eq!(Outer::ALIGN, 1024);

#[test]
fn nested_once() {
    assert_eq!(
        Middle::FIELDS,
        &[
            placement("head", 0, 100, 256),
            placement("inner", 1024, 1024, 1024), // 100 rounded up to Inner::ALIGN
            placement("tail", 2048, 100, 256),    // [u16; 50]
        ]
    );
    assert_eq!(Middle::FIELD_TYPES, &["u8", "Inner", "u16"]);
}

#[test]
fn nested_twice() {
    assert_eq!(
        Outer::FIELDS,
        &[
            placement("flag", 0, 4, 256),
            placement("middle", 1024, 3072, 1024), // 4 rounded up to Middle::ALIGN
            placement("inner", 4096, 1024, 1024),  // 1024 + 3072
            placement("last", 5120, 1, 256),       // 4096 + 1024
        ]
    );
    // The innermost coefficients of Outer.middle.inner lie at 1024 + 1024 + 0.
    assert_eq!(
        Outer::OFFSETS.middle + Middle::OFFSETS.inner + Inner::OFFSETS.coeffs,
        2048
    );
}

/// A nested layout under a struct default of 1, and with a field alignment above its own.
#[derive(DeviceLayout)]
#[layout(align = 1)]
struct NestedAligned {
    tag: [u8; 1],
    inner: Inner,
    #[layout(align = 4096)]
    paged: Inner,
}

#[test]
fn nested_alignment_rules() {
    // inner: default 1 raised to 1024; paged: 2048 rounded up to 4096.
    assert_eq!(
        NestedAligned::FIELDS,
        &[
            placement("tag", 0, 1, 1),
            placement("inner", 1024, 1024, 1024),
            placement("paged", 4096, 1024, 4096),
        ]
    );
    assert_eq!((NestedAligned::SIZE, NestedAligned::ALIGN), (8192, 4096)); // 5120 -> 8192
}

// ---- const generics --------------------------------------------------------------------------

// 640x480: rgb 921_600 (= 3600 * 256); gray 1_228_800 at 921_600, end 2_150_400 = 525 pages
// exactly, so hist sits there; end 2_151_424 -> SIZE 526 * 4096.
const_assert_eq!(FrameVga::SIZE, 2_154_496);
// 100x100: rgb 30_000; gray at 30_208 (118 * 256), end 70_208; hist at 73_728 (18 * 4096),
// end 74_752 -> SIZE 19 * 4096.
const_assert_eq!(FrameTiny::SIZE, 77_824);

#[test]
fn const_generic_at_two_sizes() {
    assert_eq!(
        FrameVga::FIELDS,
        &[
            placement("rgb", 0, 921_600, 256),
            placement("gray", 921_600, 1_228_800, 256),
            placement("hist", 2_150_400, 1024, 4096),
        ]
    );
    assert_eq!(
        FrameTiny::FIELDS,
        &[
            placement("rgb", 0, 30_000, 256),
            placement("gray", 30_208, 40_000, 256),
            placement("hist", 73_728, 1024, 4096),
        ]
    );
    assert_eq!((FrameVga::ALIGN, FrameTiny::ALIGN), (4096, 4096));
    assert_eq!(FrameTiny::OFFSETS.gray, 30_208);
}

// ---- FIELDS, OFFSETS, SIZE as compile-time values ----------------------------------------------

#[test]
fn fields_in_declaration_order() {
    let names: Vec<&str> = Padded::FIELDS.iter().map(|f| f.name).collect();
    assert_eq!(names, ["a", "b", "c"]);
    let names: Vec<&str> = Mixed::FIELDS.iter().map(|f| f.name).collect();
    assert_eq!(names, ["a", "b", "c", "d", "e", "f", "g", "h"]);
    // end() is offset + size.
    assert_eq!(Padded::FIELDS[1].end(), 296); // b: 256 + 40
}

#[test]
fn offsets_struct_matches_fields() {
    let o = Padded::OFFSETS;
    assert_eq!((o.a, o.b, o.c), (0, 256, 1024));
    // The OFFSETS struct is a plain value: comparable and copyable.
    let copy = o;
    assert_eq!(copy, Padded::OFFSETS);
    for (f, off) in Padded::FIELDS.iter().zip([o.a, o.b, o.c]) {
        assert_eq!(f.offset, off, "{}", f.name);
    }
}

/// Sized by a layout's SIZE: only a compile-time constant can do that.
static BUF: [u8; FrameTiny::SIZE] = [0; FrameTiny::SIZE];
/// OFFSETS and FIELDS are compile-time values too.
const GRAY_AT: usize = FrameTiny::OFFSETS.gray;
const FIELD_COUNT: usize = Outer::FIELDS.len();
const_assert_eq!(GRAY_AT, 30_208);
const_assert_eq!(FIELD_COUNT, 4);
const_assert_eq!(Padded::SIZE, 2048); // c ends at 1030, rounded up to 1024
const_assert_eq!(Padded::ALIGN, 1024);

#[test]
fn size_is_a_compile_time_value() {
    assert_eq!(BUF.len(), 77_824);
    let on_stack = [0u16; Inner::SIZE / 2];
    assert_eq!(on_stack.len(), 512);
}

#[test]
fn empty_layout_is_zero_sized() {
    assert_eq!(Empty::SIZE, 0);
    assert_eq!(Empty::ALIGN, 256); // no fields: the default alignment
    assert!(Empty::FIELDS.is_empty());
}

/// An empty layout nested in another takes no bytes.
#[derive(DeviceLayout)]
struct WithEmpty {
    a: [u8; 1],
    nothing: Empty,
    b: [u8; 1],
}

#[test]
fn empty_nested_layout_takes_no_bytes() {
    assert_eq!(
        WithEmpty::FIELDS,
        &[
            placement("a", 0, 1, 256),
            placement("nothing", 256, 0, 256),
            placement("b", 256, 1, 256),
        ]
    );
    assert_eq!(WithEmpty::SIZE, 512);
}
