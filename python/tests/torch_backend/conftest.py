"""Spawns one job per world size that runs every scenario of _workers.py.

The job is made once per world size (importing torch in each rank is the
slow part); each test then checks one scenario's outcome on every rank.
Every wait has a deadline: the job is killed after JOB_TIMEOUT seconds.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
JOB_TIMEOUT = float(os.environ.get("NCCL_RS_TORCH_TEST_TIMEOUT", "600"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(n: int) -> dict[int, dict[str, str]]:
    import torch.multiprocessing as mp

    sys.path.insert(0, HERE)
    import _workers

    out_dir = tempfile.mkdtemp(prefix=f"nccl_rs_torch_{n}_")
    env = dict(NCCL_RS_TIMEOUT="60", OMP_NUM_THREADS="1")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        ctx = mp.get_context("spawn")
        port = free_port()
        procs = [ctx.Process(target=_workers.worker, args=(r, n, port, out_dir)) for r in range(n)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + JOB_TIMEOUT
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    results: dict[int, dict[str, str]] = {}
    for r in range(n):
        path = os.path.join(out_dir, f"rank{r}.txt")
        lines = open(path).read().splitlines() if os.path.exists(path) else []
        res = {}
        for line in lines:
            name, _, rest = line.partition(" ")
            res[name] = rest.replace("\\n", "\n")
        if r in hung:
            res["_hung"] = f"rank {r} still ran after {JOB_TIMEOUT:.0f} s (killed)"
        results[r] = res
    return results


_jobs: dict[int, dict] = {}


@pytest.fixture(scope="session")
def job():
    def get(n: int):
        if n not in _jobs:
            _jobs[n] = run_job(n)
        return _jobs[n]

    return get
