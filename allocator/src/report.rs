//! Layout reports: a table (`Display`) and an SVG memory map.

use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt::{self, Write as _};

use crate::layout::DeviceLayout;
use crate::plan::{LiveRange, Slot, Totals};

/// One row of a [`LayoutReport`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportRow {
    /// Field name.
    pub name: String,
    /// Element type as written.
    pub ty: String,
    /// Byte offset.
    pub offset: usize,
    /// Bytes.
    pub size: usize,
    /// Alignment.
    pub align: usize,
    /// Unused bytes between the end of what lies below this field and its offset.
    pub padding_before: usize,
    /// Live range, clipped to the layout's stages.
    pub live: LiveRange,
    /// Names of the fields whose bytes this one shares (stages that never meet).
    pub shares_with: Vec<String>,
}

impl ReportRow {
    /// One past the last byte (`usize::MAX` for a row that runs past it).
    pub fn end(&self) -> usize {
        self.offset.saturating_add(self.size)
    }
}

/// What a layout looks like in memory: print it (`Display`) for a table, or write the SVG map.
///
/// ```
/// use devarena::{DeviceLayout, LayoutReport};
///
/// #[derive(DeviceLayout)]
/// struct Frame { rgb: [u8; 300], gray: [f32; 100] }
///
/// let report = LayoutReport::of::<Frame>();
/// assert_eq!(report.padding_bytes(), 1024 - 700); // SIZE rounds 912 up to 1024
/// let table = report.to_string();
/// assert!(table.contains("gray"));
/// assert!(report.to_svg().starts_with("<svg"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutReport {
    /// Layout name.
    pub name: String,
    /// Rows in address order (ties in declaration order).
    pub rows: Vec<ReportRow>,
    /// Layout-wide results.
    pub totals: Totals,
    /// Number of stages (0 without stages).
    pub stages: usize,
    /// Stage names, when the layout named its stages.
    pub stage_names: Vec<String>,
}

impl LayoutReport {
    /// The report of a compile-time layout.
    pub fn of<L: DeviceLayout>() -> Self {
        let totals = Totals {
            size: L::SIZE,
            align: L::ALIGN,
            requested: L::FIELDS.iter().map(|f| f.size).sum(),
            unaliased_size: L::UNALIASED_SIZE,
            peak_live_bound: L::PEAK_LIVE_BOUND,
        };
        let mut report = Self::from_parts(
            L::NAME,
            L::STAGES,
            totals,
            L::FIELDS.iter().enumerate().map(|(i, f)| {
                (
                    f.name,
                    L::FIELD_TYPES.get(i).copied().unwrap_or(""),
                    Slot {
                        offset: f.offset,
                        size: f.size,
                        align: f.align,
                    },
                    L::LIVE.get(i).copied().unwrap_or(LiveRange::ALL),
                )
            }),
        );
        report.stage_names = L::STAGE_NAMES.iter().map(|s| s.to_string()).collect();
        report
    }

    /// How a stage is shown: its name, or its number.
    fn stage_label(&self, k: usize) -> String {
        match self.stage_names.get(k) {
            Some(name) => name.clone(),
            None => alloc::format!("stage {k}"),
        }
    }

    fn live_label(&self, live: LiveRange) -> String {
        match (
            self.stage_names.get(live.first),
            self.stage_names.get(live.last),
        ) {
            (Some(a), Some(_)) if live.first == live.last => a.clone(),
            (Some(a), Some(b)) => alloc::format!("{a}..={b}"),
            _ => alloc::format!("{}..={}", live.first, live.last),
        }
    }

