"""Runs a scenario of `_workers.py` as N real processes on 127.0.0.1, with
torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "_workers.py")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    nranks: int,
    scenario: str,
    timeout: float = 120.0,
    env: Optional[Dict[str, str]] = None,
    expect_rc: Optional[Dict[int, int]] = None,
) -> List[str]:
    """Runs `scenario` on `nranks` processes; fails unless every rank exits
    with its expected code (0 unless `expect_rc` says otherwise) within
    `timeout` seconds. Returns each rank's output."""
    port = free_port()
    procs = []
    for rank in range(nranks):
        e = dict(os.environ)
        e.update(
            RANK=str(rank),
            WORLD_SIZE=str(nranks),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(nranks),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            NCCL_SOCKET_IFNAME="lo",
            NCCL_IB_DISABLE="1",
            NCCL_RS_BOOTSTRAP_TIMEOUT="60",
            NCCL_RS_TIMEOUT="60",
            PYTHONUNBUFFERED="1",
        )
        e.update(env or {})
        procs.append(
            subprocess.Popen(
                [sys.executable, WORKERS, scenario],
                env=e,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs: List[str] = []
    failed = []
    deadline = time.monotonic() + timeout
    for rank, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate(timeout=10)
            failed.append(f"rank {rank} did not finish within {timeout}s")
        outs.append(out)
        want = (expect_rc or {}).get(rank, 0)
        if p.returncode != want and not failed:
            failed.append(f"rank {rank} exited {p.returncode}, expected {want}")
    if failed:
        joined = "\n".join(f"--- rank {r} ---\n{o}" for r, o in enumerate(outs))
        raise AssertionError(f"{scenario} at {nranks} ranks: {'; '.join(failed)}\n{joined}")
    return outs
