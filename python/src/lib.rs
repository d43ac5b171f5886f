//! `nccl_rs._native`: the Python binding of nccl-rs.
//!
//! Every collective goes through nccl-rs's raw (NCCL-style) entry points on
//! the memory of Python objects ([`buf::View`]); blocking calls and waits run
//! with the GIL released. Async calls use nccl-rs's background queue and hold
//! the views until they are waited for.
//!
//! The extension also links nccl-rs's C ABI (`ncclAllReduce`, ...), which it
//! exports, so that C++ code (the torch backend) can `dlopen` this file and
//! use NCCL's API on the same library.

// Links the C ABI in; its `#[no_mangle]` functions are exported from this
// shared object.
extern crate nccl;

mod buf;
mod dtype;
mod errors;

use buf::View;
use errors::{invalid, raise, to_py};
use nccl_rs::comm::raw::{RawArgs, RawColl, RawP2p};
use nccl_rs::comm::{AbortHandle, AsyncOp};
use nccl_rs::{Config, DataType, RedOp, UniqueId as RsUniqueId};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyType};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

fn config() -> PyResult<Config> {
    Config::from_env().map_err(to_py)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The rendezvous token of a communicator (NCCL's `ncclUniqueId`).
///
/// ``UniqueId()`` creates one and starts the rendezvous root in this
/// process (do it on one rank, then pass ``bytes(uid)`` to the others);
/// ``UniqueId.from_bytes(b)`` rebuilds it from its 128 bytes.
#[pyclass(frozen, module = "nccl_rs")]
struct UniqueId(RsUniqueId);

#[pymethods]
impl UniqueId {
    #[new]
    fn new(py: Python<'_>) -> PyResult<UniqueId> {
        let cfg = config()?;
        let id = py
            .detach(|| RsUniqueId::new(&cfg))
            .map_err(|e| raise("NcclBootstrapError", format!("creating a unique id: {e}")))?;
        Ok(UniqueId(id))
    }

    /// The id whose 128 bytes are `data` (from ``bytes(uid)``).
    #[staticmethod]
    fn from_bytes(data: &[u8]) -> PyResult<UniqueId> {
        RsUniqueId::from_bytes(data)
            .map(UniqueId)
            .map_err(|e| invalid(format!("UniqueId.from_bytes: {e}")))
    }

    /// The 128 bytes of the id.
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.0.to_bytes())
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        self.to_bytes(py)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<UniqueId>()
            .is_ok_and(|o| o.get().0.to_bytes() == self.0.to_bytes())
    }

    fn __hash__(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.0.to_bytes().hash(&mut h);
        h.finish()
    }

    fn __reduce__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyBytes>,))> {
        let ctor = py.get_type::<UniqueId>().getattr("from_bytes")?;
        Ok((ctor, (self.to_bytes(py),)))
    }

    fn __repr__(&self) -> String {
        format!("UniqueId(root={})", self.0.root_addr())
    }
}

/// What an async operation holds until it is waited for: the views of its
/// buffers (and scratch bytes of a barrier).
struct Keep {
    _views: Vec<View>,
    _scratch: Option<Box<[u8]>>,
}

type Pending = AsyncOp<(Keep, nccl_rs::Result<()>)>;

struct WorkState {
    op: Option<Pending>,
    /// `Some` once waited for: `Ok`, or the exception class and message.
    outcome: Option<Result<(), (&'static str, String)>>,
}

/// An operation started with ``async_op=True``.
///
/// ``wait()`` blocks until it finished (at most ``NCCL_RS_TIMEOUT``, or
/// ``timeout`` seconds) and returns its output buffer, or raises its error;
/// ``is_completed()`` polls. The buffers must not be touched before
/// ``wait()`` returns. Dropping an unwaited handle waits for the operation.
#[pyclass(frozen, module = "nccl_rs")]
struct Work {
    state: Mutex<WorkState>,
    result: Py<PyAny>,
}

impl Work {
    fn new(op: Pending, result: Py<PyAny>) -> Work {
        Work {
            state: Mutex::new(WorkState {
                op: Some(op),
                outcome: None,
            }),
            result,
        }
    }
}

#[pymethods]
impl Work {
    /// Waits for the operation; returns its output buffer.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Py<PyAny>> {
        let limit = match timeout {
            Some(t) if !(t.is_finite() && t >= 0.0) => {
                return Err(invalid(format!(
                    "wait: timeout {t} is not a number of seconds >= 0"
                )))
            }
            Some(t) => Some(Duration::from_secs_f64(t)),
            None => None,
        };
        // The state is never locked across the wait, so that `is_completed`
        // from another thread does not block while holding the GIL.
        let op = lock(&self.state).op.take();
        if let Some(op) = op {
            let got = py.detach(move || match limit {
                None => Ok(op.wait()),
                Some(t) => op.wait_timeout(t),
            });
            let outcome = match got {
                Ok(Ok((keep, res))) => {
                    drop(keep);
                    res.map_err(|e| (errors::class_of(&e), e.to_string()))
                }
                Ok(Err(e)) => Err((errors::class_of(&e), e.to_string())),
                Err(op) => {
                    lock(&self.state).op = Some(op);
                    return Err(raise(
                        "NcclTimeoutError",
                        format!(
                            "wait: the operation did not complete within {}s",
                            timeout.unwrap_or(0.0)
                        ),
                    ));
                }
            };
            lock(&self.state).outcome = Some(outcome);
        }
        match &lock(&self.state).outcome {
            Some(Ok(())) => Ok(self.result.clone_ref(py)),
            Some(Err((class, msg))) => Err(raise(class, msg.clone())),
            None => Err(raise(
                "NcclInvalidUsageError",
                "wait: another thread is waiting for this operation".into(),
            )),
        }
    }

