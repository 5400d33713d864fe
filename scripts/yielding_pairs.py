#!/usr/bin/env python3
"""Pools the on/off pairs of several yielding-bench JSON files (scripts/yielding.sh) and prints,
per mode, the throughput ratio with yielding over without: each repetition's two back-to-back
runs make a pair. Prints the median pair ratio with a distribution-free 95% confidence interval
(order statistics of the binomial), min-max, the ratio of the medians, the best run of each side,
and the runtime thread's on-CPU time on/off (the thread the yielding works on).

A second block keeps only the pairs whose two runs had a normal CPU time off the runtime thread
(process CPU minus runtime thread CPU, at most 1.5x the mode's median): on this VM some buffered
runs spend 3-8x the usual CPU in the I/O thread's pwritev into the page cache, at random and on
either side; the filter does not look at the yielding side or at throughput.

    scripts/yielding_pairs.py results/yielding-stable/run-*.json
"""
import json
import math
import statistics as st
import sys


def ci95(v):
    """The median's distribution-free ~95% interval: (x_k, x_{n+1-k}) with P(Bin(n, 1/2) < k) <= 0.025."""
    v = sorted(v)
    n = len(v)
    below = lambda k: sum(math.comb(n, i) for i in range(k)) / 2**n
    ks = [k for k in range(1, n // 2 + 1) if below(k) <= 0.025]
    return (v[ks[-1] - 1], v[n - ks[-1]]) if ks else (v[0], v[-1])


def pairs(docs, mode):
    out = []
    for d in docs:
        rs = [r for r in d["runs"] if r["mode"] == mode]
        for rep in sorted({r["rep"] for r in rs}):
            on = [r for r in rs if r["rep"] == rep and r["yielding"]]
            off = [r for r in rs if r["rep"] == rep and not r["yielding"]]
            if on and off:
                out.append((on[0], off[0]))
    return out


def show(label, ps):
    w = [a["mib_per_s"] / b["mib_per_s"] for a, b in ps]
    c = [a["runtime_thread_on_cpu_s"] / b["runtime_thread_on_cpu_s"] for a, b in ps]
    on = [a["mib_per_s"] for a, _ in ps]
    off = [b["mib_per_s"] for _, b in ps]
    print(f"  {label}: {len(ps)} pairs")
    print("    throughput on/off: median %.3f, 95%% CI %.3f-%.3f, min-max %.3f-%.3f" % (st.median(w), *ci95(w), min(w), max(w)))
    print("    MiB/s on: median %.0f (%.0f-%.0f); off: median %.0f (%.0f-%.0f); ratio of medians %.3f; best on / best off %.3f"
          % (st.median(on), min(on), max(on), st.median(off), min(off), max(off), st.median(on) / st.median(off), max(on) / max(off)))
    print("    runtime thread on-CPU on/off: median %.3f, 95%% CI %.3f-%.3f" % (st.median(c), *ci95(c)))


def main():
    docs = [json.load(open(f)) for f in sys.argv[1:]]
    print("files %d, MiB %s, load average (1 min) before each: %s"
          % (len(docs), sorted({d["mib"] for d in docs}), " ".join(d["loadavg_before"].split()[0] for d in docs)))
    for mode in ("buffered", "direct"):
        ps = pairs(docs, mode)
        print(mode)
        show("all pairs", ps)
        other = lambda r: r["process_cpu_s"] - r["runtime_thread_on_cpu_s"]
        med = st.median(other(r) for p in ps for r in p)
        kept = [p for p in ps if all(other(r) <= 1.5 * med for r in p)]
        if kept:
            show("pairs without an I/O-thread CPU outlier (<= 1.5 x %.3f s)" % med, kept)


if __name__ == "__main__":
    main()
