"""Scenarios run by every rank of a spawned job (see conftest.py).

Each scenario makes the same calls on the nccl_rs default group and on a Gloo
group of the same ranks, and asserts the results are equal, bit for bit
(integer-valued data keep floating-point sums exact in any order). Where Gloo
lacks a call (AVG, bool reductions) the expectation is Gloo's nearest call
plus plain torch arithmetic.
"""

from __future__ import annotations

import os
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

R = dist.ReduceOp

REDUCE_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                 torch.int32, torch.int64, torch.int8, torch.uint8]


def data(rank: int, n: int, dtype=torch.float32, salt: int = 0) -> torch.Tensor:
    """Small integers that differ by rank (exact in every dtype, no overflow)."""
    g = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randint(1, 4, (n,), generator=g).to(dtype)


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns (floats compare bit for bit, not by value)."""
    t = t.contiguous()
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.is_floating_point():
        return t.view(_BITS[t.element_size()])
    return t


def same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}"
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    assert torch.equal(bits(a), bits(b)), (
        f"{what}: {a.flatten()[:8].tolist()} != {b.flatten()[:8].tolist()}"
    )


class Ctx:
    def __init__(self, rank: int, n: int, gloo):
        self.rank, self.n, self.gloo = rank, n, gloo


# -- scenarios ----------------------------------------------------------------


def s_all_reduce_ops_dtypes(c: Ctx):
    for dtype in REDUCE_DTYPES:
        for salt, op in enumerate((R.SUM, R.PRODUCT, R.MIN, R.MAX)):
            x = data(c.rank, 37, dtype, salt=salt)
            a, b = x.clone(), x.clone()
            dist.all_reduce(a, op=op)
            dist.all_reduce(b, op=op, group=c.gloo)
            same(a, b, f"all_reduce {op} {dtype}")


def s_all_reduce_avg(c: Ctx):
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64):
        # the sum over ranks is a multiple of n, so sum / n is exact
        x = ((torch.arange(16) + c.rank) * c.n).to(dtype)
        a, b = x.clone(), x.clone()
        dist.all_reduce(a, op=R.AVG)
        dist.all_reduce(b, op=R.SUM, group=c.gloo)
        expect = b // c.n if not dtype.is_floating_point else b / c.n
        same(a, expect.to(dtype), f"all_reduce AVG {dtype}")


def s_all_reduce_premul_sum(c: Ctx):
    x = data(c.rank, 20, torch.float32)
    a = x.clone()
    dist.all_reduce(a, op=dist._make_nccl_premul_sum(2.0))
    b = x * 2.0
    dist.all_reduce(b, group=c.gloo)
    same(a, b, "all_reduce PREMUL_SUM(2.0)")


def s_all_reduce_bool_complex(c: Ctx):
    x = torch.tensor([c.rank == 0, False, True, c.rank == 1])
    a = x.clone()
    dist.all_reduce(a, op=R.SUM)
    b = x.to(torch.uint8)
    dist.all_reduce(b, op=R.MAX, group=c.gloo)
    same(a, b.bool(), "all_reduce bool SUM (logical or)")
    z = torch.complex(data(c.rank, 8), data(c.rank, 8, salt=1))
    a = z.clone()
    dist.all_reduce(a)
    b = torch.view_as_real(z).clone()
    dist.all_reduce(b, group=c.gloo)
    same(a, torch.view_as_complex(b), "all_reduce complex64 SUM")


def s_all_reduce_unsupported_ops(c: Ctx):
    for op in (R.BAND, R.BOR, R.BXOR):
        try:
            dist.all_reduce(torch.ones(4, dtype=torch.int32), op=op)
        except (ValueError, RuntimeError) as e:
            assert "no NCCL equivalent" in str(e), str(e)
        else:
            raise AssertionError(f"{op} was accepted")
    # torch.distributed refuses MAX on complex itself; ask the backend directly
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    opts = dist.AllreduceOptions()
    opts.reduceOp = R.MAX
    try:
        backend.allreduce([torch.ones(4, dtype=torch.complex64)], opts)
    except (ValueError, RuntimeError) as e:
        assert "complex tensors only reduce with SUM or AVG" in str(e), str(e)
    else:
        raise AssertionError("MAX on complex was accepted")


def s_all_reduce_noncontiguous_and_shapes(c: Ctx):
    x = data(c.rank, 24).view(4, 6)
    a = x.clone().t()  # not contiguous
    b = x.clone().t().contiguous()
    dist.all_reduce(a)
    dist.all_reduce(b, group=c.gloo)
    assert not a.is_contiguous()
    same(a.contiguous(), b, "all_reduce non-contiguous")
    for shape in ((), (0,), (3, 0, 2), (1,), (1000003,)):
        x = torch.randint(0, 3, shape, generator=torch.Generator().manual_seed(c.rank)).float()
        a, b = x.clone(), x.clone()
        dist.all_reduce(a)
        dist.all_reduce(b, group=c.gloo)
        same(a, b, f"all_reduce shape {shape}")


def s_broadcast_reduce(c: Ctx):
    for root in range(c.n):
        for dtype in (torch.float32, torch.int64, torch.bool, torch.complex128):
            x = data(c.rank, 33, torch.float64).to(dtype) if dtype != torch.bool else data(c.rank, 33) > 1
            a, b = x.clone(), x.clone()
            dist.broadcast(a, src=root)
            dist.broadcast(b, src=root, group=c.gloo)
            same(a, b, f"broadcast root {root} {dtype}")
        for op in (R.SUM, R.MAX, R.MIN, R.PRODUCT):
            x = data(c.rank, 19, torch.float32)
            a, b = x.clone(), x.clone()
            dist.reduce(a, dst=root, op=op)
            dist.reduce(b, dst=root, op=op, group=c.gloo)
            if c.rank == root:
                same(a, b, f"reduce root {root} {op}")


def s_all_gather(c: Ctx):
    for dtype in (torch.float32, torch.int8, torch.bool, torch.complex64):
        x = (data(c.rank, 10, torch.float32) + c.rank).to(dtype)
        a = torch.empty(c.n * 10, dtype=dtype)
        b = torch.empty(c.n * 10, dtype=dtype)
        dist.all_gather_into_tensor(a, x)
        dist.all_gather_into_tensor(b, x, group=c.gloo)
        same(a, b, f"all_gather_into_tensor {dtype}")
        la = [torch.empty(2, 5, dtype=dtype) for _ in range(c.n)]
        lb = [torch.empty(2, 5, dtype=dtype) for _ in range(c.n)]
        dist.all_gather(la, x.view(2, 5))
        dist.all_gather(lb, x.view(2, 5), group=c.gloo)
        for i in range(c.n):
            same(la[i], lb[i], f"all_gather list {dtype} [{i}]")
    # 2-D output, as FSDP uses it
    a = torch.empty(c.n, 3)
    dist.all_gather_into_tensor(a, torch.full((3,), float(c.rank)))
    same(a, torch.arange(c.n).float().repeat_interleave(3).view(c.n, 3), "all_gather_into_tensor 2-D")


def s_all_gather_bad_shapes(c: Ctx):
    try:
        dist.all_gather_into_tensor(torch.empty(c.n * 10 + 1), torch.ones(10))
    except (ValueError, RuntimeError) as e:
        assert "output has" in str(e) or "size" in str(e), str(e)
    else:
        raise AssertionError("a wrong output size was accepted")
    try:
        dist.all_gather_into_tensor(torch.empty(c.n * 10, dtype=torch.float64), torch.ones(10))
    except (ValueError, RuntimeError) as e:
        assert "dtype" in str(e), str(e)
    else:
        raise AssertionError("a dtype mismatch was accepted")


def _gloo_reduce_scatter_tensor(out, inp, op, c):
    """Gloo's reduce_scatter_tensor; its all_reduce then a slice where it has none."""
    try:
        dist.reduce_scatter_tensor(out, inp, op=op, group=c.gloo)
    except (RuntimeError, ValueError):
        full = inp.clone()
        dist.all_reduce(full, op=op, group=c.gloo)
        out.copy_(full.view(c.n, -1)[c.rank].view_as(out))