    /// Whether the operation has finished (successfully or not).
    fn is_completed(&self) -> bool {
        let s = lock(&self.state);
        s.outcome.is_some() || s.op.as_ref().is_some_and(|op| op.is_done())
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        let op = lock(&self.state).op.take();
        if let Some(op) = op {
            // Runs to its own deadline; the views are released after, under
            // the GIL.
            Python::attach(|py| drop(py.detach(move || op.wait())));
        }
    }
}

/// A raw call's arguments, moved into a GIL-free section.
struct Call(RawArgs);
// SAFETY: addresses of views the caller holds until the call ends.
unsafe impl Send for Call {}

struct Ops(Vec<RawP2p>);
// SAFETY: as `Call`.
unsafe impl Send for Ops {}

fn parse_op(op: &Bound<'_, PyAny>) -> PyResult<RedOp> {
    let s = match op.cast::<PyString>() {
        Ok(s) => s.to_cow()?.to_ascii_lowercase(),
        // An enum member (e.g. torch's `ReduceOp.SUM`): its name.
        Err(_) => op
            .getattr("name")
            .and_then(|n| n.extract::<String>())
            .map_err(|_| {
                invalid(format!(
                    "op={op}: expected 'sum', 'prod', 'min', 'max' or 'avg'"
                ))
            })?
            .to_ascii_lowercase(),
    };
    RedOp::parse(&s).ok_or_else(|| {
        invalid(format!(
            "op={s:?}: expected 'sum', 'prod', 'min', 'max' or 'avg'"
        ))
    })
}

fn parse_dtype(dtype: Option<&Bound<'_, PyAny>>) -> PyResult<Option<DataType>> {
    let Some(d) = dtype else { return Ok(None) };
    let name = match d.cast::<PyString>() {
        Ok(s) => s.to_cow()?.into_owned(),
        // numpy dtypes and scalar types, torch dtypes.
        Err(_) => match d.getattr("__name__") {
            Ok(n) if d.is_instance_of::<PyType>() => n.str()?.to_cow()?.into_owned(),
            _ => d.str()?.to_cow()?.into_owned(),
        },
    };
    dtype::parse_name(&name).map(Some).map_err(invalid)
}

/// "call: argument", formatted only for an error message.
struct Name<'a>(&'a str, &'a str);

impl std::fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.0, self.1)
    }
}

/// The communicator's views of a call's buffers and their datatype.
struct Bufs {
    input: Option<View>,
    output: Option<View>,
    dtype: DataType,
}

