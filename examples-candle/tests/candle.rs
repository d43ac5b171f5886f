//! The checks on real processes: `candle_ddp` launched by `ncclrun`
//! at 1, 2 and 4 ranks, each run under ncclrun's `--timeout` and a deadline
//! of this test's own that kills ncclrun.
//!
//! 1. After training every rank holds bit-identical parameters (the dumped
//!    files, and the program's own all-gathered hash check).
//! 2. The per-epoch loss at 2 and 4 ranks matches the 1-rank run with the
//!    same global batch within 1e-4 relative, for candle-nn's AdamW and for
//!    SGD with momentum: averaging equal shards' mean gradients gives the
//!    global batch's mean gradient, so only the order of float sums differs.
//! 3. The model learns: held-out accuracy beats the majority class.
//!
//! `ncclrun` is taken from `$NCCLRUN`, else from beside the program (build
//! both into one target directory, as `scripts/candle-test.sh` does).

use nccl_ddp::data;
use nccl_ddp::run_files::{field, Run};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_candle_ddp");
const DEADLINE: Duration = Duration::from_secs(180);
const WINE: &str = "--dataset wine --epochs 8 --batch 64 --lr 0.01 --seed 3 --progress never";
/// With 1 KiB buckets each of the 11-64-64-6 MLP's 6 tensors gets a bucket
/// of its own: 6 all-reduces per step.
const TINY_BUCKETS: &str = "--bucket-bytes 1024";
const PARAMS: usize = 11 * 64 + 64 + 64 * 64 + 64 + 64 * 6 + 6;
/// Measured: about 3e-7 after 8 epochs, for both optimizers.
const REL_TOL: f64 = 1e-5;

/// Variables of other launchers, which would win over ncclrun's.
const FOREIGN: &[&str] = &[
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "NCCL_COMM_ID",
    "RANK",
    "WORLD_SIZE",
];

fn ncclrun() -> PathBuf {
    let p = std::env::var_os("NCCLRUN")
        .map_or_else(|| Path::new(BIN).with_file_name("ncclrun"), PathBuf::from);
    assert!(
        p.is_file(),
        "no ncclrun at {} (set NCCLRUN, or build it into this target dir: cargo build --release -p nccl-perf --bin ncclrun)",
        p.display()
    );
    p
}

/// Runs `ncclrun -n ranks candle_ddp flags` and waits for it.
fn launch(name: &str, ranks: usize, flags: &str) -> Run {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("candle-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let out_path = dir.join("out");
    let out = std::fs::File::create(&out_path).expect("log file");
    let mut cmd = Command::new(ncclrun());
    cmd.args(["-n", &ranks.to_string(), "--timeout"])
        .arg(DEADLINE.as_secs().saturating_sub(10).to_string())
        .arg(BIN)
        .args(flags.split_whitespace())
        .arg("--dump-params")
        .arg(dir.join("params.{rank}"))
        .arg("--log-json")
        .arg(dir.join("log.json"))
        .env("NCCL_SOCKET_IFNAME", "lo")
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("dup"))
        .stderr(out);
    for v in FOREIGN {
        cmd.env_remove(v);
    }
    let mut child: Child = cmd.spawn().expect("spawning ncclrun");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break Some(s);
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    match status {
        Some(s) if s.success() => {}
        Some(s) => panic!("{name}: ncclrun {s} after {:?}\n{stdout}", start.elapsed()),
        None => panic!(
            "{name}: deadline passed after {:?}\n{stdout}",
            start.elapsed()
        ),
    }
    Run { dir, ranks, stdout }
}

/// The shared runs: AdamW at 1, 2 and 4 ranks (4 with tiny buckets), SGD
/// with momentum at 1 and 2.
fn run(optim: &str, ranks: usize) -> &'static Run {
    static RUNS: [OnceLock<Run>; 5] = [const { OnceLock::new() }; 5];
    let (i, extra) = match (optim, ranks) {
        ("adamw", 1) => (0, ""),
        ("adamw", 2) => (1, ""),
        ("adamw", 4) => (2, TINY_BUCKETS),
        ("sgd", 1) => (3, ""),
        ("sgd", 2) => (4, ""),
        _ => unreachable!(),
    };
    RUNS[i].get_or_init(|| {
        launch(
            &format!("{optim}{ranks}"),
            ranks,
            &format!("{WINE} --optim {optim} {extra}"),
        )
    })
}

