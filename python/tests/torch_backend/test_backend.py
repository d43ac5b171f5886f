"""torch.distributed backend "nccl_rs" against Gloo, at 2 and 4 ranks."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _workers import SCENARIOS  # noqa: E402


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scenario(job, n, scenario):
    results = job(n)
    problems = []
    for rank, res in sorted(results.items()):
        if "setup" in res:
            problems.append(f"rank {rank} setup: {res['setup']}")
            continue
        outcome = res.get(scenario)
        if outcome is None:
            why = res.get("_hung", "its process ended before it")
            problems.append(f"rank {rank}: scenario did not run ({why})")
        elif outcome != "ok":
            problems.append(f"rank {rank}: {outcome}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("n", [2, 4])
def test_job_ended_cleanly(job, n):
    """Every rank got through destroy_process_group within the deadline."""
    for rank, res in job(n).items():
        assert "_hung" not in res, res["_hung"]
        assert "end" in res, f"rank {rank} did not finish"
