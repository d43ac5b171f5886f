"""nccl_rs: collective communication with NCCL's semantics, from Python.

Collectives and send/recv between processes on any contiguous host buffer:
numpy arrays, ``bytearray``, ``memoryview``, torch CPU tensors (through
DLPack). ::

    import numpy as np, nccl_rs
    comm = nccl_rs.Communicator.from_env()     # torchrun / mpirun / srun / ncclrun
    x = np.full(1024, comm.rank, dtype=np.float32)
    comm.all_reduce(x)                          # in place, op="sum"
    comm.close()

Errors are :class:`NcclError` subclasses carrying the library's message.
"""

from __future__ import annotations

import os as _os
from typing import Any, Iterator, List, Optional, Tuple

from . import _native
from ._errors import (
    NcclAbortedError,
    NcclBootstrapError,
    NcclError,
    NcclInternalError,
    NcclInvalidArgumentError,
    NcclInvalidUsageError,
    NcclRemoteError,
    NcclTimeoutError,
)
from ._native import Communicator, UniqueId, Work

__all__ = [
    "Communicator",
    "UniqueId",
    "Work",
    "P2pGroup",
    "native_library_path",
    "NcclError",
    "NcclInvalidArgumentError",
    "NcclInvalidUsageError",
    "NcclTimeoutError",
    "NcclRemoteError",
    "NcclBootstrapError",
    "NcclInternalError",
    "NcclAbortedError",
]

__version__ = "0.1.0"


def native_library_path() -> str:
    """Absolute path of the extension module's shared object. Besides the
    Python binding it exports NCCL's C ABI (``ncclCommInitRank``,
    ``ncclAllReduce``, ...), for C/C++ code that ``dlopen``s it."""
    return _os.path.abspath(_native.__file__)


class P2pGroup:
    """Sends and receives that run together (NCCL's group of
    ``ncclSend``/``ncclRecv``), in any order without deadlock. ::

        with nccl_rs.P2pGroup(comm) as g:      # runs when the block ends
            g.send(a, (comm.rank + 1) % comm.size)
            g.recv(b, (comm.rank - 1) % comm.size)

    or ``g = P2pGroup(comm); ...; work = g.run(async_op=True)``.
    """

    def __init__(self, comm: Communicator) -> None:
        self._comm = comm
        self._ops: List[Tuple[str, Any, int]] = []

    def send(self, buf: Any, peer: int) -> "P2pGroup":
        """Adds a send of `buf` to `peer`."""
        self._ops.append(("send", buf, peer))
        return self

    def recv(self, buf: Any, peer: int) -> "P2pGroup":
        """Adds a receive into `buf` from `peer`."""
        self._ops.append(("recv", buf, peer))
        return self

    def run(self, *, async_op: bool = False) -> Optional[Work]:
        """Runs the group (and empties it)."""
        ops, self._ops = self._ops, []
        return self._comm.run_group(ops, async_op=async_op)

    def __len__(self) -> int:
        return len(self._ops)

    def __iter__(self) -> Iterator[Tuple[str, Any, int]]:
        return iter(self._ops)

    def __enter__(self) -> "P2pGroup":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.run()
