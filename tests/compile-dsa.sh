#!/usr/bin/env bash
# The MiniMalloc instances as #[derive(DeviceLayout)] structs: release compile time and the
# compiler's plan, per instance.
#
#   tests/compile-dsa.sh [DIR] [INSTANCES]   (defaults: ../shared/dsa/minimalloc, "A B C ... K")
#
# Each CSV (`id,lower,upper,size`, live over [lower, upper)) becomes a struct of one `[u8; size]`
# field per buffer, `#[layout(align = 1, stages = S)]` with S the number of distinct times and
# each field's `live = rank(lower)..=rank(upper) - 1`, and NO other attribute. A binary prints
# the plan's SIZE, its ratio to the capacity 1,048,576 and to PEAK_LIVE_BOUND, and checks the
# plan with devarena::plan::validate. After one warm-up build (devarena and its dependencies),
# each instance's crate is built once with `cargo build --release` (incremental off); the
# table gives that wall-clock time and rustc's peak memory.
set -euo pipefail
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
dir=${1:-$root/../shared/dsa/minimalloc}
[ -d "$dir" ] || dir=/work/shared/dsa/minimalloc
instances=${2:-"A B C D E F G H I J K"}
work=${DSA_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/devarena-compile-dsa.XXXXXX")}
mkdir -p "$work/dsa_ct/src"
cat > "$work/Cargo.toml" <<EOF
[workspace]
resolver = "3"
members = ["dsa_ct"]
EOF
cp "$root/Cargo.lock" "$work/Cargo.lock"
cat > "$work/dsa_ct/Cargo.toml" <<EOF
[package]
name = "dsa_ct"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
devarena = { path = "$root/allocator" }
EOF

gen() { # $1 = csv file: writes src/main.rs
  python3 - "$1" > "$work/dsa_ct/src/main.rs" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
times = sorted({int(r[k]) for r in rows for k in ("lower", "upper")})
rank = {t: i for i, t in enumerate(times)}
print("use devarena::DeviceLayout;")
print("use devarena::plan::{Placed, validate};")
print("#[derive(DeviceLayout)]")
print(f"#[layout(align = 1, stages = {len(times)})]")
print("pub struct Dsa {")
for i, r in enumerate(rows):
    a, b = rank[int(r["lower"])], rank[int(r["upper"])] - 1
    print(f"    #[layout(live = {a}..={b})]")
    print(f"    pub b{i}: [u8; {int(r['size'])}],")
print("}")
print("""fn main() {
    let placed: Vec<Placed> = Dsa::FIELDS
        .iter()
        .zip(Dsa::LIVE)
        .map(|(f, l)| Placed { offset: f.offset, size: f.size, align: f.align, live: *l })
        .collect();
    let check = match validate(&placed, Dsa::SIZE) {
        Ok(()) => "valid".to_string(),
        Err(v) => format!("INVALID: {v}"),
    };
    println!(
        "fields {} SIZE {} ratio {:.4} peak {} size/peak {:.4} unaliased {} {}",
        Dsa::FIELDS.len(), Dsa::SIZE, Dsa::SIZE as f64 / 1048576.0, Dsa::PEAK_LIVE_BOUND,
        Dsa::SIZE as f64 / Dsa::PEAK_LIVE_BOUND as f64, Dsa::UNALIASED_SIZE, check
    );
}""")
PY
}

export CARGO_TARGET_DIR="$work/target" CARGO_INCREMENTAL=0
cd "$work"
echo "rustc: $(rustc -V); $(nproc) cores; work dir $work"
printf '//! warm-up\nfn main() {}\n' > dsa_ct/src/main.rs
cargo build --offline --quiet --release   # warm-up: devarena and its dependencies
printf '%-4s %8s %8s   %s\n' inst "build s" "rss MB" "plan"
for x in $instances; do
  f=$(ls "$dir"/"$x".*.csv)
  gen "$f"
  t0=$(date +%s.%N)
  /usr/bin/time -f '%M' -o "$work/rss" cargo build --offline --quiet --release 2> "$work/err" || {
    printf '%-4s build failed:\n' "$x"; cat "$work/err"; continue; }
  t1=$(date +%s.%N)
  # cargo's own peak is small; rustc's dominates.
  rss=$(tail -1 "$work/rss")
  out=$("$work/target/release/dsa_ct")
  printf '%-4s %8.2f %8d   %s\n' "$x" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
    "$((rss / 1024))" "$out"
  grep -q warning "$work/err" && { echo "  warnings:"; grep -A3 warning "$work/err" | head -20; }
done
