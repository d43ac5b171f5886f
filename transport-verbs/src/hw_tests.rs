//! Hardware tests that need the crate's internals (`#[ignore]`d; run on
//! soft-RoCE by `scripts/rxe/run.sh`, or with `VERBS_TEST_DEVICE=<dev>
//! cargo test -p transport-verbs -- --ignored`).

use crate::connect::{VerbsConnector, VerbsListener};
use crate::error::{VerbsError, WcStatus};
use crate::{VerbsNet, VerbsOptions};
use nccl_net::{Listener, Net, NetError, RecvComm, SendComm};
use std::time::{Duration, Instant};

fn options() -> VerbsOptions {
    let mut o =
        VerbsOptions::from_env_lookup(|k| std::env::var(k).ok()).expect("valid NCCL_IB_* settings");
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
    let mut l = VerbsListener::bind(&net.rails).unwrap();
    let h = crate::wire::VerbsHandle::decode(l.handle()).unwrap();
    let mut c = VerbsConnector::start(&net.rails, &h).unwrap();
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

/// Connects a send and a receive comm of `net` to each other.
fn pair(net: &VerbsNet) -> (crate::comm::VerbsSendComm, crate::comm::VerbsRecvComm) {
    let mut l = VerbsListener::bind(&net.rails).unwrap();
    let h = crate::wire::VerbsHandle::decode(l.handle()).unwrap();
    let mut c = VerbsConnector::start(&net.rails, &h).unwrap();
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
    (s.unwrap(), r.unwrap())
}

/// DMA-BUF registration on a real device: the properties follow the
/// probes; without support `reg_mr_dmabuf` says so (typed, no panic);
/// with support, a descriptor that is not a DMA-BUF is refused cleanly
/// and, where `/dev/udmabuf` exists, a message lands in a DMA-BUF.
#[test]
#[ignore = "needs an RDMA device (VERBS_TEST_DEVICE=rxe0)"]
fn dmabuf_registration_on_the_device() {
    let net = VerbsNet::new(options()).expect("RDMA device");
    let p = net.properties().ptr_support;
    assert_eq!(
        (p.host, p.cuda, p.dmabuf),
        (true, net.peermem_supported(), net.dmabuf_supported())
    );
    eprintln!(
        "{}: DMA-BUF {}, peer memory {}",
        net.device_name(),
        net.dmabuf_supported(),
        net.peermem_supported()
    );
    let (mut s, mut r) = pair(&net);
    let mut host = vec![0u8; 8192];
    if !net.dmabuf_supported() {
        let e = r.reg_mr_dmabuf(host.as_mut_ptr(), 8192, 0, 0).unwrap_err();
        assert!(matches!(e, NetError::Unsupported(_)), "{e}");
        let e = s.reg_mr_dmabuf(host.as_ptr(), 8192, 0, 0).unwrap_err();
        assert!(matches!(e, NetError::Unsupported(_)), "{e}");
        return;
    }
    // A memfd is not a DMA-BUF: the kernel refuses it.
    // SAFETY: a NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"not-a-dmabuf".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    let e = r.reg_mr_dmabuf(host.as_mut_ptr(), 8192, 0, fd).unwrap_err();
    assert!(VerbsError::from_net(&e).is_some(), "{e}");
    // SAFETY: ours, closed once.
    unsafe { libc::close(fd) };
    let Some(buf) = crate::udmabuf::UDmaBuf::new(2 * crate::regcache::PAGE) else {
        eprintln!("/dev/udmabuf is absent: no transfer into a DMA-BUF");
        return;
    };
    let buf = buf.expect("creating a udmabuf");
    // The receive buffer: the DMA-BUF, addressed by its mapping here.
    let mr = r.reg_mr_dmabuf(buf.ptr(), 4096, 0, buf.fd()).unwrap();
    for (i, b) in host.iter_mut().enumerate().take(4096) {
        *b = (i * 7 + 3) as u8;
    }
    let smr = s.reg_mr(host.as_ptr(), 4096).unwrap();
    // SAFETY: both buffers outlive the requests (polled to completion).
    let rq = unsafe { r.irecv(buf.ptr(), 4096, 5, Some(mr)) }
        .unwrap()
        .unwrap();
    // SAFETY: as above.
    let sq = unsafe { s.isend(host.as_ptr(), 4096, 5, Some(smr)) }
        .unwrap()
        .unwrap();
    let (mut sent, mut got) = (false, None);
    let start = Instant::now();
    while !sent || got.is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "transfer timed out"
        );
        sent = sent || s.test(sq).unwrap();
        if got.is_none() {
            got = r.test(rq).unwrap();
        }
    }
    assert_eq!(got, Some(4096));
    // SAFETY: the mapping is 2 pages long; the adapter is done with it.
    let seen = unsafe { std::slice::from_raw_parts(buf.ptr(), 4096) };
    assert_eq!(seen, &host[..4096]);
    r.dereg_mr(mr).unwrap();
    s.dereg_mr(smr).unwrap();
}
