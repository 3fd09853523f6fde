//! A MiniMalloc CSV as the layout `tests/compile-dsa.sh` derives from it, and the check of a
//! plan of it: shared by the `compile_time_csv` and `tune_schedule` examples.

use devarena::plan::{self, FieldSpec, LayoutSpec, Placed, Slot};

use super::csv;

/// The layout of one CSV (`id,lower,upper,size`, live over `[lower, upper)`), as
/// `tests/compile-dsa.sh` writes it: align 1, one stage per distinct time.
pub fn load(path: &str) -> Result<(LayoutSpec, Vec<FieldSpec>), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let (_, rows) = csv::parse(&text).map_err(|e| format!("{path}: {e}"))?;
    let mut times: Vec<u64> = rows.iter().flat_map(|r| [r.lower, r.upper]).collect();
    times.sort_unstable();
    times.dedup();
    let rank = |t: u64| times.partition_point(|&x| x < t);
    let layout = LayoutSpec::DEFAULT.with_align(1).with_stages(times.len());
    let specs = rows
        .iter()
        .map(|r| FieldSpec::of::<u8>(r.size as usize).with_live(rank(r.lower), rank(r.upper) - 1))
        .collect();
    Ok((layout, specs))
}

/// Checks a plan of `specs` (offsets in `slots`, `size` bytes in all) with `plan::validate`.
pub fn validate(
    path: &str,
    slots: &[Slot],
    specs: &[FieldSpec],
    size: usize,
) -> Result<(), String> {
    let placed: Vec<Placed> = slots
        .iter()
        .zip(specs)
        .map(|(s, f)| Placed::of(s, f.live))
        .collect();
    plan::validate(&placed, size).map_err(|v| format!("{path}: invalid plan: {v}"))
}
