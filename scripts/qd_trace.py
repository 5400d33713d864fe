#!/usr/bin/env python3
"""Summarises a tracefs trace written by scripts/qd-trace.sh (one JSON object on stdout).

Window: from the first io_uring write submitted to the last one completed (writes are
WRITE/WRITE_FIXED/WRITEV/WRITEV_FIXED). Over it:
- app in flight: io_uring writes submitted and not yet completed (io_uring_submit_req ->
  io_uring_complete, by request), time-weighted distribution and mean;
- device in flight: write requests issued to the device and not completed (block_rq_issue ->
  block_rq_complete on --dev), time-weighted distribution, mean, the share of the window with
  none (the device idle for writes), and the idle gaps' sizes;
- request sizes and counts, writes punted to io-wq, fallocate calls (count, summed time, max),
  unwritten-extent handling calls, jbd2 commits; per-write latency (submit -> CQE) and
  per-request device latency.
"""
import argparse
import collections
import gzip
import json
import re
import statistics
import sys

LINE = re.compile(r"^\s*(?P<comm>.+?)-(?P<pid>\d+)\s+\[(?P<cpu>\d+)\]\s+\S+\s+(?P<ts>\d+\.\d+):\s+(?P<ev>\w+):\s?(?P<rest>.*)$")
SYSCALL = re.compile(r"^\s*(?P<comm>.+?)-(?P<pid>\d+)\s+\[\d+\]\s+\S+\s+(?P<ts>\d+\.\d+):\s+sys_ftruncate(?P<exit> ->)?")
WRITE_OPS = {"WRITE", "WRITE_FIXED", "WRITEV", "WRITEV_FIXED"}


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def weighted(changes, t0, t1):
    """changes: sorted (t, level) after each change; returns {level: seconds} over [t0, t1]."""
    hist = collections.Counter()
    gaps = []
    level, last = 0, t0
    gap_start = None
    for t, lv in changes:
        if t < t0:
            level = lv
            continue
        if t > t1:
            break
        hist[level] += t - last
        if level == 0 and gap_start is None:
            gap_start = last
        if lv != 0 and gap_start is not None:
            gaps.append(t - gap_start)
            gap_start = None
        elif lv == 0 and level != 0:
            gap_start = t
        level, last = lv, t
    hist[level] += t1 - last
    if gap_start is not None:
        gaps.append(t1 - gap_start)
    return hist, gaps


BUCKETS = [(0, 0), (1, 1), (2, 2), (3, 4), (5, 7), (8, 8), (9, 16), (17, 10**9)]


def summarize_hist(hist, span):
    mean = sum(k * v for k, v in hist.items()) / span if span else 0
    share = {}
    for lo, hi in BUCKETS:
        v = sum(x for k, x in hist.items() if lo <= k <= hi)
        if v:
            name = str(lo) if lo == hi else (f"{lo}+" if hi > 10**6 else f"{lo}-{hi}")
            share[name] = round(v / span, 4)
    return {"mean": round(mean, 3), "share_by_level": share}


