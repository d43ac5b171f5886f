//! Tests of the shared-memory transport between two processes: the test
//! binary re-runs itself as the peer (`child_peer`). The peers read and set
//! the crate-private `mapped` counters, so these stay unit tests; the
//! public-API cross-process tests are in `nccl-rs/tests/shm/process.rs`;
//! the harness is [`crate::testing::peer`].

use super::cma::cma_default;
use super::{irecv, isend, pattern, poll, recv_check};
use crate::testing::peer::{
    child_mode, connect_to_parent, read_handle, start_peer, write_handle, Reap,
};
use crate::transport::shm::*;
use nccl_net::{RecvComm, SendComm};
use std::path::{Path, PathBuf};

/// This module's peer test, as [`spawn_child`](crate::testing::peer::spawn_child) runs it.
const CHILD_TEST: &str = "transport::shm::tests::process::child_peer";

/// Messages of the "mapped" peer: `(bytes, from a shared buffer)`. The
/// shared ones are single-copy frames the receiver maps (one split, at
/// 9 MiB); the heap ones in between are read by address on the same
/// connection; the small one goes through the ring.
const MAPPED_MSGS: &[(usize, bool)] = &[
    (64 << 10, true),
    ((1 << 20) + 3, true),
    ((1 << 20) + 3, false),
    (100, true),
    (9 << 20, true),
    ((5 << 20) + 7, false),
    ((5 << 20) + 7, true),
];

/// Messages of the "writer" peers: split single-copy messages that the
/// idle sender helps copy into the parent's shared buffer.
const WRITER_SIZES: &[usize] = &[(1 << 20) + 3, 9 << 20, 256 << 10];

/// Sends [`WRITER_SIZES`] (message `i` is `pattern(len, 80 + i)`) from the
/// heap, idle, so the sender copies the back of each into the receiver;
/// leaves how many runs it wrote through a mapping in the file `writes`.
fn send_as_writer(s: &mut dyn SendComm, dir: &Path, refuse_mapping: bool) {
    use crate::transport::shm::mapped::{MAPPED_WRITES, REFUSE_MAPPING};
    REFUSE_MAPPING.with(|r| r.set(refuse_mapping));
    s.hint_copy(nccl_net::CopyHint {
        single_copy: true,
        sender_idle: true,
        receives: false,
        streaming_stores: false,
        buffered_max: 0,
    });
    for (i, &n) in WRITER_SIZES.iter().enumerate() {
        let data = pattern(n, 80 + i as u64);
        let q = isend(s, &data, 4);
        poll("send", || Ok(s.test(q)?.then_some(()))).unwrap();
    }
    let writes = MAPPED_WRITES.with(|n| n.get());
    write_handle(&dir.join("writes"), writes.to_string().as_bytes());
}

/// Sends [`MAPPED_MSGS`] (message `i` is `pattern(len, 60 + i)`), the shared
/// ones from an odd offset into a `ShmBuffer`.
fn send_mapped(s: &mut dyn SendComm) {
    for (i, &(n, shared)) in MAPPED_MSGS.iter().enumerate() {
        let data = pattern(n, 60 + i as u64);
        let mut buf = crate::ShmBuffer::<u8>::zeroed(n + 4096 + 5).unwrap();
        let src: &[u8] = if shared {
            buf[4101..4101 + n].copy_from_slice(&data);
            &buf[4101..4101 + n]
        } else {
            &data
        };
        let q = isend(s, src, 3);
        poll("send", || Ok(s.test(q)?.then_some(()))).unwrap();
    }
}

/// The peer process. A no-op unless run by one of the tests below.
#[test]
fn child_peer() {
    let Some((mode, dir)) = child_mode() else {
        return;
    };
    let mut s = connect_to_parent(&cma_default(), &dir);
    match mode.as_str() {
        "mapped" => {
            // The parent has accepted (so probed single copy) once this
            // exists; before that every message would take the ring.
            read_handle(&dir.join("go"), None);
            send_mapped(s.as_mut())
        }
        "writer" | "writer-refused" => {
            read_handle(&dir.join("go"), None);
            send_as_writer(s.as_mut(), &dir, mode == "writer-refused");
        }
        m => panic!("unknown child mode {m}"),
    }
}

/// Listens over [`cma_default`], starts the peer process in `mode` and
/// accepts its connection: the test's directory, the transport, the peer
/// and the receiving comm.
fn start(mode: &str) -> (PathBuf, ShmNet, Reap, Box<dyn RecvComm>) {
    let net = cma_default();
    let (dir, child, r) = start_peer(&net, CHILD_TEST, mode);
    (dir, net, child, r)
}

