//! The GPU reduction path of the stager (`stage_gpu.rs`), run on the fake
//! driver (`ffi/tests/cuda/fake_libcuda.c`) with the reduction kernels
//! built for the CPU (`kernels.cu` through `kernels_cpu_shim.h`) and a
//! test NVRTC (built here) that hands the fake driver that library as the
//! "PTX". So the staged all-reduce / reduce-scatter / reduce with device
//! arithmetic, its chunking, padding, stream ordering and the kernel
//! launches are all checked, bit for bit against the host kernels folded
//! in rank order, on machines without a GPU.
//!
//! Skipped (saying why) without a C and a C++ compiler. A separate test
//! binary: the NVRTC library is chosen once per process.
#![cfg(feature = "cuda")]

use nccl_rs::comm::raw::{RawArgs, RawColl};
use nccl_rs::cuda::{DeviceReduce, Stager, StagingOptions};
use nccl_rs::fp8::{F8E4M3, F8E5M2};
use nccl_rs::testing::{on_threads, Over};
use nccl_rs::{Communicator, Config, DataType, RedOp};
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

#[path = "../../ffi/tests/cuda/fake_driver.rs"]
mod fake_build;

/// The driver calls the tests make themselves (as in `cuda_fake.rs`).
#[path = "cuda_fake/drv.rs"]
mod drv;

use drv::{Dev, Stream};

const FAKE_NVRTC: &str = r#"
#include <stdlib.h>
#include <string.h>
static const char* image(void) { const char* p = getenv("FAKE_NVRTC_IMAGE"); return p ? p : ""; }
int nvrtcVersion(int* a, int* b) { *a = 13; *b = 0; return 0; }
const char* nvrtcGetErrorString(int r) { return r ? "NVRTC_ERROR_INVALID_OPTION (fake)" : "NVRTC_SUCCESS"; }
int nvrtcCreateProgram(void** p, const char* src, const char* name, int n, const char* const* h,
                       const char* const* i) {
  (void)name; (void)n; (void)h; (void)i;
  *p = strdup(src);
  return 0;
}
int nvrtcCompileProgram(void* p, int n, const char* const* o) {
  (void)p;
  for (int i = 0; i < n; i++)
    if (!strncmp(o[i], "--gpu-architecture=compute_", 27)) return 0;
  return 5;
}
int nvrtcGetProgramLogSize(void* p, size_t* n) { (void)p; *n = 1; return 0; }
int nvrtcGetProgramLog(void* p, char* l) { (void)p; l[0] = 0; return 0; }
int nvrtcGetPTXSize(void* p, size_t* n) { (void)p; *n = 8 + strlen(image()) + 1; return 0; }
int nvrtcGetPTX(void* p, char* out) { (void)p; strcpy(out, "FAKECPU:"); strcat(out, image()); return 0; }
int nvrtcDestroyProgram(void** p) { free(*p); *p = 0; return 0; }
"#;

fn build(cmd: &str, args: &[&str], inputs: &[&Path], out: &Path) -> Result<(), String> {
    let o = Command::new(cmd)
        .args(args)
        .args(inputs)
        .arg("-o")
        .arg(out)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    assert!(
        o.status.success(),
        "{cmd} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(())
}

/// Builds the fake driver, the CPU kernels and the test NVRTC once and
/// points the environment at them; Err(why) when a compiler is missing.
fn setup() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let dir =
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fakegpu-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let driver = fake_build::try_build(&dir)?;
        let kernels = dir.join("libncclrs_kernels_cpu.so");
        let shim = root.join("src/cuda/kernels_cpu_shim.h");
        build(
            std::env::var("CXX").as_deref().unwrap_or("g++"),
            &[
                "-std=c++11",
                "-O2",
                "-ffp-contract=off",
                "-shared",
                "-fPIC",
                "-include",
            ],
            &[
                &shim,
                Path::new("-x"),
                Path::new("c++"),
                &root.join("src/cuda/kernels.cu"),
            ],
            &kernels,
        )?;
        let nvrtc_src = dir.join("fake_nvrtc.c");
        std::fs::write(&nvrtc_src, FAKE_NVRTC).unwrap();
        let nvrtc = dir.join("libnvrtc.so.13");
        build("cc", &["-shared", "-fPIC", "-O1"], &[&nvrtc_src], &nvrtc)?;
        std::env::set_var("NCCL_RS_CUDA_DRIVER", &driver);
        std::env::set_var("FAKE_CUDA_DELAY_US", "50");
        std::env::set_var("NCCL_RS_NVRTC_LIBRARY", &nvrtc);
        std::env::set_var("FAKE_NVRTC_IMAGE", &kernels);
        Ok(())
    })
    .clone()
}

