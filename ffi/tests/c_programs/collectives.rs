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

#[test]
fn multiprocess_zero_copy_on_ncclmemalloc_buffers() {
    // Every collective of every type and op on ncclMemAlloc buffers, taking
    // the zero-copy path (threshold 1 byte); the INFO line proves it ran.
    let exe = compile("multiproc.c", &[]);
    let dir = work_dir("multiproc-zc");
    let idfile = dir.join("nccl-id");
    let n = 4;
    let children: Vec<Running> = (0..n)
        .map(|r| {
            let mut c = command(&exe);
            c.args([r.to_string(), n.to_string()])
                .arg(&idfile)
                .env("MULTIPROC_MEMALLOC", "1")
                .env("NCCL_SHM_ZERO_COPY_MIN_BYTES", "1")
                .env("NCCL_DEBUG", "INFO");
            start(c)
        })
        .collect();
    let log = wait_all("multiproc-zc", children, Duration::from_secs(400));
    assert_eq!(log.matches(": OK").count(), n, "{log}");
    assert!(
        log.contains("SHM zero copy: collectives on shared buffers"),
        "{log}"
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
