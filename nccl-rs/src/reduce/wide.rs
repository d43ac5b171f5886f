//! Run-time multiversioning of the kernels: the same generic loops compiled a
//! second time with AVX2 and F16C enabled, chosen once per call when the CPU
//! has them (x86-64 only; everywhere else, and on older x86-64 CPUs, the
//! baseline build runs).
//!
//! The results are bit-identical either way: the loops only get wider
//! registers. Float arithmetic is never contracted into FMA (Rust does not
//! fuse `a * b + c`), and the `f16` conversions use the F16C instructions
//! (`vcvtph2ps` / `vcvtps2ph`, round to nearest even) in both builds, because
//! the `half` crate detects F16C at run time too; the AVX2 build lets them
//! run on 8 lanes inside the vectorised block loop instead of behind a
//! detection branch per group of 8.
//!
//! `cargo bench -p nccl-rs --bench reduce` measures both builds on a host.

#![allow(unsafe_code)]

use super::ops::{Kernel, Op};

/// Whether this CPU runs the AVX2 + F16C build (cached by the standard
/// library after the first query).
#[cfg(target_arch = "x86_64")]
#[inline]
fn wide_cpu() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c")
}

/// `dst[i] = O(dst[i], src[i])`, in the widest build this CPU runs.
#[inline]
pub(super) fn inplace<T: Kernel, O: Op>(dst: &mut [T], src: &[T]) {
    #[cfg(target_arch = "x86_64")]
    if wide_cpu() {
        // SAFETY: `inplace_avx2` only requires AVX2 and F16C, which the CPU
        // has (checked just above).
        return unsafe { inplace_avx2::<T, O>(dst, src) };
    }
    T::inplace::<O>(dst, src)
}

