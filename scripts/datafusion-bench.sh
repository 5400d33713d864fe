#!/usr/bin/env bash
# DataFusion's spilling queries with its default temp files against spillring (issue 23):
# ORDER BY, a high-cardinality GROUP BY and a repartition over ~1 GiB of lineitem rows, each
# backend in its own child process, interleaved over --pairs rounds; then the files left after
# a cancel and after a kill. Run twice: as is, and inside a cgroup v1 memory cgroup too small
# for the page cache to hold the spill (as root). Writes results/datafusion.json,
# results/datafusion-cgroup.json and results/DATAFUSION.md (scripts/datafusion_report.py).
#
#   scripts/datafusion-bench.sh [--pairs N] [--mib N] [--cgroup-mib N] [--out DIR] [--no-cgroup]
#
# Defaults: 5 pairs, 1024 MiB of input, a cgroup of input + 1 GiB (the input table, the
# pool, DataFusion's working memory; what is left for the page cache is less than the spill).
# The spill roots go under SPILL_DIR (default /var/tmp, the disk; not tmpfs).
set -euo pipefail
cd "$(dirname "$0")/.."

pairs=5 mib=1024 cgroup_mib= out=results cgroup=1
while (($#)); do
  case "$1" in
    --pairs) pairs=$2; shift 2 ;;
    --mib) mib=$2; shift 2 ;;
    --cgroup-mib) cgroup_mib=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-cgroup) cgroup=; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
cgroup_mib=${cgroup_mib:-$((mib + 1024))}
mkdir -p "$out"
spill_dir=${SPILL_DIR:-/var/tmp}
work=$(mktemp -d "$spill_dir/spillring-df-bench.XXXXXX")
cg=spillring-df-bench-$$
cleanup() {
  rm -rf "$work"
  if [[ -d /sys/fs/cgroup/memory/$cg ]]; then
    # Move anything left back to the root cgroup, then remove it.
    while read -r p; do echo "$p" >/sys/fs/cgroup/memory/cgroup.procs 2>/dev/null || true; done \
      </sys/fs/cgroup/memory/$cg/cgroup.procs
    rmdir /sys/fs/cgroup/memory/$cg || true
  fi
}
trap cleanup EXIT

echo "== building the bench (release)"
cargo bench -p spillring-datafusion --bench datafusion_spill --no-run
bin=$(ls -t target/release/deps/datafusion_spill-* | grep -v '\.d$' | head -1)
data="$work/lineitem-$mib.arrow"
"$bin" gen --data "$data" --mib "$mib"

commit=$(git rev-parse --short HEAD)
started=$(date -u +%FT%TZ)
echo "== run 1: no memory cgroup"
"$bin" all --data "$data" --root "$work/roots" --mib "$mib" --pairs "$pairs" \
  --out "$out/datafusion.json"
if [[ -n $cgroup ]]; then
  echo "== run 2: inside a memory cgroup of $cgroup_mib MiB"
  mkdir /sys/fs/cgroup/memory/$cg
  echo $((cgroup_mib << 20)) >/sys/fs/cgroup/memory/$cg/memory.limit_in_bytes
  "$bin" all --data "$data" --root "$work/roots" --mib "$mib" --pairs "$pairs" \
    --cgroup "$cg" --out "$out/datafusion-cgroup.json"
fi
finished=$(date -u +%FT%TZ)
python3 scripts/datafusion_report.py --out "$out/DATAFUSION.md" \
  --command "scripts/datafusion-bench.sh --pairs $pairs --mib $mib --cgroup-mib $cgroup_mib" \
  --commit "$commit" --started "$started" --finished "$finished" \
  "$out/datafusion.json" ${cgroup:+"$out/datafusion-cgroup.json"}
echo "wrote $out/DATAFUSION.md"
