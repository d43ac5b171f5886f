//! The checks, on real processes: the `ddp_train` program is started
//! at 1, 2 and 4 ranks with torchrun-style variables that this test sets
//! itself (1 rank: no launcher variables, the single-process path), under a
//! deadline that kills every child.
//!
//! 1. After training every rank holds bit-identical parameters.
//! 2. The per-epoch loss at N ranks matches single-process training with the
//!    same global batch within 1e-4 relative: data-parallel SGD with `Avg`
//!    over equal shards *is* full-batch SGD; only the order of float sums
//!    differs (measured: ~1e-6 after 30 epochs).
//! 3. Accuracy beats a stated baseline on the held-out split.

use nccl_ddp::data;
use nccl_ddp::run_files::{field, Run};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ddp_train_bin");
const DEADLINE: Duration = Duration::from_secs(60);
const WINE: &str = "--dataset wine --epochs 8 --batch 64 --lr 0.01 --seed 3 --progress never";
/// With 1 KiB buckets no two neighbouring tensors of the 11-64-64-6 MLP fit
/// together, so each of its 6 tensors gets a bucket of its own: 6 all-reduces
/// per step, launched one by one during backward.
const TINY_BUCKETS: &str = "--bucket-bytes 1024";
const PARAMS: usize = 11 * 64 + 64 + 64 * 64 + 64 + 64 * 6 + 6;

