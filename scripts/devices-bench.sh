#!/usr/bin/env bash
# devices-bench.sh: the engine on throttled devices (scripts/slowdev.sh), against fio and
# against itself, in interleaved pairs. Two sections:
#
#   devices  (issue 27) 1, 2 and 4 loop devices, each writing at most --mbps MB/s (direct
#            I/O). Per device count N, pairs of: fio with N jobs, one per device (io_uring,
#            1 MiB writes, iodepth 8, direct, --gib-per-device each), and one engine whose roots
#            are the same N devices, 2 writers per root, the same bytes in 1 MiB random records,
#            direct mode. The pair's order alternates. Figures: the engine's MB/s over N x the
#            N=1 fio median (the devices' bandwidth), and engine / fio per pair.
#   codec    (issue 26) one device at --codec-mbps MB/s (default 200): `Auto` against `None`
#            on lineitem rows and on random 1 MiB records, direct mode, 2 writers; and the same
#            random pair on the fast disk (the root under $SPILLRING_BENCH_ROOT or /var/tmp,
#            not throttled). Each pair's order alternates. The device's filesystem is
#            --codec-size-gib (default 16, a sparse image): with room to spare, `Auto` chooses
#            for time (the device's speed); on a small one (--codec-size-gib 3: a 1 GiB spill
#            is a third of it) its space policy engages too (spill/writer/codec.rs).
#   quota    (issue 26) lineitem rows with `Auto` under a quota (max_spill_bytes) of half
#            their logical bytes, on the fast disk, --pairs runs: does the spill fit, and in
#            how much of its logical size.
#   mixed    (issue 27, point 2) two devices of different speeds (--mbps and --slow-mbps,
#            default 25): per pair, fio on each device alone (their bandwidths, summed), then
#            one engine over both, 4 writers, 2 x --gib-per-device of 1 MiB random records,
#            direct mode; and, with --baseline-exe (a devices bench built at another commit),
#            that engine too, the order alternating. Figures: engine MB/s over the sum of the
#            two devices' fio MB/s, and engine / baseline per pair.
#
# Usage: scripts/devices-bench.sh [--section devices|codec|quota|mixed|all] [--pairs N (>= 5)]
#                                 [--mbps M] [--slow-mbps M] [--codec-mbps M]
#                                 [--gib-per-device G] [--codec-size-gib G] [--counts "1 2 4"] [--quick]
#                                 [--baseline-exe PATH] [--out DIR]
#   --quick: 3 pairs of 256 MiB per device (a smoke run; its medians are not a report).
# Writes DIR/devices.json and DIR/DEVICES.md (DIR defaults to results/). Needs root (the rig);
# installs fio with apt-get when it is missing. Takes about 12 minutes with the defaults.
set -euo pipefail

given="$*"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
section=all
pairs=5
mbps=100
codec_mbps=200
codec_size_gib=16
gib=1
counts="1 2 4"
slow_mbps=25
baseline_exe=
out="$repo/results"
quick=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --section) section=$2; shift 2 ;;
        --pairs) pairs=$2; shift 2 ;;
        --mbps) mbps=$2; shift 2 ;;
        --codec-mbps) codec_mbps=$2; shift 2 ;;
        --slow-mbps) slow_mbps=$2; shift 2 ;;
        --baseline-exe) baseline_exe=$2; shift 2 ;;
        --gib-per-device) gib=$2; shift 2 ;;
        --codec-size-gib) codec_size_gib=$2; shift 2 ;;
        --counts) counts=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --quick) quick=1; pairs=3; shift ;;
        -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
        *) echo "devices-bench.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
if (( pairs < 5 && quick == 0 )); then
    echo "devices-bench.sh: need at least 5 pairs for a median (got $pairs)" >&2
    exit 2
fi
case "$section" in devices|codec|quota|mixed|all) ;; *) echo "devices-bench.sh: --section devices, codec, quota, mixed or all" >&2; exit 2 ;; esac
bytes_per_dev=$(( gib << 30 ))
(( quick )) && bytes_per_dev=$(( 256 << 20 ))

