//! The RAS query port of a process whose ranks are threads: one rank holds
//! back from an all-reduce, and a query names it, the operation it holds
//! up and the ranks waiting on it; once it joins, the job is OK again.
//! (Stopped processes on network namespaces: `scripts/ras-test.sh`.)

use nccl_rs::testing::{self, Over};
use nccl_rs::RedOp;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Queries until `ok(answer)` or 10 s pass; the last answer.
fn query_until(addr: &str, verbose: bool, json: bool, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = nccl_rs::ras::client::query(addr, verbose, json, Duration::from_secs(2))
            .unwrap_or_else(|e| e);
        if ok(&got) || Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_rank_that_holds_back_is_named_with_its_waiters() {
    let addr = format!("127.0.0.1:{}", free_port());
    let config = nccl_rs::Config {
        ras_addr: addr.clone(),
        ..testing::loopback(Duration::from_secs(60))
    };
    let go = AtomicBool::new(false);
    let release = AtomicBool::new(false);
    let pid = std::process::id();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string();
    let held =
        format!("    rank 2 BEHIND ({host} pid {pid}; started #2, completed #2): holds up op #3\n");
    std::thread::scope(|s| {
        let job = s.spawn(|| {
            testing::on_threads(4, &config, Over::Mem, |rank, mut comm| {
                let send = vec![1.0f32; 256];
                let mut recv = vec![0.0f32; 256];
                for op in 1..=3 {
                    if rank == 2 && op == 3 {
                        let deadline = Instant::now() + Duration::from_secs(30);
                        while !go.load(Ordering::Acquire) && Instant::now() < deadline {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                    }
                    comm.all_reduce(&send, &mut recv, RedOp::Sum).unwrap();
                    assert_eq!(recv, vec![4.0f32; 256]);
                }
                // Alive, with op 3 complete, until the last query.
                let deadline = Instant::now() + Duration::from_secs(30);
                while !release.load(Ordering::Acquire) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        });
        let text = query_until(&addr, true, false, |t| t.contains(&held));
        let json = query_until(&addr, false, true, |j| {
            j.contains("\"stuck\":[{\"rank\":2,")
        });
        go.store(true, Ordering::Release);
        assert!(text.contains(&held), "{text}");
        assert!(
            text.contains("\n  1 hosts, 1 processes, 4 ranks\n"),
            "{text}"
        );
        assert!(text.contains("    4/4  RANKS BEHIND   "), "{text}");
        let waiters = text
            .lines()
            .find_map(|l| l.strip_prefix("      waited on by ranks "))
            .unwrap_or_else(|| panic!("no waiters: {text}"));
        assert!(!waiters.is_empty() && !waiters.contains("2 ("), "{text}");
        assert!(
            json.contains("\"stuck\":[{\"rank\":2,\"reason\":\"behind\",\"op\":3,"),
            "{json}"
        );
        // Everyone completed op 3: nothing is stuck.
        let done = format!("{:>5}  {:<13}  {:>13}  {:>15}\n", "4/4", "OK", 3, 3);
        let after = query_until(&addr, false, false, |t| t.contains(&done));
        release.store(true, Ordering::Release);
        job.join().unwrap();
        assert!(after.contains(&done), "{after}");
        assert!(!after.contains("BEHIND"), "{after}");
        assert!(
            after.contains("\nDead peers: none\nLink errors: none\n"),
            "{after}"
        );
    });
}
