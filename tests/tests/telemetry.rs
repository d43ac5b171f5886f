//! Per-peer telemetry, as real processes at 2 and 4 ranks over shared
//! memory and over TCP on loopback: every rank's `Communicator::stats()`
//! byte and message counters, and its Prometheus file's, must equal
//! exactly what the ring and pairwise schedules move (worked out by hand
//! below), and the file must parse as the text exposition format.

use nccl_rs::observe::telemetry::LATENCY_SAMPLE;
use nccl_tests_suite::launch::run_ranks;
use std::collections::BTreeMap;
use std::time::Duration;

/// Bytes per block (`telemetry_worker`'s `BLOCK` f32 elements).
const B: u64 = 1024;
/// Times each collective runs in the first phase.
const REPEAT: u64 = 3;
/// Bytes of the send/recv group's message.
const P2P: u64 = 100;

/// Zero-copy all-reduces (`TELEMETRY_ZERO_COPY=1`).
const ZC_REPEAT: u64 = 2;

/// Payload counters of one peer: (bytes sent, bytes received, messages
/// sent, messages received).
type Counts = (u64, u64, u64, u64);

/// Zero-copy bytes of one peer: (read from it, written into it).
type Direct = (u64, u64);

/// What rank `r` of `n` reads from and writes into each peer's buffers in
/// `zc` zero-copy all-reduces of `n` blocks: it reduces block `r` of every
/// input and writes it to every output.
fn expected_direct(n: usize, r: usize, zc: u64) -> Vec<Direct> {
    (0..n)
        .map(|p| if p == r { (0, 0) } else { (zc * B, zc * B) })
        .collect()
}

/// What rank `r` of `n` must have moved with each peer: `all_reduces`
/// ring all-reduces of `n` blocks, and with `first_phase` also the
/// worker's first phase ([`REPEAT`] × ring all-gather, ring
/// reduce-scatter, ring broadcast from rank 0 and pairwise all-to-all of
/// one block per peer, then one send/recv group to the next rank).
fn expected(n: usize, r: usize, all_reduces: u64, first_phase: bool) -> Vec<Counts> {
    let mut c = vec![(0, 0, 0, 0); n];
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let send = |c: &mut Vec<Counts>, p: usize, msgs: u64, bytes: u64| {
        c[p].0 += msgs * bytes;
        c[p].2 += msgs;
    };
    let recv = |c: &mut Vec<Counts>, p: usize, msgs: u64, bytes: u64| {
        c[p].1 += msgs * bytes;
        c[p].3 += msgs;
    };
    let m = n as u64 - 1;
    // Ring all-reduce: n-1 reduce-scatter steps and n-1 all-gather steps,
    // one block each, to the next rank and from the previous one.
    send(&mut c, next, all_reduces * 2 * m, B);
    recv(&mut c, prev, all_reduces * 2 * m, B);
    if first_phase {
        // Ring all-gather and ring reduce-scatter: n-1 blocks each.
        send(&mut c, next, REPEAT * 2 * m, B);
        recv(&mut c, prev, REPEAT * 2 * m, B);
        // Ring broadcast from 0: a chain 0 -> 1 -> ... -> n-1.
        if r != n - 1 {
            send(&mut c, next, REPEAT, B);
        }
        if r != 0 {
            recv(&mut c, prev, REPEAT, B);
        }
        // Pairwise all-to-all: one block to and from every other rank.
        for p in (0..n).filter(|&p| p != r) {
            send(&mut c, p, REPEAT, B);
            recv(&mut c, p, REPEAT, B);
        }
        send(&mut c, next, 1, P2P);
        recv(&mut c, prev, 1, P2P);
    }
    c
}

/// One sample of a Prometheus text file: metric name and labels.
type Key = (String, BTreeMap<String, String>);

/// A parsed Prometheus text file: the samples, and each family's type.
type Parsed = (BTreeMap<Key, f64>, BTreeMap<String, String>);

