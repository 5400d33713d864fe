#!/usr/bin/env bash
# Model-checks the engine's concurrent protocols with loom.
#
# What it runs: the `loom_*` unit tests of the spillring crate, built with `--cfg loom` (which
# puts loom's atomics, mutex and condvar behind engine/src/sync.rs) in release mode, in a target
# dir of their own (target/loom, so the normal build is not invalidated). Each model runs the
# engine's own code for its protocol in every interleaving loom explores:
#
#   loom_abortable_files_*  spill/writer/hook.rs   the abort flag against the file list (invariant 2)
#   loom_grants_*           spill/grant.rs (models in grant_loom.rs) grant release and publish against scope close

#   loom_lane_gate_*        io/lane.rs  submitters against a lane's close
#   loom_op_slot_*          io/op.rs    a writer taking its queued write back against the I/O thread
#   loom_handoff_*          io/handoff.rs (models in handoff_loom.rs) a push against a parking
#                           consumer and against the last consumer's exit (the channel itself
#                           is a stand-in: loom cannot see into crossbeam's)
#   loom_sleep_wake_*       io/uring/wake.rs the ring thread's sleep/wake handshake
#   loom_ledger_*           store/ledger.rs ticket reserve/grow/shrink/retain/release (1, 3)
#   loom_worker_batch_*     cleanup/worker.rs a batch's outcomes reach the worker, each at its name (4)
#
# Bounds (LOOM_MAX_PREEMPTIONS): the abort list, the grants, the directory count and the batch are
# explored exhaustively; the lane gate, the sleep/wake handshake, the op slot and the handoff queue
# with at most 5 preemptions per execution (the handoff models: 6 s; 75 s unbounded), the ledger
# with at most 3 (at 4 it takes over 3 minutes alone).
#
# How long, on the 2-core machine (measured while it ran other builds too): about 2 minutes
# from an empty target/loom (80 s of it building), under 40 s once built.
#
# Usage: scripts/loom.sh            (exits non-zero if any model fails or a model is missing)
set -euo pipefail
cd "$(dirname "$0")/.."

export RUSTFLAGS="${RUSTFLAGS:-} --cfg loom"
export CARGO_TARGET_DIR="target/loom"

cargo test -p spillring --lib --release --no-run

# run BOUND FILTER...: runs the models matching the filters with at most BOUND preemptions
# ("-": exhaustive), and fails unless each filter matched a test.
run() {
    local bound=$1
    shift
    local out
    out=$(mktemp)
    if [[ $bound == - ]]; then
        env -u LOOM_MAX_PREEMPTIONS cargo test -p spillring --lib --release -- "$@" |
            tee "$out"
    else
        LOOM_MAX_PREEMPTIONS=$bound cargo test -p spillring --lib --release -- "$@" |
            tee "$out"
    fi
    local f
    for f in "$@"; do
        if ! grep -q "^test .*::${f}.* ok$" "$out"; then
            echo "loom.sh: no model matched ${f}" >&2
            rm -f "$out"
            return 1
        fi
    done
    rm -f "$out"
}

start=$SECONDS
run - loom_abortable_files loom_grants loom_worker_batch
run 5 loom_lane_gate loom_sleep_wake loom_op_slot loom_handoff
run 3 loom_ledger
echo "loom.sh: every model passed in $((SECONDS - start)) s"
