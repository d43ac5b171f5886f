"""One rank of a multi-process test (run by `_launch.launch`). Each scenario
checks its results against numpy-computed expectations, bit for bit, and
exits non-zero (with a traceback) on the first difference.

Inputs are small integers, so that every sum, product and average is exact
in every datatype, and rank r can compute every rank's input."""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import nccl_rs

DTYPES = [
    "int8", "uint8", "int32", "uint32", "int64", "uint64",
    "float16", "bfloat16", "float32", "float64",
]
OPS = ["sum", "prod", "min", "max", "avg"]
# Element counts per rank's part: empty, one, odd, and one past the
# library's chunking.
COUNTS = [0, 1, 7, 40_000]
MODES = ["out", "inplace", "async_out", "async_inplace"]


def values(rank: int, count: int, dt: str, op: str, salt: int) -> np.ndarray:
    """Rank `rank`'s input as float64 integers that keep `op` exact."""
    rng = np.random.default_rng(1_000_003 * salt + 7919 * rank + count)
    signed = not dt.startswith("uint")
    if op == "prod":
        pool = [-1, 1, 2, 3] if signed else [1, 2, 3]
        return rng.choice(pool, size=count).astype(np.float64)
    lo = -12 if signed else 0
    return rng.integers(lo, 26, size=count).astype(np.float64)


