//! Test data whose expected results are exact.
//!
//! Every input element is a small integer derived from (rank, index) by a
//! hash, chosen per datatype and operation so that every partial result of
//! the reduction, in any order, is exactly representable in the datatype:
//! sums stay within the type's exactly-representable integers (e.g. 2048
//! for `half`, 8 for `f8e5m2`), products are powers of two (inputs in
//! {1, 2}, at most as many factors 2 as the type holds), max/min use any
//! small integers. The expected output is then computed on the host in
//! `i64` and converted once, and compared bit-exactly.
//!
//! The one exception is `avg` on floating-point types: the library may
//! divide with a rounding of its own, so those results are compared with a
//! tolerance of `2 * nranks * eps * max|input|` (eps: the type's relative
//! precision, 2^-23 for `float`, 2^-10 for `half`, 2^-2 for `f8e5m2`).

use half::{bf16, f16};
use nccl_rs::fp8::{F8E4M3, F8E5M2};
use nccl_rs::{Element, RedOp};

/// An element type the perf tools can fill and check.
pub trait TestElem: Element {
    /// The largest integer `M` such that all integers in `[-M, M]` (or
    /// `[0, M]` for unsigned types) are exact in this type.
    const EXACT_MAX: i64;
    /// The largest `k` with `2^k` exact (and below `2^63`).
    const POW2_MAX: u32;
    /// Whether negative values exist.
    const SIGNED: bool;
    /// Relative precision (2^-mantissa bits); 0 for integers.
    const EPS: f64;
    /// Converts a small integer (exact when within `EXACT_MAX`).
    fn from_i64(v: i64) -> Self;
    /// Converts a float, rounding to nearest (used for float averages).
    fn from_f64(v: f64) -> Self;
    /// The value as `f64`.
    fn to_f64(self) -> f64;
}

macro_rules! int_elem {
    ($($t:ty => $max:expr, $pow:expr, $signed:expr);* $(;)?) => {$(
        impl TestElem for $t {
            const EXACT_MAX: i64 = $max;
            const POW2_MAX: u32 = $pow;
            const SIGNED: bool = $signed;
            const EPS: f64 = 0.0;
            fn from_i64(v: i64) -> Self { v as $t }
            fn from_f64(v: f64) -> Self { v as $t }
            fn to_f64(self) -> f64 { self as f64 }
        }
    )*};
}

int_elem! {
    i8 => i8::MAX as i64, 6, true;
    u8 => u8::MAX as i64, 7, false;
    i32 => i32::MAX as i64, 30, true;
    u32 => u32::MAX as i64, 31, false;
    i64 => i64::MAX, 62, true;
    u64 => i64::MAX, 62, false;
}

macro_rules! float_elem {
    ($($t:ty => $max:expr, $pow:expr, $eps:expr, |$x:ident| $from:expr, |$y:ident| $to:expr);* $(;)?) => {$(
        impl TestElem for $t {
            const EXACT_MAX: i64 = $max;
            const POW2_MAX: u32 = $pow;
            const SIGNED: bool = true;
            const EPS: f64 = $eps;
            fn from_i64(v: i64) -> Self { Self::from_f64(v as f64) }
            fn from_f64($x: f64) -> Self { $from }
            fn to_f64(self) -> f64 { let $y = self; $to }
        }
    )*};
}

float_elem! {
    f16 => 1 << 11, 15, 1.0 / 1024.0, |x| f16::from_f64(x), |y| y.to_f64();
    f32 => 1 << 24, 62, 1.0 / 8388608.0, |x| x as f32, |y| y as f64;
    f64 => 1 << 53, 62, 1.0 / 4503599627370496.0, |x| x, |y| y;
    bf16 => 1 << 8, 62, 1.0 / 128.0, |x| bf16::from_f64(x), |y| y.to_f64();
    F8E4M3 => 16, 8, 0.125, |x| F8E4M3::from_f32(x as f32), |y| y.to_f32() as f64;
    F8E5M2 => 8, 15, 0.25, |x| F8E5M2::from_f32(x as f32), |y| y.to_f32() as f64;
}

