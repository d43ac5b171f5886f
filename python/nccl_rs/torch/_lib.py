"""Loads nccl-rs's C ABI (``libnccl.so.2``) for the torch backend.

PyTorch's CUDA wheels bring NVIDIA's ``libnccl.so.2``, and ``import torch``
may load it into the process with global symbol scope. Looking up
``ncclAllReduce`` by name would then bind to NVIDIA's library. So ours is
opened by path with ``RTLD_LOCAL | RTLD_NOW | RTLD_DEEPBIND`` (its symbols
stay private, and its own references resolve inside it first), every entry
point is taken from that handle, and ``dladdr`` confirms that the resolved
``ncclGetVersion`` lives in the file we opened.
"""

from __future__ import annotations

import ctypes
import os
import threading

# ncclResult_t codes (nccl.h).
SUCCESS = 0
IN_PROGRESS = 7

# ncclDataType_t (nccl.h).
INT8, UINT8, INT32, UINT32, INT64, UINT64 = 0, 1, 2, 3, 4, 5
FLOAT16, FLOAT32, FLOAT64, BFLOAT16 = 6, 7, 8, 9
FLOAT8E4M3, FLOAT8E5M2 = 10, 11

# ncclRedOp_t (nccl.h).
SUM, PROD, MAX, MIN, AVG = 0, 1, 2, 3, 4

UNIQUE_ID_BYTES = 128

_ENV_LIBRARY = "NCCL_RS_LIBRARY"


class UniqueId(ctypes.Structure):
    """``ncclUniqueId``: 128 opaque bytes, passed by value."""

    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]

    def to_bytes(self) -> bytes:
        # bytes(self.internal) would stop at the first NUL.
        return ctypes.string_at(ctypes.addressof(self), UNIQUE_ID_BYTES)

    @classmethod
    def from_bytes(cls, data: bytes) -> "UniqueId":
        if len(data) != UNIQUE_ID_BYTES:
            raise ValueError(
                f"nccl_rs: a unique id has {UNIQUE_ID_BYTES} bytes, got {len(data)}"
            )
        uid = cls()
        ctypes.memmove(ctypes.addressof(uid), data, UNIQUE_ID_BYTES)
        return uid


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def library_path() -> str:
    """The path of the nccl-rs C library this backend calls.

    ``NCCL_RS_LIBRARY`` (a path to ``libnccl.so.2`` built from this
    repository) wins; otherwise the ``nccl_rs`` package's native module,
    which exports the same C ABI (``nccl_rs.native_library_path()``).
    """
    path = os.environ.get(_ENV_LIBRARY)
    if path:
        if not os.path.isfile(path):
            raise RuntimeError(f"nccl_rs: {_ENV_LIBRARY}={path!r} is not a file")
        return os.path.realpath(path)
    try:
        import nccl_rs  # the package's own native module exports the C ABI
    except ImportError as e:  # pragma: no cover - depends on the install
        raise RuntimeError(
            f"nccl_rs: cannot find the nccl-rs C library: set {_ENV_LIBRARY} "
            f"to a libnccl.so.2 built from nccl-rs, or install the nccl_rs package ({e})"
        ) from e
    find = getattr(nccl_rs, "native_library_path", None)
    if find is None:
        raise RuntimeError(
            "nccl_rs: the installed nccl_rs package has no native_library_path(); "
            f"set {_ENV_LIBRARY} to a libnccl.so.2 built from nccl-rs"
        )
    return os.path.realpath(find())


def _sig(lib, name, restype, argtypes):
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


