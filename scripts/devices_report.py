#!/usr/bin/env python3
"""devices_report.py: turns scripts/devices-bench.sh's runs into devices.json and DEVICES.md.

Usage: devices_report.py RUNS.jsonl OUT_DIR --command C --commit C --fio V --mbps M
                         --codec-mbps M --bytes-per-device B
Every ratio is a median of per-pair ratios with its min-max spread; the pairs were run
interleaved (the order alternating) in the same session.
"""
import argparse
import json
import os
import platform
import statistics
import sys


def med(xs):
    return statistics.median(xs) if xs else None


def spread(xs):
    return {"n": len(xs), "median": med(xs), "min": min(xs) if xs else None,
            "max": max(xs) if xs else None, "values": xs}


def fmt(s, unit="x"):
    if not s or s["median"] is None:
        return "not measured"
    return f"{s['median']:.2f}{unit} ({s['min']:.2f}-{s['max']:.2f}, {s['n']} pairs)"


def machine():
    cores = os.cpu_count()
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem = f", {kb / (1 << 20):.0f} GiB RAM"
    except OSError:
        pass
    return f"{platform.node()}: {cores} cores{mem}, Linux {platform.release()}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs")
    ap.add_argument("out")
    ap.add_argument("--command", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--fio", required=True)
    ap.add_argument("--mbps", type=int, required=True)
    ap.add_argument("--codec-mbps", type=int, required=True)
    ap.add_argument("--codec-size-gib", type=int, default=None)
    ap.add_argument("--slow-mbps", type=int, default=25)
    ap.add_argument("--bytes-per-device", type=int, required=True)
    a = ap.parse_args()
    new = [json.loads(l) for l in open(a.runs) if l.strip()]
    for r in new:
        r.update(command=a.command, commit=a.commit, bytes_per_device=a.bytes_per_device,
                 limit_mbps=a.mbps if r["section"] in ("devices", "mixed") else a.codec_mbps)
        if r["section"] == "mixed":
            r["slow_limit_mbps"] = a.slow_mbps
    # Sections this run did not measure keep their runs from the report already there (each
    # run names the command and commit that made it).
    fresh = {r["section"] for r in new}
    old = []
    try:
        with open(os.path.join(a.out, "devices.json")) as f:
            old = [r for r in json.load(f).get("runs", []) if r["section"] not in fresh]
    except (OSError, ValueError, KeyError):
        old = []
    runs = old + new

    def first(section):
        return next(r for r in runs if r["section"] == section)

    def pairs(section, n, side):
        got = {r["pair"]: r for r in runs if r["section"] == section and r["n"] == n and r["side"] == side}
        return got

    made = sorted({(r.get("command", "?"), r.get("commit", "?")) for r in runs})
    doc = {"bench": "devices", "made_by": [{"command": c, "commit": k} for c, k in made], "machine": machine(),
           "fio": a.fio, "device_mbps_limit": a.mbps, "codec_device_mbps_limit": a.codec_mbps,
           "bytes_per_device": a.bytes_per_device, "runs": runs, "devices": [], "codec": []}
    md = ["# Devices: throttled loop devices as spill roots", "",
          "Made by " + "; ".join(f"`{c}` at `{k}`" for c, k in made) + f", on {machine()}; {a.fio}.", "",
          "Rig: `scripts/slowdev.sh`: loop-device ext4 filesystems on sparse images on this",
          "machine's shared disk, each device's direct writes throttled by the cgroup v1",
          "`blkio.throttle.write_bps_device`; fio and the engine run in that cgroup. Pairs run",
          "interleaved, the order alternating; a ratio is the median of per-pair ratios, with its",
          "min-max spread.", ""]

    counts = sorted({r["n"] for r in runs if r["section"] == "devices"})
    if counts:
        fio1 = [r["mb_s"] for r in pairs("devices", 1, "fio").values()] if 1 in counts else []
        one = med(fio1)
        md += ["## Several devices (issue 27)", "",
               f"Each device limited to {first('devices')['limit_mbps']} MB/s; "
               f"{first('devices')['bytes_per_device'] >> 20} MiB per device per run.",
               "fio: one io_uring job per device (1 MiB writes, iodepth 8, direct). Engine: one engine",
               "whose roots are the N devices, 2 writers per root, 1 MiB random records, direct mode.",
               "One device's bandwidth is the N=1 fio median.", "",
               "| devices | fio MB/s | engine MB/s | engine / (N x one device) | goal | engine / fio | goal | engine files per root | engine CPU s/GiB |",
               "|---|---|---|---|---|---|---|---|---|"]
        for n in counts:
            f = pairs("devices", n, "fio")
            e = pairs("devices", n, "engine")
            both = sorted(set(f) & set(e))
            vs_fio = [e[p]["logical_mb_s"] / f[p]["mb_s"] for p in both]
            vs_n = [e[p]["logical_mb_s"] / (n * one) for p in both] if one else []
            files = [e[p]["files_per_root"] for p in both]
            row = {"n": n, "fio_mb_s": spread([f[p]["mb_s"] for p in both]),
                   "engine_mb_s": spread([e[p]["logical_mb_s"] for p in both]),
                   "engine_over_n_devices": spread(vs_n), "engine_over_fio": spread(vs_fio),
                   "files_per_root": files,
                   "cpu_s_per_gib": spread([e[p]["cpu_s_per_gib"] for p in both])}
            row["met"] = bool(vs_n and vs_fio and med(vs_n) >= 0.9 and med(vs_fio) >= 0.9)
            doc["devices"].append(row)
            md.append(f"| {n} | {row['fio_mb_s']['median']:.1f} | {row['engine_mb_s']['median']:.1f} | "
                      f"{fmt(row['engine_over_n_devices'])} | >= 0.9 | {fmt(row['engine_over_fio'])} | >= 0.9 | "
                      f"{files[len(files) // 2] if files else '-'} | {row['cpu_s_per_gib']['median']:.3f} |")
        md.append("")

    codec_sections = [s for s in ("codec-slow-lineitem", "codec-slow-random", "codec-fast-random")
                      if any(r["section"] == s for r in runs)]
    if codec_sections:
        goals = {"codec-slow-lineitem": 1.5, "codec-slow-random": 0.95, "codec-fast-random": 0.95}
        md += ["## Auto against None on a slow device (issue 26)", "",
               f"Slow: one device limited to {first(codec_sections[0])['limit_mbps']} MB/s"
               + (f", a {a.codec_size_gib} GiB filesystem" if a.codec_size_gib else "")
               + ". Fast: a directory on this machine's",
               "disk, not throttled. One engine per run, 2 writers, direct mode,",
               f"{first(codec_sections[0])['bytes_per_device'] >> 20} MiB logical per run.", "",
               "| where | data | None MB/s | Auto MB/s | Auto / None | goal | Auto physical / logical | Auto blocks raw / lz4 / zstd (median run) | producer CPU Auto / None |",
               "|---|---|---|---|---|---|---|---|---|"]
        for s in codec_sections:
            no = pairs(s, 1, "none")
            au = pairs(s, 1, "auto")
            both = sorted(set(no) & set(au))
            ratio = [au[p]["logical_mb_s"] / no[p]["logical_mb_s"] for p in both]
            cpu = [au[p]["producer_cpu_s_per_gib"] / no[p]["producer_cpu_s_per_gib"] for p in both]
            phys = [au[p]["physical_per_logical"] for p in both]
            mid = sorted(both, key=lambda p: au[p]["logical_mb_s"])[len(both) // 2] if both else None
            row = {"section": s, "none_mb_s": spread([no[p]["logical_mb_s"] for p in both]),
                   "auto_mb_s": spread([au[p]["logical_mb_s"] for p in both]),
                   "auto_over_none": spread(ratio), "auto_physical_per_logical": spread(phys),
                   "producer_cpu_auto_over_none": spread(cpu), "goal_min": goals[s],
                   "met": bool(ratio and med(ratio) >= goals[s])}
            doc["codec"].append(row)
            _, where, data = s.split("-")
            blocks = (f"{au[mid]['blocks_raw']} / {au[mid]['blocks_lz4']} / {au[mid]['blocks_zstd']}"
                      if mid is not None else "-")
            md.append(f"| {where} | {data} | {row['none_mb_s']['median']:.1f} | {row['auto_mb_s']['median']:.1f} | "
                      f"{fmt(ratio and row['auto_over_none'])} | >= {goals[s]} | {med(phys):.3f} | {blocks} | "
                      f"{fmt(row['producer_cpu_auto_over_none'])} |")
        md.append("")

    quota = [r for r in runs if r["section"] == "quota"]
    if quota:
        ok = [r for r in quota if not r.get("error")]
        phys = [r["physical_per_logical"] for r in ok]
        row = {"runs": len(quota), "succeeded": len(ok), "physical_per_logical": spread(phys),
               "mb_s": spread([r["logical_mb_s"] for r in ok]),
               "errors": [r["error"] for r in quota if r.get("error")], "goal_max": 0.4,
               "met": len(ok) == len(quota) and bool(phys) and max(phys) <= 0.4}
        doc["quota"] = row
        q = quota[0]
        md += ["## Auto under a quota of half the logical bytes (issue 26)", "",
               f"Lineitem rows, {q['logical_bytes'] >> 20 if ok else q['bytes_per_device'] >> 20} MiB logical per run,"
               f" `max_spill_bytes` {q['quota_bytes'] >> 20} MiB, `Auto`, 2 writers, direct mode, fast disk.", "",
               "| runs | succeeded | physical / logical | goal | MB/s |", "|---|---|---|---|---|",
               f"| {row['runs']} | {row['succeeded']} | "
               + (f"{med(phys):.3f} ({min(phys):.3f}-{max(phys):.3f})" if phys else "-")
               + f" | <= 0.4 | {row['mb_s']['median'] or 0:.1f} |", ""]
        if row["errors"]:
            md += ["Errors: " + "; ".join(sorted(set(row["errors"]))), ""]

    mixed = {side: pairs("mixed", 2, side) for side in ("fio0", "fio1", "engine", "baseline")}
    if mixed["engine"]:
        m = first("mixed")
        both = sorted(set(mixed["fio0"]) & set(mixed["fio1"]) & set(mixed["engine"]))
        bw = {p: mixed["fio0"][p]["mb_s"] + mixed["fio1"][p]["mb_s"] for p in both}
        row = {"fio_sum_mb_s": spread([bw[p] for p in both]),
               "engine_mb_s": spread([mixed["engine"][p]["logical_mb_s"] for p in both]),
               "engine_over_sum": spread([mixed["engine"][p]["logical_mb_s"] / bw[p] for p in both]),
               "engine_files_per_root": [mixed["engine"][p]["files_per_root"] for p in both]}
        base = sorted(set(both) & set(mixed["baseline"]))
        if base:
            row["baseline_mb_s"] = spread([mixed["baseline"][p]["logical_mb_s"] for p in base])
            row["baseline_over_sum"] = spread([mixed["baseline"][p]["logical_mb_s"] / bw[p] for p in base])
            row["baseline_files_per_root"] = [mixed["baseline"][p]["files_per_root"] for p in base]
            row["engine_over_baseline"] = spread(
                [mixed["engine"][p]["logical_mb_s"] / mixed["baseline"][p]["logical_mb_s"] for p in base])
        doc["mixed"] = row
        mid = lambda xs: xs[len(xs) // 2] if xs else "-"
        md += ["## A fast and a slow device (issue 27, point 2)", "",
               f"Two devices limited to {m['limit_mbps']} and {m.get('slow_limit_mbps', '?')} MB/s. Per pair: fio",
               "(io_uring, 1 MiB writes, iodepth 8, direct) on each device alone, their MB/s summed; then one",
               f"engine over both, 4 writers, {2 * m['bytes_per_device'] >> 20} MiB of 1 MiB random records, direct mode;",
               "the baseline is the same bench built at another commit (`--baseline-exe`), interleaved.", "",
               "| engine | MB/s | / sum of the devices | files per root (median pair) |", "|---|---|---|---|",
               f"| this commit | {row['engine_mb_s']['median']:.1f} | {fmt(row['engine_over_sum'])} | {mid(row['engine_files_per_root'])} |"]
        if base:
            md.append(f"| baseline | {row['baseline_mb_s']['median']:.1f} | {fmt(row['baseline_over_sum'])} | {mid(row['baseline_files_per_root'])} |")
            md += ["", f"This commit / baseline, per pair: {fmt(row['engine_over_baseline'])}."]
        md += ["", f"Sum of the devices (fio): {row['fio_sum_mb_s']['median']:.1f} MB/s.", ""]

    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "devices.json"), "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    with open(os.path.join(a.out, "DEVICES.md"), "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    sys.exit(main())