def s_reduce_scatter(c: Ctx):
    for dtype in (torch.float32, torch.int32, torch.bfloat16):
        for op in (R.SUM, R.MAX, R.MIN, R.PRODUCT):
            x = data(c.rank, c.n * 7, dtype)
            a = torch.empty(7, dtype=dtype)
            b = torch.empty(7, dtype=dtype)
            dist.reduce_scatter_tensor(a, x, op=op)
            _gloo_reduce_scatter_tensor(b, x, op, c)
            same(a, b, f"reduce_scatter_tensor {op} {dtype}")
        parts = [data(c.rank, 7, dtype, salt=i) for i in range(c.n)]
        a = torch.empty(7, dtype=dtype)
        dist.reduce_scatter(a, parts)
        b = torch.empty(7, dtype=dtype)
        _gloo_reduce_scatter_tensor(b, torch.cat(parts), R.SUM, c)
        same(a, b, f"reduce_scatter list {dtype}")


def s_all_to_all(c: Ctx):
    n = c.n
    x = torch.arange(n * 6, dtype=torch.float32) + 100 * c.rank
    a, b = torch.empty(n * 6), torch.empty(n * 6)
    dist.all_to_all_single(a, x)
    dist.all_to_all_single(b, x, group=c.gloo)
    same(a, b, "all_to_all_single even")
    # uneven: rank r sends (r + p + 1) rows of 3 to peer p
    ins = [c.rank + p + 1 for p in range(n)]
    outs = [p + c.rank + 1 for p in range(n)]
    x = (torch.arange(sum(ins) * 3, dtype=torch.int64) + 1000 * c.rank).view(-1, 3)
    a = torch.empty(sum(outs), 3, dtype=torch.int64)
    b = torch.empty(sum(outs), 3, dtype=torch.int64)
    dist.all_to_all_single(a, x, outs, ins)
    dist.all_to_all_single(b, x, outs, ins, group=c.gloo)
    same(a, b, "all_to_all_single splits")
    # zero-sized splits
    ins = [0 if p == c.rank else 2 for p in range(n)]
    x = torch.arange(sum(ins), dtype=torch.float64) + c.rank
    a, b = torch.empty(sum(ins), dtype=torch.float64), torch.empty(sum(ins), dtype=torch.float64)
    dist.all_to_all_single(a, x, ins, ins)
    dist.all_to_all_single(b, x, ins, ins, group=c.gloo)
    same(a, b, "all_to_all_single zero splits")
    xs = [torch.full((3,), float(10 * c.rank + p)) for p in range(n)]
    la = [torch.empty(3) for _ in range(n)]
    lb = [torch.empty(3) for _ in range(n)]
    dist.all_to_all(la, xs)
    dist.all_to_all(lb, xs, group=c.gloo)
    for i in range(n):
        same(la[i], lb[i], f"all_to_all list [{i}]")
    # uneven list form (Gloo's needs equal sizes): from rank q, q + 1 elements
    la = [torch.empty(q + 1) for q in range(n)]
    dist.all_to_all(la, [torch.full((c.rank + 1,), float(10 * c.rank + p)) for p in range(n)])
    for q in range(n):
        same(la[q], torch.full((q + 1,), float(10 * q + c.rank)), f"all_to_all uneven [{q}]")