/// `dst[i] = O(a[i], b[i])`, in the widest build this CPU runs.
#[inline]
pub(super) fn copy<T: Kernel, O: Op>(dst: &mut [T], a: &[T], b: &[T]) {
    #[cfg(target_arch = "x86_64")]
    if wide_cpu() {
        // SAFETY: as in `inplace`: AVX2 and F16C are present.
        return unsafe { copy_avx2::<T, O>(dst, a, b) };
    }
    T::copy::<O>(dst, a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn inplace_avx2<T: Kernel, O: Op>(dst: &mut [T], src: &[T]) {
    T::inplace::<O>(dst, src)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn copy_avx2<T: Kernel, O: Op>(dst: &mut [T], a: &[T], b: &[T]) {
    T::copy::<O>(dst, a, b)
}

/// `dst[i] = src[i] as f32` for `f16` with F16C, 8 lanes at a time, when
/// the CPU has it; returns how many leading elements it converted (a
/// multiple of 8, or 0 without F16C) so the caller converts the rest.
#[inline]
pub(super) fn f16_widen(src: &[half::f16], dst: &mut [f32]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if wide_cpu() {
        // SAFETY: F16C and AVX2 are present (checked just above).
        return unsafe { f16_widen_f16c(src, dst) };
    }
    let _ = (src, dst);
    0
}

/// `dst[i] = round(src[i])` to `f16` (nearest even) with F16C, as
/// [`f16_widen`]: returns the count converted.
#[inline]
pub(super) fn f16_narrow(src: &[f32], dst: &mut [half::f16]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if wide_cpu() {
        // SAFETY: F16C and AVX2 are present (checked just above).
        return unsafe { f16_narrow_f16c(src, dst) };
    }
    let _ = (src, dst);
    0
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn f16_widen_f16c(src: &[half::f16], dst: &mut [f32]) -> usize {
    use std::arch::x86_64::{__m128i, _mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
    let n = src.len().min(dst.len()) / 8 * 8;
    for (s, d) in src[..n].chunks_exact(8).zip(dst[..n].chunks_exact_mut(8)) {
        // SAFETY: `s` is 8 `f16` (16 bytes) and `d` 8 `f32` (32 bytes);
        // the unaligned load and store intrinsics accept any alignment.
        unsafe {
            let h = _mm_loadu_si128(s.as_ptr().cast::<__m128i>());
            _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(h));
        }
    }
    n
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn f16_narrow_f16c(src: &[f32], dst: &mut [half::f16]) -> usize {
    use std::arch::x86_64::{
        __m128i, _mm256_cvtps_ph, _mm256_loadu_ps, _mm_storeu_si128, _MM_FROUND_TO_NEAREST_INT,
    };
    let n = src.len().min(dst.len()) / 8 * 8;
    for (s, d) in src[..n].chunks_exact(8).zip(dst[..n].chunks_exact_mut(8)) {
        // SAFETY: as in `f16_widen_f16c`, with the sizes swapped.
        unsafe {
            let f = _mm256_loadu_ps(s.as_ptr());
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(f);
            _mm_storeu_si128(d.as_mut_ptr().cast::<__m128i>(), h);
        }
    }
    n
}

/// `bf16` → `f32` with AVX2, 8 lanes at a time (bit-identical to
/// `Narrow::widen` for `bf16`: NaNs made quiet); returns the count
/// converted, 0 without AVX2.
#[inline]
pub(super) fn bf16_widen(src: &[half::bf16], dst: &mut [f32]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if wide_cpu() {
        // SAFETY: AVX2 is present (checked just above).
        return unsafe { bf16_widen_avx2(src, dst) };
    }
    let _ = (src, dst);
    0
}

/// `f32` → `bf16` with AVX2 (round to nearest even, NaNs kept quiet with
/// their top payload bits, as `Narrow::narrow` for `bf16`); returns the
/// count converted.
#[inline]
pub(super) fn bf16_narrow(src: &[f32], dst: &mut [half::bf16]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if wide_cpu() {
        // SAFETY: AVX2 is present (checked just above).
        return unsafe { bf16_narrow_avx2(src, dst) };
    }
    let _ = (src, dst);
    0
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn bf16_widen_avx2(src: &[half::bf16], dst: &mut [f32]) -> usize {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len()) / 8 * 8;
    let low15 = _mm256_set1_epi32(0x7FFF);
    let inf = _mm256_set1_epi32(0x7F80);
    let quiet = _mm256_set1_epi32(0x40_0000);
    for (s, d) in src[..n].chunks_exact(8).zip(dst[..n].chunks_exact_mut(8)) {
        // SAFETY: `s` is 8 `bf16` (16 bytes), `d` 8 `f32` (32 bytes);
        // unaligned loads and stores.
        unsafe {
            let b = _mm256_cvtepu16_epi32(_mm_loadu_si128(s.as_ptr().cast::<__m128i>()));
            let w = _mm256_slli_epi32::<16>(b);
            let nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, low15), inf);
            let w = _mm256_or_si256(w, _mm256_and_si256(nan, quiet));
            _mm256_storeu_si256(d.as_mut_ptr().cast::<__m256i>(), w);
        }
    }
    n
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn bf16_narrow_avx2(src: &[f32], dst: &mut [half::bf16]) -> usize {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len()) / 8 * 8;
    let bias = _mm256_set1_epi32(0x7FFF);
    let one = _mm256_set1_epi32(1);
    let abs = _mm256_set1_epi32(0x7FFF_FFFF);
    let inf = _mm256_set1_epi32(0x7F80_0000);
    let quiet = _mm256_set1_epi32(0x40);
    for (s, d) in src[..n].chunks_exact(8).zip(dst[..n].chunks_exact_mut(8)) {
        // SAFETY: `s` is 8 `f32` (32 bytes), `d` 8 `bf16` (16 bytes);
        // unaligned loads and stores.
        unsafe {
            let x = _mm256_loadu_si256(s.as_ptr().cast::<__m256i>());
            let hi = _mm256_srli_epi32::<16>(x);
            let round = _mm256_add_epi32(bias, _mm256_and_si256(hi, one));
            let rounded = _mm256_srli_epi32::<16>(_mm256_add_epi32(x, round));
            let nan = _mm256_or_si256(hi, quiet);
            let is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs), inf);
            let r = _mm256_blendv_epi8(rounded, nan, is_nan);
            // Every lane is below 0x1_0000: the unsigned-saturating pack
            // keeps it; packing works per 128-bit half, so reorder.
            let packed = _mm256_packus_epi32(r, r);
            let ordered = _mm256_permute4x64_epi64::<0b1000>(packed);
            _mm_storeu_si128(
                d.as_mut_ptr().cast::<__m128i>(),
                _mm256_castsi256_si128(ordered),
            );
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::super::narrow::Narrow;
    use half::{bf16, f16};

    /// The 8-lane conversions against the one-element paths (which never
    /// take them), over every 16-bit pattern and a spread of `f32`s with
    /// NaN payloads, infinities, subnormals and rounding ties.
    fn check_type<T: Narrow>(
        from_bits: impl Fn(u16) -> T,
        widen: fn(&[T], &mut [f32]) -> usize,
        narrow: fn(&[f32], &mut [T]) -> usize,
    ) {
        let all: Vec<T> = (0..=u16::MAX).map(&from_bits).collect();
        let mut wide = vec![0f32; all.len()];
        let done = widen(&all, &mut wide);
        for (i, (x, w)) in all.iter().zip(&wide).enumerate().take(done) {
            let mut one = [0f32];
            T::widen(std::slice::from_ref(x), &mut one);
            assert_eq!(w.to_bits(), one[0].to_bits(), "widen of pattern {i:#06x}");
        }
        let mut floats: Vec<f32> = wide.clone();
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..(1 << 18) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            floats.push(f32::from_bits(s as u32));
            // Halfway between neighbours of the narrow type.
            floats.push(f32::from_bits((s as u32 & 0xFFFF_0000) | 0x8000));
        }
        floats.truncate(floats.len() / 8 * 8);
        let mut narrowed = vec![from_bits(0); floats.len()];
        let done = narrow(&floats, &mut narrowed);
        for (f, n) in floats.iter().zip(&narrowed).take(done) {
            let mut one = [from_bits(0)];
            T::narrow(std::slice::from_ref(f), &mut one);
            assert_eq!(
                bytemuck::bytes_of(n),
                bytemuck::bytes_of(&one[0]),
                "narrow of {:#010x}",
                f.to_bits()
            );
        }
    }

    #[test]
    fn f16_lanes_match_scalar() {
        check_type(f16::from_bits, super::f16_widen, super::f16_narrow);
    }

    #[test]
    fn bf16_lanes_match_scalar() {
        check_type(bf16::from_bits, super::bf16_widen, super::bf16_narrow);
    }
}
