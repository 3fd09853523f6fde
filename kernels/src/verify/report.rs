//! What the verifier checks and what it found: the regions it takes, and its reports per
//! field and per stage.

use std::fmt;

/// One region to verify: where it is, how big, and the alignment it promises.
///
/// Plain data: making one is safe, handing it to a raw entry point of [`Verifier`](super::Verifier) is not
/// (they are `unsafe fn`s whose kernels write `addr..addr + size`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    /// Name for the report.
    pub name: String,
    /// Offset from the arena's base.
    pub offset: usize,
    /// Device address.
    pub addr: u64,
    /// Bytes.
    pub size: usize,
    /// Promised alignment.
    pub align: usize,
}

/// The hardware alignment check of one region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlignmentCheck {
    /// `addr % align`, computed on the device (0 when the promise holds).
    pub residue: u64,
    /// Width in bytes of the access the device performed (16 = `ld/st.global.v4.u32`).
    pub access_bytes: u32,
}

/// The bulk-tensor (TMA) round trip of one region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TmaCheck {
    /// A tensor map was encoded over the region and a box went to shared memory and back.
    Passed {
        /// Bytes moved each way.
        box_bytes: usize,
    },
    /// The round trip ran but the bytes that came back were wrong.
    Failed {
        /// Wrong bytes in the box.
        wrong: usize,
    },
    /// Not run, and why (alignment below 16, region under 16 bytes, GPU below sm_90).
    Skipped(&'static str),
}

/// Verification of one region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldReport {
    /// The region.
    pub region: Region,
    /// The hardware alignment check.
    pub alignment: AlignmentCheck,
    /// Bytes that did not hold the region's own tag after every region was filled at once.
    pub mismatches: u64,
    /// The bulk-tensor round trip.
    pub tma: TmaCheck,
}

impl FieldReport {
    /// Whether every check of this region passed (a skipped TMA check counts as passed).
    pub fn passed(&self) -> bool {
        self.alignment.residue == 0
            && self.mismatches == 0
            && !matches!(self.tma, TmaCheck::Failed { .. })
    }
}

/// The verifier's report for a whole arena.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The GPU the checks ran on.
    pub device: String,
    /// Base address of the arena.
    pub base: u64,
    /// One entry per region.
    pub fields: Vec<FieldReport>,
}

impl Report {
    /// Whether every region passed every check.
    pub fn passed(&self) -> bool {
        self.fields.iter().all(FieldReport::passed)
    }

    /// Number of regions whose TMA round trip ran and passed.
    pub fn tma_passed(&self) -> usize {
        self.fields
            .iter()
            .filter(|f| matches!(f.tma, TmaCheck::Passed { .. }))
            .count()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "verified on {} — base {:#x}", self.device, self.base)?;
        let w = self
            .fields
            .iter()
            .map(|r| r.region.name.len())
            .chain([5])
            .max()
            .unwrap_or(5)
            .min(32);
        writeln!(
            f,
            "{:<w$}  {:>10}  {:>6}  {:>14}  {:>9}  {:>10}  tma",
            "field", "offset", "align", "device ptr", "ptr%align", "overlap"
        )?;
        for r in &self.fields {
            let tma = match &r.tma {
                TmaCheck::Passed { box_bytes } => format!("ok ({box_bytes} B round trip)"),
                TmaCheck::Failed { wrong } => format!("FAILED ({wrong} wrong bytes)"),
                TmaCheck::Skipped(why) => format!("skipped: {why}"),
            };
            let name: String = r.region.name.chars().take(w).collect();
            writeln!(
                f,
                "{:<w$}  {:>10}  {:>6}  {:>#14x}  {:>9}  {:>10}  {}",
                name,
                r.region.offset,
                r.region.align,
                r.region.addr,
                format!("{} (v{})", r.alignment.residue, r.alignment.access_bytes),
                if r.mismatches == 0 {
                    "ok".to_string()
                } else {
                    format!("{} bad", r.mismatches)
                },
                tma
            )?;
        }
        let failed = self.fields.iter().filter(|r| !r.passed()).count();
        write!(
            f,
            "{} regions: {} passed, {} failed; {} TMA round trips",
            self.fields.len(),
            self.fields.len() - failed,
            failed,
            self.tma_passed()
        )
    }
}

/// Two fields of a layout with stages whose live ranges never meet and whose bytes the plan
/// shares, as seen on the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedBytes {
    /// The field placed lower (or first declared, at equal offsets).
    pub first: String,
    /// The other field.
    pub second: String,
    /// Bytes the two share in the plan.
    pub overlap: usize,
    /// Bytes of the two regions that did not keep their own tag when both were filled at once.
    /// Non-zero shows on the device that the regions share bytes (tags of the two regions
    /// differ on all but about 1 in 256 of the shared bytes).
    pub mismatches: u64,
}

impl SharedBytes {
    /// Whether the device saw the sharing the plan promised.
    pub fn confirmed(&self) -> bool {
        self.mismatches > 0
    }
}

/// The per-stage verification of an arena whose layout has stages ([`verify_stages`](super::verify_stages)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagesReport {
    /// The GPU the checks ran on.
    pub device: String,
    /// The layout's name.
    pub layout: &'static str,
    /// Base address of the arena.
    pub base: u64,
    /// Per stage, in order: the fields live in it, each with its hardware alignment check and
    /// the bytes that did not keep its tag when every field of the stage was filled at once
    /// (the bulk-tensor check is not run per stage).
    pub stages: Vec<Vec<FieldReport>>,
    /// Every pair of fields that the plan lets share bytes, with what the device saw.
    pub shared: Vec<SharedBytes>,
}

impl StagesReport {
    /// Whether, in every stage, every live field is aligned and overlaps no other live field,
    /// and every pair the plan lets share bytes does share them on the device.
    pub fn passed(&self) -> bool {
        self.stages.iter().flatten().all(FieldReport::passed)
            && self.shared.iter().all(SharedBytes::confirmed)
    }
}

impl fmt::Display for StagesReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} verified per stage on {} — base {:#x}",
            self.layout, self.device, self.base
        )?;
        for (s, fields) in self.stages.iter().enumerate() {
            let failed: Vec<&FieldReport> = fields.iter().filter(|r| !r.passed()).collect();
            let names: Vec<&str> = fields.iter().map(|r| r.region.name.as_str()).collect();
            write!(
                f,
                "stage {s}: {} live ({}): ",
                fields.len(),
                names.join(", ")
            )?;
            if failed.is_empty() {
                writeln!(f, "aligned, pairwise disjoint")?;
            } else {
                let what: Vec<String> = failed
                    .iter()
                    .map(|r| {
                        format!(
                            "{} (ptr%align {}, {} bytes overwritten)",
                            r.region.name, r.alignment.residue, r.mismatches
                        )
                    })
                    .collect();
                writeln!(f, "FAILED: {}", what.join("; "))?;
            }
        }
        for p in &self.shared {
            writeln!(
                f,
                "shared: {} and {} ({} bytes): {}",
                p.first,
                p.second,
                p.overlap,
                if p.confirmed() {
                    format!(
                        "the device sees the sharing ({} bytes retagged)",
                        p.mismatches
                    )
                } else {
                    "NOT seen on the device".to_string()
                }
            )?;
        }
        write!(
            f,
            "{} stages, {} shared pairs: {}",
            self.stages.len(),
            self.shared.len(),
            if self.passed() { "passed" } else { "FAILED" }
        )
    }
}
