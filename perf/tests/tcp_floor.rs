//! `tcp_floor` carries every byte intact each way, prints one row per size
//! with positive times, and refuses bad arguments.

use std::process::Command;

fn run(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tcp_floor"))
        .args(args)
        .output()
        .unwrap()
}

/// Sizes that do not divide among the sockets, one socket and several,
/// every way: the receiver checks each message byte for byte (`-c`) and
/// fails the run on a wrong one.
#[test]
fn every_way_delivers_and_prints_one_row_per_size() {
    for socks in ["1", "3"] {
        let out = run(&[
            "-b", "1001", "-e", "2M", "-f", "45", "-n", "3", "-s", socks, "-c",
        ]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rows: Vec<Vec<f64>> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split_whitespace().map(|w| w.parse().unwrap()).collect())
            .collect();
        let sizes: Vec<f64> = rows.iter().map(|r| r[0]).collect();
        assert_eq!(sizes, [1001.0, 45045.0, 2027025.0], "{text}");
        for r in &rows {
            assert_eq!(r.len(), 9, "{text}");
            assert!(r[1..].iter().all(|&x| x > 0.0 && x.is_finite()), "{text}");
        }
        assert!(text.contains("# zerocopy: the kernel copied"), "{text}");
    }
}

#[test]
fn refuses_bad_arguments() {
    for args in [
        &["-b", "1M", "-e", "1K"][..],
        &["-f", "1"],
        &["-s", "0"],
        &["-m", "carrier-pigeon"],
        &["-x"],
        &["--receive", "1"],
    ] {
        let out = run(args);
        assert!(!out.status.success(), "{args:?}");
        assert!(!out.stderr.is_empty(), "{args:?}");
    }
}