/// A small parser of the text exposition format: the samples, and the
/// families declared by `# TYPE` lines (each with its HELP line before).
fn parse_prom(text: &str) -> Result<Parsed, String> {
    let mut samples = BTreeMap::new();
    let mut types = BTreeMap::new();
    let mut helped = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let bad = |why: &str| format!("line {}: {why}: {line:?}", i + 1);
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest
                .split_once(' ')
                .ok_or_else(|| bad("HELP without text"))?;
            if help.is_empty() {
                return Err(bad("empty HELP"));
            }
            helped.push(name.to_string());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest
                .split_once(' ')
                .ok_or_else(|| bad("TYPE without kind"))?;
            if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                return Err(bad("unknown type"));
            }
            if !helped.iter().any(|h| h == name) {
                return Err(bad("TYPE without HELP"));
            }
            if types.insert(name.to_string(), kind.to_string()).is_some() {
                return Err(bad("family declared twice"));
            }
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            return Err(bad("unexpected comment or blank line"));
        }
        let (name, rest) = line.split_once('{').ok_or_else(|| bad("no labels"))?;
        if !name.starts_with("nccl_rs_")
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(bad("bad metric name"));
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .filter_map(|s| name.strip_suffix(s))
            .find(|b| types.get(*b).map(String::as_str) == Some("histogram"))
            .unwrap_or(name);
        if !types.contains_key(family) {
            return Err(bad("sample before its TYPE line"));
        }
        // Labels: k="v" pairs, comma-separated, with \\ \" \n escapes.
        let mut labels = BTreeMap::new();
        let mut chars = rest.chars();
        loop {
            let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
            if chars.next() != Some('"') {
                return Err(bad("label value not quoted"));
            }
            let mut value = String::new();
            loop {
                match chars.next().ok_or_else(|| bad("unterminated label"))? {
                    '\\' => match chars.next() {
                        Some('\\') => value.push('\\'),
                        Some('"') => value.push('"'),
                        Some('n') => value.push('\n'),
                        _ => return Err(bad("bad escape")),
                    },
                    '"' => break,
                    c => value.push(c),
                }
            }
            if labels.insert(key, value).is_some() {
                return Err(bad("repeated label"));
            }
            match chars.next() {
                Some(',') => continue,
                Some('}') => break,
                _ => return Err(bad("bad label separator")),
            }
        }
        let rest: String = chars.collect();
        let value = rest
            .strip_prefix(' ')
            .ok_or_else(|| bad("no value"))?
            .parse::<f64>()
            .map_err(|_| bad("value not a number"))?;
        if samples.insert((name.to_string(), labels), value).is_some() {
            return Err(bad("repeated sample"));
        }
    }
    Ok((samples, types))
}

#[test]
fn prom_parser_rejects_malformed_files() {
    let good = "# HELP nccl_rs_x X.\n# TYPE nccl_rs_x counter\nnccl_rs_x{a=\"q\\\"\",b=\"2\"} 3\n";
    let (samples, types) = parse_prom(good).unwrap();
    assert_eq!(types["nccl_rs_x"], "counter");
    let key = (
        "nccl_rs_x".to_string(),
        BTreeMap::from([("a".into(), "q\"".into()), ("b".into(), "2".into())]),
    );
    assert_eq!(samples[&key], 3.0);
    for bad in [
        "nccl_rs_x{a=\"1\"} 3\n",
        "# TYPE nccl_rs_x counter\nnccl_rs_x{a=\"1\"} 3\n",
        "# HELP nccl_rs_x X.\n# TYPE nccl_rs_x counter\nnccl_rs_x{a=1} 3\n",
        "# HELP nccl_rs_x X.\n# TYPE nccl_rs_x counter\nnccl_rs_x{a=\"1\"} three\n",
        "# HELP nccl_rs_x X.\n# TYPE nccl_rs_x counter\nnccl_rs_x{a=\"1\"} 3\nnccl_rs_x{a=\"1\"} 4\n",
        "# HELP nccl_rs_x X.\n# TYPE nccl_rs_x countr\n",
    ] {
        assert!(parse_prom(bad).is_err(), "accepted {bad:?}");
    }
}

/// The worker's `PEER <phase> ...` lines as counters per peer, and its
/// `LAT <phase> <coll> <calls> <timed> <bucket sum>` lines.
/// Per collective kind: (calls, timed calls, sum of its histogram's buckets).
type Latencies = BTreeMap<String, (u64, u64, u64)>;

