#!/usr/bin/env bash
# The yielding bench (issue 24, point 3): a current_thread runtime, a 1 ms timer beside a task
# that spills and reads back 768 MiB with write_async / next_record_async, yielding on and
# off; prints the JSON (timer lateness against the idle run, throughput on/off, goals).
# Run it on a quiet machine: it times a timer to the millisecond.
#
#   scripts/yielding.sh                       # 768 MiB, 64 KiB records, 3 repetitions
#   SPILLRING_YIELD_MIB=128 SPILLRING_YIELD_REPS=1 scripts/yielding.sh   # a short look
#
# SPILLRING_BENCH_ROOT picks the disk (default: the system temp directory);
# SPILLRING_YIELD_RECORD the record size; the JSON also goes to SPILLRING_BENCH_OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench -p spillring-benches --bench yielding --no-run
exec cargo bench -p spillring-benches --bench yielding -- --bench
