//! Kernels against a scalar reference, for every type and operation, at
//! several lengths and alignments.

use super::*;
pub(super) use crate::testing::Rng;
use bytemuck::Pod;

mod cases;

const LENS: [usize; 5] = [0, 1, 7, 1000, 1027];

/// A byte buffer at a chosen offset from an 8-aligned base.
struct Buf {
    words: Vec<u64>,
    off: usize,
    len: usize,
}

impl Buf {
    fn new(bytes: &[u8], off: usize) -> Buf {
        let mut b = Buf {
            words: vec![0; bytes.len() / 8 + 2],
            off,
            len: bytes.len(),
        };
        b.bytes_mut().copy_from_slice(bytes);
        b
    }
    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[self.off..self.off + self.len]
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[self.off..self.off + self.len]
    }
}

/// Scalar reference semantics, written independently of the kernels.
trait TestElem: Pod + std::fmt::Debug {
    fn gen(rng: &mut Rng) -> Self;
    fn reference(op: RedOp, a: Self, b: Self) -> Self;
    fn ref_div(self, n: usize) -> Self;
    fn ref_scale(self, s: Self) -> Self;
    fn is_nan(self) -> bool;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl TestElem for $t {
            fn gen(rng: &mut Rng) -> Self {
                let r = rng.next_u64();
                // Mix full-range values with small ones.
                if r & 1 == 0 { (r >> 8) as $t } else { ((r >> 8) % 7) as $t }
            }
            fn reference(op: RedOp, a: Self, b: Self) -> Self {
                match op {
                    RedOp::Sum | RedOp::Avg => a.wrapping_add(b),
                    RedOp::Prod => a.wrapping_mul(b),
                    RedOp::Max => std::cmp::max(a, b),
                    RedOp::Min => std::cmp::min(a, b),
                }
            }
            fn ref_div(self, n: usize) -> Self {
                (self as i128 / n as i128) as $t
            }
            fn ref_scale(self, s: Self) -> Self {
                self.wrapping_mul(s)
            }
            fn is_nan(self) -> bool {
                false
            }
        }
    )*};
}
int_elem!(i8, u8, i32, u32, i64, u64);

fn ref_f64(op: RedOp, a: f64, b: f64) -> f64 {
    match op {
        RedOp::Sum | RedOp::Avg => a + b,
        RedOp::Prod => a * b,
        RedOp::Max | RedOp::Min => {
            let max = op == RedOp::Max;
            if a.is_nan() {
                b
            } else if b.is_nan() {
                a
            } else if a == b && a == 0.0 {
                let both_neg = a.is_sign_negative() && b.is_sign_negative();
                let any_neg = a.is_sign_negative() || b.is_sign_negative();
                if (max && both_neg) || (!max && any_neg) {
                    -0.0
                } else {
                    0.0
                }
            } else if (a > b) == max {
                a
            } else {
                b
            }
        }
    }
}

fn ref_f32(op: RedOp, a: f32, b: f32) -> f32 {
    match op {
        RedOp::Sum | RedOp::Avg => a + b,
        RedOp::Prod => a * b,
        // Max/min pick an operand (or a signed zero): exact in f64.
        _ => ref_f64(op, a as f64, b as f64) as f32,
    }
}

fn gen_f64(rng: &mut Rng) -> f64 {
    let r = rng.next_u64();
    match r % 8 {
        0 => f64::from_bits(rng.next_u64()),
        1 => [0.0, -0.0, f64::NAN, f64::INFINITY, -f64::INFINITY][(r >> 8) as usize % 5],
        _ => ((r >> 16) as i32 as f64) / 65536.0,
    }
}

impl TestElem for f64 {
    fn gen(rng: &mut Rng) -> Self {
        gen_f64(rng)
    }
    fn reference(op: RedOp, a: Self, b: Self) -> Self {
        ref_f64(op, a, b)
    }
    fn ref_div(self, n: usize) -> Self {
        self / n as f64
    }
    fn ref_scale(self, s: Self) -> Self {
        self * s
    }
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
}

impl TestElem for f32 {
    fn gen(rng: &mut Rng) -> Self {
        if rng.next_u64() & 7 == 0 {
            f32::from_bits(rng.next_u64() as u32)
        } else {
            gen_f64(rng) as f32
        }
    }
    fn reference(op: RedOp, a: Self, b: Self) -> Self {
        ref_f32(op, a, b)
    }
    fn ref_div(self, n: usize) -> Self {
        self / n as f32
    }
    fn ref_scale(self, s: Self) -> Self {
        self * s
    }
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
}

