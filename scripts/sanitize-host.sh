#!/usr/bin/env bash
# AddressSanitizer and ThreadSanitizer over the host pool and arena tests, on nightly Rust with
# the standard library rebuilt instrumented (-Zbuild-std), and the pool soak example (4
# threads) under each. No GPU needed.
#
#   bash scripts/sanitize-host.sh              # both sanitizers
#   bash scripts/sanitize-host.sh thread       # one
#
# Each sanitizer builds into target/sanitize-<name>/ (the standard library included, a few
# minutes on 2 cores). A report from the sanitizer fails the test that caused it; the script
# prints one line per step and exits non-zero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
sanitizers=("$@")
[ ${#sanitizers[@]} -gt 0 ] || sanitizers=(address thread)
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
rustup component list --toolchain nightly --installed | grep -q '^rust-src' \
  || rustup component add rust-src --toolchain nightly
target=$(rustc +nightly -vV | sed -n 's/^host: //p')
# Huge requests are part of the tests (an arena of 64 TiB must be an error): let the
# sanitizers' allocators return null for them as the system allocator does.
export ASAN_OPTIONS="allocator_may_return_null=1:detect_leaks=1:abort_on_error=0"
export TSAN_OPTIONS="allocator_may_return_null=1:halt_on_error=1"
export RUST_BACKTRACE=1
# The model-checked pool sequences: fewer cases than on stable, the sanitizers are slow.
export PROPTEST_CASES=${PROPTEST_CASES:-32}
failed=0
for san in "${sanitizers[@]}"; do
  dir="target/sanitize-$san"
  run() {
    local what=$1
    shift
    local start rc
    start=$(date +%s)
    RUSTFLAGS="-Zsanitizer=$san -Cdebug-assertions=on" RUSTDOCFLAGS="-Zsanitizer=$san" \
      CARGO_TARGET_DIR="$dir" nice -n 19 "$@" > "$dir/$what.log" 2>&1
    rc=$?
    local summary
    summary=$(grep -E '^test result:|^soak:' "$dir/$what.log" | awk '{ s = s (s ? "; " : "") $0 } END { print s }')
    echo "$san $what: rc=$rc $(( $(date +%s) - start ))s ${summary:-no summary}"
    if [ $rc -ne 0 ]; then
      failed=1
      grep -E 'Sanitizer|WARNING|ERROR|panicked' "$dir/$what.log" | head -20
    fi
  }
  mkdir -p "$dir"
  cargo_test=(cargo +nightly test -Zbuild-std --target "$target" --no-fail-fast)
  # The pool (its unit tests: TLSF, address map, lock, events; its integration tests, the
  # thread heaps' and the growable region's on the host stand-in among them), the
  # static and runtime arenas, stages, extremes, and the fuzz corpora replayed.
  run devarena "${cargo_test[@]}" -p devarena --no-default-features --features std --lib --test pool \
    --test pool_threads --test pool_callbacks --test pool_inputs --test pool_vmm
  run tests "${cargo_test[@]}" -p devarena-tests --no-default-features \
    --lib --test host_arena --test dyn_arena --test stages --test extremes --test fuzz_corpus \
    --test builder_props --test layouts --test report
  run soak cargo +nightly run -Zbuild-std --target "$target" --release -p devarena \
    --example pool_soak -- --ops 2000000 --threads 4 --check-every 50000
done
exit $failed