def s_gather_scatter(c: Ctx):
    for root in range(c.n):
        x = data(c.rank, 9) + c.rank
        la = [torch.empty(9) for _ in range(c.n)] if c.rank == root else None
        lb = [torch.empty(9) for _ in range(c.n)] if c.rank == root else None
        dist.gather(x, la, dst=root)
        dist.gather(x, lb, dst=root, group=c.gloo)
        if c.rank == root:
            for i in range(c.n):
                same(la[i], lb[i], f"gather root {root} [{i}]")
        src = [data(p, 5, torch.int64, salt=root) for p in range(c.n)] if c.rank == root else None
        a, b = torch.empty(5, dtype=torch.int64), torch.empty(5, dtype=torch.int64)
        dist.scatter(a, src, src=root)
        dist.scatter(b, src, src=root, group=c.gloo)
        same(a, b, f"scatter root {root}")


def s_send_recv(c: Ctx):
    n, r = c.n, c.rank
    nxt, prv = (r + 1) % n, (r - 1) % n
    for count in (1, 1 << 20):  # small and rendezvous-sized
        x = torch.full((count,), float(r))
        got = torch.empty(count)
        # blocking, ordered so a ring cannot wait on itself
        if r % 2 == 0:
            dist.send(x, nxt)
            dist.recv(got, prv)
        else:
            dist.recv(got, prv)
            dist.send(x, nxt)
        same(got, torch.full((count,), float(prv)), f"send/recv ring {count}")
        # non-blocking, each rank receives first
        got = torch.empty(count)
        rq = dist.irecv(got, prv)
        sq = dist.isend(x, nxt)
        rq.wait()
        sq.wait()
        assert rq.is_completed() and sq.is_completed()
        same(got, torch.full((count,), float(prv)), f"irecv/isend {count}")


