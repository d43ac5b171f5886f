//! The Prometheus text file (`NCCL_RS_PROM_FILE`): every live communicator's
//! telemetry in this process, in the text exposition format that
//! node_exporter's textfile collector reads, written atomically (a
//! temporary file in the same directory, then `rename`) every
//! `NCCL_RS_PROM_INTERVAL_MS` by a background thread and once more when a
//! communicator is destroyed.
//!
//! One file per process: `{rank}` in the path becomes the rank of the
//! first communicator this process created (the job's rank under a
//! launcher) and `{pid}` the process id, so processes sharing a host and a
//! directory write files of their own. Metrics are prefixed `nccl_rs_` and
//! labelled `comm` (the communicator's id, 16 hex digits, the same on every
//! rank), `rank`, and `peer`, `coll`, `le`, `wait`, `kind` where they apply.
//! Counters never go down (`Communicator::reset_stats` does not reset them).

use super::telemetry::{self, CommStats, Telemetry};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

/// `ns` nanoseconds as seconds, exactly (`1.5e-6 s` is `0.000001500`).
pub fn seconds(ns: u64) -> String {
    format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000)
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// `{k="v",...}`.
fn labels(pairs: &[(&str, &str)]) -> String {
    let body: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    format!("{{{}}}", body.join(","))
}

/// One metric family: its HELP and TYPE lines, then `samples`.
fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: &[String]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for s in samples {
        out.push_str(s);
        out.push('\n');
    }
}