impl Bufs {
    fn get(
        what: &str,
        input: Option<(&Bound<'_, PyAny>, bool)>,
        output: Option<&Bound<'_, PyAny>>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bufs> {
        let explicit = parse_dtype(dtype)?;
        let input = input
            .map(|(o, w)| View::of(o, &Name(what, "input"), w))
            .transpose()?;
        let output = output
            .map(|o| View::of(o, &Name(what, "output"), true))
            .transpose()?;
        let mut found: Option<DataType> = None;
        for (name, v) in [("input", &input), ("output", &output)] {
            let Some(v) = v else { continue };
            let d = dtype::resolve(&Name(what, name), v.desc, explicit).map_err(invalid)?;
            if let Some(f) = found.filter(|&f| f != d) {
                return Err(invalid(format!(
                    "{what}: input holds {} but output holds {}; they must have one datatype",
                    dtype::np_name(f),
                    dtype::np_name(d)
                )));
            }
            found = Some(d);
            if v.bytes % d.size() != 0 {
                return Err(invalid(format!(
                    "{what}: {name} has {} bytes, not a whole number of {} elements",
                    v.bytes,
                    dtype::np_name(d)
                )));
            }
        }
        let dtype = found.ok_or_else(|| invalid(format!("{what}: no buffer given")))?;
        Ok(Bufs {
            input,
            output,
            dtype,
        })
    }

    fn elems(v: &View, d: DataType) -> usize {
        v.bytes / d.size()
    }

    fn into_keep(self) -> Keep {
        Keep {
            _views: self.input.into_iter().chain(self.output).collect(),
            _scratch: None,
        }
    }
}

fn mismatch(what: &str, detail: String) -> PyErr {
    invalid(format!("{what}: {detail}"))
}

/// Refuses an input and output of different lengths.
fn same_len(what: &str, i: &View, o: &View, d: DataType) -> PyResult<()> {
    if i.bytes == o.bytes {
        return Ok(());
    }
    Err(mismatch(
        what,
        format!(
            "input has {} elements but output has {}",
            Bufs::elems(i, d),
            Bufs::elems(o, d)
        ),
    ))
}

/// The length of `part`, refusing a `whole` that is not `ranks` of it.
fn part_of(
    what: &str,
    (whole_name, whole): (&str, &View),
    (part_name, part): (&str, &View),
    d: DataType,
    ranks: usize,
) -> PyResult<usize> {
    let (total, c) = (Bufs::elems(whole, d), Bufs::elems(part, d));
    if total != c * ranks {
        return Err(mismatch(
            what,
            format!("{whole_name} has {total} elements, not {part_name}'s {c} x {ranks} ranks"),
        ));
    }
    Ok(c)
}

/// Refuses an input and output that share bytes without being NCCL's
/// in-place layout `in_place_at` (the input's address when in place).
fn check_overlap(what: &str, i: &View, o: &View, in_place_at: *const u8) -> PyResult<()> {
    let (ia, oa) = (i.ptr as usize, o.ptr as usize);
    let overlap = i.bytes > 0 && o.bytes > 0 && ia < oa + o.bytes && oa < ia + i.bytes;
    if overlap && !std::ptr::eq(i.ptr, in_place_at) {
        return Err(mismatch(
            what,
            "input and output overlap; for in place pass one buffer (see the docstring)".into(),
        ));
    }
    Ok(())
}

/// A group of NCCL ranks (NCCL's `ncclComm_t`): ``rank`` of ``size``.
///
/// Make one with ``Communicator.from_env()`` under torchrun, mpirun, srun or
/// ncclrun, or ``Communicator(unique_id, nranks, rank)``. Collectives take
/// any object with the buffer protocol (numpy arrays, ``bytearray``,
/// ``memoryview``) or DLPack (torch CPU tensors), contiguous, in host memory.
/// The datatype comes from the buffer (``dtype=`` overrides it for plain
/// bytes, or gives it where the buffer cannot, e.g. bfloat16 in a uint16
/// array). Each call blocks (without the GIL) and returns its output buffer,
/// or with ``async_op=True`` returns a :class:`Work` at once.
#[pyclass(frozen, module = "nccl_rs")]
struct Communicator {
    inner: Mutex<Option<nccl_rs::Communicator>>,
    rank: usize,
    size: usize,
    abort: AbortHandle,
}

impl Communicator {
    fn wrap(c: nccl_rs::Communicator) -> Communicator {
        Communicator {
            rank: c.rank(),
            size: c.size(),
            abort: c.abort_handle(),
            inner: Mutex::new(Some(c)),
        }
    }

    fn with<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut nccl_rs::Communicator) -> nccl_rs::Result<R> + Send,
    ) -> PyResult<R> {
        let res = py.detach(|| {
            let mut g = lock(&self.inner);
            g.as_mut().map(f)
        });
        match res {
            Some(r) => r.map_err(to_py),
            None => Err(raise(
                "NcclInvalidUsageError",
                format!("rank {}: the communicator is closed", self.rank),
            )),
        }
    }

    /// Runs `a` on the views in `keep`; returns `result`, or a `Work`.
    fn run(
        &self,
        py: Python<'_>,
        a: RawArgs,
        keep: Keep,
        result: &Bound<'_, PyAny>,
        async_op: bool,
    ) -> PyResult<Py<PyAny>> {
        let call = Call(a);
        self.submit(py, keep, result, async_op, move |c, keep| {
            let call = call;
            // SAFETY: `keep` holds the views of every buffer `a` names: it
            // travels with an async operation until it is waited for, and
            // outlives a blocking call (see `submit`).
            unsafe {
                match keep {
                    Some(keep) => c.collective_raw_async(&call.0, keep).map(Some),
                    None => c.collective_raw(&call.0).map(|()| None),
                }
            }
        })
    }

    /// Runs `f` blocking (`f` gets no `keep`; `keep` is dropped after it
    /// returns, with the GIL) and returns `result`, or starts it with
    /// `keep` and returns a `Work`.
    fn submit(
        &self,
        py: Python<'_>,
        keep: Keep,
        result: &Bound<'_, PyAny>,
        async_op: bool,
        f: impl FnOnce(&mut nccl_rs::Communicator, Option<Keep>) -> nccl_rs::Result<Option<Pending>>
            + Send,
    ) -> PyResult<Py<PyAny>> {
        if async_op {
            return match self.with(py, move |c| f(c, Some(keep)))? {
                Some(op) => Ok(Py::new(py, Work::new(op, result.clone().unbind()))?.into_any()),
                None => Err(invalid("an async start returned no operation".into())),
            };
        }
        self.with(py, move |c| f(c, None))?;
        drop(keep);
        Ok(result.clone().unbind())
    }

    fn args(
        &self,
        coll: RawColl,
        count: usize,
        b: &Bufs,
        send: *const u8,
        recv: *mut u8,
    ) -> RawArgs {
        RawArgs {
            coll,
            send,
            recv,
            count,
            dtype: b.dtype,
            op: RedOp::Sum,
            root: 0,
        }
    }

    fn check_root(&self, what: &str, root: usize) -> PyResult<()> {
        if root >= self.size {
            return Err(mismatch(
                what,
                format!("root {root} is not a rank of {} ranks", self.size),
            ));
        }
        Ok(())
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Closing waits for queued operations and joins threads: not with
        // the GIL held.
        let c = lock(&self.inner).take();
        if c.is_some() {
            Python::attach(|py| py.detach(move || drop(c)));
        }
    }
}

