#!/usr/bin/env bash
# Runs each fuzz target in turn for SECONDS seconds (default 660) at the lowest priority, then
# minimises its corpus (`cargo fuzz cmin`). Logs go to fuzz/logs/<target>.log; the last status
# line of each run (executions, exec/s, corpus) is printed.
#
#   bash fuzz/setup.sh && bash fuzz/run-all.sh [SECONDS] [TARGET...]
set -uo pipefail
cd "$(dirname "$0")"
seconds=${1:-660}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(pool_ops heap_ops layout torch_abi csv_log)
mkdir -p logs
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  nice -n 19 cargo +nightly fuzz run "$t" "corpus/$t" -- \
    -max_total_time="$seconds" -max_len=4096 -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 \
    > "logs/$t.log" 2>&1
  rc=$?
  before=$(ls "corpus/$t" | wc -l)
  nice -n 19 cargo +nightly fuzz cmin "$t" "corpus/$t" -- -max_len=4096 > "logs/$t.cmin.log" 2>&1
  after=$(ls "corpus/$t" | wc -l)
  echo "$t: rc=$rc $(grep -E '^#[0-9]+' "logs/$t.log" | tail -1)"
  echo "$t: corpus $before inputs -> $after after cmin, $(du -sk "corpus/$t" | cut -f1) KiB"
  grep -E 'stat::' "logs/$t.log" | tr '\n' ' '; echo
  ls artifacts/"$t" 2>/dev/null | sed "s/^/$t: artifact /"
done
