#!/usr/bin/env bash
# cpu-profile.sh [BIN_DIR] [OUT_DIR]: CPU profiles (perf record -e cpu-clock -g) of the
# direct-mode write at 1 MiB and 64 KiB records (throughput bench, profile mode) and of the
# 4 KiB spill cycle (hot_path bench, profile mode, tmpfs root), every thread of the process.
# Prints, per profile, the share of samples per thread and the top self-time symbols.
# BIN_DIR holds the bench executables `throughput` and `hot_path` (default: built here with
# scripts/bench-exe.sh). Hardware counters do not work on the VM: cpu-clock only.
set -eu  # no pipefail: `head` closes the report pipes early
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin=${1:-}
out=${2:-$(mktemp -d /tmp/spillring-cpu-profile-XXXXXX)}
secs=${SPILLRING_PROFILE_SECS:-4}
mkdir -p "$out"
exe() { if [[ -n $bin ]]; then echo "$bin/$1"; else scripts/bench-exe.sh "$1"; fi; }
prof() { # NAME BENCH WHAT
    local name=$1 bench=$2 what=$3 data="$out/$1.perf.data"
    SPILLRING_BENCH_PROFILE=$what SPILLRING_BENCH_PROFILE_SECS=$secs \
        perf record -q -e cpu-clock -F 1999 -g -o "$data" -- "$(exe "$bench")" --bench >/dev/null 2>&1
    echo "== $name ($what), $(perf report -i "$data" --stdio --sort comm 2>/dev/null | grep -m1 '^# Samples' | cut -d' ' -f3) samples of cpu-clock at 1999 Hz"
    echo "-- by thread"
    perf report -i "$data" --stdio --no-children --sort comm 2>/dev/null | grep -E '^ +[0-9.]+%' | head -8
    echo "-- top symbols (self)"
    perf report -i "$data" --stdio --no-children --sort comm,sym 2>/dev/null | grep -E '^ +[0-9.]+%' | head -15
}
prof direct-1MiB throughput engine-direct-1MiB
prof direct-64KiB throughput engine-direct-64KiB
prof cycle-4KiB hot_path engine-4KiB
prof cycle-4KiB-pool-off hot_path engine-pool-off-4KiB
echo "perf data in $out"
