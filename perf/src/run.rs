//! The driver of every perf tool: rank setup, header, size sweep, footer.

use std::process::ExitCode;

use nccl_rs::launch::LaunchEnv;
use nccl_rs::{Communicator, Config, DataType, RedOp, UniqueId};

use crate::args::{parse_args, sweep, usage, Args, Parsed};
use crate::check::{generator, prepare, Place};
use crate::coll::Collective;
use crate::data::{count_wrong, poison, tolerance, TestElem};
use crate::device::DeviceBuffers;
use crate::exec::run_op;
use crate::table;
use crate::timing::{combine, sum_count, time_ops};

/// Errors of a rank: the library's, or our own messages.
type AnyError = Box<dyn std::error::Error + Send + Sync>;
type AnyResult<T> = Result<T, AnyError>;

/// Totals over the whole run, on each rank.
#[derive(Default)]
struct Stats {
    /// Measurements with wrong elements.
    errors: u64,
    /// Sum of bus bandwidths, for the average.
    bw_sum: f64,
    /// Number of bandwidths summed.
    bw_count: u64,
}

/// What every rank needs to run the sweep.
struct Ctx<'a> {
    coll: Collective,
    args: &'a Args,
    prog: &'a str,
    /// Whether this rank prints (rank 0).
    main: bool,
}

/// Entry point of a perf tool binary: parses the command line, sets up the
/// ranks (threads with `-t N`, the launcher's processes, or a single rank),
/// runs the sweep and returns the exit status (1 on wrong results or errors,
/// 2 on bad usage).
pub fn perf_main(coll: Collective) -> ExitCode {
    let mut argv = std::env::args();
    let prog = argv
        .next()
        .and_then(|p| p.rsplit('/').next().map(str::to_string))
        .unwrap_or_else(|| coll.name().to_string());
    let args = match parse_args(argv) {
        Ok(Parsed::Run(a)) => a,
        Ok(Parsed::Help) => {
            print!("{}", usage(&prog));
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            eprint_whole(&format!("{prog}: {msg}\n{}", usage(&prog)));
            return ExitCode::from(2);
        }
    };
    nccl_rs::init_logging();
    match launch(coll, &prog, &args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprint_whole(&format!("{prog}: {e}\n"));
            ExitCode::FAILURE
        }
    }
}

/// Creates this process's ranks and runs them; `Ok(false)` on wrong results.
fn launch(coll: Collective, prog: &str, args: &Args) -> AnyResult<bool> {
    if args.device {
        // Every rank would fail alike: say so before any rank waits.
        crate::device::available()?;
    }
    let mut cfg = Config::from_env()?;
    // `-T` overrides NCCL_RS_TIMEOUT, so a stuck peer fails a rank in that time.
    args.apply_to(&mut cfg);
    let env = LaunchEnv::detect();
    let Some(nthreads) = args.nthreads else {
        let (comm, local_rank) = match &env {
            Some(e) => (Communicator::init_from_env(&cfg)?, e.local_rank),
            None => {
                let id = UniqueId::new(&cfg)?;
                (Communicator::init(&id, 1, 0, &cfg)?, 0)
            }
        };
        return Ok(run_rank_or_exit(comm, coll, prog, args, 1, local_rank));
    };
    if env.as_ref().is_some_and(|e| e.size > 1) {
        return Err("-t cannot be combined with a multi-process launcher".into());
    }
    if coll.has_root() && args.root >= nthreads {
        return Err(format!("root {} is not a rank of {nthreads}", args.root).into());
    }
    // `id` (the bootstrap root, in this process) lives until the ranks are done.
    let id = UniqueId::new(&cfg)?;
    let bytes = id.to_bytes();
    let ok = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..nthreads)
            .map(|r| {
                let (cfg, bytes) = (&cfg, &bytes);
                std::thread::Builder::new()
                    .name(format!("rank{r}"))
                    .spawn_scoped(s, move || -> AnyResult<bool> {
                        let body = || -> AnyResult<bool> {
                            let id = UniqueId::from_bytes(bytes)?;
                            let comm = Communicator::init(&id, nthreads, r, cfg)
                                .map_err(|e| format!("rank {r}: init: {e}"))?;
                            Ok(run_rank_or_exit(comm, coll, prog, args, nthreads, r))
                        };
                        // A panicking rank would leave the others blocked.
                        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
                            Ok(res) => res,
                            Err(_) => fail(prog, &format!("rank {r} panicked")),
                        }
                    })
            })
            .collect::<Result<_, _>>()?;
        let mut ok = true;
        for h in ranks {
            match h.join() {
                Ok(Ok(good)) => ok &= good,
                Ok(Err(e)) => fail(prog, &e.to_string()),
                Err(_) => fail(prog, "a rank thread panicked"),
            }
        }
        Ok::<bool, AnyError>(ok)
    })?;
    Ok(ok)
}