/// Receives [`MAPPED_MSGS`] from a "mapped" peer, checking every byte;
/// returns how many frames were copied from a mapping.
fn receive_mapped(refuse_mapping: bool) -> usize {
    use crate::transport::shm::mapped::{MAPPED_FRAMES, REFUSE_MAPPING};
    REFUSE_MAPPING.with(|r| r.set(refuse_mapping));
    let (dir, _net, mut child, mut r) = start("mapped");
    write_handle(&dir.join("go"), b"go");
    let before = MAPPED_FRAMES.with(|n| n.get());
    for (i, &(n, _)) in MAPPED_MSGS.iter().enumerate() {
        recv_check(r.as_mut(), &[n], 60 + i as u64, 3);
    }
    let mapped = MAPPED_FRAMES.with(|n| n.get()) - before;
    child.wait_success();
    let _ = std::fs::remove_dir_all(&dir);
    REFUSE_MAPPING.with(|r| r.set(false));
    mapped
}

#[test]
fn cross_process_shared_buffers_are_mapped_and_copied() {
    let single_copy_shared = MAPPED_MSGS
        .iter()
        .filter(|&&(n, shared)| shared && n >= DEFAULT_CMA_MIN_BYTES)
        .count();
    assert_eq!(
        receive_mapped(false),
        single_copy_shared,
        "frames copied from a mapping of the peer's shared buffers"
    );
}

#[test]
fn cross_process_unmappable_shared_buffers_are_read_by_address() {
    // The same messages intact, every one read by `process_vm_readv`.
    assert_eq!(receive_mapped(true), 0);
}

/// Whether `want` is at `p` now (read while the peer may be writing it).
fn arrived(p: *const u8, want: &[u8]) -> bool {
    want.iter().enumerate().all(|(i, &b)| {
        // SAFETY: `p` is the start of `want.len()` bytes of a live buffer of
        // the caller's; a volatile read of a byte the peer may be writing
        // through its mapping (the value is only compared).
        unsafe { std::ptr::read_volatile(p.add(i)) == b }
    })
}

/// Receives [`WRITER_SIZES`] from a writer peer into a `ShmBuffer` at an odd
/// offset: polls until the receiver has offered the message and copied its
/// first run, then leaves the rest to the sender (waits for the last bytes
/// to land), then completes and checks every byte. Returns how many runs
/// the peer wrote through a mapping of the buffer.
fn receive_from_writer(refuse_mapping: bool) -> usize {
    let mode = if refuse_mapping {
        "writer-refused"
    } else {
        "writer"
    };
    let (dir, _net, mut child, mut r) = start(mode);
    write_handle(&dir.join("go"), b"go");
    for (i, &n) in WRITER_SIZES.iter().enumerate() {
        let want = pattern(n, 80 + i as u64);
        let mut shared = crate::ShmBuffer::<u8>::zeroed(n + 8192).unwrap();
        let buf = &mut shared[4101..4101 + n];
        let p = buf.as_ptr();
        let q = irecv(r.as_mut(), buf, 4);
        // The poll that copies the receiver's first run may also find the
        // sender's runs written meanwhile and complete the message: only
        // then may it complete, with every byte there (checked below).
        let mut done = None;
        poll("the receiver's first run", || {
            done = r.test(q)?;
            Ok((done.is_some() || arrived(p, &want[..64])).then_some(()))
        })
        .unwrap();
        poll("the sender's runs", || {
            Ok(arrived(p.wrapping_add(n - 64), &want[n - 64..]).then_some(()))
        })
        .unwrap();
        let got = match done {
            Some(got) => got,
            None => poll("recv", || r.test(q)).unwrap(),
        };
        assert_eq!(got, n, "message {i}");
        assert!(
            shared[4101..4101 + n] == want[..],
            "message {i} of {n} bytes"
        );
    }
    child.wait_success();
    let writes = std::fs::read_to_string(dir.join("writes")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    writes.parse().unwrap()
}

#[test]
fn cross_process_split_pieces_are_written_into_a_mapping() {
    let writes = receive_from_writer(false);
    assert!(
        writes >= WRITER_SIZES.len(),
        "the sender wrote {writes} runs through a mapping"
    );
}

#[test]
fn cross_process_unmappable_destinations_are_written_by_address() {
    assert_eq!(receive_from_writer(true), 0);
}
