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

/// `sent_pkts` of port 1 of RDMA device `dev` (soft-RoCE and most
/// providers have it among the port's hardware counters).
fn sent_pkts(dev: &str) -> u64 {
    let p = format!("/sys/class/infiniband/{dev}/ports/1/hw_counters/sent_pkts");
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{p}: {e}"))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{p}: {e}"))
}

/// Sends `len` bytes of a pattern over `s`/`r` (unregistered buffers, so
/// bounce slots up to 64 KiB and cache registrations above) and checks
/// them bit for bit.
fn transfer_exact(s: &mut dyn SendComm, r: &mut dyn RecvComm, len: usize, tag: u32) {
    let src: Vec<u8> = (0..len).map(|i| (i * 131 + i / 4099 + 7) as u8).collect();
    let mut dst = vec![0u8; len];
    // SAFETY: both buffers outlive the requests (polled to completion).
    let rq = unsafe { r.irecv(dst.as_mut_ptr(), len, tag, None) }
        .unwrap()
        .unwrap();
    // SAFETY: as above.
    let sq = unsafe { s.isend(src.as_ptr(), len, tag, None) }
        .unwrap()
        .unwrap();
    let (mut sent, mut got) = (false, None);
    let start = Instant::now();
    while !sent || got.is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "transfer of {len} bytes timed out"
        );
        sent = sent || s.test(sq).unwrap();
        if got.is_none() {
            got = r.test(rq).unwrap();
        }
    }
    assert_eq!(got, Some(len));
    assert!(dst == src, "{len} bytes differ");
}

/// Two (or more) rails: `VERBS_TEST_RAILS=rxe0,rxe1` names devices that are
/// each a rail. The net holds them in that order with the summed speed; a
/// connection between two such nets stripes a multi-MiB message over both
/// (each device's `sent_pkts` grows by at least its share in MTU-sized
/// packets) and the bytes arrive exactly; small and bounce-sized messages
/// arrive exactly too.
#[test]
#[ignore = "needs two RDMA devices (VERBS_TEST_RAILS=rxe0,rxe1)"]
fn rails_stripe_large_messages_over_every_device() {
    let Ok(list) = std::env::var("VERBS_TEST_RAILS") else {
        eprintln!("VERBS_TEST_RAILS is unset: no multi-rail run here");
        return;
    };
    let devs: Vec<&str> = list.split(',').map(str::trim).collect();
    assert!(
        devs.len() >= 2,
        "VERBS_TEST_RAILS={list:?}: name two devices"
    );
    let mut o = options();
    o.hca = Some(format!("={list}"));
    let net = VerbsNet::new(o.clone()).expect("RDMA devices");
    let rails = net.rails();
    // The topology's view, found without opening the ports, is the same
    // rails with the addresses in the GIDs the net advertises.
    let sums = crate::rail_summaries(&o).unwrap();
    assert_eq!(
        sums.iter().map(|s| s.port.clone()).collect::<Vec<_>>(),
        rails
    );
    assert_eq!(sums[0].addr, Some(crate::gid::gid_ip(&net.gid())));
    assert!(sums.iter().all(|s| s.addr.is_some()), "{sums:?}");
    let names: Vec<&str> = rails.iter().map(|p| p.device.as_str()).collect();
    // NCCL's order: the device list's, whatever order the variable names.
    let listed: Vec<String> = crate::list_ports()
        .unwrap()
        .into_iter()
        .filter(|p| p.active && devs.contains(&p.device.as_str()))
        .map(|p| p.device)
        .collect();
    assert_eq!(names, listed);
    let mut sorted = names.clone();
    sorted.sort_unstable();
    let mut want = devs.clone();
    want.sort_unstable();
    assert_eq!(sorted, want, "one rail per named device");
    let devs = names;
    assert_eq!(
        net.properties().speed_mbps,
        rails.iter().map(|p| p.speed_mbps).sum::<u64>()
    );
    let (mut s, mut r) = pair(&net);
    transfer_exact(&mut s, &mut r, 100, 1);
    transfer_exact(&mut s, &mut r, 48 << 10, 2);
    let len = 8 << 20;
    let before: Vec<u64> = devs.iter().map(|d| sent_pkts(d)).collect();
    transfer_exact(&mut s, &mut r, len, 3);
    let after: Vec<u64> = devs.iter().map(|d| sent_pkts(d)).collect();
    for (k, d) in devs.iter().enumerate() {
        let mtu = crate::device::mtu_bytes(rails[k].mtu) as u64;
        let share = (len / devs.len()) as u64;
        let delta = after[k] - before[k];
        eprintln!("rail {k} ({d}): {delta} packets sent (MTU {mtu}, share {share} bytes)");
        assert!(
            delta >= share / mtu,
            "rail {k} ({d}) sent {delta} packets, its share needs {}",
            share / mtu
        );
    }
    transfer_exact(&mut s, &mut r, (3 << 20) + 12_345, 4);
}
