"""python/examples/ddp_digits.py under torchrun: nccl_rs trains as Gloo does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
EXAMPLE = os.path.join(ROOT, "python", "examples", "ddp_digits.py")
STEPS = 15


def train(backend: str, n: int, out: str) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={n}", EXAMPLE, "--backend", backend,
           "--steps", str(STEPS), "--quiet", "--out", out]
    env = dict(os.environ, NCCL_RS_TIMEOUT="60", OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return [json.load(open(f"{out}.rank{r}.json")) for r in range(n)]


@pytest.mark.parametrize("n", [2, 4])
def test_ddp_digits_matches_gloo(tmp_path, n):
    gloo = train("gloo", n, str(tmp_path / "gloo"))
    ours = train("nccl_rs", n, str(tmp_path / "nccl_rs"))
    for runs, name in ((gloo, "gloo"), (ours, "nccl_rs")):
        digests = {r["params_sha256"] for r in runs}
        assert len(digests) == 1, f"{name}: final parameters differ across ranks: {digests}"
        assert all(len(r["losses"]) == STEPS for r in runs)
    for step, (a, b) in enumerate(zip(ours[0]["losses"], gloo[0]["losses"])):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6), f"step {step}: nccl_rs {a} vs gloo {b}"
    # training did something
    assert ours[0]["losses"][-1] < ours[0]["losses"][0]
