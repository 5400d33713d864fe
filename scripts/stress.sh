#!/usr/bin/env bash
# The standard loadgen stress + crash set. Builds loadgen (release), runs five stress runs and
# one crash series, and writes results/loadgen.json (every report, merged) and
# results/LOADGEN.md (the figures, the command, the commit and the machine).
#
#   scripts/stress.sh            # about 2.5 minutes on 2 cores
#   SEED=42 scripts/stress.sh    # another seed (the default makes runs comparable)
#
# Exits non-zero if any run found a violation (a leak, a wrong record, a wrong error).
set -euo pipefail
cd "$(dirname "$0")/.."

SEED="${SEED:-20261129}"
target="${CARGO_TARGET_DIR:-target}"
cargo build --release -p loadgen
bin="$target/release/loadgen"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

status=0
step() {
  local name="$1"
  shift
  echo
  echo "== $name: loadgen $*"
  if ! "$bin" "$@" --name "$name" --report "$out/$(printf '%02d' "$n")-$name.json" --progress plain; then
    echo "== $name FAILED"
    status=1
  fi
  n=$((n + 1))
}
n=1
# 1. The README's command: defaults (30 s, 8 tasks, every abort point at 25%, 1% faults).
step default run --seed "$SEED"
# 2. Heavy faults and aborts: 30% of create/write/unlink calls fail (EIO, ENOSPC, ambiguous).
step faults-0.3 run --seed "$SEED" --duration 20 --abort-rate 0.3 --fault-rate 0.3
# 3. O_DIRECT writes.
step direct run --seed "$SEED" --duration 20 --mode direct --abort-rate 0.3 --fault-rate 0.05
# 4. The psync backend (the io_uring fallback), over three roots with preallocated segments.
step psync-3-roots run --seed "$SEED" --duration 15 --backend psync --roots 3 --preallocate \
  --abort-rate 0.3 --fault-rate 0.05
# 5. Admission pressure: 16 tasks share 24 tickets and a 48 MiB quota.
step admission run --seed "$SEED" --duration 15 --tasks 16 --ticket-capacity 24 \
  --max-spill-bytes 48MiB --abort-rate 0.3 --fault-rate 0.01
# 6. Crashes: 10 children SIGKILLed with files on disk (two roots); each next open must sweep
#    them, and a bystander engine's live spill must survive every sweep.
step crash crash --seed "$SEED" --kills 10 --roots 2 --abort-rate 0.3 --fault-rate 0.05

mkdir -p results
"$bin" summarize --command "scripts/stress.sh (SEED=$SEED)" \
  --json results/loadgen.json --markdown results/LOADGEN.md "$out"/*.json || status=1
echo
echo "wrote results/loadgen.json and results/LOADGEN.md"
exit "$status"