/// How many of the calls numbered `from..to` (from 0, per kind) are timed:
/// one in `LATENCY_SAMPLE`, the first included.
fn timed(from: u64, to: u64) -> u64 {
    (from..to).filter(|i| i % LATENCY_SAMPLE == 0).count() as u64
}

fn worker_stats(out: &str, phase: &str) -> (Vec<Counts>, Vec<Direct>, Latencies) {
    let mut peers = Vec::new();
    let mut direct = Vec::new();
    let mut lat = BTreeMap::new();
    for l in out.lines() {
        let f: Vec<&str> = l.split(' ').collect();
        let num = |i: usize| f[i].parse::<u64>().expect("number");
        match f.as_slice() {
            ["PEER", p, ..] if *p == phase => {
                assert_eq!(num(2) as usize, peers.len(), "peers in order");
                assert_eq!(num(7), 0, "errors: {l}");
                peers.push((num(3), num(4), num(5), num(6)));
                direct.push((num(8), num(9)));
            }
            ["LAT", p, coll, ..] if *p == phase => {
                lat.insert(coll.to_string(), (num(3), num(4), num(5)));
            }
            _ => {}
        }
    }
    (peers, direct, lat)
}

fn telemetry_at(n: usize, extra: &[(&str, &str)]) {
    let zc = if extra.contains(&("TELEMETRY_ZERO_COPY", "1")) {
        ZC_REPEAT
    } else {
        0
    };
    let dir = std::env::temp_dir().join(format!(
        "nccl-rs-telemetry-{}-{n}-{}",
        std::process::id(),
        extra.len()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let template = dir.join("nccl-{rank}.prom").display().to_string();
    let mut env = vec![
        ("NCCL_RS_TIMEOUT", "60".to_string()),
        (
            "NCCL_ALGO",
            "allreduce:ring;allgather:ring;reducescatter:ring;broadcast:ring".to_string(),
        ),
        ("NCCL_RS_RING_ORDER", "rank".to_string()),
        ("NCCL_RS_PROM_FILE", template),
        ("NCCL_RS_PROM_INTERVAL_MS", "20".to_string()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    let worker = env!("CARGO_BIN_EXE_telemetry_worker");
    let outs = run_ranks(worker, &[], n, &env, Duration::from_secs(60));
    let mut comm_ids = Vec::new();
    for o in &outs {
        let r = o.rank;
        let ctx = format!("rank {r} of {n} {extra:?}:\n{}{}", o.stdout, o.stderr);
        assert_eq!(o.code, Some(0), "{ctx}");
        assert!(o.stdout.contains("PERIODIC ok\n"), "{ctx}");
        assert!(o.stdout.contains("DONE\n"), "{ctx}");

        // Communicator::stats(), then after reset_stats and one all-reduce.
        let (all, direct, lat) = worker_stats(&o.stdout, "all");
        assert_eq!(all, expected(n, r, REPEAT, true), "stats(): {ctx}");
        assert_eq!(direct, expected_direct(n, r, zc), "zero copy: {ctx}");
        let (after, direct_after, lat_after) = worker_stats(&o.stdout, "reset");
        assert_eq!(after, expected(n, r, 1, false), "after reset: {ctx}");
        assert_eq!(direct_after, expected_direct(n, r, 0), "after reset: {ctx}");
        let calls = |name: &str, phase: &Latencies| phase[name];
        for (coll, want) in [
            ("all_reduce", REPEAT + zc),
            ("all_gather", REPEAT),
            ("reduce_scatter", REPEAT),
            ("broadcast", REPEAT),
            ("all_to_all", REPEAT),
            ("reduce", 0),
            ("gather", 0),
            ("scatter", 0),
            ("send_recv", 1),
        ] {
            let t = timed(0, want);
            assert_eq!(calls(coll, &lat), (want, t, t), "{coll} latencies: {ctx}");
            let after = if coll == "all_reduce" { 1 } else { 0 };
            let t = timed(want, want + after);
            assert_eq!(
                calls(coll, &lat_after),
                (after, t, t),
                "{coll} after reset: {ctx}"
            );
        }

        // The Prometheus file: every counter since creation.
        let path = dir.join(format!("nccl-{r}.prom"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        let (samples, types) = parse_prom(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        for (family, kind) in [
            ("nccl_rs_comm_ranks", "gauge"),
            ("nccl_rs_peer_sent_bytes_total", "counter"),
            ("nccl_rs_peer_received_bytes_total", "counter"),
            ("nccl_rs_peer_sent_messages_total", "counter"),
            ("nccl_rs_peer_received_messages_total", "counter"),
            ("nccl_rs_peer_wait_seconds_total", "counter"),
            ("nccl_rs_peer_errors_total", "counter"),
            ("nccl_rs_peer_retransmits_total", "counter"),
            ("nccl_rs_collective_calls_total", "counter"),
            ("nccl_rs_collective_latency_seconds", "histogram"),
        ] {
            assert_eq!(
                types.get(family).map(String::as_str),
                Some(kind),
                "{family}"
            );
        }
        let comm = samples
            .keys()
            .find(|(name, _)| name == "nccl_rs_comm_ranks")
            .map(|(_, l)| l["comm"].clone())
            .expect("one communicator");
        comm_ids.push(comm.clone());
        let value = |name: &str, extra: &[(&str, String)]| -> Option<f64> {
            let mut labels = BTreeMap::from([
                ("comm".to_string(), comm.clone()),
                ("rank".to_string(), r.to_string()),
            ]);
            labels.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
            samples.get(&(name.to_string(), labels)).copied()
        };
        assert_eq!(value("nccl_rs_comm_ranks", &[]), Some(n as f64));
        let totals = expected(n, r, REPEAT + 1, true);
        for (p, want) in totals.iter().enumerate() {
            let peer = [("peer", p.to_string())];
            let got = |name: &str| value(name, &peer).map(|v| v as u64);
            let got = (
                got("nccl_rs_peer_sent_bytes_total"),
                got("nccl_rs_peer_received_bytes_total"),
                got("nccl_rs_peer_sent_messages_total"),
                got("nccl_rs_peer_received_messages_total"),
            );
            if p == r {
                assert_eq!(got, (None, None, None, None), "no lines for itself");
                continue;
            }
            let want = (Some(want.0), Some(want.1), Some(want.2), Some(want.3));
            assert_eq!(got, want, "peer {p} in {path:?}:\n{text}");
            let direct = (
                value("nccl_rs_peer_direct_read_bytes_total", &peer),
                value("nccl_rs_peer_direct_written_bytes_total", &peer),
            );
            let want = expected_direct(n, r, zc)[p];
            let want = (Some(want.0 as f64), Some(want.1 as f64));
            assert_eq!(direct, want, "peer {p} in {path:?}:\n{text}");
            for kind in ["io", "protocol", "timeout", "other"] {
                let labels = [("peer", p.to_string()), ("kind", kind.to_string())];
                assert_eq!(value("nccl_rs_peer_errors_total", &labels), Some(0.0));
            }
            // Sampled from the transport's link probes: a line per active
            // peer (a loopback socket may retransmit, so only its presence).
            assert!(value("nccl_rs_peer_retransmits_total", &peer).is_some());
        }
        // With zero copy on, every eligible call first exchanges buffer
        // descriptors with every peer: control traffic, apart from payload.
        for p in (0..n).filter(|&p| p != r) {
            let peer = [("peer", p.to_string())];
            let control = value("nccl_rs_peer_control_sent_messages_total", &peer);
            assert_eq!(control.is_some_and(|v| v > 0.0), zc > 0, "control to {p}");
        }
        let hist = "nccl_rs_collective_latency_seconds";
        let coll = |c: &str| [("coll", c.to_string())];
        let all_reduces = REPEAT + zc + 1;
        assert_eq!(
            value("nccl_rs_collective_calls_total", &coll("all_reduce")),
            Some(all_reduces as f64)
        );
        assert_eq!(
            value(&format!("{hist}_count"), &coll("all_reduce")),
            Some(timed(0, all_reduces) as f64)
        );
        let inf = [
            ("coll", "all_reduce".to_string()),
            ("le", "+Inf".to_string()),
        ];
        assert_eq!(
            value(&format!("{hist}_bucket"), &inf),
            Some(timed(0, all_reduces) as f64)
        );
        assert_eq!(
            value(&format!("{hist}_count"), &coll("send_recv")),
            Some(1.0)
        );
        assert_eq!(value(&format!("{hist}_count"), &coll("reduce")), None);
    }
    comm_ids.dedup();
    assert_eq!(
        comm_ids.len(),
        1,
        "one comm label on every rank: {comm_ids:?}"
    );
    // Only the files: every temporary file was renamed.
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let want: Vec<String> = (0..n).map(|r| format!("nccl-{r}.prom")).collect();
    assert_eq!(names, want);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn telemetry_2_ranks_shm() {
    telemetry_at(2, &[]);
}

#[test]
fn telemetry_4_ranks_shm() {
    telemetry_at(4, &[]);
}

/// Over shared memory with shared buffers: the all-reduces on them take
/// the zero-copy path (direct bytes, no messages); the heap buffers' calls
/// now also exchange descriptors first, counted as control traffic, so the
/// payload counters stay those of the schedules.
#[test]
fn telemetry_3_ranks_zero_copy() {
    telemetry_at(
        3,
        &[
            ("TELEMETRY_ZERO_COPY", "1"),
            ("NCCL_RS_ZERO_COPY_MIN_BYTES", "1024"),
        ],
    );
}

#[test]
fn telemetry_2_ranks_tcp() {
    telemetry_at(2, &[("NCCL_SHM_DISABLE", "1")]);
}

#[test]
fn telemetry_4_ranks_tcp() {
    telemetry_at(4, &[("NCCL_SHM_DISABLE", "1")]);
}

/// A peer that never calls: rank 0's all-reduce times out waiting for its
/// data, and its telemetry names that peer: one timeout, and the wait.
#[test]
fn a_stalled_peer_shows_as_a_timeout_and_a_wait() {
    let dir = std::env::temp_dir().join(format!("nccl-rs-telemetry-stall-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let env = [
        ("NCCL_RS_TIMEOUT", "0.5".to_string()),
        ("TELEMETRY_STALL", "1".to_string()),
        (
            "NCCL_RS_PROM_FILE",
            dir.join("nccl-{rank}.prom").display().to_string(),
        ),
        ("NCCL_RS_PROM_INTERVAL_MS", "0".to_string()),
    ];
    let worker = env!("CARGO_BIN_EXE_telemetry_worker");
    let outs = run_ranks(worker, &[], 2, &env, Duration::from_secs(60));
    let o = &outs[0];
    let ctx = format!("{}{}", o.stdout, o.stderr);
    assert_eq!(o.code, Some(0), "{ctx}");
    let line = o
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("STALL "))
        .unwrap_or_else(|| panic!("no STALL line: {ctx}"));
    let f: Vec<u128> = line
        .split(' ')
        .map(|x| x.parse().expect("number"))
        .collect();
    let (failed, elapsed, wait, timeouts, others) = (f[0], f[1], f[2], f[3], f[4]);
    assert_eq!((failed, timeouts, others), (1, 1, 0), "{ctx}");
    // Most of the 0.5 s deadline was spent waiting on rank 1's data.
    assert!(
        wait >= 250_000_000 && wait <= elapsed,
        "wait {wait} ns of {elapsed}: {ctx}"
    );
    // Written once, at destroy (interval 0), with the same counters.
    let text = std::fs::read_to_string(dir.join("nccl-0.prom")).expect("file");
    let (samples, _) = parse_prom(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let find = |name: &str, extra: (&str, &str)| {
        samples
            .iter()
            .find(|((n, l), _)| {
                n == name && l["peer"] == "1" && l.get(extra.0).map(String::as_str) == Some(extra.1)
            })
            .map(|(_, v)| *v)
    };
    assert_eq!(
        find("nccl_rs_peer_errors_total", ("kind", "timeout")),
        Some(1.0),
        "{text}"
    );
    let waited = find("nccl_rs_peer_wait_seconds_total", ("wait", "recv")).expect("wait line");
    assert!(
        (waited - wait as f64 / 1e9).abs() < 1e-9,
        "{waited} s: {text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
