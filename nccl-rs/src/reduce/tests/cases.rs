//! Hand-written cases for each semantic rule, and chunking independence.

use super::super::*;
use super::Rng;
use bytemuck::Pod;

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
        let a: Vec<u8> = (0..n * size).map(|_| rng.next_u64() as u8).collect();
        let b: Vec<u8> = (0..n * size).map(|_| rng.next_u64() as u8).collect();
        let mut whole = a.clone();
        reduce_inplace(dtype, RedOp::Sum, &mut whole, &b);
        let mut pieces = a.clone();
        let mut at = 0;
        while at < n {
            let len = ((rng.next_u64() % 97) as usize + 1).min(n - at);
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
        for lo in [
            0x7FFF,
            0x8000,
            0x8001,
            0xFFFF,
            rng.next_u64() as u32 & 0xFFFF,
        ] {
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
