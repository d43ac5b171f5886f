//! NCCL's profiler plugin interface, end to end: a C plugin built here
//! against our header (`nccl-rs/src/profiler/include/nccl_profiler.h`,
//! plugin `tests/profiler/record.c`) is loaded through
//! `NCCL_PROFILER_PLUGIN` by real rank processes (`profiler_worker`) that
//! run every collective and a send/recv group; the event tree it records
//! is checked: every field of every Group, Coll and P2p event, the
//! KernelCh under each, the ProxyOps and ProxySteps under them for network
//! peers (steps, sizes, states, timestamps) and the TCP transport's
//! NetPlugin socket events under the steps (lengths adding up to each
//! step's bytes), bytes sent against bytes received across ranks, and the
//! activation mask.

use nccl_tests_suite::launch::{run_ranks, RankOutput};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const HEADER_DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../nccl-rs/src/profiler/include"
);
const PLUGIN_SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/profiler/record.c");

/// ProxyStep states (`ncclProfilerEventState_t`).
const SEND_WAIT: i64 = 9;
const RECV_WAIT: i64 = 10;
const RECV_GPU_WAIT: i64 = 12;
const OP_IN_PROGRESS: i64 = 19;
const SEND_PEER_WAIT: i64 = 20;
const KERNEL_CH_STOP: i64 = 22;
/// `NCCL_PROFILER_NET_TYPE_SOCK | NCCL_PROFILER_NET_SOCKET_VER`.
const SOCK_V1: &str = "0x20001";

/// A scratch directory of this test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nccl-rs-prof-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// Builds the recording plugin as `dir/file` (`v4`: exporting only v4).
fn build_plugin(dir: &Path, file: &str, v4: bool) -> PathBuf {
    let out = dir.join(file);
    let mut cmd = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cmd.args([
        "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-I", HEADER_DIR, "-o",
    ])
    .arg(&out)
    .arg(PLUGIN_SRC);
    if v4 {
        cmd.arg("-DRECORD_V4");
    }
    let st = cmd.status().expect("run the C compiler (cc)");
    assert!(st.success(), "building the test plugin failed");
    out
}

#[derive(Debug, Default, Clone)]
struct Event {
    id: u64,
    parent: u64,
    ty: String,
    f: BTreeMap<String, String>,
    start: i64,
    /// (state, size or -1, time)
    states: Vec<(i64, i64, i64)>,
    stop: Option<i64>,
}

impl Event {
    fn get(&self, k: &str) -> &str {
        self.f
            .get(k)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("{} has no {k}: {self:?}", self.ty))
    }
    fn num(&self, k: &str) -> i64 {
        self.get(k)
            .parse()
            .unwrap_or_else(|_| panic!("{k} of {self:?}"))
    }
}

struct RankLog {
    init: BTreeMap<String, String>,
    events: Vec<Event>,
    finalized: bool,
}

fn kv(words: &[&str]) -> BTreeMap<String, String> {
    words
        .iter()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn parse(text: &str) -> RankLog {
    let mut log = RankLog {
        init: BTreeMap::new(),
        events: Vec::new(),
        finalized: false,
    };
    let mut at: BTreeMap<u64, usize> = BTreeMap::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let f = kv(&words);
        let id = || f["id"].parse::<u64>().unwrap();
        let t = || f["t"].parse::<i64>().unwrap();
        match words.first().copied() {
            Some("init") => log.init = f.clone(),
            Some("finalize") => log.finalized = true,
            Some("start") => {
                assert!(!at.contains_key(&id()), "id reused: {line}");
                at.insert(id(), log.events.len());
                log.events.push(Event {
                    id: id(),
                    parent: f["parent"].parse().unwrap(),
                    ty: f["type"].clone(),
                    start: t(),
                    f: f.clone(),
                    ..Event::default()
                });
            }
            Some("state") => {
                let e = &mut log.events[at[&id()]];
                assert!(e.stop.is_none(), "state after stop: {line}");
                e.states
                    .push((f["s"].parse().unwrap(), f["size"].parse().unwrap(), t()));
            }
            Some("stop") => {
                let e = &mut log.events[at[&id()]];
                assert!(e.stop.is_none(), "stopped twice: {line}");
                e.stop = Some(t());
            }
            _ => panic!("unexpected line {line:?}"),
        }
    }
    log
}

