//! Which NCCL datatype a buffer holds: from the buffer protocol's format
//! string or DLPack's type code, and an explicit `dtype=`. Pure functions;
//! `tests/test_dtype.py` checks them through `_native._resolve_dtype`.

use nccl_rs::DataType;

/// What a buffer says about its elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Described {
    /// The datatype the buffer names, if it is one NCCL has.
    pub(crate) dtype: Option<DataType>,
    /// Bytes per element of the buffer.
    pub(crate) itemsize: usize,
    /// Plain bytes (`bytearray`, `uint8`/`int8` arrays): may hold any
    /// datatype given with `dtype=`.
    pub(crate) raw: bool,
}

/// The element type of a buffer-protocol format (`struct` module syntax, one
/// item, native byte order) of `itemsize` bytes.
pub(crate) fn from_format(format: Option<&str>, itemsize: usize) -> Result<Described, String> {
    // No format means unsigned bytes (PEP 3118).
    let f = format.unwrap_or("B");
    let body = match f.as_bytes().first() {
        Some(b'@' | b'=') => &f[1..],
        Some(b'<') if cfg!(target_endian = "little") => &f[1..],
        Some(b'>' | b'!') if cfg!(target_endian = "little") => {
            return Err(format!(
                "buffer format {f:?} is big-endian; only native byte order is supported"
            ));
        }
        _ => f,
    };
    let dtype = match (body, itemsize) {
        ("b", 1) => Some(DataType::Int8),
        ("B" | "c", 1) => Some(DataType::Uint8),
        ("i" | "l" | "q" | "n", 4) => Some(DataType::Int32),
        ("I" | "L" | "Q" | "N", 4) => Some(DataType::Uint32),
        ("i" | "l" | "q" | "n", 8) => Some(DataType::Int64),
        ("I" | "L" | "Q" | "N", 8) => Some(DataType::Uint64),
        ("e", 2) => Some(DataType::Float16),
        ("f", 4) => Some(DataType::Float32),
        ("d", 8) => Some(DataType::Float64),
        _ => None,
    };
    Ok(Described {
        dtype,
        itemsize,
        raw: matches!(body, "b" | "B" | "c") && itemsize == 1,
    })
}

/// The element type of a DLPack tensor (`DLDataType`'s code, bits, lanes).
pub(crate) fn from_dlpack(code: u8, bits: u8, lanes: u16) -> Result<Described, String> {
    if lanes != 1 {
        return Err(format!(
            "DLPack tensor has {lanes} lanes per element; only 1 is supported"
        ));
    }
    let dtype = match (code, bits) {
        (0, 8) => Some(DataType::Int8),
        (0, 32) => Some(DataType::Int32),
        (0, 64) => Some(DataType::Int64),
        (1, 8) => Some(DataType::Uint8),
        (1, 32) => Some(DataType::Uint32),
        (1, 64) => Some(DataType::Uint64),
        (2, 16) => Some(DataType::Float16),
        (2, 32) => Some(DataType::Float32),
        (2, 64) => Some(DataType::Float64),
        (4, 16) => Some(DataType::Bfloat16),
        _ => None,
    };
    if bits % 8 != 0 || bits == 0 {
        return Err(format!("DLPack element of {bits} bits is not whole bytes"));
    }
    Ok(Described {
        dtype,
        itemsize: usize::from(bits / 8),
        raw: matches!((code, bits), (0 | 1, 8)),
    })
}

/// The datatype named by `dtype=` (numpy's and torch's spellings; `str()` of
/// a numpy or torch dtype works).
pub(crate) fn parse_name(name: &str) -> Result<DataType, String> {
    let n = name.trim();
    let n = n.strip_prefix("torch.").unwrap_or(n);
    Ok(match n {
        "int8" | "i1" => DataType::Int8,
        "uint8" | "u1" => DataType::Uint8,
        "int32" | "i4" => DataType::Int32,
        "uint32" | "u4" => DataType::Uint32,
        "int64" | "i8" | "long" => DataType::Int64,
        "uint64" | "u8" => DataType::Uint64,
        "float16" | "half" | "f2" => DataType::Float16,
        "float32" | "float" | "f4" => DataType::Float32,
        "float64" | "double" | "f8" => DataType::Float64,
        "bfloat16" => DataType::Bfloat16,
        "float8_e4m3" | "float8_e4m3fn" => DataType::Float8e4m3,
        "float8_e5m2" => DataType::Float8e5m2,
        _ => {
            return Err(format!(
                "dtype {name:?} is not an NCCL datatype (int8, uint8, int32, uint32, int64, uint64, float16, bfloat16, float32, float64, float8_e4m3, float8_e5m2)"
            ))
        }
    })
}

/// The datatype of a call on a buffer described by `d`, given the caller's
/// `dtype=`: the buffer's own type unless `dtype=` overrides it, which it
/// may for plain bytes or for an element type NCCL lacks of the same size
/// (bfloat16 kept in a `uint16` array); any other disagreement is an error.
pub(crate) fn resolve(
    what: &dyn std::fmt::Display,
    d: Described,
    explicit: Option<DataType>,
) -> Result<DataType, String> {
    match (d.dtype, explicit) {
        (Some(have), None) => Ok(have),
        (None, None) => Err(format!(
            "{what}: the buffer's element type ({} bytes) is not an NCCL datatype; pass dtype=",
            d.itemsize
        )),
        (Some(have), Some(want)) if have == want => Ok(want),
        (_, Some(want)) if d.raw => Ok(want),
        (None, Some(want)) if d.itemsize == want.size() => Ok(want),
        (None, Some(want)) => Err(format!(
            "{what}: dtype={} has {} bytes per element but the buffer's elements have {}",
            np_name(want),
            want.size(),
            d.itemsize
        )),
        (Some(have), Some(want)) => Err(format!(
            "{what}: the buffer holds {} but dtype={} was given",
            np_name(have),
            np_name(want)
        )),
    }
}

/// numpy's name of `d` (the spelling `dtype=` takes).
pub(crate) fn np_name(d: DataType) -> &'static str {
    match d {
        DataType::Int8 => "int8",
        DataType::Uint8 => "uint8",
        DataType::Int32 => "int32",
        DataType::Uint32 => "uint32",
        DataType::Int64 => "int64",
        DataType::Uint64 => "uint64",
        DataType::Float16 => "float16",
        DataType::Float32 => "float32",
        DataType::Float64 => "float64",
        DataType::Bfloat16 => "bfloat16",
        DataType::Float8e4m3 => "float8_e4m3",
        DataType::Float8e5m2 => "float8_e5m2",
    }
}
