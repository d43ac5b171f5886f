"""Every collective, dtype, op and in-place/async form at 2 and 4 processes,
against numpy-computed results, bit for bit (see `_workers.py`)."""

import pytest

from _launch import launch

SCENARIOS = [
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "gather_scatter",
    "p2p",
    "barrier_split",
    "bytearray",
]


@pytest.mark.parametrize("nranks", [2, 4])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(scenario, nranks):
    outs = launch(nranks, scenario, timeout=240)
    for rank, out in enumerate(outs):
        assert f"rank {rank}: {scenario} passed" in out, out


@pytest.mark.parametrize("nranks", [2, 4])
def test_torch_tensors(nranks):
    pytest.importorskip("torch")
    launch(nranks, "torch", timeout=240)
