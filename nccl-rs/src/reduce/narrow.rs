//! Kernels for the narrow float types (`f16`, `bf16`, FP8), which compute in
//! `f32`: each block of up to [`BLOCK`] elements is widened into stack arrays
//! of `f32`, combined by a plain `f32` loop, and rounded back, so that every
//! stage is a simple loop the compiler can vectorise.

use super::ops::{Kernel, Op};
use crate::fp8::{F8E4M3, F8E5M2};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// Elements widened to `f32` at a time.
const BLOCK: usize = 256;

/// A storage type whose arithmetic is done in `f32`.
pub(super) trait Narrow: bytemuck::Pod {
    /// `dst[i] = src[i] as f32` (exact). Lengths are equal.
    fn widen(src: &[Self], dst: &mut [f32]);
    /// `dst[i] = round(src[i])`, to nearest even (FP8: saturating). Lengths
    /// are equal.
    fn narrow(src: &[f32], dst: &mut [Self]);
    /// One element to `f32`.
    fn to_f32(self) -> f32;
}

impl Narrow for f16 {
    #[inline]
    fn widen(src: &[Self], dst: &mut [f32]) {
        let done = super::wide::f16_widen(src, dst);
        src[done..].convert_to_f32_slice(&mut dst[done..])
    }
    #[inline]
    fn narrow(src: &[f32], dst: &mut [Self]) {
        let done = super::wide::f16_narrow(src, dst);
        dst[done..].convert_from_f32_slice(&src[done..])
    }
    #[inline]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

// bf16 is the top half of an f32, so both directions are a few integer
// operations; written as selects so the loops vectorise. Bit-identical to
// `half::bf16::{to_f32, from_f32}`.
impl Narrow for bf16 {
    #[inline]
    fn widen(src: &[Self], dst: &mut [f32]) {
        let done = super::wide::bf16_widen(src, dst);
        let (src, dst) = (&src[done..], &mut dst[done..]);
        for (d, s) in dst.iter_mut().zip(src) {
            let b = s.to_bits();
            let w = u32::from(b) << 16;
            // NaN: made quiet, as half does.
            let w = if b & 0x7FFF > 0x7F80 {
                w | 0x40_0000
            } else {
                w
            };
            *d = f32::from_bits(w);
        }
    }
    #[inline]
    fn narrow(src: &[f32], dst: &mut [Self]) {
        let done = super::wide::bf16_narrow(src, dst);
        let (src, dst) = (&src[done..], &mut dst[done..]);
        for (d, s) in dst.iter_mut().zip(src) {
            let x = s.to_bits();
            // Round to nearest, ties to even, on the dropped 16 bits.
            let rounded = x.wrapping_add(0x7FFF + ((x >> 16) & 1)) >> 16;
            // NaN: keep the top payload bits and make it quiet.
            let nan = (x >> 16) | 0x40;
            let r = if x & 0x7FFF_FFFF > 0x7F80_0000 {
                nan
            } else {
                rounded
            };
            *d = bf16::from_bits(r as u16);
        }
    }
    #[inline]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

macro_rules! fp8_narrow {
    ($($t:ty),*) => {$(
        impl Narrow for $t {
            #[inline]
            fn widen(src: &[Self], dst: &mut [f32]) {
                for (d, s) in dst.iter_mut().zip(src) {
                    *d = s.to_f32();
                }
            }
            #[inline]
            fn narrow(src: &[f32], dst: &mut [Self]) {
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d = <$t>::from_f32(s);
                }
            }
            #[inline]
            fn to_f32(self) -> f32 {
                <$t>::to_f32(self)
            }
        }
    )*};
}
fp8_narrow!(F8E4M3, F8E5M2);

#[inline(always)]
fn narrow_inplace<T: Narrow, O: Op>(dst: &mut [T], src: &[T]) {
    let mut a = [0f32; BLOCK];
    let mut b = [0f32; BLOCK];
    for (dc, sc) in dst.chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
        let n = dc.len();
        let (a, b) = (&mut a[..n], &mut b[..n]);
        T::widen(dc, a);
        T::widen(sc, b);
        for (x, &y) in a.iter_mut().zip(b.iter()) {
            *x = O::apply(*x, y);
        }
        T::narrow(a, dc);
    }
}

#[inline(always)]
fn narrow_copy<T: Narrow, O: Op>(dst: &mut [T], a: &[T], b: &[T]) {
    let mut fa = [0f32; BLOCK];
    let mut fb = [0f32; BLOCK];
    for ((dc, ac), bc) in dst
        .chunks_mut(BLOCK)
        .zip(a.chunks(BLOCK))
        .zip(b.chunks(BLOCK))
    {
        let n = dc.len();
        let (fa, fb) = (&mut fa[..n], &mut fb[..n]);
        T::widen(ac, fa);
        T::widen(bc, fb);
        for (x, &y) in fa.iter_mut().zip(fb.iter()) {
            *x = O::apply(*x, y);
        }
        T::narrow(fa, dc);
    }
}

/// `buf[i] = round(f(buf[i] as f32))`, blockwise.
#[inline(always)]
fn narrow_map<T: Narrow>(buf: &mut [T], f: impl Fn(f32) -> f32) {
    let mut a = [0f32; BLOCK];
    for c in buf.chunks_mut(BLOCK) {
        let a = &mut a[..c.len()];
        T::widen(c, a);
        for x in a.iter_mut() {
            *x = f(*x);
        }
        T::narrow(a, c);
    }
}

macro_rules! narrow_kernel {
    ($($t:ty),*) => {$(
        impl Kernel for $t {
            #[inline(always)]
            fn inplace<O: Op>(dst: &mut [Self], src: &[Self]) {
                narrow_inplace::<$t, O>(dst, src)
            }
            #[inline(always)]
            fn copy<O: Op>(dst: &mut [Self], a: &[Self], b: &[Self]) {
                narrow_copy::<$t, O>(dst, a, b)
            }
            fn divide(buf: &mut [Self], n: usize) {
                let d = n as f32;
                narrow_map(buf, |x| x / d)
            }
            fn scale(buf: &mut [Self], s: Self) {
                let s = Narrow::to_f32(s);
                narrow_map(buf, |x| x * s)
            }
        }
    )*};
}
narrow_kernel!(f16, bf16, F8E4M3, F8E5M2);