    /// Builds a report from planned fields (declaration order).
    pub fn from_parts<'s>(
        name: &str,
        stages: usize,
        totals: Totals,
        fields: impl IntoIterator<Item = (&'s str, &'s str, Slot, LiveRange)>,
    ) -> Self {
        let fields: Vec<_> = fields.into_iter().collect();
        let mut order: Vec<usize> = (0..fields.len()).collect();
        order.sort_by_key(|&i| (fields[i].2.offset, i));
        let mut rows = Vec::with_capacity(fields.len());
        let mut covered = 0usize;
        for &i in &order {
            let (fname, ty, slot, live) = fields[i];
            let shares_with = fields
                .iter()
                .enumerate()
                .filter(|&(j, other)| j != i && other.2.overlaps(&slot))
                .map(|(_, other)| other.0.to_string())
                .collect();
            rows.push(ReportRow {
                name: fname.to_string(),
                ty: ty.to_string(),
                offset: slot.offset,
                size: slot.size,
                align: slot.align,
                padding_before: slot.offset.saturating_sub(covered),
                live: if stages == 0 { live } else { live.clip(stages) },
                shares_with,
            });
            covered = covered.max(slot.end());
        }
        LayoutReport {
            name: name.to_string(),
            rows,
            totals,
            stages,
            stage_names: Vec::new(),
        }
    }

    /// Bytes of the allocation that belong to no field.
    pub fn padding_bytes(&self) -> usize {
        let mut spans: Vec<(usize, usize)> = self
            .rows
            .iter()
            .filter(|r| r.size > 0)
            .map(|r| (r.offset, r.end()))
            .collect();
        spans.sort_unstable();
        let mut used = 0;
        let mut reach = 0;
        for (start, end) in spans {
            let start = start.max(reach);
            if end > start {
                used += end - start;
                reach = end;
            }
        }
        self.totals.size.saturating_sub(used)
    }

    /// Padding as a percentage of the allocation.
    pub fn padding_percent(&self) -> f64 {
        if self.totals.size == 0 {
            0.0
        } else {
            self.padding_bytes() as f64 * 100.0 / self.totals.size as f64
        }
    }

    /// The SVG memory map: one bar per field drawn to scale with padding shaded, labels, and
    /// for staged layouts a stage × address picture (at most 256 stage columns: with more
    /// stages, each column stands for a run of them).
    pub fn to_svg(&self) -> String {
        if self.stages > 0 {
            self.svg_stages()
        } else {
            self.svg_linear()
        }
    }

    /// Writes [`to_svg`](Self::to_svg) to a file.
    #[cfg(feature = "std")]
    pub fn write_svg(&self, path: impl AsRef<std::path::Path>) -> std::io::Result<()> {
        std::fs::write(path, self.to_svg())
    }

    fn svg_linear(&self) -> String {
        const W: f64 = 960.0;
        const LEFT: f64 = 170.0;
        const BAR_W: f64 = 560.0;
        const ROW_H: f64 = 22.0;
        let size = self.totals.size.max(1) as f64;
        let x = |off: usize| LEFT + off as f64 / size * BAR_W;
        let strip_y = 56.0;
        let rows_y = strip_y + 60.0;
        let h = rows_y + ROW_H * self.rows.len() as f64 + 30.0;
        let mut s = String::new();
        svg_head(&mut s, W, h);
        let _ = writeln!(
            s,
            "<text x=\"12\" y=\"24\" class=\"title\">{} — {} bytes, align {}, {} fields, padding {} bytes ({:.2}%)</text>",
            esc(&self.name),
            self.totals.size,
            self.totals.align,
            self.rows.len(),
            self.padding_bytes(),
            self.padding_percent()
        );
        // The whole allocation to scale: padding shaded underneath, fields on top.
        let _ = writeln!(
            s,
            "<text x=\"12\" y=\"{:.1}\">allocation</text><rect x=\"{LEFT}\" y=\"{strip_y}\" width=\"{BAR_W}\" height=\"28\" class=\"pad\"/>",
            strip_y + 18.0
        );
        for (i, r) in self.rows.iter().enumerate() {
            let w = (r.size as f64 / size * BAR_W).max(0.5);
            let _ = writeln!(
                s,
                "<rect x=\"{:.2}\" y=\"{strip_y}\" width=\"{w:.2}\" height=\"28\" fill=\"{}\"><title>{}: offset {}, {} bytes</title></rect>",
                x(r.offset),
                color(i),
                esc(&r.name),
                r.offset,
                r.size
            );
        }
        let _ = writeln!(
            s,
            "<text x=\"{LEFT}\" y=\"{:.1}\" class=\"small\">0</text><text x=\"{:.1}\" y=\"{:.1}\" class=\"small\" text-anchor=\"end\">{}</text>",
            strip_y + 42.0,
            LEFT + BAR_W,
            strip_y + 42.0,
            self.totals.size
        );
        // One row per field, each drawn to the same scale; padding before it shaded.
        for (i, r) in self.rows.iter().enumerate() {
            let y = rows_y + ROW_H * i as f64;
            let _ = write!(
                s,
                "<text x=\"12\" y=\"{:.1}\">{}</text>",
                y + 14.0,
                esc(&r.name)
            );
            let _ = write!(
                s,
                "<rect x=\"{LEFT}\" y=\"{:.1}\" width=\"{BAR_W}\" height=\"16\" class=\"lane\"/>",
                y + 2.0
            );
            if r.padding_before > 0 {
                let pw = (r.padding_before as f64 / size * BAR_W).max(0.5);
                let _ = write!(
                    s,
                    "<rect x=\"{:.2}\" y=\"{:.1}\" width=\"{pw:.2}\" height=\"16\" class=\"pad\"><title>padding: {} bytes</title></rect>",
                    x(r.offset.saturating_sub(r.padding_before)),
                    y + 2.0,
                    r.padding_before
                );
            }
            let w = (r.size as f64 / size * BAR_W).max(1.0);
            let _ = write!(
                s,
                "<rect x=\"{:.2}\" y=\"{:.1}\" width=\"{w:.2}\" height=\"16\" fill=\"{}\"/>",
                x(r.offset),
                y + 2.0,
                color(i)
            );
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" class=\"small\">@{} {} B align {}</text>",
                LEFT + BAR_W + 10.0,
                y + 14.0,
                r.offset,
                r.size,
                r.align
            );
        }
        s.push_str("</svg>\n");
        s
    }

    fn svg_stages(&self) -> String {
        const LEFT: f64 = 90.0;
        const COL_W: f64 = 120.0;
        const MAP_H: f64 = 520.0;
        let stages = self.stages;
        // At most `MAX_COLUMNS` columns, `per` stages each: the picture of a layout with
        // millions of stages stays the size of its buffers' list, not of its stages'.
        let per = stages.div_ceil(MAX_COLUMNS).max(1);
        let columns = stages.div_ceil(per);
        let w = LEFT + COL_W * columns as f64 + 240.0;
        let top = 70.0;
        let h = top + MAP_H + 60.0;
        let size = self.totals.size.max(1) as f64;
        let y = |off: usize| top + off as f64 / size * MAP_H;
        let ratio = if self.totals.peak_live_bound == 0 {
            1.0
        } else {
            self.totals.size as f64 / self.totals.peak_live_bound as f64
        };
        let mut s = String::new();
        svg_head(&mut s, w, h);
        let _ = writeln!(
            s,
            "<text x=\"12\" y=\"24\" class=\"title\">{} — SIZE {} bytes, UNALIASED_SIZE {}, PEAK_LIVE_BOUND {}, SIZE/bound {:.3}</text>",
            esc(&self.name),
            self.totals.size,
            self.totals.unaliased_size,
            self.totals.peak_live_bound,
            ratio
        );
        let _ = writeln!(
            s,
            "<text x=\"12\" y=\"44\" class=\"small\">stages across{}, offsets down; one rectangle per buffer over its live stages; sharing saves {} bytes</text>",
            if per > 1 {
                alloc::format!(" ({per} to a column)")
            } else {
                String::new()
            },
            self.totals.unaliased_size.saturating_sub(self.totals.size)
        );
        let _ = writeln!(
            s,
            "<rect x=\"{LEFT}\" y=\"{top}\" width=\"{:.1}\" height=\"{MAP_H}\" class=\"pad\"/>",
            COL_W * columns as f64
        );
        for k in 0..columns {
            let cx = LEFT + COL_W * k as f64;
            let label = if per == 1 {
                self.stage_label(k)
            } else {
                let (first, last) = (k * per, (k + 1).saturating_mul(per).min(stages) - 1);
                if self.stage_names.is_empty() {
                    alloc::format!("{first}–{last}")
                } else {
                    alloc::format!("{}–{}", self.stage_label(first), self.stage_label(last))
                }
            };
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" class=\"small\" text-anchor=\"middle\">{}</text><line x1=\"{cx:.1}\" y1=\"{top}\" x2=\"{cx:.1}\" y2=\"{:.1}\" class=\"grid\"/>",
                cx + COL_W / 2.0,
                top - 6.0,
                esc(&label),
                top + MAP_H
            );
        }
        for (i, r) in self.rows.iter().enumerate() {
            let (first, last) = (r.live.first / per, r.live.last / per);
            let x0 = LEFT + COL_W * first as f64 + 2.0;
            // A row's range is clipped to the stages on the way in; rows and stages are public,
            // so a range outside them draws empty instead of overflowing.
            let columns_live = last.saturating_add(1).saturating_sub(first);
            let cw = (COL_W * columns_live as f64 - 4.0).max(0.0);
            let hh = (r.size as f64 / size * MAP_H).max(1.0);
            let _ = writeln!(
                s,
                "<rect x=\"{x0:.1}\" y=\"{:.2}\" width=\"{cw:.1}\" height=\"{hh:.2}\" fill=\"{}\" stroke=\"#333\" stroke-width=\"0.5\"><title>{}: offset {}, {} bytes, stages {}..={}</title></rect><text x=\"{:.1}\" y=\"{:.2}\" class=\"small\">{}</text>",
                y(r.offset),
                color(i),
                esc(&r.name),
                r.offset,
                r.size,
                r.live.first,
                r.live.last,
                x0 + 3.0,
                y(r.offset) + 11.0_f64.min(hh.max(9.0)),
                esc(&r.name)
            );
        }
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" class=\"small\">0</text><text x=\"{:.1}\" y=\"{:.1}\" class=\"small\">{} bytes</text>",
            LEFT - 30.0,
            top + 10.0,
            LEFT - 80.0,
            top + MAP_H,
            self.totals.size
        );
        s.push_str("</svg>\n");
        s
    }
}