/// Prints the error and ends the process at once: the other ranks of this
/// process may be blocked in a collective with the failed one.
fn fail(prog: &str, msg: &str) -> ! {
    eprint_whole(&format!("{prog}: {msg}\n"));
    std::process::exit(1)
}

/// Writes `text` to stderr in one `write`: `eprintln!` writes each piece
/// separately, and ranks sharing a terminal interleaved mid-line.
fn eprint_whole(text: &str) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// Runs one rank; on error prints it and exits the process.
fn run_rank_or_exit(
    comm: Communicator,
    coll: Collective,
    prog: &str,
    args: &Args,
    nthreads: usize,
    local_rank: usize,
) -> bool {
    let rank = comm.rank();
    match run_rank(comm, coll, prog, args, nthreads, local_rank) {
        Ok(good) => good,
        Err(e) => {
            let msg = e.to_string();
            let tag = format!("rank {rank}:");
            if msg.starts_with(&tag) {
                fail(prog, &msg)
            } else {
                fail(prog, &format!("{tag} {msg}"))
            }
        }
    }
}

/// Runs the whole sweep on one rank; `Ok(false)` on wrong results.
fn run_rank(
    mut comm: Communicator,
    coll: Collective,
    prog: &str,
    args: &Args,
    nthreads: usize,
    local_rank: usize,
) -> AnyResult<bool> {
    let n = comm.size();
    if coll.has_root() && args.root >= n {
        return Err(format!("root {} is not a rank of {n}", args.root).into());
    }
    let ctx = Ctx {
        coll,
        args,
        prog,
        main: comm.rank() == 0,
    };
    print_header(&mut comm, &ctx, nthreads, local_rank)?;
    let mut stats = Stats::default();
    for &dt in &args.dtypes {
        macro_rules! go {
            ($($d:ident => $t:ty),* $(,)?) => {
                match dt { $(DataType::$d => run_type::<$t>(&mut comm, &ctx, &mut stats)?,)* }
            };
        }
        go! {
            Int8 => i8, Uint8 => u8, Int32 => i32, Uint32 => u32, Int64 => i64, Uint64 => u64,
            Float16 => half::f16, Float32 => f32, Float64 => f64, Bfloat16 => half::bf16,
            Float8e4m3 => nccl_rs::fp8::F8E4M3, Float8e5m2 => nccl_rs::fp8::F8E5M2,
        }
    }
    if ctx.main {
        let avg = if stats.bw_count > 0 {
            stats.bw_sum / stats.bw_count as f64
        } else {
            0.0
        };
        for line in table::footer(stats.errors, avg) {
            println!("{line}");
        }
        println!("# Collective test concluded: {prog}");
    }
    // Nobody tears down while a peer's last transfer is unacknowledged.
    comm.finalize()?;
    Ok(stats.errors == 0)
}

/// Bytes per rank in the device report.
const RECORD: usize = 256;

