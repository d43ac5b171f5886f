//! Two processes: the test binary re-runs itself as the peer
//! (`child_peer`). The cross-process tests that read the transport's
//! internal counters are unit tests (`src/transport/shm/tests/process.rs`);
//! the harness is `nccl_rs::testing::peer`.

use super::net;
use nccl_rs::testing::peer::{
    child_mode, connect_to_parent, read_handle, start_peer, write_handle,
};
use nccl_rs::testing::shm::{
    irecv, isend, pattern, patterns, poll, recv_check, send_all, DEADLINE,
};
use nccl_rs::transport::{Net, NetError, NetResult};
use std::time::{Duration, Instant};

/// This module's peer test, as [`spawn_child`](nccl_rs::testing::peer::spawn_child) runs it.
const CHILD_TEST: &str = "process::child_peer";

const ECHO_SIZES: &[usize] = &[0, 1, 7, 4095, 1 << 20, 9 << 20];

/// The peer process. A no-op unless run by one of the tests below.
#[test]
fn child_peer() {
    let Some((mode, dir)) = child_mode() else {
        return;
    };
    let net = net();
    let mut s = connect_to_parent(&net, &dir);
    match mode.as_str() {
        "echo" => {
            let mut l = net.listen().unwrap();
            write_handle(&dir.join("child.handle"), l.handle());
            let mut r = poll("accept", || l.accept()).unwrap();
            // Receive from the parent, check, send the same back.
            recv_check(r.as_mut(), ECHO_SIZES, 40, 1);
            let bufs = patterns(ECHO_SIZES, 40);
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

#[test]
fn cross_process_both_directions() {
    let net = net();
    let (dir, mut child, mut r) = start_peer(&net, CHILD_TEST, "echo");
    let h = read_handle(&dir.join("child.handle"), child.0.as_mut());
    let mut c = net.connect(&h).unwrap();
    let mut s = poll("connect", || c.poll_connect()).unwrap();
    let bufs = patterns(ECHO_SIZES, 40);
    send_all(s.as_mut(), &bufs, 1);
    recv_check(r.as_mut(), ECHO_SIZES, 40, 2);
    child.wait_success();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cross_process_sigkill_gives_closed() {
    let (dir, mut child, mut r) = start_peer(&net(), CHILD_TEST, "stream");
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
