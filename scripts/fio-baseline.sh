#!/usr/bin/env bash
# fio-baseline.sh: the engine's direct-mode write path against fio running the same device job.
#
# fio job (issue 4): --ioengine=io_uring --rw=write --bs=1M --iodepth=8 --direct=1
#                    --fixedbufs=1 --registerfiles=1, on one file of --size in the bench root,
#                    with fio's default --fallocate (the engine allocates each direct-mode segment
#                    up front too, so both write inside the file size).
# Engine run:        the throughput bench's single-run mode: one writer, 1 MiB records, direct
#                    mode, queue depth 8 (the default), same bytes, timed from the first write to
#                    `finish` (every write completed); no fsync on either side.
#
# The two are interleaved (fio, engine, engine, fio, ...: the order alternates per pair) and
# the figure is the median over the pairs of engine MB/s / fio MB/s. Goal: >= 0.95.
#
# --layout adds a third run to each pair: fio's same job over the engine's file layout (one file
# per 64 MiB segment, written one after the other: --nrfiles --filesize=64M
# --file_service_type=sequential, each file allocated first as fio does), so that the JSON also
# gives engine / fio-over-segments and fio-over-segments / fio: how much of the gap the layout
# alone explains.
#
# Usage: scripts/fio-baseline.sh [--pairs N (>= 5)] [--size-mib N] [--out DIR] [--quick] [--layout]
# Env:   CARGO_TARGET_DIR (as for cargo), SPILLRING_BENCH_ROOT (where files go; default $TMPDIR
#        or /tmp). Installs fio with apt-get when it is missing.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
pairs=5
size_mib=1024
out="$repo/results"
layout=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --pairs) pairs=$2; shift 2 ;;
        --size-mib) size_mib=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --quick) size_mib=256; shift ;;
        --layout) layout=1; shift ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "fio-baseline.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
if (( pairs < 5 )); then
    echo "fio-baseline.sh: need at least 5 pairs for a median (got $pairs)" >&2
    exit 2
fi

if ! command -v fio >/dev/null 2>&1; then
    echo "fio-baseline.sh: installing fio" >&2
    sudo_cmd=()
    if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
    "${sudo_cmd[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq fio >/dev/null
fi

cd "$repo"
exe=$("$here/bench-exe.sh" throughput || true)
if [[ -z "$exe" ]]; then
    echo "fio-baseline.sh: could not build the throughput bench" >&2
    exit 1
fi

root=${SPILLRING_BENCH_ROOT:-${TMPDIR:-/tmp}}
work=$(mktemp -d "$root/spillring-fio-XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
bytes=$(( size_mib * 1024 * 1024 ))
fio_args=(--name=spillring-baseline --filename="$work/fio.bin" --ioengine=io_uring --rw=write
          --bs=1M --iodepth=8 --direct=1 --fixedbufs=1 --registerfiles=1 --size="${size_mib}M"
          --unlink=1 --output-format=json)

seg_files=$(( (size_mib + 63) / 64 ))
seg_args=(--name=spillring-baseline-segments --directory="$work" --filename_format='seg.$filenum'
          --nrfiles="$seg_files" --filesize=64M --file_service_type=sequential
          --ioengine=io_uring --rw=write --bs=1M --iodepth=8 --direct=1 --fixedbufs=1
          --registerfiles=1 --size="${size_mib}M" --unlink=1 --output-format=json)

run_fio() {
    fio "$@" | python3 -c '
import json, sys
text = sys.stdin.read()
d = json.loads(text[text.index("{"):])
print(d["jobs"][0]["write"]["bw_bytes"] / 1e6)
'
}

run_engine() {
    SPILLRING_BENCH_ROOT="$work" SPILLRING_TP_SINGLE=engine SPILLRING_TP_MODE=direct \
        SPILLRING_TP_RECORD=1048576 SPILLRING_TP_BYTES="$bytes" "$exe" \
        | python3 -c 'import json, sys; print(json.loads(sys.stdin.readlines()[-1])["mb_s"])'
}

fio_mb=()
eng_mb=()
seg_mb=()
for (( i = 0; i < pairs; i++ )); do
    g=0
    if (( i % 2 == 0 )); then
        f=$(run_fio "${fio_args[@]}")
        if (( layout )); then g=$(run_fio "${seg_args[@]}"); fi
        e=$(run_engine)
    else
        e=$(run_engine)
        if (( layout )); then g=$(run_fio "${seg_args[@]}"); fi
        f=$(run_fio "${fio_args[@]}")
    fi
    fio_mb+=("$f"); eng_mb+=("$e"); seg_mb+=("$g")
    printf 'fio-baseline: pair %d  fio %8.1f MB/s  engine %8.1f MB/s  fio over segments %8.1f MB/s\n' \
        "$((i + 1))" "$f" "$e" "$g" >&2
done

python3 - "$out/fio-baseline.json" "$size_mib" "$(fio --version)" "${fio_args[*]}" \
    "${fio_mb[*]}" "${eng_mb[*]}" "${seg_mb[*]}" "${seg_args[*]}" <<'EOF'
import json, statistics, sys
path, size_mib, fio_version, fio_cmd, fio_s, eng_s, seg_s, seg_cmd = sys.argv[1:9]
fio = [float(x) for x in fio_s.split()]
eng = [float(x) for x in eng_s.split()]
seg = [float(x) for x in seg_s.split()]
ratios = [e / f for e, f in zip(eng, fio)]
goal = 0.95
ratio = statistics.median(ratios)
doc = {
    "bench": "fio_baseline",
    "what": "engine direct-mode write (1 MiB records, queue depth 8) vs fio's identical io_uring job, interleaved pairs",
    "size_mib": int(size_mib),
    "fio_version": fio_version,
    "fio_command": "fio " + fio_cmd,
    "engine_command": "SPILLRING_TP_SINGLE=engine SPILLRING_TP_MODE=direct SPILLRING_TP_RECORD=1048576 <throughput bench>",
    "pairs": [{"fio_mb_s": f, "engine_mb_s": e, "ratio": e / f} for f, e in zip(fio, eng)],
    "fio_mb_s_median": statistics.median(fio),
    "engine_mb_s_median": statistics.median(eng),
    "ratio_median": ratio,
    "goal_ratio_min": goal,
    "met": ratio >= goal,
}
if any(seg):
    def spread(xs):
        return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}
    doc["fio_segments_command"] = "fio " + seg_cmd
    for p, g in zip(doc["pairs"], seg):
        p["fio_segments_mb_s"] = g
    doc["engine_over_fio_segments"] = spread([e / g for e, g in zip(eng, seg)])
    doc["fio_segments_over_fio"] = spread([g / f for g, f in zip(seg, fio)])
with open(path, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
print(f"fio-baseline: engine/fio = {ratio:.3f} (median of {len(ratios)} pairs; goal >= {goal}) -> {path}", file=sys.stderr)
EOF
