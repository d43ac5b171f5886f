"""all_reduce latency and bandwidth from Python, nccl-tests style: per size,
the median over 5 runs of the mean time of a loop of calls; algbw = bytes /
time, busbw = algbw * 2(n-1)/n.

    python python/bench/allreduce.py [--nranks 2] [--sizes 8,1M,64M] [--api API]

--api nccl_rs (default): the nccl_rs package on float32 numpy arrays, out of
place. --api gloo or --api torch-nccl_rs: torch.distributed's all_reduce on a
float32 CPU tensor of zeros (in place, so zeros keep every call's input the
same) through Gloo or through this package's torch backend.

Without RANK in the environment it starts --nranks copies of itself on
127.0.0.1 (torchrun's variables); under a launcher it runs as one rank.
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time


def parse_size(s: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)


def launch(args) -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(args.nranks):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.nranks), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(args.nranks))
        env.setdefault("NCCL_SOCKET_IFNAME", "lo")
        procs.append(subprocess.Popen([sys.executable] + sys.argv, env=env))
    deadline = time.monotonic() + args.timeout
    rc = 0
    for p in procs:
        try:
            rc |= p.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            print("timed out", file=sys.stderr)
            return 1
    return rc


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nranks", type=int, default=2)
    ap.add_argument("--sizes", default="8,1M,64M")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--api", choices=["nccl_rs", "gloo", "torch-nccl_rs"], default="nccl_rs")
    args = ap.parse_args()
    if "RANK" not in os.environ:
        return launch(args)
    if args.api != "nccl_rs":
        return torch_main(args)
    import numpy as np

    import nccl_rs

    comm = nccl_rs.Communicator.from_env()
    n = comm.size
    title = f"nccl_rs all_reduce from Python, {n} ranks, float32, sum, out of place; transport {comm.transport}"

    def setup(size):
        x = np.ones(max(1, size // 4), np.float32)
        y = np.empty_like(x)
        return x.nbytes, lambda: comm.all_reduce(x, y), lambda: float(y[0]) == n

    sweep(args, comm.rank, n, title, setup, comm.barrier)
    comm.finalize()
    comm.close()
    return 0


def torch_main(args) -> int:
    import torch
    import torch.distributed as dist

    backend = "gloo"
    if args.api == "torch-nccl_rs":
        import nccl_rs.torch  # noqa: F401  (registers the backend)

        backend = "nccl_rs"
    dist.init_process_group(backend=backend)
    n = dist.get_world_size()
    title = f"torch.distributed all_reduce on {backend}, {n} ranks, float32, sum, in place"

    def setup(size):
        x = torch.zeros(max(1, size // 4), dtype=torch.float32)
        return x.numel() * 4, lambda: dist.all_reduce(x), lambda: float(x[0]) == 0.0

    sweep(args, dist.get_rank(), n, title, setup, dist.barrier)
    dist.destroy_process_group()
    return 0


def sweep(args, rank, n, title, setup, barrier) -> None:
    """Times every size of --sizes: setup(size) gives (bytes, call, check)."""
    if rank == 0:
        print(f"# {title}")
        print(f"# {'bytes':>10} {'iters':>6} {'time(us)':>10} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}")
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        nbytes, call, check = setup(size)
        iters = max(3, min(1000, (64 << 20) // max(size, 1) // 8))
        for _ in range(max(2, iters // 10)):
            call()
        runs = []
        for _ in range(5):
            barrier()
            t = time.perf_counter()
            for _ in range(iters):
                call()
            runs.append((time.perf_counter() - t) / iters)
        sec = statistics.median(runs)
        assert check(), "wrong result"
        algbw = nbytes / sec / 1e9
        if rank == 0:
            print(f"  {nbytes:>10} {iters:>6} {sec * 1e6:>10.1f} {algbw:>12.3f} {algbw * 2 * (n - 1) / n:>12.3f}")


if __name__ == "__main__":
    sys.exit(main())