/// What the worker printed: its pid and each op's (send, recv) addresses.
fn worker_facts(out: &RankOutput) -> (String, Vec<(String, String)>) {
    let mut pid = String::new();
    let mut ops = Vec::new();
    for line in out.stdout.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.first().copied() {
            Some("pid") => pid = w[1].to_string(),
            Some("op") => {
                let f = kv(&w);
                ops.push((f["send"].clone(), f["recv"].clone()));
            }
            _ => {}
        }
    }
    (pid, ops)
}

/// The (algorithm, protocol) pairs the rank named at INFO for collective
/// `func`, in order (a line the first time each pair runs).
fn logged_choices(stderr: &str, func: &str) -> Vec<(String, String)> {
    let key = format!(" {func}: algorithm ");
    stderr
        .lines()
        .filter_map(|line| {
            let rest = &line[line.find(&key)? + key.len()..];
            let (algo, rest) = rest.split_once(", protocol ")?;
            let proto = rest.split(',').next()?;
            Some((algo.to_string(), proto.to_string()))
        })
        .collect()
}

fn run(
    n: usize,
    name: &str,
    plugin_var: &str,
    extra: &[(&str, String)],
) -> (PathBuf, Vec<RankOutput>) {
    let dir = scratch(name);
    let worker = env!("CARGO_BIN_EXE_profiler_worker");
    let mut env = vec![
        ("NCCL_PROFILER_PLUGIN", plugin_var.to_string()),
        ("PROF_DIR", dir.display().to_string()),
        ("NCCL_DEBUG", "INFO".to_string()),
        ("NCCL_RS_TIMEOUT", "60".to_string()),
        // Chunks of 8 KiB: the large all-reduce takes several steps per peer.
        ("NCCL_BUFFSIZE", "65536".to_string()),
    ];
    env.extend(extra.iter().cloned());
    let outs = run_ranks(worker, &[], n, &env, Duration::from_secs(120));
    for o in &outs {
        assert_eq!(
            o.code,
            Some(0),
            "rank {} failed:\n{}\n{}",
            o.rank,
            o.stdout,
            o.stderr
        );
    }
    (dir, outs)
}

fn logs(dir: &Path, n: usize) -> Vec<RankLog> {
    (0..n)
        .map(|r| {
            parse(&std::fs::read_to_string(dir.join(format!("rank-{r}.log"))).expect("plugin log"))
        })
        .collect()
}

/// The calls the worker makes.
const CALLS: usize = 10;
/// The send/recv group among them.
const P2P_CALL: usize = 7;
/// The all-reduce on shared buffers (the zero-copy path where every rank
/// shares the host over shared memory).
const ZC_CALL: usize = 8;
/// The large all-reduce.
const BIG_CALL: usize = 9;

/// The collectives the worker runs, by call: (func, count, root,
/// datatype, seqNumber); `None` for the send/recv group.
fn expected_coll(n: usize, call: usize) -> Option<(&'static str, i64, i64, &'static str, i64)> {
    [
        Some(("AllReduce", 5, 0, "ncclFloat32", 0)),
        Some(("AllReduce", 5, 0, "ncclFloat32", 1)),
        Some(("Broadcast", 3, (1 % n) as i64, "ncclInt32", 0)),
        Some(("Reduce", 4, 0, "ncclFloat64", 0)),
        Some(("AllGather", 2, 0, "ncclUint8", 0)),
        Some(("ReduceScatter", 3, 0, "ncclFloat32", 0)),
        Some(("AllToAll", 2, 0, "ncclInt64", 0)),
        None,
        Some(("AllReduce", 1 << 14, 0, "ncclFloat32", 2)),
        Some(("AllReduce", 1 << 16, 0, "ncclFloat32", 3)),
    ][call]
}

