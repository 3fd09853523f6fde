#!/usr/bin/env bash
# The unsafe code that host tests reach, under Miri: the pool's lock and thread heaps (raw
# pointers to a thread's heaps, another thread's frees, the spare headroom's atomics), pool
# slices over host memory shared between threads, the TLSF's unchecked indexing, host arenas
# and their views, `DynArena`. Miri checks every access for undefined behaviour and data
# races, and fails weak compare-exchanges spuriously, as load-linked/store-conditional CPUs
# may.
#
# Needs a nightly toolchain with Miri (`rustup +nightly component add miri`), so it is not
# part of `.ci/run`. Loops that run tens of thousands of steps run a hundredth of them under
# Miri (`test_iterations`, `cfg!(miri)`); the planner (safe code) and the property tests are
# left out as too long there. Takes about 45 minutes on two cores.
#
#   bash scripts/miri.sh            # everything below
#   bash scripts/miri.sh pool::lock # the library's own tests whose names contain a filter
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/miri}"
# Isolation off: the pool's event log reads the wall clock and the CSV log writes a file.
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-disable-isolation}"
miri() { cargo +nightly miri test "$@"; }

if [ $# -gt 0 ]; then
    miri -p devarena --lib -- "$@"
    exit
fi

miri -p devarena --lib -- pool:: dyn_arena::
miri -p devarena-tests --test host_arena -- --skip pipeline_frame_views_hold_distinct_patterns
miri -p devarena-tests --test dyn_arena

# Tests whose callbacks hold a handle of the pool that holds them (a sink, a stream runtime, a
# log's writer): a cycle of the test's own making, which Miri reports as a leak.
CYCLES=(
    a_sink_that_calls_back_into_the_pool_works
    a_stream_runtime_that_calls_back_gets_an_error_instead_of_a_hang
    a_stream_runtime_that_panics_gives_errors_and_changes_nothing
    an_event_that_cannot_be_queried_sets_aside_only_its_block
    rows_a_writer_causes_while_writing_deferred_rows_are_written
    the_csv_logs_writer_may_use_a_pool_that_logs_there_too
)
skips=()
for t in "${CYCLES[@]}"; do skips+=(--skip "$t"); done
# Too long under Miri: property tests, and tests that wait for threads with a deadline.
LONG=(
    --skip random_sequences
    --skip the_csv_log_under_threads_keeps_every_row_in_order
    --skip events_from_many_threads_arrive_in_the_pools_order
)
miri -p devarena --test pool -- "${LONG[@]}" "${skips[@]}"
miri -p devarena --test pool_callbacks -- "${LONG[@]}" "${skips[@]}"
only=()
for t in "${CYCLES[@]}"; do only+=("$t"); done
MIRIFLAGS="$MIRIFLAGS -Zmiri-ignore-leaks" miri -p devarena --test pool -- "${only[@]}"
MIRIFLAGS="$MIRIFLAGS -Zmiri-ignore-leaks" miri -p devarena --test pool_callbacks -- "${only[@]}"
# Thread heaps under threads: other threads' frees, heaps given back at thread exit and while
# the pool looks at them, leases passed between heaps. Left out as too long there: the
# million-operation model checks, the model checks of one thread, the storms, and five tests
# that loop over thousands of requests.
THREADS_LONG=(
    --skip four_threads_
    --skip _matches_the_model_exactly
    --skip storm
    --skip bytes_in_an_idle_threads_heap_count_for_the_cap_and_the_quotas
    --skip peaks_that_count_leases_are_bounds_and_every_other_count_stays_exact
    --skip the_event_log_sees_every_allocation_of_every_heap_in_order
    --skip trim_gives_every_heap_back_and_keeps_what_live_blocks_touch
    --skip without_reuse_and_without_heaps
)
# Its scoped threads give their heaps back in thread-local destructors after the scope's join,
# which Miri reports as threads still running when the test ends.
JOINED_LATE=statistics_leave_every_heap_as_it_is_and_describe_it_as_given_back
miri -p devarena --test pool_threads -- "${THREADS_LONG[@]}" --skip "$JOINED_LATE"
MIRIFLAGS="$MIRIFLAGS -Zmiri-ignore-leaks" miri -p devarena --test pool_threads -- "$JOINED_LATE"
echo "miri: every selected test passed"
