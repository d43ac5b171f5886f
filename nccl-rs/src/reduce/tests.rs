use super::*;
use bytemuck::Pod;

const LENS: [usize; 5] = [0, 1, 7, 1000, 1027];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

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
                let r = rng.next();
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
    let r = rng.next();
    match r % 8 {
        0 => f64::from_bits(rng.next()),
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
        if rng.next() & 7 == 0 {
            f32::from_bits(rng.next() as u32)
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
                let r = rng.next();
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

fn run_inplace<T: Pod>(dtype: DataType, op: RedOp, a: &[T], b: &[T]) -> Vec<T> {
    let mut d = a.to_vec();
    reduce_inplace(
        dtype,
        op,
        bytemuck::cast_slice_mut(&mut d),
        bytemuck::cast_slice(b),
    );
    d
}

#[test]
fn integer_semantics() {
    let r = run_inplace(DataType::Int32, RedOp::Sum, &[i32::MAX, -5], &[1, 2]);
    assert_eq!(r, [i32::MIN, -3]);
    let r = run_inplace(DataType::Uint8, RedOp::Prod, &[200u8, 3], &[2, 5]);
    assert_eq!(r, [144, 15]);
    let r = run_inplace(DataType::Int64, RedOp::Min, &[-1i64, 4], &[1, 3]);
    assert_eq!(r, [-1, 3]);
    let r = run_inplace(DataType::Uint64, RedOp::Max, &[u64::MAX, 0], &[1, 0]);
    assert_eq!(r, [u64::MAX, 0]);

    let mut v = [-7i32, 7, -8, 9, i32::MIN];
    divide(DataType::Int32, bytemuck::cast_slice_mut(&mut v), 2);
    assert_eq!(v, [-3, 3, -4, 4, i32::MIN / 2]);
    let mut v = [i8::MIN, -127, 127, 5];
    divide(DataType::Int8, bytemuck::cast_slice_mut(&mut v), 128);
    assert_eq!(v, [-1, 0, 0, 0]);
    let mut v = [255u8, 10];
    divide(DataType::Uint8, bytemuck::cast_slice_mut(&mut v), 1000);
    assert_eq!(v, [0, 0]);
    let mut v = [u8::MAX, 3];
    scale(DataType::Uint8, bytemuck::cast_slice_mut(&mut v), &[2]);
    assert_eq!(v, [254, 6]);
    let mut v = [3i64, -4];
    scale(
        DataType::Int64,
        bytemuck::cast_slice_mut(&mut v),
        &(-2i64).to_le_bytes(),
    );
    assert_eq!(v, [-6, 8]);
}

#[test]
fn float_semantics() {
    let nan = f32::NAN;
    let r = run_inplace(
        DataType::Float32,
        RedOp::Max,
        &[nan, 1.0, nan, -0.0],
        &[2.0, nan, nan, 0.0],
    );
    assert_eq!(r[..2], [2.0, 1.0]);
    assert!(r[2].is_nan());
    assert_eq!(r[3].to_bits(), 0.0f32.to_bits());
    let r = run_inplace(
        DataType::Float64,
        RedOp::Min,
        &[0.0, 1.0, nan as f64],
        &[-0.0, -1.0, 3.0],
    );
    assert_eq!(r[0].to_bits(), (-0.0f64).to_bits());
    assert_eq!(r[1..], [-1.0, 3.0]);

    // f16: 1 + 2^-11 is a tie between 1 and 1 + 2^-10; ties to even gives 1.
    let one = f16::ONE;
    let r = run_inplace(
        DataType::Float16,
        RedOp::Sum,
        &[one, one],
        &[
            f16::from_f32(2f32.powi(-11)),
            f16::from_f32(3.0 * 2f32.powi(-11)),
        ],
    );
    assert_eq!(r, [one, f16::from_f32(1.0 + 2.0 * 2f32.powi(-10))]);
    let r = run_inplace(DataType::Float16, RedOp::Sum, &[f16::MAX], &[f16::MAX]);
    assert_eq!(r, [f16::INFINITY]);
    let r = run_inplace(
        DataType::Bfloat16,
        RedOp::Prod,
        &[bf16::from_f32(3.0)],
        &[bf16::from_f32(1.0 / 3.0)],
    );
    assert_eq!(
        r,
        [bf16::from_f32(3.0 * bf16::from_f32(1.0 / 3.0).to_f32())]
    );

    // FP8 saturates.
    let m = F8E4M3::MAX;
    let r = run_inplace(
        DataType::Float8e4m3,
        RedOp::Sum,
        &[m, F8E4M3::MIN],
        &[m, F8E4M3::MIN],
    );
    assert_eq!(r, [m, F8E4M3::MIN]);
    let m = F8E5M2::MAX;
    let r = run_inplace(DataType::Float8e5m2, RedOp::Prod, &[m], &[m]);
    assert_eq!(r, [m]);
    let x = F8E4M3::from_f32(1.5);
    let r = run_inplace(DataType::Float8e4m3, RedOp::Sum, &[x], &[x]);
    assert_eq!(r[0].to_f32(), 3.0);

    let mut v = [F8E4M3::from_f32(3.0)];
    divide(DataType::Float8e4m3, bytemuck::cast_slice_mut(&mut v), 2);
    assert_eq!(v[0].to_f32(), 1.5);
    let mut v = [1.0f32, 3.0];
    divide(DataType::Float32, bytemuck::cast_slice_mut(&mut v), 4);
    assert_eq!(v, [0.25, 0.75]);
    let mut v = [1.5f32, -2.0];
    scale(
        DataType::Float32,
        bytemuck::cast_slice_mut(&mut v),
        &2.0f32.to_le_bytes(),
    );
    assert_eq!(v, [3.0, -4.0]);
    let mut v = [f16::from_f32(1.5)];
    scale(
        DataType::Float16,
        bytemuck::cast_slice_mut(&mut v),
        &f16::from_f32(-0.5).to_le_bytes(),
    );
    assert_eq!(v, [f16::from_f32(-0.75)]);
}

#[test]
fn chunking_does_not_change_results() {
    let mut rng = Rng(42);
    for dtype in [
        DataType::Float16,
        DataType::Float32,
        DataType::Float8e5m2,
        DataType::Int64,
    ] {
        let size = dtype.size();
        let n = 3001;
        let a: Vec<u8> = (0..n * size).map(|_| rng.next() as u8).collect();
        let b: Vec<u8> = (0..n * size).map(|_| rng.next() as u8).collect();
        let mut whole = a.clone();
        reduce_inplace(dtype, RedOp::Sum, &mut whole, &b);
        let mut pieces = a.clone();
        let mut at = 0;
        while at < n {
            let len = ((rng.next() % 97) as usize + 1).min(n - at);
            let r = at * size..(at + len) * size;
            reduce_inplace(dtype, RedOp::Sum, &mut pieces[r.clone()], &b[r]);
            at += len;
        }
        assert_eq!(whole, pieces, "{dtype}");
    }
}

#[test]
fn bf16_conversions_match_half() {
    let mut rng = Rng(7);
    let mut xs: Vec<u32> = (0..=0xFFFFu32).map(|h| h << 16).collect();
    for h in 0..=0xFFFFu32 {
        for lo in [0x7FFF, 0x8000, 0x8001, 0xFFFF, rng.next() as u32 & 0xFFFF] {
            xs.push(h << 16 | lo);
        }
    }
    let src: Vec<f32> = xs.iter().map(|&b| f32::from_bits(b)).collect();
    let mut got = vec![bf16::ZERO; src.len()];
    <bf16 as narrow::Narrow>::narrow(&src, &mut got);
    for (x, g) in src.iter().zip(&got) {
        assert_eq!(
            g.to_bits(),
            bf16::from_f32(*x).to_bits(),
            "{:#x}",
            x.to_bits()
        );
    }
    let all: Vec<bf16> = (0..=0xFFFFu16).map(bf16::from_bits).collect();
    let mut wide = vec![0f32; all.len()];
    <bf16 as narrow::Narrow>::widen(&all, &mut wide);
    for (b, w) in all.iter().zip(&wide) {
        assert_eq!(w.to_bits(), b.to_f32().to_bits());
    }
}