/// Prints the run parameters, one line per rank (gathered from all ranks),
/// and the table header.
fn print_header(
    comm: &mut Communicator,
    ctx: &Ctx<'_>,
    nthreads: usize,
    local_rank: usize,
) -> AnyResult<()> {
    let a = ctx.args;
    if ctx.main {
        let (step, kind) = if a.step_factor > 1 {
            (a.step_factor, "factor")
        } else {
            (a.step_bytes, "bytes")
        };
        println!("# Collective test starting: {}", ctx.prog);
        println!(
            "# nThread {nthreads} nGpus 1 minBytes {} maxBytes {} step: {step}({kind}) warmup iters: {} iters: {} agg iters: {} validation: {} graph: 0",
            a.min_bytes, a.max_bytes, a.warmup_iters, a.iters, a.agg_iters, a.check
        );
        println!("#");
        println!("# Using devices");
    }
    // Each rank's record: pid, device number, host name, memory.
    let (dev, memory) = if a.device {
        let ordinal = crate::device::select(local_rank)?;
        (
            ordinal as u32,
            format!("[{}] device memory", crate::device::describe()),
        )
    } else {
        (local_rank as u32, "[cpu] host memory".to_string())
    };
    let mut rec = [0u8; RECORD];
    rec[..4].copy_from_slice(&std::process::id().to_le_bytes());
    rec[4..8].copy_from_slice(&dev.to_le_bytes());
    let text = format!("{}\0{memory}", hostname());
    let tb = text.as_bytes();
    let len = tb.len().min(RECORD - 9);
    rec[8..8 + len].copy_from_slice(&tb[..len]);
    let mut all = vec![0u8; RECORD * comm.size()];
    comm.all_gather(&rec, &mut all)?;
    if ctx.main {
        for (r, rec) in all.chunks(RECORD).enumerate() {
            let pid = u32::from_le_bytes(rec[..4].try_into().unwrap_or_default());
            let dev = u32::from_le_bytes(rec[4..8].try_into().unwrap_or_default());
            let mut fields = rec[8..].split(|&b| b == 0);
            let host = String::from_utf8_lossy(fields.next().unwrap_or_default());
            let memory = String::from_utf8_lossy(fields.next().unwrap_or_default());
            println!("#  Rank {r:>2} Group  0 Pid {pid:>6} on {host:>10} device {dev:>2} {memory}");
        }
        println!("#");
        for line in table::header() {
            println!("{line}");
        }
    }
    Ok(())
}

/// This host's name up to the first dot, as nccl-tests prints it.
fn hostname() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into());
    let name = name.trim();
    name.split('.').next().unwrap_or(name).to_string()
}

/// The three buffers of one rank, allocated once at the largest size,
/// and with `--device 1` the device buffers the operations use (`send`
/// and `recv` are then the host copies the check fills and reads).
struct Buffers<T: TestElem> {
    send: HostBuf<T>,
    recv: HostBuf<T>,
    expected: Vec<T>,
    device: Option<DeviceBuffers>,
}

/// Host memory of the operations: the heap, or with `-R 1` shared memory
/// that co-located ranks copy between directly.
enum HostBuf<T: TestElem> {
    Heap(Vec<T>),
    Shared(nccl_rs::ShmBuffer<T>),
}

impl<T: TestElem> HostBuf<T> {
    /// `len` elements: shared memory, or heap memory, registered onto
    /// huge pages with `huge`.
    fn new(len: usize, shared: bool, huge: bool) -> AnyResult<HostBuf<T>> {
        Ok(match shared {
            true => HostBuf::Shared(nccl_rs::ShmBuffer::zeroed(len)?),
            false => {
                let v = vec![T::zeroed(); len];
                if huge {
                    nccl_rs::hostmem::register_host_buffer(&v);
                }
                HostBuf::Heap(v)
            }
        })
    }
}

impl<T: TestElem> std::ops::Deref for HostBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            HostBuf::Heap(v) => v,
            HostBuf::Shared(s) => s,
        }
    }
}

impl<T: TestElem> std::ops::DerefMut for HostBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            HostBuf::Heap(v) => v,
            HostBuf::Shared(s) => s,
        }
    }
}

impl<T: TestElem> Buffers<T> {
    /// Runs one operation, `shift` elements into the buffers.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        comm: &mut Communicator,
        coll: Collective,
        op: RedOp,
        root: usize,
        c: &crate::coll::Counts,
        in_place: bool,
        shift: usize,
    ) -> AnyResult<()> {
        match &mut self.device {
            Some(d) => d.run_op::<T>(comm, coll, op, root, c, in_place, shift),
            None => {
                let (s, r) = (&mut self.send[shift..], &mut self.recv[shift..]);
                Ok(run_op(comm, coll, op, root, c, in_place, s, r)?)
            }
        }
    }
}

