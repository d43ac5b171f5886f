#!/usr/bin/env python3
"""Medians over reps of scripts/compare.sh output, as a markdown table.

Each cell: median time per op and median bus bandwidth (GB/s); nccl-rs's
broadcast in place (the peers' broadcast has one buffer), the rest out of
place. The last
two columns compare, by time, the best peer with nccl-rs's best on heap
buffers (shm or tcp) and with nccl-rs on ncclMemAlloc buffers (shm-R,
zero copy); a run with registered heap buffers (shm-H, OURS=... shm-H)
gets their column and a third comparison."""
import re, statistics, sys
from collections import defaultdict

d = defaultdict(list)
cfg = None
for line in open(sys.argv[1]):
    m = re.match(r"=== rep \d+ cfg (\S+) N=(\d+) op (\S+)", line)
    if m:
        cfg = (m.group(1), int(m.group(2)), m.group(3))
        continue
    f = line.split()
    if cfg and len(f) in (4, 6):
        # nccl-rs lines: size count time busbw time busbw (out of place, in
        # place); broadcast is compared in place, as the peers' one-buffer calls.
        t, b = (f[4], f[5]) if len(f) == 6 and cfg[2] == "broadcast" else (f[2], f[3])
        try:
            d[(cfg, int(f[0]))].append((float(t), float(b)))
        except ValueError:
            pass

def lab(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB" if b >= 1024 else f"{b} B"

def ft(us):
    return f"{us / 1000:.1f} ms" if us >= 10000 else f"{us:.0f} us" if us >= 100 else f"{us:.1f} us"

huge = any(c[0] == "nccl-rs-shm-H" for (c, s) in d)
ours_heap, ours_reg = ["nccl-rs-shm", "nccl-rs-tcp"], ["nccl-rs-shm-R"]
ours_huge = ["nccl-rs-shm-H"] if huge else []
peers = ["mpi-shm", "mpi-tcp", "gloo"]
cfgs = ours_heap + ours_reg + ours_huge + peers
groups = [ours_heap, ours_reg] + ([ours_huge] if huge else [])
keys = sorted({(c[1], c[2], s) for (c, s) in d})
extra = " ours (-H 1) vs best peer |" if huge else ""
print("| N | op | size | " + " | ".join(cfgs) + " | ours (heap) vs best peer | ours (-R 1) vs best peer |" + extra)
print("|---|---|---|" + "---|" * (len(cfgs) + len(groups)))
for n, op, s in sorted(keys, key=lambda k: (k[0], k[1], k[2])):
    cells, times = [], {}
    for c in cfgs:
        v = d.get(((c, n, op), s))
        if not v:
            cells.append("-")
            continue
        t = statistics.median(x[0] for x in v)
        b = statistics.median(x[1] for x in v)
        times[c] = t
        cells.append(f"{ft(t)} / {b:.2f}")
    peer = min([times[c] for c in peers if c in times] or [0])
    def ratio(group):
        ours = min([times[c] for c in group if c in times] or [0])
        if not (ours and peer):
            return "-"
        return f"{peer / ours:.2f}x faster" if ours <= peer else f"{ours / peer:.2f}x slower"
    print(f"| {n} | {op} | {lab(s)} | " + " | ".join(cells) + " | " + " | ".join(ratio(g) for g in groups) + " |")
