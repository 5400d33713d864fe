#!/usr/bin/env python3
"""CPU samples (perf script text of `perf record -g -e cpu-clock`) of the engine's threads while
the engine had <= 1 io_uring write in flight, from a qd-trace.sh trace taken with
trace_clock=perf (so both share a clock). Usage: perf_in_gaps.py TRACE.gz PERF_SCRIPT.txt"""
import bisect, collections, gzip, re, sys
LINE = re.compile(r"^\s*(?P<comm>.+?)-(?P<pid>\d+)\s+\[(?P<cpu>\d+)\]\s+\S+\s+(?P<ts>\d+\.\d+):\s+(?P<ev>\w+):\s?(?P<rest>.*)$")
ev = []
for line in gzip.open(sys.argv[1], 'rt'):
    m = LINE.match(line)
    if m: ev.append((float(m['ts']), m['comm'].strip(), m['pid'], m['ev'], m['rest']))
subs = {}; lvl = 0; ch = []
for e in ev:
    if e[3] == 'io_uring_submit_req' and 'WRITE' in e[4] and e[1].startswith('spillring-ring'):
        subs[re.search(r'req (\w+)', e[4]).group(1)] = 1; lvl += 1; ch.append((e[0], lvl))
    elif e[3] == 'io_uring_complete':
        if subs.pop(re.search(r'req (\w+)', e[4]).group(1), None): lvl -= 1; ch.append((e[0], lvl))
t0, t1 = ch[0][0], ch[-1][0]
low = []; start = None
for t, l in ch:
    if l <= 1 and start is None: start = t
    elif l > 1 and start is not None: low.append((start, t)); start = None
print('window %.1f ms; io_uring writes in flight <= 1: %d intervals, %.1f ms' % ((t1 - t0) * 1e3, len(low), sum(b - a for a, b in low) * 1e3))
H = re.compile(r'^\s*(?P<comm>.+?)\s+(?P<tid>\d+)\s+(?P<ts>\d+\.\d+):\s+(?P<ev>\S+):\s*(?P<rest>.*)$')
SKIP = ('finish_task_switch', '__schedule', 'schedule', '_raw_spin_unlock_irqrestore', '__irq_exit_rcu', 'irq_exit_rcu', 'sysvec_', 'asm_sysvec', '__sysvec', 'handle_softirqs', '[unknown]')
c_low = collections.Counter(); c_all = collections.Counter(); th_low = collections.Counter(); th_all = collections.Counter()
starts = [a for a, b in low]
for blk in open(sys.argv[2]).read().split('\n\n'):
    lines = blk.strip('\n').split('\n')
    m = H.match(lines[0]) if lines and lines[0].strip() else None
    if not m: continue
    t = float(m['ts'])
    if not (t0 <= t <= t1): continue
    st = [l.split(None, 1)[1] for l in lines[1:] if len(l.split(None, 1)) > 1]
    fr = [f for f in st if not f.startswith(SKIP)]
    key = m['comm'].strip()[:14] + ': ' + ' < '.join(x[:60] for x in fr[:4])
    i = bisect.bisect_right(starts, t) - 1
    th_all[m['comm'].strip()[:14]] += 1; c_all[key] += 1
    if i >= 0 and low[i][0] <= t <= low[i][1]:
        c_low[key] += 1; th_low[m['comm'].strip()[:14]] += 1
print('samples by thread, whole window:', th_all.most_common(6))
print('samples by thread, <= 1 write in flight:', th_low.most_common(6))
print('--- top stacks, <= 1 write in flight')
for k, v in c_low.most_common(12): print(v, k)
print('--- top stacks, whole window')
for k, v in c_all.most_common(12): print(v, k)
