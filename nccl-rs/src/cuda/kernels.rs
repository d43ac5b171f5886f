//! The CUDA C source of the device reduction kernels (`kernels.cu`) and
//! their names.
//!
//! For every datatype there are four reductions and a scale:
//! * `ncclrs_reduce_<type>_<op>(T* dst, const T* src, u64 stride, u32
//!   nsrc, u64 count, u64 avg_n)`: `dst[i]` is row 0 op row 1 op ... of
//!   `src` (rows `stride` elements apart, in rank order, combined left to
//!   right and rounded after every step as the host does), then divided
//!   by `avg_n` unless it is 0 (`ncclAvg`);
//! * `ncclrs_scale_<type>(T* dst, const T* src, u64 count, u64 bits)`:
//!   `dst[i] = src[i] * s` for the element `s` whose little-endian bits
//!   are `bits` (`ncclRedOpCreatePreMulSum`).
//!
//! The results are bit-identical to the host kernels (`crate::reduce`),
//! NaN payloads aside; `kernels/tests/cpu.rs` checks it by compiling this
//! source for the CPU.

use crate::datatype::{DataType, RedOp};

/// The kernel source (CUDA C, no headers needed).
pub(crate) const SOURCE: &str = include_str!("kernels.cu");

/// The kernels' name for `dtype`.
pub(crate) fn type_name(dtype: DataType) -> &'static str {
    match dtype {
        DataType::Int8 => "int8",
        DataType::Uint8 => "uint8",
        DataType::Int32 => "int32",
        DataType::Uint32 => "uint32",
        DataType::Int64 => "int64",
        DataType::Uint64 => "uint64",
        DataType::Float16 => "f16",
        DataType::Float32 => "f32",
        DataType::Float64 => "f64",
        DataType::Bfloat16 => "bf16",
        DataType::Float8e4m3 => "f8e4m3",
        DataType::Float8e5m2 => "f8e5m2",
    }
}

/// The kernels' name for `op` (`Avg` is a sum with a final division).
pub(crate) fn op_name(op: RedOp) -> &'static str {
    match op {
        RedOp::Sum | RedOp::Avg => "sum",
        RedOp::Prod => "prod",
        RedOp::Max => "max",
        RedOp::Min => "min",
    }
}

/// The reduction kernel for `dtype` and `op`.
pub(crate) fn reduce_name(dtype: DataType, op: RedOp) -> String {
    format!("ncclrs_reduce_{}_{}", type_name(dtype), op_name(op))
}

/// The scale kernel for `dtype`.
pub(crate) fn scale_name(dtype: DataType) -> String {
    format!("ncclrs_scale_{}", type_name(dtype))
}

/// Every kernel name in the source.
pub(crate) fn all_names() -> Vec<String> {
    let ops = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min];
    DataType::ALL
        .iter()
        .flat_map(|&d| {
            ops.iter()
                .map(move |&o| reduce_name(d, o))
                .chain(std::iter::once(scale_name(d)))
        })
        .collect()
}

#[cfg(test)]
mod tests;
