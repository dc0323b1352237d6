"""Run 44: per distinct kernel (name, grid, block, registers, shared memory) in ncu CSVs: count, median
and fastest gpu__time_duration (ns), median SM clock. Usage: python3 ncu_summary.py 'out/ncu-*.csv'"""
import csv,glob,collections,gzip,sys
for f in sorted(glob.glob(sys.argv[1] if len(sys.argv)>1 else "ncu-*.csv")):
    with (gzip.open(f, 'rt') if f.endswith('.gz') else open(f)) as fh:
        lines=[l for l in fh if l.startswith('"')]
    r=list(csv.reader(lines))
    if not r: print(f,"empty"); continue
    hdr=r[0]; data=r[2:]
    idx={h:i for i,h in enumerate(hdr)}
    agg=collections.OrderedDict()
    for d in data:
        name=d[idx["Kernel Name"]][:120]
        key=(name,d[idx["launch__grid_size"]],d[idx["launch__block_size"]],d[idx["launch__registers_per_thread"]],d[idx["launch__shared_mem_per_block_dynamic"]])
        agg.setdefault(key,[]).append((float(d[idx["gpu__time_duration.sum"]].replace(",","")), float(d[idx["sm__cycles_elapsed.avg.per_second"]].replace(",",""))))
    print("==",f, r[1][idx["gpu__time_duration.sum"]], r[1][idx["sm__cycles_elapsed.avg.per_second"]])
    for k,v in agg.items():
        t=sorted(x[0] for x in v); c=sorted(x[1] for x in v)
        print(f"  n={len(v):3d} med={t[len(t)//2]:12.0f} min={t[0]:12.0f} clk={c[len(c)//2]:.3g} grid={k[1]} blk={k[2]} regs={k[3]} smem={k[4]} {k[0]}")
