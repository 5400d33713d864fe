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


def miss_le(measured, goal, unit=""):
    """Text for a '<= goal' figure."""
    if measured is None:
        return "not measured"
    if measured <= goal:
        return "met"
    if goal == 0:
        return f"missed: {measured:.3g}{unit} above 0"
    return f"missed by {measured - goal:.3g}{unit} ({measured / goal:.2f}× the goal)"


def miss_ge(measured, goal):
    if measured is None:
        return "not measured"
    if measured >= goal:
        return "met"
    return f"missed by {goal - measured:.3f} ({(goal - measured) / goal * 100:.0f}% short)"


HOT_SIZES = ("4KiB", "64KiB", "1MiB")


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


def table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out)


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


def scale_section(raw, out, meta, goals):
    """The 10,000-spill scale bench (benches/benches/scale.rs, issue 10): its goal rows are
    appended to `goals`, scale.json is saved with provenance, and the REPORT.md lines are
    returned (empty when the bench did not run)."""
    sc = load(raw, "scale")
    if not sc:
        return []
    n = f(sc["spills"])
    per = f"{sc['bytes_per_writer'] // 1024} KiB"
    goals.append(("scale", f"{n} concurrent open spills (writer with {per} written, state, reader): refused",
                  f(sc["refused"]), "0", "met" if sc["refused"] == 0 else f"missed: {sc['refused']} refused",
                  sc["refused"] == 0))
    goals.append(("scale", f"{n} concurrent open spills: peak extra fds",
                  f(sc["peak_extra_fds"]), f"≤ {f(sc['goal_extra_fds_max'])}",
                  miss_le(sc["peak_extra_fds"], sc["goal_extra_fds_max"]),
                  sc["peak_extra_fds"] <= sc["goal_extra_fds_max"]))
    goals.append(("scale", f"memory (RSS) per idle open writer, {per} written",
                  f"{f(sc['rss_bytes_per_idle_writer'] / 1024, 1)} KiB", "reported", "context", True))
    save(out, "scale", sc, meta)
    ph = sc["phase_seconds"]
    return ["## Scale: 10,000 concurrent open spills", "", sc["what"] + ".", "",
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
    cap, hot, tp = load(args.raw, "capacity"), load(args.raw, "hot-path"), load(args.raw, "throughput")
    led, cln, fio = load(args.raw, "ledger"), load(args.raw, "cleanup"), load(args.raw, "fio-baseline")
    rep = load(args.raw, "repeat")

    goals = []  # (area, figure, measured, goal text, verdict, met)
    wanted = {}  # profile key -> (bench, what, reason)
    if cap:
        b = cap.get("bytes_per_ticket_at_capacity")
        goals.append(("capacity", "retained heap per ticket at 65,536 tickets", f"{f(b)} B", "≤ 16 B",
                      miss_le(b, cap["goal_bytes_per_ticket"], " B"), cap.get("met")))
    worst_hot = None
    hot_goal = (hot or {}).get("goals", {}).get("ratio_vs_read_max", 0.5)
    hot_rows = {r["record"]: r for r in (hot or {}).get("rows", [])}
    for root, pkey, mkey in (("tmpfs root", "paired", "ratio_vs_read_met"),
                             ("disk root", "paired_disk_root", "disk_ratio_vs_read_met")):
        for rec in HOT_SIZES:
            r = hot_rows.get(rec)
            p = (r or {}).get(pkey) or {}
            v = p.get("ratio_vs_read_median")
            goals.append(("hot path", f"spill cycle, task per cycle, engine / std::fs with read-back, {rec} ({root})",
                          ratio_spread(p, "ratio_vs_read"), f"≤ {hot_goal}×", miss_le(v, hot_goal, "×"),
                          bool(r and r.get(mkey))))
            if v is not None and not r.get(mkey) and (worst_hot is None or v > worst_hot[1]):
                worst_hot = (rec, v, root)
    for root, pkey in (("tmpfs root", "paired"), ("disk root", "paired_disk_root")):
        for rec in HOT_SIZES:
            p = (hot_rows.get(rec) or {}).get(pkey) or {}
            goals.append(("hot path", f"same cycle, engine pool off / std::fs with read-back, {rec} ({root})",
                          ratio_spread(p, "pool_off_ratio_vs_read"), "–", "context", True))
            goals.append(("hot path", f"same cycle, engine pool on / pool off, {rec} ({root})",
                          ratio_spread(p, "pool_on_vs_off"), "–", "context", True))
    for rec in HOT_SIZES:
        r = hot_rows.get(rec)
        a = (r or {}).get("allocs") or {}
        goals.append(("hot path", f"heap allocations per write, {rec}", f(a.get("allocs_per_write"), 4),
                      "0", miss_le(a.get("allocs_per_write"), 0.0), bool(r and r["allocs_per_write_met"])))
    for rec in HOT_SIZES:
        r = hot_rows.get(rec)
        a = (r or {}).get("allocs") or {}
        goals.append(("hot path", f"heap allocations per cycle (task per cycle), {rec}", f(a.get("engine_allocs_per_cycle")),
                      "≤ 2", miss_le(a.get("engine_allocs_per_cycle"), 2.0), bool(r and r["allocs_per_cycle_met"])))
    if worst_hot:
        disk = "disk-" if worst_hot[2] == "disk root" else ""
        wanted["hot"] = ("hot_path", f"cycle-{disk}{worst_hot[0]}", "hot-path ratio")
    rep_goals = (rep or {}).get("goals", {})
    vs_fio = (rep or {}).get("pool_on_vs_fio")
    vs_off = (rep or {}).get("pool_on_vs_pool_off")
    rounds = (rep or {}).get("counted_rounds", "2-6")
    size = f"{rep['bytes_per_round'] / 2**20:.0f} MiB" if rep else "1 GiB"
    goals.append(("repeat", f"back-to-back {size} direct spills, rounds {rounds}: engine pool on / fio (same job, same run)",
                  stats_spread(vs_fio, 3), f"≥ {rep_goals.get('pool_on_vs_fio_min', 0.9)}×",
                  miss_ge(vs_fio and vs_fio["median"], rep_goals.get("pool_on_vs_fio_min", 0.9)),
                  bool(rep and rep.get("pool_on_vs_fio_met"))))
    goals.append(("repeat", f"back-to-back {size} direct spills, rounds {rounds}: engine pool on / pool off",
                  stats_spread(vs_off), f"≥ {rep_goals.get('pool_on_vs_pool_off_min', 2.0)}×",
                  miss_ge(vs_off and vs_off["median"], rep_goals.get("pool_on_vs_pool_off_min", 2.0)),
                  bool(rep and rep.get("pool_on_vs_pool_off_met"))))
    scale_md = scale_section(args.raw, args.out, meta, goals)
    worst_cpu = None
    if tp:
        for gr in tp["goal_rows"]:
            if gr["mode"] == "direct":
                goals.append(("throughput", f"CPU/GiB engine direct / std::fs buffered, {gr['record']}",
                              f"{f(gr['cpu_ratio_vs_std_buffered'])}×", "≤ 0.2×",
                              miss_le(gr["cpu_ratio_vs_std_buffered"], 0.2, "×"), gr["cpu_met"]))
                if not gr["cpu_met"] and (worst_cpu is None or gr["cpu_ratio_vs_std_buffered"] > worst_cpu[1]):
                    worst_cpu = (gr["record"], gr["cpu_ratio_vs_std_buffered"])
        for gr in tp["goal_rows"]:
            goals.append(("throughput", f"caller-blocked/GiB engine {gr['mode']} / std::fs buffered, {gr['record']}",
                          f"{f(gr['blocked_ratio_vs_std_buffered'])}×", "≤ 0.1×",
                          miss_le(gr["blocked_ratio_vs_std_buffered"], 0.1, "×"), gr["blocked_met"]))
        if worst_cpu:
            wanted["tp"] = ("throughput", f"engine-direct-{worst_cpu[0]}", "direct-mode CPU and caller-blocked time")
        elif any(not gr["blocked_met"] for gr in tp["goal_rows"]):
            wanted["tp"] = ("throughput", "engine-direct-1MiB", "caller-blocked time")
    if cln:
        goals.append(("cleanup", "drain of 8 ready records, no-op deleter", f"{f(cln['drain_8_noop_us'], 1)} µs",
                      "≤ 2 µs (MatrixOne: 9.8 µs)", miss_le(cln["drain_8_noop_us"], cln["drain_goal_us"], " µs"),
                      cln.get("drain_met")))
        if not cln.get("drain_met"):
            wanted["drain"] = ("cleanup", "drain8", "cleanup drain")
    if fio:
        goals.append(("fio", "engine direct MB/s / fio MB/s (same job)", f"{f(fio['ratio_median'], 3)}×", "≥ 0.95×",
                      miss_ge(fio["ratio_median"], fio["goal_ratio_min"]), fio["met"]))
        if not fio["met"]:
            wanted["fio"] = ("throughput", "engine-direct-1MiB", "fio ratio")

    profiles = {}
    if wanted and not args.no_profile:
        if ensure_perf():
            exes = bench_executables(args.target_dir)
            done = {}
            for key, (bench, what, _) in wanted.items():
                if (bench, what) not in done:
                    print(f"bench_report: perf profile of {bench} {what}", file=sys.stderr)
                    done[(bench, what)] = profile(exes, bench, what, args.profile_secs, args.raw)
                profiles[key] = done[(bench, what)]
        else:
            for key in wanted:
                profiles[key] = {"error": "perf is not installed (apt-get install linux-perf)"}

    # ---- JSON outputs with provenance
    for name, doc in (("capacity", cap), ("hot-path", hot), ("throughput", tp), ("ledger", led),
                      ("cleanup", cln), ("fio-baseline", fio), ("repeat", rep)):
        if doc is not None:
            if name == "hot-path":
                doc = dict(doc)
                doc["profile"] = profiles.get("hot")
            if name == "throughput":
                doc = dict(doc)
                doc["profile"] = profiles.get("tp")
            save(args.out, name, doc, meta)

    # ---- plots
    plots = []
    if cap:
        pts = sorted(cap["points"], key=lambda p: p["tickets"])
        svg_points(os.path.join(args.out, "capacity-bytes-per-ticket.svg"),
                   "Heap retained per ticket held by a name-only cleanup record",
                   [p["tickets"] for p in pts], [p["bytes_per_ticket"] for p in pts],
                   "tickets held (log scale)", "bytes per ticket", (16, "goal ≤ 16 B"))
        plots.append("capacity-bytes-per-ticket.svg")
    if tp:
        rows = tp["rows"]
        impls = ["engine", "std_fs", "tokio_uring"]
        groups, vals, cpu = [], [], []
        for rec in ("1MiB", "64KiB", "4KiB"):
            for mode in ("buffered", "direct"):
                groups.append(f"{rec} {mode}")
                get = lambda k, i: next((r[k] for r in rows if r["record"] == rec and r["mode"] == mode and r["impl"] == i), None)
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
        table(["area", "figure", "measured", "goal", "verdict"],
              [(a, b, c, d, e if met else f"**{e}**") for a, b, c, d, e, met in goals]),
        "",
        f"Goals met: {sum(1 for g in goals if g[4] == 'met')} of {sum(1 for g in goals if g[4] != 'context')}.",
        "",
    ]
    if cap:
        md += ["## Capacity: heap retained per cleanup ticket (dhat)", "", cap["what"] + ".", "",
               "For each scale a fresh engine spills one-record segments through the public API; every unlink",
               "fails (`IoUnlink`, `CleanupUnlink` → EIO), so each released spill leaves its ticket with a",
               "name-only record in the cleanup worker's queue. dhat profiles the whole process from before",
               "`Engine::open`; the baseline is read after the engine, the task directory and a warm-up exist,",
               f"and the figure is live heap once all records are queued minus that baseline. Record struct: {cap['record_struct_bytes']} bytes.", "",
               table(["tickets", "retained bytes", "retained blocks", "bytes / ticket", "goal", "ledger held", "LedgerFull at cap", "all released after"],
                     [(f(p["tickets"]), f(p["retained_bytes"]), f(p["retained_blocks"]), f(p["bytes_per_ticket"]),
                       "≤ 16" if p["tickets"] in (1024, 16384, 65536) else "(not a goal point)",
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
               f"std::fs ≤ {hot['goals'].get('ratio_vs_read_max', 0.5)}× on both roots. On the disk root, ext4 journal",
               "stalls from the shared device add the same time to all sides.", ""]
        for title, k in (("tmpfs root", "paired"), ("disk root", "paired_disk_root")):
            md += [f"**{title}** ({f(pr(hot['rows'][0], k).get('rounds'))} rounds of "
                   + ", ".join(f"{f(pr(r, k).get('cycles_per_round'))}" for r in hot["rows"]) + " cycles):", "",
                   table(["record", "engine pool on µs", "engine pool off µs", "std::fs + read µs", "on / std::fs", "off / std::fs",
                          "on / off", "goal (on / std::fs)", "pool hits / misses (on)"],
                         [(r["record"], f(pr(r, k).get("engine_us_median"), 1), f(pr(r, k).get("engine_pool_off_us_median"), 1),
                           f(pr(r, k).get("std_fs_read_us_median"), 1), ratio_spread(pr(r, k), "ratio_vs_read"),
                           ratio_spread(pr(r, k), "pool_off_ratio_vs_read"), ratio_spread(pr(r, k), "pool_on_vs_off"),
                           f"≤ {hot['goals'].get('ratio_vs_read_max', 0.5)}",
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
        if any(not (r["ratio_vs_read_met"] and r["disk_ratio_vs_read_met"]) for r in hot["rows"]):
            md += ["### Where a cycle's time goes", "",
                   "Caller-side phase medians (µs) of the pool-on engine's cycle on the tmpfs root; the engine's I/O runs on its ring thread",
                   "and io_uring's io-wq workers, so a phase that waits is a thread round trip:", ""]
            names = [p["phase"] for p in hot["rows"][0]["phases"]]
            md += [table(["phase"] + [r["record"] for r in hot["rows"]],
                         [(n, *[f(next(p["us_median"] for p in r["phases"] if p["phase"] == n), 1) for r in hot["rows"]]) for n in names]), ""]
            if worst_hot:
                md.append(profile_md(profiles.get("hot"), f"CPU profile of engine cycles ({worst_hot[0]}, {worst_hot[2]})"))
            if profiles.get("hot") and "error" not in profiles["hot"]:
                md += ["Samples of `do_sched_yield`, `__schedule` and `__sched_yield` on the bench's own thread are its",
                       "yield loop waiting for the delete confirmation, not engine work; `iou-wrk` is io_uring's worker",
                       "pool (unlinkat and buffered writes that could not complete inline), `spillring-reape` closes",
                       "files and unmaps read-back maps (`smp_call_function_many_cond` is munmap's TLB shootdown).", ""]
        if any(not (r["allocs_per_cycle_met"] and r["allocs_per_write_met"]) for r in hot["rows"]):
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
               f"{tp['bytes_per_run'] / 2**20:.0f} MiB per run, {tp['rounds']} interleaved round(s), medians; engine backend {tp['backend']};",
               f"tokio-uring keeps {tp['tokio_uring_in_flight']} writes in flight. Definitions:", ""]
        md += [f"- **{k}**: {v}" for k, v in tp["definitions"].items()]
        md += ["", table(["record", "mode", "impl", "MiB per run", "MB/s", "CPU s/GiB", "caller-blocked s/GiB", "caller CPU s/GiB"],
                         [(r["record"], r["mode"], r["impl"], f(r.get("bytes_per_run", tp["bytes_per_run"]) // 2**20),
                           f(r["mb_s"], 0), f(r["cpu_s_per_gib"], 3),
                           f(r["caller_blocked_s_per_gib"], 3), f(r["caller_cpu_s_per_gib"], 3)) for r in tp["rows"]]),
               "", "Goal ratios (median of per-round ratios, engine vs the std::fs buffered writer at the same record size):", "",
               table(["record", "engine mode", "CPU ratio", "CPU goal", "caller-blocked ratio", "blocked goal", "MB/s vs tokio-uring", "MB/s vs std::fs same mode"],
                     [(g["record"], g["mode"], f(g["cpu_ratio_vs_std_buffered"]), "≤ 0.2" if g["cpu_goal"] else "–",
                       f(g["blocked_ratio_vs_std_buffered"]), "≤ 0.1", f(g["mb_s_ratio_vs_tokio_uring"]),
                       f(g["mb_s_ratio_vs_std_fs_same_mode"])) for g in tp["goal_rows"]]),
               "", "![throughput](throughput-mb-s.svg)", "", "![cpu](throughput-cpu.svg)", ""]
        if profiles.get("tp"):
            md.append(profile_md(profiles["tp"], "CPU profile of the engine's direct-mode writer"
                                 + (f" ({worst_cpu[0]} records)" if worst_cpu else "")))
    if led:
        md += ["## Ledger", "", led["what"] + ".", "",
               table(["threads", "reserve+release ns", "atomic baseline ns", "ratio"],
                     [(r["threads"], f(r["reserve_release_ns"], 1), f(r["atomic_baseline_ns"], 1), f(r["ratio"])) for r in led["rows"]]), ""]
    if cln:
        md += ["## Cleanup worker", "",
               table(["figure", "measured", "baseline (same run)", "ratio", "goal"],
                     [("drain of 8 ready records, no-op deleter", f"{f(cln['drain_8_noop_us'], 1)} µs",
                       f"thread wake round trip {f(cln['thread_round_trip_us'], 1)} µs", f"{f(cln['drain_in_round_trips'])} round trips",
                       f"≤ {cln['drain_goal_us']} µs (MatrixOne {cln['matrixone_drain_8_us']} µs)"),
                      ("1,000 deletes: worker batch vs std::fs one by one", f"{f(cln['batch_1000_engine_us'], 0)} µs",
                       f"{f(cln['batch_1000_std_one_by_one_us'], 0)} µs", f"{f(cln['batch_1000_ratio'])}×", "–")]),
               "", f"Segment files of {cln['segment_file_bytes']} bytes; drain measured on `{cln['root_fs']['drain']}`, batch on `{cln['root_fs']['batch']}`.", ""]
        md.append(profile_md(profiles.get("drain"), "CPU profile of repeated 8-record drains (setup included)"))
    if fio:
        md += ["## fio baseline (direct mode)", "", f"`{fio['fio_command']}`", "",
               table(["pair", "fio MB/s", "engine MB/s", "engine / fio"],
                     [(i + 1, f(p["fio_mb_s"], 0), f(p["engine_mb_s"], 0), f(p["ratio"], 3)) for i, p in enumerate(fio["pairs"])]),
               "", f"Median ratio **{fio['ratio_median']:.3f}** (goal ≥ {fio['goal_ratio_min']}); {fio['fio_version']}, {fio['size_mib']} MiB per run.", ""]
        if profiles.get("fio") and profiles.get("fio") is not profiles.get("tp"):
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
               table(["figure", "median (rounds " + rep["counted_rounds"] + ")", "goal", "verdict"],
                     [("pool on / fio", stats_spread(rep.get("pool_on_vs_fio"), 3), f"≥ {rep['goals']['pool_on_vs_fio_min']}×",
                       miss_ge(rep["pool_on_vs_fio"] and rep["pool_on_vs_fio"]["median"], rep["goals"]["pool_on_vs_fio_min"])),
                      ("pool on / pool off", stats_spread(rep.get("pool_on_vs_pool_off")), f"≥ {rep['goals']['pool_on_vs_pool_off_min']}×",
                       miss_ge(rep["pool_on_vs_pool_off"]["median"], rep["goals"]["pool_on_vs_pool_off_min"]))]), ""]
    else:
        md += ["Not measured (no `repeat.json`).", ""]
    md += scale_md
    md += ["## Files", "", "JSON with the same figures and their provenance: "
           + ", ".join(f"`{n}.json`" for n, d in (("capacity", cap), ("hot-path", hot), ("throughput", tp), ("ledger", led),
                                                     ("cleanup", cln), ("fio-baseline", fio), ("repeat", rep)) if d is not None)
           + ". Plots: " + ", ".join(f"`{p}`" for p in plots) + ".", ""]
    with open(os.path.join(args.out, "REPORT.md"), "w") as fh:
        fh.write("\n".join(md))
    print(f"bench_report: wrote {os.path.join(args.out, 'REPORT.md')}", file=sys.stderr)


if __name__ == "__main__":
    main()