if ! command -v fio >/dev/null 2>&1; then
    echo "devices-bench.sh: installing fio" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio >/dev/null
fi

cd "$repo"
# The commit the binaries are built from (the tree may change while the bench runs).
commit="$(git -C "$repo" rev-parse --short HEAD)$(git -C "$repo" diff --quiet HEAD -- . ':!results' || echo '+dirty')"
exe=$("$here/bench-exe.sh" devices || true)
[[ -n "$exe" ]] || { echo "devices-bench.sh: could not build the devices bench" >&2; exit 1; }

slow="$here/slowdev.sh"
log=$(mktemp -d /tmp/spillring-devices-XXXXXX)
trap '"$slow" down; rm -rf "$log"' EXIT
max_n=1
for n in $counts; do (( n > max_n )) && max_n=$n; done

# fio over the first N mounts (or over mount FIRST alone), one job per device, SIZE bytes each
# (default: --gib-per-device); prints one JSON line.
run_fio() {
    local n=$1 first=${2:-0} size=${3:-$bytes_per_dev} args=() i
    mapfile -t mounts < <("$slow" mounts)
    for (( i = first; i < first + n; i++ )); do
        args+=(--name="dev$i" --filename="${mounts[$i]}/fio.bin")
    done
    "$slow" run fio --ioengine=io_uring --rw=write --bs=1M --iodepth=8 --direct=1 \
        --fixedbufs=1 --registerfiles=1 --size="$size" --unlink=1 --group_reporting \
        --output-format=json "${args[@]}" | python3 -c '
import json, sys
t = sys.stdin.read()
d = json.loads(t[t.index("{"):])
w = d["jobs"][0]["write"]
print(json.dumps({"impl": "fio", "mb_s": w["bw_bytes"] / 1e6, "bytes": w["io_bytes"]}))
'
}

# The engine over the first N mounts (or the given roots); extra env as NAME=VALUE arguments.
# ENGINE_EXE (default: this tree's bench) is the binary.
run_engine() {
    local roots=$1 throttled=$2; shift 2
    local cmd=(env SPILLRING_DEV_ROOTS="$roots" "$@" "${ENGINE_EXE:-$exe}")
    if (( throttled )); then "$slow" run "${cmd[@]}"; else "${cmd[@]}"; fi | tail -1
}

roots_of() {
    mapfile -t mounts < <("$slow" mounts)
    local IFS=:
    echo "${mounts[*]:0:$1}"
}

: > "$log/runs.jsonl"
record() { # section, n, pair, side, json
    python3 -c 'import json, sys; d = json.loads(sys.argv[5]); d.update(section=sys.argv[1], n=int(sys.argv[2]), pair=int(sys.argv[3]), side=sys.argv[4]); print(json.dumps(d))' \
        "$@" >> "$log/runs.jsonl"
}

if [[ $section == devices || $section == all ]]; then
    "$slow" up --devices "$max_n" --mbps "$mbps" --size-gib $(( gib * 2 + 1 )) >/dev/null
    for n in $counts; do
        roots=$(roots_of "$n")
        for (( p = 0; p < pairs; p++ )); do
            for side in $( (( p % 2 == 0 )) && echo "fio engine" || echo "engine fio"); do
                if [[ $side == fio ]]; then
                    j=$(run_fio "$n")
                else
                    j=$(run_engine "$roots" 1 SPILLRING_DEV_BYTES=$(( bytes_per_dev * n )) \
                        SPILLRING_DEV_WRITERS=$(( 2 * n )))
                fi
                record devices "$n" "$p" "$side" "$j"
                echo "devices: N=$n pair $((p + 1)) $side $(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(round(d.get("logical_mb_s", d.get("mb_s")), 1), "MB/s")' "$j")" >&2
            done
        done
    done
    "$slow" down
fi