/// Bytes a rank sent to and received from each peer in one call: per
/// peer (sent, received, send steps, receive steps).
type Traffic = Vec<(i64, i64, usize, usize)>;

/// Checks one rank's whole record; returns the per-call traffic.
fn check_rank(
    log: &RankLog,
    out: &RankOutput,
    n: usize,
    (version, zc, net): (i64, bool, bool),
) -> Vec<Traffic> {
    let r = out.rank;
    let (pid, ops) = worker_facts(out);
    assert_eq!(ops.len(), CALLS, "worker output:\n{}", out.stdout);
    let i = &log.init;
    assert_eq!(
        (
            i["v"].as_str(),
            i["rank"].as_str(),
            i["nranks"].as_str(),
            i["nnodes"].as_str(),
            i["name"].as_str()
        ),
        (
            version.to_string().as_str(),
            r.to_string().as_str(),
            n.to_string().as_str(),
            "1",
            "(null)"
        )
    );
    assert!(log.finalized, "rank {r}: no finalize");
    let by_id: BTreeMap<u64, &Event> = log.events.iter().map(|e| (e.id, e)).collect();
    // The tree: Coll and P2p hang under their Group through `parentGroup`
    // in v5 (`parentObj` is the API event, not emitted) and `parentObj` in v4.
    let up = |e: &Event| -> u64 {
        match (e.ty.as_str(), version) {
            ("Coll" | "P2p", 5) => {
                assert_eq!(e.parent, 0, "v5 {} has no API parent", e.ty);
                e.num("group") as u64
            }
            _ => e.parent,
        }
    };
    let kids = |id: u64| -> Vec<&Event> { log.events.iter().filter(|e| up(e) == id).collect() };
    for e in &log.events {
        assert_eq!(e.num("rank"), r as i64);
        let stop = e
            .stop
            .unwrap_or_else(|| panic!("rank {r}: never stopped: {e:?}"));
        let mut t = e.start;
        for &(_, _, st) in &e.states {
            assert!(st >= t, "states out of time order: {e:?}");
            t = st;
        }
        assert!(stop >= t);
        let p = up(e);
        if p != 0 {
            let parent = by_id[&p];
            assert!(
                parent.start <= e.start && e.stop <= parent.stop,
                "child outside its parent: {e:?} {parent:?}"
            );
        }
    }
    let groups = kids(0);
    assert!(
        groups.iter().all(|g| g.ty == "Group"),
        "top level: {groups:?}"
    );
    assert_eq!(groups.len(), CALLS, "one Group per call");
    let mut traffic = Vec::new();
    for (k, g) in groups.iter().enumerate() {
        let tasks = kids(g.id);
        if let Some((func, count, root, dtype, seq)) = expected_coll(n, k) {
            assert_eq!(tasks.len(), 1, "call {k}: {tasks:?}");
            let c = tasks[0];
            // The first call of a collective runs the first algorithm
            // logged for it; a later one, one of those logged.
            let logged = logged_choices(&out.stderr, func);
            let ran = (c.get("algo").to_string(), c.get("proto").to_string());
            let (algo, proto) = match seq {
                _ if k == ZC_CALL && zc => ("ZeroCopy".into(), "Simple".into()),
                0 => logged.first().cloned().unwrap_or_default(),
                _ if logged.contains(&ran) => ran,
                _ => Default::default(),
            };
            let want: BTreeMap<&str, String> = [
                ("type", "Coll".to_string()),
                ("func", func.into()),
                ("seq", seq.to_string()),
                ("send", ops[k].0.clone()),
                ("recv", ops[k].1.clone()),
                ("count", count.to_string()),
                ("root", root.to_string()),
                ("dtype", dtype.into()),
                ("nch", "1".into()),
                ("nwarps", "1".into()),
                ("algo", algo),
                ("proto", proto),
            ]
            .into_iter()
            .collect();
            let got: BTreeMap<&str, String> =
                want.keys().map(|k| (*k, c.get(k).to_string())).collect();
            assert_eq!(got, want, "rank {r} call {k}");
        } else {
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            let got: Vec<(String, String, String, String, String, String)> = tasks
                .iter()
                .map(|e| {
                    let g = |k: &str| e.get(k).to_string();
                    (
                        g("type"),
                        g("func"),
                        g("buff"),
                        g("dtype"),
                        g("count"),
                        g("peer"),
                    )
                })
                .collect();
            let s = |v: &str| v.to_string();
            assert_eq!(
                got,
                vec![
                    (
                        s("P2p"),
                        s("Send"),
                        ops[k].0.clone(),
                        s("ncclFloat32"),
                        s("7"),
                        next.to_string()
                    ),
                    (
                        s("P2p"),
                        s("Recv"),
                        ops[k].1.clone(),
                        s("ncclFloat32"),
                        s("7"),
                        prev.to_string()
                    ),
                ]
            );
            assert!(tasks.iter().all(|e| e.get("nch") == "1"));
        }
        // A KernelCh per task; ProxyOps (network peers only) and their steps.
        let mut t: Traffic = vec![(0, 0, 0, 0); n];
        for task in &tasks {
            let mut seen = Vec::new();
            let (kernel, ops): (Vec<&Event>, Vec<&Event>) =
                kids(task.id).into_iter().partition(|e| e.ty == "KernelCh");
            assert_eq!(kernel.len(), 1, "one KernelCh under {task:?}");
            let k = kernel[0];
            let states: Vec<(i64, bool)> = k
                .states
                .iter()
                .map(|s| (s.0, s.1 >= k.num("ptimer")))
                .collect();
            assert_eq!(
                (k.num("ch"), states),
                (0, vec![(KERNEL_CH_STOP, true)]),
                "{k:?}"
            );
            assert!(k.num("ptimer") > 0 && kids(k.id).is_empty(), "{k:?}");
            if !net {
                assert!(ops.is_empty(), "ProxyOps for shared-memory peers: {ops:?}");
            }
            for op in ops {
                assert_eq!(op.ty, "ProxyOp", "under {task:?}");
                let (peer, send) = (op.num("peer"), op.num("send"));
                assert!(
                    peer >= 0
                        && (peer as usize) < n
                        && peer as usize != r
                        && (send == 0 || send == 1),
                    "{op:?}"
                );
                assert!(
                    !seen.contains(&(peer, send)),
                    "two ProxyOps for one peer and direction: {op:?}"
                );
                seen.push((peer, send));
                assert_eq!((op.get("pid"), op.get("ch")), (pid.as_str(), "0"), "{op:?}");
                let states: Vec<i64> = op.states.iter().map(|s| s.0).collect();
                assert_eq!(states, [OP_IN_PROGRESS], "{op:?}");
                let steps = kids(op.id);
                assert_eq!(steps.len() as i64, op.num("nsteps"), "{op:?}");
                let mut max = 0;
                for (j, st) in steps.iter().enumerate() {
                    assert_eq!((st.ty.as_str(), st.num("step")), ("ProxyStep", j as i64));
                    let seq: Vec<(i64, bool)> = st.states.iter().map(|s| (s.0, s.1 >= 0)).collect();
                    let size = st.states.iter().map(|s| s.1).max().unwrap_or(-1);
                    if send == 1 {
                        assert!(
                            seq == [(SEND_WAIT, true)]
                                || seq == [(SEND_PEER_WAIT, false), (SEND_WAIT, true)],
                            "send step states {st:?}"
                        );
                        t[peer as usize].0 += size;
                        t[peer as usize].2 += 1;
                    } else {
                        assert_eq!(
                            seq,
                            [(RECV_WAIT, true), (RECV_GPU_WAIT, false)],
                            "recv step states {st:?}"
                        );
                        t[peer as usize].1 += size;
                        t[peer as usize].3 += 1;
                    }
                    assert!(size > 0);
                    max = max.max(size);
                    // The socket writes (reads) that carried it: their
                    // lengths add up to the step's bytes.
                    let mut carried = 0;
                    for e in kids(st.id) {
                        assert_eq!(
                            (e.ty.as_str(), e.get("plugin"), e.num("kind"), e.num("op")),
                            ("NetPlugin", SOCK_V1, 1, 1 - send),
                            "{e:?}"
                        );
                        assert!(e.num("fd") > 2 && kids(e.id).is_empty(), "{e:?}");
                        carried += e.num("len");
                    }
                    assert_eq!(carried, size, "NetPlugin events of {st:?}");
                }
                assert_eq!(op.num("chunk"), max, "{op:?}");
            }
            if task.ty == "P2p" && net {
                let want = match task.get("func") {
                    "Send" => (task.num("peer"), 1),
                    _ => (task.num("peer"), 0),
                };
                assert_eq!(seen, [want], "the P2p's ProxyOp");
            }
        }
        traffic.push(t);
    }
    traffic
}

