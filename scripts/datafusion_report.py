#!/usr/bin/env python3
"""results/DATAFUSION.md from the JSON that `datafusion_spill all` wrote (one file per run of
scripts/datafusion-bench.sh: as is, and inside a memory cgroup). Ratios are taken per round,
against the default backend's run of the same query in that round (the runs interleave), then
summarised as a median with the spread (min-max) over rounds."""
import argparse
import json
import os
import platform
import statistics
from collections import defaultdict

BACKENDS = ["default", "buffered", "direct", "auto-quota"]
LABEL = {
    "default": "DataFusion's temp files",
    "buffered": "spillring, buffered",
    "direct": "spillring, direct",
    "auto-quota": "spillring, direct, `Auto` under a quota",
    "df-lz4": "DataFusion's temp files, its `spill_compression = lz4_frame`",
    "lz4": "spillring `Lz4`, DataFusion's compression off",
    "lz4+df-lz4": "spillring `Lz4` and DataFusion's `lz4_frame`",
}
QUERIES = ["order_by", "group_by", "repartition"]


def rounds(runs):
    """{(query, backend): [run of round 0, round 1, ...]} in the order they ran."""
    out = defaultdict(list)
    for r in runs:
        out[(r["query"], r["backend"])].append(r)
    return out


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def spread(xs):
    return f"{min(xs):.2f}-{max(xs):.2f}" if xs else "-"


def spill_s(r):
    return r["write_s"] + r["read_s"]


def ratios(by, q, b, f):
    """Per-round ratios f(backend run) / f(default run), rounds where both ran."""
    out = []
    for x, d in zip(by[(q, b)], by[(q, "default")]):
        if x["ok"] and d["ok"] and f(d) > 0:
            out.append(f(x) / f(d))
    return out


def table(doc, setting):
    by = rounds(doc["runs"])
    lines = []
    lines.append(
        "| query | backend | runs ok | wall s (median) | wall ÷ default | spill I/O s | spill I/O ÷ default | spilled MiB (DataFusion's) | on disk MiB | on disk ÷ spilled | peak RSS MiB | RSS − default's MiB | peak anon / file-backed MiB | same rows as default |"
    )
    lines.append("|" + "---|" * 14)
    summary = {}
    for q in QUERIES:
        for b in BACKENDS:
            rs = by.get((q, b), [])
            if not rs:
                continue
            ok = [r for r in rs if r["ok"]]
            d_ok = [r for r in by.get((q, "default"), []) if r["ok"]]
            wall = [r["wall_s"] for r in ok]
            io = [spill_s(r) for r in ok]
            wr = ratios(by, q, b, lambda r: r["wall_s"])
            ior = ratios(by, q, b, spill_s)
            spilled = med([r["spilled_bytes"] for r in ok]) / 2**20 if ok else float("nan")
            phys = med([r["physical_bytes"] for r in ok]) / 2**20 if ok else float("nan")
            rss = med([r["peak_rss_kib"] for r in ok]) / 1024 if ok else float("nan")
            d_rss = med([r["peak_rss_kib"] for r in d_ok]) / 1024 if d_ok else float("nan")
            anon = med([r.get("peak_anon_kib", 0) for r in ok]) / 1024 if ok else float("nan")
            filed = med([r.get("peak_file_kib", 0) for r in ok]) / 1024 if ok else float("nan")
            hashes = {(r["rows"], r["hash"]) for r in ok} | {(r["rows"], r["hash"]) for r in d_ok}
            same = "yes" if len(hashes) == 1 else f"NO ({len(hashes)} distinct)"
            summary[(q, b)] = dict(
                wall=med(wr) if wr else None,
                io=med(ior) if ior else None,
                phys_ratio=(phys / spilled) if spilled else None,
                rss_over=rss - d_rss,
                same=len(hashes) == 1,
                ok=len(ok),
                runs=len(rs),
            )
            if b == "default":
                wcol, iocol, rcol = "1", "1", "0"
            else:
                wcol = f"{med(wr):.3f} ({spread(wr)})" if wr else "-"
                iocol = f"{med(ior):.3f} ({spread(ior)})" if ior else "-"
                rcol = f"{rss - d_rss:+.0f}"
            errors = {r["error"] for r in rs if not r["ok"]}
            okcol = f"{len(ok)}/{len(rs)}" + (
                f" ({'; '.join(sorted(e[:80] for e in errors if e))})" if errors else ""
            )
            lines.append(
                f"| {q} | {LABEL[b]} | {okcol} | {med(wall):.2f} | {wcol} | {med(io):.2f} | {iocol} | {spilled:.0f} | {phys:.0f} | {phys / spilled if spilled else float('nan'):.3f} | {rss:.0f} | {rcol} | {anon:.0f} / {filed:.0f} | {same} |"
            )
    return lines, summary


