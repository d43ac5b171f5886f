//! The reduction a collective runs with: NCCL's built-in ops, and each
//! communicator's table of `ncclRedOpCreatePreMulSum` ops (the API that
//! fills it is `ops.rs`).
//!
//! A leaf module (imports only `types` and `error`): `comm.rs` owns a
//! [`RedOps`] and `work.rs` carries an [`OpChoice`], and neither may
//! depend on an API module.

use crate::error::{invalid, FfiResult};
use crate::types::ncclNumOps;
use nccl_rs::{DataType, RedOp};
use std::ffi::c_int;

/// A scalar kept by pointer (`ncclScalarDevice`), read when a collective
/// using the op runs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScalarPtr(pub(crate) *const u8);

// SAFETY: the pointer is only read, by whichever thread runs a collective
// that uses the op; the application keeps it valid and holding a value of
// the op's datatype until `ncclRedOpDestroy` (the header's contract for
// `ncclScalarDevice`).
unsafe impl Send for ScalarPtr {}
// SAFETY: as above; reads from several threads are fine.
unsafe impl Sync for ScalarPtr {}

/// Where the scalar of a PreMulSum op is.
#[derive(Clone, Debug)]
pub(crate) enum Scalar {
    /// Read at creation (`ncclScalarHostImmediate`).
    Value(Vec<u8>),
    /// Read at each use (`ncclScalarDevice`).
    Pointer(ScalarPtr),
}

impl Scalar {
    /// The scalar's bytes now.
    ///
    /// # Safety
    /// For `Pointer`, the pointer must be valid for `dtype.size()` bytes.
    unsafe fn bytes(&self, dtype: DataType) -> Vec<u8> {
        match self {
            Scalar::Value(v) => v.clone(),
            // SAFETY: valid for one element (this function's contract).
            Scalar::Pointer(p) => unsafe { std::slice::from_raw_parts(p.0, dtype.size()) }.to_vec(),
        }
    }
}

/// The reduction a collective call uses.
#[derive(Clone, Debug)]
pub(crate) enum OpChoice {
    /// `ncclSum` … `ncclAvg`.
    Builtin(RedOp),
    /// A PreMulSum op with this scalar.
    PreMul(Scalar),
}

impl OpChoice {
    /// The core op the collective runs with.
    pub(crate) fn core_op(&self) -> RedOp {
        match self {
            OpChoice::Builtin(op) => *op,
            OpChoice::PreMul(_) => RedOp::Sum,
        }
    }
}

/// One communicator's PreMulSum ops.
#[derive(Default)]
pub(crate) struct RedOps {
    slots: Vec<Option<(DataType, Scalar)>>,
}

impl RedOps {
    pub(crate) fn create(&mut self, dtype: DataType, scalar: Scalar) -> FfiResult<c_int> {
        let slot = match self.slots.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        let id = c_int::try_from(slot)
            .ok()
            .and_then(|s| s.checked_add(ncclNumOps));
        let id = id.ok_or_else(|| invalid("too many reduction ops on this communicator"))?;
        self.slots[slot] = Some((dtype, scalar));
        Ok(id)
    }

    fn slot(op: c_int) -> Option<usize> {
        usize::try_from(op.checked_sub(ncclNumOps)?).ok()
    }

    pub(crate) fn destroy(&mut self, op: c_int) -> FfiResult<()> {
        if (0..ncclNumOps).contains(&op) {
            return Err(invalid(format!(
                "ncclRedOpDestroy: op {op} is built in, not created by ncclRedOpCreatePreMulSum"
            )));
        }
        match Self::slot(op).and_then(|s| self.slots.get_mut(s)) {
            Some(s @ Some(_)) => {
                *s = None;
                Ok(())
            }
            _ => Err(invalid(format!(
                "ncclRedOpDestroy: op {op} is not a live op of this communicator"
            ))),
        }
    }

    /// The op a collective of `dtype` asked for with `op`.
    pub(crate) fn resolve(&self, op: c_int, dtype: DataType) -> FfiResult<OpChoice> {
        if let Some(b) = RedOp::from_raw(op) {
            return Ok(OpChoice::Builtin(b));
        }
        match Self::slot(op).and_then(|s| self.slots.get(s)) {
            Some(Some((d, scalar))) if *d == dtype => Ok(OpChoice::PreMul(scalar.clone())),
            Some(Some((d, _))) => Err(invalid(format!("reduction op {op} was created for {d}, not {dtype}"))),
            _ => Err(invalid(format!("invalid reduction op {op}: not a built-in op (0..=4) nor a live op of this communicator"))),
        }
    }
}

/// A copy of the `bytes` input bytes at `send`, each element multiplied by
/// the scalar; 8-byte aligned storage.
///
/// # Safety
/// `send` must be readable for `bytes` bytes (or `bytes` is 0), and a
/// `Pointer` scalar valid for one element.
pub(crate) unsafe fn premultiplied(
    send: *const u8,
    bytes: usize,
    dtype: DataType,
    scalar: &Scalar,
) -> Vec<u64> {
    let mut copy = vec![0u64; bytes.div_ceil(8)];
    // SAFETY: `copy` has at least `bytes` bytes and is a fresh allocation.
    let dst = unsafe { std::slice::from_raw_parts_mut(copy.as_mut_ptr().cast::<u8>(), bytes) };
    if bytes > 0 {
        // SAFETY: `send` is readable for `bytes` bytes (contract).
        dst.copy_from_slice(unsafe { std::slice::from_raw_parts(send, bytes) });
    }
    // SAFETY: the scalar pointer is valid (contract).
    let s = unsafe { scalar.bytes(dtype) };
    nccl_rs::datatype::scale_in_place(dtype, dst, &s);
    copy
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_nccl_numbering_and_reuse_slots() {
        let mut ops = RedOps::default();
        let a = ops
            .create(
                DataType::Float32,
                Scalar::Value(2f32.to_ne_bytes().to_vec()),
            )
            .unwrap();
        let b = ops
            .create(DataType::Int32, Scalar::Value(3i32.to_ne_bytes().to_vec()))
            .unwrap();
        assert_eq!((a, b), (ncclNumOps, ncclNumOps + 1));
        assert!(ops.resolve(a, DataType::Int32).is_err());
        assert!(matches!(
            ops.resolve(b, DataType::Int32),
            Ok(OpChoice::PreMul(_))
        ));
        ops.destroy(a).unwrap();
        assert!(ops.destroy(a).is_err());
        assert!(ops.destroy(0).is_err());
        assert!(ops.resolve(a, DataType::Float32).is_err());
        assert_eq!(
            ops.create(DataType::Float32, Scalar::Value(vec![0; 4]))
                .unwrap(),
            ncclNumOps
        );
        assert!(ops.resolve(-1, DataType::Float32).is_err());
        assert!(matches!(
            ops.resolve(4, DataType::Float32),
            Ok(OpChoice::Builtin(RedOp::Avg))
        ));
    }

    #[test]
    fn premultiplies_a_copy() {
        let input: [i32; 3] = [1, -2, 3];
        // SAFETY: `input` is 12 readable bytes.
        let out = unsafe {
            premultiplied(
                input.as_ptr().cast(),
                12,
                DataType::Int32,
                &Scalar::Value(5i32.to_ne_bytes().to_vec()),
            )
        };
        let got: Vec<i32> = out
            .iter()
            .flat_map(|w| w.to_ne_bytes())
            .collect::<Vec<u8>>()
            .chunks(4)
            .take(3)
            .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, [5, -10, 15]);
        assert_eq!(input, [1, -2, 3]);
    }
}