fn ptr_at(v: &View, elems: usize, d: DataType) -> *mut u8 {
    v.ptr.wrapping_add(elems * d.size())
}

#[pymethods]
impl Communicator {
    /// Joins the job described by `unique_id` (a :class:`UniqueId` or its
    /// bytes) as `rank` of `nranks`. Blocks until every rank joined, or
    /// ``NCCL_RS_BOOTSTRAP_TIMEOUT`` passed.
    #[new]
    fn new(
        py: Python<'_>,
        unique_id: &Bound<'_, PyAny>,
        nranks: usize,
        rank: usize,
    ) -> PyResult<Communicator> {
        let id = match unique_id.cast::<UniqueId>() {
            Ok(u) => u.get().0,
            Err(_) => {
                let b: Vec<u8> = unique_id.extract().map_err(|_| {
                    invalid("unique_id: expected a UniqueId or its 128 bytes".into())
                })?;
                UniqueId::from_bytes(&b)?.0
            }
        };
        let cfg = config()?;
        nccl_rs::init_logging();
        let c = py
            .detach(|| nccl_rs::Communicator::init(&id, nranks, rank, &cfg))
            .map_err(to_py)?;
        Ok(Communicator::wrap(c))
    }

    /// Joins the job a launcher described in the environment: torchrun
    /// (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), Open MPI,
    /// PMI, Slurm, or ncclrun. Rank 0 starts the rendezvous root.
    #[staticmethod]
    fn from_env(py: Python<'_>) -> PyResult<Communicator> {
        let cfg = config()?;
        nccl_rs::init_logging();
        let c = py
            .detach(|| nccl_rs::Communicator::init_from_env(&cfg))
            .map_err(to_py)?;
        Ok(Communicator::wrap(c))
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    #[getter]
    fn size(&self) -> usize {
        self.size
    }

    /// The data transport between ranks (``"SHM"``, ``"Socket"``, ...).
    #[getter]
    fn transport(&self, py: Python<'_>) -> PyResult<String> {
        self.with(py, |c| Ok(c.transport_name().to_owned()))
    }

    /// Waits for this communicator's operations, then closes its
    /// connections. Later calls raise; closing twice does nothing.
    fn close(&self, py: Python<'_>) {
        let c = py.detach(|| lock(&self.inner).take());
        py.detach(move || drop(c));
    }

    /// Waits until every rank called `finalize` (NCCL's
    /// ``ncclCommFinalize``): call it before ``close`` so that no rank
    /// tears down connections a peer still uses.
    fn finalize(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |c| c.finalize())
    }

    /// Aborts the operations in flight, from any thread (NCCL's
    /// ``ncclCommAbort``): they raise :class:`NcclAbortedError`; afterwards
    /// the communicator can only be closed.
    fn abort(&self) {
        self.abort.abort();
    }

    /// Ranks passing the same `color` form a new communicator, ranked by
    /// ``(key, rank)``; ``color=None`` takes part and gets ``None``. Every
    /// rank must call it.
    #[pyo3(signature = (color, key=0))]
    fn split(
        &self,
        py: Python<'_>,
        color: Option<u32>,
        key: i32,
    ) -> PyResult<Option<Communicator>> {
        let sub = self.with(py, |c| {
            let cfg = c.config().clone();
            c.split(color, key, &cfg)
        })?;
        Ok(sub.map(Communicator::wrap))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) {
        self.close(py);
    }

