//! Cost of the mismatch fingerprint each collective computes (it travels in
//! the transport tag, so it adds no bytes): `cargo bench -p nccl-rs --bench
//! fingerprint`. Compare with the 8-byte all-reduce time from
//! `all_reduce_perf -b 8 -e 8`.

use std::hint::black_box;
use std::time::Instant;

fn main() {
    let n = 10_000_000u64;
    let mut acc = 0u32;
    let t = Instant::now();
    for i in 0..n {
        acc ^= nccl_rs::kernels::fingerprint_all_reduce(black_box(i), black_box(2));
    }
    let ns = t.elapsed().as_secs_f64() * 1e9 / n as f64;
    println!("fingerprint: {ns:.2} ns per collective (checksum {acc:#x})");
}
