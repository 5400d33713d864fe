#!/usr/bin/env python3
"""Why did a tokio worker sleep in an `_async` poll? Per sleep, from a scheduler trace.

The async_poll bench counts the polls during which its worker thread made a voluntary context
switch; this names each one. Record the bench (one repetition: buffered then direct) with
the scheduler's switch tracepoint and user stacks, then give this the text:

    SPILLRING_ASYNC_REPS=1 SPILLRING_BENCH_OUT=/tmp/ap perf record -m 8M \\
        -e sched:sched_switch --call-graph dwarf,16384 -o /tmp/ap.data <async_poll exe> --bench
    perf script -i /tmp/ap.data -F comm,tid,event,trace,ip,sym > /tmp/ap.txt
    python3 scripts/async-poll-sleeps.py /tmp/ap.txt [more.txt ...]

It keeps each switch of a `tokio-rt-worker` thread whose previous state is not R (a sleep,
not a preemption) and whose stack holds the bench's `Timed::poll` (inside a timed poll),
and prints counts by mode, cause (from the kernel and user frames) and the engine function
that led there. The mode comes from the worker's thread id: each run starts a runtime of 2
workers, buffered first. perf may lose samples on a busy machine (it says so): counts are a
lower bound. Each switch counts, so one poll can count twice.
"""
import collections
import re
import sys


def cause(frames):
    j = " | ".join(frames)
    if "SyncWaker::notify" in j:
        if "Offload::run" in j:
            return "crossbeam send: waker mutex (offload pool job)"
        if "reaper" in j or "Reaped" in j:
            return "crossbeam send: waker mutex (reaper)"
        return "crossbeam send: waker mutex (other)"
    if "lll_lock_wait_private" in j:
        who = "free" if "libc_free" in j else "realloc" if "realloc" in j else "malloc"
        return f"glibc malloc arena lock ({who})"
    if "mprotect" in j and "malloc" in j:
        return "glibc malloc heap growth (mprotect: mmap lock)"
    if "map_anon" in j or "__mmap" in j:
        return "mmap of a staging buffer (mmap lock)"
    if "munmap" in j:
        return "munmap (mmap lock)"
    if "exc_page_fault" in j:
        if "rwsem_down_read" in j or "lock_mm_and_find_vma" in j:
            return "page fault waiting for the mmap lock"
        if "filemap_fault" in j:
            return "page fault of a file map waiting for its page (I/O)"
        return "page fault (other)"
    if "parking_lot" in j:
        return "parking_lot lock parked"
    return "other: " + " < ".join(frames[2:8])


def where(frames):
    for f in frames:
        if "Timed" in f:
            break
        if f.startswith("spillring::") and "io::offload" not in f and "io::buf" not in f:
            return re.sub(r"<impl [^>]*>::", "", f)[:90]
    return "?"


def main(paths):
    counts = collections.Counter()
    for path in paths:
        tids = []
        with open(path, errors="replace") as fh:
            text = fh.read()
        for block in text.split("\n\n"):
            lines = [l for l in block.strip().split("\n") if l.strip()]
            if not lines or not lines[0].startswith("tokio-rt-worker"):
                continue
            if "sched_switch" not in lines[0]:
                continue
            tid = lines[0].split()[1]
            if tid not in tids:
                tids.append(tid)
            mode = ("buffered", "direct")[(tids.index(tid) // 2) % 2]
            m = re.search(r"prev_state=(\S+)", lines[0])
            if not m or m.group(1).startswith("R"):
                continue
            frames = []
            for l in lines[1:]:
                parts = l.strip().split(None, 1)
                frames.append(parts[1] if len(parts) > 1 else "")
            if not any("Timed" in f for f in frames):
                continue
            counts[(mode, cause(frames), where(frames))] += 1
    for (mode, c, w), n in sorted(counts.items()):
        print(f"{n:4d}  {mode:8s}  {c}   [{w}]")
    print(f"{sum(counts.values()):4d}  in all")


if __name__ == "__main__":
    main(sys.argv[1:])
