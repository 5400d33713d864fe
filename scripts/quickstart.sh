#!/usr/bin/env bash
# Runs the quickstart (1 GiB spilled and read back in buffered and direct mode, next to a
# std::fs write_all + fsync loop of the same data, the three interleaved over --rounds rounds
# in the same run) and writes results/QUICKSTART.md with the command, the commit and the machine.
#   scripts/quickstart.sh [--out FILE] [quickstart args, e.g. --gib 2 --record-kib 256 --rounds 5]
#   --out FILE   where the markdown goes (default results/QUICKSTART.md)
set -euo pipefail
cd "$(dirname "$0")/.."
out=results/QUICKSTART.md
if [[ ${1:-} == --out ]]; then
    out=$2
    shift 2
fi
mkdir -p "$(dirname "$out")"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build -q --release --example quickstart
output=$("$CARGO_TARGET_DIR/release/examples/quickstart" "$@")
commit=$(git rev-parse HEAD)
[[ -n $(git status --porcelain) ]] && commit="$commit (with uncommitted changes)"
{
  echo "# quickstart"
  echo
  echo "Written by \`scripts/quickstart.sh $*\`; rerun it to refresh."
  echo
  echo "- command: \`cargo run --release --example quickstart -- $*\`"
  echo "- commit: \`$commit\`"
  echo "- machine: $(uname -srm), $(nproc) cores, $(df -T "${TMPDIR:-/tmp}" | awk 'NR==2 {print $2}') temp dir"
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo '```text'
  echo "$output"
  echo '```'
  echo
  echo "Each write figure includes an fsync of what was written (\`sync_data\` of every segment for"
  echo "the engine), so both sides are measured to the device. Each round runs the three writers in"
  echo "turn (the first one rotating from round to round), and the summary lines are medians of the"
  echo "per-round engine / std::fs ratios with their min-max: the host's disk is shared and noisy, so"
  echo "only ratios within one round mean anything."
} > "$out"
cat "$out"