def thread_states(sched, names, t0, t1, ours):
    """Per thread of interest (the engine's, fio's, the block layer's kworkers): the share of
    the window it ran, waited runnable (preempted or woken, not yet on a CPU: state R at its
    switch-out), or slept (S/D)."""
    def keep(pid, n):
        if ours is not None and pid not in ours and not n.startswith(("kworker", "iou-")):
            return False
        return n.startswith(("spillring", "throughput", "fio", "kworker", "iou-"))
    state = {}   # pid -> (since, "run"|"runnable"|"sleep")
    acc = collections.defaultdict(collections.Counter)
    def close(pid, t):
        if pid in state:
            since, st = state[pid]
            lo, hi = max(since, t0), min(t, t1)
            if hi > lo:
                acc[pid][st] += hi - lo
    for t, prev, pst, nxt in sched:
        close(prev, t)
        state[prev] = (t, "runnable" if pst.startswith("R") else "sleep")
        close(nxt, t)
        state[nxt] = (t, "run")
    for pid in list(state):
        close(pid, t1)
    span = t1 - t0
    out = {}
    for pid, c in acc.items():
        n = names.get(pid, pid)
        if not keep(pid, n) or sum(c.values()) == 0:
            continue
        key = f"{n}-{pid}"
        out[key] = {k: round(v / span, 3) for k, v in sorted(c.items())}
    return dict(sorted(out.items(), key=lambda kv: -kv[1].get("run", 0))[:8])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--dev", required=True, help="major:minor")
    ap.add_argument("--pid", help="the traced command's pid: only its process tree's io_uring writes count")
    ap.add_argument("--stdout", help="the command's stdout; its last JSON line is kept")
    a = ap.parse_args()
    major, minor = a.dev.split(":")
    devtag = f"{major},{minor}"
    opener = gzip.open if a.trace.endswith(".gz") else open
    subs = {}          # req -> (t, op)
    app_events = []    # (t, +1/-1)
    lat = []
    dev_open = collections.defaultdict(list)  # sector -> [issue t]
    dev_events = []    # (t, +1/-1, bytes)
    dev_lat = []
    sizes = collections.Counter()
    punts = collections.Counter()
    falloc_open = {}
    falloc = []
    unwritten = 0
    commits = []
    splits = 0
    write_ts = []
    reissues = 0
    ftrunc_open = {}
    ftrunc = []
    discards = []
    sched = []  # (t, prev_pid, prev_state, next_pid) and names
    names = {}
    ours = {a.pid} if a.pid else None
    issuers = collections.Counter()
    with opener(a.trace, "rt") as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                sm = SYSCALL.match(line)
                if sm and (ours is None or sm["pid"] in ours):
                    if sm["exit"]:
                        t_ = ftrunc_open.pop(sm["pid"], None)
                        if t_ is not None:
                            ftrunc.append((t_, float(sm["ts"]) - t_))
                    else:
                        ftrunc_open[sm["pid"]] = float(sm["ts"])
                continue
            t = float(m["ts"])
            ev = m["ev"]
            rest = m["rest"]
            if ev == "sched_process_fork":
                mm = re.search(r" pid=(\d+) child_comm=.* child_pid=(\d+)", rest)
                if ours is not None and mm and (mm.group(1) in ours or m["pid"] in ours):
                    ours.add(mm.group(2))
                continue
            if ev == "io_uring_submit_req":
                if ours is not None and m["pid"] not in ours:
                    continue
                op = re.search(r"opcode (\w+)", rest).group(1)
                req = re.search(r"req (\w+)", rest).group(1)
                if op in WRITE_OPS:
                    subs[req] = (t, op)
                    app_events.append((t, 1))
                    write_ts.append(t)
            elif ev == "io_uring_complete":
                req = re.search(r"req (\w+)", rest).group(1)
                s = subs.pop(req, None)
                if s:
                    app_events.append((t, -1))
                    lat.append(t - s[0])
                    write_ts.append(t)
            elif ev == "io_uring_queue_async_work":
                op = re.search(r"opcode (\w+)", rest).group(1)
                punts[op] += 1
            elif ev in ("block_rq_issue", "block_rq_complete"):
                parts = rest.split()
                if parts[0] != devtag or "W" not in parts[1]:
                    continue
                if ev == "block_rq_issue":
                    nbytes = int(parts[2])
                    mm = re.search(r"\) (\d+) \+ (\d+)", rest)
                    if not mm or int(mm.group(2)) == 0:
                        continue  # flush
                    sector, nsec = int(mm.group(1)), int(mm.group(2))
                    if dev_open.get(sector):
                        reissues += 1  # a requeued request dispatched again (kworker)
                        continue
                    dev_open[sector].append((t, nsec * 512))
                    dev_events.append((t, 1, nsec * 512))
                    sizes[nsec * 512] += 1
                    issuers[m["comm"].strip().split("/")[0]] += 1
                else:
                    mm = re.search(r"\) (\d+) \+ (\d+)", rest)
                    if not mm:
                        continue
                    sector = int(mm.group(1))
                    if dev_open.get(sector):
                        ti, nb = dev_open[sector].pop(0)
                        dev_events.append((t, -1, nb))
                        dev_lat.append(t - ti)
            elif ev == "block_split":
                splits += 1
            elif ev == "ext4_fallocate_enter":
                falloc_open[m["pid"]] = t
            elif ev == "ext4_fallocate_exit":
                t0 = falloc_open.pop(m["pid"], None)
                if t0 is not None:
                    falloc.append((t0, t - t0))
            elif ev == "ext4_discard_blocks":
                mm = re.search(r"count (\d+)", rest)
                discards.append((t, m["pid"], int(mm.group(1)) if mm else 0))
            elif ev == "ext4_ext_handle_unwritten_extents":
                unwritten += 1
            elif ev == "jbd2_start_commit":
                commits.append(t)
            elif ev == "sched_switch":
                mm = re.search(r"prev_comm=(.*?) prev_pid=(\d+) .*prev_state=(\S+) ==> next_comm=(.*?) next_pid=(\d+)", rest)
                if mm:
                    names[mm.group(2)] = mm.group(1)
                    names[mm.group(5)] = mm.group(4)
                    sched.append((t, mm.group(2), mm.group(3), mm.group(5)))
    if not write_ts:
        print(json.dumps({"error": "no io_uring writes in the trace"}))
        return
    t0, t1 = min(write_ts), max(write_ts)
    span = t1 - t0
    app_events.sort()
    lvl, changes = 0, []
    for t, d in app_events:
        lvl += d
        changes.append((t, lvl))
    app_hist, _ = weighted(changes, t0, t1)
    dev_events.sort()
    lvl, byt, changes, bchanges = 0, 0, [], []
    for t, d, nb in dev_events:
        lvl += d
        byt += d * nb
        changes.append((t, max(lvl, 0)))
        bchanges.append((t, max(byt, 0)))
    dev_hist, gaps = weighted(changes, t0, t1)
    bhist, _ = weighted(bchanges, t0, t1)
    in_win = lambda ts: t0 <= ts <= t1
    doc = {
        "window_s": round(span, 4),
        "io_uring_writes": len(lat),
        "app_in_flight": summarize_hist(app_hist, span),
        "write_latency_ms": {"p50": round(pct(lat, 0.5) * 1e3, 3), "p90": round(pct(lat, 0.9) * 1e3, 3),
                             "p99": round(pct(lat, 0.99) * 1e3, 3), "max": round(max(lat) * 1e3, 3)},
        "device_in_flight": summarize_hist(dev_hist, span),
        "device_mib_in_flight_mean": round(sum(k * v for k, v in bhist.items()) / span / 2**20, 3),
        "device_idle_share": round(dev_hist.get(0, 0) / span, 4),
        "device_idle_gaps": {"n": len(gaps), "sum_ms": round(sum(gaps) * 1e3, 2),
                             "over_1ms": sum(1 for g in gaps if g > 1e-3),
                             "max_ms": round(max(gaps) * 1e3, 3) if gaps else 0},
        "device_requests": sum(sizes.values()),
        "device_request_bytes": {str(k): v for k, v in sizes.most_common(6)},
        "device_latency_ms": {"p50": round((pct(dev_lat, 0.5) or 0) * 1e3, 3),
                              "p90": round((pct(dev_lat, 0.9) or 0) * 1e3, 3),
                              "max": round(max(dev_lat or [0]) * 1e3, 3)},
        "block_splits": splits,
        "device_reissues": reissues,
        "device_request_issuers": dict(issuers.most_common(4)),
        "io_wq_punts": dict(punts),
        "fallocate": {"n": len(falloc), "in_window": sum(1 for s, _ in falloc if in_win(s)),
                      "sum_ms": round(sum(d for s, d in falloc if in_win(s)) * 1e3, 3),
                      "max_ms": round(max([d for s, d in falloc if in_win(s)] or [0]) * 1e3, 3)},
        "ext4_unwritten_extent_calls": unwritten,
        "jbd2_commits_in_window": sum(1 for c in commits if in_win(c)),
        "ftruncate": {"n": len(ftrunc), "after_window": sum(1 for s_, _ in ftrunc if s_ > t1),
                      "sum_ms": round(sum(d for _, d in ftrunc) * 1e3, 2),
                      "max_ms": round(max([d for _, d in ftrunc] or [0]) * 1e3, 2)},
        "ext4_discards": {"n": len(discards),
                          "by_process_tree": sum(1 for _, p_, _ in discards if ours is None or p_ in ours),
                          "blocks": sum(c for _, _, c in discards)},
    }
    if sched:
        doc["threads"] = thread_states(sched, names, t0, t1, ours)
    if a.stdout:
        try:
            lines = [l for l in open(a.stdout) if l.strip()]
            text = "".join(lines)
            if text.lstrip().startswith("{") and '"jobs"' in text:
                d = json.loads(text[text.index("{"):])
                doc["command_mb_s"] = d["jobs"][0]["write"]["bw_bytes"] / 1e6
            else:
                d = json.loads(lines[-1])
                doc["command_mb_s"] = d.get("mb_s")
                doc["command"] = d
        except (ValueError, KeyError, IndexError, OSError):
            pass
    doc["device_mb_s"] = round(sum(k * v for k, v in sizes.items()) / span / 1e6, 1)
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