/// How input values are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueGen {
    /// Data movement: values in `0..=hi`.
    Move {
        /// Largest value.
        hi: i64,
    },
    /// Sums (and averages): values in `lo..=hi` on ranks below `ranks`,
    /// zero elsewhere, so that `|sum|` stays exact.
    Sum {
        /// Smallest value.
        lo: i64,
        /// Largest value.
        hi: i64,
        /// Ranks that contribute non-zero values.
        ranks: usize,
    },
    /// Products: 1 or 2 on ranks below `ranks`, 1 elsewhere.
    Prod {
        /// Ranks that may contribute a factor 2.
        ranks: usize,
    },
    /// Max and min: values in `lo..=hi`.
    MinMax {
        /// Smallest value.
        lo: i64,
        /// Largest value.
        hi: i64,
    },
}

/// A cheap, well-mixed hash of (rank, index).
fn mix(rank: usize, idx: usize) -> u64 {
    let mut x = (idx as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (rank as u64 + 1).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^ (x >> 29)
}

impl ValueGen {
    /// The generator for data movement in type `T`.
    pub fn movement<T: TestElem>() -> Self {
        ValueGen::Move {
            hi: T::EXACT_MAX.min(100),
        }
    }

    /// The generator for reducing with `op` over `nranks` ranks in type `T`.
    pub fn reduction<T: TestElem>(op: RedOp, nranks: usize) -> Self {
        let n = nranks.max(1);
        let m = T::EXACT_MAX;
        match op {
            RedOp::Sum | RedOp::Avg => {
                let cap = (m / n as i64).min(100);
                if cap >= 1 {
                    let lo = if T::SIGNED { -cap } else { 0 };
                    ValueGen::Sum {
                        lo,
                        hi: cap,
                        ranks: n,
                    }
                } else {
                    // More ranks than exact integers: only `m` ranks add ±1.
                    let lo = if T::SIGNED { -1 } else { 0 };
                    ValueGen::Sum {
                        lo,
                        hi: 1,
                        ranks: m as usize,
                    }
                }
            }
            RedOp::Prod => ValueGen::Prod {
                ranks: n.min(T::POW2_MAX as usize),
            },
            RedOp::Max | RedOp::Min => {
                let hi = m.min(100);
                let lo = if T::SIGNED { -hi } else { 0 };
                ValueGen::MinMax { lo, hi }
            }
        }
    }

    /// The input value of `rank` at `idx`.
    pub fn value(&self, rank: usize, idx: usize) -> i64 {
        let h = mix(rank, idx);
        let pick = |lo: i64, hi: i64| lo + (h % (hi - lo + 1) as u64) as i64;
        match *self {
            ValueGen::Move { hi } => pick(0, hi),
            ValueGen::Sum { lo, hi, ranks } => {
                if rank < ranks {
                    pick(lo, hi)
                } else {
                    0
                }
            }
            ValueGen::Prod { ranks } => {
                if rank < ranks && h & 1 == 1 {
                    2
                } else {
                    1
                }
            }
            ValueGen::MinMax { lo, hi } => pick(lo, hi),
        }
    }

    /// The largest input magnitude.
    pub fn max_abs(&self) -> i64 {
        match *self {
            ValueGen::Move { hi } => hi,
            ValueGen::Sum { lo, hi, .. } | ValueGen::MinMax { lo, hi } => lo.abs().max(hi),
            ValueGen::Prod { .. } => 2,
        }
    }
}

/// Reduces the inputs of all ranks at `idx` with `op`, then converts to `T`
/// (for `avg`: integers divide truncating like C, floats round once).
pub fn reduce_at<T: TestElem>(gen: &ValueGen, op: RedOp, nranks: usize, idx: usize) -> T {
    let vals = (0..nranks).map(|r| gen.value(r, idx));
    match op {
        RedOp::Sum => T::from_i64(vals.sum()),
        RedOp::Prod => T::from_i64(vals.product()),
        RedOp::Max => T::from_i64(vals.max().unwrap_or(0)),
        RedOp::Min => T::from_i64(vals.min().unwrap_or(0)),
        RedOp::Avg => {
            let sum: i64 = vals.sum();
            if T::EPS == 0.0 {
                T::from_i64(sum / nranks as i64)
            } else {
                T::from_f64(sum as f64 / nranks as f64)
            }
        }
    }
}

/// The absolute tolerance when comparing results of `op` in `T`, or `None`
/// for a bit-exact comparison (see the module documentation).
pub fn tolerance<T: TestElem>(gen: &ValueGen, op: RedOp, nranks: usize) -> Option<f64> {
    (op == RedOp::Avg && T::EPS > 0.0)
        .then(|| 2.0 * nranks as f64 * T::EPS * gen.max_abs().max(1) as f64)
}

/// Counts the elements of `got` that differ from `want`.
pub fn count_wrong<T: TestElem>(got: &[T], want: &[T], tol: Option<f64>) -> u64 {
    debug_assert_eq!(got.len(), want.len());
    let wrong = got.iter().zip(want).filter(|(g, w)| match tol {
        None => bytemuck::bytes_of(*g) != bytemuck::bytes_of(*w),
        Some(tol) => {
            let d = (g.to_f64() - w.to_f64()).abs();
            d.is_nan() || d > tol
        }
    });
    wrong.count() as u64
}

/// Fills `buf[k]` with the value of `rank` at index `base + k`.
pub fn fill<T: TestElem>(buf: &mut [T], gen: &ValueGen, rank: usize, base: usize) {
    for (k, x) in buf.iter_mut().enumerate() {
        *x = T::from_i64(gen.value(rank, base + k));
    }
}

/// Fills `buf` with an all-ones byte pattern (NaN for floats, -1 or the
/// maximum for integers), so that unwritten output is noticed.
pub fn poison<T: TestElem>(buf: &mut [T]) {
    bytemuck::cast_slice_mut::<T, u8>(buf).fill(0xFF);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reduces in `T`'s own arithmetic, rounding after every step as a
    /// narrow-type kernel would, in the given rank order.
    fn reduce_in_type<T: TestElem>(gen: &ValueGen, op: RedOp, order: &[usize], idx: usize) -> T {
        let mut acc = T::from_i64(gen.value(order[0], idx));
        for &r in &order[1..] {
            let x = T::from_i64(gen.value(r, idx)).to_f64();
            let a = acc.to_f64();
            let v = match op {
                RedOp::Sum | RedOp::Avg => a + x,
                RedOp::Prod => a * x,
                RedOp::Max => a.max(x),
                RedOp::Min => a.min(x),
            };
            acc = T::from_f64(v);
        }
        acc
    }

    fn exact_for<T: TestElem>() {
        for n in 1..=9 {
            for op in [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min] {
                let gen = ValueGen::reduction::<T>(op, n);
                let fwd: Vec<usize> = (0..n).collect();
                let rev: Vec<usize> = (0..n).rev().collect();
                for idx in 0..500 {
                    // Inputs are exact.
                    for r in 0..n {
                        let v = gen.value(r, idx);
                        assert_eq!(T::from_i64(v).to_f64(), v as f64, "{:?} input", T::DTYPE);
                    }
                    let want: T = reduce_at(&gen, op, n, idx);
                    for order in [&fwd, &rev] {
                        let got: T = reduce_in_type(&gen, op, order, idx);
                        assert_eq!(
                            count_wrong(&[got], &[want], None),
                            0,
                            "{:?} {op:?} n={n} idx={idx}",
                            T::DTYPE
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn reductions_are_exact_in_every_type() {
        exact_for::<i8>();
        exact_for::<u8>();
        exact_for::<i32>();
        exact_for::<u32>();
        exact_for::<i64>();
        exact_for::<u64>();
        exact_for::<f16>();
        exact_for::<f32>();
        exact_for::<f64>();
        exact_for::<bf16>();
        exact_for::<F8E4M3>();
        exact_for::<F8E5M2>();
    }

    #[test]
    fn half_sum_at_three_ranks() {
        let gen = ValueGen::reduction::<f16>(RedOp::Sum, 3);
        assert_eq!(
            gen,
            ValueGen::Sum {
                lo: -100,
                hi: 100,
                ranks: 3
            }
        );
        let mut nonzero = 0;
        for idx in 0..1000 {
            let want: f16 = reduce_at(&gen, RedOp::Sum, 3, idx);
            let exact: i64 = (0..3).map(|r| gen.value(r, idx)).sum();
            assert_eq!(want.to_f64(), exact as f64);
            nonzero += usize::from(exact != 0);
        }
        assert!(nonzero > 900, "values should vary");
    }

    #[test]
    fn fp8_ranges() {
        // e5m2 holds integers up to 8: at 8 ranks sums use {-1, 0, 1}.
        assert_eq!(
            ValueGen::reduction::<F8E5M2>(RedOp::Sum, 8),
            ValueGen::Sum {
                lo: -1,
                hi: 1,
                ranks: 8
            }
        );
        // At 9 ranks only 8 contribute.
        assert_eq!(
            ValueGen::reduction::<F8E5M2>(RedOp::Sum, 9),
            ValueGen::Sum {
                lo: -1,
                hi: 1,
                ranks: 8
            }
        );
        assert_eq!(
            ValueGen::reduction::<F8E4M3>(RedOp::Prod, 16),
            ValueGen::Prod { ranks: 8 }
        );
        assert_eq!(
            ValueGen::reduction::<u8>(RedOp::Max, 4),
            ValueGen::MinMax { lo: 0, hi: 100 }
        );
    }

    #[test]
    fn averages() {
        let gen = ValueGen::Sum {
            lo: -5,
            hi: 5,
            ranks: 3,
        };
        for idx in 0..200 {
            let sum: i64 = (0..3).map(|r| gen.value(r, idx)).sum();
            let got: i32 = reduce_at(&gen, RedOp::Avg, 3, idx);
            assert_eq!(got as i64, sum / 3); // truncating, like C
            let got: f32 = reduce_at(&gen, RedOp::Avg, 3, idx);
            assert_eq!(got, (sum as f64 / 3.0) as f32);
        }
        let g = ValueGen::reduction::<f32>(RedOp::Avg, 4);
        assert!(tolerance::<f32>(&g, RedOp::Avg, 4).unwrap() < 1e-3);
        assert_eq!(tolerance::<f32>(&g, RedOp::Sum, 4), None);
        assert_eq!(tolerance::<i32>(&g, RedOp::Avg, 4), None);
        let a = [1.0f32, 2.0];
        assert_eq!(count_wrong(&a, &[1.0, 2.00001], Some(1e-4)), 0);
        assert_eq!(count_wrong(&a, &[1.0, 2.1], Some(1e-4)), 1);
        assert_eq!(count_wrong(&[f32::NAN], &[1.0], Some(1.0)), 1);
    }

    #[test]
    fn poison_and_fill() {
        let mut b = [0i16 as i32; 4];
        poison(&mut b);
        assert_eq!(b, [-1; 4]);
        let gen = ValueGen::movement::<u8>();
        let mut x = [0u8; 8];
        fill(&mut x, &gen, 1, 10);
        for (k, v) in x.iter().enumerate() {
            assert_eq!(*v as i64, gen.value(1, 10 + k));
            assert!(*v <= 100);
        }
    }
}
