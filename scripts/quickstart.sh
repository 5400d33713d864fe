#!/usr/bin/env bash
# Runs the quickstart (1 GiB spilled and read back in buffered and direct mode, next to a
# std::fs write_all + fsync loop of the same data in the same run) and writes
# results/QUICKSTART.md with the command, the commit and the machine.
#   scripts/quickstart.sh [quickstart args, e.g. --gib 2 --record-kib 256]
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p results
cargo build -q --release --example quickstart
out=$(target/release/examples/quickstart "$@")
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
  echo "$out"
  echo '```'
  echo
  echo "Each write figure includes an fsync of what was written (\`sync_data\` of every segment for"
  echo "the engine), so both sides are measured to the device. The host's disk is shared and noisy:"
  echo "compare within one run only."
} > results/QUICKSTART.md
cat results/QUICKSTART.md