def to_buf(v: np.ndarray, dt: str) -> np.ndarray:
    """`v` in datatype `dt` (bfloat16 as its bits in uint16)."""
    if dt == "bfloat16":
        return (v.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return v.astype(dt)


def reduce_all(stack: np.ndarray, op: str, n: int, dt: str) -> np.ndarray:
    if op == "sum":
        return stack.sum(axis=0)
    if op == "prod":
        return stack.prod(axis=0)
    if op == "min":
        return stack.min(axis=0)
    if op == "max":
        return stack.max(axis=0)
    s = stack.sum(axis=0)
    if dt.startswith("float") or dt == "bfloat16":
        return s / n
    return np.trunc(s / n)  # integers: truncating division


def kw(dt: str) -> dict:
    return {"dtype": "bfloat16"} if dt == "bfloat16" else {}


def check(got: np.ndarray, want: np.ndarray, what: str) -> None:
    if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
        bad = np.flatnonzero(got.view(np.uint8) != want.view(np.uint8)) if got.shape == want.shape else []
        raise AssertionError(
            f"{what}: got {got[:8]}... want {want[:8]}... "
            f"(dtype {got.dtype}/{want.dtype}, shape {got.shape}/{want.shape}, first bad byte {bad[:1]})"
        )


def run(comm, mode: str, call):
    """Runs `call(async_op)`; waits with a deadline when async."""
    if mode.startswith("async"):
        work = call(True)
        out = work.wait(timeout=60)
        assert work.is_completed()
        return out
    return call(False)


def sc_all_reduce(comm):
    n, r = comm.size, comm.rank
    for dt in DTYPES:
        for op in OPS:
            for count in COUNTS:
                if count == 40_000 and dt not in ("float32", "bfloat16", "int64"):
                    continue
                for mode in MODES:
                    what = f"all_reduce {dt} {op} {count} {mode}"
                    ins = [values(p, count, dt, op, 1) for p in range(n)]
                    want = to_buf(reduce_all(np.stack(ins), op, n, dt), dt)
                    x = to_buf(ins[r], dt)
                    if "inplace" in mode:
                        out = run(comm, mode, lambda a: comm.all_reduce(x, op=op, async_op=a, **kw(dt)))
                        assert out is x
                        check(x, want, what)
                    else:
                        y = np.full_like(x, 5)
                        out = run(comm, mode, lambda a: comm.all_reduce(x, y, op=op, async_op=a, **kw(dt)))
                        assert out is y
                        check(y, want, what)
                        check(x, to_buf(ins[r], dt), what + " (input unchanged)")


def sc_broadcast(comm):
    n, r = comm.size, comm.rank
    for dt in DTYPES:
        for root in sorted({0, n - 1}):
            for count in COUNTS[:3] + ([40_000] if dt == "float32" else []):
                for mode in MODES:
                    what = f"broadcast {dt} root {root} {count} {mode}"
                    want = to_buf(values(root, count, dt, "sum", 2), dt)
                    mine = to_buf(values(r, count, dt, "sum", 2), dt)
                    if "inplace" in mode:
                        run(comm, mode, lambda a: comm.broadcast(mine, root=root, async_op=a, **kw(dt)))
                        check(mine, want, what)
                    else:
                        y = np.full_like(mine, 3)
                        src = mine if r == root else None
                        run(comm, mode, lambda a: comm.broadcast(src, y, root=root, async_op=a, **kw(dt)))
                        check(y, want, what)


def sc_reduce(comm):
    n, r = comm.size, comm.rank
    for dt in DTYPES:
        for op in OPS:
            root = (op == "max") * (n - 1)
            for count in (1, 7):
                for mode in MODES:
                    what = f"reduce {dt} {op} root {root} {count} {mode}"
                    ins = [values(p, count, dt, op, 3) for p in range(n)]
                    want = to_buf(reduce_all(np.stack(ins), op, n, dt), dt)
                    x = to_buf(ins[r], dt)
                    if "inplace" in mode:
                        run(comm, mode, lambda a: comm.reduce(x, root=root, op=op, async_op=a, **kw(dt)))
                        check(x, want if r == root else to_buf(ins[r], dt), what)
                    else:
                        y = np.full_like(x, 4)
                        run(comm, mode, lambda a: comm.reduce(x, y, root=root, op=op, async_op=a, **kw(dt)))
                        # Not written on the other ranks.
                        check(y, want if r == root else np.full_like(x, 4), what)


def sc_all_gather(comm):
    n, r = comm.size, comm.rank
    for dt in DTYPES:
        for count in COUNTS[:3] + ([40_000] if dt == "float16" else []):
            for mode in MODES:
                what = f"all_gather {dt} {count} {mode}"
                ins = [to_buf(values(p, count, dt, "sum", 4), dt) for p in range(n)]
                want = np.concatenate(ins)
                y = np.full_like(want, 9)
                if "inplace" in mode:
                    y[r * count:(r + 1) * count] = ins[r]
                    run(comm, mode, lambda a: comm.all_gather(None, y, async_op=a, **kw(dt)))
                else:
                    run(comm, mode, lambda a: comm.all_gather(ins[r], y, async_op=a, **kw(dt)))
                check(y, want, what)


def sc_reduce_scatter(comm):
    n, r = comm.size, comm.rank
    for dt in DTYPES:
        for op in OPS:
            for count in (0, 1, 7):
                for mode in MODES:
                    what = f"reduce_scatter {dt} {op} {count} {mode}"
                    ins = [values(p, n * count, dt, op, 5) for p in range(n)]
                    full = to_buf(reduce_all(np.stack(ins), op, n, dt), dt)
                    want = full[r * count:(r + 1) * count]
                    x = to_buf(ins[r], dt)
                    if "inplace" in mode:
                        run(comm, mode, lambda a: comm.reduce_scatter(x, op=op, async_op=a, **kw(dt)))
                        check(x[r * count:(r + 1) * count], want, what)
                    else:
                        y = np.full_like(want, 2)
                        run(comm, mode, lambda a: comm.reduce_scatter(x, y, op=op, async_op=a, **kw(dt)))
                        check(y, want, what)


def sc_all_to_all(comm):
    n, r = comm.size, comm.rank
    for dt in DTYPES:
        for count in (0, 1, 7) + ((10_000,) if dt == "uint8" else ()):
            for mode in MODES:
                what = f"all_to_all {dt} {count} {mode}"
                ins = [to_buf(values(p, n * count, dt, "sum", 6), dt) for p in range(n)]
                want = np.concatenate([ins[p][r * count:(r + 1) * count] for p in range(n)])
                x = ins[r].copy()
                if "inplace" in mode:
                    run(comm, mode, lambda a: comm.all_to_all(x, async_op=a, **kw(dt)))
                    check(x, want, what)
                else:
                    y = np.full_like(x, 1)
                    run(comm, mode, lambda a: comm.all_to_all(x, y, async_op=a, **kw(dt)))
                    check(y, want, what)


def sc_gather_scatter(comm):
    n, r = comm.size, comm.rank
    for dt in DTYPES:
        for root in sorted({0, n - 1}):
            for count in (0, 1, 7):
                for mode in MODES:
                    what = f"gather {dt} root {root} {count} {mode}"
                    ins = [to_buf(values(p, count, dt, "sum", 7), dt) for p in range(n)]
                    want = np.concatenate(ins)
                    if r == root:
                        y = np.full_like(want, 8)
                        if "inplace" in mode:
                            y[r * count:(r + 1) * count] = ins[r]
                            run(comm, mode, lambda a: comm.gather(None, y, root=root, async_op=a, **kw(dt)))
                        else:
                            run(comm, mode, lambda a: comm.gather(ins[r], y, root=root, async_op=a, **kw(dt)))
                        check(y, want, what)
                    else:
                        run(comm, mode, lambda a: comm.gather(ins[r], root=root, async_op=a, **kw(dt)))

                    what = f"scatter {dt} root {root} {count} {mode}"
                    src = to_buf(values(root, n * count, dt, "sum", 8), dt)
                    want = src[r * count:(r + 1) * count]
                    if r == root and "inplace" in mode:
                        x = src.copy()
                        run(comm, mode, lambda a: comm.scatter(x, root=root, async_op=a, **kw(dt)))
                        check(x, src, what)  # its part already is its output
                    else:
                        y = np.full_like(want, 6)
                        mine = src if r == root else None
                        run(comm, mode, lambda a: comm.scatter(mine, y, root=root, async_op=a, **kw(dt)))
                        check(y, want, what)


def sc_p2p(comm):
    n, r = comm.size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    for dt in ("float32", "int64", "uint8"):
        for count in (0, 1, 1000):
            data = [to_buf(values(p, count, dt, "sum", 9), dt) for p in range(n)]
            # Ring with a group (any order within the group).
            y = np.zeros_like(data[r])
            with nccl_rs.P2pGroup(comm) as g:
                g.recv(y, left)
                g.send(data[r], right)
            check(y, data[left], f"group ring {dt} {count}")
            # Plain send/recv: even ranks send first.
            y = np.zeros_like(data[r])
            if r % 2 == 0:
                comm.send(data[r], right)
                comm.recv(y, left)
            else:
                comm.recv(y, left)
                comm.send(data[r], right)
            check(y, data[left], f"send/recv {dt} {count}")
            # Async group: every rank exchanges with every other.
            outs = [np.zeros_like(data[r]) for _ in range(n)]
            g = nccl_rs.P2pGroup(comm)
            for p in range(n):
                if p != r:
                    g.send(data[r], p)
                    g.recv(outs[p], p)
            work = g.run(async_op=True)
            work.wait(timeout=60)
            for p in range(n):
                if p != r:
                    check(outs[p], data[p], f"async all-pairs {dt} {count} from {p}")
            # Async send and receive as two operations, both in flight.
            y = np.zeros_like(data[r])
            if r % 2 == 0:
                ws = comm.send(data[r], right, async_op=True)
                wr = comm.recv(y, left, async_op=True)
            else:
                wr = comm.recv(y, left, async_op=True)
                ws = comm.send(data[r], right, async_op=True)
            ws.wait(timeout=60)
            wr.wait(timeout=60)
            check(y, data[left], f"async send/recv {dt} {count}")


def sc_barrier_split(comm):
    n, r = comm.size, comm.rank
    for _ in range(3):
        comm.barrier()
    comm.barrier(async_op=True).wait(timeout=60)
    # Even and odd ranks in two communicators, reverse order by key.
    sub = comm.split(r % 2, key=-r)
    assert sub is not None
    members = [p for p in range(n) if p % 2 == r % 2]
    assert sub.size == len(members), (sub.size, members)
    assert sub.rank == len(members) - 1 - members.index(r), (sub.rank, members)
    x = np.array([r], dtype=np.int64)
    sub.all_reduce(x)
    assert int(x[0]) == sum(members), (x, members)
    sub.close()
    none = comm.split(None if r == 0 else 1)
    assert (none is None) == (r == 0)
    if none is not None:
        none.close()


def sc_torch(comm):
    import torch

    n, r = comm.size, comm.rank
    for tdt, dt in [(torch.float32, "float32"), (torch.bfloat16, "bfloat16"),
                    (torch.float16, "float16"), (torch.int64, "int64"), (torch.uint8, "uint8")]:
        ins = [values(p, 33, dt, "sum", 10) for p in range(n)]
        want = to_buf(np.stack(ins).sum(axis=0), dt)
        t = torch.from_numpy(to_buf(ins[r], dt).copy())
        if tdt == torch.bfloat16:
            t = t.view(torch.bfloat16)
        assert t.dtype == tdt
        out = comm.all_reduce(t)
        assert out is t
        got = t.view(torch.uint16) if tdt == torch.bfloat16 else t
        check(got.numpy(), want, f"torch all_reduce {dt}")
        # Out of place into a fresh tensor, async.
        src = torch.from_numpy(to_buf(ins[r], dt).copy())
        if tdt == torch.bfloat16:
            src = src.view(torch.bfloat16)
        dst = torch.zeros_like(src)
        comm.all_reduce(src, dst, async_op=True).wait(timeout=60)
        got = dst.view(torch.uint16) if tdt == torch.bfloat16 else dst
        check(got.numpy(), want, f"torch async all_reduce {dt}")
        # all_gather into a 2-D tensor.
        g = torch.zeros((n, 33), dtype=tdt)
        comm.all_gather(src, g)
        got = g.view(torch.uint16) if tdt == torch.bfloat16 else g
        check(got.numpy().reshape(-1), np.concatenate([to_buf(v, dt) for v in ins]), f"torch all_gather {dt}")


def sc_bytearray(comm):
    n, r = comm.size, comm.rank
    # Plain bytes carry any dtype given with dtype=.
    vals = [np.arange(6, dtype=np.float32) * (p + 1) for p in range(n)]
    b = bytearray(vals[r].tobytes())
    comm.all_reduce(b, dtype="float32")
    check(np.frombuffer(bytes(b), dtype=np.float32), np.sum(vals, axis=0).astype(np.float32), "bytearray float32")
    m = memoryview(bytearray(vals[r].tobytes())).cast("f")
    comm.all_reduce(m, op="max")
    check(np.frombuffer(m, dtype=np.float32), vals[n - 1], "memoryview max")
    # A read-only input is fine out of place.
    ro = bytes(vals[r].tobytes())
    out = bytearray(len(ro))
    comm.all_reduce(ro, out, dtype=np.float32)
    check(np.frombuffer(bytes(out), dtype=np.float32), np.sum(vals, axis=0).astype(np.float32), "bytes input")


# --- failures ---------------------------------------------------------------

def expect(exc_type, fn, *args, contains=(), **kwargs):
    t0 = time.monotonic()
    try:
        fn(*args, **kwargs)
    except exc_type as e:
        msg = str(e)
        for c in contains:
            assert c in msg, f"{c!r} not in {msg!r}"
        print(f"OK {type(e).__name__} after {time.monotonic() - t0:.1f}s: {msg}")
        return e
    raise AssertionError(f"{fn} did not raise {exc_type.__name__}")


def sc_timeout(comm):
    # NCCL_RS_TIMEOUT is short: rank 0 waits in vain for rank 1.
    if comm.rank == 0:
        x = np.ones(4, np.float32)
        expect(nccl_rs.NcclTimeoutError, comm.all_reduce, x, contains=("rank 0", "all_reduce", "timed out"))
        # Unusable afterwards, and an async handle says so through wait().
        expect(nccl_rs.NcclInvalidUsageError, comm.all_reduce, x, contains=("failed earlier",))
        w = comm.all_reduce(x, async_op=True)
        expect(nccl_rs.NcclInvalidUsageError, w.wait, timeout=30, contains=("failed earlier",))
    else:
        time.sleep(float(os.environ["SLEEP"]))


def sc_dead_peer(comm):
    x = np.ones(1 << 16, np.float32)
    comm.all_reduce(x)
    if comm.rank == 1:
        os._exit(3)  # dies without closing anything
    time.sleep(0.5)
    expect(nccl_rs.NcclRemoteError, comm.all_reduce, x, contains=("rank 0", "rank 1"))


def sc_wait_timeout(comm):
    # Rank 1 joins late: rank 0's wait(timeout=) gives up first, then the
    # operation completes and wait() returns the output.
    x = np.full(4, comm.rank + 1, np.int32)
    if comm.rank == 1:
        time.sleep(3)
    work = comm.all_reduce(x, async_op=True)
    if comm.rank == 0:
        expect(nccl_rs.NcclTimeoutError, work.wait, timeout=0.2, contains=("did not complete",))
        assert not work.is_completed()
    out = work.wait(timeout=60)
    assert out is x and x.tolist() == [3, 3, 3, 3], x


def sc_mismatch(comm):
    # Ranks disagree on the count: every rank gets an error, never wrong data.
    x = np.ones(8 if comm.rank == 0 else 16, np.float32)
    expect(nccl_rs.NcclInvalidUsageError, comm.all_reduce, x, contains=(
        f"rank {comm.rank}", "mismatched collectives", "count=8", "count=16"))


def sc_from_env_info(comm):
    assert comm.size == int(os.environ["WORLD_SIZE"])
    assert comm.rank == int(os.environ["RANK"])


def main() -> None:
    scenario = sys.argv[1]
    fn = globals()[f"sc_{scenario}"]
    comm = nccl_rs.Communicator.from_env()
    try:
        fn(comm)
    finally:
        if scenario not in ("timeout", "dead_peer", "mismatch"):
            comm.finalize()
        comm.close()
    print(f"rank {comm.rank}: {scenario} passed")


if __name__ == "__main__":
    main()
