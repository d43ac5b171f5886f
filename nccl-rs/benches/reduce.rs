//! Reduction kernel throughput for every datatype and op, next to memcpy.
//!
//! `cargo bench -p nccl-rs --bench reduce [-- SIZE_BYTES REPS]`
//! Prints GB/s of `dst ⊕= src` counted as bytes of one buffer per call
//! (the unit the all-reduce busbw uses), the median of REPS runs, for a
//! cache-resident (256 KiB) and a memory-bound (64 MiB by default) size.

use nccl_rs::kernels::reduce_inplace;
use nccl_rs::{DataType, RedOp};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn rate(bytes: usize, reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let times: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    bytes as f64 / median(times) / 1e9
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let big: usize = args
        .first()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64 << 20);
    let reps: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(7);
    println!(
        "# load: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    for size in [256 << 10, big] {
        let src: Vec<u8> = (0..size).map(|i| (i % 7) as u8).collect();
        let mut dst: Vec<u8> = (0..size).map(|i| (i % 5) as u8).collect();
        let memcpy = rate(size, reps, || dst.copy_from_slice(&src));
        println!("\n# {size} bytes per buffer, median of {reps}; memcpy {memcpy:.1} GB/s");
        print!("{:>10}", "type");
        for op in RedOp::ALL {
            print!("{:>9}", op.name());
        }
        println!();
        for dt in DataType::ALL {
            print!("{:>10}", dt.name());
            for op in RedOp::ALL {
                let g = rate(size, reps, || reduce_inplace(dt, op, &mut dst, &src));
                print!("{g:>9.1}");
            }
            println!();
        }
    }
}