    fn __repr__(&self) -> String {
        format!("Communicator(rank={}, size={})", self.rank, self.size)
    }

    /// ``output = input[0] op ... op input[size-1]`` on every rank. Without
    /// `output`, in place in `input`.
    #[pyo3(signature = (input, output=None, *, op=None, dtype=None, async_op=false))]
    fn all_reduce(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: Option<&Bound<'_, PyAny>>,
        op: Option<&Bound<'_, PyAny>>,
        dtype: Option<&Bound<'_, PyAny>>,
        async_op: bool,
    ) -> PyResult<Py<PyAny>> {
        let what = "all_reduce";
        let op = op.map(parse_op).transpose()?.unwrap_or(RedOp::Sum);
        let b = Bufs::get(what, Some((input, output.is_none())), output, dtype)?;
        let i = b.input.as_ref().expect("given");
        let n = Bufs::elems(i, b.dtype);
        let recv = match &b.output {
            Some(o) => {
                same_len(what, i, o, b.dtype)?;
                check_overlap(what, i, o, o.ptr)?;
                o.ptr
            }
            None => i.ptr,
        };
        let a = RawArgs {
            op,
            ..self.args(RawColl::AllReduce, n, &b, i.ptr, recv)
        };
        self.run(py, a, b.into_keep(), output.unwrap_or(input), async_op)
    }

    /// Copies `root`'s `input` into every rank's `output`. Without `output`,
    /// in place in `input`; with `output`, `input` is read on the root only
    /// (other ranks may pass ``None``).
    #[pyo3(signature = (input, output=None, *, root=0, dtype=None, async_op=false))]
    fn broadcast(
        &self,
        py: Python<'_>,
        input: Option<&Bound<'_, PyAny>>,
        output: Option<&Bound<'_, PyAny>>,
        root: usize,
        dtype: Option<&Bound<'_, PyAny>>,
        async_op: bool,
    ) -> PyResult<Py<PyAny>> {
        let what = "broadcast";
        self.check_root(what, root)?;
        let in_place = output.is_none();
        let input = if in_place || self.rank == root {
            input
        } else {
            input.filter(|_| false)
        };
        let result = output
            .or(input)
            .ok_or_else(|| mismatch(what, "no buffer given".into()))?;
        let b = Bufs::get(what, input.map(|i| (i, in_place)), output, dtype)?;
        let (send, recv, n) = match (&b.input, &b.output) {
            (Some(i), None) => (i.ptr as *const u8, i.ptr, Bufs::elems(i, b.dtype)),
            (i, Some(o)) => {
                if let Some(i) = i {
                    same_len(what, i, o, b.dtype)?;
                    check_overlap(what, i, o, o.ptr)?;
                }
                (
                    i.as_ref().map_or(std::ptr::null(), |i| i.ptr as *const u8),
                    o.ptr,
                    Bufs::elems(o, b.dtype),
                )
            }
            (None, None) => unreachable!("checked above"),
        };
        if self.rank == root && b.input.is_none() {
            return Err(mismatch(
                what,
                format!("rank {root} is the root and needs input"),
            ));
        }
        let a = RawArgs {
            root,
            ..self.args(RawColl::Broadcast, n, &b, send, recv)
        };
        self.run(py, a, b.into_keep(), result, async_op)
    }

    /// Reduces every rank's `input` into `root`'s `output` (other ranks may
    /// omit `output`; it is not written there). Without `output`, the
    /// root's result lands in its `input`.
    #[allow(clippy::too_many_arguments)] // the Python signature
    #[pyo3(signature = (input, output=None, *, root=0, op=None, dtype=None, async_op=false))]
    fn reduce(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: Option<&Bound<'_, PyAny>>,
        root: usize,
        op: Option<&Bound<'_, PyAny>>,
        dtype: Option<&Bound<'_, PyAny>>,
        async_op: bool,
    ) -> PyResult<Py<PyAny>> {
        let what = "reduce";
        self.check_root(what, root)?;
        let op = op.map(parse_op).transpose()?.unwrap_or(RedOp::Sum);
        let is_root = self.rank == root;
        let in_place = output.is_none();
        let b = Bufs::get(what, Some((input, in_place && is_root)), output, dtype)?;
        let i = b.input.as_ref().expect("given");
        let n = Bufs::elems(i, b.dtype);
        let recv = match &b.output {
            Some(o) => {
                if is_root {
                    same_len(what, i, o, b.dtype)?;
                }
                check_overlap(what, i, o, o.ptr)?;
                o.ptr
            }
            None => i.ptr,
        };
        let a = RawArgs {
            op,
            root,
            ..self.args(RawColl::Reduce, n, &b, i.ptr, recv)
        };
        self.run(py, a, b.into_keep(), output.unwrap_or(input), async_op)
    }

