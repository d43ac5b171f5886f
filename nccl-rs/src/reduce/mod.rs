//! Type-erased elementwise reduction kernels over byte buffers.
//!
//! The entry points take a [`DataType`], a [`RedOp`] and byte slices whose
//! lengths are equal multiples of `dtype.size()`. They cast the bytes to the
//! element type (with `bytemuck`, no `unsafe`) and run a loop monomorphised
//! per type and operation, which LLVM vectorises. Buffers that are not aligned
//! for the element type are staged through an aligned stack buffer in blocks
//! and give exactly the same results.
//!
//! # Semantics
//!
//! Every result element depends only on the corresponding input elements and
//! the operand order, never on the buffer length, alignment or how a caller
//! chunks the data, so reductions are bit-reproducible across ranks.
//!
//! * **Integers**: `Sum` and `Prod` wrap (two's complement); `Max`/`Min` are
//!   the natural order. [`divide`] truncates towards zero like C's `/`;
//!   [`scale`] is a wrapping multiply.
//! * **`f32`, `f64`**: native IEEE arithmetic (round to nearest even).
//!   `Max`/`Min` behave like C's `fmax`/`fmin`, which NCCL's kernels use: a
//!   NaN operand is ignored, so the result is NaN only if both operands are
//!   NaN. `-0.0` orders below `+0.0`, which makes them commutative.
//! * **`f16`, `bf16`**: both operands are widened exactly to `f32`, the
//!   operation is done in `f32`, and the result is rounded back once to the
//!   nearest representable value, ties to even (overflow gives ±infinity, NaN
//!   stays NaN). Because `f32` carries more than twice the significand bits of
//!   either format plus two, this single rounding equals the correctly rounded
//!   result of the operation done in the narrow format itself. `Max`/`Min`
//!   use the `f32` rules above.
//! * **FP8 (`F8E4M3`, `F8E5M2`)**: likewise widened exactly to `f32`,
//!   operated on in `f32`, and rounded back once with
//!   [`F8E4M3::from_f32`](crate::fp8::F8E4M3::from_f32) /
//!   [`F8E5M2::from_f32`](crate::fp8::F8E5M2::from_f32): nearest, ties to
//!   even, **saturating** to ±max finite on overflow (±448, ±57344), as
//!   CUDA's `__NV_SATFINITE` conversions NCCL uses.
//! * [`divide`] on floats divides by `n` in `f64` for `f64` and in `f32` for
//!   every other float type, then rounds back as above; [`scale`] likewise
//!   multiplies in `f64` or `f32`.
//!
//! `RedOp::Avg` reduces like `Sum`; the caller applies [`divide`] at the end.
//!
//! Lengths that differ or are not multiples of the element size are caller
//! bugs: they trip a `debug_assert!`, and in release builds only the common
//! whole-element prefix is processed. No path panics on misalignment.

// Unsafe code only in `wide` (calls of the AVX2 build after the CPU check).
#![deny(unsafe_code)]

mod copy;
mod narrow;
mod ops;
mod stream;
#[cfg(test)]
mod tests;
mod wide;

pub(crate) use copy::{copy_mem, disjoint, move_mem, on_cliff};
pub(crate) use stream::{copy_streaming, stream_output_min, STREAM_COPY_MIN, STREAM_PIECE_MIN};

use crate::datatype::{DataType, RedOp};
use crate::fp8::{F8E4M3, F8E5M2};
use half::{bf16, f16};
use ops::{Kernel, Max, Min, Op, Prod, Sum};

/// Picks the element type for `dtype` and calls `$go!(T)`.
macro_rules! dispatch_type {
    ($dtype:expr, $go:ident) => {
        match $dtype {
            DataType::Int8 => $go!(i8),
            DataType::Uint8 => $go!(u8),
            DataType::Int32 => $go!(i32),
            DataType::Uint32 => $go!(u32),
            DataType::Int64 => $go!(i64),
            DataType::Uint64 => $go!(u64),
            DataType::Float16 => $go!(f16),
            DataType::Float32 => $go!(f32),
            DataType::Float64 => $go!(f64),
            DataType::Bfloat16 => $go!(bf16),
            DataType::Float8e4m3 => $go!(F8E4M3),
            DataType::Float8e5m2 => $go!(F8E5M2),
        }
    };
}