/// The most stage columns the stage map draws; beyond, a column stands for several stages.
const MAX_COLUMNS: usize = 256;

fn svg_head(s: &mut String, w: f64, h: f64) {
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w:.0}\" height=\"{h:.0}\" viewBox=\"0 0 {w:.0} {h:.0}\" font-family=\"monospace\" font-size=\"12\">\n\
         <defs><pattern id=\"hatch\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#eee\"/><line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#bbb\" stroke-width=\"2\"/></pattern></defs>\n\
         <style>.title{{font-size:14px;font-weight:bold}} .small{{font-size:10px}} .pad{{fill:url(#hatch)}} .lane{{fill:#f7f7f7}} .grid{{stroke:#ccc}}</style>\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
}

fn color(i: usize) -> &'static str {
    const PALETTE: [&str; 10] = [
        "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
        "#9c755f", "#bab0ac",
    ];
    PALETTE[i % PALETTE.len()]
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

impl fmt::Display for LayoutReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name_w = self
            .rows
            .iter()
            .map(|r| r.name.chars().count())
            .chain([5])
            .max()
            .unwrap_or(5);
        let ty_w = self
            .rows
            .iter()
            .map(|r| r.ty.chars().count())
            .chain([4])
            .max()
            .unwrap_or(4)
            .min(28);
        writeln!(
            f,
            "layout {}: {} bytes, align {}, {} fields",
            self.name,
            self.totals.size,
            self.totals.align,
            self.rows.len()
        )?;
        write!(
            f,
            "{:<name_w$}  {:<ty_w$}  {:>12}  {:>12}  {:>6}  {:>10}  {:>12}",
            "field", "type", "offset", "size", "align", "pad before", "end"
        )?;
        let lw = self
            .rows
            .iter()
            .map(|r| self.live_label(r.live).chars().count())
            .chain([4])
            .max()
            .unwrap_or(4);
        if self.stages > 0 {
            write!(f, "  {:>lw$}  shares bytes with", "live")?;
        }
        writeln!(f)?;
        for r in &self.rows {
            let ty: String = r.ty.chars().take(ty_w).collect();
            write!(
                f,
                "{:<name_w$}  {:<ty_w$}  {:>12}  {:>12}  {:>6}  {:>10}  {:>12}",
                r.name,
                ty,
                r.offset,
                r.size,
                r.align,
                r.padding_before,
                r.end()
            )?;
            if self.stages > 0 {
                let live = self.live_label(r.live);
                write!(f, "  {live:>lw$}  {}", r.shares_with.join(", "))?;
            }
            writeln!(f)?;
        }
        write!(
            f,
            "requested {} bytes, padding {} bytes ({:.2}%)",
            self.totals.requested,
            self.padding_bytes(),
            self.padding_percent()
        )?;
        if self.stages > 0 {
            let saved = self.totals.unaliased_size.saturating_sub(self.totals.size);
            write!(
                f,
                "\nSIZE {} | UNALIASED_SIZE {} | PEAK_LIVE_BOUND {} | saved {} bytes ({:.1}%) | SIZE/bound {:.3}",
                self.totals.size,
                self.totals.unaliased_size,
                self.totals.peak_live_bound,
                saved,
                if self.totals.unaliased_size == 0 {
                    0.0
                } else {
                    saved as f64 * 100.0 / self.totals.unaliased_size as f64
                },
                if self.totals.peak_live_bound == 0 {
                    1.0
                } else {
                    self.totals.size as f64 / self.totals.peak_live_bound as f64
                }
            )?;
        }
        Ok(())
    }
}
