#!/usr/bin/env python3
"""Loads libnccl.so.2 with ctypes and runs an all-reduce across processes.

    python3 ffi/examples/allreduce_ctypes.py [PATH/TO/libnccl.so.2] [NRANKS]

With no path it loads the newest library this checkout built: cargo names it
target/<profile>/libnccl.so (`cargo build --release -p nccl-ffi`) and
ffi/scripts/dist.sh lays it out as target/<profile>/nccl-dist/lib/libnccl.so.2
(CARGO_TARGET_DIR is honoured); with none built, the dynamic loader's
libnccl.so.2 (LD_LIBRARY_PATH, or an installed NCCL). It prints which.

The launcher starts NRANKS (default 2) copies of itself; rank 0 creates the
unique id with ncclGetUniqueId and hands its 128 bytes to the others through
a file. Every rank all-reduces a float32 array and checks the sum.
"""
import ctypes
import os
import subprocess
import sys
import tempfile
import time

NCCL_SUCCESS, NCCL_FLOAT32, NCCL_SUM = 0, 7, 0


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def check(lib, res, what):
    if res != NCCL_SUCCESS:
        err = lib.ncclGetLastError(None).decode()
        raise RuntimeError(f"{what} failed with {res} ({lib.ncclGetErrorString(res).decode()}): {err}")


def worker(libpath, rank, nranks, idfile):
    lib = ctypes.CDLL(libpath)
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    lib.ncclGetLastError.restype = ctypes.c_char_p
    uid = UniqueId()
    if rank == 0:
        check(lib, lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        with open(idfile + ".tmp", "wb") as f:
            f.write(ctypes.string_at(ctypes.addressof(uid), 128))  # all 128 bytes, NULs included
        os.rename(idfile + ".tmp", idfile)
    else:
        deadline = time.monotonic() + 60
        while not os.path.exists(idfile):
            if time.monotonic() > deadline:
                raise RuntimeError("no unique id after 60 s")
            time.sleep(0.01)
        with open(idfile, "rb") as f:
            raw = f.read()
        assert len(raw) == 128, f"unique id file has {len(raw)} bytes"
        ctypes.memmove(ctypes.byref(uid), raw, 128)
    comm = ctypes.c_void_p()
    check(lib, lib.ncclCommInitRank(ctypes.byref(comm), nranks, uid, rank), "ncclCommInitRank")
    n = 1 << 16
    send = (ctypes.c_float * n)(*([float(rank + 1)] * n))
    recv = (ctypes.c_float * n)()
    check(lib, lib.ncclAllReduce(send, recv, ctypes.c_size_t(n), NCCL_FLOAT32, NCCL_SUM, comm, None), "ncclAllReduce")
    want = nranks * (nranks + 1) / 2
    assert all(x == want for x in recv), f"rank {rank}: got {recv[0]}, want {want}"
    check(lib, lib.ncclCommDestroy(comm), "ncclCommDestroy")
    print(f"ctypes rank {rank}: all-reduce OK ({want})")


def find_library():
    """The newest libnccl built under this checkout's target directory, or
    the bare SONAME for the dynamic loader when there is none.

    Newest, because a stale build next to a fresh one is the usual mistake;
    cargo's own name (libnccl.so) counts, since a cdylib build never writes
    the .so.2 name and ctypes loads any path."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    target = os.path.abspath(os.environ.get("CARGO_TARGET_DIR") or os.path.join(root, "target"))
    found = []
    for profile in ("release", "debug"):
        for rel in ("nccl-dist/lib/libnccl.so.2", "libnccl.so.2", "libnccl.so"):
            path = os.path.join(target, profile, rel)
            if os.path.isfile(path):
                found.append((os.path.getmtime(path), path))
    return max(found)[1] if found else "libnccl.so.2"


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _, _, libpath, rank, nranks, idfile = sys.argv
        worker(libpath, int(rank), int(nranks), idfile)
        return
    libpath = sys.argv[1] if len(sys.argv) > 1 else find_library()
    nranks = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    # Load it here first: one clear message instead of a traceback per rank.
    try:
        lib = ctypes.CDLL(libpath)
        lib.ncclGetErrorString.restype = ctypes.c_char_p
        lib.ncclGetLastError.restype = ctypes.c_char_p
        version = ctypes.c_int()
        check(lib, lib.ncclGetVersion(ctypes.byref(version)), "ncclGetVersion")
    except (OSError, AttributeError, RuntimeError) as e:
        sys.exit(f"cannot use {libpath}: {e}\n"
                 "build it first (cargo build --release -p nccl-ffi, or ffi/scripts/dist.sh --release)"
                 " or pass its path")
    print(f"ctypes: loaded {libpath} (NCCL version code {version.value}), {nranks} ranks", flush=True)
    with tempfile.TemporaryDirectory() as d:
        idfile = os.path.join(d, "nccl-id")
        procs = [subprocess.Popen([sys.executable, __file__, "--worker", libpath, str(r), str(nranks), idfile])
                 for r in range(nranks)]
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=120))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append("timeout")
    if any(c != 0 for c in codes):
        sys.exit(f"ranks exited with {codes}")
    print("ctypes all-reduce: OK")


if __name__ == "__main__":
    main()