/// Checks every rank of a full-mask run, and the traffic across ranks.
// The loops' indices are ranks and calls, named in the messages.
#[allow(clippy::needless_range_loop)]
fn check_all(n: usize, dir: &Path, outs: &[RankOutput], version: i64, zc: bool) {
    // Shared memory where every rank shares the host and it is enabled
    // (the zero-copy runs); TCP otherwise.
    let net = !zc;
    let logs = logs(dir, n);
    let hash = &logs[0].init["hash"];
    assert!(
        logs.iter().all(|l| &l.init["hash"] == hash),
        "commHash differs between ranks"
    );
    let traffic: Vec<Vec<Traffic>> = logs
        .iter()
        .zip(outs)
        .map(|(l, o)| check_rank(l, o, n, (version, zc, net)))
        .collect();
    if !net {
        // No ProxyOps: nothing more to compare.
        return;
    }
    let most_steps = (0..n)
        .flat_map(|r| traffic[r][BIG_CALL].iter().map(|t| t.2))
        .max();
    assert!(
        most_steps > Some(1),
        "the large all-reduce sends in one step per peer"
    );
    for call in 0..CALLS {
        for a in 0..n {
            for b in 0..n {
                let (sent, _, sends, _) = traffic[a][call][b];
                let (_, got, _, recvs) = traffic[b][call][a];
                assert_eq!(
                    (sent, sends),
                    (got, recvs),
                    "call {call}: rank {a} to rank {b}"
                );
            }
        }
        let received = |r: usize| traffic[r][call].iter().map(|t| t.1).sum::<i64>();
        let sent = |r: usize| traffic[r][call].iter().map(|t| t.0).sum::<i64>();
        let m = n as i64 - 1;
        for r in 0..n {
            // Bytes every algorithm must move, whatever it is.
            match call {
                2 => assert_eq!(
                    received(r),
                    if r == 1 % n { 0 } else { 12 },
                    "broadcast at rank {r}"
                ),
                4 => assert_eq!(received(r), m * 2, "all-gather at rank {r}"),
                6 => assert_eq!(
                    (sent(r), received(r)),
                    (m * 16, m * 16),
                    "all-to-all at rank {r}"
                ),
                P2P_CALL => assert_eq!((sent(r), received(r)), (28, 28), "send/recv at rank {r}"),
                // Reduce: the root receives; the others may only send.
                3 if r == 0 => assert!(received(r) > 0, "reduce at the root"),
                3 => assert!(sent(r) > 0, "reduce at rank {r}"),
                _ => assert!(received(r) > 0 && sent(r) > 0, "call {call} at rank {r}"),
            }
        }
    }
}

