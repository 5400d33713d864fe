#!/usr/bin/env bash
# ab-pairs.sh OLD_DIR NEW_DIR [PAIRS] [OUT_JSON]: interleaved before/after pairs of two builds of
# the `hot_path` and `throughput` benches (each directory holds the two executables, e.g. from
# `scripts/ab-pairs.sh --build REV DIR`, which builds them at REV in a temporary worktree).
# Per pair, the order alternating (old first in even pairs, new first in odd ones):
#  - hot_path's spill cycle (SPILLRING_BENCH_PROFILE=engine-<size>, a task scope per cycle,
#    tmpfs root, 3 s each) at 4 KiB, 64 KiB and 1 MiB: cycles per second;
#  - throughput's single run (SPILLRING_TP_SINGLE=engine, no sync, 512 MiB, disk root) in
#    buffered and direct mode at 1 MiB and 64 KiB records: MB/s and process CPU s per GiB.
# Prints one JSON line per run, then per figure new/old as the median of per-pair ratios with
# min-max, and writes every run and the summary to OUT_JSON when given.
set -euo pipefail
if [[ ${1:-} == --build ]]; then
    rev=${2:?usage: ab-pairs.sh --build REV DIR}
    dest=${3:?usage: ab-pairs.sh --build REV DIR}
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    wt=$(mktemp -d /tmp/spillring-ab-XXXXXX)
    git -C "$repo" worktree add -q --detach "$wt" "$rev"
    mkdir -p "$dest"
    for b in hot_path throughput; do
        exe=$(CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$repo/target/ab} \
            "$repo/scripts/bench-exe.sh" "$b" "$wt" || true)
        [[ -n $exe ]] || { echo "ab-pairs.sh: could not build $b at $rev" >&2; exit 1; }
        cp "$exe" "$dest/$b"
    done
    git -C "$repo" rev-parse "$rev" >"$dest/commit"
    git -C "$repo" worktree remove --force "$wt"
    echo "$dest: hot_path and throughput at $(cat "$dest/commit")"
    exit 0
fi
old=${1:?usage: ab-pairs.sh OLD_DIR NEW_DIR [PAIRS] [OUT_JSON]}
new=${2:?usage: ab-pairs.sh OLD_DIR NEW_DIR [PAIRS] [OUT_JSON]}
pairs=${3:-5}
out=${4:-}
exec python3 - "$old" "$new" "$pairs" "$out" <<'PY'
import json, os, re, statistics as st, subprocess, sys
old, new, pairs, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
MIB = 1 << 20
rows = []
def cycles(binary, size):
    env = dict(os.environ, SPILLRING_BENCH_PROFILE=f"engine-{size}", SPILLRING_BENCH_PROFILE_SECS="3")
    p = subprocess.run([binary + "/hot_path", "--bench"], env=env, capture_output=True, text=True,
                       check=True)
    m = re.search(r"(\d+) cycles in ([\d.]+)(ms|s)", p.stderr)
    secs = float(m.group(2)) / (1000 if m.group(3) == "ms" else 1)
    return {"what": f"cycle {size}", "per_s": int(m.group(1)) / secs}
def tp(binary, mode, rec):
    env = dict(os.environ, SPILLRING_TP_SINGLE="engine", SPILLRING_TP_MODE=mode,
               SPILLRING_TP_RECORD=str(rec), SPILLRING_TP_BYTES=str(512 * MIB))
    o = subprocess.run([binary + "/throughput", "--bench"], env=env, capture_output=True,
                       text=True, check=True).stdout
    r = json.loads(o.strip().splitlines()[-1])
    label = "1MiB" if rec == MIB else "64KiB"
    return {"what": f"write {mode} {label}", "mb_s": r["mb_s"], "cpu_s_per_gib": r["cpu_s_per_gib"]}
jobs = [lambda b, s=s: cycles(b, s) for s in ("4KiB", "64KiB", "1MiB")]
jobs += [lambda b, m=m, r=r: tp(b, m, r) for m in ("buffered", "direct") for r in (MIB, 64 << 10)]
for p in range(pairs):
    order = [("old", old), ("new", new)] if p % 2 == 0 else [("new", new), ("old", old)]
    for job in jobs:
        for side, b in order:
            r = job(b)
            r.update(pair=p, side=side)
            rows.append(r)
            print(json.dumps(r), flush=True)
summary = {}
for what in dict.fromkeys(r["what"] for r in rows):
    for key in ("per_s", "mb_s", "cpu_s_per_gib"):
        by = {}
        for r in rows:
            if r["what"] == what and key in r:
                by.setdefault(r["pair"], {})[r["side"]] = r[key]
        ratios = [v["new"] / v["old"] for v in by.values() if "new" in v and "old" in v and v["old"]]
        if ratios:
            summary[f"{what} {key}"] = {"median": st.median(ratios), "min": min(ratios),
                                        "max": max(ratios), "pairs": len(ratios)}
print(f"\nnew / old over {pairs} pairs: median (min-max)")
for k, v in summary.items():
    print(f"  {k:32s} {v['median']:.3f} ({v['min']:.3f}-{v['max']:.3f})")
if out:
    commit = lambda d: open(os.path.join(d, "commit")).read().strip() if os.path.exists(os.path.join(d, "commit")) else d
    with open(out, "w") as f:
        json.dump({"old": commit(old), "new": commit(new), "pairs": pairs, "runs": rows,
                   "new_over_old": summary}, f, indent=1)
PY
