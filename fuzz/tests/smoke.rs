//! The fuzz targets' functions as a plain test, without libFuzzer: the
//! seeds, then seeded random and mutated inputs for `FUZZ_SMOKE_SECS`
//! seconds per target (default 2). Runs on stable with `cargo test`.
//! The real fuzzing is `cargo fuzz run <target>` (see `fuzz/run.sh`).

use std::time::{Duration, Instant};

type Target = fn(&[u8]);

fn tcp_handle(data: &[u8]) {
    if let Ok(h) = transport_tcp::handle::TcpHandle::decode(data) {
        let again = transport_tcp::handle::TcpHandle::decode(&h.encode())
            .expect("an encoded handle decodes");
        assert_eq!(again, h, "encode/decode round trip");
    }
}

const TARGETS: [(&str, Target); 7] = [
    ("bootstrap_hello", nccl_rs::fuzzing::bootstrap_hello),
    ("bootstrap_admission", nccl_rs::fuzzing::bootstrap_admission),
    ("bootstrap_frames", nccl_rs::fuzzing::bootstrap_frames),
    ("unique_id", nccl_rs::fuzzing::unique_id),
    ("config_values", nccl_rs::fuzzing::config_values),
    ("tcp_handle", tcp_handle),
    ("shm_handle", nccl_rs::fuzzing::shm_handle),
];

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("seeds")
        .join(target);
    let mut out: Vec<Vec<u8>> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| std::fs::read(e.ok()?.path()).ok())
                .collect()
        })
        .unwrap_or_default();
    out.push(Vec::new());
    out
}

/// A random edit of `base`: flip, overwrite, insert, delete, splice in an
/// interesting integer, truncate or extend.
fn mutate(base: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(v.len() + 1);
        match rng.below(7) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next() as u8;
            }
            2 => v.insert(at, rng.next() as u8),
            3 if !v.is_empty() => {
                v.remove(rng.below(v.len()));
            }
            4 => {
                let ints: [u32; 8] = [0, 1, 0x7f, 0xff, 0xffff, 0x7fff_ffff, 0xffff_ffff, 64 << 20];
                let x = ints[rng.below(ints.len())].to_le_bytes();
                let at = at.min(v.len());
                v.splice(at..(at + 4).min(v.len()), x);
            }
            5 => v.truncate(at),
            _ => {
                let n = rng.below(64);
                v.extend((0..n).map(|_| rng.next() as u8));
            }
        }
    }
    v
}

#[test]
fn fuzz_targets_smoke() {
    let secs: u64 = std::env::var("FUZZ_SMOKE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let seed: u64 = std::env::var("FUZZ_SMOKE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    for (name, f) in TARGETS {
        let corpus = seeds(name);
        let mut rng = Rng(seed ^ name.len() as u64);
        let start = Instant::now();
        let mut runs = 0u64;
        for s in &corpus {
            f(s);
        }
        while start.elapsed() < Duration::from_secs(secs) {
            let input = if rng.below(4) == 0 {
                let n = rng.below(256);
                (0..n).map(|_| rng.next() as u8).collect()
            } else {
                mutate(&corpus[rng.below(corpus.len())], &mut rng)
            };
            f(&input);
            runs += 1;
        }
        println!("{name}: {runs} inputs in {secs} s, no crash");
    }
}