def compression_table(doc):
    by = rounds(doc["compression"])
    lines = [
        "| configuration | runs ok | wall s (median, spread) | spill I/O s | DataFusion's spilled MiB | on disk MiB |",
        "|---|---|---|---|---|---|",
    ]
    for b in ["default", "df-lz4", "lz4", "lz4+df-lz4"]:
        rs = [r for r in by.get(("order_by", b), []) if r["ok"]]
        if not rs:
            continue
        wall = [r["wall_s"] for r in rs]
        lines.append(
            f"| {LABEL[b]} | {len(rs)}/{len(by[('order_by', b)])} | {med(wall):.2f} ({spread(wall)}) | {med([spill_s(r) for r in rs]):.2f} | {med([r['spilled_bytes'] for r in rs]) / 2**20:.0f} | {med([r['physical_bytes'] for r in rs]) / 2**20:.0f} |"
        )
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--started", default="")
    ap.add_argument("--finished", default="")
    ap.add_argument("json", nargs="+")
    a = ap.parse_args()
    docs = [json.load(open(p)) for p in a.json]
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    md = []
    md.append("# DataFusion spilling through spillring (issue 23)")
    md.append("")
    md.append(f"- command: `{a.command}`")
    md.append(f"- commit: `{a.commit}`, {a.started} to {a.finished}")
    md.append(
        f"- machine: {platform.node()}, {os.cpu_count()} vCPUs, {mem:.0f} GiB RAM, Linux {platform.release()}; spill roots on the shared virtio disk (ext4, `discard`)"
    )
    d0 = docs[0]
    md.append(
        f"- input: {d0['mib']} MiB of TPC-H `lineitem`-like rows (the engine benches' generator), a `MemTable`; memory pool `FairSpillPool` of "
        + ", ".join(f"{q} {m} MiB" for q, m in d0["pools_mib"])
        + f"; ORDER BY in one partition, the others in two; `auto-quota`'s `max_spill_bytes`: {d0['quota_mib']} MiB (half of what the default spilled of the ORDER BY in a first run)"
    )
    md.append(
        f"- {d0['pairs']} rounds, each query's backends run in turn (order reversed every other round), each run a child process of its own (its peak RSS is its own, `VmHWM`)"
    )
    md.append(
        "- spill I/O: the time inside the spill files' `write`/`flush`/`finish` and the time DataFusion waited for each chunk of `read_stream` (one timing wrapper around both kinds of file)"
    )
    md.append("")
    summaries = {}
    for doc in docs:
        setting = "inside a memory cgroup" if doc.get("cgroup") else "as is"
        if doc.get("cgroup"):
            lim = doc.get("cgroup_limit_bytes") or 0
            md.append(f"## Inside a memory cgroup of {lim / 2**20:.0f} MiB (cgroup v1 `memory.limit_in_bytes`)")
            md.append("")
            md.append(
                "The input table, the pool and DataFusion's own memory leave less than the spill for the page cache: spilled bytes go to the disk and come back from it."
            )
        else:
            md.append("## As is (a roomy page cache)")
        md.append("")
        lines, summary = table(doc, setting)
        md.extend(lines)
        md.append("")
        summaries[setting] = summary
        if doc.get("compression"):
            md.append(f"### DataFusion's own `spill_compression` with spillring ({setting}, the ORDER BY)")
            md.append("")
            md.extend(compression_table(doc))
            md.append("")
        if doc.get("life"):
            md.append("### Files left after a cancel and after a kill (the ORDER BY, mid-spill)")
            md.append("")
            md.append("| backend | files after the cancelled query's stream is dropped | live files the engine lists | files right after SIGKILL | files after the next `Engine::open` on the root |")
            md.append("|---|---|---|---|---|")
            for l in doc["life"]:
                md.append(
                    f"| {LABEL[l['backend']]} | {l['files_after_cancel']} | {l['live_after_cancel'] if l['backend'] != 'default' else '-'} | {l['files_at_kill']} | {l['files_after_next_open'] if l['backend'] != 'default' else str(l['files_after_next_open']) + ' (nothing sweeps them)'} |"
                )
            md.append("")
    # Goals.
    md.append("## Goals")
    md.append("")
    md.append("| goal | figure | verdict |")
    md.append("|---|---|---|")
    s = summaries
    same = all(v["same"] for sm in s.values() for v in sm.values())
    md.append(f"| identical results everywhere | every run's rows hash to the default's: {same} | {'met' if same else 'MISSED'} |")
    for setting, sm in s.items():
        for b in ["buffered", "direct", "auto-quota"]:
            io = [sm[(q, b)]["io"] for q in QUERIES if (q, b) in sm and sm[(q, b)]["io"]]
            if io:
                ok = all(x <= 0.5 for x in io)
                md.append(
                    f"| spill I/O time ≤ 0.5× the default's ({setting}, {b}) | "
                    + ", ".join(f"{q} {sm[(q, b)]['io']:.3f}" for q in QUERIES if (q, b) in sm and sm[(q, b)]["io"])
                    + f" | {'met' if ok else 'MISSED'} |"
                )
            walls = [sm[(q, b)]["wall"] for q in QUERIES if (q, b) in sm and sm[(q, b)]["wall"]]
            if walls:
                ok = all(x <= 1.0 for x in walls)
                md.append(
                    f"| query wall ≤ 1.0× the default's on every query ({setting}, {b}) | "
                    + ", ".join(f"{q} {sm[(q, b)]['wall']:.3f}" for q in QUERIES if (q, b) in sm and sm[(q, b)]["wall"])
                    + f" | {'met' if ok else 'MISSED'} |"
                )
                if setting != "as is":
                    n = sum(1 for x in walls if x <= 0.8)
                    md.append(f"| wall ≤ 0.8× on at least two queries inside the cgroup ({b}) | {n} of {len(walls)} | {'met' if n >= 2 else 'MISSED'} |")
        pr = [sm[(q, "auto-quota")]["phys_ratio"] for q in QUERIES if (q, "auto-quota") in sm]
        if pr:
            ok = all(x is not None and x <= 0.5 for x in pr)
            md.append(
                f"| on disk ≤ 0.5× spilled with `Auto` under a quota ({setting}) | "
                + ", ".join(f"{q} {x:.3f}" for q, x in zip(QUERIES, pr))
                + f" | {'met' if ok else 'MISSED'} |"
            )
        over = [(q, b, sm[(q, b)]["rss_over"]) for q in QUERIES for b in ["buffered", "direct", "auto-quota"] if (q, b) in sm]
        if over:
            worst = max(over, key=lambda t: t[2])
            ok = worst[2] <= 128
            md.append(
                f"| peak RSS ≤ the default's + the buffer budget (128 MiB) ({setting}) | worst: {worst[0]} {worst[1]} {worst[2]:+.0f} MiB | {'met' if ok else 'MISSED'} |"
            )
    for doc in docs:
        for l in doc.get("life", []):
            if l["backend"] != "default":
                ok = l["files_after_cancel"] == 0 and l["files_after_next_open"] == 0 and l["live_after_cancel"] == 0
                md.append(
                    f"| 0 files left after cancel and after kill ({l['backend']}) | cancel {l['files_after_cancel']}, kill {l['files_at_kill']} then {l['files_after_next_open']} after the next open | {'met' if ok else 'MISSED'} |"
                )
            else:
                md.append(
                    f"| (DataFusion's default, for comparison) | cancel {l['files_after_cancel']}, kill {l['files_at_kill']} left for good | - |"
                )
    md.append("")
    with open(a.out, "w") as f:
        f.write("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