/// The text exposition of `comms` (every family's HELP and TYPE lines,
/// even without samples). A peer with nothing counted has no lines, nor
/// does a collective kind with no call.
pub fn render(comms: &[CommStats]) -> String {
    let mut out = String::new();
    let comm_of = |c: &CommStats| format!("{:016x}", c.comm);
    let ranks: Vec<String> = comms
        .iter()
        .map(|c| {
            let l = labels(&[("comm", &comm_of(c)), ("rank", &c.rank.to_string())]);
            format!("nccl_rs_comm_ranks{l} {}", c.nranks)
        })
        .collect();
    family(
        &mut out,
        "nccl_rs_comm_ranks",
        "gauge",
        "Ranks of the communicator.",
        &ranks,
    );
    type Field = fn(&telemetry::PeerStats) -> u64;
    let counters: [(&str, &str, Field); 11] = [
        (
            "nccl_rs_peer_sent_bytes_total",
            "Payload bytes sent to the peer.",
            |p| p.bytes_sent,
        ),
        (
            "nccl_rs_peer_received_bytes_total",
            "Payload bytes received from the peer.",
            |p| p.bytes_recv,
        ),
        (
            "nccl_rs_peer_sent_messages_total",
            "Payload messages sent to the peer.",
            |p| p.msgs_sent,
        ),
        (
            "nccl_rs_peer_received_messages_total",
            "Payload messages received from the peer.",
            |p| p.msgs_recv,
        ),
        (
            "nccl_rs_peer_control_sent_bytes_total",
            "Bytes of the library's own exchanges sent to the peer.",
            |p| p.control_bytes_sent,
        ),
        (
            "nccl_rs_peer_control_received_bytes_total",
            "Bytes of the library's own exchanges received from the peer.",
            |p| p.control_bytes_recv,
        ),
        (
            "nccl_rs_peer_control_sent_messages_total",
            "Messages of the library's own exchanges sent to the peer.",
            |p| p.control_msgs_sent,
        ),
        (
            "nccl_rs_peer_control_received_messages_total",
            "Messages of the library's own exchanges received from the peer.",
            |p| p.control_msgs_recv,
        ),
        (
            "nccl_rs_peer_direct_read_bytes_total",
            "Payload bytes the zero-copy path read straight from the peer's buffers.",
            |p| p.direct_bytes_read,
        ),
        (
            "nccl_rs_peer_direct_written_bytes_total",
            "Payload bytes the zero-copy path wrote straight into the peer's buffers.",
            |p| p.direct_bytes_written,
        ),
        (
            "nccl_rs_peer_retransmits_total",
            "Segments or packets retransmitted on the connections with the peer (kernel or adapter count).",
            |p| p.retransmits,
        ),
    ];
    // Per communicator, its active peers and their base labels.
    type Labelled<'a> = (&'a telemetry::PeerStats, Vec<(&'static str, String)>);
    let active: Vec<Vec<Labelled<'_>>> = comms
        .iter()
        .map(|c| {
            c.peers
                .iter()
                .filter(|p| p.peer != c.rank && !p.is_zero())
                .map(|p| {
                    let base = vec![
                        ("comm", comm_of(c)),
                        ("rank", c.rank.to_string()),
                        ("peer", p.peer.to_string()),
                    ];
                    (p, base)
                })
                .collect()
        })
        .collect();
    let with = |base: &[(&str, String)], extra: &[(&str, &str)]| {
        let mut all: Vec<(&str, &str)> = base.iter().map(|(k, v)| (*k, v.as_str())).collect();
        all.extend_from_slice(extra);
        labels(&all)
    };
    for (name, help, field) in counters {
        let samples: Vec<String> = active
            .iter()
            .flatten()
            .map(|(p, base)| format!("{name}{} {}", with(base, &[]), field(p)))
            .collect();
        family(&mut out, name, "counter", help, &samples);
    }
    let waits: Vec<String> = active
        .iter()
        .flatten()
        .flat_map(|(p, base)| {
            [("recv", p.recv_wait), ("send", p.send_wait)].map(|(w, d)| {
                let ns = d.as_nanos().min(u64::MAX as u128) as u64;
                format!(
                    "nccl_rs_peer_wait_seconds_total{} {}",
                    with(base, &[("wait", w)]),
                    seconds(ns)
                )
            })
        })
        .collect();
    family(
        &mut out,
        "nccl_rs_peer_wait_seconds_total",
        "counter",
        "Time spent idle waiting for the peer's data (wait=recv) or for the peer to take a send (wait=send).",
        &waits,
    );
    let errors: Vec<String> = active
        .iter()
        .flatten()
        .flat_map(|(p, base)| {
            let e = p.errors;
            [
                ("io", e.io),
                ("protocol", e.protocol),
                ("timeout", e.timeout),
                ("other", e.other),
            ]
            .map(|(k, n)| {
                format!(
                    "nccl_rs_peer_errors_total{} {n}",
                    with(base, &[("kind", k)])
                )
            })
        })
        .collect();
    family(
        &mut out,
        "nccl_rs_peer_errors_total",
        "counter",
        "Errors on the connection with the peer, by kind.",
        &errors,
    );
    // Per collective kind: its calls, then the histogram of its timed calls.
    let (mut calls, mut hist) = (Vec::new(), Vec::new());
    for c in comms {
        for h in c.colls.iter().filter(|h| h.calls > 0) {
            let base = [
                ("comm", comm_of(c)),
                ("rank", c.rank.to_string()),
                ("coll", h.coll.to_string()),
            ];
            calls.push(format!(
                "nccl_rs_collective_calls_total{} {}",
                with(&base, &[]),
                h.calls
            ));
            if h.count == 0 {
                continue;
            }
            let name = "nccl_rs_collective_latency_seconds";
            for (up, n) in h.cumulative() {
                let le = up.map_or_else(|| "+Inf".to_string(), seconds);
                hist.push(format!("{name}_bucket{} {n}", with(&base, &[("le", &le)])));
            }
            let sum = h.sum.as_nanos().min(u64::MAX as u128) as u64;
            hist.push(format!("{name}_sum{} {}", with(&base, &[]), seconds(sum)));
            hist.push(format!("{name}_count{} {}", with(&base, &[]), h.count));
        }
    }
    family(
        &mut out,
        "nccl_rs_collective_calls_total",
        "counter",
        "Successful calls on this rank, by collective kind.",
        &calls,
    );
    family(
        &mut out,
        "nccl_rs_collective_latency_seconds",
        "histogram",
        &format!(
            "Time of the timed successful calls on this rank (one in {} of each kind, the first included), by collective kind.",
            crate::observe::telemetry::LATENCY_SAMPLE
        ),
        &hist,
    );
    out
}

/// The path of `template` for a process whose first communicator has
/// `rank`: `{rank}` and `{pid}` replaced.
pub fn expand_path(template: &str, rank: usize, pid: u32) -> PathBuf {
    PathBuf::from(
        template
            .replace("{rank}", &rank.to_string())
            .replace("{pid}", &pid.to_string()),
    )
}

/// Writes `text` to `path` atomically: to a temporary file beside it, then
/// renamed over it, so a reader never sees a partial file.
pub fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other(format!("{}: not a file name", path.display())))?;
    // A leading dot: the textfile collector reads only `*.prom`.
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp.{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// The process's file and writer thread.
struct Writer {
    path: PathBuf,
    interval: Duration,
    /// Communicators registered with the file, still alive.
    users: usize,
    thread_running: bool,
    /// Whether a write failure was logged already (once per process).
    warned: bool,
}

fn writer() -> &'static (Mutex<Option<Writer>>, Condvar) {
    static W: OnceLock<(Mutex<Option<Writer>>, Condvar)> = OnceLock::new();
    W.get_or_init(|| (Mutex::new(None), Condvar::new()))
}