/// Launcher variables of other launchers, which would win over ours.
const FOREIGN: &[&str] = &[
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "NCCL_COMM_ID",
];

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn kill_all(children: &mut [Child]) {
    for c in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

fn log_of(dir: &Path, rank: usize) -> String {
    std::fs::read_to_string(dir.join(format!("rank{rank}.out"))).unwrap_or_default()
}

/// Starts `ranks` processes of the program and waits for all of them.
fn launch(name: &str, ranks: usize, flags: &str) -> Run {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ddp-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let port = free_port().to_string();
    let mut children = Vec::new();
    for rank in 0..ranks {
        let out = std::fs::File::create(dir.join(format!("rank{rank}.out"))).expect("log file");
        let mut cmd = Command::new(BIN);
        cmd.args(flags.split_whitespace())
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
        if ranks == 1 {
            cmd.env_remove("RANK").env_remove("WORLD_SIZE");
        } else {
            let r = rank.to_string();
            cmd.env("RANK", &r)
                .env("LOCAL_RANK", &r)
                .env("WORLD_SIZE", ranks.to_string());
            cmd.env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port);
        }
        match cmd.spawn() {
            Ok(c) => children.push(c),
            Err(e) => {
                kill_all(&mut children);
                panic!("spawning {BIN}: {e}");
            }
        }
    }
    let start = Instant::now();
    let mut done = vec![None; ranks];
    while done.iter().any(Option::is_none) {
        for (r, c) in children.iter_mut().enumerate() {
            if done[r].is_none() {
                done[r] = c.try_wait().expect("try_wait");
            }
        }
        let failed = done.iter().position(|s| s.is_some_and(|s| !s.success()));
        if start.elapsed() > DEADLINE || failed.is_some() {
            kill_all(&mut children);
            let logs: String = (0..ranks)
                .map(|r| format!("--- rank {r}:\n{}", log_of(&dir, r)))
                .collect();
            panic!(
                "{name}: {} after {:?}\n{logs}",
                failed.map_or("deadline passed".into(), |r| format!("rank {r} failed")),
                start.elapsed()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Run {
        stdout: log_of(&dir, 0),
        dir,
        ranks,
    }
}

/// The wine runs, shared by the tests: 1 process, 2 ranks (default 25 MiB
/// bucket: one bucket), 4 ranks with tiny buckets.
fn wine(ranks: usize) -> &'static Run {
    static RUNS: [OnceLock<Run>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let (i, flags) = match ranks {
        1 => (0, WINE.to_string()),
        2 => (1, WINE.to_string()),
        4 => (2, format!("{WINE} {TINY_BUCKETS}")),
        _ => unreachable!(),
    };
    RUNS[i].get_or_init(|| launch(&format!("wine{ranks}"), ranks, &flags))
}

#[test]
fn every_rank_holds_bit_identical_parameters() {
    for ranks in [2, 4] {
        let run = wine(ranks);
        let p0 = run.params(0);
        assert_eq!(p0.len(), PARAMS * 4, "raw f32 dump");
        for r in 1..run.ranks {
            assert!(
                run.params(r) == p0,
                "{ranks} ranks: rank {r}'s parameters differ from rank 0's"
            );
        }
    }
    let four = wine(4).epochs();
    let steps = (1599 - 320) / 64;
    assert_eq!(
        field(&four[0], "buckets") as usize,
        steps * 6,
        "6 buckets per step with tiny buckets"
    );
}

#[test]
fn loss_curve_matches_single_process_training() {
    const REL_TOL: f64 = 1e-4;
    let one = wine(1).epochs();
    assert_eq!(one.len(), 8);
    assert!(
        field(&one[7], "train_loss") < field(&one[0], "train_loss") * 0.8,
        "it learns: {one:?}"
    );
    for ranks in [2, 4] {
        let many = wine(ranks).epochs();
        assert_eq!(many.len(), one.len());
        for (a, b) in many.iter().zip(&one) {
            assert_eq!(field(a, "world_size") as usize, ranks);
            for key in ["train_loss", "test_loss"] {
                let (x, y) = (field(a, key), field(b, key));
                assert!(
                    (x - y).abs() <= REL_TOL * y.abs(),
                    "{ranks} ranks, {key}: {x} vs single-process {y}\n{a}\n{b}"
                );
            }
        }
        let (p, q) = (wine(ranks).params(0), wine(1).params(0));
        let max_diff = p.chunks(4).zip(q.chunks(4)).map(|(a, b)| {
            let f = |c: &[u8]| f32::from_le_bytes(c.try_into().expect("4 bytes"));
            (f(a) - f(b)).abs()
        });
        let max_diff = max_diff.fold(0.0f32, f32::max);
        assert!(
            max_diff < 1e-3,
            "{ranks} ranks: parameters drift {max_diff} from single-process"
        );
    }
}

#[test]
fn wine_accuracy_beats_the_majority_class() {
    let majority = data::load("wine", 0.2, 3)
        .expect("dataset")
        .test
        .majority_fraction();
    for ranks in [1, 4] {
        let run = wine(ranks);
        let last = run.epochs().pop().expect("epochs");
        let acc = field(&last, "test_acc");
        assert!(
            acc > majority + 0.05,
            "{ranks} ranks: held-out accuracy {acc} vs majority baseline {majority}"
        );
        assert!(
            run.stdout.contains("epoch 8/8") && run.stdout.contains("samples/s"),
            "rank 0 reports:\n{}",
            run.stdout
        );
    }
}

#[test]
fn iris_reaches_ninety_percent_at_four_ranks() {
    let run = launch(
        "iris4",
        4,
        "--dataset iris --epochs 20 --batch 24 --lr 0.01 --progress never",
    );
    let last = run.epochs().pop().expect("epochs");
    assert!(field(&last, "test_acc") >= 0.9, "held-out accuracy: {last}");
    assert!(field(&last, "train_acc") >= 0.9, "train accuracy: {last}");
}

#[test]
fn bad_flags_fail_cleanly() {
    let help = Command::new(BIN).arg("--help").output().expect("run");
    assert!(
        help.status.success() && String::from_utf8_lossy(&help.stdout).contains("--bucket-bytes")
    );
    let bad = Command::new(BIN)
        .args(["--epochs", "x"])
        .output()
        .expect("run");
    assert_eq!(bad.status.code(), Some(2));
    let mut cmd = Command::new(BIN);
    cmd.args(["--batch", "5000", "--progress", "never"])
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env_remove("RANK")
        .env_remove("WORLD_SIZE");
    for v in FOREIGN {
        cmd.env_remove(v);
    }
    let big = cmd.output().expect("run");
    assert_eq!(big.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&big.stderr).contains("exceeds"),
        "{big:?}"
    );
}
