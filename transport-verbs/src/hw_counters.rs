//! Retry counters of RDMA device ports, from sysfs
//! (`/sys/class/infiniband/<dev>/ports/<port>/hw_counters/<name>`). The
//! adapter retries lost packets in hardware and reports nothing per queue
//! pair, so these per-port counts are what shows a lossy link; an
//! exhausted retry reaches the transport as an error completion (counted
//! per peer as an `io` error). Drivers name them differently: rxe
//! (soft-RoCE) and mlx5 are known; each port reports the names it has.

use std::io;
use std::path::Path;

/// Retry-related counters: (name, driver, what it counts, whether it is a
/// packet this port retransmitted).
pub const RETRY_COUNTERS: &[(&str, &str, &str, bool)] = &[
    // rxe
    (
        "completer_retry_err",
        "rxe",
        "requests retransmitted after a timeout or NAK",
        true,
    ),
    (
        "retry_exceeded_err",
        "rxe",
        "requests whose retries ran out",
        false,
    ),
    (
        "retry_rnr_exceeded_err",
        "rxe",
        "requests whose RNR retries ran out",
        false,
    ),
    ("rcvd_seq_err", "rxe", "sequence-error NAKs received", false),
    ("rcvd_rnr_err", "rxe", "RNR NAKs received", false),
    ("send_rnr_err", "rxe", "RNR NAKs sent", false),
    (
        "out_of_seq_request",
        "rxe",
        "requests received out of sequence",
        false,
    ),
    // both
    (
        "duplicate_request",
        "rxe, mlx5",
        "retransmitted requests received",
        false,
    ),
    // mlx5
    (
        "local_ack_timeout_err",
        "mlx5",
        "ACK timeouts (each a retransmission)",
        true,
    ),
    (
        "packet_seq_err",
        "mlx5",
        "sequence-error NAKs received (each a retransmission)",
        true,
    ),
    (
        "implied_nak_seq_err",
        "mlx5",
        "implied NAKs (each a retransmission)",
        true,
    ),
    (
        "rnr_nak_retry_err",
        "mlx5",
        "RNR NAKs received whose retries ran out",
        false,
    ),
    (
        "out_of_sequence",
        "mlx5",
        "packets received out of sequence",
        false,
    ),
    ("roce_adp_retrans", "mlx5", "adaptive retransmissions", true),
    (
        "roce_slow_restart",
        "mlx5",
        "slow restarts after a retransmission timeout",
        false,
    ),
];

/// The retry counters one port has.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortRetries {
    /// The device (`rxe0`, `mlx5_0`).
    pub device: String,
    /// The port number.
    pub port: u32,
    /// `(name, value)` for each [`RETRY_COUNTERS`] name the port has, in
    /// that table's order.
    pub counters: Vec<(&'static str, u64)>,
}

impl PortRetries {
    /// Packets this port retransmitted: the sum of the counters that count
    /// retransmissions.
    pub fn retransmits(&self) -> u64 {
        self.counters
            .iter()
            .filter(|(n, _)| RETRY_COUNTERS.iter().any(|c| c.0 == *n && c.3))
            .fold(0u64, |a, (_, v)| a.saturating_add(*v))
    }
}

/// Parses one counter file's text (a decimal number, a newline).
pub fn parse_counter(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// The [`RETRY_COUNTERS`] in `port_dir/hw_counters` (`port_dir` is
/// `.../ports/<n>`): none if the port has no `hw_counters`; an error for a
/// counter file that cannot be read or parsed.
pub fn read_port(port_dir: &Path) -> io::Result<Vec<(&'static str, u64)>> {
    let dir = port_dir.join("hw_counters");
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for &(name, ..) in RETRY_COUNTERS {
        let path = dir.join(name);
        match std::fs::read_to_string(&path) {
            Ok(t) => {
                let v = parse_counter(&t).ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{}: not a counter: {:?}", path.display(), t.trim()),
                    )
                })?;
                out.push((name, v));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
        }
    }
    Ok(out)
}

