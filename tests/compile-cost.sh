#!/usr/bin/env bash
# What a 64-field layout with stages adds to a crate's build time.
#
#   tests/compile-cost.sh [REPEATS]          (default 3; run from anywhere in the repository)
#
# Makes a temporary workspace of three tiny library crates that depend on devarena by path:
#
#   cc_none    no layout (the same dependency, a function that does nothing with it);
#   cc_plain   one #[derive(DeviceLayout)] struct of 64 fields (mixed element types, 1 B … 1 MiB),
#              and a function that makes a host arena and writes every field through views_mut();
#   cc_staged  the same 64 fields with #[layout(stages = 32)] and a random-ish live range on
#              each (fixed seed), and a function that goes through every stage with
#              stage_mut::<S>() and writes a field live there.
#
# Every struct and function is used, so the derive runs, the planner's const evaluation runs
# (the derive forces it with a `const _`) and the views are instantiated. After one warm-up
# build (devarena and its dependencies), each crate is rebuilt REPEATS times in the dev and
# the release profile after `touch src/lib.rs`, the crates taking turns; the table gives the
# median wall-clock seconds of `cargo build -p CRATE` and the extra seconds over cc_none.
# Incremental compilation is off (CARGO_INCREMENTAL=0): with it, a dev rebuild of an unchanged
# file reuses the cached plan and shows nothing of what a change to the layout costs.
set -euo pipefail
repeats=${1:-3}
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
work=$(mktemp -d "${TMPDIR:-/tmp}/devarena-compile-cost.XXXXXX")
trap 'rm -rf "$work"' EXIT

cat > "$work/Cargo.toml" <<EOF
[workspace]
resolver = "3"
members = ["cc_none", "cc_plain", "cc_staged"]
EOF
cp "$root/Cargo.lock" "$work/Cargo.lock"
for c in cc_none cc_plain cc_staged; do
  mkdir -p "$work/$c/src"
  cat > "$work/$c/Cargo.toml" <<EOF
[package]
name = "$c"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
devarena = { path = "$root/allocator" }
EOF
done

# The 64 fields, from a fixed seed: element type, length, live range over 32 stages.
STAGES=32
RANDOM=64
types=(u8 u16 u32 f32 f64 u64 i32)
declare -a ty len first last
for i in $(seq 0 63); do
  ty[i]=${types[RANDOM % ${#types[@]}]}
  len[i]=$(( (RANDOM % 1024 + 1) * (1 << (RANDOM % 11)) ))   # 1 … 1 Mi elements
  a=$(( RANDOM % STAGES )); b=$(( RANDOM % STAGES ))
  (( a > b )) && { t=$a; a=$b; b=$t; }
  (( b - a > 8 )) && b=$(( a + RANDOM % 9 ))                  # mostly short lives
  first[i]=$a; last[i]=$b
done

fields() { # $1 = staged|plain
  for i in $(seq 0 63); do
    [ "$1" = staged ] && echo "    #[layout(live = ${first[i]}..=${last[i]})]"
    printf '    pub f%02d: [%s; %d],\n' "$i" "${ty[i]}" "${len[i]}"
  done
}

{
  echo "//! No layout: the baseline."
  echo "pub fn run(backend: &devarena::HostBackend) -> u64 {"
  echo "    backend.stats().allocations"
  echo "}"
} > "$work/cc_none/src/lib.rs"

{
  echo "//! 64 fields, no stages."
  echo "use devarena::{Arena, DeviceLayout};"
  echo "#[derive(DeviceLayout)]"
  echo "#[layout(max_bytes = 1 << 40)]"
  echo "pub struct Plain {"
  fields plain
  echo "}"
  echo "pub fn run(arena: &mut Arena<Plain>) -> usize {"
  echo "    let v = arena.views_mut();"
  for i in $(seq 0 63); do printf '    v.f%02d[0] = Default::default();\n' "$i"; done
  echo "    Plain::SIZE + Plain::FIELDS.len()"
  echo "}"
} > "$work/cc_plain/src/lib.rs"

{
  echo "//! The same 64 fields with stages and live ranges."
  echo "use devarena::{Arena, DeviceLayout};"
  echo "#[derive(DeviceLayout)]"
  echo "#[layout(max_bytes = 1 << 40, stages = $STAGES)]"
  echo "pub struct Staged {"
  fields staged
  echo "}"
  echo "pub fn run(arena: &mut Arena<Staged>) -> usize {"
  echo "    let mut n = 0;"
  for s in $(seq 0 $((STAGES - 1))); do
    for i in $(seq 0 63); do
      if (( first[i] <= s && s <= last[i] )); then
        printf '    { let v = arena.stage_mut::<%d>(); v.f%02d[0] = Default::default(); n += v.f%02d.len(); }\n' "$s" "$i" "$i"
        break
      fi
    done
  done
  echo "    n + Staged::SIZE + Staged::UNALIASED_SIZE + Staged::PEAK_LIVE_BOUND"
  echo "}"
} > "$work/cc_staged/src/lib.rs"

export CARGO_TARGET_DIR="$work/target" CARGO_INCREMENTAL=0
cd "$work"
echo "rustc: $(rustc -V); $(nproc) cores; $repeats builds per crate and profile"
for profile in dev release; do
  flag=$([ $profile = release ] && echo --release || true)
  cargo build --offline --quiet --workspace $flag   # warm-up: devarena and its dependencies
done

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
declare -A times
for profile in dev release; do
  flag=$([ $profile = release ] && echo --release || true)
  for r in $(seq 1 "$repeats"); do
    for c in cc_none cc_plain cc_staged; do
      touch "$c/src/lib.rs"
      t0=$(date +%s.%N)
      cargo build --offline --quiet -p "$c" $flag
      t1=$(date +%s.%N)
      times[$profile.$c]+="$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }') "
    done
  done
done

printf '\n%-8s %-10s %10s %12s   %s\n' profile crate "median s" "extra s" "all runs (s)"
for profile in dev release; do
  base=$(echo ${times[$profile.cc_none]} | tr ' ' '\n' | median)
  for c in cc_none cc_plain cc_staged; do
    m=$(echo ${times[$profile.$c]} | tr ' ' '\n' | median)
    printf '%-8s %-10s %10.2f %+12.2f   %s\n' "$profile" "$c" "$m" "$(awk -v a="$base" -v b="$m" 'BEGIN { print b - a }')" \
      "$(for t in ${times[$profile.$c]}; do printf '%.2f ' "$t"; done)"
  done
done
size=$(grep -c 'live =' cc_staged/src/lib.rs)
echo
echo "cc_staged: 64 fields, $size live ranges over $STAGES stages; 'extra s' is over cc_none (target: < 2 s for cc_staged)"
