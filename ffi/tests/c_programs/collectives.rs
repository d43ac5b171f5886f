//! Collectives across ranks: four threads of one process
//! (`ncclCommInitAll`), and separate processes meeting through an id
//! file or `NCCL_COMM_ID`.

use crate::{command, compile, run_one, start, wait_all, work_dir, Running};
use std::time::Duration;

#[test]
fn init_all_four_ranks_as_threads_every_collective() {
    let exe = compile("initall.c", &[]);
    let out = run_one(&exe, &[], &[], Duration::from_secs(300));
    assert!(out.contains("initall: OK"), "{out}");
}

#[test]
fn multiprocess_four_ranks() {
    let exe = compile("multiproc.c", &[]);
    let dir = work_dir("multiproc");
    let idfile = dir.join("nccl-id");
    let n = 4;
    let children: Vec<Running> = (0..n)
        .map(|r| {
            let mut c = command(&exe);
            c.args([r.to_string(), n.to_string()]).arg(&idfile);
            start(c)
        })
        .collect();
    let log = wait_all("multiproc", children, Duration::from_secs(400));
    assert_eq!(log.matches(": OK").count(), n, "{log}");
}

/// `multiproc.c` on `n` ranks with every buffer from `ncclMemAlloc`, every
/// collective trying the zero-copy path (threshold 1 byte), at INFO; the
/// ranks' log.
fn multiproc_on_ncclmemalloc(name: &str, n: usize) -> String {
    let exe = compile("multiproc.c", &[]);
    let dir = work_dir(name);
    let idfile = dir.join("nccl-id");
    let children: Vec<Running> = (0..n)
        .map(|r| {
            let mut c = command(&exe);
            c.args([r.to_string(), n.to_string()])
                .arg(&idfile)
                .env("MULTIPROC_MEMALLOC", "1")
                .env("NCCL_RS_ZERO_COPY_MIN_BYTES", "1")
                .env("NCCL_DEBUG", "INFO");
            start(c)
        })
        .collect();
    let log = wait_all(name, children, Duration::from_secs(400));
    assert_eq!(log.matches(": OK").count(), n, "{log}");
    log
}

#[test]
fn multiprocess_zero_copy_on_ncclmemalloc_buffers() {
    // Every collective of every type and op takes the zero-copy path; the
    // INFO line proves it ran.
    let log = multiproc_on_ncclmemalloc("multiproc-zc", 4);
    assert!(
        log.contains("SHM zero copy: collectives on shared buffers"),
        "{log}"
    );
}

#[test]
fn send_recv_from_ncclmemalloc_buffers_read_through_a_mapping() {
    // Two ranks (four would outnumber this machine's CPUs, and then send/recv
    // takes the ring): the send/recv rings, 16 KiB and 4 MiB, go single copy
    // and the receiver maps the sender's buffer; the INFO line proves it.
    let log = multiproc_on_ncclmemalloc("multiproc-mapped", 2);
    assert!(
        log.contains("SHM: received from a shared buffer of the sender"),
        "send/recv from ncclMemAlloc buffers never read through a mapping: {log}"
    );
}

#[test]
fn multiprocess_with_nccl_comm_id() {
    let exe = compile("multiproc.c", &[]);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let n = 2;
    let children: Vec<Running> = (0..n)
        .map(|r| {
            let mut c = command(&exe);
            c.args([r.to_string(), n.to_string(), "-".into()])
                .env("NCCL_COMM_ID", &addr);
            start(c)
        })
        .collect();
    let log = wait_all("comm-id", children, Duration::from_secs(400));
    assert_eq!(log.matches(": OK").count(), n, "{log}");
}