    /// Gathers every rank's `input` into `output` (``size`` times as long,
    /// in rank order) on every rank. In place with ``input=None``: this
    /// rank's part of `output` is its input.
    #[pyo3(signature = (input, output, *, dtype=None, async_op=false))]
    fn all_gather(
        &self,
        py: Python<'_>,
        input: Option<&Bound<'_, PyAny>>,
        output: &Bound<'_, PyAny>,
        dtype: Option<&Bound<'_, PyAny>>,
        async_op: bool,
    ) -> PyResult<Py<PyAny>> {
        let what = "all_gather";
        let b = Bufs::get(what, input.map(|i| (i, false)), Some(output), dtype)?;
        let o = b.output.as_ref().expect("given");
        let total = Bufs::elems(o, b.dtype);
        let (send, c) = match &b.input {
            Some(i) => {
                let c = part_of(what, ("output", o), ("input", i), b.dtype, self.size)?;
                check_overlap(what, i, o, ptr_at(o, self.rank * c, b.dtype))?;
                (i.ptr as *const u8, c)
            }
            None => {
                let c = self.equal_parts(what, "output", total)?;
                (ptr_at(o, self.rank * c, b.dtype) as *const u8, c)
            }
        };
        let a = self.args(RawColl::AllGather, c, &b, send, o.ptr);
        self.run(py, a, b.into_keep(), output, async_op)
    }