class Library:
    """The C entry points, bound from one ``dlopen`` handle."""

    def __init__(self, path: str):
        self.path = path
        mode = os.RTLD_LOCAL | os.RTLD_NOW | getattr(os, "RTLD_DEEPBIND", 0)
        try:
            lib = ctypes.CDLL(path, mode=mode)
        except OSError as e:
            raise RuntimeError(f"nccl_rs: cannot load {path}: {e}") from e
        self._lib = lib
        vp, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        res = ctypes.c_int
        self.GetVersion = _sig(lib, "ncclGetVersion", res, [ctypes.POINTER(i)])
        self.GetUniqueId = _sig(lib, "ncclGetUniqueId", res, [ctypes.POINTER(UniqueId)])
        self.CommInitRank = _sig(
            lib, "ncclCommInitRank", res, [ctypes.POINTER(vp), i, UniqueId, i]
        )
        self.CommDestroy = _sig(lib, "ncclCommDestroy", res, [vp])
        self.CommAbort = _sig(lib, "ncclCommAbort", res, [vp])
        self.GetErrorString = _sig(lib, "ncclGetErrorString", ctypes.c_char_p, [res])
        self.GetLastError = _sig(lib, "ncclGetLastError", ctypes.c_char_p, [vp])
        self.AllReduce = _sig(lib, "ncclAllReduce", res, [vp, vp, sz, i, i, vp, vp])
        self.Broadcast = _sig(lib, "ncclBroadcast", res, [vp, vp, sz, i, i, vp, vp])
        self.Reduce = _sig(lib, "ncclReduce", res, [vp, vp, sz, i, i, i, vp, vp])
        self.AllGather = _sig(lib, "ncclAllGather", res, [vp, vp, sz, i, vp, vp])
        self.ReduceScatter = _sig(lib, "ncclReduceScatter", res, [vp, vp, sz, i, i, vp, vp])
        self.AlltoAll = _sig(lib, "ncclAlltoAll", res, [vp, vp, sz, i, vp, vp])
        self.Gather = _sig(lib, "ncclGather", res, [vp, vp, sz, i, i, vp, vp])
        self.Scatter = _sig(lib, "ncclScatter", res, [vp, vp, sz, i, i, vp, vp])
        self.Send = _sig(lib, "ncclSend", res, [vp, sz, i, i, vp, vp])
        self.Recv = _sig(lib, "ncclRecv", res, [vp, sz, i, i, vp, vp])
        self.GroupStart = _sig(lib, "ncclGroupStart", res, [])
        self.GroupEnd = _sig(lib, "ncclGroupEnd", res, [])
        self.resolved_from = self._owner_of("ncclGetVersion")
        if self.resolved_from != os.path.realpath(path):
            raise RuntimeError(
                f"nccl_rs: ncclGetVersion resolved to {self.resolved_from}, not {path}; "
                "another libnccl.so.2 shadows nccl-rs"
            )
        # The cuda feature makes the library look up the CUDA driver by name.
        with open(path, "rb") as f:
            self.has_cuda_feature = b"cuPointerGetAttribute" in f.read()

    def _owner_of(self, symbol: str) -> str:
        libdl = ctypes.CDLL(None)
        dladdr = libdl.dladdr
        dladdr.restype = ctypes.c_int
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        info = _DlInfo()
        addr = ctypes.cast(getattr(self._lib, symbol), ctypes.c_void_p)
        if not dladdr(addr, ctypes.byref(info)) or not info.dli_fname:
            raise RuntimeError(f"nccl_rs: dladdr cannot place {symbol}")
        return os.path.realpath(info.dli_fname.decode())

    def version(self) -> int:
        v = ctypes.c_int()
        self.check(self.GetVersion(ctypes.byref(v)), "ncclGetVersion")
        return v.value

    def check(self, rc: int, what: str, comm=None) -> None:
        """Raises RuntimeError carrying the library's own message when rc fails.

        Must run on the thread that made the call: the last error is per thread.
        """
        if rc == SUCCESS:
            return
        name = (self.GetErrorString(rc) or b"").decode(errors="replace")
        last = (self.GetLastError(comm) or b"").decode(errors="replace")
        detail = f": {last}" if last else ""
        raise RuntimeError(f"nccl_rs: {what} failed ({name}, code {rc}){detail}")


_loaded: Library | None = None
_lock = threading.Lock()


def load() -> Library:
    """The process's one ``Library``, loaded on first use."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = Library(library_path())
        return _loaded
