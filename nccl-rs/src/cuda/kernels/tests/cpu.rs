//! The device kernels (`kernels.cu`) compiled for the CPU with the host
//! C++ compiler (through `kernels_cpu_shim.h`) and compared bit for bit
//! with the host kernels (`crate::reduce`) for every datatype and
//! operation, on inputs with NaN, ±0, ±infinity, subnormals, overflow and
//! rounding ties. Skipped, saying why, when no C++ compiler is found
//! (`CXX`, else `g++`).

use crate::cuda::kernels::{reduce_name, scale_name, SOURCE};
use crate::datatype::{DataType, RedOp};
use crate::fp8::{F8E4M3, F8E5M2};
use crate::reduce;
use crate::testing::Rng;
use std::ffi::{c_void, CString};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

type ReduceFn = unsafe extern "C" fn(*mut u8, *const u8, u64, u32, u64, u64);
type ScaleFn = unsafe extern "C" fn(*mut u8, *const u8, u64, u64);
type SetIndexFn = unsafe extern "C" fn(u32, u32, u32, u32);

/// The CPU build of the kernels, loaded (None: no compiler, with why).
fn library() -> Result<usize, String> {
    static LIB: OnceLock<Result<usize, String>> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("ncclrs-kernels-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let src = dir.join("kernels.cu");
        let shim = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/cuda/kernels_cpu_shim.h");
        std::fs::write(&src, SOURCE).map_err(|e| e.to_string())?;
        let out = dir.join("libncclrs_kernels_cpu.so");
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
        let status = Command::new(&cxx)
            .args(["-std=c++11", "-O2", "-ffp-contract=off", "-fno-fast-math"])
            .args([
                "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-include",
            ])
            .arg(&shim)
            .args(["-x", "c++"])
            .arg(&src)
            .arg("-o")
            .arg(&out)
            .status();
        match status {
            Err(e) => return Err(format!("no C++ compiler ({cxx}: {e})")),
            Ok(s) if !s.success() => panic!("{cxx} failed to compile kernels.cu for the CPU: {s}"),
            Ok(_) => {}
        }
        let c = CString::new(out.to_string_lossy().as_bytes()).unwrap();
        // SAFETY: loading the library we just built (plain C functions,
        // no initialisers).
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen of the CPU kernels failed");
        Ok(h as usize)
    })
    .clone()
}

fn sym(name: &str) -> *mut c_void {
    let h = library().unwrap() as *mut c_void;
    let c = CString::new(name).unwrap();
    // SAFETY: a symbol lookup in our library.
    let p = unsafe { libc::dlsym(h, c.as_ptr()) };
    assert!(!p.is_null(), "{name} is missing from the CPU kernels");
    p
}

/// Runs a "launch" of `grid` × `block` threads: `f` once per thread.
fn launch(grid: u32, block: u32, mut f: impl FnMut()) {
    // SAFETY: the shim's setter has this signature.
    let set =
        unsafe { std::mem::transmute::<*mut c_void, SetIndexFn>(sym("ncclrs_cpu_set_index")) };
    for b in 0..grid {
        for t in 0..block {
            // SAFETY: plain setter of four globals.
            unsafe { set(grid, block, b, t) };
            f();
        }
    }
}