def s_batch_isend_irecv(c: Ctx):
    n, r = c.n, c.rank
    ops, gots = [], []
    for p in range(n):
        if p == r:
            continue
        x = torch.full((300_000,), float(100 * r + p))
        got = torch.empty(300_000)
        gots.append((p, got))
        ops.append(dist.P2POp(dist.isend, x, p))
        ops.append(dist.P2POp(dist.irecv, got, p))
    works = dist.batch_isend_irecv(ops)
    for w in works:
        w.wait()
    assert all(w.is_completed() for w in works)
    for p, got in gots:
        same(got, torch.full((300_000,), float(100 * p + r)), f"batch_isend_irecv from {p}")


def s_barrier_async(c: Ctx):
    dist.barrier()
    xs = [data(c.rank, 1000, salt=i) for i in range(8)]
    a = [x.clone() for x in xs]
    works = [dist.all_reduce(t, async_op=True) for t in a]
    for w in works:
        w.wait()
    assert all(w.is_completed() for w in works)
    for i, x in enumerate(xs):
        b = x.clone()
        dist.all_reduce(b, group=c.gloo)
        same(a[i], b, f"async all_reduce [{i}]")
    w = dist.all_gather_into_tensor(torch.empty(c.n * 4), torch.ones(4), async_op=True)
    fut = w.get_future()
    fut.wait()
    assert w.is_completed()
    w = dist.barrier(async_op=True)
    w.wait()
    assert w.is_completed()