/// Picks the element type and operation and calls `$go!(T, O)`.
macro_rules! dispatch {
    ($dtype:expr, $op:expr, $go:ident) => {{
        macro_rules! with_op {
            ($t:ty) => {
                match $op {
                    RedOp::Sum | RedOp::Avg => $go!($t, Sum),
                    RedOp::Prod => $go!($t, Prod),
                    RedOp::Max => $go!($t, Max),
                    RedOp::Min => $go!($t, Min),
                }
            };
        }
        dispatch_type!($dtype, with_op)
    }};
}

/// Bytes staged per block on the misaligned path (a multiple of every
/// element size).
const STAGE_BYTES: usize = 512;

/// An aligned staging buffer (`u64` alignment covers every element type).
type Stage = [u64; STAGE_BYTES / 8];

/// `dst[i] = dst[i] op src[i]`. `RedOp::Avg` reduces like `Sum` (the caller
/// divides later with [`divide`]).
pub(crate) fn reduce_inplace(dtype: DataType, op: RedOp, dst: &mut [u8], src: &[u8]) {
    debug_assert_eq!(dst.len(), src.len(), "reduce_inplace: length mismatch");
    debug_assert_eq!(
        dst.len() % dtype.size(),
        0,
        "reduce_inplace: partial element"
    );
    macro_rules! go {
        ($t:ty, $o:ty) => {
            inplace_bytes::<$t, $o>(dst, src)
        };
    }
    dispatch!(dtype, op, go)
}

/// `dst[i] = a[i] op b[i]` (`dst` is distinct from `a` and `b`).
/// `RedOp::Avg` reduces like `Sum`.
pub(crate) fn reduce_copy(dtype: DataType, op: RedOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    debug_assert!(
        dst.len() == a.len() && a.len() == b.len(),
        "reduce_copy: length mismatch"
    );
    debug_assert_eq!(dst.len() % dtype.size(), 0, "reduce_copy: partial element");
    macro_rules! go {
        ($t:ty, $o:ty) => {
            copy_bytes::<$t, $o>(dst, a, b)
        };
    }
    dispatch!(dtype, op, go)
}

/// `buf[i] = buf[i] / n` (for `RedOp::Avg`). Integers use truncating
/// division like C; floats divide in `f64` (for `f64`) or `f32` and round
/// back. `n == 0` is a caller bug: it trips a `debug_assert!` and otherwise
/// leaves `buf` unchanged.
pub(crate) fn divide(dtype: DataType, buf: &mut [u8], n: usize) {
    debug_assert_eq!(buf.len() % dtype.size(), 0, "divide: partial element");
    debug_assert!(n > 0, "divide by zero ranks");
    if n == 0 {
        return;
    }
    macro_rules! go {
        ($t:ty) => {
            map_bytes::<$t>(buf, |x| <$t as Kernel>::divide(x, n))
        };
    }
    dispatch_type!(dtype, go)
}

/// `buf[i] = buf[i] * scalar`, computed in `f64` for `f64`, `f32` for other
/// floats, wrapping for integers. `scalar` is one element in its own
/// little-endian bytes (`dtype.size()` long). Used for
/// `ncclRedOpCreatePreMulSum`.
pub(crate) fn scale(dtype: DataType, buf: &mut [u8], scalar: &[u8]) {
    debug_assert_eq!(buf.len() % dtype.size(), 0, "scale: partial element");
    debug_assert_eq!(scalar.len(), dtype.size(), "scale: scalar size");
    macro_rules! go {
        ($t:ty) => {{
            let s: $t = element_from_le(scalar);
            map_bytes::<$t>(buf, |x| <$t as Kernel>::scale(x, s))
        }};
    }
    dispatch_type!(dtype, go)
}

