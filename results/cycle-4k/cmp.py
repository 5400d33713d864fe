import re,sys
def load(f, n):
    d={}
    for line in open(f):
        m=re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(\S+?):(.*?)(?: \[[^\]]*\])?\s*$", line)
        if not m: continue
        fn=m.group(3)
        d[fn]=d.get(fn,0)+int(m.group(1).replace(",",""))/n
    return d
kind=sys.argv[1]; nb=int(sys.argv[2]); na=int(sys.argv[3]); top=int(sys.argv[4])
b=load(f"before.{kind}.txt",nb); a=load(f"after.{kind}.txt",na)
if kind=="self": print("total/cycle", round(sum(b.values())), round(sum(a.values())))
keys=set(a)|set(b)
flt=sys.argv[5] if len(sys.argv)>5 else ""
rows=sorted([k for k in keys if flt in k],key=lambda k: -abs(a.get(k,0)-b.get(k,0)))
for k in rows[:top]:
    print(f"{b.get(k,0):8.1f} {a.get(k,0):8.1f} {a.get(k,0)-b.get(k,0):+8.1f}  {k[:140]}")