#[test]
fn every_rank_holds_bit_identical_parameters() {
    for (optim, ranks) in [("adamw", 2), ("adamw", 4), ("sgd", 2)] {
        let r = run(optim, ranks);
        let p0 = r.params(0);
        assert_eq!(p0.len(), PARAMS * 4, "raw f32 dump");
        for k in 1..r.ranks {
            assert!(
                r.params(k) == p0,
                "{optim} at {ranks} ranks: rank {k}'s parameters differ from rank 0's"
            );
        }
        assert!(
            r.stdout
                .contains(&format!("identical on all {ranks} rank(s)")),
            "the program's own hash check:\n{}",
            r.stdout
        );
    }
    let four = run("adamw", 4).epochs();
    let steps = (1599 - 320) / 64;
    assert_eq!(
        field(&four[0], "buckets") as usize,
        steps * 6,
        "6 buckets per step with tiny buckets"
    );
    let two = run("adamw", 2).epochs();
    assert_eq!(
        field(&two[0], "buckets") as usize,
        steps,
        "one 25 MiB bucket per step"
    );
}

#[test]
fn loss_curve_matches_single_process_training() {
    for optim in ["adamw", "sgd"] {
        let one = run(optim, 1).epochs();
        assert_eq!(one.len(), 8);
        assert!(
            field(&one[7], "train_loss") < field(&one[0], "train_loss") * 0.9,
            "{optim} learns: {one:?}"
        );
        let many: &[usize] = if optim == "adamw" { &[2, 4] } else { &[2] };
        for &ranks in many {
            let m = run(optim, ranks).epochs();
            assert_eq!(m.len(), one.len());
            for (a, b) in m.iter().zip(&one) {
                assert_eq!(field(a, "world_size") as usize, ranks);
                for key in ["train_loss", "test_loss"] {
                    let (x, y) = (field(a, key), field(b, key));
                    assert!(
                        (x - y).abs() <= REL_TOL * y.abs(),
                        "{optim}, {ranks} ranks, {key}: {x} vs 1 rank {y}\n{a}\n{b}"
                    );
                }
            }
            let (p, q) = (run(optim, ranks).params(0), run(optim, 1).params(0));
            let f = |c: &[u8]| f32::from_le_bytes(c.try_into().expect("4 bytes"));
            let drift = p
                .chunks(4)
                .zip(q.chunks(4))
                .map(|(a, b)| (f(a) - f(b)).abs())
                .fold(0.0f32, f32::max);
            assert!(
                drift < 1e-5,
                "{optim}, {ranks} ranks: parameters drift {drift} from the 1-rank run"
            );
        }
    }
}

#[test]
fn wine_accuracy_beats_the_majority_class() {
    let majority = data::load("wine", 0.2, 3)
        .expect("dataset")
        .test
        .majority_fraction();
    for (optim, ranks) in [("adamw", 1), ("adamw", 4), ("sgd", 2)] {
        let r = run(optim, ranks);
        let last = r.epochs().pop().expect("epochs");
        let acc = field(&last, "test_acc");
        assert!(
            acc > majority + 0.05,
            "{optim} at {ranks} ranks: held-out accuracy {acc} vs majority baseline {majority}"
        );
        assert!(
            r.stdout.contains("epoch 8/8") && r.stdout.contains("candle-nn MLP [11, 64, 64, 6]"),
            "rank 0 reports:\n{}",
            r.stdout
        );
    }
}

#[test]
fn bad_flags_fail_cleanly() {
    let help = Command::new(BIN).arg("--help").output().expect("run");
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(help.status.success() && text.contains("--optim") && text.contains("--bucket-bytes"));
    for bad in [
        &["--optim", "adam"][..],
        &["--epochs", "x"],
        &["--weight-decay"],
    ] {
        let out = Command::new(BIN).args(bad).output().expect("run");
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {out:?}");
    }
}
