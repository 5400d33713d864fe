import re,sys
def blocks(f):
    cur=[];out=[]
    for l in open(f):
        if not l.strip():
            if cur: out.append(cur); cur=[]
        else: cur.append(l.rstrip())
    return out
def norm(s): 
    s=re.sub(r"/work/wt-[a-z]+/|\[/work/cyc/[a-z]+/hot_path\]|/rustc/[0-9a-f]+/","",s); return s
pat=sys.argv[1]; n={"before":70169,"after":70626}
for s in ["before","after"]:
    print("==",s)
    for b in blocks(f"{s}.tree.txt"):
        star=[l for l in b if re.search(r"\*  ",l)]
        if star and re.search(pat,star[0]):
            for l in b:
                m=re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+([<>*])\s+(.*)",l)
                if not m: continue
                v=int(m.group(1).replace(",",""))/n[s]
                if v>=float(sys.argv[2]) or m.group(2)=="*": print("%9.1f %s %s"%(v,m.group(2),norm(m.group(3))[:200]))
