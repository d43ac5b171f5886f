//! `fabric_check`: validates a cluster's fabric before a job. Runs on every
//! rank of a job (any launcher); measures every pair of hosts on every rail
//! and an all-reduce, names the outliers, exits 1 when there are any. See
//! `-h` and `docs/fabric_check.md`; the decisions are in
//! `nccl_perf::fcheck`.

use nccl_perf::fcheck::{
    allreduce_bound, allreduce_outlier, batches, find_outliers, json, parse_options,
    parse_snmp_tcp, rounds, table, usage, AllReduce, Matrix, Options, Report,
};
use nccl_rs::bootstrap::UNIQUE_ID_BYTES;
use nccl_rs::{Communicator, Config, RedOp, UniqueId};
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse_options(&args) {
        Ok(Some(o)) => o,
        Ok(None) => {
            print!("{}", usage());
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("fabric_check: {e}");
            return ExitCode::from(2);
        }
    };
    nccl_rs::init_logging();
    match run(&opts) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("fabric_check: {e}");
            ExitCode::from(2)
        }
    }
}

/// A message naming the rank and what failed.
fn fail(rank: usize, what: &str, e: impl std::fmt::Display) -> String {
    format!("rank {rank}: {what}: {e}")
}

/// The configuration of rail `rail`'s communicator: the transport kept to
/// this host's NIC `nic` of that rail (`NCCL_SOCKET_IFNAME=` or
/// `NCCL_IB_HCA=` with `=`, the exact name), its own bootstrap root, and
/// the measurement deadline.
fn rail_config(config: &Config, transport: &str, nic: &str, timeout: Duration) -> Config {
    let mut c = config.clone();
    if transport == "Socket" {
        c.net = Some("Socket".into());
        c.socket_ifname = Some(format!("={nic}"));
    } else {
        c.ib.hca = Some(format!("={nic}"));
    }
    c.comm_id = None;
    c.timeout = timeout;
    c
}

/// This host's TCP `(RetransSegs, OutSegs)` (zeros where unreadable).
fn tcp_counters() -> (u64, u64) {
    std::fs::read_to_string("/proc/net/snmp")
        .ok()
        .and_then(|t| parse_snmp_tcp(&t))
        .unwrap_or((0, 0))
}