if [[ $section == codec || $section == all ]]; then
    "$slow" up --devices 1 --mbps "$codec_mbps" --size-gib "$codec_size_gib" >/dev/null
    slow_root=$(roots_of 1)
    fast_root=$(mktemp -d "${SPILLRING_BENCH_ROOT:-/var/tmp}/spillring-devices-fast-XXXXXX")
    for where in slow fast; do
        for data in lineitem random; do
            [[ $where == fast && $data == lineitem ]] && continue
            root=$slow_root; thr=1
            [[ $where == fast ]] && { root=$fast_root; thr=0; }
            for (( p = 0; p < pairs; p++ )); do
                for c in $( (( p % 2 == 0 )) && echo "none auto" || echo "auto none"); do
                    j=$(run_engine "$root" "$thr" SPILLRING_DEV_BYTES="$bytes_per_dev" \
                        SPILLRING_DEV_WRITERS=2 SPILLRING_DEV_DATA="$data" SPILLRING_DEV_COMPRESSION="$c")
                    record "codec-$where-$data" 1 "$p" "$c" "$j"
                    echo "codec: $where $data pair $((p + 1)) $c $(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(round(d["logical_mb_s"], 1), "MB/s, physical/logical", round(d["physical_per_logical"], 3))' "$j")" >&2
                done
            done
        done
    done
    rm -rf "$fast_root"
    "$slow" down
fi

if [[ $section == quota || $section == all ]]; then
    qroot=$(mktemp -d "${SPILLRING_BENCH_ROOT:-/var/tmp}/spillring-devices-quota-XXXXXX")
    for (( p = 0; p < pairs; p++ )); do
        j=$(run_engine "$qroot" 0 SPILLRING_DEV_BYTES="$bytes_per_dev" SPILLRING_DEV_WRITERS=2 \
            SPILLRING_DEV_DATA=lineitem SPILLRING_DEV_COMPRESSION=auto \
            SPILLRING_DEV_QUOTA=$(( bytes_per_dev / 2 )))
        record quota 1 "$p" auto "$j"
        echo "quota: run $((p + 1)) $(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print("error:", d["error"]) if d["error"] else print(round(d["logical_mb_s"], 1), "MB/s, physical/logical", round(d["physical_per_logical"], 3))' "$j")" >&2
    done
    rm -rf "$qroot"
fi

if [[ $section == mixed || $section == all ]]; then
    "$slow" up --devices 2 --mbps "$mbps,$slow_mbps" --size-gib $(( gib * 2 + 1 )) >/dev/null
    roots=$(roots_of 2)
    sides="engine"
    [[ -n $baseline_exe ]] && sides="engine baseline"
    for (( p = 0; p < pairs; p++ )); do
        # Each device's bandwidth alone, as fio gets it (a quarter of a run's bytes each).
        for d in 0 1; do
            j=$(run_fio 1 "$d" $(( bytes_per_dev / 4 )))
            record mixed 2 "$p" "fio$d" "$j"
        done
        order=$sides
        (( p % 2 == 1 )) && order=$(echo "$sides" | tr ' ' '\n' | tac | tr '\n' ' ')
        for side in $order; do
            e=$exe
            [[ $side == baseline ]] && e=$baseline_exe
            j=$(ENGINE_EXE=$e run_engine "$roots" 1 SPILLRING_DEV_BYTES=$(( bytes_per_dev * 2 )) \
                SPILLRING_DEV_WRITERS=4)
            record mixed 2 "$p" "$side" "$j"
            echo "mixed: pair $((p + 1)) $side $(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(round(d["logical_mb_s"], 1), "MB/s, files per root", d["files_per_root"])' "$j")" >&2
        done
    done
    "$slow" down
fi

mkdir -p "$out"
python3 "$here/devices_report.py" "$log/runs.jsonl" "$out" \
    --command "scripts/devices-bench.sh $given" --mbps "$mbps" --codec-mbps "$codec_mbps" \
    --codec-size-gib "$codec_size_gib" \
    --slow-mbps "$slow_mbps" \
    --bytes-per-device "$bytes_per_dev" --commit "$commit" \
    --fio "$(fio --version)"
