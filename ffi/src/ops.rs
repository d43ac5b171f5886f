//! `ncclRedOpCreatePreMulSum` and `ncclRedOpDestroy`: the API over each
//! communicator's op table (`redop.rs`).
//!
//! A PreMulSum op multiplies each rank's input by a scalar and sums. With
//! host memory it runs as: copy the input, scale the copy with the core's
//! `scale_in_place`, then a `Sum` collective from the copy. Ops are numbered
//! as NCCL numbers them: `ncclNumOps + slot`, per communicator, reusing the
//! slots of destroyed ops.

use crate::comm::CommShared;
use crate::error::{invalid, FfiResult};
use crate::handle::lookup;
use crate::panic::nccl_api;
use crate::redop::{Scalar, ScalarPtr};
use crate::types::{ncclComm_t, ncclResult_t, ncclScalarDevice, ncclScalarHostImmediate};
use nccl_rs::DataType;
use std::ffi::{c_int, c_void};

#[allow(non_upper_case_globals)]
fn create(
    op: *mut c_int,
    scalar: *mut c_void,
    dtype: c_int,
    residence: c_int,
    comm: ncclComm_t,
) -> FfiResult<ncclResult_t> {
    let shared = lookup(comm)?;
    if op.is_null() || scalar.is_null() {
        return Err(invalid(
            "ncclRedOpCreatePreMulSum: op and scalar must not be NULL",
        ));
    }
    let dtype = DataType::from_raw(dtype).ok_or_else(|| {
        invalid(format!(
            "ncclRedOpCreatePreMulSum: invalid datatype {dtype}"
        ))
    })?;
    let scalar = match residence {
        ncclScalarHostImmediate => {
            // SAFETY: a non-NULL scalar points to one element of `dtype`
            // (the function's contract).
            Scalar::Value(
                unsafe { std::slice::from_raw_parts(scalar.cast::<u8>(), dtype.size()) }.to_vec(),
            )
        }
        ncclScalarDevice => Scalar::Pointer(ScalarPtr(scalar.cast_const().cast())),
        r => {
            return Err(invalid(format!(
                "ncclRedOpCreatePreMulSum: invalid scalar residence {r}"
            )))
        }
    };
    let id = shared.red_ops().create(dtype, scalar)?;
    // SAFETY: `op` is non-NULL and points to an ncclRedOp_t (an int).
    unsafe { op.write(id) };
    Ok(ncclResult_t::Success)
}

fn destroy(op: c_int, comm: ncclComm_t) -> FfiResult<ncclResult_t> {
    let shared: std::sync::Arc<CommShared> = lookup(comm)?;
    shared.red_ops().destroy(op)?;
    Ok(ncclResult_t::Success)
}

nccl_api! {
    /// Creates a PreMulSum op for `comm` and `datatype`.
    fn ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(
        op: *mut c_int, scalar: *mut c_void, datatype: c_int, residence: c_int, comm: ncclComm_t,
    ) -> ncclResult_t {
        crate::error::to_code(create(op, scalar, datatype, residence, comm))
    }

    /// Destroys a PreMulSum op of `comm`.
    fn ncclRedOpDestroy / pncclRedOpDestroy(op: c_int, comm: ncclComm_t) -> ncclResult_t {
        crate::error::to_code(destroy(op, comm))
    }
}
