#!/usr/bin/env python3
"""One rank of a Gloo (torch.distributed) collective benchmark, started by a
launcher that sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (ncclrun,
torchrun, mpirun with those exported). Rank 0 prints one line per size:

    op size_bytes time_us busbw_GBps

time_us is the median over iterations of the slowest rank's time (a barrier
before each); sizes follow nccl-tests: all-reduce the buffer, all-gather the
output, reduce-scatter the input, all-to-all the per-rank send buffer.

    python3 gloo_rank.py -o allreduce,allgather -s 65536,1048576 [-i ITERS]
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist


def factor(op, n):
    return 2.0 * (n - 1) / n if op == "allreduce" else (n - 1) / n


def call(op, n, count):
    """The collective of `count` float32 elements (nccl-tests' size meaning)."""
    if op == "allreduce":
        t = torch.ones(count)
        return lambda: dist.all_reduce(t)
    per = max(count // n, 1)
    if op == "allgather":
        src, dst = torch.ones(per), torch.empty(per * n)
        return lambda: dist.all_gather_into_tensor(dst, src)
    if op == "reduce_scatter":
        src, dst = torch.ones(per * n), torch.empty(per)
        return lambda: dist.reduce_scatter_tensor(dst, src)
    if op == "alltoall":
        src, dst = torch.ones(per * n), torch.empty(per * n)
        return lambda: dist.all_to_all_single(dst, src)
    raise SystemExit(f"unknown op {op}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--ops", default="allreduce")
    ap.add_argument("-s", "--sizes", default="65536,1048576,16777216,67108864")
    ap.add_argument("-i", "--iters", type=int, default=0, help="0: by size")
    a = ap.parse_args()
    dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=120))
    rank, n = dist.get_rank(), dist.get_world_size()
    for op in a.ops.split(","):
        if op == "reduce_scatter" and not hasattr(dist, "reduce_scatter_tensor"):
            continue
        for size in (int(s) for s in a.sizes.split(",")):
            fn = call(op, n, max(size // 4, n))
            iters = a.iters or (5 if size >= 16 << 20 else 20 if size >= 1 << 20 else 50)
            for _ in range(2):
                fn()
            times = []
            for _ in range(iters):
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            slowest = torch.tensor(times, dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            med = statistics.median(slowest.tolist())
            if rank == 0:
                busbw = size / med * factor(op, n) / 1e9
                print(f"{op} {size} {med * 1e6:.1f} {busbw:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
