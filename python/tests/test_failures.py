"""Failures across processes come back as the right exception, with the
library's message, within their deadline."""

import pytest

from _launch import launch


def test_timeout_raises_timeout_error():
    outs = launch(2, "timeout", timeout=60, env={"NCCL_RS_TIMEOUT": "2", "SLEEP": "6"})
    assert "OK NcclTimeoutError" in outs[0], outs[0]


def test_dead_peer_raises():
    outs = launch(2, "dead_peer", timeout=90, env={"NCCL_RS_TIMEOUT": "20"}, expect_rc={1: 3})
    assert "OK NcclRemoteError" in outs[0], outs[0]


def test_wait_timeout_then_complete():
    launch(2, "wait_timeout", timeout=60)


def test_mismatched_counts_raise_on_every_rank():
    outs = launch(2, "mismatch", timeout=60, env={"NCCL_RS_TIMEOUT": "5"})
    for out in outs:
        assert "OK NcclInvalidUsageError" in out, out
