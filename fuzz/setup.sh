#!/usr/bin/env bash
# Installs what the fuzz targets need: the nightly toolchain (libFuzzer's instrumentation
# needs `-Zsanitizer`) and cargo-fuzz, built from crates.io through Cargo.
#
#   bash fuzz/setup.sh
#   cargo +nightly fuzz run pool_ops -- -max_total_time=600      # from fuzz/.. (see fuzz/README.md)
set -euo pipefail
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --version '^0.13' --locked
fi
cargo +nightly fuzz --version
