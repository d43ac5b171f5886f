//! Inputs built so that the expected output is exact (as nccl-tests does),
//! and a reference reduction in the element type itself.
//!
//! Sums use small non-negative integers bounded per type so that every
//! partial sum at up to 8 ranks is exactly representable (fp8 e5m2 holds
//! integers up to 8 exactly, e4m3 up to 16, bf16 up to 256, f16 up to 2048);
//! integer sums and products wrap, which is order-independent. Products use
//! {1, 2} (powers of two up to 2^8 are exact in every float type). Max and
//! min need no arithmetic. Hence the reference, folded in rank order, equals
//! whatever order the library reduces in, bit for bit. Float averages are
//! compared with a tolerance of one unit in the last place of the type.

use half::{bf16, f16};
use nccl_rs::fp8::{F8E4M3, F8E5M2};
use nccl_rs::{DataType, Element, RedOp};

/// An element type the tests can generate, reduce and compare.
pub trait TestElem: Element + PartialEq + std::fmt::Debug {
    /// Exact conversion of a small integer.
    fn from_i64(v: i64) -> Self;
    /// The reference `a op b` with the library's semantics.
    fn combine(a: Self, b: Self, op: RedOp) -> Self;
    /// The reference average's division.
    fn div(self, n: usize) -> Self;
    /// Whether two averages agree within tolerance.
    fn close(a: Self, b: Self) -> bool;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl TestElem for $t {
            fn from_i64(v: i64) -> Self { v as $t }
            fn combine(a: Self, b: Self, op: RedOp) -> Self {
                match op {
                    RedOp::Sum | RedOp::Avg => a.wrapping_add(b),
                    RedOp::Prod => a.wrapping_mul(b),
                    RedOp::Max => a.max(b),
                    RedOp::Min => a.min(b),
                }
            }
            fn div(self, n: usize) -> Self { self / (n as $t) }
            fn close(a: Self, b: Self) -> bool { a == b }
        }
    )*};
}
int_elem!(i8, u8, i32, u32, i64, u64);

fn fold_f64(a: f64, b: f64, op: RedOp) -> f64 {
    match op {
        RedOp::Sum | RedOp::Avg => a + b,
        RedOp::Prod => a * b,
        RedOp::Max => a.max(b),
        RedOp::Min => a.min(b),
    }
}

macro_rules! float_elem {
    ($t:ty, $to:expr, $from:expr, $eps:expr) => {
        impl TestElem for $t {
            fn from_i64(v: i64) -> Self {
                $from(v as f64)
            }
            fn combine(a: Self, b: Self, op: RedOp) -> Self {
                $from(fold_f64($to(a), $to(b), op))
            }
            fn div(self, n: usize) -> Self {
                $from($to(self) / n as f64)
            }
            fn close(a: Self, b: Self) -> bool {
                let (x, y) = ($to(a), $to(b));
                (x - y).abs() <= $eps * x.abs().max(y.abs()) + 1e-30
            }
        }
    };
}
float_elem!(
    f32,
    |x: f32| x as f64,
    |v: f64| v as f32,
    2.0 * f32::EPSILON as f64
);
float_elem!(f64, |x: f64| x, |v: f64| v, 2.0 * f64::EPSILON);
float_elem!(f16, |x: f16| x.to_f64(), f16::from_f64, 2.0 / 1024.0);
float_elem!(bf16, |x: bf16| x.to_f64(), bf16::from_f64, 2.0 / 128.0);
float_elem!(
    F8E4M3,
    |x: F8E4M3| x.to_f32() as f64,
    |v: f64| F8E4M3::from_f32(v as f32),
    2.0 / 8.0
);
float_elem!(
    F8E5M2,
    |x: F8E5M2| x.to_f32() as f64,
    |v: f64| F8E5M2::from_f32(v as f32),
    2.0 / 4.0
);

/// Exclusive bound of summands for `dtype` so sums at 8 ranks stay exact.
pub fn sum_bound(dtype: DataType) -> i64 {
    match dtype {
        DataType::Float8e5m2 => 2,
        DataType::Float8e4m3 => 3,
        DataType::Bfloat16 => 32,
        DataType::Float16 => 256,
        _ => 1000,
    }
}

/// The input element `i` of `rank` for a reduction with `op`.
pub fn reduce_input<T: TestElem>(op: RedOp, rank: usize, i: usize, seed: u64) -> T {
    let h = (rank as u64)
        .wrapping_mul(31)
        .wrapping_add((i as u64).wrapping_mul(7))
        .wrapping_add(seed);
    let v = match op {
        RedOp::Sum | RedOp::Avg => (h % sum_bound(T::DTYPE) as u64) as i64,
        RedOp::Prod => 1 + ((rank + i) % 2) as i64,
        RedOp::Max | RedOp::Min => {
            let v = (h % 21) as i64;
            if matches!(
                T::DTYPE,
                DataType::Uint8 | DataType::Uint32 | DataType::Uint64
            ) {
                v
            } else {
                v - 10
            }
        }
    };
    T::from_i64(v)
}

/// The reference reduction of element `i` over `n` ranks.
pub fn reduce_expected<T: TestElem>(op: RedOp, n: usize, i: usize, seed: u64) -> T {
    let mut acc: T = reduce_input(op, 0, i, seed);
    for r in 1..n {
        acc = T::combine(acc, reduce_input(op, r, i, seed), op);
    }
    if op == RedOp::Avg {
        acc.div(n)
    } else {
        acc
    }
}

/// Arbitrary bytes for element `i` of `rank` (data movement collectives),
/// compared bit for bit.
pub fn move_input<T: TestElem>(rank: usize, i: usize, seed: u64) -> T {
    let mut x = (rank as u64) << 40 ^ (i as u64) ^ seed.rotate_left(17);
    x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 29;
    let bytes = x.to_le_bytes();
    let size = std::mem::size_of::<T>();
    bytemuck::pod_read_unaligned(&bytes[..size])
}

/// Compares `got` with `want`: bit for bit, or within tolerance for float
/// averages. Returns the number of wrong elements.
pub fn count_wrong<T: TestElem>(got: &[T], want: impl Fn(usize) -> T, op: Option<RedOp>) -> usize {
    let tolerant = op == Some(RedOp::Avg) && T::DTYPE.is_float();
    got.iter()
        .enumerate()
        .filter(|&(i, g)| {
            let w = want(i);
            if tolerant {
                !T::close(*g, w)
            } else {
                bytemuck::bytes_of(g) != bytemuck::bytes_of(&w)
            }
        })
        .count()
}
