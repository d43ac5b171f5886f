"""Exceptions of nccl_rs. Each carries the library's message, which names the
rank and the operation (e.g. ``rank 1: all_reduce #3 timed out ...``)."""


class NcclError(Exception):
    """Base class of every error nccl_rs raises."""


class NcclInvalidArgumentError(NcclError, ValueError):
    """A call's arguments cannot work (wrong dtype, mismatched lengths,
    read-only or non-contiguous buffer, bad rank or root); nothing was sent."""


class NcclInvalidUsageError(NcclError):
    """Calls that are valid one by one but not together (mismatched
    collectives across ranks, a closed communicator, use after a failure)."""


class NcclTimeoutError(NcclError, TimeoutError):
    """A deadline passed (``NCCL_RS_TIMEOUT`` for operations,
    ``NCCL_RS_BOOTSTRAP_TIMEOUT`` for rendezvous, or ``wait(timeout=)``)."""


class NcclRemoteError(NcclError):
    """A peer failed or died, or its connection broke."""


class NcclBootstrapError(NcclError):
    """Rendezvous failed (bad unique id or address, rejected by the root)."""


class NcclInternalError(NcclError):
    """A system call failed, or a bug in the library: please report it."""


class NcclAbortedError(NcclError):
    """The communicator was aborted while the operation ran."""
