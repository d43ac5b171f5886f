"""Bad arguments raise NcclInvalidArgumentError (a ValueError) with a clear
message, before anything is sent; never a crash. One-rank communicator, in
this process."""

import os

import numpy as np
import pytest

os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
os.environ.setdefault("NCCL_IB_DISABLE", "1")

import nccl_rs  # noqa: E402
from nccl_rs import NcclInvalidArgumentError as Bad  # noqa: E402


@pytest.fixture(scope="module")
def comm():
    c = nccl_rs.Communicator(nccl_rs.UniqueId(), 1, 0)
    yield c
    c.close()


def f32(n):
    return np.arange(n, dtype=np.float32)


CASES = [
    # (call, message fragment)
    (lambda c: c.all_reduce(f32(8), np.zeros(8, np.int32)), "input holds float32 but output holds int32"),
    (lambda c: c.all_reduce(f32(8), np.zeros(4, np.float32)), "input has 8 elements but output has 4"),
    (lambda c: c.all_reduce(f32(8)[::2]), "not contiguous"),
    (lambda c: c.all_reduce(np.zeros((4, 4), np.float32).T), "not contiguous"),
    (lambda c: c.all_reduce(f32(8), dtype="int32"), "holds float32 but dtype=int32"),
    (lambda c: c.all_reduce(f32(8), dtype="float64"), "holds float32 but dtype=float64"),
    (lambda c: c.all_reduce(np.zeros(4, np.int16)), "not an NCCL datatype; pass dtype="),
    (lambda c: c.all_reduce(np.zeros(4, np.int16), dtype="float32"), "dtype=float32 has 4 bytes"),
    (lambda c: c.all_reduce(np.zeros(4, np.complex64)), "not an NCCL datatype"),
    (lambda c: c.all_reduce(bytearray(6), dtype="float32"), "6 bytes, not a whole number of float32"),
    (lambda c: c.all_reduce(f32(4), dtype="float128"), "is not an NCCL datatype"),
    (lambda c: c.all_reduce(f32(4), op="mean"), "expected 'sum'"),
    (lambda c: c.all_reduce(bytes(8), dtype="uint8"), "read-only"),
    (lambda c: c.all_reduce(f32(4), bytes(16)), "output is read-only"),
    (lambda c: c.all_reduce([1.0, 2.0]), "neither the buffer protocol nor DLPack"),
    (lambda c: c.all_reduce(f32(8), f32(8)[2:]), "input has 8 elements but output has 6"),
    (lambda c: c.broadcast(f32(4), np.zeros(5, np.float32)), "input has 4 elements but output has 5"),
    (lambda c: c.broadcast(f32(4), root=1), "root 1 is not a rank of 1 ranks"),
    (lambda c: c.broadcast(None, None), "no buffer given"),
    (lambda c: c.reduce(f32(4), np.zeros(3, np.float32)), "input has 4 elements but output has 3"),
    (lambda c: c.all_gather(f32(4), np.zeros(5, np.float32)), "output has 5 elements, not input's 4 x 1 ranks"),
    (lambda c: c.reduce_scatter(f32(4), np.zeros(3, np.float32)), "input has 4 elements, not output's 3 x 1 ranks"),
    (lambda c: c.all_to_all(f32(4), np.zeros(2, np.float32)), "input has 4 elements but output has 2"),
    (lambda c: c.gather(f32(4), None), "needs output"),
    (lambda c: c.scatter(None, f32(4)), "needs input"),
    (lambda c: c.send(f32(4), 1), "peer 1 is not a rank of 1 ranks"),
    (lambda c: c.recv(bytes(4), 0), "read-only"),
    (lambda c: c.run_group([("put", f32(4), 0)]), "neither \"send\" nor \"recv\""),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_bad_input(comm, case):
    call, fragment = CASES[case]
    with pytest.raises(Bad) as e:
        call(comm)
    assert fragment in str(e.value), str(e.value)
    assert isinstance(e.value, ValueError)
    # The communicator is still usable.
    x = f32(4)
    comm.all_reduce(x)
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_overlap_refused(comm):
    buf = np.zeros(8, np.float32)
    with pytest.raises(Bad, match="overlap"):
        comm.all_reduce(buf[:4], buf[2:6])


def test_same_buffer_twice_is_in_place(comm):
    x = f32(4)
    assert comm.all_reduce(x, x) is x
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_torch_noncontiguous_and_device(comm):
    torch = pytest.importorskip("torch")
    with pytest.raises(Bad, match="not contiguous"):
        comm.all_reduce(torch.zeros(4, 4).t())
    t = torch.ones(4, requires_grad=True)
    with pytest.raises(Exception, match="grad"):
        comm.all_reduce(t)
    comm.all_reduce(torch.zeros(3, 3)[1])  # a contiguous row is fine


def test_closed_communicator():
    c = nccl_rs.Communicator(nccl_rs.UniqueId(), 1, 0)
    with c:
        c.barrier()
    with pytest.raises(nccl_rs.NcclInvalidUsageError, match="closed"):
        c.barrier()
    c.close()  # twice is fine


def test_bad_rank_and_id():
    with pytest.raises(Bad, match="rank 2 of 2 ranks"):
        nccl_rs.Communicator(nccl_rs.UniqueId(), 2, 2)
    with pytest.raises(Bad, match="UniqueId.from_bytes"):
        nccl_rs.UniqueId.from_bytes(b"short")
    with pytest.raises(Bad, match="expected a UniqueId"):
        nccl_rs.Communicator("nope", 1, 0)


def test_unique_id_round_trip():
    import pickle

    u = nccl_rs.UniqueId()
    b = bytes(u)
    assert len(b) == 128
    assert nccl_rs.UniqueId.from_bytes(b) == u
    assert pickle.loads(pickle.dumps(u)) == u
    assert u.to_bytes() == b


def test_wait_timeout_argument(comm):
    w = comm.all_reduce(f32(4), async_op=True)
    with pytest.raises(Bad, match="timeout"):
        w.wait(timeout=-1)
    w.wait(timeout=30)
    assert w.is_completed()
    assert w.wait(timeout=30) is not None  # a second wait returns again


def test_errors_hierarchy():
    assert issubclass(nccl_rs.NcclTimeoutError, TimeoutError)
    for name in ("NcclTimeoutError", "NcclRemoteError", "NcclInvalidArgumentError",
                 "NcclInvalidUsageError", "NcclInternalError", "NcclBootstrapError",
                 "NcclAbortedError"):
        assert issubclass(getattr(nccl_rs, name), nccl_rs.NcclError)


def test_native_library_exports_c_abi():
    import ctypes

    path = nccl_rs.native_library_path()
    assert os.path.isabs(path) and os.path.exists(path)
    lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
    for sym in ("ncclGetVersion", "ncclCommInitRank", "ncclAllReduce", "ncclSend", "ncclGroupEnd"):
        assert hasattr(lib, sym), sym
    v = ctypes.c_int(0)
    assert lib.ncclGetVersion(ctypes.byref(v)) == 0 and v.value > 0


# The dtype mapping, as a table: (format, itemsize, dtype=, result or error).
DTYPE_TABLE = [
    ("f", 4, None, "float32"),
    ("<f", 4, None, "float32"),
    ("=d", 8, None, "float64"),
    ("e", 2, None, "float16"),
    ("b", 1, None, "int8"),
    ("B", 1, None, "uint8"),
    (None, 1, None, "uint8"),
    ("i", 4, None, "int32"),
    ("I", 4, None, "uint32"),
    ("l", 8, None, "int64"),
    ("q", 8, None, "int64"),
    ("Q", 8, None, "uint64"),
    ("L", 8, None, "uint64"),
    ("B", 1, "bfloat16", "bfloat16"),
    ("B", 1, "float32", "float32"),
    ("H", 2, "bfloat16", "bfloat16"),
    ("H", 2, "float16", "float16"),
    ("f", 4, "float32", "float32"),
    ("f", 4, "torch.float32", "float32"),
    ("e", 2, "half", "float16"),
    ("H", 2, None, "ERR not an NCCL datatype"),
    ("h", 2, None, "ERR not an NCCL datatype"),
    ("?", 1, None, "ERR not an NCCL datatype"),
    ("e", 2, "bfloat16", "ERR holds float16 but dtype=bfloat16"),
    ("i", 4, "float32", "ERR holds int32 but dtype=float32"),
    ("H", 2, "float32", "ERR dtype=float32 has 4 bytes"),
    (">f", 4, None, "ERR big-endian"),
    ("f", 4, "complex", "ERR is not an NCCL datatype"),
]


@pytest.mark.parametrize("fmt,size,dtype,want", DTYPE_TABLE)
def test_dtype_table(fmt, size, dtype, want):
    if want.startswith("ERR "):
        with pytest.raises(Bad, match=want[4:]):
            nccl_rs._native._resolve_dtype(fmt, size, dtype)
    else:
        assert nccl_rs._native._resolve_dtype(fmt, size, dtype) == want


def test_dtype_objects():
    assert nccl_rs._native._resolve_dtype("B", 1, np.float32) == "float32"
    assert nccl_rs._native._resolve_dtype("B", 1, np.dtype("int64")) == "int64"


def test_abort_then_calls_raise():
    c = nccl_rs.Communicator(nccl_rs.UniqueId(), 1, 0)
    c.abort()
    with pytest.raises(nccl_rs.NcclError):
        c.all_reduce(f32(4))
    c.close()


def test_explicit_in_place_layouts(comm):
    # The same memory as NCCL's in-place layout, passed as two views.
    buf = f32(4)
    assert comm.reduce_scatter(buf, buf[0:4]) is not None
    assert buf.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert comm.all_gather(buf[0:4], buf) is buf
    with pytest.raises(Bad, match="overlap"):
        comm.all_to_all(buf[:3], buf[1:])


def elf_soname(path):
    """DT_SONAME of a 64-bit little-endian ELF shared object, or None."""
    import struct

    data = open(path, "rb").read()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    SHT_DYNAMIC, DT_SONAME = 6, 14
    for sh in sections:
        if sh[1] != SHT_DYNAMIC:
            continue
        strtab = sections[sh[6]]  # sh_link: the string table
        for off in range(sh[4], sh[4] + sh[5], 16):
            tag, val = struct.unpack_from("<qQ", data, off)
            if tag == 0:
                break
            if tag == DT_SONAME:
                start = strtab[4] + val
                return data[start:data.index(b"\0", start)].decode()
    return None


def test_extension_is_not_libnccl_so_2():
    # Else the loader would use it for any later `libnccl.so.2` dependency
    # (torch's CUDA library needs NVIDIA's), and fail on missing symbols.
    assert elf_soname(nccl_rs.native_library_path()) != "libnccl.so.2"


def test_torch_imports_after_nccl_rs():
    pytest.importorskip("torch")
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", "import nccl_rs, torch; torch.zeros(1)"], check=True, timeout=300)
