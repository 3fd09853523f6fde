//! MiniMalloc's CSV format for static memory allocation problems, read and checked: shared by
//! the `plan_csv` and `compile_time_csv` examples. A header naming at least `id`, `lower`,
//! `upper` and `size` (in any order), then one buffer per row, of `size` bytes, live over the
//! half-open `[lower, upper)`; every error names the line.

use std::collections::HashSet;

/// One buffer of the input.
pub struct Row {
    /// The text of the row, written back before its offset.
    pub text: String,
    pub id: String,
    pub lower: u64,
    pub upper: u64,
    pub size: u64,
}

/// A number of the row, or why not.
fn number(v: &str, column: &str, line: usize) -> Result<u64, String> {
    let v = v.trim();
    if v.starts_with('-') {
        return Err(format!("line {line}: {column} `{v}` is negative"));
    }
    v.parse()
        .map_err(|_| format!("line {line}: {column} `{v}` is not a whole number"))
}

/// The header and rows of a problem, each checked.
pub fn parse(text: &str) -> Result<(String, Vec<Row>), String> {
    // Spreadsheets save UTF-8 with a byte-order mark, which would stick to the first name.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let (_, header) = lines
        .next()
        .ok_or("the input is empty: expected a header `id,lower,upper,size`")?;
    let names: Vec<&str> = header.split(',').map(str::trim).collect();
    let column = |name: &str| match names.iter().filter(|&&c| c == name).count() {
        0 => Err(format!(
            "line 1: the header `{header}` has no `{name}` column"
        )),
        1 => Ok(names.iter().position(|&c| c == name).unwrap_or(0)),
        // Which one holds the numbers is anyone's guess.
        k => Err(format!(
            "line 1: the header `{header}` has {k} `{name}` columns"
        )),
    };
    let (id, lower, upper, size) = (
        column("id")?,
        column("lower")?,
        column("upper")?,
        column("size")?,
    );
    let mut rows = Vec::new();
    let mut ids = HashSet::new();
    for (i, line) in lines {
        let n = i + 1;
        let fields: Vec<&str> = line.split(',').collect();
        if fields.len() != names.len() {
            return Err(format!(
                "line {n}: {} columns, the header has {}",
                fields.len(),
                names.len()
            ));
        }
        let row = Row {
            text: line.trim_end().to_string(),
            id: fields[id].trim().to_string(),
            lower: number(fields[lower], "lower", n)?,
            upper: number(fields[upper], "upper", n)?,
            size: number(fields[size], "size", n)?,
        };
        if row.id.is_empty() {
            return Err(format!("line {n}: the id is empty"));
        }
        if row.upper <= row.lower {
            return Err(format!(
                "line {n}: upper {} is not after lower {} (live over [lower, upper))",
                row.upper, row.lower
            ));
        }
        if row.size == 0 {
            return Err(format!(
                "line {n}: size is 0; a buffer has at least one byte"
            ));
        }
        if !ids.insert(row.id.clone()) {
            return Err(format!("line {n}: id `{}` appears twice", row.id));
        }
        rows.push(row);
    }
    Ok((header.trim_end().to_string(), rows))
}

/// The peak of live bytes: the most bytes live at one time.
pub fn peak(rows: &[Row]) -> u64 {
    let mut events: Vec<(u64, i128)> = rows
        .iter()
        .flat_map(|r| [(r.lower, r.size as i128), (r.upper, -(r.size as i128))])
        .collect();
    // Ends before starts at equal times: [lower, upper) is half-open.
    events.sort_by_key(|&(t, d)| (t, d > 0));
    let (mut live, mut best) = (0i128, 0i128);
    for (_, d) in events {
        live += d;
        best = best.max(live);
    }
    best as u64
}