/// The retry counters of the host's RDMA ports (`transport_verbs::hw_counters`),
/// labelled `device`, `port`, `counter`; nothing without ports.
pub fn render_devices(ports: &[transport_verbs::hw_counters::PortRetries]) -> String {
    let mut out = String::new();
    let samples: Vec<String> = ports
        .iter()
        .flat_map(|p| {
            p.counters.iter().map(|(name, v)| {
                let l = labels(&[
                    ("device", &p.device),
                    ("port", &p.port.to_string()),
                    ("counter", name),
                ]);
                format!("nccl_rs_device_retries_total{l} {v}")
            })
        })
        .collect();
    if !samples.is_empty() {
        family(
            &mut out,
            "nccl_rs_device_retries_total",
            "counter",
            "Retry counters of the host's RDMA ports (sysfs hw_counters), by counter.",
            &samples,
        );
    }
    out
}

/// Where RDMA devices are listed.
const SYSFS_INFINIBAND: &str = "/sys/class/infiniband";

/// Writes the file now with every live communicator and the host's RDMA
/// port retry counters (a failure is logged once, never fatal).
fn write_now(w: &mut Writer) {
    let mut text = render(&telemetry::snapshot_all());
    text.push_str(&render_devices(&transport_verbs::hw_counters::read_all(
        Path::new(SYSFS_INFINIBAND),
    )));
    if let Err(e) = write_atomic(&w.path, &text) {
        if !w.warned {
            w.warned = true;
            tracing::warn!("NCCL_RS_PROM_FILE {}: {e}", w.path.display());
        }
    }
}

/// The writer thread: rewrites the file every interval while any
/// communicator uses it.
fn run_writer() {
    let (lock, cv) = writer();
    let mut g = lock.lock().unwrap_or_else(|p| p.into_inner());
    while let Some(interval) = g.as_ref().filter(|w| w.users > 0).map(|w| w.interval) {
        g = cv
            .wait_timeout(g, interval)
            .unwrap_or_else(|p| p.into_inner())
            .0;
        match g.as_mut() {
            Some(w) if w.users > 0 => write_now(w),
            _ => break,
        }
    }
    if let Some(w) = g.as_mut() {
        w.thread_running = false;
    }
}

/// A communicator's place in the process's telemetry: in the live set (for
/// RAS and `snapshot_all`) and, with `NCCL_RS_PROM_FILE`, in the file.
/// Dropping it writes the file a last time with this communicator's final
/// counters, then removes the communicator.
pub(crate) struct Registration {
    tel: Arc<Telemetry>,
    prom: bool,
}

impl Registration {
    /// Registers `tel`; `file` and `interval` are `NCCL_RS_PROM_FILE` and
    /// `NCCL_RS_PROM_INTERVAL_MS` (0: written only at destroy). The
    /// process's first communicator with a file fixes its path.
    pub(crate) fn new(tel: Arc<Telemetry>, file: Option<&str>, interval: Duration) -> Registration {
        telemetry::register(&tel);
        let Some(file) = file else {
            return Registration { tel, prom: false };
        };
        let (lock, cv) = writer();
        let mut g = lock.lock().unwrap_or_else(|p| p.into_inner());
        let w = g.get_or_insert_with(|| Writer {
            path: expand_path(file, tel.rank(), std::process::id()),
            interval,
            users: 0,
            thread_running: false,
            warned: false,
        });
        w.users += 1;
        if !w.interval.is_zero() && !w.thread_running {
            let spawned = std::thread::Builder::new()
                .name("nccl-rs-prom".into())
                .spawn(run_writer);
            match spawned {
                Ok(_) => w.thread_running = true,
                Err(e) => tracing::warn!("NCCL_RS_PROM_FILE: no writer thread ({e})"),
            }
        }
        cv.notify_all();
        Registration { tel, prom: true }
    }

