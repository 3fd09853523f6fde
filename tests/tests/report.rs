//! The layout report: the table (`Display`), the totals, and the SVG memory map.

use devarena::{DeviceLayout, LayoutBuilder, LayoutReport};
use devarena_kernels::pipeline::Frame;
use devarena_tests::fixtures::{Empty, Padded};

/// Padded: a [u8; 100] at 0; b [u32; 10] at 256 (156 bytes of padding before it), end 296;
/// c [u16; 3] at 1024 (728 bytes of padding), end 1030; SIZE 2048 (1018 bytes after c).
/// Requested 100 + 40 + 6 = 146; padding 2048 - 146 = 1902 = 156 + 728 + 1018, which is
/// 1902 / 2048 = 92.87109375 %.
#[test]
fn rows_and_totals_of_a_padded_layout() {
    let report = LayoutReport::of::<Padded>();
    assert_eq!(report.name, "Padded");
    assert_eq!(report.totals.size, 2048);
    assert_eq!(report.totals.align, 1024);
    assert_eq!(report.totals.requested, 146);
    assert_eq!(report.padding_bytes(), 1902);
    assert!((report.padding_percent() - 92.871_093_75).abs() < 1e-9);

    let rows: Vec<_> = report
        .rows
        .iter()
        .map(|r| {
            (
                r.name.as_str(),
                r.ty.as_str(),
                r.offset,
                r.size,
                r.align,
                r.padding_before,
                r.end(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("a", "u8", 0, 100, 256, 0, 100),
            ("b", "u32", 256, 40, 256, 156, 296),
            ("c", "u16", 1024, 6, 1024, 728, 1030),
        ]
    );
}

/// The printed table, parsed back: one line per field with its numbers, and the totals line.
#[test]
fn table_lists_every_field_and_the_totals() {
    let table = LayoutReport::of::<Padded>().to_string();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines[0], "layout Padded: 2048 bytes, align 1024, 3 fields");
    let header: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        header,
        [
            "field", "type", "offset", "size", "align", "pad", "before", "end"
        ]
    );
    let rows: Vec<Vec<&str>> = lines[2..5]
        .iter()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows,
        [
            ["a", "u8", "0", "100", "256", "0", "100"],
            ["b", "u32", "256", "40", "256", "156", "296"],
            ["c", "u16", "1024", "6", "1024", "728", "1030"],
        ]
    );
    assert_eq!(lines[5], "requested 146 bytes, padding 1902 bytes (92.87%)");
    assert_eq!(lines.len(), 6);
}

/// The pipeline's `Frame` (planned for 3840×2160): every size but threshold's 4 bytes is a
/// multiple of 256, so its only padding is the 252 bytes between threshold and mask. Requested
/// 24_883_200 + 4 * 33_177_600 + 1024 + 4 + 8_294_400 = 165_889_028 of SIZE 165_889_280.
#[test]
fn table_of_the_pipeline_frame_pads_only_before_the_mask() {
    let report = LayoutReport::of::<Frame>();
    assert_eq!(report.padding_bytes(), 252);
    assert_eq!(report.totals.requested, 165_889_028);
    let table = report.to_string();
    assert!(
        table.ends_with("requested 165889028 bytes, padding 252 bytes (0.00%)"),
        "{table}"
    );
    for f in Frame::FIELDS {
        let line = table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(f.name))
            .unwrap_or_else(|| panic!("no row for {}", f.name));
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols[2], f.offset.to_string(), "{}", f.name);
        assert_eq!(cols[3], f.size.to_string(), "{}", f.name);
        let padding_before = if f.name == "mask" { "252" } else { "0" };
        assert_eq!(cols[5], padding_before, "{}", f.name);
        assert_eq!(cols[6], f.end().to_string(), "{}", f.name);
    }
}

#[test]
fn zero_size_layout_reports_cleanly() {
    let report = LayoutReport::of::<Empty>();
    assert_eq!(report.padding_bytes(), 0);
    assert_eq!(report.padding_percent(), 0.0);
    assert!(report.rows.is_empty());
    assert!(report.to_string().contains("padding 0 bytes (0.00%)"));
    let svg = report.to_svg();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
}