/// Runs every operation of `-o` (or just one without reduction) in type `T`.
fn run_type<T: TestElem>(
    comm: &mut Communicator,
    ctx: &Ctx<'_>,
    stats: &mut Stats,
) -> AnyResult<()> {
    let max_count = usize::try_from(ctx.args.max_bytes)? / std::mem::size_of::<T>();
    let mut b = Buffers {
        send: HostBuf::new(max_count, ctx.args.register, ctx.args.huge_pages)?,
        recv: HostBuf::new(max_count, ctx.args.register, ctx.args.huge_pages)?,
        expected: vec![T::zeroed(); if ctx.args.check > 0 { max_count } else { 0 }],
        device: match ctx.args.device {
            true => Some(DeviceBuffers::new(
                max_count * std::mem::size_of::<T>(),
                comm,
            )?),
            false => None,
        },
    };
    // Touch every page before timing anything.
    poison(&mut b.send);
    poison(&mut b.recv);
    poison(&mut b.expected);
    let ops: &[RedOp] = if ctx.coll.has_op() {
        &ctx.args.ops
    } else {
        &[RedOp::Sum]
    };
    for &op in ops {
        time_test(comm, ctx, op, &mut b, stats)?;
    }
    Ok(())
}

/// Warms up, then measures every size of the sweep out of place and in
/// place, printing one row per size.
fn time_test<T: TestElem>(
    comm: &mut Communicator,
    ctx: &Ctx<'_>,
    op: RedOp,
    b: &mut Buffers<T>,
    stats: &mut Stats,
) -> AnyResult<()> {
    let (a, coll) = (ctx.args, ctx.coll);
    let (rank, n) = (comm.rank(), comm.size());
    let ts = std::mem::size_of::<T>();
    let max_count = b.send.len();
    let root = a.root;
    let elems = |bytes: u64| (bytes / ts as u64) as usize;

    comm.barrier()?;
    // Warm up at the largest, then the smallest size, as nccl-tests.
    for bytes in [a.max_bytes, a.min_bytes] {
        let c = coll.counts(elems(bytes), n);
        for _ in 0..a.warmup_iters {
            b.run(comm, coll, op, root, &c, !a.places.runs(false), 0)?;
        }
    }

    let gen = generator::<T>(coll, op, n);
    let tol = tolerance::<T>(&gen, op, n);
    let opname = if coll.has_op() { op.name() } else { "none" };
    let root_col = if coll.has_root() { root as i64 } else { -1 };
    for bytes in sweep(a.min_bytes, a.max_bytes, a.step_factor, a.step_bytes)? {
        let c = coll.counts(elems(bytes), n);
        let total = c.total();
        // Move through the buffers from one iteration to the next.
        let steps = max_count.checked_div(total).unwrap_or(1);
        let mut row =
            table::row_prefix(c.size_bytes(ts), c.param, T::DTYPE.name(), opname, root_col);
        for in_place in [false, true] {
            if !a.places.runs(in_place) {
                row += &table::row_skipped();
                continue;
            }
            let checked = a.check > 0 && !(coll == Collective::SendRecv && in_place);
            let mut wrong = 0;
            if checked {
                let place = Place {
                    rank,
                    nranks: n,
                    root,
                    in_place,
                };
                let range = prepare(
                    coll,
                    op,
                    &gen,
                    place,
                    &c,
                    &mut b.send,
                    &mut b.recv,
                    &mut b.expected,
                );
                if let Some(d) = &mut b.device {
                    d.upload(&b.send[..total], &b.recv[..total])?;
                }
                b.run(comm, coll, op, root, &c, in_place, 0)?;
                if let Some(d) = &mut b.device {
                    d.download(&mut b.recv[..total])?;
                }
                if let Some(range) = range {
                    wrong = count_wrong(&b.recv[range], &b.expected[..c.recv], tol);
                }
            } else {
                b.run(comm, coll, op, root, &c, in_place, 0)?;
            }
            comm.barrier()?;
            let secs = time_ops(a.iters * a.agg_iters, |i| {
                let shift = total * (i % steps.max(1));
                b.run(comm, coll, op, root, &c, in_place, shift)
            })?;
            let secs = combine(comm, secs, a.average)?;
            let wrong = if checked {
                Some(sum_count(comm, wrong)?)
            } else {
                None
            };
            let (alg, bus) = coll.bandwidth(c.param, ts, secs, n);
            stats.bw_sum += bus;
            stats.bw_count += 1;
            if wrong.is_some_and(|w| w > 0) {
                stats.errors += 1;
            }
            row += &table::row_body(secs * 1e6, alg, bus, wrong);
        }
        if ctx.main {
            println!("{row}");
        }
    }
    Ok(())
}