fn run(opts: &Options) -> Result<u8, String> {
    let config = Config::from_env().map_err(|e| format!("configuration: {e}"))?;
    let mut comm =
        Communicator::init_from_env(&config).map_err(|e| format!("joining the job: {e}"))?;
    let rank = comm.rank();
    let nranks = comm.size();
    let fabric = comm.fabric().clone();
    let nh = fabric.nhosts();
    let me = fabric.host_of(rank);
    let leader = fabric.local_rank(rank) == 0;
    let rails = if nh >= 2 { fabric.rails() } else { 0 };
    let hosts: Vec<String> = fabric.hosts().iter().map(|h| h.name.clone()).collect();
    let nics: Vec<Vec<String>> = (0..rails)
        .map(|r| {
            fabric
                .hosts()
                .iter()
                .map(|h| h.nics[r].name.clone())
                .collect()
        })
        .collect();
    let mut matrix = Matrix::new(hosts, rails, nics.clone());
    let plan = rounds(nh);
    let timeout = Duration::from_secs_f64(opts.timeout_s);
    let transport = comm.transport_name().to_string();

    if rails > 0 {
        // One communicator per rail between the hosts' first ranks (rank =
        // host index), its transport kept to that rail: host 0's first
        // rank (rank 0) starts their roots and hands out the ids.
        let mut ids = vec![0u8; UNIQUE_ID_BYTES * rails];
        if rank == 0 {
            for (r, slot) in ids.chunks_exact_mut(UNIQUE_ID_BYTES).enumerate() {
                let cfg = rail_config(&config, &transport, &nics[r][me], timeout);
                let id = UniqueId::new(&cfg).map_err(|e| fail(rank, "rail root", e))?;
                slot.copy_from_slice(&id.to_bytes());
            }
        }
        comm.broadcast_in_place(&mut ids, 0)
            .map_err(|e| fail(rank, "sharing rail ids", e))?;
        if leader {
            let mut rail_comms = Vec::with_capacity(rails);
            for (r, bytes) in ids.chunks_exact(UNIQUE_ID_BYTES).enumerate() {
                let cfg = rail_config(&config, &transport, &nics[r][me], timeout);
                let id = UniqueId::from_bytes(bytes).map_err(|e| fail(rank, "rail id", e))?;
                let net = nccl_rs::comm::choose_net(&cfg, me)
                    .map_err(|e| fail(rank, &format!("rail {r} transport"), e))?;
                let c = Communicator::init_with_net(&id, nh, me, &cfg, net)
                    .map_err(|e| fail(rank, &format!("rail {r} communicator"), e))?;
                rail_comms.push(c);
            }
            // The whole schedule `--reps` times over: a link's best pass
            // counts, and its passes lie seconds apart, so that a moment
            // the scheduler starved a busy host spoils one of them only.
            for pass in 0..opts.reps {
                for (r, c) in rail_comms.iter_mut().enumerate() {
                    measure_rail(c, r, me, &plan, opts, pass, &mut matrix)
                        .map_err(|e| fail(rank, &format!("rail {r} ({})", nics[r][me]), e))?;
                }
            }
            for c in &mut rail_comms {
                c.finalize().map_err(|e| fail(rank, "closing a rail", e))?;
            }
        }
        // Every leader filled the cells it measured, the rest are zeros.
        let mut flat = matrix.flat();
        comm.all_reduce_in_place(&mut flat, RedOp::Sum)
            .map_err(|e| fail(rank, "gathering results", e))?;
        matrix.set_flat(&flat);
    }

    let mut allreduce = AllReduce {
        bytes: opts.ar_bytes,
        nranks,
        ..AllReduce::default()
    };
    if opts.ar_bytes >= 4 && nranks >= 2 {
        let mut buf = vec![1.0f32; opts.ar_bytes / 4];
        comm.all_reduce_in_place(&mut buf, RedOp::Sum)
            .map_err(|e| fail(rank, "all-reduce", e))?;
        comm.barrier().map_err(|e| fail(rank, "barrier", e))?;
        // Each iteration's time on the slowest rank; their median, so
        // that a scheduler hiccup in one iteration does not count.
        let mut secs = vec![0.0f64; opts.ar_iters];
        for t in secs.iter_mut() {
            let t0 = Instant::now();
            comm.all_reduce_in_place(&mut buf, RedOp::Sum)
                .map_err(|e| fail(rank, "all-reduce", e))?;
            *t = t0.elapsed().as_secs_f64();
        }
        comm.all_reduce_in_place(&mut secs, RedOp::Max)
            .map_err(|e| fail(rank, "all-reduce time", e))?;
        let secs = [nccl_perf::fcheck::median(&secs)];
        let bytes = (buf.len() * 4) as f64;
        let n = nranks as f64;
        allreduce.busbw_gbps = 2.0 * (n - 1.0) / n * bytes * 8.0 / secs[0] / 1e9;
        let slowest = matrix
            .links()
            .map(|(r, s, d)| matrix.get(r, s, d).gbps)
            .fold(f64::INFINITY, f64::min);
        if slowest.is_finite() {
            allreduce.bound_gbps = allreduce_bound(nranks, nh, rails, slowest);
        }
    }
    let mut outliers = find_outliers(&matrix, &opts.limits);
    outliers.extend(allreduce_outlier(
        allreduce.busbw_gbps,
        allreduce.bound_gbps,
        &opts.limits,
    ));
    let report = Report {
        matrix,
        bytes: opts.bytes,
        iters: opts.iters,
        reps: opts.reps,
        rounds: plan.len(),
        allreduce,
        limits: opts.limits,
        outliers,
    };
    if rank == 0 {
        print!("{}", table(&report));
        if let Some(path) = &opts.json {
            std::fs::write(path, json(&report)).map_err(|e| fail(rank, path, e))?;
        }
    }
    comm.finalize().map_err(|e| fail(rank, "finalize", e))?;
    Ok(if report.outliers.is_empty() { 0 } else { 1 })
}

