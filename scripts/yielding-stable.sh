#!/usr/bin/env bash
# yielding-stable.sh FIRST LAST [OUT]: the yielding bench's throughput on/off pairs on a RAM
# device (results/YIELDING.md, last section). Runs `scripts/yielding.sh --ram-device 2048`
# once per number FIRST..LAST (each: SPILLRING_YIELD_WARMUP=2 untimed repetitions, then
# SPILLRING_YIELD_REPS=12 pairs per mode, each after an untimed run of its mode:
# SPILLRING_YIELD_SETTLE=1) into OUT/run-N.json (default
# results/yielding-stable), then pools them with scripts/yielding_pairs.py. Root only.
#
# Before each run it waits (up to 60 s) for the CPUs to be at most 25% busy over 2 s (on this
# shared 2-vCPU machine other work is the main noise left) and logs that and the load average
# to OUT/log; each run holds /tmp/bench.lock (other benches on this machine take it too) and
# runs at nice -19.
set -uo pipefail
first=${1:?usage: yielding-stable.sh FIRST LAST [OUT]}
last=${2:?usage: yielding-stable.sh FIRST LAST [OUT]}
cd "$(dirname "$0")/.."
out=$(realpath -m "${3:-results/yielding-stable}")
mkdir -p "$out"
export SPILLRING_YIELD_REPS=${SPILLRING_YIELD_REPS:-12} SPILLRING_YIELD_WARMUP=${SPILLRING_YIELD_WARMUP:-2} \
    SPILLRING_YIELD_SETTLE=${SPILLRING_YIELD_SETTLE:-1}
busy() { # percent of CPU time busy (not idle, not iowait) over 2 s
    local a b
    read -ra a < /proc/stat; sleep 2; read -ra b < /proc/stat
    local tot=0 i
    for i in 1 2 3 4 5 6 7 8; do tot=$(( tot + b[i] - a[i] )); done
    echo $(( 100 * (tot - (b[4] - a[4]) - (b[5] - a[5])) / (tot > 0 ? tot : 1) ))
}
for i in $(seq "$first" "$last"); do
    for _ in $(seq 30); do b=$(busy); (( b <= 25 )) && break; done
    echo "run $i: $(date -u +%FT%TZ) busy ${b}% loadavg $(cat /proc/loadavg)" | tee -a "$out/log"
    flock /tmp/bench.lock nice -n -19 env SPILLRING_BENCH_OUT="$out/bench-out" \
        scripts/yielding.sh --ram-device 2048 > "$out/run-$i.json" 2> "$out/run-$i.err"
    echo "run $i: rc $? $(date -u +%FT%TZ) loadavg after $(cat /proc/loadavg)" | tee -a "$out/log"
done
rm -rf "$out/bench-out"
python3 scripts/yielding_pairs.py "$out"/run-*.json
