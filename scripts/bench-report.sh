#!/usr/bin/env bash
# bench-report.sh: one command for the whole performance story (issues 4 and 10).
#
# Runs every bench of the spillring-benches crate (`cargo bench -p spillring-benches`: capacity,
# hot_path, throughput, ledger, cleanup, repeat, overlap, codec, and any bench added to
# benches/Cargo.toml), pairs the engine with fio (scripts/fio-baseline.sh), profiles the engine
# path of the worst missed goal of each profile slot with `perf record -e cpu-clock`, and writes
# into the output directory:
#   every bench's JSON (capacity.json hot-path.json throughput.json ledger.json cleanup.json
#   repeat.json overlap.json fio-baseline.json ...) with provenance and its verdicts,
#   REPORT.md (the goal table: every goal with its verdict, or "not measured" when its bench did
#   not run; commit, machine, command) and SVG plots.
# Verdicts come from one place, the GOALS table of scripts/bench_report.py. The benches open
# their engines with an explicit backend (io_uring; SPILLRING_BENCH_BACKEND=psync to measure
# psync on purpose) and fail rather than report a fallback.
#
# Usage: scripts/bench-report.sh [--quick] [--out DIR] [--no-fio] [--no-profile]
#   --quick       CI-sized smoke run (small volumes, few samples, ~3-8 minutes). Writes to
#                 $CARGO_TARGET_DIR/spillring-bench/quick-results unless --out is given, so it
#                 never overwrites the checked-in results/.
#   --out DIR     output directory (default: results/ for a full run)
# Env: CARGO_TARGET_DIR (default target/), SPILLRING_BENCH_ROOT (where spill files go; default
#      the system temp directory; must support O_DIRECT for the direct-mode runs),
#      SPILLRING_BENCH_BACKEND (uring, the default, or psync).
# Needs python3 with matplotlib (the plots); installs it from PyPI with pip when it is missing.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
cd "$repo"
command_line="scripts/bench-report.sh${*:+ $*}"

quick=0
out=""
fio=1
profile=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --quick) quick=1; shift ;;
        --out) out=$2; shift 2 ;;
        --no-fio) fio=0; shift ;;
        --no-profile) profile=0; shift ;;
        -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
        *) echo "bench-report.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

# The plots are drawn with matplotlib. Install it before the benches run, so a missing one
# fails in seconds rather than after the whole bench run.
if ! python3 -c 'import matplotlib' 2>/dev/null; then
    echo "bench-report: matplotlib is missing; python3 -m pip install --quiet matplotlib" >&2
    if ! python3 -m pip install --quiet matplotlib || ! python3 -c 'import matplotlib'; then
        echo "bench-report: could not install matplotlib for $(command -v python3)" \
            "(needs pip and PyPI; on a Debian system python3: apt-get install python3-matplotlib)" >&2
        exit 1
    fi
fi

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$repo/target}
if [[ -z "$out" ]]; then
    if (( quick )); then out="$CARGO_TARGET_DIR/spillring-bench/quick-results"; else out="$repo/results"; fi
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
raw="$CARGO_TARGET_DIR/spillring-bench/raw"
rm -rf "$raw"
mkdir -p "$raw"
export SPILLRING_BENCH_OUT="$raw"
export SPILLRING_BENCH_QUICK=$quick

start=$(date +%s)
echo "bench-report: cargo bench (quick=$quick), raw results in $raw" >&2
set +e
cargo bench -p spillring-benches 2>&1 | tee "$raw/cargo-bench.log" \
    | { grep -E '^(capacity|hot_path|throughput round|cleanup|repeat|overlap|scale|async_poll|codec round|spillring-bench|error)|time:|panicked' >&2 || true; }
status=${PIPESTATUS[0]}
set -e
if (( status != 0 )); then
    echo "bench-report: cargo bench failed ($status); the end of its log:" >&2
    tail -40 "$raw/cargo-bench.log" >&2
    exit "$status"
fi

if (( fio )); then
    fio_args=(--out "$raw")
    if (( quick )); then fio_args+=(--quick); fi
    "$here/fio-baseline.sh" "${fio_args[@]}"
fi

report_args=(--raw "$raw" --out "$out" --command "$command_line" --target-dir "$CARGO_TARGET_DIR")
if (( quick )); then report_args+=(--quick --profile-secs 1); fi
if (( ! profile )); then report_args+=(--no-profile); fi
python3 "$here/bench_report.py" "${report_args[@]}"
echo "bench-report: done in $(( $(date +%s) - start )) s; see $out/REPORT.md" >&2