/// Measures rail `r` on its communicator `c` (rank = host index `me`),
/// pass `pass` of `--reps`: round by round, batch by batch, each pair's
/// latency, then each direction's bandwidth, every leader in step through
/// barriers. A cell keeps the best of the passes (the lowest latency, the
/// highest bandwidth) and the retransmissions of all.
fn measure_rail(
    c: &mut Communicator,
    r: usize,
    me: usize,
    plan: &[Vec<(usize, usize)>],
    opts: &Options,
    pass: usize,
    m: &mut Matrix,
) -> nccl_rs::Result<()> {
    let mut buf = vec![0u8; opts.bytes];
    for round in plan {
        for batch in batches(round, opts.max_pairs) {
            let pair = batch.iter().copied().find(|&(a, b)| a == me || b == me);
            c.barrier()?;
            if let Some((a, b)) = pair {
                latency(c, r, me, a, b, opts.lat_iters, m)?;
            }
            for forward in [true, false] {
                c.barrier()?;
                let Some((a, b)) = pair else { continue };
                let (src, dst) = if forward { (a, b) } else { (b, a) };
                let peer = if me == src { dst } else { src };
                let mut ack = [0u8; 1];
                if me == src {
                    // On the first pass one untimed message first
                    // (connection and TCP warm-up); then one burst closed
                    // by an acknowledgement.
                    if pass == 0 {
                        c.send(&buf, peer)?;
                        c.recv(&mut ack, peer)?;
                    }
                    let (re0, out0) = tcp_counters();
                    let t0 = Instant::now();
                    for _ in 0..opts.iters {
                        c.send(&buf, peer)?;
                    }
                    c.recv(&mut ack, peer)?;
                    let secs = t0.elapsed().as_secs_f64();
                    let (re1, out1) = tcp_counters();
                    let i = m.index(r, src, dst);
                    let cell = &mut m.cells[i];
                    let gbps = (opts.bytes * opts.iters) as f64 * 8.0 / secs / 1e9;
                    cell.gbps = cell.gbps.max(gbps);
                    cell.retrans += re1.saturating_sub(re0);
                    cell.segs += out1.saturating_sub(out0);
                } else {
                    if pass == 0 {
                        c.recv(&mut buf, peer)?;
                        c.send(&ack, peer)?;
                    }
                    for _ in 0..opts.iters {
                        c.recv(&mut buf, peer)?;
                    }
                    c.send(&ack, peer)?;
                }
            }
        }
    }
    Ok(())
}

/// Measures the latency of the pair `(a, b)` on rail `r`: `a` pings `b`
/// `iters` times (after 5 untimed) and keeps half the 10th percentile round
/// trip in both directions' cells, or the value already there if lower.
fn latency(
    c: &mut Communicator,
    r: usize,
    me: usize,
    a: usize,
    b: usize,
    iters: usize,
    m: &mut Matrix,
) -> nccl_rs::Result<()> {
    let mut small = [0u8; 8];
    let peer = if me == a { b } else { a };
    let mut rtts = Vec::with_capacity(iters);
    for i in 0..iters + 5 {
        let t0 = Instant::now();
        if me == a {
            c.send(&small, peer)?;
            c.recv(&mut small, peer)?;
        } else {
            c.recv(&mut small, peer)?;
            c.send(&small, peer)?;
        }
        if i >= 5 {
            rtts.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    if me == a {
        let lat = nccl_perf::fcheck::quantile(&rtts, 0.1) / 2.0;
        for i in [m.index(r, a, b), m.index(r, b, a)] {
            let old = m.cells[i].lat_us;
            m.cells[i].lat_us = if old > 0.0 { old.min(lat) } else { lat };
        }
    }
    Ok(())
}