/// Reads one element from its little-endian bytes (zero-padded or truncated
/// to the element size if `bytes` has the wrong length).
fn element_from_le<T: bytemuck::Pod>(bytes: &[u8]) -> T {
    let mut v = T::zeroed();
    let out = bytemuck::bytes_of_mut(&mut v);
    let n = out.len().min(bytes.len());
    out[..n].copy_from_slice(&bytes[..n]);
    if cfg!(target_endian = "big") {
        out.reverse();
    }
    v
}

/// Length in bytes of the whole elements common to all the given lengths.
fn whole_len<T>(lens: &[usize]) -> usize {
    let size = std::mem::size_of::<T>();
    let min = lens.iter().copied().min().unwrap_or(0);
    min - min % size
}

/// Copies `bytes` into `stage` and views the copy as elements.
fn stage_in<'a, T: bytemuck::Pod>(stage: &'a mut Stage, bytes: &[u8]) -> &'a mut [T] {
    let staged = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut stage[..])[..bytes.len()];
    staged.copy_from_slice(bytes);
    bytemuck::cast_slice_mut(staged)
}

fn inplace_bytes<T: Kernel, O: Op>(dst: &mut [u8], src: &[u8]) {
    let len = whole_len::<T>(&[dst.len(), src.len()]);
    let (dst, src) = (&mut dst[..len], &src[..len]);
    if let (Ok(d), Ok(s)) = (
        bytemuck::try_cast_slice_mut::<u8, T>(dst),
        bytemuck::try_cast_slice::<u8, T>(src),
    ) {
        return wide::inplace::<T, O>(d, s);
    }
    let (mut sd, mut ss): (Stage, Stage) = ([0; STAGE_BYTES / 8], [0; STAGE_BYTES / 8]);
    for (dc, sc) in dst.chunks_mut(STAGE_BYTES).zip(src.chunks(STAGE_BYTES)) {
        let d = stage_in::<T>(&mut sd, dc);
        T::inplace::<O>(d, stage_in::<T>(&mut ss, sc));
        dc.copy_from_slice(bytemuck::cast_slice::<T, u8>(d));
    }
}

fn copy_bytes<T: Kernel, O: Op>(dst: &mut [u8], a: &[u8], b: &[u8]) {
    let len = whole_len::<T>(&[dst.len(), a.len(), b.len()]);
    let (dst, a, b) = (&mut dst[..len], &a[..len], &b[..len]);
    if let (Ok(d), Ok(a), Ok(b)) = (
        bytemuck::try_cast_slice_mut::<u8, T>(dst),
        bytemuck::try_cast_slice::<u8, T>(a),
        bytemuck::try_cast_slice::<u8, T>(b),
    ) {
        return wide::copy::<T, O>(d, a, b);
    }
    // Stage a and b, combine in place into the staged a (same operand
    // order, hence the same result as the copy kernel), then store.
    let (mut sa, mut sb): (Stage, Stage) = ([0; STAGE_BYTES / 8], [0; STAGE_BYTES / 8]);
    let chunks = a.chunks(STAGE_BYTES).zip(b.chunks(STAGE_BYTES));
    for (dc, (ac, bc)) in dst.chunks_mut(STAGE_BYTES).zip(chunks) {
        let x = stage_in::<T>(&mut sa, ac);
        T::inplace::<O>(x, stage_in::<T>(&mut sb, bc));
        dc.copy_from_slice(bytemuck::cast_slice::<T, u8>(x));
    }
}

/// Applies a whole-slice kernel to `buf`, staging it if misaligned.
fn map_bytes<T: bytemuck::Pod>(buf: &mut [u8], f: impl Fn(&mut [T])) {
    let len = whole_len::<T>(&[buf.len()]);
    let buf = &mut buf[..len];
    if let Ok(b) = bytemuck::try_cast_slice_mut::<u8, T>(buf) {
        return f(b);
    }
    let mut stage: Stage = [0; STAGE_BYTES / 8];
    for c in buf.chunks_mut(STAGE_BYTES) {
        let x = stage_in::<T>(&mut stage, c);
        f(x);
        c.copy_from_slice(bytemuck::cast_slice::<T, u8>(x));
    }
}