/// Element bits of rank `r`, position `i` (random, NaN included).
fn input(dtype: DataType, r: usize, len: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ ((r as u64 + 1) << 32) ^ dtype as u64;
    (0..len * dtype.size())
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// `buf / n` as the host does (the datatype docs): truncating for
/// integers, in f32 (f64) for floats with one rounding back.
fn divide(dtype: DataType, buf: &mut [u8], n: usize) {
    let es = dtype.size();
    for e in buf.chunks_mut(es) {
        let mut b = [0u8; 8];
        b[..es].copy_from_slice(e);
        let v = u64::from_le_bytes(b);
        let f = n as f32;
        let r: u64 = match dtype {
            DataType::Int8 => ((v as i8) / n as i8) as u8 as u64,
            DataType::Uint8 => v / n as u64,
            DataType::Int32 => ((v as i32) / n as i32) as u32 as u64,
            DataType::Uint32 | DataType::Uint64 => v / n as u64,
            DataType::Int64 => ((v as i64) / n as i64) as u64,
            DataType::Float32 => (f32::from_bits(v as u32) / f).to_bits() as u64,
            DataType::Float64 => (f64::from_bits(v) / n as f64).to_bits(),
            DataType::Float16 => {
                half::f16::from_f32(half::f16::from_bits(v as u16).to_f32() / f).to_bits() as u64
            }
            DataType::Bfloat16 => {
                half::bf16::from_f32(half::bf16::from_bits(v as u16).to_f32() / f).to_bits() as u64
            }
            DataType::Float8e4m3 => F8E4M3::from_f32(F8E4M3(v as u8).to_f32() / f).0 as u64,
            DataType::Float8e5m2 => F8E5M2::from_f32(F8E5M2(v as u8).to_f32() / f).0 as u64,
        };
        e.copy_from_slice(&r.to_le_bytes()[..es]);
    }
}

/// Rows of every rank folded in rank order with the host kernels.
fn fold(dtype: DataType, op: RedOp, rows: &[Vec<u8>], from: usize, len: usize) -> Vec<u8> {
    let es = dtype.size();
    let mut acc = rows[0][from * es..(from + len) * es].to_vec();
    for r in &rows[1..] {
        nccl_rs::kernels::reduce_inplace(dtype, op, &mut acc, &r[from * es..(from + len) * es]);
    }
    if op == RedOp::Avg {
        divide(dtype, &mut acc, rows.len());
    }
    acc
}

fn is_nan(dtype: DataType, e: &[u8]) -> bool {
    match dtype {
        DataType::Float16 => half::f16::from_le_bytes([e[0], e[1]]).is_nan(),
        DataType::Bfloat16 => half::bf16::from_le_bytes([e[0], e[1]]).is_nan(),
        DataType::Float32 => f32::from_le_bytes(e.try_into().unwrap()).is_nan(),
        DataType::Float64 => f64::from_le_bytes(e.try_into().unwrap()).is_nan(),
        DataType::Float8e4m3 => F8E4M3(e[0]).is_nan(),
        DataType::Float8e5m2 => F8E5M2(e[0]).is_nan(),
        _ => false,
    }
}

fn same(dtype: DataType, got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let es = dtype.size();
    for (i, (g, w)) in got.chunks(es).zip(want.chunks(es)).enumerate() {
        assert!(
            g == w || (is_nan(dtype, g) && is_nan(dtype, w)),
            "{what}: element {i} is {g:02x?}, expected {w:02x?}"
        );
    }
}

#[test]
fn staged_reductions_on_the_gpu_path_are_exact() {
    if let Err(why) = setup() {
        println!("SKIPPED: {why}");
        return;
    }
    let probe = nccl_rs::cuda::device_reduce_probe().expect("the CPU kernels load as a module");
    assert!(
        probe.contains("NVRTC 13.0") && probe.contains("compute_90"),
        "{probe}"
    );
    for n in [2usize, 3] {
        let cfg = Config {
            socket_ifname: Some("lo".into()),
            ..Config::default()
        };
        on_threads(n, &cfg, Over::Config, |r, mut comm| {
            drv::bind_device0();
            let s = &Stream::new();
            let mut st = Stager::new(StagingOptions {
                chunk_bytes: 4096,
                pipeline: true,
            });
            // Forced: a fallback to the host would be an error.
            st.set_device_reduce(DeviceReduce::Gpu);
            // Several chunks of 4 KiB, a count not divisible by
            // n; counts below n (empty shards).
            for c in [1531, 1, 5] {
                run_all(&mut st, &mut comm, s, r, n, c);
            }
            let mut whole = Stager::new(StagingOptions {
                chunk_bytes: 4096,
                pipeline: false,
            });
            whole.set_device_reduce(DeviceReduce::Gpu);
            run_all(&mut whole, &mut comm, s, r, n, 1531);
        });
    }
}

fn run_all(st: &mut Stager, comm: &mut Communicator, s: &Stream, r: usize, n: usize, c: usize) {
    for dtype in DataType::ALL {
        let es = dtype.size();
        let rows: Vec<Vec<u8>> = (0..n).map(|q| input(dtype, q, n * c)).collect();
        for op in [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg] {
            let what = |coll: &str| format!("rank {r} of {n}: {coll} of {c} {dtype} {op}");
            let send = Dev::from(&rows[r], s);
            let out = Dev::<u8>::zeros(n * c * es, s);
            let mut run = |coll: RawColl, send: *const u8, recv: *mut u8| {
                let a = RawArgs {
                    coll,
                    send,
                    recv,
                    count: c,
                    dtype,
                    op,
                    root: 1,
                };
                // SAFETY: device allocations of the sizes NCCL defines.
                unsafe { st.collective(comm, &a, s.id(), None) }
                    .unwrap_or_else(|e| panic!("{}: {e}", what("call")));
            };
            run(RawColl::AllReduce, send.ptr(), out.ptr());
            same(
                dtype,
                &out.read(s)[..c * es],
                &fold(dtype, op, &rows, 0, c),
                &what("all-reduce"),
            );
            // In place: the result overwrites the input.
            run(RawColl::AllReduce, send.ptr(), send.ptr());
            same(
                dtype,
                &send.read(s)[..c * es],
                &fold(dtype, op, &rows, 0, c),
                &what("in-place all-reduce"),
            );
            send.write(&rows[r], s);
            run(RawColl::ReduceScatter, send.ptr(), out.ptr());
            same(
                dtype,
                &out.read(s)[..c * es],
                &fold(dtype, op, &rows, r * c, c),
                &what("reduce-scatter"),
            );
            run(RawColl::Reduce, send.ptr(), out.ptr());
            if r == 1 {
                same(
                    dtype,
                    &out.read(s)[..c * es],
                    &fold(dtype, op, &rows, 0, c),
                    &what("reduce"),
                );
            }
            // The inputs are untouched (out of place).
            same(dtype, &send.read(s), &rows[r], &what("input"));
        }
    }
    // PreMulSum: each rank scales its input by its own scalar first.
    let dtype = DataType::Float32;
    let mine: Vec<f32> = (0..c).map(|i| (i % 17) as f32 - 8.0).collect();
    let send = Dev::from(&mine, s);
    let out = Dev::<f32>::zeros(c, s);
    let scalar = (r as f32 + 0.5).to_le_bytes();
    let a = RawArgs {
        coll: RawColl::AllReduce,
        send: send.ptr(),
        recv: out.ptr(),
        count: c,
        dtype,
        op: RedOp::Sum,
        root: 0,
    };
    // SAFETY: device allocations of `c` floats.
    unsafe { st.collective(comm, &a, s.id(), Some(&scalar)) }.unwrap();
    let want: Vec<u8> = (0..c)
        .flat_map(|i| {
            let mut acc = mine[i] * 0.5;
            for q in 1..n {
                acc += mine[i] * (q as f32 + 0.5);
            }
            acc.to_le_bytes()
        })
        .collect();
    same(
        dtype,
        bytemuck_bytes(&out.read(s)),
        &want,
        &format!("rank {r}: PreMulSum"),
    );
}

fn bytemuck_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding; the bytes live as long as `v`.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}