/// Counts non-overlapping occurrences of `needle`.
fn count(hay: &str, needle: &str) -> usize {
    hay.matches(needle).count()
}

#[test]
fn svg_is_a_well_formed_map_with_one_bar_per_field() {
    let svg = LayoutReport::of::<Padded>().to_svg();
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert!(svg.trim_end().ends_with("</svg>"));
    assert_eq!(count(&svg, "<svg"), 1);
    assert_eq!(count(&svg, "</svg>"), 1);
    // Every opened element is closed (self-closing or with its end tag).
    for tag in ["text", "title", "style", "defs", "pattern"] {
        assert_eq!(
            count(&svg, &format!("<{tag}")),
            count(&svg, &format!("</{tag}>")),
            "<{tag}> not balanced"
        );
    }
    assert_eq!(count(&svg, "<"), count(&svg, ">"));
    // The title states the numbers.
    assert!(
        svg.contains("Padded — 2048 bytes, align 1024, 3 fields, padding 1902 bytes (92.87%)"),
        "{svg}"
    );
    // One bar per field on the allocation strip, titled with its offset and size.
    assert_eq!(count(&svg, "<title>a: offset 0, 100 bytes</title>"), 1);
    assert_eq!(count(&svg, "<title>b: offset 256, 40 bytes</title>"), 1);
    assert_eq!(count(&svg, "<title>c: offset 1024, 6 bytes</title>"), 1);
    assert_eq!(count(&svg, ": offset "), 3);
    // Padding before b and c is drawn, with its size.
    assert_eq!(count(&svg, "<title>padding: 156 bytes</title>"), 1);
    assert_eq!(count(&svg, "<title>padding: 728 bytes</title>"), 1);
    // A label per field with offset, size and alignment.
    assert!(svg.contains("@1024 6 B align 1024"));
}

#[test]
fn svg_bars_are_drawn_to_scale() {
    // Two fields: 256 bytes and 768 bytes, SIZE 1024; the bar is 560 units wide.
    let report = LayoutBuilder::new("Scale")
        .array::<u8>("quarter", 256)
        .array::<u8>("rest", 768)
        .build()
        .unwrap()
        .report();
    let svg = report.to_svg();
    // quarter: x = 170, width 560 * 256/1024 = 140; rest: x = 170 + 140 = 310, width 420.
    assert!(
        svg.contains("<rect x=\"170.00\" y=\"56\" width=\"140.00\" height=\"28\""),
        "{svg}"
    );
    assert!(
        svg.contains("<rect x=\"310.00\" y=\"56\" width=\"420.00\" height=\"28\""),
        "{svg}"
    );
}

#[test]
fn svg_escapes_names() {
    let report = LayoutBuilder::new("A<B> & \"C\"")
        .array::<u8>("x", 1)
        .build()
        .unwrap()
        .report();
    let svg = report.to_svg();
    assert!(svg.contains("A&lt;B&gt; &amp; &quot;C&quot;"));
    assert!(!svg.contains("A<B>"));
}

#[test]
fn write_svg_writes_the_map_to_a_file() {
    let report = LayoutReport::of::<Padded>();
    let path = std::env::temp_dir().join(format!("devarena-report-{}.svg", std::process::id()));
    report.write_svg(&path).unwrap();
    let written = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(written, report.to_svg());
    // A path that cannot be written is an error, not a panic.
    let bad = std::env::temp_dir()
        .join("devarena-no-such-dir")
        .join("x.svg");
    assert!(report.write_svg(&bad).is_err());
}

#[test]
fn report_of_a_builder_layout_matches_the_derive() {
    let built = LayoutBuilder::new("Padded")
        .array::<u8>("a", 100)
        .array::<u32>("b", 10)
        .array_aligned::<u16>("c", 3, 1024)
        .build()
        .unwrap();
    assert_eq!(built.report(), LayoutReport::of::<Padded>());
    assert_eq!(
        built.report().to_string(),
        LayoutReport::of::<Padded>().to_string()
    );
}
