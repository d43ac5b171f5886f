//! Strangers at the rendezvous port of a job started torchrun-style
//! (`MASTER_ADDR`/`MASTER_PORT`): crafted hellos, a duplicate rank claim, a
//! flood of garbage connections. Real processes, real sockets on loopback;
//! every wait has a deadline.

use nccl_tests_suite::launch::{free_port, kill_and_take_logs, spawn_rank, take_log};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Child;
use std::time::{Duration, Instant};

const N: usize = 4;

/// One scenario at a time: each picks a free rendezvous port.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn worker() -> &'static str {
    env!("CARGO_BIN_EXE_fault_worker")
}

/// A well-formed hello frame: `len "NCRH" version secret rank nranks`.
fn hello(secret: [u8; 16], rank: u32, nranks: u32) -> Vec<u8> {
    let mut f = 32u32.to_le_bytes().to_vec();
    f.extend_from_slice(b"NCRH");
    f.extend_from_slice(&1u32.to_le_bytes());
    f.extend_from_slice(&secret);
    f.extend_from_slice(&rank.to_le_bytes());
    f.extend_from_slice(&nranks.to_le_bytes());
    f
}

/// Connects to the root once it listens (rank 0 starts it).
fn connect(port: u16) -> TcpStream {
    let start = Instant::now();
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => {
                s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                return s;
            }
            Err(e) if start.elapsed() > Duration::from_secs(30) => {
                panic!("root never listened on {port}: {e}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// A stranger that sent a hello; `answer` reads the root's reply frame.
struct Stranger(TcpStream);

impl Stranger {
    fn send(port: u16, frame: &[u8]) -> Stranger {
        let mut s = connect(port);
        s.write_all(frame).unwrap();
        Stranger(s)
    }

    fn addr(&self) -> String {
        self.0.local_addr().unwrap().to_string()
    }

    /// The root's first reply frame.
    fn reply(&mut self) -> String {
        let mut len = [0u8; 4];
        self.0.read_exact(&mut len).unwrap();
        let mut b = vec![0u8; u32::from_le_bytes(len).min(4096) as usize];
        self.0.read_exact(&mut b).unwrap();
        String::from_utf8_lossy(&b).into_owned()
    }

    /// The root's reply, or "" if it closed without one.
    fn answer(mut self) -> String {
        let mut b = Vec::new();
        let _ = self.0.read_to_end(&mut b);
        String::from_utf8_lossy(b.get(4..).unwrap_or_default()).into_owned()
    }
}

/// Waits for every child (outer deadline), returning each rank's RESULT
/// line fields `(ok, error)` and its stderr.
fn finish(mut children: Vec<Child>, port: u16, deadline: Duration) -> Vec<(bool, String, String)> {
    let start = Instant::now();
    for c in &mut children {
        loop {
            if c.try_wait().unwrap().is_some() {
                break;
            }
            if start.elapsed() > deadline {
                let logs = kill_and_take_logs(&mut children, port, N);
                panic!("ranks did not finish within {deadline:?}: {logs:#?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    (0..N)
        .map(|r| {
            let out = take_log(port, r, "out");
            let err = take_log(port, r, "err");
            let line = out
                .lines()
                .find(|l| l.starts_with("RESULT "))
                .unwrap_or_else(|| panic!("rank {r} printed no RESULT: {out}\n{err}"))
                .to_string();
            let mut it = line.splitn(5, ' ').skip(2);
            let ok = it.next() == Some("ok");
            let why = it.nth(1).unwrap_or("").to_string();
            (ok, why, err)
        })
        .collect()
}

fn delay_file(port: u16) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("nccl-rs-delay-{}-{port}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

/// Starts rank 0 (with `delayed`, its root listens but its own join waits
/// for `ROOT_DELAY_FILE`), lets `strangers` reach the root, then lets rank 0
/// join and starts the other ranks. Returns each rank's result and what
/// `strangers` returned.
fn job_after<T>(
    env: &[(&str, String)],
    delayed: bool,
    strangers: impl FnOnce(u16) -> T,
    deadline: Duration,
) -> (Vec<(bool, String, String)>, T) {
    let port = free_port();
    let delay = delay_file(port);
    let mut env = env.to_vec();
    if delayed {
        env.push(("ROOT_DELAY_FILE", delay.display().to_string()));
    }
    let mut children = vec![spawn_rank(worker(), &[], (0, N), port, &env)];
    let got = strangers(port);
    std::fs::write(&delay, b"go").unwrap();
    children.extend((1..N).map(|r| spawn_rank(worker(), &[], (r, N), port, &env)));
    let res = finish(children, port, deadline);
    let _ = std::fs::remove_file(&delay);
    (res, got)
}

/// The crash repro: before the real ranks, a stranger sends well-formed,
/// zero-secret hellos claiming 2^32-1 and 50,000,000 ranks, and 300 more
/// connect with garbage. Rank 0's root either knows the size from its
/// launcher (`init_from_env`) or learns it only when rank 0 joins
/// (`ROOT_DELAY_FILE`); either way the strangers are refused, the job
/// completes, and rank 0's log holds a bounded number of lines about them.
#[test]
fn crafted_hellos_are_refused_and_the_job_completes() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for delayed in [true, false] {
        let env = [("FAULT", "none".to_string())];
        let (res, (huge, large, flood)) = job_after(
            &env,
            delayed,
            |port| {
                let huge = Stranger::send(port, &hello([0; 16], 0, u32::MAX));
                let large = Stranger::send(port, &hello([0; 16], 1, 50_000_000));
                let flood: Vec<TcpStream> = (0..300)
                    .map(|_| {
                        let mut s = connect(port);
                        let _ = s.write_all(b"GET / HTTP/1.1\r\n\r\n");
                        s
                    })
                    .collect();
                (huge, large, flood)
            },
            Duration::from_secs(90),
        );
        for (r, (ok, why, err)) in res.iter().enumerate() {
            assert!(ok, "delayed={delayed}: rank {r} failed: {why}\n{err}");
        }
        let (a, b) = (huge.answer(), large.answer());
        assert!(
            a.starts_with("ERR") && a.contains("4294967295 ranks"),
            "{a}"
        );
        assert!(b.starts_with("ERR") && b.contains("50000000 ranks"), "{b}");
        let about_strangers = res[0]
            .2
            .lines()
            .filter(|l| l.contains("bootstrap root") && !l.contains("joined"))
            .count();
        assert!(
            (1..=12).contains(&about_strangers),
            "delayed={delayed}: {about_strangers} lines about strangers:\n{}",
            res[0].2
        );
        drop(flood);
    }
}

/// Each rank's error names a second claim of rank 1 by the stranger at
/// `stranger` and by another address.
fn all_name_the_duplicate(res: &[(bool, String, String)], stranger: &str) {
    for (r, (ok, why, err)) in res.iter().enumerate() {
        assert!(!ok, "rank {r} should have failed");
        assert!(
            why.contains("rank 1 was claimed twice"),
            "rank {r}: {why}\n{err}"
        );
        assert!(why.contains(stranger), "rank {r}: {why}");
        assert_eq!(why.matches("127.0.0.1:").count(), 2, "rank {r}: {why}");
        assert!(why.contains("NCCL_RS_JOB_SECRET"), "rank {r}: {why}");
    }
}

/// Waits (at most 30 s) for `c` to exit.
fn exited(c: &mut Child) {
    let start = Instant::now();
    while c.try_wait().unwrap().is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "rank never exited"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A stranger claims rank 1, then the real rank 1 claims it while the job
/// is still joining: the root refuses the whole job, and every rank (and
/// the stranger) hears why, naming both addresses, at once.
#[test]
fn a_duplicate_rank_claim_fails_every_rank_naming_both_addresses() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let start = Instant::now();
    let port = free_port();
    let delay = delay_file(port);
    let env = [
        ("FAULT", "none".to_string()),
        ("ROOT_DELAY_FILE", delay.display().to_string()),
    ];
    let mut children = vec![spawn_rank(worker(), &[], (0, N), port, &env)];
    let stranger = Stranger::send(port, &hello([0; 16], 1, N as u32));
    children.push(spawn_rank(worker(), &[], (1, N), port, &env));
    exited(&mut children[1]);
    std::fs::write(&delay, b"go").unwrap();
    children.extend((2..N).map(|r| spawn_rank(worker(), &[], (r, N), port, &env)));
    let res = finish(children, port, Duration::from_secs(60));
    let _ = std::fs::remove_file(&delay);
    all_name_the_duplicate(&res, &stranger.addr());
    assert!(stranger.answer().contains("claimed twice"));
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "took {:?}",
        start.elapsed()
    );
}

/// The stranger's claim of rank 1 completes the job before the real rank 1
/// arrives (it took rank 1's place). When the real one claims it during
/// init, the job is aborted on every rank naming both addresses, instead of
/// waiting for the silent stranger until NCCL_RS_BOOTSTRAP_TIMEOUT.
#[test]
fn a_late_claim_of_an_admitted_rank_aborts_the_job() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let start = Instant::now();
    let port = free_port();
    let env = [("FAULT", "none".to_string())];
    let mut children = vec![spawn_rank(worker(), &[], (0, N), port, &env)];
    let mut stranger = Stranger::send(port, &hello([0; 16], 1, N as u32));
    children.extend((2..N).map(|r| spawn_rank(worker(), &[], (r, N), port, &env)));
    assert_eq!(
        stranger.reply(),
        "OK",
        "the stranger was admitted as rank 1"
    );
    children.insert(1, spawn_rank(worker(), &[], (1, N), port, &env));
    let res = finish(children, port, Duration::from_secs(60));
    all_name_the_duplicate(&res, &stranger.addr());
    for (r, (_, why, _)) in res.iter().enumerate() {
        assert!(why.contains("aborting the job"), "rank {r}: {why}");
    }
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "took {:?}",
        start.elapsed()
    );
}

/// With a job secret, the same stranger is dropped unanswered and the job
/// completes.
#[test]
fn with_a_job_secret_a_strangers_claim_is_dropped() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let env = [
        ("FAULT", "none".to_string()),
        (
            "NCCL_RS_JOB_SECRET",
            "00112233445566778899aabbccddeeff".to_string(),
        ),
    ];
    let (res, stranger) = job_after(
        &env,
        true,
        |port| Stranger::send(port, &hello([0; 16], 1, N as u32)),
        Duration::from_secs(90),
    );
    for (r, (ok, why, err)) in res.iter().enumerate() {
        assert!(ok, "rank {r} failed: {why}\n{err}");
    }
    assert_eq!(stranger.answer(), "");
}