def s_new_group(c: Ctx):
    n, r = c.n, c.rank
    halves = [list(range(0, n // 2)), list(range(n // 2, n))]
    groups = [dist.new_group(h) for h in halves]
    glo = [dist.new_group(h, backend="gloo") for h in halves]
    mine = 0 if r < n // 2 else 1
    x = data(r, 50)
    a, b = x.clone(), x.clone()
    dist.all_reduce(a, group=groups[mine])
    dist.all_reduce(b, group=glo[mine])
    same(a, b, "all_reduce in a subgroup")
    # a group of every other rank, and p2p inside a subgroup (group ranks)
    odd = [p for p in range(n) if p % 2 == 1]
    g_odd = dist.new_group(odd)
    if r in odd:
        t = torch.full((3,), float(r))
        dist.all_reduce(t, group=g_odd, op=R.MAX)
        same(t, torch.full((3,), float(max(odd))), "all_reduce in the odd group")
    sub = groups[mine]
    if len(halves[mine]) >= 2:
        me = dist.get_group_rank(sub, r)
        peer = dist.get_global_rank(sub, 1 - me) if me < 2 else None
        if me < 2:
            got = torch.empty(4)
            ops = [dist.P2POp(dist.isend, torch.full((4,), float(r)), peer, group=sub),
                   dist.P2POp(dist.irecv, got, peer, group=sub)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            same(got, torch.full((4,), float(peer)), "p2p in a subgroup")
    dist.barrier()
    for g in groups + [g_odd]:
        dist.destroy_process_group(g)


def s_ddp_matches_gloo(c: Ctx):
    def train(group):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
            torch.nn.Linear(4 * 8 * 8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, process_group=group, bucket_cap_mb=0.005)  # several buckets
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(100 + c.rank)
        losses = []
        for _ in range(6):
            x = torch.randn(16, 1, 8, 8, generator=g)
            y = torch.randint(0, 10, (16,), generator=g)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, torch.cat([p.detach().flatten() for p in model.parameters()])

    ours, p_ours = train(None)
    theirs, p_theirs = train(c.gloo)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), f"step {i}: loss {a} (nccl_rs) vs {b} (gloo)"
    # parameters identical across ranks
    allp = torch.empty(c.n * p_ours.numel())
    dist.all_gather_into_tensor(allp, p_ours)
    for k in range(c.n):
        same(allp.view(c.n, -1)[k], p_ours, f"DDP parameters rank {k} vs rank {c.rank}")
    assert torch.allclose(p_ours, p_theirs, rtol=1e-5, atol=1e-6), "DDP parameters differ from gloo's"


def s_fsdp_matches_gloo(c: Ctx):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    def train(group):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        model = FSDP(m, process_group=group, device_id=torch.device("cpu"))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(c.rank)
        losses = []
        for _ in range(4):
            loss = model(torch.randn(4, 8, generator=g)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    ours = train(dist.group.WORLD)
    theirs = train(c.gloo)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), f"FSDP step {i}: loss {a} (nccl_rs) vs {b} (gloo)"


def s_mismatch_raises_library_message(c: Ctx):
    """Different counts on different ranks: every rank raises, with our message."""
    g = dist.new_group(timeout=timedelta(seconds=30))
    for attempt in ("first", "later"):
        try:
            dist.all_reduce(torch.ones(10 + c.rank), group=g)
        except RuntimeError as e:
            msg = str(e)
            assert "mismatched collectives" in msg, f"{attempt}: {msg}"
            if attempt == "later":
                assert "failed earlier" in msg, msg
        else:
            raise AssertionError(f"{attempt} mismatched all_reduce returned normally")
    dist.destroy_process_group(g)


def s_timeout_aborts(c: Ctx):
    """Rank 0 calls alone: its wait ends after the group's timeout and raises."""
    g = dist.new_group(timeout=timedelta(seconds=3))
    if c.rank == 0:
        import time
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(10), group=g)
        except RuntimeError as e:
            assert "did not finish within 3 s" in str(e), str(e)
        else:
            raise AssertionError("a collective no peer joined returned normally")
        took = time.monotonic() - t0
        assert 2.5 <= took <= 30, f"the wait took {took:.1f} s"
    dist.barrier()
    dist.destroy_process_group(g)


SCENARIOS = {name[2:]: fn for name, fn in globals().items() if name.startswith("s_")}


def worker(rank: int, n: int, port: int, out_dir: str) -> None:
    """One rank: runs every scenario and writes `name ok` / `name FAIL ...` lines."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(n))
    import nccl_rs.torch  # noqa: F401  registers the backend

    lines = []
    try:
        dist.init_process_group("nccl_rs", timeout=timedelta(seconds=60))
        gloo = dist.new_group(backend="gloo", timeout=timedelta(seconds=60))
        c = Ctx(rank, n, gloo)
        for name, fn in SCENARIOS.items():
            try:
                fn(c)
                lines.append(f"{name} ok")
            except Exception:
                lines.append(f"{name} FAIL " + traceback.format_exc().replace("\n", "\\n"))
            with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
                f.write("\n".join(lines) + "\n")
        dist.destroy_process_group()
    except Exception:
        lines.append("setup FAIL " + traceback.format_exc().replace("\n", "\\n"))
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write("\n".join(lines) + "\nend\n")
