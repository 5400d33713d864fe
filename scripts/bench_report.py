#!/usr/bin/env python3
"""Turns the benches' raw JSON into results/: JSON files with provenance, REPORT.md and SVG plots.

Called by scripts/bench-report.sh (use that, it installs matplotlib when missing). Standard
library plus matplotlib, which draws the plots (SVG, Agg backend). For every missed goal it
records a CPU profile of the engine path in question (`perf record -e cpu-clock`) and puts a
summary in REPORT.md, next to dhat's allocation sites where allocations are the goal.
"""

import argparse
import datetime
import html
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --------------------------------------------------------------------------------------------
# provenance


def sh(cmd, **kw):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False, **kw).stdout.strip()
    except OSError:
        return ""


def provenance(args):
    model = ""
    for line in sh(["lscpu"]).splitlines():
        if line.startswith("Model name:"):
            model = line.split(":", 1)[1].strip()
    dirty = [l for l in sh(["git", "status", "--porcelain"], cwd=REPO).splitlines() if l.strip()]
    return {
        "commit": sh(["git", "rev-parse", "HEAD"], cwd=REPO),
        "commit_subject": sh(["git", "log", "-1", "--format=%s"], cwd=REPO),
        "dirty_files": len(dirty),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "machine": {"uname": sh(["uname", "-a"]), "nproc": sh(["nproc"]), "cpu_model": model},
        "rustc": sh(["rustc", "--version"]),
        "command": args.command,
        "quick": args.quick,
    }


def load(raw, name):
    p = os.path.join(raw, name + ".json")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)


def save(out, name, doc, meta):
    doc = dict(doc)
    doc["provenance"] = meta
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


# --------------------------------------------------------------------------------------------
# dhat sites

ENGINE_SRC = os.path.join(REPO, "engine", "src")
# Every engine source file, as its path under engine/src ("spill/writer/mod.rs").
ENGINE_FILES = set()
for d, _, files in os.walk(ENGINE_SRC):
    ENGINE_FILES.update(os.path.relpath(os.path.join(d, f), ENGINE_SRC) for f in files if f.endswith(".rs"))


def engine_frame(frame):
    """'fn (engine/src/x.rs:12:3)' for an engine frame, else None. Backtraces name engine files
    as engine/src/..., src/... or relative to src (spill/writer/mod.rs)."""
    m = re.search(r"^(?:0x[0-9a-f]+: )?(.*) \((?:engine/)?(?:src/)?((?:[a-z_]+/)*[a-z_]+\.rs):(\d+):\d+\)$", frame)
    if not m or m.group(2) not in ENGINE_FILES:
        return None
    fn = re.sub(r"<.*", "", m.group(1))
    return f"{fn} (engine/src/{m.group(2)}:{m.group(3)})"


def dhat_sites(path, key, per, top=14):
    """Allocation sites by `key` ('tbk' total blocks, 'eb' bytes live at the end), `per` unit."""
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        d = json.load(f)
    ft = d["ftbl"]
    rows = {}
    for pp in d["pps"]:
        if not pp.get(key):
            continue
        frames = [ft[i] for i in pp["fs"]]
        chain = [e for e in (engine_frame(x) for x in frames) if e]
        site = " <- ".join(chain[:2]) if chain else "(outside the engine) " + (
            re.sub(r"^0x[0-9a-f]+: ", "", frames[min(len(frames) - 1, 8)]) if frames else "?")
        r = rows.setdefault(site, [0, 0])
        r[0] += pp[key]
        r[1] += pp["tb"] if key == "tbk" else pp.get("ebk", 0)
    out = sorted(rows.items(), key=lambda kv: -kv[1][0])[:top]
    return [(v[0] / per, v[1] / per, s) for s, v in out]


# --------------------------------------------------------------------------------------------
# perf profiles


def bench_executables(target_dir):
    env = dict(os.environ)
    if target_dir:
        env["CARGO_TARGET_DIR"] = target_dir
    out = sh(["cargo", "bench", "-p", "spillring-benches", "--no-run", "--message-format=json"], cwd=REPO, env=env)
    exes = {}
    for line in out.splitlines():
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if m.get("reason") == "compiler-artifact" and m.get("executable") and "bench" in m["target"]["kind"]:
            exes[m["target"]["name"]] = m["executable"]
    return exes


def ensure_perf():
    if shutil.which("perf"):
        return True
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for cmd in (["apt-get", "install", "-y", "-qq", "linux-perf"], ["apt-get", "update", "-qq"],
                    ["apt-get", "install", "-y", "-qq", "linux-perf"]):
            subprocess.run(cmd, capture_output=True, check=False, env=env)
            if cmd[1] == "install" and shutil.which("perf"):
                break
    return bool(shutil.which("perf"))


def perf_lines(data, sort, limit):
    txt = sh(["perf", "report", "-i", data, "--stdio", "--no-children", "--sort", sort,
              "--percent-limit", str(limit)])
    rows = []
    for line in txt.splitlines():
        m = re.match(r"^\s+([0-9.]+)%\s+(.*)$", line)
        if m:
            rows.append((float(m.group(1)), re.sub(r"\s{2,}", "  ", m.group(2).strip())))
    return rows


def profile(exes, bench, what, secs, raw, extra_env=None):
    exe = exes.get(bench)
    if not exe:
        return {"error": f"no executable for bench {bench}"}
    data = os.path.join(raw, f"perf-{bench}-{what}.data")
    env = dict(os.environ)
    env.update({"SPILLRING_BENCH_PROFILE": what, "SPILLRING_BENCH_PROFILE_SECS": str(secs)})
    env.update(extra_env or {})
    r = subprocess.run(["perf", "record", "-e", "cpu-clock", "-F", "1999", "-o", data, "--", exe],
                       env=env, capture_output=True, text=True, check=False)
    if r.returncode != 0 or not os.path.exists(data):
        return {"error": (r.stderr or "perf record failed").strip().splitlines()[-1:]}
    return {
        "command": f"SPILLRING_BENCH_PROFILE={what} SPILLRING_BENCH_PROFILE_SECS={secs} perf record -e cpu-clock -F 1999 -- <{bench} bench>",
        "by_thread": [(p, re.sub(r"-\d+$", "", n)) for p, n in perf_lines(data, "comm", 0.5)],
        "top": perf_lines(data, "comm,dso,sym", 1.0)[:18],
    }


# --------------------------------------------------------------------------------------------
# plots (matplotlib, Agg backend, written as SVG)


COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]
GOAL_COLOR = "#d62728"


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend, with reproducible SVG output."""
    try:
        import matplotlib
    except ImportError:
        sys.exit("bench_report: matplotlib is missing; scripts/bench-report.sh installs it "
                 "(python3 -m pip install --quiet matplotlib)")
    matplotlib.use("Agg")
    matplotlib.rcParams.update({
        "font.family": "sans-serif",
        "font.size": 9,
        "svg.fonttype": "none",      # text stays text, as in the hand-written plots before
        "svg.hashsalt": "spillring",  # stable element ids: reruns of the same data diff cleanly
    })
    import matplotlib.pyplot as plt
    return plt


def save_svg(plt, fig, path):
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)


def lab(v):
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def svg_bars(path, title, groups, series, values, ylabel, log=False, goal=None):
    """Grouped bars: values[g][s]; optional horizontal goal line (value, label)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8.6, 4.2))
    n = max(1, len(series))
    width = 0.8 / n
    for si, name in enumerate(series):
        xs, hs = [], []
        for gi in range(len(groups)):
            v = values[gi][si]
            if v is not None and (v > 0 or not log):
                xs.append(gi - 0.4 + width * (si + 0.5))
                hs.append(v)
        bars = ax.bar(xs, hs, width * 0.95, color=COLORS[si % len(COLORS)], label=name)
        ax.bar_label(bars, labels=[lab(v) for v in hs], fontsize=7, padding=1)
    if log:
        ax.set_yscale("log")
    if goal:
        ax.axhline(goal[0], color=GOAL_COLOR, linestyle="--", linewidth=1)
        ax.annotate(goal[1], xy=(1, goal[0]), xycoords=("axes fraction", "data"), xytext=(-4, 4),
                    textcoords="offset points", ha="right", va="bottom", color=GOAL_COLOR)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_xlim(-0.5, len(groups) - 0.5)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=11)
    ax.grid(axis="y", color="#ddd", linewidth=0.8)
    ax.set_axisbelow(True)
    ax.margins(y=0.08)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=len(series), frameon=False)
    fig.tight_layout()
    save_svg(plt, fig, path)


