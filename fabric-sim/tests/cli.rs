//! `fabric_sim` end to end: every output form, and errors as exit code 2.

use std::process::Command;

fn sim(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fabric_sim"))
        .args(args)
        .output()
        .expect("fabric_sim runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const SMALL: [&str; 8] = [
    "--ranks",
    "16,32",
    "--ranks-per-host",
    "4",
    "--hosts-per-leaf",
    "2",
    "--sizes",
    "1M,4M",
];

#[test]
fn csv_has_a_row_per_combination() {
    let mut args = SMALL.to_vec();
    args.extend(["--algo", "ring,hier", "--oversub", "1,2", "--csv"]);
    let (code, out, err) = sim(&args);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("op,bytes,ranks,oversub,algo,algorithm,time_us"));
    // 2 rank counts x 2 oversubscriptions x 2 sizes x 2 algorithms.
    assert_eq!(lines.len(), 1 + 16);
    assert!(
        lines[1..].iter().all(|l| l.split(',').count() == 13),
        "{out}"
    );
}

#[test]
fn json_table_and_svg() {
    let mut args = SMALL.to_vec();
    args.push("--json");
    let (code, out, _) = sim(&args);
    assert_eq!(code, 0);
    assert!(out.starts_with('[') && out.trim_end().ends_with(']'));
    assert_eq!(out.matches("\"busbw_gbs\"").count(), 4);
    let (code, out, _) = sim(&SMALL);
    assert_eq!(code, 0);
    assert_eq!(
        out.lines().filter(|l| !l.starts_with('#')).count(),
        4,
        "{out}"
    );
    let path = std::env::temp_dir().join(format!("fabric-sim-cli-{}.svg", std::process::id()));
    let mut args = SMALL.to_vec();
    let p = path.to_str().unwrap().to_string();
    args.extend(["--svg", &p]);
    let (code, _, _) = sim(&args);
    assert_eq!(code, 0);
    let svg = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).ok();
    // Two panels (vs size, vs ranks), one line each.
    assert_eq!(svg.matches("<polyline").count(), 2);
}

#[test]
fn bad_arguments_exit_2_with_a_message() {
    for args in [
        &["--ranks", "7"][..],
        &["--op", "allfoo"],
        &["--fabric", "ring-of-fire"],
        &["--sizes", "12Q"],
        &["--topo", "/nonexistent/topology.conf"],
        &["--bogus"],
    ] {
        let (code, _, err) = sim(args);
        assert_eq!(code, 2, "{args:?}");
        assert!(err.starts_with("fabric_sim: "), "{args:?}: {err}");
    }
    let (code, out, _) = sim(&["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("--rails-layout"));
}
