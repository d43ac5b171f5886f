"""``NcclRsBackend``: a ``c10d.Backend`` subclass over nccl-rs's C ABI.

Each backend owns one communicator for its group's collectives. A
communicator is driven by one worker thread that runs its calls in the order
they were issued (NCCL allows one thread at a time on a communicator, and
every rank issues the same sequence). The C calls release the GIL, so
``async_op=True`` calls and DDP's bucketed all-reduces overlap with the
Python thread that issued them. Every call returns a ``Work`` wrapping a
``torch.futures.Future`` that the worker completes with the outputs or with
the library's error.

Point-to-point traffic runs on lazily created two-rank communicators, one per
ordered pair (sender, receiver), each with its own worker. A communicator's
queue then only holds sends (at the sender) or only receives (at the
receiver) of one pair, matched first to first, so any set of sends and
receives that matches completes, in whatever order each rank issued them.
That is what ``batch_isend_irecv`` needs, without coalescing.
"""

from __future__ import annotations

import ctypes
import queue
import threading
import time
from datetime import timedelta
from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend

from . import _lib

BACKEND_NAME = "nccl_rs"

# Guards the c10d store client, which all groups of the process share.
_STORE_LOCK = threading.Lock()

# torch dtype -> ncclDataType_t, for calls that reduce.
_REDUCE_DTYPES = {
    torch.int8: _lib.INT8,
    torch.uint8: _lib.UINT8,
    torch.int32: _lib.INT32,
    torch.int64: _lib.INT64,
    torch.float16: _lib.FLOAT16,
    torch.float32: _lib.FLOAT32,
    torch.float64: _lib.FLOAT64,
    torch.bfloat16: _lib.BFLOAT16,
    torch.bool: _lib.UINT8,
}
for _name, _code in (
    ("uint32", _lib.UINT32),
    ("uint64", _lib.UINT64),
    ("float8_e4m3fn", _lib.FLOAT8E4M3),
    ("float8_e5m2", _lib.FLOAT8E5M2),
):
    if hasattr(torch, _name):
        _REDUCE_DTYPES[getattr(torch, _name)] = _code

_RED = dist.ReduceOp.RedOpType
# ReduceOp -> ncclRedOp_t. PREMUL_SUM scales a copy of the input, then sums.
_REDUCE_OPS = {
    _RED.SUM: _lib.SUM,
    _RED.PRODUCT: _lib.PROD,
    _RED.MIN: _lib.MIN,
    _RED.MAX: _lib.MAX,
    _RED.AVG: _lib.AVG,
    _RED.PREMUL_SUM: _lib.SUM,
}


def _kind(op) -> object:
    """The RedOpType of a ReduceOp (or of a RedOpType)."""
    return op if isinstance(op, _RED) else getattr(op, "op", op)


def nccl_reduce_op(op: dist.ReduceOp, dtype: torch.dtype) -> int:
    """The ncclRedOp_t for ``op`` on ``dtype``; ValueError where none maps.

    Bool tensors reduce as bytes: SUM is a logical or (MAX), PRODUCT a
    logical and (MIN), as in PyTorch's NCCL backend.
    """
    kind = _kind(op)
    if not isinstance(kind, _RED):
        raise TypeError(f"nccl_rs: expected a ReduceOp, got {type(op).__name__}")
    if kind not in _REDUCE_OPS:
        raise ValueError(
            f"nccl_rs: ReduceOp.{kind.name} has no NCCL equivalent "
            "(supported: SUM, PRODUCT, MIN, MAX, AVG, PREMUL_SUM)"
        )
    if dtype == torch.bool:
        if kind in (_RED.SUM, _RED.MAX):
            return _lib.MAX
        if kind in (_RED.PRODUCT, _RED.MIN):
            return _lib.MIN
        raise ValueError(f"nccl_rs: ReduceOp.{kind.name} is not defined on bool tensors")
    if kind == _RED.PREMUL_SUM and not (dtype.is_floating_point or dtype.is_complex):
        raise ValueError("nccl_rs: ReduceOp.PREMUL_SUM needs a floating-point tensor")
    return _REDUCE_OPS[kind]


