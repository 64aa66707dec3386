"""auto / native time per run of noregression.sh's output, and the medians over the old and the new runs."""
import sys, statistics
rows={}
cur=None
for line in open(sys.argv[1]):
    if line.startswith('=='):
        cur=line.split()[1]+line.split()[4]; continue
    f=line.split()
    if len(f)>10 and f[0].isdigit():
        size=int(f[0]); name=f[4].split('(')[0]
        rows.setdefault(cur,{}).setdefault(size,{})[name]=(float(f[5]),float(f[10]),f[4])
sizes=sorted(next(iter(rows.values())))
print("size  " + "  ".join(f"{r:>8}" for r in rows) + "   old-med new-med")
for s in sizes:
    r=[rows[k][s]['auto'][0]/rows[k][s]['native'][0] for k in rows]
    old=[v for k,v in zip(rows,r) if k.startswith('old')]; new=[v for k,v in zip(rows,r) if k.startswith('new')]
    print(f"{s:>10} " + "  ".join(f"{v:8.2f}" for v in r) + f"   {statistics.median(old):.2f} {statistics.median(new):.2f}  {rows[list(rows)[-1]][s]['auto'][2]}")
