#!/usr/bin/env bash
# fio-gap-pairs.sh [--pairs N] [--out DIR] [--extra-exe NAME=PATH ...]: the fio-baseline pair
# (fio's io_uring O_DIRECT 1 MiB qd 8 job on one fallocated file, and the throughput bench's
# single direct-mode engine run, 1 GiB each), each run under scripts/qd-trace.sh, interleaved
# (the order alternates per pair). Per run DIR/<pair>-<label>.json is qd_trace.py's summary
# (io_uring writes in flight, device requests in flight and idle, thread states); then
# DIR/summary.json the per-pair ratios and medians. Take it under `flock /tmp/bench.lock`.
#
# --extra-exe NAME=PATH runs one more engine per pair, the throughput bench executable PATH
# (another build), labelled NAME; the order of all runs in a pair alternates.
# Env: CARGO_TARGET_DIR, SPILLRING_BENCH_ROOT (default /var/tmp), QD_EXTRA (default: the
#      scheduler's switch and wakeup events).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
pairs=7
out="$repo/results/fio-gap"
extras=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --pairs) pairs=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --extra-exe) extras+=("$2"); shift 2 ;;
        *) echo "fio-gap-pairs.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
exe=${SPILLRING_EXE:-$("$here/bench-exe.sh" throughput "$repo")}
root=${SPILLRING_BENCH_ROOT:-/var/tmp}
work=$(mktemp -d "$root/spillring-fiogap-XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
export QD_EXTRA=${QD_EXTRA-"sched/sched_switch sched/sched_wakeup"}
uptime > "$out/uptime-start.txt"

run_fio() {
    "$here/qd-trace.sh" "$out" "$1" -- fio --name=spillring-baseline --filename="$work/fio.bin" \
        --ioengine=io_uring --rw=write --bs=1M --iodepth=8 --direct=1 --fixedbufs=1 \
        --registerfiles=1 --size=1024M --unlink=1 --output-format=json
}
run_engine() {
    local label=$1 bin=$2
    env SPILLRING_BENCH_ROOT="$work" SPILLRING_TP_SINGLE=engine SPILLRING_TP_MODE=direct \
        SPILLRING_TP_RECORD=1048576 SPILLRING_TP_BYTES=1073741824 \
        "$here/qd-trace.sh" "$out" "$label" -- "$bin"
}
run_extras() {
    local p=$1 x
    for x in "${extras[@]}"; do
        run_engine "$p-${x%%=*}" "${x#*=}"
    done
}
for (( i = 1; i <= pairs; i++ )); do
    if (( i % 2 == 1 )); then
        run_fio "$i-fio"; run_engine "$i-engine" "$exe"; run_extras "$i"
    else
        run_extras "$i"; run_engine "$i-engine" "$exe"; run_fio "$i-fio"
    fi
    python3 - "$out" "$i" <<'EOF'
import json, sys
out, i = sys.argv[1:3]
f = json.load(open(f"{out}/{i}-fio.json")); e = json.load(open(f"{out}/{i}-engine.json"))
import glob
line = f"pair {i}: fio {f['command_mb_s']:.0f} MB/s (in flight {f['app_in_flight']['mean']}, device idle {f['device_idle_share']})"
for path in sorted(glob.glob(f"{out}/{i}-*.json")):
    name = path.rsplit("/", 1)[1][len(str(i)) + 1:-5]
    if name == "fio":
        continue
    e = json.load(open(path))
    line += (f"; {name} {e['command_mb_s']:.0f} MB/s ratio {e['command_mb_s']/f['command_mb_s']:.3f}"
             f" (in flight {e['app_in_flight']['mean']}, device idle {e['device_idle_share']})")
print(line, file=sys.stderr)
EOF
done
uptime > "$out/uptime-end.txt"
rm -f "$out"/*.stdout
python3 - "$out" "$pairs" <<'PY'
import glob, json, statistics, sys
out, pairs = sys.argv[1], int(sys.argv[2])
def load(i, name):
    return json.load(open(f"{out}/{i}-{name}.json"))
names = sorted({p.rsplit("/", 1)[1].split("-", 1)[1][:-5] for p in glob.glob(f"{out}/*-*.json")} - {"fio"})
doc = {"pairs": pairs, "runs": {}, "per_pair": []}
def spread(xs):
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4), "n": len(xs)}
for i in range(1, pairs + 1):
    f = load(i, "fio")
    row = {"pair": i, "fio_mb_s": round(f["command_mb_s"], 1), "fio_in_flight": f["app_in_flight"]["mean"],
           "fio_device_idle_share": f["device_idle_share"], "fio_window_s": f["window_s"]}
    for n in names:
        e = load(i, n)
        row[n] = {"mb_s": round(e["command_mb_s"], 1), "ratio": round(e["command_mb_s"] / f["command_mb_s"], 4),
                  "wall_s": e["command"]["wall_s"], "window_s": e["window_s"],
                  "outside_window_ms": round((e["command"]["wall_s"] - e["window_s"]) * 1e3, 1),
                  "in_flight": e["app_in_flight"]["mean"], "in_flight_8_share": e["app_in_flight"]["share_by_level"].get("8", 0),
                  "device_idle_share": e["device_idle_share"], "device_idle_ms": e["device_idle_gaps"]["sum_ms"]}
    doc["per_pair"].append(row)
rows = doc["per_pair"]
doc["fio"] = {"mb_s": spread([r["fio_mb_s"] for r in rows]), "in_flight": spread([r["fio_in_flight"] for r in rows]),
              "device_idle_share": spread([r["fio_device_idle_share"] for r in rows])}
for n in names:
    doc["runs"][n] = {k: spread([r[n][k] for r in rows]) for k in
                      ("ratio", "mb_s", "in_flight", "in_flight_8_share", "device_idle_share", "device_idle_ms", "outside_window_ms")}
json.dump(doc, open(f"{out}/summary.json", "w"), indent=1)
for n in names:
    r = doc["runs"][n]
    print(f"{n}: engine/fio {r['ratio']['median']} ({r['ratio']['min']}-{r['ratio']['max']}), in flight {r['in_flight']['median']} "
          f"(fio {doc['fio']['in_flight']['median']}), device idle {r['device_idle_share']['median']} (fio {doc['fio']['device_idle_share']['median']}), "
          f"outside window {r['outside_window_ms']['median']} ms", file=sys.stderr)
PY