def nccl_reduce_dtype(dtype: torch.dtype, op: int) -> int:
    """The ncclDataType_t a reduction of ``dtype`` runs on; ValueError if none."""
    if dtype.is_complex:
        if op not in (_lib.SUM, _lib.AVG):
            raise ValueError(
                f"nccl_rs: complex tensors only reduce with SUM or AVG, not op {op}"
            )
        return _REDUCE_DTYPES[torch.float32 if dtype == torch.complex64 else torch.float64]
    try:
        return _REDUCE_DTYPES[dtype]
    except KeyError:
        raise ValueError(f"nccl_rs: cannot reduce tensors of dtype {dtype}") from None


def _reduce_view(t: torch.Tensor) -> torch.Tensor:
    """The real view a complex tensor reduces through (itself otherwise)."""
    return torch.view_as_real(t) if t.is_complex() else t


def _check_tensor(t, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"nccl_rs: {what} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_sparse:
        raise ValueError(f"nccl_rs: {what} is sparse; only dense tensors are supported")
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"nccl_rs: {what} is on {t.device}; only cpu and cuda are supported")
    return t


def _contig(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _ptr(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def _single(tensors: Sequence[torch.Tensor], what: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise ValueError(
            f"nccl_rs: {what} takes exactly one tensor per rank, got {len(tensors)}"
        )
    return _check_tensor(tensors[0], what)


class _Work(dist.Work):
    """A queued call: done when its communicator's worker ran it.

    ``wait`` raises the call's error (the library's message), and gives up
    after the group's timeout: it then aborts the communicator, which stops
    the call in flight, and raises.
    """

    def __init__(self, fut: torch.futures.Future, done: threading.Event, comm, timeout: timedelta):
        super().__init__()
        self._fut = fut
        self._done = done
        self._comm = comm
        self._timeout = timeout

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        limit = timeout if timeout and timeout.total_seconds() > 0 else self._timeout
        if not self._done.wait(limit.total_seconds()):
            self._comm.abort_from_waiter()
            raise RuntimeError(
                f"nccl_rs: a call on communicator {self._comm.name} did not finish within "
                f"{limit.total_seconds():.0f} s; the communicator was aborted"
            )
        self._fut.wait()  # raises the call's error
        return True

    def is_completed(self) -> bool:
        return self._fut.done()

    def get_future(self) -> torch.futures.Future:
        return self._fut


class _Communicator:
    """One ncclComm_t and the worker thread that runs its calls in order."""

    def __init__(self, lib: _lib.Library, name: str):
        self.lib = lib
        self.name = name
        self.comm = ctypes.c_void_p()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._aborted = False
        self._abort_lock = threading.Lock()
        # The first error: later calls fail at once with it (the peers
        # cannot continue a sequence this rank broke off).
        self.failed: str | None = None
        self._thread = threading.Thread(target=self._run, name=f"nccl_rs:{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, fut, done = job
            try:
                if self.failed is not None:
                    raise RuntimeError(
                        f"nccl_rs: communicator {self.name} failed earlier: {self.failed}"
                    )
                value = fn()
            except BaseException as e:  # the caller sees it through the future
                if self.failed is None:
                    self.failed = str(e)
                done.set()
                fut.set_exception(e)
            else:
                done.set()
                fut.set_result(value)

    def submit(self, fn: Callable[[], object]) -> tuple[torch.futures.Future, threading.Event]:
        """Queues ``fn`` (run on the worker, in issue order); its future and done flag."""
        if self._closed:
            raise RuntimeError(f"nccl_rs: communicator {self.name} was shut down")
        fut = torch.futures.Future()
        done = threading.Event()
        self._jobs.put((fn, fut, done))
        return fut, done

    def abort_from_waiter(self) -> None:
        """Aborts the communicator from a thread waiting on it (after a timeout)."""
        with self._abort_lock:
            if self.comm.value and not self._aborted:
                self._aborted = True
                self.lib.CommAbort(self.comm)

    def init(self, uid_bytes: Callable[[], bytes], nranks: int, rank: int) -> torch.futures.Future:
        """Queues ncclCommInitRank with the id ``uid_bytes()`` returns."""

        def run():
            uid = _lib.UniqueId.from_bytes(uid_bytes())
            self.lib.check(
                self.lib.CommInitRank(ctypes.byref(self.comm), nranks, uid, rank),
                f"ncclCommInitRank ({self.name}, rank {rank} of {nranks})",
            )
            return []

        return self.submit(run)

    def check(self, rc: int, what: str) -> None:
        self.lib.check(rc, what, self.comm)

    def close(self, abort: bool = False) -> None:
        """Stops the worker after its queued calls, then frees the communicator.

        ncclCommDestroy meets the peers, so a rank's communicators close
        concurrently (see ``_close_all``): closing them one by one in
        different orders on different ranks would wait on each other.
        """
        if self._closed:
            return
        self._closed = True
        if abort:
            self.abort_from_waiter()  # stops a call in flight; frees the communicator
        self._jobs.put(None)
        self._thread.join()
        if self.comm.value and not self._aborted:
            self.lib.CommDestroy(self.comm)
        self.comm = ctypes.c_void_p()


def _close_all(comms: list, abort: bool, timeout: timedelta) -> None:
    """Closes ``comms`` concurrently; gives up waiting after ``timeout``."""
    threads = [
        threading.Thread(target=c.close, args=(abort,), name=f"nccl_rs:close:{c.name}", daemon=True)
        for c in comms
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout.total_seconds()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [c.name for c, t in zip(comms, threads) if t.is_alive()]
    if stuck:
        raise RuntimeError(
            f"nccl_rs: communicators {stuck} did not close within {timeout.total_seconds():.0f} s"
        )


def _new_unique_id(lib: _lib.Library) -> bytes:
    uid = _lib.UniqueId()
    lib.check(lib.GetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
    return uid.to_bytes()


class NcclRsBackend(_C10dBackend):
    """torch.distributed backend "nccl_rs" (made by ``init_process_group``)."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta, group_name: str = ""):
        super().__init__(rank, size)
        self._lib = _lib.load()
        self._store = store
        self._rank = rank
        self._size = size
        self._timeout = timeout
        self._group_name = group_name or "default"
        self._p2p: dict[tuple[int, int], _Communicator] = {}
        self._p2p_lock = threading.Lock()
        self._comm = _Communicator(self._lib, f"{self._group_name}/coll")
        key = "nccl_rs/coll/uid"
        self._wrap(self._comm.init(self._uid_exchange(key, rank == 0), size, rank), self._comm).wait()

    # -- setup ---------------------------------------------------------------

    def _uid_exchange(self, key: str, creator: bool) -> Callable[[], bytes]:
        """A job step that publishes (creator) or fetches the id under ``key``.

        The store's client is one connection shared by every group and
        thread of the process: a ``get`` blocked on a missing key stalls the
        other threads' store calls (a peer's id may be what they would
        publish). So a fetch polls ``check`` and reads only a present key,
        each access under ``_STORE_LOCK``.
        """
        store, lib = self._store, self._lib
        deadline = time.monotonic() + self._timeout.total_seconds()

        def get() -> bytes:
            if creator:
                data = _new_unique_id(lib)
                with _STORE_LOCK:
                    store.set(key, data)
                return data
            pause = 0.0005
            while True:
                with _STORE_LOCK:
                    if store.check([key]):
                        return bytes(store.get(key))
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"nccl_rs: rank {self._rank} of group {self._group_name} waited "
                        f"{self._timeout.total_seconds():.0f} s for the unique id {key!r}; "
                        "did every rank make the same calls?"
                    )
                time.sleep(pause)
                pause = min(pause * 2, 0.05)

        return get

    def _pair(self, src: int, dst: int) -> _Communicator:
        """The two-rank communicator carrying src -> dst traffic (made on first use)."""
        if src == dst:
            raise ValueError(f"nccl_rs: rank {src} cannot send to or receive from itself")
        with self._p2p_lock:
            comm = self._p2p.get((src, dst))
            if comm is None:
                comm = _Communicator(self._lib, f"{self._group_name}/p2p/{src}->{dst}")
                me = 0 if self._rank == src else 1
                comm.init(self._uid_exchange(f"nccl_rs/p2p/{src}->{dst}/uid", me == 0), 2, me)
                self._p2p[(src, dst)] = comm
            return comm

    def getBackendName(self) -> str:
        return BACKEND_NAME

    # Capabilities, answered here: PyTorch asks the Python object for them.
    @property
    def supports_coalescing(self) -> bool:
        return False

    @property
    def supports_splitting(self) -> bool:
        return False

    @property
    def supports_shrinking(self) -> bool:
        return False

    @property
    def supports_reconfigure(self) -> bool:
        return False

    @property
    def supports_window(self) -> bool:
        return False

    @property
    def supports_time_estimate(self) -> bool:
        return False

    @property
    def options(self):
        return _C10dBackend.Options(BACKEND_NAME, self._timeout)

    def shutdown(self) -> None:
        with self._p2p_lock:
            comms = list(self._p2p.values()) + [self._comm]
        _close_all(comms, False, self._timeout)

    def abort(self) -> None:
        with self._p2p_lock:
            comms = list(self._p2p.values()) + [self._comm]
        _close_all(comms, True, self._timeout)

    # -- helpers -------------------------------------------------------------

    def _stream(self, t: torch.Tensor) -> ctypes.c_void_p:
        """The cudaStream_t a call on ``t`` is ordered on (NULL for host memory)."""
        if t.device.type != "cuda":
            return ctypes.c_void_p()
        if not self._lib.has_cuda_feature:
            raise ValueError(
                f"nccl_rs: {t.device} tensors need nccl-rs built with the cuda feature "
                f"({self._lib.path} was built without it)"
            )
        return ctypes.c_void_p(torch.cuda.current_stream(t.device).cuda_stream)

    def _wrap(self, submitted, comm: _Communicator) -> dist.Work:
        fut, done = submitted
        return _Work(fut, done, comm, self._timeout)

    def _run(self, fn: Callable[[], object], comm: _Communicator | None = None) -> dist.Work:
        comm = comm or self._comm
        return self._wrap(comm.submit(fn), comm)

    def _check_peer(self, peer: int, what: str) -> int:
        if not 0 <= peer < self._size:
            raise ValueError(f"nccl_rs: {what} rank {peer} is outside the group (size {self._size})")
        return peer

    def _check_root(self, root: int) -> int:
        return self._check_peer(root, "root")

    # -- collectives ---------------------------------------------------------

    def allreduce(self, tensors, opts=None) -> dist.Work:
        t = _single(tensors, "all_reduce")
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        return self._allreduce(t, op)

    def _allreduce(self, t: torch.Tensor, op) -> dist.Work:
        red = nccl_reduce_op(op, t.dtype)
        dtype = nccl_reduce_dtype(t.dtype, red)
        stream = self._stream(t)
        inp = self._premul(t, op)
        buf = _reduce_view(_contig(t))
        src = _reduce_view(inp) if inp is not None else buf
        comm = self._comm

        def run():
            comm.check(
                self._lib.AllReduce(_ptr(src), _ptr(buf), buf.numel(), dtype, red, comm.comm, stream),
                "ncclAllReduce",
            )
            if buf.data_ptr() != _reduce_view(t).data_ptr():
                t.copy_(torch.view_as_complex(buf) if t.is_complex() else buf)
            return [t]

        return self._run(run)

    @staticmethod
    def _premul(t: torch.Tensor, op) -> torch.Tensor | None:
        """For PREMUL_SUM: a contiguous copy of ``t`` times the op's factor."""
        if _kind(op) != _RED.PREMUL_SUM:
            return None
        factor = op.factor
        return (t * factor).contiguous()

    def allreduce_coalesced(self, tensors, opts=None) -> dist.Work:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        works = [self._allreduce(_check_tensor(t, "all_reduce_coalesced"), op) for t in tensors]
        return self._after(works, list(tensors))

    def _after(self, works: list, value) -> dist.Work:
        """One Work done once every work in ``works`` (queued before it) is done."""
        comm = self._comm

        def run():
            for w in works:
                w.wait()
            return value

        return self._run(run, comm)

    def broadcast(self, tensors, opts) -> dist.Work:
        t = _single(tensors, "broadcast")
        root = self._check_root(opts.rootRank)
        stream = self._stream(t)
        buf = _contig(t)
        comm = self._comm

        def run():
            nbytes = buf.numel() * buf.element_size()
            comm.check(
                self._lib.Broadcast(_ptr(buf), _ptr(buf), nbytes, _lib.UINT8, root, comm.comm, stream),
                "ncclBroadcast",
            )
            if buf.data_ptr() != t.data_ptr():
                t.copy_(buf)
            return [t]

        return self._run(run)

    def reduce(self, tensors, opts) -> dist.Work:
        t = _single(tensors, "reduce")
        root = self._check_root(opts.rootRank)
        red = nccl_reduce_op(opts.reduceOp, t.dtype)
        dtype = nccl_reduce_dtype(t.dtype, red)
        stream = self._stream(t)
        inp = self._premul(t, opts.reduceOp)
        buf = _reduce_view(_contig(t))
        src = _reduce_view(inp) if inp is not None else buf
        comm = self._comm

        def run():
            comm.check(
                self._lib.Reduce(_ptr(src), _ptr(buf), buf.numel(), dtype, red, root, comm.comm, stream),
                "ncclReduce",
            )
            if buf.data_ptr() != _reduce_view(t).data_ptr():
                t.copy_(torch.view_as_complex(buf) if t.is_complex() else buf)
            return [t]

        return self._run(run)

    def _allgather_base(self, output, input, opts=None) -> dist.Work:
        _check_tensor(output, "all_gather_into_tensor output")
        _check_tensor(input, "all_gather_into_tensor input")
        if output.dtype != input.dtype:
            raise ValueError(
                f"nccl_rs: all_gather_into_tensor: output dtype {output.dtype} != input dtype {input.dtype}"
            )
        if output.numel() != input.numel() * self._size:
            raise ValueError(
                f"nccl_rs: all_gather_into_tensor: output has {output.numel()} elements, "
                f"needs {self._size} x {input.numel()}"
            )
        stream = self._stream(input)
        src = _contig(input)
        out = _contig(output)
        comm = self._comm

        def run():
            nbytes = src.numel() * src.element_size()
            comm.check(
                self._lib.AllGather(_ptr(src), _ptr(out), nbytes, _lib.UINT8, comm.comm, stream),
                "ncclAllGather",
            )
            if out.data_ptr() != output.data_ptr():
                output.copy_(out)
            return [output]

        return self._run(run)

    def allgather(self, output_tensors, input_tensors, opts=None) -> dist.Work:
        inp = _single(input_tensors, "all_gather input")
        if len(output_tensors) != 1 or len(output_tensors[0]) != self._size:
            raise ValueError(
                f"nccl_rs: all_gather needs one output list of {self._size} tensors"
            )
        outs = output_tensors[0]
        for o in outs:
            _check_tensor(o, "all_gather output")
            if o.numel() != inp.numel() or o.dtype != inp.dtype:
                raise ValueError(
                    f"nccl_rs: all_gather: every output must match the input "
                    f"({inp.numel()} x {inp.dtype}), got {o.numel()} x {o.dtype}"
                )
        flat = torch.empty((self._size,) + tuple(inp.shape), dtype=inp.dtype, device=inp.device)
        work = self._allgather_base(flat, inp)
        comm = self._comm

        def run():
            work.wait()
            for o, part in zip(outs, flat):
                o.copy_(part.view(o.shape))
            return list(outs)

        return self._run(run, comm)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None) -> dist.Work:
        works = [self._allgather_base(o, i) for o, i in zip(outputs, inputs)]
        return self._after(works, list(outputs))

    def _reduce_scatter_base(self, output, input, opts) -> dist.Work:
        _check_tensor(output, "reduce_scatter_tensor output")
        _check_tensor(input, "reduce_scatter_tensor input")
        if output.dtype != input.dtype:
            raise ValueError(
                f"nccl_rs: reduce_scatter_tensor: output dtype {output.dtype} != input dtype {input.dtype}"
            )
        if input.numel() != output.numel() * self._size:
            raise ValueError(
                f"nccl_rs: reduce_scatter_tensor: input has {input.numel()} elements, "
                f"needs {self._size} x {output.numel()}"
            )
        red = nccl_reduce_op(opts.reduceOp, input.dtype)
        dtype = nccl_reduce_dtype(input.dtype, red)
        stream = self._stream(input)
        pre = self._premul(input, opts.reduceOp)
        src = _reduce_view(pre if pre is not None else _contig(input))
        out = _reduce_view(_contig(output))
        comm = self._comm

        def run():
            comm.check(
                self._lib.ReduceScatter(_ptr(src), _ptr(out), out.numel(), dtype, red, comm.comm, stream),
                "ncclReduceScatter",
            )
            if out.data_ptr() != _reduce_view(output).data_ptr():
                output.copy_(torch.view_as_complex(out) if output.is_complex() else out)
            return [output]

        return self._run(run)

    def reduce_scatter(self, output_tensors, input_tensors, opts) -> dist.Work:
        out = _single(output_tensors, "reduce_scatter output")
        if len(input_tensors) != 1 or len(input_tensors[0]) != self._size:
            raise ValueError(
                f"nccl_rs: reduce_scatter needs one input list of {self._size} tensors"
            )
        for i in input_tensors[0]:
            _check_tensor(i, "reduce_scatter input")
            if i.numel() != out.numel() or i.dtype != out.dtype:
                raise ValueError(
                    f"nccl_rs: reduce_scatter: every input must match the output "
                    f"({out.numel()} x {out.dtype}), got {i.numel()} x {i.dtype}"
                )
        flat = torch.stack([i.reshape(out.shape) for i in input_tensors[0]])
        return self._reduce_scatter_base(out, flat, opts)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts) -> dist.Work:
        works = [self._reduce_scatter_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return self._after(works, list(outputs))

    def _exchange(self, sends, recvs, what: str, comm: _Communicator | None = None):
        """A job running sends [(tensor, peer)] and recvs [(tensor, peer)] as one group."""
        comm = comm or self._comm
        lib = self._lib

        def run():
            comm.check(lib.GroupStart(), f"ncclGroupStart ({what})")
            first = None
            for buf, peer, stream in sends:
                if first is None:
                    n = buf.numel() * buf.element_size()
                    rc = lib.Send(_ptr(buf), n, _lib.UINT8, peer, comm.comm, stream)
                    if rc != _lib.SUCCESS:
                        first = (rc, "ncclSend")
            for buf, peer, stream in recvs:
                if first is None:
                    n = buf.numel() * buf.element_size()
                    rc = lib.Recv(_ptr(buf), n, _lib.UINT8, peer, comm.comm, stream)
                    if rc != _lib.SUCCESS:
                        first = (rc, "ncclRecv")
            rc = lib.GroupEnd()
            if first is not None:
                comm.check(first[0], f"{first[1]} ({what})")
            comm.check(rc, f"ncclGroupEnd ({what})")

        return run

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None) -> dist.Work:
        _check_tensor(output, "all_to_all_single output")
        _check_tensor(input, "all_to_all_single input")
        if output.dtype != input.dtype:
            raise ValueError(
                f"nccl_rs: all_to_all_single: output dtype {output.dtype} != input dtype {input.dtype}"
            )
        n = self._size
        stream = self._stream(input)
        src = _contig(input)
        out = _contig(output)
        comm = self._comm
        if not output_split_sizes and not input_split_sizes:
            if input.numel() % n or output.numel() != input.numel():
                raise ValueError(
                    f"nccl_rs: all_to_all_single: input ({input.numel()}) and output "
                    f"({output.numel()}) must have the same size, a multiple of {n}"
                )

            def run():
                per = src.numel() // n * src.element_size()
                comm.check(
                    self._lib.AlltoAll(_ptr(src), _ptr(out), per, _lib.UINT8, comm.comm, stream),
                    "ncclAlltoAll",
                )
                if out.data_ptr() != output.data_ptr():
                    output.copy_(out)
                return [output]

            return self._run(run)
        in_rows = self._splits(input, input_split_sizes, "input")
        out_rows = self._splits(output, output_split_sizes, "output")
        flat_in = src.view(-1) if src.dim() else src.view(1)
        flat_out = out.view(-1) if out.dim() else out.view(1)
        row_in = input.numel() // max(input.shape[0], 1) if input.dim() else 1
        row_out = output.numel() // max(output.shape[0], 1) if output.dim() else 1
        sends, recvs = [], []
        off = 0
        for peer, rows in enumerate(in_rows):
            sends.append((flat_in[off : off + rows * row_in], peer, stream))
            off += rows * row_in
        off = 0
        for peer, rows in enumerate(out_rows):
            recvs.append((flat_out[off : off + rows * row_out], peer, stream))
            off += rows * row_out
        exchange = self._exchange(sends, recvs, "all_to_all_single")

        def run():
            exchange()
            if out.data_ptr() != output.data_ptr():
                output.copy_(out)
            return [output]

        return self._run(run)

    def _splits(self, t: torch.Tensor, splits, what: str) -> list[int]:
        n = self._size
        rows = t.shape[0] if t.dim() else 1
        if not splits:
            if rows % n:
                raise ValueError(
                    f"nccl_rs: all_to_all_single: {what} dim 0 ({rows}) is not a multiple of {n}"
                )
            return [rows // n] * n
        splits = [int(s) for s in splits]
        if len(splits) != n or any(s < 0 for s in splits) or sum(splits) != rows:
            raise ValueError(
                f"nccl_rs: all_to_all_single: {what} splits {splits} must be {n} "
                f"non-negative sizes summing to dim 0 ({rows})"
            )
        return splits

    def alltoall(self, output_tensors, input_tensors, opts=None) -> dist.Work:
        n = self._size
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(f"nccl_rs: all_to_all needs {n} input and {n} output tensors")
        ins = [_contig(_check_tensor(t, "all_to_all input")) for t in input_tensors]
        outs = [_check_tensor(t, "all_to_all output") for t in output_tensors]
        bufs = [_contig(t) for t in outs]
        stream = self._stream(ins[0])
        exchange = self._exchange(
            [(t, p, stream) for p, t in enumerate(ins)],
            [(t, p, stream) for p, t in enumerate(bufs)],
            "all_to_all",
        )

        def run():
            exchange()
            for o, b in zip(outs, bufs):
                if o.data_ptr() != b.data_ptr():
                    o.copy_(b)
            return outs

        return self._run(run)

    def gather(self, output_tensors, input_tensors, opts) -> dist.Work:
        inp = _contig(_single(input_tensors, "gather input"))
        root = self._check_root(opts.rootRank)
        stream = self._stream(inp)
        sends = [(inp, root, stream)]
        recvs, outs, bufs = [], [], []
        if self._rank == root:
            if len(output_tensors) != 1 or len(output_tensors[0]) != self._size:
                raise ValueError(f"nccl_rs: gather needs one output list of {self._size} tensors at the root")
            outs = [_check_tensor(t, "gather output") for t in output_tensors[0]]
            for o in outs:
                if o.numel() != inp.numel() or o.dtype != inp.dtype:
                    raise ValueError("nccl_rs: gather: every output must match the input's size and dtype")
            bufs = [_contig(o) for o in outs]
            recvs = [(b, p, stream) for p, b in enumerate(bufs)]
        exchange = self._exchange(sends, recvs, "gather")

        def run():
            exchange()
            for o, b in zip(outs, bufs):
                if o.data_ptr() != b.data_ptr():
                    o.copy_(b)
            return outs or [inp]

        return self._run(run)

    def scatter(self, output_tensors, input_tensors, opts) -> dist.Work:
        out = _single(output_tensors, "scatter output")
        root = self._check_root(opts.rootRank)
        buf = _contig(out)
        stream = self._stream(out)
        sends = []
        if self._rank == root:
            if len(input_tensors) != 1 or len(input_tensors[0]) != self._size:
                raise ValueError(f"nccl_rs: scatter needs one input list of {self._size} tensors at the root")
            for p, t in enumerate(input_tensors[0]):
                _check_tensor(t, "scatter input")
                if t.numel() != out.numel() or t.dtype != out.dtype:
                    raise ValueError("nccl_rs: scatter: every input must match the output's size and dtype")
                sends.append((_contig(t), p, stream))
        exchange = self._exchange(sends, [(buf, root, stream)], "scatter")

        def run():
            exchange()
            if buf.data_ptr() != out.data_ptr():
                out.copy_(buf)
            return [out]

        return self._run(run)

    def barrier(self, opts=None) -> dist.Work:
        token = torch.zeros(1, dtype=torch.uint8)
        comm = self._comm

        def run():
            comm.check(
                self._lib.AllReduce(_ptr(token), _ptr(token), 1, _lib.UINT8, _lib.SUM, comm.comm, None),
                "ncclAllReduce (barrier)",
            )
            return [token]

        return self._run(run)

    # -- point to point ------------------------------------------------------

    def send(self, tensors, dstRank: int, tag: int = 0) -> dist.Work:
        t = _single(tensors, "send")
        dst = self._check_peer(dstRank, "destination")
        comm = self._pair(self._rank, dst)
        buf = _contig(t)
        return self._run(self._p2p_job(comm, buf, 1, True, t), comm)

    def recv(self, tensors, srcRank: int, tag: int = 0) -> dist.Work:
        t = _single(tensors, "recv")
        src = self._check_peer(srcRank, "source")
        comm = self._pair(src, self._rank)
        buf = _contig(t)
        return self._run(self._p2p_job(comm, buf, 0, False, t), comm)

    def _p2p_job(self, comm: _Communicator, buf: torch.Tensor, peer: int, is_send: bool, t):
        stream = self._stream(t)
        lib = self._lib

        def run():
            n = buf.numel() * buf.element_size()
            if is_send:
                comm.check(lib.Send(_ptr(buf), n, _lib.UINT8, peer, comm.comm, stream), "ncclSend")
            else:
                comm.check(lib.Recv(_ptr(buf), n, _lib.UINT8, peer, comm.comm, stream), "ncclRecv")
                if buf.data_ptr() != t.data_ptr():
                    t.copy_(buf)
            return [t]

        return run

    def recv_anysource(self, tensors, tag: int = 0) -> dist.Work:
        raise ValueError("nccl_rs: recv from any source is not supported (NCCL has no wildcard receive)")

    def gather_single(self, output, input, opts) -> dist.Work:
        """gather into one tensor: the root's ``output`` holds size x ``input``."""
        _check_tensor(input, "gather input")
        outs = [[]]
        if self._rank == opts.rootRank:
            _check_tensor(output, "gather output")
            if output.numel() != input.numel() * self._size or output.dtype != input.dtype:
                raise ValueError(
                    f"nccl_rs: gather: the root's output must hold {self._size} x "
                    f"{input.numel()} elements of {input.dtype}"
                )
            if not output.is_contiguous():
                raise ValueError("nccl_rs: gather: the root's output must be contiguous")
            outs = [list(output.view(self._size, -1).unbind(0))]
        work = self.gather(outs, [input.reshape(-1)], opts)
        comm = self._comm

        def run():
            work.wait()
            return [output]

        return self._run(run, comm)

    # PyTorch 2.15 names of the same calls.
    all_gather_single = _allgather_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single = _reduce_scatter_base
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced
    all_to_all_single = alltoall_base
    gather_into_tensor = gather_single