def svg_points(path, title, xs, ys, xlabel, ylabel, goal):
    """Points joined by a line, x on a log2 axis, a dashed goal line."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.2, 3.8))
    ax.set_xscale("log", base=2)
    ax.plot(xs, ys, color=COLORS[0], linewidth=2, marker="o", markersize=5)
    for x, y in zip(xs, ys):
        ax.annotate(f"{y:.2f}", xy=(x, y), xytext=(0, 7), textcoords="offset points", ha="center")
    ax.axhline(goal[0], color=GOAL_COLOR, linestyle="--", linewidth=1)
    ax.annotate(goal[1], xy=(0, goal[0]), xycoords=("axes fraction", "data"), xytext=(6, -14),
                textcoords="offset points", ha="left", color=GOAL_COLOR)
    ax.set_xticks(xs, [f"{x:,}" for x in xs])
    ax.minorticks_off()
    ax.set_xlim(min(xs) / 2 ** 0.5, max(xs) * 2 ** 0.5)
    ax.set_ylim(0, max(list(ys) + [goal[0]]) * 1.25)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=11)
    ax.grid(axis="y", color="#ddd", linewidth=0.8)
    ax.set_axisbelow(True)
    fig.tight_layout()
    save_svg(plt, fig, path)


# --------------------------------------------------------------------------------------------
# report


def f(v, nd=2):
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "**no**"
    if isinstance(v, (int,)) and not isinstance(v, bool):
        return f"{v:,}"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{nd}f}"


HOT_SIZES = ("4KiB", "64KiB", "1MiB")
TP_SIZES = ("1MiB", "64KiB", "4KiB")


def ratio_spread(p, prefix, nd=2):
    """'0.42× (median of 21 rounds, 0.38–0.47)' from a paired block, or 'not measured'."""
    v = (p or {}).get(prefix + "_median")
    if v is None:
        return "not measured"
    return (f"{f(v, nd)}× (median of {p.get('rounds', '?')} rounds, "
            f"{f(p.get(prefix + '_min'), nd)}–{f(p.get(prefix + '_max'), nd)})")


def stats_spread(st, nd=2):
    """The same for a {n, median, min, max} block."""
    if not st or st.get("median") is None:
        return "not measured"
    return f"{f(st['median'], nd)}× (median of {st['n']} pairs, {f(st['min'], nd)}–{f(st['max'], nd)})"


def counted_stats(d, value):
    """{n, median, min, max} of `value(row)` over the counted rounds of repeat.json."""
    vals = sorted(v for v in (value(r) for r in d["rows"] if r["counted"]) if v is not None)
    if not vals:
        return None
    return {"n": len(vals), "median": statistics.median(vals), "min": vals[0], "max": vals[-1]}


def fio_noise(r):
    """A round's slower fio run / its faster one (the device's own swing within a round)."""
    runs = [x for x in (r.get("fio_runs_mb_s") or []) if x]
    return min(runs) / max(runs) if len(runs) == 2 else None


def pool_off_vs_fio(r):
    return r["pool_off_mb_s"] / r["fio_mb_s"] if r.get("fio_mb_s") else None


def table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# goals: the one table every verdict of REPORT.md comes from
#
# Each Goal is one row of the report's goal table. `source` is the JSON a bench writes (without
# `.json`); `value(doc)` picks the measured number out of it; `op` and `target` are the goal
# (`op=None`: a context row, shown without a verdict); `shown(doc)` is the measured text when
# more than the number is worth showing (a spread). `verdict()` below is the only place a
# figure is judged: the benches write figures, never verdicts. A bench whose JSON is missing,
# or a figure a JSON does not hold, shows "not measured" (and counts as not met).
#
# Adding a goal is one entry: append a Goal to GOALS, e.g. for a bench writing foo.json:
#
#     Goal("foo", "foo latency, engine / baseline", "foo", lambda d: d["ratio"]["median"], "<=", 1.0,
#          shown=lambda d: stats_spread(d["ratio"]))
#
# `profile=(slot, bench, what)` asks for a perf profile of `SPILLRING_BENCH_PROFILE=what` of
# `bench` when the goal is missed (one per slot: of the worst miss); a section shows it by slot.


class Goal:
    def __init__(self, area, figure, source, value, op, target, unit="×", shown=None, goal_text=None,
                 profile=None, key=None):
        assert op in ("<=", ">=", None), op
        self.area, self.figure, self.source, self.value = area, figure, source, value
        self.op, self.target, self.unit, self.shown, self.profile = op, target, unit, shown, profile
        self.goal_text = goal_text or ("–" if op is None else f"{'≤' if op == '<=' else '≥'} {target:g}{unit}")
        self.key = key or figure


def pick(rows, **match):
    """The one element of `rows` whose fields equal `match` (KeyError when none does)."""
    for r in rows:
        if all(r.get(k) == v for k, v in match.items()):
            return r
    raise KeyError(", ".join(f"{k}={v}" for k, v in match.items()))


def hot(d, rec, root):
    return pick(d["rows"], record=rec)["paired" if root == "tmpfs" else "paired_disk_root"]


HOT_RATIO_MAX = 0.5

GOALS = [
    Goal("capacity", "retained heap per ticket, worst point measured", "capacity",
         lambda d: d["worst_bytes_per_ticket"], "<=", 16, unit=" B",
         shown=lambda d: f"{f(d['worst_bytes_per_ticket'])} B at {f(d['worst_at_tickets'])} tickets "
                         f"({f(d.get('bytes_per_ticket_at_capacity'))} B at 65,536)"),
]
for _root in ("tmpfs", "disk"):
    for _rec in HOT_SIZES:
        GOALS.append(Goal(
            "hot path", f"spill cycle, task per cycle, engine / std::fs with read-back, {_rec} ({_root} root)",
            "hot-path", lambda d, r=_rec, t=_root: hot(d, r, t)["ratio_vs_read_median"], "<=", HOT_RATIO_MAX,
            shown=lambda d, r=_rec, t=_root: ratio_spread(hot(d, r, t), "ratio_vs_read"),
            profile=("hot", "hot_path", f"cycle-{'disk-' if _root == 'disk' else ''}{_rec}")))
for _root in ("tmpfs", "disk"):
    for _rec in HOT_SIZES:
        GOALS.append(Goal(
            "hot path", f"same cycle, engine pool off / std::fs with read-back, {_rec} ({_root} root)", "hot-path",
            lambda d, r=_rec, t=_root: hot(d, r, t)["pool_off_ratio_vs_read_median"], None, None,
            shown=lambda d, r=_rec, t=_root: ratio_spread(hot(d, r, t), "pool_off_ratio_vs_read")))
        GOALS.append(Goal(
            "hot path", f"same cycle, engine pool on / pool off, {_rec} ({_root} root)", "hot-path",
            lambda d, r=_rec, t=_root: hot(d, r, t)["pool_on_vs_off_median"], None, None,
            shown=lambda d, r=_rec, t=_root: ratio_spread(hot(d, r, t), "pool_on_vs_off")))
for _rec in HOT_SIZES:
    GOALS.append(Goal(
        "hot path", f"heap allocations per write, {_rec}", "hot-path",
        lambda d, r=_rec: pick(d["rows"], record=r)["allocs"]["allocs_per_write"], "<=", 0, unit="",
        shown=lambda d, r=_rec: f(pick(d["rows"], record=r)["allocs"]["allocs_per_write"], 4)))
for _rec in HOT_SIZES:
    GOALS.append(Goal(
        "hot path", f"heap allocations per cycle (task per cycle), {_rec}", "hot-path",
        lambda d, r=_rec: pick(d["rows"], record=r)["allocs"]["engine_allocs_per_cycle"], "<=", 2, unit=""))
GOALS += [
    Goal("repeat", "back-to-back direct spills, median of rounds 2-6: engine pool on / fio (same job, same run)",
         "repeat", lambda d: d["pool_on_vs_fio"]["median"], ">=", 0.9,
         shown=lambda d: stats_spread(d["pool_on_vs_fio"], 3)),
    Goal("repeat", "back-to-back direct spills, median of rounds 2-6: engine pool on / pool off",
         "repeat", lambda d: d["pool_on_vs_pool_off"]["median"], ">=", 2.0,
         shown=lambda d: stats_spread(d["pool_on_vs_pool_off"])),
    Goal("repeat", "same rounds: engine pool off / fio (the 2x goal asks pool on for twice this)",
         "repeat", lambda d: counted_stats(d, pool_off_vs_fio)["median"], None, None,
         shown=lambda d: stats_spread(counted_stats(d, pool_off_vs_fio), 3)),
    Goal("repeat", "same rounds: fio's two runs of a round, slower / faster (the device's swing within a round)",
         "repeat", lambda d: counted_stats(d, fio_noise)["median"], None, None,
         shown=lambda d: stats_spread(counted_stats(d, fio_noise), 3)),
    Goal("fio", "single direct spill: engine MB/s / fio MB/s (same job, interleaved pairs)", "fio-baseline",
         lambda d: d["ratio_median"], ">=", 0.95,
         shown=lambda d: stats_spread({"n": len(d["pairs"]), "median": d["ratio_median"],
                                       "min": min(p["ratio"] for p in d["pairs"]),
                                       "max": max(p["ratio"] for p in d["pairs"])}, 3),
         profile=("fio", "throughput", "engine-direct-1MiB")),
    Goal("overlap", "producer computing as long as the device writes: engine wall / max(compute alone, write alone)",
         "overlap", lambda d: d["engine_vs_longer"]["median"], "<=", 1.15,
         shown=lambda d: stats_spread(d["engine_vs_longer"], 3), profile=("overlap", "overlap", "engine")),
    Goal("overlap", "same producer, std::fs O_DIRECT loop (compute, then write) / max(compute alone, write alone)",
         "overlap", lambda d: d["std_vs_longer"]["median"], None, None,
         shown=lambda d: stats_spread(d["std_vs_longer"], 3)),
    # scale.json: benches/benches/scale.rs (field names as that bench writes them).
    Goal("scale", "10,000 concurrent open spills (writer, state, reader): spills refused", "scale",
         lambda d: d["refused"], "<=", 0, unit="", shown=lambda d: f"{f(d['refused'])} of {f(d['spills'])}"),
    Goal("scale", "10,000 concurrent open spills: peak extra process fds", "scale",
         lambda d: d["peak_extra_fds"], "<=", 2048, unit=""),
    Goal("scale", "10,000 concurrent open spills: memory (RSS) per idle open writer (reported)", "scale",
         lambda d: d["rss_bytes_per_idle_writer"], None, None,
         shown=lambda d: f"{f(d['rss_bytes_per_idle_writer'] / 1024, 1)} KiB"),
]
for _rec in TP_SIZES:
    GOALS.append(Goal(
        "throughput", f"CPU/GiB engine direct / std::fs buffered, {_rec}", "throughput",
        lambda d, r=_rec: pick(d["goal_rows"], record=r, mode="direct")["cpu_ratio_vs_std_buffered"], "<=", 0.2,
        profile=("tp", "throughput", f"engine-direct-{_rec}")))
for _rec in TP_SIZES:
    for _mode in ("buffered", "direct"):
        GOALS.append(Goal(
            "throughput", f"caller-blocked/GiB engine {_mode} / std::fs buffered, {_rec}", "throughput",
            lambda d, r=_rec, m=_mode: pick(d["goal_rows"], record=r, mode=m)["blocked_ratio_vs_std_buffered"],
            "<=", 0.1, profile=("tp", "throughput", f"engine-{_mode}-{_rec}")))
GOALS.append(Goal("cleanup", "drain of 8 ready records, no-op deleter", "cleanup", lambda d: d["drain_8_noop_us"],
                  "<=", 2, unit=" µs", goal_text="≤ 2 µs (MatrixOne: 9.8 µs)",
                  shown=lambda d: f"{f(d['drain_8_noop_us'], 1)} µs", profile=("drain", "cleanup", "drain8")))
# async-poll.json: benches/benches/async_poll.rs (issue 13, point 2: an _async call never makes a
# blocking syscall on the caller's thread). The goal counts polls in which the worker slept in the
# kernel; the wall-time longest poll is context (on a shared machine it mostly measures preemption).
for _mode in ("buffered", "direct"):
    GOALS.append(Goal(
        "async", f"polls of an _async call in which the tokio worker slept in the kernel, worst run, {_mode}",
        "async-poll", lambda d, m=_mode: d["modes"][m]["polls_blocked"]["max"], "<=", 0, unit="",
        shown=lambda d, m=_mode: (f"{f(d['modes'][m]['polls_blocked']['max'], 0)} (median "
                                  f"{f(d['modes'][m]['polls_blocked']['median'], 1)} of "
                                  f"{d['modes'][m]['polls_blocked']['n']} runs)")))
    GOALS.append(Goal(
        "async", f"longest poll of an _async call, wall time (counts preemption), {_mode}", "async-poll",
        lambda d, m=_mode: d["modes"][m]["max_poll_ms"]["median"], None, None, unit=" ms",
        shown=lambda d, m=_mode: (f"{f(d['modes'][m]['max_poll_ms']['median'])} ms (median of "
                                  f"{d['modes'][m]['max_poll_ms']['n']} runs, {f(d['modes'][m]['max_poll_ms']['min'])}"
                                  f"–{f(d['modes'][m]['max_poll_ms']['max'])})")))
# writers.json: benches/benches/writers.rs (issue 13, point 4: 64 writers of one task, round-robin,
# 4 MiB each). Disk: direct mode allocates segments in doubling steps, so a writer holds at most
# about twice what it wrote (plus its 1 MiB first step); RSS rows are context.
for _mode in ("buffered", "direct"):
    GOALS.append(Goal(
        "writers", f"64 open writers round-robin, 4 MiB each: peak RSS delta per writer, {_mode}", "writers",
        lambda d, m=_mode: d["modes"][m]["rss_bytes_per_writer_median"], None, None, unit=" B",
        shown=lambda d, m=_mode: (f"{f(d['modes'][m]['rss_bytes_per_writer_median'] / 2**20, 2)} MiB (peak "
                                  f"{f(d['modes'][m]['peak_rss_delta_bytes_median'] / 2**20, 1)} MiB, median of "
                                  f"{len(d['modes'][m]['peak_rss_delta_bytes'])} runs)")))
GOALS.append(Goal(
    "writers", "64 open writers round-robin, 4 MiB each: peak disk held / bytes written, direct", "writers",
    lambda d: d["modes"]["direct"]["disk_per_written_median"], "<=", 2.1,
    shown=lambda d: (f"{f(d['modes']['direct']['disk_per_written_median'], 2)} "
                     f"({f(d['modes']['direct']['peak_disk_bytes_median'] / 2**20, 0)} MiB for "
                     f"{f(d['modes']['direct']['written_bytes'] / 2**20, 0)} MiB)")))
FIO_KEY = "single direct spill: engine MB/s / fio MB/s (same job, interleaved pairs)"
CAP_GOAL = next(g for g in GOALS if g.source == "capacity")

# JSONs read for their own sections that no goal row reads.
EXTRA_SOURCES = ("ledger",)

# Sections of REPORT.md added by a bench of its own, after the built-in ones: (source, title,
# function of the bench's JSON returning markdown lines). A bench that did not run gets its
# title and a "not measured" line. Adding one is one entry, e.g.
#     SECTIONS.append(("scale", "Scale: 10,000 concurrent open spills", scale_section_md))
# where scale_section_md(doc) returns the lines under the title (its goal rows go in GOALS).
SECTIONS = []


def scale_section_md(sc):
    """REPORT.md lines of the 10,000-spill scale bench (benches/benches/scale.rs, scale.json);
    its goal rows are in GOALS."""
    n = f(sc["spills"])
    per = f"{sc['bytes_per_writer'] // 1024} KiB"
    ph = sc["phase_seconds"]
    return [sc["what"] + ".", "",
            f"Engine backend {sc['engine']['backend']}, {sc['engine']['write_mode']} mode, segment pool off,"
            f" `io_buffer_size` {sc['io_buffer_size'] // 1024} KiB, segment size {sc['segment_size'] // 2**20} MiB,"
            f" `max_open_files` {f(sc['max_open_files'])}; soft RLIMIT_NOFILE {f(sc['rlimit_nofile_soft'])};"
            f" {f(sc['record_bytes'] // 1024)} KiB records.", "",
            table(["phase (all held at once)", "refused", "extra fds after", "RSS delta", "seconds"],
                  [(f"{n} writers, {per} written each", f(sc["refused_writers"]), f(sc["extra_fds_writers"]),
                    f"{f(sc['rss_delta_writers_bytes'] / 2**20, 1)} MiB", f(ph["writers"])),
                   (f"{n} held states", f(sc["refused_states"]), f(sc["extra_fds_states"]),
                    f"{f(sc['rss_delta_states_bytes'] / 2**20, 1)} MiB", f(ph["states"])),
                   (f"{n} readers mid-read", f(sc["refused_readers"]), f(sc["extra_fds_readers"]),
                    f"{f(sc['rss_delta_readers_bytes'] / 2**20, 1)} MiB", f(ph["readers"]))]), "",
            f"Peak extra fds {f(sc['peak_extra_fds'])} (goal ≤ {f(sc['goal_extra_fds_max'])}); idle fds closed by the"
            f" bound: {f(sc['fd_evictions'])}; RSS per idle open writer {f(sc['rss_bytes_per_idle_writer'] / 1024, 1)} KiB;"
            f" records that did not read back: {f(sc['bad_records'])}; files left after release: {f(sc['files_left'])}.", ""]


SECTIONS.append(("scale", "Scale: 10,000 concurrent open spills", scale_section_md))


def writers_section_md(d):
    """REPORT.md lines of the many-writers bench (benches/benches/writers.rs, writers.json); its
    goal rows are in GOALS."""
    rows = []
    for m in ("buffered", "direct"):
        md = d["modes"][m]
        rows.append((m, f"{f(md['peak_rss_delta_bytes_median'] / 2**20, 1)} MiB",
                     f"{f(md['rss_bytes_per_writer_median'] / 2**20, 2)} MiB",
                     f"{f(md['peak_disk_bytes_median'] / 2**20, 0)} MiB",
                     f"{f(md['written_bytes'] / 2**20, 0)} MiB", len(md["peak_rss_delta_bytes"])))
    return [d["what"] + ".", "",
            table(["mode", "peak RSS delta", "per writer", "peak disk held", "written", "runs"], rows), ""]


SECTIONS.append(("writers", "Many writers of one task: memory and disk", writers_section_md))


def add_codec_rows():
    """Goal rows and the section of issue 11's codec bench (benches/benches/codec.rs, codec.json):
    segment format v2's compression and encryption, direct mode on the disk root. Ratios are
    medians of per-round ratios (the configurations of a data set run in one order, reversed
    every round), with their spread; codec.json writes figures, never verdicts."""
    def cfg(d, ds, c):
        return d["datasets"][ds]["configs"][c]

    def ratio(d, key, nd=2):
        return stats_spread(d["ratios"][key], nd)

    def median(key):
        # Null when a configuration of the pair did not run (refused by the build).
        return lambda d: (d["ratios"][key] or {}).get("median")

    def auto_ratio_shown(d):
        c = cfg(d, "lineitem", "auto")
        return (f"{f(c['physical_per_logical'], 3)} ({f(c['physical_bytes'] / 2**20, 0)} MiB for "
                f"{f(c['logical_bytes'] / 2**20, 0)} MiB; blocks raw/lz4/zstd "
                f"{f(c['blocks']['raw'])}/{f(c['blocks']['lz4'])}/{f(c['blocks']['zstd'])})")

    def worst_allocs(d):
        return max(a["allocs_per_write"] for a in d["allocs"]["configs"].values())

    def allocs_shown(d):
        a = d["allocs"]["configs"]
        worst = max(a, key=lambda k: a[k]["allocs_per_write"])
        return (f"{f(a[worst]['allocs_per_write'], 4)} ({worst}, worst of {len(a)} configurations; "
                f"{f(a[worst]['writes'])} writes counted)")

    GOALS.extend([
        Goal("codec", "physical / logical bytes, lineitem-like rows, `Auto`", "codec",
             lambda d: cfg(d, "lineitem", "auto")["physical_per_logical"], "<=", 0.4, unit="",
             shown=auto_ratio_shown),
        Goal("codec", "spill logical GB/s, lineitem-like, `Auto` / `None`, direct mode, disk root", "codec",
             median("lineitem_auto_vs_none_gb_s"), ">=", 1.5,
             shown=lambda d: ratio(d, "lineitem_auto_vs_none_gb_s"), profile=("codec", "codec", "lineitem-auto")),
        Goal("codec", "spill logical GB/s, random bytes, `Auto` / `None`", "codec",
             median("random_auto_vs_none_gb_s"), ">=", 0.95,
             shown=lambda d: ratio(d, "random_auto_vs_none_gb_s"), profile=("codec", "codec", "random-auto")),
        Goal("codec", "process CPU per GiB, random bytes, `Auto` / `None`", "codec",
             median("random_auto_vs_none_cpu"), "<=", 1.05,
             shown=lambda d: ratio(d, "random_auto_vs_none_cpu"), profile=("codec", "codec", "random-auto")),
        Goal("codec", "engine `Lz4` logical GB/s / lz4_flex compressing the same 1 MiB blocks alone, lineitem-like",
             "codec", median("lineitem_lz4_vs_crate"), ">=", 0.9,
             shown=lambda d: ratio(d, "lineitem_lz4_vs_crate"), profile=("codec", "codec", "lineitem-lz4")),
        Goal("codec", "spill logical GB/s, encryption on / off, lineitem-like, `None`", "codec",
             median("lineitem_enc_none_vs_none_gb_s"), ">=", 0.8,
             shown=lambda d: ratio(d, "lineitem_enc_none_vs_none_gb_s"), profile=("codec", "codec", "lineitem-enc_none")),
        Goal("codec", "spill logical GB/s, encryption on / off, lineitem-like, `Auto`", "codec",
             median("lineitem_enc_auto_vs_auto_gb_s"), ">=", 0.8,
             shown=lambda d: ratio(d, "lineitem_enc_auto_vs_auto_gb_s"), profile=("codec", "codec", "lineitem-enc_auto")),
        Goal("codec", "spill logical GB/s, encryption on / off, random bytes, `None`", "codec",
             median("random_enc_none_vs_none_gb_s"), ">=", 0.8,
             shown=lambda d: ratio(d, "random_enc_none_vs_none_gb_s"), profile=("codec", "codec", "random-enc_none")),
        Goal("codec", "encryption's CPU per GiB in the engine (on − off, `None`, lineitem-like) vs ring "
             "AES-256-GCM sealing the same blocks alone", "codec",
             lambda d: d["encryption_cpu"]["engine_extra_cpu_s_per_gib"], None, None, unit=" s/GiB",
             shown=lambda d: (f"{f(d['encryption_cpu']['engine_extra_cpu_s_per_gib'], 3)} s/GiB vs "
                              f"{f(d['encryption_cpu']['crate_cpu_s_per_gib'], 3)} s/GiB alone")),
        Goal("codec", "heap allocations per write with compression or encryption on", "codec",
             worst_allocs, "<=", 0, unit="", shown=allocs_shown),
    ])

    def section(d):
        out = [d["what"] + ".", ""]
        if d.get("refused"):
            out += ["Configurations this build refused (not measured): "
                    + "; ".join(f"`{k}`: {v}" for k, v in d["refused"].items()) + ".", ""]
        out += [
               f"Engine backend {d['engine']['backend']}, {d['engine']['write_mode']} mode, root `{d['root']}`;"
               f" {f(d['bytes_per_run'] / 2**20, 0)} MiB logical per run; {d['rounds']} rounds (each data set's"
               f" configurations in one order, reversed every round; medians over rounds, ratios paired per round).", ""]
        order = [v["name"] for v in d.get("variants", [])]
        for ds, dd in d["datasets"].items():
            configs = sorted(dd["configs"].items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))
            out += [f"**{ds}** ({dd['what']}):", "",
                    table(["configuration", "write GB/s", "read GB/s", "physical / logical", "physical / record bytes",
                           "CPU s/GiB write", "CPU s/GiB read", "blocks raw / lz4 / zstd", "compress s/GiB",
                           "encrypt s/GiB", "runs"],
                          [(name, f(c["write_gb_s"], 3), f(c["read_gb_s"], 3), f(c["physical_per_logical"], 3),
                            f(c.get("physical_per_payload"), 3),
                            f(c["cpu_s_per_gib_write"], 3), f(c["cpu_s_per_gib_read"], 3),
                            f"{f(c['blocks']['raw'])} / {f(c['blocks']['lz4'])} / {f(c['blocks']['zstd'])}",
                            f(c["compress_s_per_gib"], 3), f(c["encrypt_s_per_gib"], 3), c["runs"])
                           for name, c in configs]), ""]
        b = d["baselines"]
        out += ["Baselines in the same run, on one thread over the same 1 MiB blocks of lineitem-like rows "
                "(medians over rounds):", "",
                table(["baseline", "GB/s (wall)", "GB per CPU s", "CPU s/GiB", "output / input"],
                      [(name, f(b[k]["gb_s"], 3), f(b[k].get("gb_per_cpu_s"), 3), f(b[k]["cpu_s_per_gib"], 3),
                        f(b[k]["ratio"], 3))
                       for name, k in (("lz4_flex block compress", "lz4_flex"), ("ring AES-256-GCM seal", "aes_gcm"))]),
                "",
                "Ratios (medians of per-round ratios):", "",
                table(["ratio", "measured"], [(k, ratio(d, k)) for k in d["ratios"]]), "",
                "Heap allocations per `write` (dhat, every thread, steady state):", "",
                table(["configuration", "allocs / write", "writes counted"],
                      [(k, f(a["allocs_per_write"], 4), f(a["writes"])) for k, a in d["allocs"]["configs"].items()]), ""]
        if d.get("profiles", {}).get("codec"):
            p = d["profiles"]["codec"]
            out.append(profile_md(p, f"CPU profile of the engine's write runs (`{p.get('what')}`, the worst miss)"))
        return out

    SECTIONS.append(("codec", "Codecs and encryption (segment format v2)", section))


add_codec_rows()


def verdict(g, v):
    """(text, met) for goal `g` at measured value `v`: the one place a figure is judged."""
    if v is None:
        return "not measured", False
    if g.op is None:
        return "context", True
    met = v <= g.target if g.op == "<=" else v >= g.target
    if met:
        return "met", True
    if g.op == ">=":
        return f"missed by {g.target - v:.3g}{g.unit} ({(g.target - v) / g.target * 100:.0f}% short)", False
    if g.target == 0:
        return f"missed: {v:.3g}{g.unit} above 0", False
    return f"missed by {v - g.target:.3g}{g.unit} ({v / g.target:.2f}× the goal)", False


def miss_factor(g, v):
    """How far a missed figure is from its goal (for choosing which miss to profile)."""
    if g.op == ">=":
        return g.target / v if v else float("inf")
    return v / g.target if g.target else float("inf")


def evaluate(docs):
    """Every goal row, judged: dicts with area, figure, measured, goal, verdict, met, value, goal."""
    out = []
    for g in GOALS:
        doc, v, why = docs.get(g.source), None, f"no `{g.source}.json`"
        if doc is not None:
            try:
                v = g.value(doc)
                why = "" if v is not None else "null in the JSON"
            except (KeyError, IndexError, TypeError, ValueError) as e:
                v, why = None, f"`{g.source}.json` has no {e}"
        text, met = verdict(g, v)
        if v is None:
            measured = "not measured"
            text = f"not measured ({why})"
        elif g.shown:
            measured = g.shown(doc)
        else:
            measured = f(v) + (g.unit if g.unit.strip() else "")
        out.append({"area": g.area, "figure": g.figure, "measured": measured, "goal": g.goal_text,
                    "verdict": text, "met": met, "value": v, "g": g, "key": g.key,
                    "context": g.op is None})
    return out


def profiles_wanted(rows):
    """slot -> (bench, what, row) for the worst missed goal of each profile slot."""
    want = {}
    for r in rows:
        g = r["g"]
        if g.profile and not r["met"] and r["value"] is not None:
            slot, bench, what = g.profile
            fac = miss_factor(g, r["value"])
            if slot not in want or fac > want[slot][3]:
                want[slot] = (bench, what, r, fac)
    return {k: v[:3] for k, v in want.items()}


def profile_md(p, title):
    if not p:
        return ""
    if "error" in p:
        return f"\n*{title}: profile not taken ({p['error']}).*\n"
    s = [f"\n**{title}** — `{p['command']}`\n", "CPU samples by thread:\n",
         table(["share", "thread"], [(f"{a:.1f}%", f"`{b}`") for a, b in p["by_thread"]]),
         "\nTop symbols (self time):\n",
         table(["share", "thread / object / symbol"], [(f"{a:.1f}%", f"`{b}`") for a, b in p["top"]])]
    return "\n".join(s) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--command", default="scripts/bench-report.sh")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--target-dir", default=os.environ.get("CARGO_TARGET_DIR", ""))
    ap.add_argument("--profile-secs", type=float, default=5.0)
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    meta = provenance(args)
    docs = {name: load(args.raw, name)
            for name in sorted({g.source for g in GOALS} | set(EXTRA_SOURCES) | {s[0] for s in SECTIONS})}
    cap, hot, tp = docs["capacity"], docs["hot-path"], docs["throughput"]
    led, cln, fio = docs["ledger"], docs["cleanup"], docs["fio-baseline"]
    rep, ovl = docs["repeat"], docs["overlap"]

    rows = evaluate(docs)
    by_key = {r["key"]: r for r in rows}
    wanted = profiles_wanted(rows)

    profiles = {}
    if wanted and not args.no_profile:
        if ensure_perf():
            exes = bench_executables(args.target_dir)
            done = {}
            for slot, (bench, what, _) in wanted.items():
                if (bench, what) not in done:
                    print(f"bench_report: perf profile of {bench} {what}", file=sys.stderr)
                    done[(bench, what)] = profile(exes, bench, what, args.profile_secs, args.raw)
                profiles[slot] = dict(done[(bench, what)], what=what, goal=wanted[slot][2]["figure"])
        else:
            for slot in wanted:
                profiles[slot] = {"error": "perf is not installed (apt-get install linux-perf)"}

    # ---- JSON outputs with provenance
    # Every bench's JSON is copied with its provenance (also the ones no goal reads yet), with
    # the verdicts of its goal rows and the profile taken for it, if any.
    saved = []
    for name in sorted(set(docs) | {os.path.splitext(n)[0] for n in os.listdir(args.raw) if n.endswith(".json")
                                    and not n.startswith("dhat-")}):
        doc = docs.get(name) or load(args.raw, name)
        if doc is None:
            continue
        saved.append(name)
        doc = dict(doc)
        doc["verdicts"] = [{"figure": r["figure"], "value": r["value"], "goal": r["goal"], "verdict": r["verdict"]}
                           for r in rows if r["g"].source == name]
        for slot, (bench, _, r) in wanted.items():
            if r["g"].source == name and slot in profiles:
                doc.setdefault("profiles", {})[slot] = profiles[slot]
        save(args.out, name, doc, meta)

    # ---- plots
    plots = []
    if cap:
        pts = sorted(cap["points"], key=lambda p: p["tickets"])
        svg_points(os.path.join(args.out, "capacity-bytes-per-ticket.svg"),
                   "Heap retained per ticket held by a name-only cleanup record",
                   [p["tickets"] for p in pts], [p["bytes_per_ticket"] for p in pts],
                   "tickets held (log scale)", "bytes per ticket",
                   (CAP_GOAL.target, f"goal ≤ {CAP_GOAL.target:g} B"))
        plots.append("capacity-bytes-per-ticket.svg")
    if tp:
        tprows = tp["rows"]
        impls = ["engine", "std_fs", "tokio_uring"]
        groups, vals, cpu = [], [], []
        for rec in ("1MiB", "64KiB", "4KiB"):
            for mode in ("buffered", "direct"):
                groups.append(f"{rec} {mode}")
                get = lambda k, i: next((r[k] for r in tprows if r["record"] == rec and r["mode"] == mode and r["impl"] == i), None)
                vals.append([get("mb_s", i) for i in impls])
                cpu.append([get("cpu_s_per_gib", i) for i in impls])
        svg_bars(os.path.join(args.out, "throughput-mb-s.svg"),
                 f"Write throughput to the device (sync included), {tp['bytes_per_run'] / 2**20:.0f} MiB per run, median of {tp['rounds']}",
                 groups, impls, vals, "MB/s")
        svg_bars(os.path.join(args.out, "throughput-cpu.svg"), "CPU seconds per GiB written (whole process, log scale)",
                 groups, impls, cpu, "CPU s / GiB", log=True)
        plots += ["throughput-mb-s.svg", "throughput-cpu.svg"]
    if hot:
        groups = [f"{r['record']} {root}" for root in ("tmpfs", "disk") for r in hot["rows"]]
        vals = [[r[k]["engine_us_median"], r[k]["engine_pool_off_us_median"], r[k]["std_fs_read_us_median"]]
                for k in ("paired", "paired_disk_root") for r in hot["rows"]]
        svg_bars(os.path.join(args.out, "hot-path-cycle.svg"),
                 "One spill cycle, a task scope per cycle (median of interleaved rounds)",
                 groups, ["engine, pool on", "engine, pool off", "std::fs create+write+close+open+read+unlink"],
                 vals, "µs per cycle", log=True)
        plots.append("hot-path-cycle.svg")

    # ---- REPORT.md
    m = meta["machine"]
    md = ["# spillring benchmark report", ""]
    if args.quick:
        md += ["> **Quick (CI smoke) run**: small volumes and few samples; these figures prove the benches",
               "> run, they are not the measurement.", ""]
    md += [
        f"- Commit: `{meta['commit']}` ({html.escape(meta['commit_subject'])})"
        + (f", with {meta['dirty_files']} uncommitted file(s) in the tree" if meta["dirty_files"] else ""),
        f"- Date: {meta['date_utc']}",
        f"- Command: `{meta['command']}`",
        f"- Machine: `{m['uname']}`; {m['nproc']} cores; {m['cpu_model']}",
        f"- Toolchain: {meta['rustc']}",
        "",
        "Every figure is a ratio against a baseline measured in the same run, or a count. The host is a",
        "shared VM with a noisy virtio disk: absolute times are context, never pass/fail.",
        "",
        "## Goals",
        "",
        "Verdicts come from one goal table (`GOALS` in `scripts/bench_report.py`); a bench that did not run",
        "shows its rows as not measured.",
        "",
        table(["area", "figure", "measured", "goal", "verdict"],
              [(r["area"], r["figure"], r["measured"], r["goal"], r["verdict"] if r["met"] else f"**{r['verdict']}**")
               for r in rows]),
        "",
        f"Goals met: {sum(1 for r in rows if r['met'] and not r['context'])} of {sum(1 for r in rows if not r['context'])}"
        f" ({sum(1 for r in rows if r['value'] is None and not r['context'])} not measured).",
        "",
    ]
    if cap:
        md += ["## Capacity: heap retained per cleanup ticket (dhat)", "", cap["what"] + ".", "",
               "For each scale a fresh engine spills one-record segments through the public API; every unlink",
               "fails (`IoUnlink`, `CleanupUnlink` → EIO), so each released spill leaves its ticket with a",
               "name-only record in the cleanup worker's queue. dhat profiles the whole process from before",
               "`Engine::open`; the baseline is read after the engine, the task directory and a warm-up exist,",
               f"and the figure is live heap once all records are queued minus that baseline. Record struct: {cap['record_struct_bytes']} bytes.", "",
               "The queue grows by doubling: at a power of two its buffer is exactly full (the best case), just past",
               "one it has just doubled. The goal row takes the worst point measured.", "",
               table(["tickets", "retained bytes", "retained blocks", "bytes / ticket", "goal", "ledger held", "LedgerFull at cap", "all released after"],
                     [(f(p["tickets"]), f(p["retained_bytes"]), f(p["retained_blocks"]),
                       f(p["bytes_per_ticket"]) + (" (worst)" if p["tickets"] == cap.get("worst_at_tickets") else ""),
                       f"≤ {CAP_GOAL.target:g}",
                       f(p["tickets_used"]), f(p["ledger_full_refused_next"]) if p["ledger_full_refused_next"] is not None else "–",
                       f(p["released_after_recovery"])) for p in cap["points"]]),
               "", "![bytes per ticket](capacity-bytes-per-ticket.svg)", ""]
        sites = None
        for p in cap["points"]:
            if p.get("dhat_sites"):
                sites = dhat_sites(p["dhat_sites"], "eb", p["tickets"], top=6)
        if sites:
            md += ["Live heap at the measurement point, by allocation site (bytes per ticket; includes the engine's",
                   "own fixed structures, which the baseline subtracts):", "",
                   table(["bytes / ticket", "blocks / ticket", "site"], [(f"{a:.3f}", f"{b:.5f}", f"`{s}`") for a, b, s in sites]), ""]
    if hot:
        def pr(r, k):
            return r.get(k) or {}
        md += ["## Hot path: repeated spill cycle, a task scope per cycle, vs std::fs", "", hot["what"] + ".",
               f"Engines: backend {hot['engine']['backend']}, {hot['engine']['write_mode']} mode, default configuration"
               f" (pool on) and the same with `pool_max_segments(0)` (pool off); root `{hot.get('root', '?')}`"
               f" (disk root `{hot.get('disk_root', '?')}`).", "",
               "Each cycle makes its own task scope (`engine.task()`), as an executor makes one per task, and ends",
               "when every delete the engine was asked for is confirmed (with the pool on, a released segment goes",
               "to the pool instead of being deleted). The baseline is std::fs create + write + close + open + read",
               "+ unlink of the same bytes. The three sides run in interleaved rounds (order reversed every round);",
               "the ratios are medians of per-round ratios, with their min–max spread. Goal: engine (pool on) /",
               f"std::fs ≤ {HOT_RATIO_MAX}× on both roots. On the disk root, ext4 journal",
               "stalls from the shared device add the same time to all sides.", ""]
        for title, k in (("tmpfs root", "paired"), ("disk root", "paired_disk_root")):
            md += [f"**{title}** ({f(pr(hot['rows'][0], k).get('rounds'))} rounds of "
                   + ", ".join(f"{f(pr(r, k).get('cycles_per_round'))}" for r in hot["rows"]) + " cycles):", "",
                   table(["record", "engine pool on µs", "engine pool off µs", "std::fs + read µs", "on / std::fs", "off / std::fs",
                          "on / off", "goal (on / std::fs)", "pool hits / misses (on)"],
                         [(r["record"], f(pr(r, k).get("engine_us_median"), 1), f(pr(r, k).get("engine_pool_off_us_median"), 1),
                           f(pr(r, k).get("std_fs_read_us_median"), 1), ratio_spread(pr(r, k), "ratio_vs_read"),
                           ratio_spread(pr(r, k), "pool_off_ratio_vs_read"), ratio_spread(pr(r, k), "pool_on_vs_off"),
                           f"≤ {HOT_RATIO_MAX}",
                           f"{f(pr(r, k).get('pool_on_counts', {}).get('hits'))} / {f(pr(r, k).get('pool_on_counts', {}).get('misses'))}")
                          for r in hot["rows"]]), ""]
        md += ["Criterion medians on the tmpfs root (µs per cycle; the std::fs cycle without read-back is context):", "",
               table(["record", "engine pool on", "engine pool off", "std::fs + read", "std::fs (no read)", "on / std::fs + read"],
                     [(r["record"], f(r.get("criterion_engine_us"), 1), f(r.get("criterion_engine_pool_off_us"), 1),
                       f(r.get("criterion_std_fs_read_us"), 1), f(r.get("criterion_std_fs_us"), 1),
                       f(r.get("criterion_ratio_vs_read_baseline"))) for r in hot["rows"]]),
               "", "![cycle](hot-path-cycle.svg)", "",
               "Heap allocations (dhat, every thread of the process, steady state, a task scope per cycle):", "",
               table(["record", "engine / cycle", "std::fs + read / cycle", "per write call", "writes counted", "goal / cycle", "goal / write"],
                     [(r["record"], f(r["allocs"]["engine_allocs_per_cycle"]), f(r["allocs"].get("std_fs_read_allocs_per_cycle")),
                       f(r["allocs"]["allocs_per_write"], 4), f(r["allocs"]["writes"]), "≤ 2", "0") for r in hot["rows"]]), ""]
        if any(not r["met"] and r["value"] is not None for r in rows if r["figure"].startswith("spill cycle")):
            md += ["### Where a cycle's time goes", "",
                   "Caller-side phase medians (µs) of the pool-on engine's cycle on the tmpfs root; the engine's writes run on its ring thread",
                   "(buffered mode: `pwritev` there) and its deletes on io_uring's io-wq workers, so a phase that waits is a thread round trip:", ""]
            names = [p["phase"] for p in hot["rows"][0]["phases"]]
            md += [table(["phase"] + [r["record"] for r in hot["rows"]],
                         [(n, *[f(next(p["us_median"] for p in r["phases"] if p["phase"] == n), 1) for r in hot["rows"]]) for n in names]), ""]
            if "hot" in wanted:
                md.append(profile_md(profiles.get("hot"), f"CPU profile of engine cycles (`{wanted['hot'][1]}`, the worst miss)"))
            if profiles.get("hot") and "error" not in profiles["hot"]:
                md += ["Samples of `do_sched_yield`, `__schedule` and `__sched_yield` on the bench's own thread are its",
                       "yield loop waiting for the delete confirmation, not engine work; `iou-wrk` is io_uring's worker",
                       "pool (unlinkat), `spillring-reape` closes files and unmaps read-back maps not kept with their",
                       "pooled files (`smp_call_function_many_cond` is munmap's TLB shootdown).", ""]
        if any(not r["met"] and r["value"] is not None for r in rows if r["figure"].startswith("heap allocations")):
            r = next((r for r in hot["rows"] if r["record"] == "64KiB"), hot["rows"][0])
            cyc = dhat_sites(r["allocs"]["dhat_cycle_sites"], "tbk", r["allocs"]["cycles"])
            md += ["### Where the allocations are (dhat, {} records)".format(r["record"]), "",
                   "Per cycle, by first engine frame (allocator and std frames skipped):", "",
                   table(["allocs / cycle", "bytes / cycle", "site"], [(f"{a:.3f}", f"{b:.0f}", f"`{s}`") for a, b, s in cyc]), ""]
            for r in hot["rows"]:
                ws = dhat_sites(r["allocs"]["dhat_write_sites"], "tbk", r["allocs"]["writes"], top=5)
                if ws:
                    md += [f"Per `write` call, {r['record']} records ({r['allocs']['writes']} writes counted):", "",
                           table(["allocs / write", "bytes / write", "site"], [(f"{a:.4f}", f"{b:.1f}", f"`{s}`") for a, b, s in ws]), ""]
    if tp:
        md += ["## Throughput", "",
               f"{tp['bytes_per_run'] / 2**20:.0f} MiB per run (the 4 KiB direct baselines: the row's MiB per run, what their runs wrote),",
               f"{tp['rounds']} interleaved round(s), medians; engine backend {tp['backend']};",
               f"tokio-uring keeps {tp['tokio_uring_in_flight']} writes in flight. Definitions:", ""]
        md += [f"- **{k}**: {v}" for k, v in tp["definitions"].items()]
        md += ["", table(["record", "mode", "impl", "MiB per run", "MB/s", "CPU s/GiB", "caller-blocked s/GiB", "caller CPU s/GiB"],
                         [(r["record"], r["mode"], r["impl"], f(r["bytes_per_run"] / 2**20, 0),
                           f(r["mb_s"], 0), f(r["cpu_s_per_gib"], 3),
                           f(r["caller_blocked_s_per_gib"], 3), f(r["caller_cpu_s_per_gib"], 3)) for r in tp["rows"]]),
               "", "Goal ratios (median of per-round ratios, engine vs the std::fs buffered writer at the same record size):", "",
               table(["record", "engine mode", "CPU ratio", "CPU goal", "caller-blocked ratio", "blocked goal", "MB/s vs tokio-uring", "MB/s vs std::fs same mode"],
                     [(g["record"], g["mode"], f(g["cpu_ratio_vs_std_buffered"]),
                       by_key.get(f"CPU/GiB engine {g['mode']} / std::fs buffered, {g['record']}", {}).get("goal", "–"),
                       f(g["blocked_ratio_vs_std_buffered"]),
                       by_key.get(f"caller-blocked/GiB engine {g['mode']} / std::fs buffered, {g['record']}", {}).get("goal", "–"),
                       f(g["mb_s_ratio_vs_tokio_uring"]),
                       f(g["mb_s_ratio_vs_std_fs_same_mode"])) for g in tp["goal_rows"]]),
               "", "![throughput](throughput-mb-s.svg)", "", "![cpu](throughput-cpu.svg)", ""]
        if profiles.get("tp"):
            md.append(profile_md(profiles["tp"], f"CPU profile of the engine's writer (`{wanted['tp'][1]}`, the worst miss)"))
    if led:
        md += ["## Ledger", "", led["what"] + ".", "",
               table(["threads", "reserve+release ns", "atomic baseline ns", "ratio"],
                     [(r["threads"], f(r["reserve_release_ns"], 1), f(r["atomic_baseline_ns"], 1), f(r["ratio"])) for r in led["rows"]]), ""]
    if cln:
        md += ["## Cleanup worker", "",
               table(["figure", "measured", "baseline (same run)", "ratio", "goal"],
                     [("drain of 8 ready records, no-op deleter", f"{f(cln['drain_8_noop_us'], 1)} µs",
                       f"thread wake round trip {f(cln['thread_round_trip_us'], 1)} µs", f"{f(cln['drain_in_round_trips'])} round trips",
                       by_key["drain of 8 ready records, no-op deleter"]["goal"]),
                      ("1,000 deletes: worker batch vs std::fs one by one", f"{f(cln['batch_1000_engine_us'], 0)} µs",
                       f"{f(cln['batch_1000_std_one_by_one_us'], 0)} µs", f"{f(cln['batch_1000_ratio'])}×", "–")]),
               "", f"Segment files of {cln['segment_file_bytes']} bytes; drain measured on `{cln['root_fs']['drain']}`, batch on `{cln['root_fs']['batch']}`.", ""]
        md.append(profile_md(profiles.get("drain"), "CPU profile of repeated 8-record drains (setup included)"))
    if fio:
        md += ["## fio baseline (direct mode)", "", f"`{fio['fio_command']}`", "",
               table(["pair", "fio MB/s", "engine MB/s", "engine / fio"],
                     [(i + 1, f(p["fio_mb_s"], 0), f(p["engine_mb_s"], 0), f(p["ratio"], 3)) for i, p in enumerate(fio["pairs"])]),
               "", f"Median ratio **{fio['ratio_median']:.3f}** (goal {by_key[FIO_KEY]['goal']}: {by_key[FIO_KEY]['verdict']}); {fio['fio_version']}, {fio['size_mib']} MiB per run.", ""]
        if profiles.get("fio") and profiles["fio"].get("what") != profiles.get("tp", {}).get("what"):
            md.append(profile_md(profiles["fio"], "CPU profile of the engine's direct-mode writer, 1 MiB records"))
        elif profiles.get("fio"):
            md.append("The CPU profile of the same direct-mode writer is in the throughput section.\n")
    md += ["## Repeat: back-to-back direct-mode spills on one engine", ""]
    if rep:
        md += [rep["what"] + ".", "",
               f"{rep['bytes_per_round'] / 2**20:.0f} MiB per round in {rep['record_bytes'] // 2**10} KiB records, {rep['rounds']} rounds on one"
               f" engine per configuration (backend {rep['engine']['backend']}, {rep['engine']['write_mode']} mode), root `{rep['root']}`.",
               "Each round runs fio, one engine, fio, the other engine (pool on first in odd rounds, pool off first in even",
               "ones), so every engine run follows a fio run; the round's fio MB/s is the mean of its two fio runs. MB/s is the",
               "write + `finish` part, the read-back is context. The figures are medians over rounds "
               f"{rep['counted_rounds']} of the per-round ratios (round 1 is the pool's cold round, shown, not counted).", "",
               f"fio: {rep['fio_note']}" + (f", {rep['fio_version']}: `{rep['fio_command']}`" if rep.get("fio_command") else "") + ".", "",
               table(["round", "counted", "pool on MB/s", "pool off MB/s", "fio MB/s", "on / fio", "on / off",
                      "read MB/s on / off", "segments", "pool hits / misses (on)"],
                     [(r["round"], "yes" if r["counted"] else "no (cold)", f(r["pool_on_mb_s"], 0), f(r["pool_off_mb_s"], 0),
                       f(r["fio_mb_s"], 0) if r["fio_mb_s"] is not None else "not measured",
                       f(r["pool_on_vs_fio"], 3), f(r["pool_on_vs_pool_off"]),
                       f"{f(r['pool_on_read_mb_s'], 0)} / {f(r['pool_off_read_mb_s'], 0)}", f(r["segments"]),
                       f"{f(r['pool_on_hits'])} / {f(r['pool_on_misses'])}") for r in rep["rows"]]), "",
               "Goals (rows of the goal table above):", "",
               table(["figure", "measured", "goal", "verdict"],
                     [(r["figure"], r["measured"], r["goal"], r["verdict"]) for r in rows if r["area"] == "repeat"]), ""]
    else:
        md += ["Not measured (no `repeat.json`).", ""]
    md += ["## Overlap: a producer that computes as long as the device writes", ""]
    if ovl:
        cal = ovl["calibration"]
        md += [ovl["what"] + ".", "",
               f"{ovl['bytes_per_run'] / 2**20:.0f} MiB per run in {ovl['record_bytes'] // 2**10} KiB records; engine backend"
               f" {ovl['engine']['backend']}, {ovl['engine']['write_mode']} mode, pool on; root `{ovl['root']}`. Calibration:"
               f" the engine wrote the run alone in {f(cal['engine_write_alone_s'], 3)} s, so the producer aims to compute"
               f" {f(cal['compute_target_us_per_record'], 1)} µs per record ({f(cal['spins_per_record'])} spins).",
               "Each pair runs compute alone, engine write alone, engine with compute, std::fs write alone and std::fs",
               "with compute (the order reversed every other pair). Neither side syncs: an O_DIRECT write completes",
               "when the device has the bytes, and `finish` waits for every engine write.", "",
               table(["pair", "compute s", "engine write s", "engine both s", "engine / longer", "std write s", "std both s",
                      "std / longer", "compute / engine write"],
                     [(r["pair"], f(r["compute_alone_s"], 3), f(r["engine_write_alone_s"], 3), f(r["engine_with_compute_s"], 3),
                       f(r["engine_vs_longer"], 3), f(r["std_write_alone_s"], 3), f(r["std_with_compute_s"], 3),
                       f(r["std_vs_longer"], 3), f(r["compute_vs_engine_write"])) for r in ovl["rows"]]), "",
               table(["figure", "measured", "goal", "verdict"],
                     [(r["figure"], r["measured"], r["goal"], r["verdict"]) for r in rows if r["area"] == "overlap"]
                     + [("balance: compute alone / engine write alone", stats_spread(ovl["compute_vs_engine_write"]), "≈ 1", "context"),
                        ("engine with compute / std::fs with compute", stats_spread(ovl["engine_vs_std"], 3), "–", "context")]), ""]
        md.append(profile_md(profiles.get("overlap"), "CPU profile of the engine with the computing producer"))
    else:
        md += ["Not measured (no `overlap.json`).", ""]
    for source, title, render in SECTIONS:
        md += [f"## {title}", ""]
        # A section sees the profiles taken for its bench's missed goals under "profiles" (by slot).
        own = {slot: dict(p, what=wanted[slot][1]) for slot, p in profiles.items() if wanted[slot][2]["g"].source == source}
        md += (render(dict(docs[source], profiles=own)) if docs.get(source) is not None
               else [f"Not measured (no `{source}.json`).", ""])
    md += ["## Files", "", "JSON with the same figures, their verdicts and their provenance: "
           + ", ".join(f"`{n}.json`" for n in saved)
           + ". Plots: " + ", ".join(f"`{p}`" for p in plots) + ".", ""]
    with open(os.path.join(args.out, "REPORT.md"), "w") as fh:
        fh.write("\n".join(md))
    print(f"bench_report: wrote {os.path.join(args.out, 'REPORT.md')}", file=sys.stderr)


if __name__ == "__main__":
    main()
