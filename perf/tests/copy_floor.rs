//! `copy_floor` runs, prints one row per size with positive times, and
//! refuses bad arguments.

use std::process::Command;

mod common;

#[test]
fn prints_one_row_per_size() {
    rows_at_distance("0");
    rows_at_distance("4");
}

fn rows_at_distance(d: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_copy_floor"))
        .args(["-b", "4K", "-e", "64K", "-f", "4", "-n", "3", "-d", d])
        .output()
        .unwrap();
    let (text, rows) = common::table(&out);
    assert!(
        text.contains(&format!("destination {d} bytes after")),
        "{text}"
    );
    let sizes: Vec<f64> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(sizes, [4096.0, 16384.0, 65536.0], "{text}");
    for r in &rows {
        assert_eq!(r.len(), 6, "{text}");
        assert!(r[1..].iter().all(|&x| x > 0.0 && x.is_finite()), "{text}");
    }
}

/// `--pair` prints one positive round-trip time (where there are two CPUs)
/// and refuses one CPU twice.
#[test]
fn pair_prints_a_round_trip() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_copy_floor"))
            .args(args)
            .output()
            .unwrap()
    };
    if std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2 {
        let out = run(&["--pair"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ns: f64 = text.trim().parse().unwrap();
        assert!(ns > 0.0 && ns.is_finite(), "{text}");
    }
    assert!(!run(&["--pair", "0", "0"]).status.success());
    assert!(!run(&["--pair", "0"]).status.success());
}

#[test]
fn refuses_bad_arguments() {
    for args in [
        &["-b", "1M", "-e", "1K"][..],
        &["-f", "1"],
        &["-x"],
        &["-b", "lots"],
        &["-d", "4096"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_copy_floor"))
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        assert!(!out.stderr.is_empty(), "{args:?}");
    }
}
