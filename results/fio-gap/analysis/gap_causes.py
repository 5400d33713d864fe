import gzip,re,sys,collections
LINE = re.compile(r"^\s*(?P<comm>.+?)-(?P<pid>\d+)\s+\[(?P<cpu>\d+)\]\s+\S+\s+(?P<ts>\d+\.\d+):\s+(?P<ev>\w+):\s?(?P<rest>.*)$")
path=sys.argv[1]; dev='254,0'
ev=[]; cur=None
for line in gzip.open(path,'rt'):
    if line.startswith(' => '):
        if cur is not None: cur[5].append(line[4:].strip())
        continue
    m=LINE.match(line)
    if not m: continue
    cur=[float(m['ts']),m['comm'].strip(),m['pid'],m['ev'],m['rest'],[]]
    ev.append(cur)
# our pids: throughput main and its forks
main=[e for e in ev if e[1].startswith('throughput')][0][2]
ours={main}
for e in ev:
    if e[3]=='sched_process_fork':
        mm=re.search(r' pid=(\d+) child_comm=.* child_pid=(\d+)',e[4])
        if mm and mm.group(1) in ours: ours.add(mm.group(2))
# window, device gaps
subs={};ws=[];
for e in ev:
    if e[3]=='io_uring_submit_req' and e[2] in ours and 'WRITE' in e[4]:
        subs[re.search(r'req (\w+)',e[4]).group(1)]=1; ws.append(e[0])
    elif e[3]=='io_uring_complete':
        if subs.pop(re.search(r'req (\w+)',e[4]).group(1),None): ws.append(e[0])
t0,t1=min(ws),max(ws)
open_=collections.Counter(); n=0; gaps=[]; gs=None
for e in ev:
    if e[3] in('block_rq_issue','block_rq_complete'):
        p=e[4].split()
        if p[0]!=dev or 'W' not in p[1]: continue
        mm=re.search(r'\) (\d+) \+ (\d+)',e[4])
        if not mm or int(mm.group(2))==0: continue
        s=mm.group(1)
        if e[3]=='block_rq_issue':
            if open_[s]: continue
            open_[s]+=1; n+=1
            if gs is not None:
                if t0<=gs and e[0]<=t1: gaps.append((gs,e[0]))
                gs=None
        elif open_[s]:
            open_[s]-=1; n-=1
            if n==0: gs=e[0]
# thread states: last switch out of each of our threads before a time
sw=[e for e in ev if e[3]=='sched_switch']
def state_at(t, pid):
    last=None
    for e in sw:
        if e[0]>t: break
        if 'prev_pid=%s '%pid in e[4]: last=('out',e)
        elif 'next_pid=%s '%pid in e[4]: last=('in',e)
    return last
names={}
for e in ev:
    if e[2] in ours: names[e[2]]=e[1]
ring=[p for p,nm in names.items() if nm.startswith('spillring-ring')]
print('window %.1f ms, gaps >0.5ms:'%((t1-t0)*1e3))
cause=collections.Counter()
for g0,g1 in gaps:
    if g1-g0<0.0005: continue
    # which of our threads are in D during the gap and why
    why=[]
    for pid in [main]+ring:
        st=state_at(g0+ (g1-g0)/2, pid)
        if st is None: continue
        kind,e=st
        if kind=='out':
            ps=re.search(r'prev_state=(\S+)',e[4]).group(1)
            fr=[f.split('+')[0] for f in e[5] if not f.startswith(('__schedule','schedule','__traceiter','trace_event','io_schedule','schedule_timeout','wait_for_completion','entry_SYSCALL','do_syscall'))][:4]
            why.append('%s:%s %s'%(names[pid][:12],ps,'<'.join(fr)))
        else:
            why.append('%s:running'%names[pid][:12])
    # events in gap window (fallocate)
    fa=[e for e in ev if g0-0.003<=e[0]<=g1 and e[3].startswith('ext4_fallocate')]
    print('%8.2f +%5.2f ms  %s %s'%((g0-t0)*1e3,(g1-g0)*1e3,' | '.join(why), 'FALLOC' if fa else ''))