macro_rules! narrow_elem {
    ($($t:ty => $bits:ty),*) => {$(
        impl TestElem for $t {
            fn gen(rng: &mut Rng) -> Self {
                let r = rng.next_u64();
                if r % 4 == 0 {
                    <$t>::from_bits((r >> 8) as $bits)
                } else {
                    <$t>::from_f32(gen_f64(rng) as f32 / 64.0)
                }
            }
            fn reference(op: RedOp, a: Self, b: Self) -> Self {
                <$t>::from_f32(ref_f32(op, a.to_f32(), b.to_f32()))
            }
            fn ref_div(self, n: usize) -> Self {
                <$t>::from_f32(self.to_f32() / n as f32)
            }
            fn ref_scale(self, s: Self) -> Self {
                <$t>::from_f32(self.to_f32() * s.to_f32())
            }
            fn is_nan(self) -> bool {
                self.to_f32().is_nan()
            }
        }
    )*};
}
narrow_elem!(f16 => u16, bf16 => u16, F8E4M3 => u8, F8E5M2 => u8);

fn gen_bytes<T: TestElem>(rng: &mut Rng, n: usize) -> Vec<u8> {
    let v: Vec<T> = (0..n).map(|_| T::gen(rng)).collect();
    bytemuck::cast_slice(&v).to_vec()
}

fn elems<T: Pod>(bytes: &[u8]) -> Vec<T> {
    bytes
        .chunks(std::mem::size_of::<T>())
        .map(bytemuck::pod_read_unaligned)
        .collect()
}

/// Equal bits, or both NaN.
fn assert_same<T: TestElem>(what: &str, got: &[u8], want: &[T]) {
    let got: Vec<T> = elems(got);
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || bytemuck::bytes_of(g) == bytemuck::bytes_of(w);
        assert!(ok, "{what}: element {i}: got {g:?}, want {w:?}");
    }
}

fn check_reduce<T: TestElem>(dtype: DataType) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ dtype as u64);
    for op in RedOp::ALL {
        for n in LENS {
            let a = gen_bytes::<T>(&mut rng, n);
            let b = gen_bytes::<T>(&mut rng, n);
            let want: Vec<T> = elems::<T>(&a)
                .into_iter()
                .zip(elems::<T>(&b))
                .map(|(x, y)| T::reference(op, x, y))
                .collect();
            let what = format!("{dtype} {op} n={n}");
            // Offsets 0 (aligned) and 1, 3 (misaligned for every multi-byte type).
            for (od, oa, ob) in [(0, 0, 0), (1, 1, 1), (0, 3, 0), (3, 0, 1), (1, 0, 0)] {
                let mut d = Buf::new(&a, od);
                let s = Buf::new(&b, ob);
                reduce_inplace(dtype, op, d.bytes_mut(), s.bytes());
                assert_same(&format!("inplace {what} off={od},{ob}"), d.bytes(), &want);

                let mut d = Buf::new(&vec![0xA5; a.len()], od);
                let (x, y) = (Buf::new(&a, oa), Buf::new(&b, ob));
                reduce_copy(dtype, op, d.bytes_mut(), x.bytes(), y.bytes());
                assert_same(&format!("copy {what} off={od},{oa},{ob}"), d.bytes(), &want);
            }
        }
    }
}

fn check_divide_scale<T: TestElem>(dtype: DataType) {
    let mut rng = Rng(0x1234_5678 ^ dtype as u64);
    for n in LENS {
        let a = gen_bytes::<T>(&mut rng, n);
        for ranks in [1usize, 2, 3, 7, 300, 1 << 40] {
            let want: Vec<T> = elems::<T>(&a)
                .into_iter()
                .map(|x| x.ref_div(ranks))
                .collect();
            for off in [0, 1] {
                let mut buf = Buf::new(&a, off);
                divide(dtype, buf.bytes_mut(), ranks);
                assert_same(
                    &format!("divide {dtype} n={n} by {ranks}"),
                    buf.bytes(),
                    &want,
                );
            }
        }
        let s = T::gen(&mut rng);
        let want: Vec<T> = elems::<T>(&a).into_iter().map(|x| x.ref_scale(s)).collect();
        for off in [0, 1, 2] {
            let mut buf = Buf::new(&a, off);
            scale(dtype, buf.bytes_mut(), bytemuck::bytes_of(&s));
            assert_same(&format!("scale {dtype} n={n}"), buf.bytes(), &want);
        }
    }
}

macro_rules! for_type {
    ($dtype:expr, $f:ident) => {
        match $dtype {
            DataType::Int8 => $f::<i8>($dtype),
            DataType::Uint8 => $f::<u8>($dtype),
            DataType::Int32 => $f::<i32>($dtype),
            DataType::Uint32 => $f::<u32>($dtype),
            DataType::Int64 => $f::<i64>($dtype),
            DataType::Uint64 => $f::<u64>($dtype),
            DataType::Float16 => $f::<f16>($dtype),
            DataType::Float32 => $f::<f32>($dtype),
            DataType::Float64 => $f::<f64>($dtype),
            DataType::Bfloat16 => $f::<bf16>($dtype),
            DataType::Float8e4m3 => $f::<F8E4M3>($dtype),
            DataType::Float8e5m2 => $f::<F8E5M2>($dtype),
        }
    };
}

#[test]
fn every_type_and_op_matches_reference() {
    for dtype in DataType::ALL {
        for_type!(dtype, check_reduce);
    }
}

#[test]
fn divide_and_scale_match_reference() {
    for dtype in DataType::ALL {
        for_type!(dtype, check_divide_scale);
    }
}
