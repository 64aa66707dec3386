import sys, statistics
rows={}
for line in open(sys.argv[1]):
    if line.startswith('=='):
        cur=(line.split()[1], line.split()[4]); continue
    f=line.split()
    if len(f)>10 and f[0].isdigit():
        size=int(f[0]); name=f[4].split('(')[0]
        rows.setdefault(cur,{}).setdefault(size,{})[name]=(float(f[5]),float(f[10]),f[4])
trees=sorted({t for t,_ in rows}, key=['old','new','newcal'].index)
sizes=sorted(next(iter(rows.values())))
print("auto/native time, medians over rounds (oop | in place)")
print("size       " + "  ".join(f"{t:>15}" for t in trees) + "   newcal picks")
for s in sizes:
    out=[]
    for t in trees:
        runs=[v[s] for (tt,_),v in rows.items() if tt==t and s in v]
        o=statistics.median(r['auto'][0]/r['native'][0] for r in runs); i=statistics.median(r['auto'][1]/r['native'][1] for r in runs)
        out.append(f"{o:6.2f} | {i:5.2f}")
    last=[v[s]['auto'][2] for (tt,_),v in rows.items() if tt=='newcal'][-1]
    print(f"{s:>10} " + "  ".join(f"{x:>15}" for x in out) + "   " + last)
