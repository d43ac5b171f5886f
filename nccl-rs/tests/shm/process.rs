//! Two processes: the test binary re-runs itself as the peer
//! (`child_peer`). The cross-process tests that read the transport's
//! internal counters are unit tests (`src/transport/shm/tests/process.rs`).

use super::{irecv, isend, net, pattern, poll, recv_check, send_all, CHILD_ENV, DEADLINE, DIR_ENV};
use nccl_rs::transport::shm::ShmNet;
use nccl_rs::transport::{Net, NetError, NetResult, RecvComm};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

fn test_dir() -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "nccl-rs-shm-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write_handle(path: &Path, handle: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, handle).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn read_handle(path: &Path, child: Option<&mut Child>) -> Vec<u8> {
    let mut child = child;
    poll("handle file", || {
        if let Some(c) = child.as_deref_mut() {
            assert!(c.try_wait().unwrap().is_none(), "peer process exited early");
        }
        Ok(std::fs::read(path).ok())
    })
    .unwrap()
}

fn spawn_child(mode: &str, dir: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "process::child_peer",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, mode)
        .env(DIR_ENV, dir)
        .spawn()
        .unwrap()
}

/// Kills and reaps `child` when dropped (a failed assertion must not leave
/// a peer spinning).
struct Reap(Option<Child>);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

const ECHO_SIZES: &[usize] = &[0, 1, 7, 4095, 1 << 20, 9 << 20];

/// The peer process. A no-op unless run by one of the tests below.
#[test]
fn child_peer() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return;
    };
    let dir = PathBuf::from(std::env::var(DIR_ENV).unwrap());
    let net = net();
    let h = read_handle(&dir.join("parent.handle"), None);
    let mut c = net.connect(&h).unwrap();
    let mut s = poll("connect", || c.poll_connect()).unwrap();
    match mode.as_str() {
        "echo" => {
            let mut l = net.listen().unwrap();
            write_handle(&dir.join("child.handle"), l.handle());
            let mut r = poll("accept", || l.accept()).unwrap();
            // Receive from the parent, check, send the same back.
            recv_check(r.as_mut(), ECHO_SIZES, 40, 1);
            let bufs: Vec<Vec<u8>> = ECHO_SIZES
                .iter()
                .enumerate()
                .map(|(i, &n)| pattern(n, 40 + i as u64))
                .collect();
            send_all(s.as_mut(), &bufs, 2);
        }
        "stream" => {
            let buf = pattern(16 << 20, 77);
            loop {
                let q = isend(s.as_mut(), &buf, 0);
                // Runs until the parent kills us; a deadline guards against
                // a parent that died first.
                if poll("send", || Ok(s.test(q)?.then_some(()))).is_err() {
                    return;
                }
            }
        }
        m => panic!("unknown child mode {m}"),
    }
}

/// Listens, starts the peer process in `mode` and accepts its connection:
/// the test's directory, the transport, the peer and the receiving comm.
fn start_peer(mode: &str) -> (PathBuf, ShmNet, Reap, Box<dyn RecvComm>) {
    let dir = test_dir();
    let net = net();
    let mut l = net.listen().unwrap();
    write_handle(&dir.join("parent.handle"), l.handle());
    let mut child = Reap(Some(spawn_child(mode, &dir)));
    let r = poll("accept", || {
        assert!(
            child.0.as_mut().unwrap().try_wait().unwrap().is_none(),
            "peer exited early"
        );
        l.accept()
    })
    .unwrap();
    (dir, net, child, r)
}

#[test]
fn cross_process_both_directions() {
    let (dir, net, mut child, mut r) = start_peer("echo");
    let h = read_handle(&dir.join("child.handle"), child.0.as_mut());
    let mut c = net.connect(&h).unwrap();
    let mut s = poll("connect", || c.poll_connect()).unwrap();
    let bufs: Vec<Vec<u8>> = ECHO_SIZES
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, 40 + i as u64))
        .collect();
    send_all(s.as_mut(), &bufs, 1);
    recv_check(r.as_mut(), ECHO_SIZES, 40, 2);
    let status = child.0.take().unwrap().wait().unwrap();
    assert!(status.success(), "peer failed: {status}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cross_process_sigkill_gives_closed() {
    let (dir, _net, mut child, mut r) = start_peer("stream");
    let pid = child.0.as_ref().unwrap().id();
    for _ in 0..2 {
        recv_check(r.as_mut(), &[16 << 20], 77, 0);
    }
    // Mid-transfer: the child is blocked on a full ring, inside a message.
    let mut buf = vec![0u8; 16 << 20];
    let mut q = irecv(r.as_mut(), &mut buf, 0);
    let mut killed: Option<Instant> = None;
    let res: NetResult<()> = loop {
        match r.test(q) {
            Ok(None) => {}
            Ok(Some(n)) => {
                // Completed before the kill landed; wait on the next one.
                assert_eq!(n, 16 << 20);
                q = irecv(r.as_mut(), &mut buf, 0);
            }
            Err(e) => break Err(e),
        }
        let t = *killed.get_or_insert_with(|| {
            // SIGKILL, not reaped yet: the peer stays a zombie meanwhile.
            child.0.as_mut().unwrap().kill().unwrap();
            Instant::now()
        });
        assert!(t.elapsed() < DEADLINE, "no error after the peer was killed");
        std::thread::yield_now();
    };
    let killed = killed.unwrap();
    let took = killed.elapsed();
    match res {
        Err(NetError::Closed(m)) => assert!(m.contains(&format!("shm peer pid {pid}")), "{m}"),
        other => panic!("expected Closed, got {other:?}"),
    }
    eprintln!("SHM: peer death noticed {took:?} after SIGKILL");
    assert!(
        took < Duration::from_secs(2),
        "peer death noticed only after {took:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
