//! Hardware tests that need the crate's internals (`#[ignore]`d; run on
//! soft-RoCE by `scripts/rxe/run.sh`, or with `VERBS_TEST_DEVICE=<dev>
//! cargo test -p transport-verbs -- --ignored`).

use crate::connect::{VerbsConnector, VerbsListener};
use crate::error::{VerbsError, WcStatus};
use crate::{VerbsNet, VerbsOptions};
use nccl_net::{Listener, RecvComm};
use std::time::{Duration, Instant};

fn options() -> VerbsOptions {
    let mut o = VerbsOptions::from_env().expect("valid NCCL_IB_* settings");
    if o.hca.is_none() {
        o.hca = std::env::var("VERBS_TEST_DEVICE")
            .ok()
            .map(|d| format!("={d}"));
    }
    o
}

/// A peer whose QPs vanish while its process (side socket) stays: the
/// receiver's clear-to-send write is never acknowledged, and the error
/// names the peer, `IBV_WC_RETRY_EXC_ERR` and the settings to look at.
#[test]
#[ignore = "needs an RDMA device (VERBS_TEST_DEVICE=rxe0)"]
fn retry_exceeded_names_peer_status_and_hint() {
    let mut o = options();
    o.timeout = 8; // 4.096 µs × 2^8 ≈ 1 ms per try
    o.retry_cnt = 1;
    let net = VerbsNet::new(o).expect("RDMA device");
    let mut l = VerbsListener::bind(&net.port).unwrap();
    let h = crate::wire::VerbsHandle::decode(l.handle()).unwrap();
    let mut c = VerbsConnector::start(&net.port, &h).unwrap();
    let (mut s, mut r) = (None, None);
    let start = Instant::now();
    while s.is_none() || r.is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "handshake timed out"
        );
        if s.is_none() {
            s = c.poll_comm().unwrap();
        }
        if r.is_none() {
            r = l.accept_comm().unwrap();
        }
    }
    let (mut s, mut r) = (s.unwrap(), r.unwrap());
    s.destroy_qps_for_test();
    let mut buf = [0u8; 64];
    // SAFETY: `buf` outlives `r`.
    let req = unsafe { r.irecv(buf.as_mut_ptr(), buf.len(), 0, None) }
        .unwrap()
        .unwrap();
    let start = Instant::now();
    let err = loop {
        assert!(start.elapsed() < Duration::from_secs(60), "no retry error");
        match r.test(req) {
            Ok(None) => continue,
            Ok(Some(_)) => panic!("received from a peer without QPs"),
            Err(e) => break e,
        }
    };
    let text = err.to_string();
    eprintln!("after {:?}: {text}", start.elapsed());
    match VerbsError::from_net(&err) {
        Some(VerbsError::Completion { status, peer, .. }) => {
            assert_eq!(*status, WcStatus::RETRY_EXC_ERR, "{text}");
            assert!(text.contains(peer.as_str()) && peer.contains(':'), "{text}");
        }
        other => panic!("expected a completion error, got {other:?}: {text}"),
    }
    assert!(text.contains("IBV_WC_RETRY_EXC_ERR"), "{text}");
    assert!(
        text.contains("stopped answering") && text.contains("NCCL_IB_TIMEOUT"),
        "{text}"
    );
    drop(s);
}