    /// Reduces `input` (``size`` equal parts) across ranks and leaves part
    /// ``rank`` in `output`. In place without `output`: the result lands in
    /// this rank's part of `input`.
    #[pyo3(signature = (input, output=None, *, op=None, dtype=None, async_op=false))]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: Option<&Bound<'_, PyAny>>,
        op: Option<&Bound<'_, PyAny>>,
        dtype: Option<&Bound<'_, PyAny>>,
        async_op: bool,
    ) -> PyResult<Py<PyAny>> {
        let what = "reduce_scatter";
        let op = op.map(parse_op).transpose()?.unwrap_or(RedOp::Sum);
        let b = Bufs::get(what, Some((input, output.is_none())), output, dtype)?;
        let i = b.input.as_ref().expect("given");
        let total = Bufs::elems(i, b.dtype);
        let (recv, c) = match &b.output {
            Some(o) => {
                let c = part_of(what, ("input", i), ("output", o), b.dtype, self.size)?;
                // NCCL's in-place layout may also be given explicitly.
                check_overlap(what, o, i, ptr_at(i, self.rank * c, b.dtype))?;
                (o.ptr, c)
            }
            None => {
                let c = self.equal_parts(what, "input", total)?;
                (ptr_at(i, self.rank * c, b.dtype), c)
            }
        };
        let a = RawArgs {
            op,
            ..self.args(RawColl::ReduceScatter, c, &b, i.ptr, recv)
        };
        self.run(py, a, b.into_keep(), output.unwrap_or(input), async_op)
    }

    /// Sends part ``p`` of `input` (``size`` equal parts) to rank ``p``, and
    /// receives rank ``p``'s part ``rank`` into part ``p`` of `output`.
    /// Without `output`, in place in `input`.
    #[pyo3(signature = (input, output=None, *, dtype=None, async_op=false))]
    fn all_to_all(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        output: Option<&Bound<'_, PyAny>>,
        dtype: Option<&Bound<'_, PyAny>>,
        async_op: bool,
    ) -> PyResult<Py<PyAny>> {
        let what = "all_to_all";
        let b = Bufs::get(what, Some((input, output.is_none())), output, dtype)?;
        let i = b.input.as_ref().expect("given");
        let total = Bufs::elems(i, b.dtype);
        let c = self.equal_parts(what, "input", total)?;
        let recv = match &b.output {
            Some(o) => {
                same_len(what, i, o, b.dtype)?;
                check_overlap(what, i, o, o.ptr)?;
                o.ptr
            }
            None => i.ptr,
        };
        let a = self.args(RawColl::AllToAll, c, &b, i.ptr, recv);
        self.run(py, a, b.into_keep(), output.unwrap_or(input), async_op)
    }

    /// Gathers every rank's `input` into `root`'s `output` (``size`` times
    /// as long, rank order). Other ranks omit `output`. In place on the
    /// root with ``input=None``: its part of `output` is its input.
    #[pyo3(signature = (input, output=None, *, root=0, dtype=None, async_op=false))]
    fn gather(
        &self,
        py: Python<'_>,
        input: Option<&Bound<'_, PyAny>>,
        output: Option<&Bound<'_, PyAny>>,
        root: usize,
        dtype: Option<&Bound<'_, PyAny>>,
        async_op: bool,
    ) -> PyResult<Py<PyAny>> {
        let what = "gather";
        self.check_root(what, root)?;
        let is_root = self.rank == root;
        let output = output.filter(|_| is_root);
        let result = output
            .or(input)
            .ok_or_else(|| mismatch(what, "no buffer given".into()))?;
        if is_root && output.is_none() {
            return Err(mismatch(
                what,
                format!("rank {root} is the root and needs output"),
            ));
        }
        if !is_root && input.is_none() {
            return Err(mismatch(
                what,
                "input is needed on every rank but the root".into(),
            ));
        }
        let b = Bufs::get(what, input.map(|i| (i, false)), output, dtype)?;
        let (send, recv, c) = match (&b.input, &b.output) {
            (Some(i), Some(o)) => {
                let c = part_of(what, ("output", o), ("input", i), b.dtype, self.size)?;
                check_overlap(what, i, o, ptr_at(o, self.rank * c, b.dtype))?;
                (i.ptr as *const u8, o.ptr, c)
            }
            (None, Some(o)) => {
                let c = self.equal_parts(what, "output", Bufs::elems(o, b.dtype))?;
                (ptr_at(o, self.rank * c, b.dtype) as *const u8, o.ptr, c)
            }
            (Some(i), None) => (
                i.ptr as *const u8,
                std::ptr::null_mut(),
                Bufs::elems(i, b.dtype),
            ),
            (None, None) => unreachable!("checked above"),
        };
        let a = RawArgs {
            root,
            ..self.args(RawColl::Gather, c, &b, send, recv)
        };
        self.run(py, a, b.into_keep(), result, async_op)
    }

    /// Sends part ``p`` of `root`'s `input` (``size`` equal parts) to rank
    /// ``p``'s `output`. Other ranks pass ``input=None``. In place on the
    /// root without `output`: its part of `input` is its output.
    #[pyo3(signature = (input, output=None, *, root=0, dtype=None, async_op=false))]
    fn scatter(
        &self,
        py: Python<'_>,
        input: Option<&Bound<'_, PyAny>>,
        output: Option<&Bound<'_, PyAny>>,
        root: usize,
        dtype: Option<&Bound<'_, PyAny>>,
        async_op: bool,
    ) -> PyResult<Py<PyAny>> {
        let what = "scatter";
        self.check_root(what, root)?;
        let is_root = self.rank == root;
        let input = input.filter(|_| is_root);
        if is_root && input.is_none() {
            return Err(mismatch(
                what,
                format!("rank {root} is the root and needs input"),
            ));
        }
        if !is_root && output.is_none() {
            return Err(mismatch(
                what,
                "output is needed on every rank but the root".into(),
            ));
        }
        let result = output.or(input).expect("checked above");
        let b = Bufs::get(what, input.map(|i| (i, output.is_none())), output, dtype)?;
        let (send, recv, c) = match (&b.input, &b.output) {
            (Some(i), Some(o)) => {
                let c = part_of(what, ("input", i), ("output", o), b.dtype, self.size)?;
                check_overlap(what, o, i, ptr_at(i, self.rank * c, b.dtype))?;
                (i.ptr as *const u8, o.ptr, c)
            }
            (Some(i), None) => {
                let c = self.equal_parts(what, "input", Bufs::elems(i, b.dtype))?;
                (i.ptr as *const u8, ptr_at(i, self.rank * c, b.dtype), c)
            }
            (None, Some(o)) => (std::ptr::null(), o.ptr, Bufs::elems(o, b.dtype)),
            (None, None) => unreachable!("checked above"),
        };
        let a = RawArgs {
            root,
            ..self.args(RawColl::Scatter, c, &b, send, recv)
        };
        self.run(py, a, b.into_keep(), result, async_op)
    }

    /// Waits until every rank called `barrier`.
    #[pyo3(signature = (*, async_op=false))]
    fn barrier(&self, py: Python<'_>, async_op: bool) -> PyResult<Py<PyAny>> {
        let mut scratch: Box<[u8]> = Box::new([0u8]);
        let p = scratch.as_mut_ptr();
        let a = RawArgs {
            coll: RawColl::AllReduce,
            send: p,
            recv: p,
            count: 1,
            dtype: DataType::Uint8,
            op: RedOp::Max,
            root: 0,
        };
        let keep = Keep {
            _views: Vec::new(),
            _scratch: Some(scratch),
        };
        self.run(py, a, keep, &py.None().into_bound(py), async_op)
    }

    /// Sends `buf` to `peer` (matched by `peer`'s ``recv`` of as many bytes).
    #[pyo3(signature = (buf, peer, *, async_op=false))]
    fn send(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        peer: usize,
        async_op: bool,
    ) -> PyResult<Py<PyAny>> {
        self.run_ops(py, vec![(true, buf.clone(), peer)], buf, async_op)
    }

    /// Receives into `buf` from `peer`.
    #[pyo3(signature = (buf, peer, *, async_op=false))]
    fn recv(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        peer: usize,
        async_op: bool,
    ) -> PyResult<Py<PyAny>> {
        self.run_ops(py, vec![(false, buf.clone(), peer)], buf, async_op)
    }

    /// Runs sends and receives together, without deadlock whatever their
    /// order (NCCL's ``ncclGroupStart``/``ncclGroupEnd`` around
    /// ``ncclSend``/``ncclRecv``). `ops` is a list of ``("send" | "recv",
    /// buffer, peer)``; :class:`P2pGroup` builds one.
    #[pyo3(signature = (ops, *, async_op=false))]
    fn run_group(
        &self,
        py: Python<'_>,
        ops: Vec<(String, Bound<'_, PyAny>, usize)>,
        async_op: bool,
    ) -> PyResult<Py<PyAny>> {
        let mut list = Vec::with_capacity(ops.len());
        for (kind, buf, peer) in ops {
            let is_send = match kind.as_str() {
                "send" => true,
                "recv" => false,
                other => {
                    return Err(invalid(format!(
                        "run_group: {other:?} is neither \"send\" nor \"recv\""
                    )))
                }
            };
            list.push((is_send, buf, peer));
        }
        self.run_ops(py, list, &py.None().into_bound(py), async_op)
    }
}