/// Bit patterns worth testing for `dtype` (little-endian element bytes).
fn specials(dtype: DataType) -> Vec<u64> {
    match dtype {
        DataType::Float32 => {
            let v = [
                0.0f32,
                -0.0,
                1.0,
                -1.0,
                0.5,
                1.5,
                2.5,
                3.0,
                1e30,
                -1e30,
                f32::MAX,
                f32::MIN,
                f32::MIN_POSITIVE,
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::from_bits(1),
                f32::from_bits(0x8000_0001),
                f32::from_bits(0x007F_FFFF),
                1.0 + f32::EPSILON,
                f32::EPSILON / 2.0,
                3.0 * f32::EPSILON / 2.0,
                16777216.0,
                1.0 / 3.0,
            ];
            let mut b: Vec<u64> = v.iter().map(|x| u64::from(x.to_bits())).collect();
            b.extend([0x7FC0_0000, 0xFFC0_0001, 0x7F80_0001]);
            b
        }
        DataType::Float64 => {
            let v = [
                0.0f64,
                -0.0,
                1.0,
                -1.0,
                0.5,
                1.5,
                2.5,
                f64::MAX,
                f64::MIN,
                f64::MIN_POSITIVE,
                f64::INFINITY,
                f64::NEG_INFINITY,
                f64::from_bits(1),
                1.0 + f64::EPSILON,
                f64::EPSILON / 2.0,
                3.0 * f64::EPSILON / 2.0,
                1.0 / 3.0,
                9007199254740992.0,
            ];
            let mut b: Vec<u64> = v.iter().map(|x| x.to_bits()).collect();
            b.extend([0x7FF8_0000_0000_0000, 0xFFF0_0000_0000_0001]);
            b
        }
        DataType::Float16 | DataType::Bfloat16 => vec![
            0, 0x8000, 0x3C00, 0xBC00, 0x3F80, 0xBF80, 0x7BFF, 0xFBFF, 0x7F7F, 0xFF7F, 0x7C00,
            0xFC00, 0x7F80, 0xFF80, 0x7E00, 0x7C01, 0x7FC0, 0x7F81, 0x0001, 0x8001, 0x03FF, 0x0400,
            0x3C01, 0x3800, 0x4000, 0x0080, 0x007F,
        ],
        DataType::Int64 | DataType::Uint64 => vec![
            0,
            1,
            u64::MAX,
            i64::MAX as u64,
            i64::MIN as u64,
            2,
            3,
            0x1_0000_0000,
            0xFFFF_FFFF,
        ],
        DataType::Int32 | DataType::Uint32 => {
            vec![
                0,
                1,
                0xFFFF_FFFF,
                0x7FFF_FFFF,
                0x8000_0000,
                2,
                3,
                0x1_0000,
                0xFFFF,
            ]
        }
        // 8-bit types are tested exhaustively.
        _ => (0..256).collect(),
    }
}

/// `rows` rows of `len` elements: every pair of specials in rows 0 and 1
/// (then random bits), and specials or random bits in the other rows.
fn inputs(dtype: DataType, rows: usize, rng: &mut Rng) -> Vec<Vec<u8>> {
    let es = dtype.size();
    let sp = specials(dtype);
    let pairs = sp.len() * sp.len();
    let len = pairs + 4096;
    let mut out = vec![vec![0u8; len * es]; rows];
    for i in 0..len {
        for (r, row) in out.iter_mut().enumerate() {
            let x = rng.next_u64();
            let v = match (i < pairs, r) {
                (true, 0) => sp[i / sp.len()],
                (true, 1) => sp[i % sp.len()],
                _ if x.is_multiple_of(3) => sp[(x >> 8) as usize % sp.len()],
                // Random bits, and for wide floats values of nearby
                // magnitudes (interesting sums and ties).
                _ => match dtype {
                    DataType::Float32 => u64::from(((x >> 16) as f32 / 64.0).to_bits()),
                    DataType::Float64 => ((x >> 11) as f64 / 1024.0).to_bits(),
                    _ => rng.next_u64(),
                },
            };
            row[i * es..(i + 1) * es].copy_from_slice(&v.to_le_bytes()[..es]);
        }
    }
    out
}

