//! `tcp_floor` carries every byte intact each way, prints one row per size
//! with positive times, and refuses bad arguments.

use std::process::Command;

mod common;

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
        let (text, rows) = common::table(&out);
        let sizes: Vec<f64> = rows.iter().map(|r| r[0]).collect();
        assert_eq!(sizes, [1001.0, 45045.0, 2027025.0], "{text}");
        for r in &rows {
            assert_eq!(r.len(), 9, "{text}");
            // Times (µs) then GB/s (which rounds to 0.00 for a slow
            // small message), per way.
            for (k, &x) in r.iter().enumerate().skip(1) {
                assert!(
                    x.is_finite() && (x > 0.0 || (k % 2 == 0 && x == 0.0)),
                    "{text}"
                );
            }
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