impl Communicator {
    fn equal_parts(&self, what: &str, name: &str, elems: usize) -> PyResult<usize> {
        if elems % self.size != 0 {
            return Err(mismatch(
                what,
                format!(
                    "{name} has {elems} elements, which do not split into {} equal parts",
                    self.size
                ),
            ));
        }
        Ok(elems / self.size)
    }

    fn run_ops(
        &self,
        py: Python<'_>,
        ops: Vec<(bool, Bound<'_, PyAny>, usize)>,
        result: &Bound<'_, PyAny>,
        async_op: bool,
    ) -> PyResult<Py<PyAny>> {
        let mut views = Vec::with_capacity(ops.len());
        let mut raw = Vec::with_capacity(ops.len());
        for (k, (is_send, buf, peer)) in ops.iter().enumerate() {
            let what = format!(
                "{} #{k} (peer {peer})",
                if *is_send { "send" } else { "recv" }
            );
            if *peer >= self.size {
                return Err(invalid(format!(
                    "{what}: peer {peer} is not a rank of {} ranks",
                    self.size
                )));
            }
            let v = View::of(buf, &what, !is_send)?;
            raw.push(RawP2p {
                is_send: *is_send,
                peer: *peer,
                ptr: v.ptr,
                bytes: v.bytes,
            });
            views.push(v);
        }
        // Receive buffers may not overlap each other or any send buffer.
        for (a, va) in raw.iter().zip(&views) {
            for (b, vb) in raw.iter().zip(&views) {
                let same = std::ptr::eq(va, vb);
                let overlap = va.bytes > 0
                    && vb.bytes > 0
                    && (va.ptr as usize) < vb.ptr as usize + vb.bytes
                    && (vb.ptr as usize) < va.ptr as usize + va.bytes;
                if !same && overlap && (!a.is_send || !b.is_send) {
                    return Err(invalid(
                        "run_group: a receive buffer overlaps another buffer of the group".into(),
                    ));
                }
            }
        }
        let keep = Keep {
            _views: views,
            _scratch: None,
        };
        let ops = Ops(raw);
        self.submit(py, keep, result, async_op, move |c, keep| {
            let ops = ops;
            // SAFETY: `keep` holds every buffer, with an async operation
            // until it is waited for, else until after the call (see
            // `submit`); overlap was refused above.
            unsafe {
                match keep {
                    Some(keep) => c.run_group_raw_async(&ops.0, keep).map(Some),
                    None => c.run_group_raw(&ops.0).map(|()| None),
                }
            }
        })
    }
}

/// The datatype a call would use on a buffer of `format` and `itemsize`
/// with `dtype=` (for tests of the mapping); raises like a call would.
#[pyfunction]
#[pyo3(signature = (format, itemsize, dtype=None))]
fn _resolve_dtype(
    format: Option<&str>,
    itemsize: usize,
    dtype: Option<&Bound<'_, PyAny>>,
) -> PyResult<&'static str> {
    let d = dtype::from_format(format, itemsize).map_err(invalid)?;
    let explicit = parse_dtype(dtype)?;
    dtype::resolve(&"call", d, explicit)
        .map(dtype::np_name)
        .map_err(invalid)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Communicator>()?;
    m.add_class::<UniqueId>()?;
    m.add_class::<Work>()?;
    m.add_function(wrap_pyfunction!(_resolve_dtype, m)?)?;
    Ok(())
}
