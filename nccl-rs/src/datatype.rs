//! Datatypes and reduction operations, with NCCL's enum values.

use crate::fp8::{F8E4M3, F8E5M2};
use half::{bf16, f16};

/// NCCL's `ncclDataType_t`, with the same numeric values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum DataType {
    /// `ncclInt8` / `ncclChar`.
    Int8 = 0,
    /// `ncclUint8`.
    Uint8 = 1,
    /// `ncclInt32` / `ncclInt`.
    Int32 = 2,
    /// `ncclUint32`.
    Uint32 = 3,
    /// `ncclInt64`.
    Int64 = 4,
    /// `ncclUint64`.
    Uint64 = 5,
    /// `ncclFloat16` / `ncclHalf`.
    Float16 = 6,
    /// `ncclFloat32` / `ncclFloat`.
    Float32 = 7,
    /// `ncclFloat64` / `ncclDouble`.
    Float64 = 8,
    /// `ncclBfloat16`.
    Bfloat16 = 9,
    /// `ncclFloat8e4m3`.
    Float8e4m3 = 10,
    /// `ncclFloat8e5m2`.
    Float8e5m2 = 11,
}

impl DataType {
    /// All twelve datatypes, in enum order.
    pub const ALL: [DataType; 12] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
        DataType::Float8e4m3,
        DataType::Float8e5m2,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 | DataType::Float8e4m3 | DataType::Float8e5m2 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    /// The name nccl-tests prints (`float`, `int32`, `half`, `bfloat16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::Int8 => "int8",
            DataType::Uint8 => "uint8",
            DataType::Int32 => "int32",
            DataType::Uint32 => "uint32",
            DataType::Int64 => "int64",
            DataType::Uint64 => "uint64",
            DataType::Float16 => "half",
            DataType::Float32 => "float",
            DataType::Float64 => "double",
            DataType::Bfloat16 => "bfloat16",
            DataType::Float8e4m3 => "f8e4m3",
            DataType::Float8e5m2 => "f8e5m2",
        }
    }

    /// Parses nccl-tests' `-d` names and a few aliases.
    pub fn parse(s: &str) -> Option<DataType> {
        Some(match s {
            "int8" | "char" => DataType::Int8,
            "uint8" => DataType::Uint8,
            "int32" | "int" => DataType::Int32,
            "uint32" => DataType::Uint32,
            "int64" => DataType::Int64,
            "uint64" => DataType::Uint64,
            "half" | "float16" | "f16" => DataType::Float16,
            "float" | "float32" | "f32" => DataType::Float32,
            "double" | "float64" | "f64" => DataType::Float64,
            "bfloat16" | "bf16" => DataType::Bfloat16,
            "f8e4m3" | "fp8_e4m3" | "float8e4m3" => DataType::Float8e4m3,
            "f8e5m2" | "fp8_e5m2" | "float8e5m2" => DataType::Float8e5m2,
            _ => return None,
        })
    }

    /// Converts NCCL's numeric value.
    pub fn from_raw(v: i32) -> Option<DataType> {
        DataType::ALL.get(usize::try_from(v).ok()?).copied()
    }

    /// Whether the type is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::Float16
                | DataType::Float32
                | DataType::Float64
                | DataType::Bfloat16
                | DataType::Float8e4m3
                | DataType::Float8e5m2
        )
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// NCCL's `ncclRedOp_t` built-in operations, with the same numeric values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum RedOp {
    /// `ncclSum`.
    Sum = 0,
    /// `ncclProd`.
    Prod = 1,
    /// `ncclMax`.
    Max = 2,
    /// `ncclMin`.
    Min = 3,
    /// `ncclAvg`: the sum divided by the number of ranks.
    Avg = 4,
}

impl RedOp {
    /// All five operations.
    pub const ALL: [RedOp; 5] = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg];

    /// The name nccl-tests prints.
    pub const fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Max => "max",
            RedOp::Min => "min",
            RedOp::Avg => "avg",
        }
    }

    /// Parses nccl-tests' `-o` names.
    pub fn parse(s: &str) -> Option<RedOp> {
        RedOp::ALL.into_iter().find(|o| o.name() == s)
    }

    /// Converts NCCL's numeric value.
    pub fn from_raw(v: i32) -> Option<RedOp> {
        RedOp::ALL.get(usize::try_from(v).ok()?).copied()
    }
}

impl std::fmt::Display for RedOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `buf[i] *= scalar` for elements of `dtype` (`scalar` is one element's
/// bytes): the pre-multiplication of `ncclRedOpCreatePreMulSum`. Integers
/// wrap; floats multiply in f32 (f64 for f64) and round to nearest even.
pub fn scale_in_place(dtype: DataType, buf: &mut [u8], scalar: &[u8]) {
    crate::reduce::scale(dtype, buf, scalar)
}

/// A Rust element type that maps to one NCCL datatype.
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// The NCCL datatype of `Self`.
    const DTYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(impl Element for $t { const DTYPE: DataType = DataType::$d; })*
    };
}

element! {
    i8 => Int8, u8 => Uint8, i32 => Int32, u32 => Uint32, i64 => Int64, u64 => Uint64,
    f16 => Float16, f32 => Float32, f64 => Float64, bf16 => Bfloat16,
    F8E4M3 => Float8e4m3, F8E5M2 => Float8e5m2,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_values_match_nccl() {
        assert_eq!(DataType::Float8e5m2 as i32, 11);
        assert_eq!(DataType::from_raw(9), Some(DataType::Bfloat16));
        assert_eq!(DataType::from_raw(12), None);
        assert_eq!(RedOp::from_raw(4), Some(RedOp::Avg));
        for d in DataType::ALL {
            assert_eq!(DataType::parse(d.name()), Some(d));
        }
    }
}
