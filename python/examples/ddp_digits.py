"""Data-parallel training of a small CNN on scikit-learn's digits, with DDP.

    torchrun --nproc-per-node 4 python/examples/ddp_digits.py --backend nccl_rs
    torchrun --nproc-per-node 4 python/examples/ddp_digits.py --backend gloo

The data set (1797 8x8 images, 10 classes) ships inside scikit-learn, so
nothing is downloaded. With the same --seed both backends see the same
initial weights and the same batches: every step takes one global batch of
--batch x world-size images from a seeded permutation, and rank r trains on
its r-th slice. DDP averages the gradients in buckets of --bucket-mb.

Rank 0 prints each step's global loss (the mean over ranks) and the mean
time per step after --warmup steps. With --out PREFIX every rank writes
PREFIX.rank<r>.json: the losses, the step times, and a SHA-256 of its final
parameters (equal on every rank when training stayed in sync).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 8 * 8, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def parameter_digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["gloo", "nccl_rs"], default="nccl_rs")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=32, help="images per rank per step")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bucket-mb", type=float, default=0.25, help="DDP gradient bucket size")
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the mean step time")
    ap.add_argument("--out", help="write PREFIX.rank<r>.json")
    ap.add_argument("--quiet", action="store_true", help="print only the summary")
    args = ap.parse_args()

    if args.backend == "nccl_rs":
        import nccl_rs.torch  # noqa: F401  registers the backend
    torch.set_num_threads(1)
    dist.init_process_group(args.backend, timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.int64)

    torch.manual_seed(args.seed)
    model = Net()
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    order = torch.Generator().manual_seed(args.seed)
    perm = torch.randperm(len(images), generator=order)
    global_batch = args.batch * world
    if global_batch > len(images):
        raise SystemExit(f"--batch x world size ({global_batch}) exceeds the data set ({len(images)})")

    losses, times = [], []
    pos = 0
    for step in range(args.steps):
        if pos + global_batch > len(perm):
            perm = torch.randperm(len(images), generator=order)
            pos = 0
        idx = perm[pos + rank * args.batch : pos + (rank + 1) * args.batch]
        pos += global_batch
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(ddp(images[idx]), labels[idx])
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean /= world
        losses.append(mean.item())
        if rank == 0 and not args.quiet:
            print(f"step {step:3d}  loss {losses[-1]:.6f}  {times[-1] * 1e3:.2f} ms", flush=True)

    timed = times[args.warmup :] or times
    step_ms = 1e3 * sum(timed) / len(timed)
    digest = parameter_digest(model)
    if rank == 0:
        print(
            f"backend {args.backend}  ranks {world}  steps {args.steps}  "
            f"final loss {losses[-1]:.6f}  mean step {step_ms:.2f} ms  params {digest[:16]}",
            flush=True,
        )
    if args.out:
        with open(f"{args.out}.rank{rank}.json", "w") as f:
            json.dump(
                {"backend": args.backend, "world": world, "losses": losses,
                 "step_ms": step_ms, "params_sha256": digest}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
