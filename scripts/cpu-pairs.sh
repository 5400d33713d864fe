#!/usr/bin/env bash
# cpu-pairs.sh OLD_DIR NEW_DIR [PAIRS]: interleaved before/after pairs of two builds' bench
# executables (each directory holds `throughput`, `hot_path` and `cleanup`, e.g. copied from
# `scripts/bench-exe.sh NAME` at each commit). Per pair, in an order that alternates:
#  - throughput, SPILLRING_TP_SINGLE (no sync), 256 MiB per run: the engine in direct mode with
#    OLD and NEW, and a buffered std::fs write_all loop (NEW's binary), at 1 MiB, 64 KiB and
#    4 KiB records: process CPU (getrusage RUSAGE_SELF, user+sys) and caller CPU (RUSAGE_THREAD)
#    per GiB, over the write loop and finish;
#  - hot_path in profile mode (SPILLRING_BENCH_PROFILE=engine-4KiB, tmpfs root, 3 s): process
#    CPU per 4 KiB spill cycle = the child's user+sys (RUSAGE_CHILDREN; engine setup included)
#    / cycles;
#  - cleanup `--bench drain_8` (the criterion bench: median of 10 samples of the drain of 8).
# Prints one JSON line per run, then a summary (medians over pairs, min-max).
set -eu
old=${1:?usage: cpu-pairs.sh OLD_DIR NEW_DIR [PAIRS]}
new=${2:?usage: cpu-pairs.sh OLD_DIR NEW_DIR [PAIRS]}
pairs=${3:-5}
exec python3 - "$old" "$new" "$pairs" <<'PY'
import json, os, re, resource, statistics as st, subprocess, sys, tempfile
old, new, pairs = sys.argv[1], sys.argv[2], int(sys.argv[3])
MIB = 1 << 20
rows = []
def tp(binary, which, mode, rec):
    env = dict(os.environ, SPILLRING_TP_SINGLE=which, SPILLRING_TP_MODE=mode,
               SPILLRING_TP_RECORD=str(rec), SPILLRING_TP_BYTES=str(256 * MIB))
    out = subprocess.run([binary + "/throughput", "--bench"], env=env, capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])
def cycle(binary):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = dict(os.environ, SPILLRING_BENCH_PROFILE="engine-4KiB", SPILLRING_BENCH_PROFILE_SECS="3")
    p = subprocess.run([binary + "/hot_path", "--bench"], env=env, capture_output=True, text=True,
                       check=True)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    n = int(re.search(r"(\d+) cycles", p.stderr).group(1))
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {"cycles": n, "cpu_us_per_cycle": cpu / n * 1e6}
def drain(binary):
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([binary + "/cleanup", "--bench", "drain_8"], env=dict(os.environ, SPILLRING_BENCH_OUT=d),
                       capture_output=True, check=True)
        for f in os.listdir(d):
            if f.startswith("cleanup") and f.endswith(".json"):
                return {"drain_8_us": json.load(open(os.path.join(d, f)))["drain_8_noop_us"]}
    return {"drain_8_us": None}
for p in range(pairs):
    order = [("old", old), ("new", new)] if p % 2 == 0 else [("new", new), ("old", old)]
    for rec in (MIB, 64 << 10, 4 << 10):
        seq = order + [("std", new)] if p % 2 == 0 else [("std", new)] + order
        for tag, b in seq:
            r = tp(b, "std" if tag == "std" else "engine", "buffered" if tag == "std" else "direct", rec)
            r.update(pair=p, side=tag, what="write"); rows.append(r); print(json.dumps(r), flush=True)
    for tag, b in order:
        r = cycle(b); r.update(pair=p, side=tag, what="cycle4k"); rows.append(r); print(json.dumps(r), flush=True)
    for tag, b in order:
        r = drain(b); r.update(pair=p, side=tag, what="drain8"); rows.append(r); print(json.dumps(r), flush=True)
def med(v):
    v = [x for x in v if x is not None]
    return f"{st.median(v):.3f} ({min(v):.3f}-{max(v):.3f})" if v else "-"
print(f"\nsummary over {pairs} pairs: median (min-max)")
for rec in (MIB, 64 << 10, 4 << 10):
    w = {s: {r["pair"]: r for r in rows if r["what"] == "write" and r["record_bytes"] == rec and r["side"] == s} for s in ("old", "new", "std")}
    for s in ("old", "new"):
        ratio = [w[s][p]["cpu_s_per_gib"] / w["std"][p]["cpu_s_per_gib"] for p in range(pairs)]
        cratio = [w[s][p]["caller_cpu_s_per_gib"] / w["std"][p]["cpu_s_per_gib"] for p in range(pairs)]
        print(f"{rec>>10:>5} KiB direct {s}: process CPU s/GiB {med([w[s][p]['cpu_s_per_gib'] for p in range(pairs)])}, "
              f"caller CPU s/GiB {med([w[s][p]['caller_cpu_s_per_gib'] for p in range(pairs)])}, "
              f"process / std buffered {med(ratio)}, caller / std buffered {med(cratio)}")
    print(f"{rec>>10:>5} KiB std::fs buffered: process CPU s/GiB {med([w['std'][p]['cpu_s_per_gib'] for p in range(pairs)])}")
    nr = [w["new"][p]["cpu_s_per_gib"] / w["old"][p]["cpu_s_per_gib"] for p in range(pairs)]
    print(f"{rec>>10:>5} KiB direct new / old process CPU: {med(nr)}")
for what, key in (("cycle4k", "cpu_us_per_cycle"), ("drain8", "drain_8_us")):
    for s in ("old", "new"):
        print(f"{what} {s}: {key} {med([r[key] for r in rows if r['what'] == what and r['side'] == s])}")
    o = {r["pair"]: r[key] for r in rows if r["what"] == what and r["side"] == "old"}
    n = {r["pair"]: r[key] for r in rows if r["what"] == what and r["side"] == "new"}
    print(f"{what} new / old per pair: {med([n[p] / o[p] for p in range(pairs) if o.get(p) and n.get(p)])}")
PY