#[test]
fn every_collective_at_2_ranks() {
    let dir = scratch("build2");
    let plugin = build_plugin(&dir, "librecord.so", false);
    let (logdir, outs) = run(2, "all2", &plugin.display().to_string(), &[]);
    check_all(2, &logdir, &outs, 5, true);
    clean(&[dir, logdir]);
}

fn clean(dirs: &[PathBuf]) {
    for d in dirs {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[test]
fn every_collective_at_4_ranks() {
    let dir = scratch("build4");
    let plugin = build_plugin(&dir, "librecord.so", false);
    let (logdir, outs) = run(4, "all4", &plugin.display().to_string(), &[]);
    check_all(4, &logdir, &outs, 5, true);
    clean(&[dir, logdir]);
}

/// Over TCP (no shared memory): every send is a request tested to
/// completion, every receive posted ahead.
#[test]
fn every_collective_over_tcp_at_2_ranks() {
    let dir = scratch("buildtcp");
    let plugin = build_plugin(&dir, "librecord.so", false);
    let env = [("NCCL_SHM_DISABLE", "1".to_string())];
    let (logdir, outs) = run(2, "tcp2", &plugin.display().to_string(), &env);
    check_all(2, &logdir, &outs, 5, false);
    clean(&[dir, logdir]);
}

/// Over TCP at 4 ranks: ProxyOps for every peer a schedule talks to.
#[test]
fn every_collective_over_tcp_at_4_ranks() {
    let dir = scratch("buildtcp4");
    let plugin = build_plugin(&dir, "librecord.so", false);
    let env = [("NCCL_SHM_DISABLE", "1".to_string())];
    let (logdir, outs) = run(4, "tcp4", &plugin.display().to_string(), &env);
    check_all(4, &logdir, &outs, 5, false);
    clean(&[dir, logdir]);
}

/// Over TCP with large chunks: the large all-reduce's messages are striped
/// over the data sockets, a NetPlugin event per piece, on distinct sockets.
#[test]
fn striped_messages_over_tcp_report_a_socket_event_per_piece() {
    let dir = scratch("buildstripe");
    let plugin = build_plugin(&dir, "librecord.so", false);
    let env = [
        ("NCCL_SHM_DISABLE", "1".to_string()),
        ("NCCL_BUFFSIZE", (4 << 20).to_string()),
    ];
    let (logdir, outs) = run(2, "stripe", &plugin.display().to_string(), &env);
    check_all(2, &logdir, &outs, 5, false);
    for log in logs(&logdir, 2) {
        // The most sockets one step's events name.
        let most = log
            .events
            .iter()
            .filter(|e| e.ty == "ProxyStep")
            .map(|st| {
                let mut fds: Vec<i64> = log
                    .events
                    .iter()
                    .filter(|e| e.parent == st.id)
                    .map(|e| e.num("fd"))
                    .collect();
                fds.sort();
                fds.dedup();
                fds.len()
            })
            .max();
        assert!(most >= Some(2), "no step striped over sockets");
    }
    clean(&[dir, logdir]);
}

/// A v4-only plugin, found by name as `libnccl-profiler-NAME.so` on the
/// library path: the newest version it exports is used, with v4's tree
/// (Coll and P2p under the Group through `parentObj`).
#[test]
fn a_v4_plugin_found_by_name() {
    let dir = scratch("buildv4");
    build_plugin(&dir, "libnccl-profiler-rec4.so", true);
    let path = dir.display().to_string();
    let (logdir, outs) = run(2, "v4", "rec4", &[("LD_LIBRARY_PATH", path)]);
    check_all(2, &logdir, &outs, 4, true);
    clean(&[dir, logdir]);
}

/// The activation mask: only the types asked for, and their parents (as
/// NCCL: a Coll is started when ProxyOps are asked for, to be their parent).
#[test]
fn the_activation_mask_is_honoured() {
    let dir = scratch("buildmask");
    let plugin = build_plugin(&dir, "librecord.so", false)
        .display()
        .to_string();
    let types_over = |mask: &str, tcp: bool| -> Vec<Vec<(String, usize)>> {
        let mut env = vec![("PROF_MASK", mask.to_string())];
        if tcp {
            env.push(("NCCL_SHM_DISABLE", "1".to_string()));
        }
        let (logdir, _) = run(2, &format!("mask{mask}{tcp}"), &plugin, &env);
        let logs = logs(&logdir, 2);
        clean(&[logdir]);
        logs.iter()
            .map(|l| {
                assert!(l.finalized);
                assert!(l.events.iter().all(|e| e.stop.is_some()));
                let mut count: BTreeMap<String, usize> = BTreeMap::new();
                for e in &l.events {
                    *count.entry(e.ty.clone()).or_default() += 1;
                }
                count.into_iter().collect()
            })
            .collect()
    };
    let types = |mask: &str| types_over(mask, false);
    let s = |t: &str, c: usize| (t.to_string(), c);
    // Coll: the seven collectives, and the Groups (their parents, started
    // for every call as NCCL does; the send/recv group has no P2p).
    assert_eq!(types("2"), vec![vec![s("Coll", 9), s("Group", 10)]; 2]);
    // Group only: one per call.
    assert_eq!(types("1"), vec![vec![s("Group", 10)]; 2]);
    // Nothing: init and finalize only.
    assert_eq!(types("0"), vec![Vec::<(String, usize)>::new(); 2]);
    // The mask is read again for every call: set to 0 when the first
    // Group stops, nothing after the first call.
    let (logdir, _) = run(2, "masklater", &plugin, &[("PROF_MASK_LATER", "0".into())]);
    for l in logs(&logdir, 2) {
        let groups = l.events.iter().filter(|e| e.ty == "Group").count();
        let colls = l.events.iter().filter(|e| e.ty == "Coll").count();
        assert_eq!((groups, colls), (1, 1));
    }
    clean(&[logdir]);
    // ProxyOp: with its parents (Group, Coll, P2p); none over shared
    // memory (no proxy there, as in NCCL), and no steps.
    let parents = vec![s("Coll", 9), s("Group", 10), s("P2p", 2)];
    assert_eq!(types("8"), vec![parents.clone(); 2]);
    for rank in types_over("8", true) {
        let names: Vec<&str> = rank.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(names, ["Coll", "Group", "P2p", "ProxyOp"]);
        assert_eq!(rank[..3], parents[..]);
    }
    // KernelCh: one per collective and per send or receive.
    let mut kernel = parents.clone();
    kernel.insert(2, s("KernelCh", 11));
    assert_eq!(types("64"), vec![kernel; 2]);
    // NetPlugin over TCP: with the ProxyOps and ProxySteps above them, and
    // no KernelCh.
    for rank in types_over("128", true) {
        let names: Vec<&str> = rank.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(
            names,
            ["Coll", "Group", "NetPlugin", "P2p", "ProxyOp", "ProxyStep"]
        );
        // A socket event per step at least.
        assert!(rank[2].1 >= rank[5].1 && rank[5].1 > 0, "{rank:?}");
    }
    clean(&[dir]);
}

/// `none` loads nothing; a plugin that cannot be opened is a warning, and
/// the job runs as without one.
#[test]
fn none_or_a_missing_plugin_leaves_the_job_unprofiled() {
    for (name, var) in [
        ("none", "none"),
        ("missing", "/nonexistent/libnccl-profiler-x.so"),
    ] {
        let (logdir, outs) = run(2, name, var, &[]);
        let written: Vec<_> = std::fs::read_dir(&logdir).unwrap().collect();
        assert!(written.is_empty(), "{var}: the plugin ran");
        if name == "missing" {
            for o in &outs {
                assert!(
                    o.stderr.contains("could not open NCCL_PROFILER_PLUGIN"),
                    "rank {}: no warning:\n{}",
                    o.rank,
                    o.stderr
                );
            }
        }
        clean(&[logdir]);
    }
}
