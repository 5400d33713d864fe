#!/usr/bin/env bash
# tp-pairs.sh ROUNDS MODE RECORD DIR... : interleaved single runs of several builds' throughput
# bench (each DIR holds a `throughput` executable, e.g. from `scripts/ab-pairs.sh --build`), the
# order reversed every other round: SPILLRING_TP_SINGLE=engine, 512 MiB, MODE buffered|direct,
# RECORD bytes, root SPILLRING_BENCH_ROOT (default: the system temp directory). Each run is
# under `flock /tmp/bench.lock`. Prints one line per run (round, build, the bench's JSON), then
# per build its MB/s and CPU s/GiB over the first DIR's, as the median of per-round ratios
# (min-max). A follow-up to ab-pairs.sh for one figure, with more rounds and more builds.
set -euo pipefail
rounds=${1:?usage: tp-pairs.sh ROUNDS MODE RECORD DIR...}
mode=${2:?mode}
rec=${3:?record bytes}
shift 3
(($# >= 2)) || { echo "tp-pairs.sh: name two builds or more" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq 1 "$rounds"); do
    dirs=("$@")
    ((r % 2 == 0)) && mapfile -t dirs < <(printf '%s\n' "$@" | tac)
    for d in "${dirs[@]}"; do
        j=$(flock /tmp/bench.lock env SPILLRING_TP_SINGLE=engine SPILLRING_TP_MODE="$mode" \
            SPILLRING_TP_RECORD="$rec" SPILLRING_TP_BYTES=$((512 << 20)) \
            "$d/throughput" --bench 2>/dev/null | tail -1)
        echo "$r $d $j" | tee -a "$out"
    done
done
python3 - "$out" "$1" <<'PY'
import collections, json, statistics, sys
runs = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r, d, j = line.split(" ", 2)
    runs[int(r)][d] = json.loads(j)
base = sys.argv[2]
for d in next(iter(runs.values())):
    if d == base:
        continue
    for k in ("mb_s", "cpu_s_per_gib"):
        x = [runs[r][d][k] / runs[r][base][k] for r in runs]
        print(f"{d} / {base} {k}: {statistics.median(x):.3f} ({min(x):.3f}-{max(x):.3f}), "
              f"{sum(v < 1 for v in x)}/{len(x)} below 1")
PY