    /// The communicator's telemetry.
    pub(crate) fn telemetry(&self) -> &Arc<Telemetry> {
        &self.tel
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if self.prom {
            let (lock, cv) = writer();
            let mut g = lock.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(w) = g.as_mut() {
                write_now(w);
                w.users = w.users.saturating_sub(1);
            }
            cv.notify_all();
        }
        telemetry::unregister(&self.tel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::telemetry::{ErrorKind, Wait, SEND_RECV};

    #[test]
    fn seconds_are_exact_decimals() {
        let table = [
            (0, "0.000000000"),
            (1, "0.000000001"),
            (1024, "0.000001024"),
            (1_500_000_000, "1.500000000"),
            (68_719_476_736, "68.719476736"),
        ];
        for (ns, s) in table {
            assert_eq!(seconds(ns), s);
        }
    }

    #[test]
    fn paths_expand_rank_and_pid() {
        let table = [
            ("/m/nccl.prom", "/m/nccl.prom"),
            ("/m/nccl-{rank}.prom", "/m/nccl-3.prom"),
            ("/m/{pid}-{rank}-{rank}.prom", "/m/77-3-3.prom"),
        ];
        for (t, want) in table {
            assert_eq!(expand_path(t, 3, 77), PathBuf::from(want));
        }
    }

    #[test]
    fn labels_are_escaped() {
        assert_eq!(
            labels(&[("a", "x\"y\\z\nw"), ("b", "1")]),
            "{a=\"x\\\"y\\\\z\\nw\",b=\"1\"}"
        );
    }

    #[test]
    fn exposition_of_one_communicator() {
        let t = Telemetry::new(0xabc, 1, 3);
        t.sent(false, 2, 4096);
        t.received(false, 0, 1024);
        t.received(false, 0, 1024);
        t.sent(true, 0, 8);
        t.waited(Some(Wait::Recv(0)), Duration::from_nanos(1500));
        t.error(2, ErrorKind::Timeout);
        t.observe(0, Some(Duration::from_nanos(2000)));
        t.observe(0, None);
        t.observe(SEND_RECV, Some(Duration::from_nanos(5000)));
        let text = render(&[t.totals()]);
        let want = "\
# HELP nccl_rs_comm_ranks Ranks of the communicator.
# TYPE nccl_rs_comm_ranks gauge
nccl_rs_comm_ranks{comm=\"0000000000000abc\",rank=\"1\"} 3
# HELP nccl_rs_peer_sent_bytes_total Payload bytes sent to the peer.
# TYPE nccl_rs_peer_sent_bytes_total counter
nccl_rs_peer_sent_bytes_total{comm=\"0000000000000abc\",rank=\"1\",peer=\"0\"} 0
nccl_rs_peer_sent_bytes_total{comm=\"0000000000000abc\",rank=\"1\",peer=\"2\"} 4096
# HELP nccl_rs_peer_received_bytes_total Payload bytes received from the peer.
# TYPE nccl_rs_peer_received_bytes_total counter
nccl_rs_peer_received_bytes_total{comm=\"0000000000000abc\",rank=\"1\",peer=\"0\"} 2048
nccl_rs_peer_received_bytes_total{comm=\"0000000000000abc\",rank=\"1\",peer=\"2\"} 0
";
        assert!(text.starts_with(want), "got:\n{text}");
        let lines: Vec<&str> = text.lines().collect();
        let has = |l: &str| assert!(lines.contains(&l), "missing {l:?} in:\n{text}");
        has("nccl_rs_peer_received_messages_total{comm=\"0000000000000abc\",rank=\"1\",peer=\"0\"} 2");
        has("nccl_rs_peer_control_sent_bytes_total{comm=\"0000000000000abc\",rank=\"1\",peer=\"0\"} 8");
        has("nccl_rs_peer_wait_seconds_total{comm=\"0000000000000abc\",rank=\"1\",peer=\"0\",wait=\"recv\"} 0.000001500");
        has("nccl_rs_peer_wait_seconds_total{comm=\"0000000000000abc\",rank=\"1\",peer=\"0\",wait=\"send\"} 0.000000000");
        has("nccl_rs_peer_errors_total{comm=\"0000000000000abc\",rank=\"1\",peer=\"2\",kind=\"timeout\"} 1");
        has("nccl_rs_peer_retransmits_total{comm=\"0000000000000abc\",rank=\"1\",peer=\"2\"} 0");
        has("# TYPE nccl_rs_collective_calls_total counter");
        has("nccl_rs_collective_calls_total{comm=\"0000000000000abc\",rank=\"1\",coll=\"all_reduce\"} 2");
        has("nccl_rs_collective_calls_total{comm=\"0000000000000abc\",rank=\"1\",coll=\"send_recv\"} 1");
        has("# TYPE nccl_rs_collective_latency_seconds histogram");
        has("nccl_rs_collective_latency_seconds_bucket{comm=\"0000000000000abc\",rank=\"1\",coll=\"all_reduce\",le=\"0.000001024\"} 0");
        has("nccl_rs_collective_latency_seconds_bucket{comm=\"0000000000000abc\",rank=\"1\",coll=\"all_reduce\",le=\"0.000002048\"} 1");
        has("nccl_rs_collective_latency_seconds_bucket{comm=\"0000000000000abc\",rank=\"1\",coll=\"all_reduce\",le=\"+Inf\"} 1");
        has("nccl_rs_collective_latency_seconds_sum{comm=\"0000000000000abc\",rank=\"1\",coll=\"all_reduce\"} 0.000002000");
        has("nccl_rs_collective_latency_seconds_count{comm=\"0000000000000abc\",rank=\"1\",coll=\"all_reduce\"} 1");
        has("nccl_rs_collective_latency_seconds_count{comm=\"0000000000000abc\",rank=\"1\",coll=\"send_recv\"} 1");
        // No line for this rank itself, nor for kinds without calls.
        assert!(!text.contains("peer=\"1\""), "{text}");
        assert!(!text.contains("coll=\"broadcast\""), "{text}");
        // Every sample line: name{labels} value, the name declared by a
        // TYPE line before it.
        let mut declared = Vec::new();
        for l in &lines {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                declared.push(rest.split(' ').next().expect("name").to_string());
                continue;
            }
            if l.starts_with('#') {
                continue;
            }
            let (name, _) = l.split_once('{').expect("labels");
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .filter(|b| declared.iter().any(|d| d == b))
                .unwrap_or(name);
            assert!(declared.iter().any(|d| d == base), "undeclared {name}");
            let value = l.rsplit_once(' ').expect("value").1;
            assert!(value.parse::<f64>().is_ok(), "value of {l:?}");
        }
    }

    #[test]
    fn device_retry_counters_are_one_family() {
        use transport_verbs::hw_counters::PortRetries;
        assert_eq!(render_devices(&[]), "");
        let text = render_devices(&[PortRetries {
            device: "rxe0".into(),
            port: 1,
            counters: vec![("completer_retry_err", 17), ("rcvd_seq_err", 4)],
        }]);
        assert_eq!(
            text,
            "\
# HELP nccl_rs_device_retries_total Retry counters of the host's RDMA ports (sysfs hw_counters), by counter.
# TYPE nccl_rs_device_retries_total counter
nccl_rs_device_retries_total{device=\"rxe0\",port=\"1\",counter=\"completer_retry_err\"} 17
nccl_rs_device_retries_total{device=\"rxe0\",port=\"1\",counter=\"rcvd_seq_err\"} 4
"
        );
    }

    #[test]
    fn empty_exposition_has_only_help_and_type() {
        let text = render(&[]);
        assert!(text.lines().all(|l| l.starts_with("# ")), "{text}");
        assert_eq!(text.lines().filter(|l| l.starts_with("# TYPE")).count(), 16);
    }

    #[test]
    fn atomic_write_replaces_the_file() {
        let dir = std::env::temp_dir().join(format!("nccl-rs-prom-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("x.prom");
        write_atomic(&path, "a 1\n").expect("write");
        write_atomic(&path, "b 2\n").expect("write");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "b 2\n");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("x.prom")]);
        std::fs::remove_dir_all(&dir).expect("clean");
        let err = write_atomic(Path::new("/"), "x").expect_err("no file name");
        assert!(err.to_string().contains("not a file name"), "{err}");
    }
}