fn is_nan(dtype: DataType, b: &[u8]) -> bool {
    let u = |n: usize| {
        let mut a = [0u8; 8];
        a[..n].copy_from_slice(&b[..n]);
        u64::from_le_bytes(a)
    };
    match dtype {
        DataType::Float16 => half::f16::from_bits(u(2) as u16).is_nan(),
        DataType::Bfloat16 => half::bf16::from_bits(u(2) as u16).is_nan(),
        DataType::Float32 => f32::from_bits(u(4) as u32).is_nan(),
        DataType::Float64 => f64::from_bits(u(8)).is_nan(),
        DataType::Float8e4m3 => F8E4M3(b[0]).is_nan(),
        DataType::Float8e5m2 => F8E5M2(b[0]).is_nan(),
        _ => false,
    }
}

/// Equal bits, or both NaN (float types).
fn assert_same(dtype: DataType, got: &[u8], want: &[u8], inputs: &[Vec<u8>], what: &str) {
    let es = dtype.size();
    for (i, (g, w)) in got.chunks(es).zip(want.chunks(es)).enumerate() {
        if g != w && !(is_nan(dtype, g) && is_nan(dtype, w)) {
            let ins: Vec<String> = inputs
                .iter()
                .map(|r| format!("{:02x?}", &r[i * es..(i + 1) * es]))
                .collect();
            panic!("{what}: element {i}: inputs {ins:?}: device kernel {g:02x?}, host {w:02x?}");
        }
    }
}

#[test]
fn cpu_built_kernels_match_the_host_bit_for_bit() {
    if let Err(why) = library() {
        eprintln!("SKIPPED: cannot build the kernels for the CPU: {why}");
        return;
    }
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for dtype in DataType::ALL {
        let es = dtype.size();
        for op in [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg] {
            // SAFETY: the kernel of this name has this signature.
            let f = unsafe {
                std::mem::transmute::<*mut c_void, ReduceFn>(sym(&reduce_name(dtype, op)))
            };
            for (nrows, avg_n) in [(1usize, 0u64), (2, 0), (3, 0), (3, 3), (2, 200), (1, 7)] {
                let avg_n = if op == RedOp::Avg { avg_n.max(1) } else { 0 };
                let rows = inputs(dtype, nrows, &mut rng);
                let len = rows[0].len() / es;
                let mut want = rows[0].clone();
                for r in &rows[1..] {
                    reduce::reduce_inplace(dtype, op, &mut want, r);
                }
                if avg_n != 0 {
                    reduce::divide(dtype, &mut want, avg_n as usize);
                }
                // Rows one after another, `stride` elements apart.
                let stride = len + 3;
                let mut src = vec![0u8; stride * es * nrows];
                for (k, r) in rows.iter().enumerate() {
                    src[k * stride * es..][..r.len()].copy_from_slice(r);
                }
                let mut got = vec![0u8; len * es];
                launch(3, 5, || {
                    // SAFETY: `got` holds `len` elements, `src` `nrows`
                    // rows of `stride`.
                    unsafe {
                        f(
                            got.as_mut_ptr(),
                            src.as_ptr(),
                            stride as u64,
                            nrows as u32,
                            len as u64,
                            avg_n,
                        )
                    }
                });
                let what = format!("{dtype} {op} of {nrows} row(s), avg_n {avg_n}");
                assert_same(dtype, &got, &want, &rows, &what);
            }
        }
        // SAFETY: the kernel of this name has this signature.
        let f = unsafe { std::mem::transmute::<*mut c_void, ScaleFn>(sym(&scale_name(dtype))) };
        let rows = inputs(dtype, 1, &mut rng);
        for s in specials(dtype).into_iter().take(40) {
            let scalar = &s.to_le_bytes()[..es];
            let mut want = rows[0].clone();
            reduce::scale(dtype, &mut want, scalar);
            let mut got = vec![0u8; want.len()];
            let len = (want.len() / es) as u64;
            // SAFETY: both buffers hold `len` elements.
            launch(2, 7, || unsafe {
                f(got.as_mut_ptr(), rows[0].as_ptr(), len, s)
            });
            assert_same(
                dtype,
                &got,
                &want,
                &rows,
                &format!("{dtype} scale by {s:#x}"),
            );
        }
    }
}
