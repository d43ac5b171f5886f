//! The reduction kernels, exposed for the benchmarks (`benches/reduce.rs`).
//! Not part of the stable API.

use crate::datatype::{DataType, RedOp};

/// `dst[i] = dst[i] ⊕ src[i]` on elements of `dtype`.
pub fn reduce_inplace(dtype: DataType, op: RedOp, dst: &mut [u8], src: &[u8]) {
    crate::reduce::reduce_inplace(dtype, op, dst, src)
}

/// `dst[i] = a[i] ⊕ b[i]` on elements of `dtype`.
pub fn reduce_copy(dtype: DataType, op: RedOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    crate::reduce::reduce_copy(dtype, op, dst, a, b)
}

/// The collective fingerprint carried in every message's tag (for the
/// benchmark of its cost).
pub fn fingerprint_all_reduce(seq: u64, count: usize) -> u32 {
    crate::engine::fingerprint_all_reduce(seq, count)
}
