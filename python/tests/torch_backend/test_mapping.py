"""The pure mappings: torch ReduceOp and dtype to NCCL's enums (tables)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from nccl_rs.torch import nccl_reduce_dtype, nccl_reduce_op

R = dist.ReduceOp

# (op, dtype, ncclRedOp_t) from nccl.h: Sum 0, Prod 1, Max 2, Min 3, Avg 4
OPS = [
    (R.SUM, torch.float32, 0),
    (R.PRODUCT, torch.float32, 1),
    (R.MAX, torch.int64, 2),
    (R.MIN, torch.int8, 3),
    (R.AVG, torch.float64, 4),
    (dist._make_nccl_premul_sum(0.5), torch.float32, 0),
    (R.SUM, torch.bool, 2),
    (R.MAX, torch.bool, 2),
    (R.PRODUCT, torch.bool, 3),
    (R.MIN, torch.bool, 3),
]


@pytest.mark.parametrize("op,dtype,code", OPS)
def test_reduce_op(op, dtype, code):
    assert nccl_reduce_op(op, dtype) == code


@pytest.mark.parametrize(
    "op,dtype,message",
    [
        (R.BAND, torch.int32, "ReduceOp.BAND has no NCCL equivalent"),
        (R.BOR, torch.int32, "ReduceOp.BOR has no NCCL equivalent"),
        (R.BXOR, torch.uint8, "ReduceOp.BXOR has no NCCL equivalent"),
        (R.AVG, torch.bool, "ReduceOp.AVG is not defined on bool tensors"),
        (dist._make_nccl_premul_sum(2.0), torch.int32, "PREMUL_SUM needs a floating-point tensor"),
    ],
)
def test_reduce_op_refused(op, dtype, message):
    with pytest.raises(ValueError, match=message):
        nccl_reduce_op(op, dtype)


# (dtype, ncclRedOp_t, ncclDataType_t) from nccl.h
DTYPES = [
    (torch.int8, 0, 0),
    (torch.uint8, 0, 1),
    (torch.int32, 0, 2),
    (torch.int64, 0, 4),
    (torch.float16, 0, 6),
    (torch.float32, 0, 7),
    (torch.float64, 0, 8),
    (torch.bfloat16, 0, 9),
    (torch.bool, 2, 1),
    (torch.complex64, 0, 7),
    (torch.complex128, 4, 8),
]


@pytest.mark.parametrize("dtype,op,code", DTYPES)
def test_reduce_dtype(dtype, op, code):
    assert nccl_reduce_dtype(dtype, op) == code


def test_reduce_dtype_refused():
    with pytest.raises(ValueError, match="complex tensors only reduce with SUM or AVG"):
        nccl_reduce_dtype(torch.complex64, 2)
    with pytest.raises(ValueError, match="cannot reduce tensors of dtype torch.int16"):
        nccl_reduce_dtype(torch.int16, 0)


def test_backend_registered():
    assert "nccl_rs" in dist.Backend.backend_list
    assert dist.Backend.backend_capability["nccl_rs"] == ["cpu", "cuda"]


def test_calls_resolve_into_nccl_rs():
    """Every entry point comes from our library, even with NVIDIA's loaded."""
    from nccl_rs.torch import _lib

    lib = _lib.load()
    assert lib.resolved_from == lib.path
    maps = open("/proc/self/maps").read()
    others = {line.split()[-1] for line in maps.splitlines()
              if "libnccl" in line and lib.path not in line}
    # torch's CUDA wheels load NVIDIA's libnccl.so.2: still, ncclGetVersion is ours
    for other in others:
        assert lib._owner_of("ncclGetVersion") != other
    assert lib.version() == 23007
