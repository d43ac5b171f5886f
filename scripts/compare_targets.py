#!/usr/bin/env python3
"""Checks issue 3's performance targets against the raw output of scripts/compare.sh
(default /tmp/nccl-rs-compare.txt): 2-rank shared-memory and TCP ratios to the peers measured in
the same run, 8-byte latencies, and 4 ranks ahead of every peer; heap-buffer (nccl-rs-shm) and
ncclMemAlloc-buffer (nccl-rs-shm-R) results are checked separately, and so are registered heap
buffers on huge pages (nccl-rs-shm-H) where the run has them. Prints the misses."""
import re, statistics, sys
from collections import defaultdict
d = defaultdict(list); cfg=None
for line in open(sys.argv[1] if len(sys.argv) > 1 else "/tmp/nccl-rs-compare.txt"):
    m = re.match(r"=== rep \d+ cfg (\S+) N=(\d+) op (\S+)", line)
    if m: cfg=(m.group(1),int(m.group(2)),m.group(3)); continue
    f=line.split()
    if cfg and len(f) in (4,6):
        tt = f[4] if len(f)==6 and cfg[2]=="broadcast" else f[2]
        try: d[(cfg,int(f[0]))].append(float(tt))
        except ValueError: pass
def t(c,n,op,s):
    v=d.get(((c,n,op),s)); return statistics.median(v) if v else None
ops=["allreduce","allgather","reduce_scatter","broadcast","alltoall"]
shm_ways=["nccl-rs-shm","nccl-rs-shm-R"]+(["nccl-rs-shm-H"] if any(c[0]=="nccl-rs-shm-H" for (c,s) in d) else [])
def lab(b): return f"{b>>20} MiB" if b>=1<<20 else f"{b>>10} KiB" if b>=1024 else f"{b} B"
miss=[]; met=[]
def chk(name, ok, detail):
    (met if ok else miss).append(f"{name}: {detail}")
for op in ops:
    for s in [16<<20, 64<<20]:
        for ours in shm_ways:
            a,b=t(ours,2,op,s),t("mpi-shm",2,op,s)
            if a and b: chk(f"2r shm {op} {lab(s)} {ours} vs mpi-shm >=1.5x", b/a>=1.5, f"{b/a:.2f}x")
        for peer,need in [("gloo",2.0),("mpi-tcp",1.5)]:
            a,b=t("nccl-rs-tcp",2,op,s),t(peer,2,op,s)
            if a and b: chk(f"2r tcp {op} {lab(s)} vs {peer} >={need}x", b/a>=need, f"{b/a:.2f}x")
    for s in [64<<10, 1<<20]:
        for ours in shm_ways:
            a,b=t(ours,2,op,s),t("mpi-shm",2,op,s)
            if a and b: chk(f"2r shm {op} {lab(s)} {ours} vs mpi-shm >=1x", b/a>=1.0, f"{b/a:.2f}x")
        a,b=t("nccl-rs-tcp",2,op,s),t("mpi-tcp",2,op,s)
        if a and b: chk(f"2r tcp {op} {lab(s)} vs mpi-tcp >=1x", b/a>=1.0, f"{b/a:.2f}x")
    a=t("nccl-rs-shm",2,op,8); chk(f"2r shm {op} 8 B < 2 us", a is not None and a<2, f"{a} us")
    a=t("nccl-rs-tcp",2,op,8); chk(f"2r tcp {op} 8 B < 15 us", a is not None and a<15, f"{a} us")
    for s in [8,16,1024,65536,1<<20,16<<20,64<<20]:
        for ours in [[w,"nccl-rs-tcp"] for w in shm_ways]:
            ot=[t(c,4,op,s) for c in ours]; ot=[x for x in ot if x]
            pt=[t(c,4,op,s) for c in ["mpi-shm","mpi-tcp","gloo"]]; pt=[x for x in pt if x]
            if ot and pt: chk(f"4r {op} {lab(s)} {'+'.join(ours)} ahead of every peer", min(ot)<=min(pt), f"{min(pt)/min(ot):.2f}x")
print(f"MET {len(met)}  MISSED {len(miss)}")
print("\n".join("  miss: "+m for m in miss))
