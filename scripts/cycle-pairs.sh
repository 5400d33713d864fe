#!/usr/bin/env bash
# cycle-pairs.sh A_DIR B_DIR PAIRS OUT_JSONL [SECS] [PROFILE]: interleaved pairs of two builds'
# hot_path profile mode (SPILLRING_BENCH_PROFILE=engine-4KiB by default, tmpfs root, SECS=3 s
# each, as scripts/ab-pairs.sh runs it), A first in even pairs, B first in odd ones. Each run
# is timed under `flock /tmp/bench.lock` by /usr/bin/time (process user+sys CPU), with the
# 1-minute load average read just before it. Writes one JSON line per run to OUT_JSONL and
# prints B/A per pair and the median (min-max) of cycles/s and CPU us/cycle.
set -euo pipefail
a=${1:?usage: cycle-pairs.sh A_DIR B_DIR PAIRS OUT_JSONL [SECS] [PROFILE]}
b=${2:?}; pairs=${3:?}; out=${4:?}; secs=${5:-3}; prof=${6:-engine-4KiB}
exec python3 - "$a" "$b" "$pairs" "$out" "$secs" "$prof" <<'PY'
import json, os, re, statistics as st, subprocess, sys, tempfile, time
a, b, pairs, out, secs, prof = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
def run(d):
    env = dict(os.environ, SPILLRING_BENCH_PROFILE=prof, SPILLRING_BENCH_PROFILE_SECS=secs)
    with tempfile.NamedTemporaryFile("r") as tf:
        cmd = ["flock", "/tmp/bench.lock", "sh", "-c",
               'cat /proc/loadavg >&2; exec /usr/bin/time -f "TIME %U %S %e" -o "$0" "$1" --bench',
               tf.name, os.path.join(d, "hot_path")]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        u, s, e = map(float, tf.read().split()[1:4])
    load = float(p.stderr.split()[0])
    m = re.search(r"(\d+) cycles in ([\d.]+)(ms|s)", p.stderr)
    n = int(m.group(1)); t = float(m.group(2)) / (1000 if m.group(3) == "ms" else 1)
    return {"cycles": n, "secs": t, "per_s": n / t, "user_s": u, "sys_s": s, "wall_s": e,
            "cpu_us_per_cycle": (u + s) * 1e6 / n, "load1": load}
rows = []
with open(out, "a") as f:
    for p in range(pairs):
        order = [("A", a), ("B", b)] if p % 2 == 0 else [("B", b), ("A", a)]
        for side, d in order:
            r = run(d)
            r.update(pair=p, side=side, dir=d, profile=prof, first=order[0][0], t=time.time())
            rows.append(r); f.write(json.dumps(r) + "\n"); f.flush()
        pa = [r for r in rows if r["pair"] == p]
        A = next(r for r in pa if r["side"] == "A"); B = next(r for r in pa if r["side"] == "B")
        print(f"pair {p}: B/A cycles/s {B['per_s']/A['per_s']:.3f}  cpu/cycle {B['cpu_us_per_cycle']/A['cpu_us_per_cycle']:.3f}"
              f"  A {A['per_s']:.0f}/s {A['cpu_us_per_cycle']:.2f}us  B {B['per_s']:.0f}/s {B['cpu_us_per_cycle']:.2f}us  load {A['load1']:.2f}/{B['load1']:.2f}", flush=True)
rat = {k: [] for k in ("per_s", "cpu_us_per_cycle")}
for p in range(pairs):
    A = next(r for r in rows if r["pair"] == p and r["side"] == "A")
    B = next(r for r in rows if r["pair"] == p and r["side"] == "B")
    for k in rat: rat[k].append(B[k] / A[k])
for k, v in rat.items():
    print(f"B/A {k}: median {st.median(v):.3f} ({min(v):.3f}-{max(v):.3f}), {sum(x < 1 for x in v)}/{len(v)} below 1, {len(v)} pairs")
PY
