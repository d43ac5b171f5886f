"""PyTorch distributed backend "nccl_rs" over nccl-rs.

``import nccl_rs.torch`` registers the backend, after which

    torch.distributed.init_process_group(backend="nccl_rs")

works under torchrun (env://) or with any other rendezvous PyTorch offers.
CPU tensors always work; CUDA tensors need nccl-rs built with its ``cuda``
feature. The C library is found through ``NCCL_RS_LIBRARY`` (a path to a
``libnccl.so.2`` built from nccl-rs) or the ``nccl_rs`` package's native
module; see ``library_path()``.
"""

from __future__ import annotations

import torch.distributed as dist

from ._lib import library_path
from .backend import BACKEND_NAME, NcclRsBackend, nccl_reduce_dtype, nccl_reduce_op

__all__ = [
    "BACKEND_NAME",
    "NcclRsBackend",
    "library_path",
    "nccl_reduce_dtype",
    "nccl_reduce_op",
    "register",
]


def _create(opts, backend_options=None) -> NcclRsBackend:
    return NcclRsBackend(
        opts.store, opts.group_rank, opts.group_size, opts.timeout, str(opts.group_id or "")
    )


def _patch_work_is_completed() -> None:
    """Makes ``Work.is_completed`` see the completion of Python backends' work.

    PyTorch wraps each Work a Python backend returns in a holder that forwards
    ``wait`` and ``get_future`` but not ``is_completed``, which then stays
    False. The patch answers from the Work's future where the original says
    False; a Work whose future is done has finished, whatever its backend.
    """
    work_cls = dist.Work
    original = work_cls.is_completed
    if getattr(original, "_nccl_rs_patched", False):
        return

    def is_completed(self) -> bool:
        if original(self):
            return True
        try:
            fut = self.get_future()
        except RuntimeError:  # a backend without futures
            return False
        return fut.done()

    is_completed._nccl_rs_patched = True
    is_completed.__doc__ = original.__doc__
    work_cls.is_completed = is_completed


def register() -> None:
    """Registers backend "nccl_rs" with torch.distributed (idempotent)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    _patch_work_is_completed()
    dist.Backend.register_backend(
        BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"]
    )


register()