/// Every port of every device under `root` (`/sys/class/infiniband`) with
/// at least one retry counter, by device and port. Unreadable ports are
/// skipped (logged).
pub fn read_all(root: &Path) -> Vec<PortRetries> {
    let mut devs: Vec<_> = match std::fs::read_dir(root) {
        Ok(d) => d.flatten().map(|e| e.path()).collect(),
        Err(_) => return Vec::new(),
    };
    devs.sort();
    let mut out = Vec::new();
    for dev in devs {
        let Some(device) = dev.file_name().and_then(|n| n.to_str()).map(String::from) else {
            continue;
        };
        let mut ports: Vec<(u32, std::path::PathBuf)> = match std::fs::read_dir(dev.join("ports")) {
            Ok(d) => d
                .flatten()
                .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path())))
                .collect(),
            Err(_) => continue,
        };
        ports.sort();
        for (port, dir) in ports {
            match read_port(&dir) {
                Ok(c) if !c.is_empty() => out.push(PortRetries {
                    device: device.clone(),
                    port,
                    counters: c,
                }),
                Ok(_) => {}
                Err(e) => tracing::debug!("verbs hw_counters: {e}"),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A fake `/sys/class/infiniband` under the temporary directory.
    fn fake_sysfs(tag: &str, files: &[(&str, &str)]) -> PathBuf {
        let root =
            std::env::temp_dir().join(format!("nccl-rs-hw-counters-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (path, text) in files {
            let p = root.join(path);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(&p, text).expect("write");
        }
        root
    }

    #[test]
    fn rxe_and_mlx5_ports_report_the_names_they_have() {
        let root = fake_sysfs(
            "both",
            &[
                ("rxe0/ports/1/hw_counters/completer_retry_err", "17\n"),
                ("rxe0/ports/1/hw_counters/rcvd_seq_err", "4\n"),
                ("rxe0/ports/1/hw_counters/duplicate_request", "3\n"),
                ("rxe0/ports/1/hw_counters/sent_pkts", "123456\n"),
                ("mlx5_0/ports/1/hw_counters/local_ack_timeout_err", "2\n"),
                ("mlx5_0/ports/1/hw_counters/packet_seq_err", "5\n"),
                ("mlx5_0/ports/1/hw_counters/out_of_sequence", "9\n"),
                ("mlx5_0/ports/2/hw_counters/roce_adp_retrans", "1\n"),
                // A port without hw_counters, a device without ports.
                ("mlx5_0/ports/3/state", "4: ACTIVE\n"),
                ("bare/node_type", "1: CA\n"),
            ],
        );
        let got = read_all(&root);
        let want = vec![
            PortRetries {
                device: "mlx5_0".into(),
                port: 1,
                counters: vec![
                    ("local_ack_timeout_err", 2),
                    ("packet_seq_err", 5),
                    ("out_of_sequence", 9),
                ],
            },
            PortRetries {
                device: "mlx5_0".into(),
                port: 2,
                counters: vec![("roce_adp_retrans", 1)],
            },
            PortRetries {
                device: "rxe0".into(),
                port: 1,
                counters: vec![
                    ("completer_retry_err", 17),
                    ("rcvd_seq_err", 4),
                    ("duplicate_request", 3),
                ],
            },
        ];
        assert_eq!(got, want);
        let r: Vec<u64> = got.iter().map(PortRetries::retransmits).collect();
        assert_eq!(r, [7, 1, 17]);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn bad_counters_are_errors_and_missing_roots_are_empty() {
        let root = fake_sysfs(
            "bad",
            &[("rxe0/ports/1/hw_counters/completer_retry_err", "many\n")],
        );
        let e = read_port(&root.join("rxe0/ports/1")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().ends_with("not a counter: \"many\""), "{e}");
        // The bad port is skipped, not a panic.
        assert!(read_all(&root).is_empty());
        assert!(read_all(&root.join("nowhere")).is_empty());
        assert_eq!(parse_counter(" 42\n"), Some(42));
        assert_eq!(parse_counter("-1"), None);
        assert_eq!(parse_counter(""), None);
        let _ = std::fs::remove_dir_all(&root);
    }
}
