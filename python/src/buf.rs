//! Memory of Python objects: the buffer protocol (numpy arrays, `bytearray`,
//! `memoryview`, ...) or DLPack (torch CPU tensors). A [`View`] holds the
//! exporter's lock on the memory (the `Py_buffer`, or the DLPack capsule) until
//! it is dropped, so the memory cannot be freed or resized meanwhile.

use crate::dtype::{self, Described};
use crate::errors::invalid;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};
use std::ffi::{c_char, c_void, CStr};
use std::fmt::Display;

/// One contiguous buffer of a Python object.
pub(crate) struct View {
    pub(crate) ptr: *mut u8,
    pub(crate) bytes: usize,
    pub(crate) desc: Described,
    hold: Hold,
}

enum Hold {
    /// A buffer-protocol view, released on drop.
    Buffer(Box<ffi::Py_buffer>),
    /// The DLPack capsule: while it lives, the producer keeps the tensor
    /// (the capsule's destructor calls the tensor's deleter).
    #[allow(dead_code)] // held, never read
    DlPack(Py<PyAny>),
    /// A torch tensor, which keeps its storage.
    #[allow(dead_code)] // held, never read
    Object(Py<PyAny>),
}

/// torch's tensor class and dtypes, looked up once torch is imported (this
/// module never imports it).
struct Torch {
    tensor: Py<PyType>,
    dtypes: Vec<(Py<PyAny>, Described)>,
}

static TORCH: PyOnceLock<Torch> = PyOnceLock::new();

fn torch(py: Python<'_>) -> Option<&'static Torch> {
    if let Some(t) = TORCH.get(py) {
        return Some(t);
    }
    let modules = py.import("sys").ok()?.getattr("modules").ok()?;
    let torch = modules.cast::<PyDict>().ok()?.get_item("torch").ok()??;
    let tensor = torch
        .getattr("Tensor")
        .ok()?
        .cast_into::<PyType>()
        .ok()?
        .unbind();
    let mut dtypes = Vec::new();
    for (name, code, bits) in [
        ("int8", 0, 8),
        ("int32", 0, 32),
        ("int64", 0, 64),
        ("uint8", 1, 8),
        ("uint32", 1, 32),
        ("uint64", 1, 64),
        ("float16", 2, 16),
        ("float32", 2, 32),
        ("float64", 2, 64),
        ("bfloat16", 4, 16),
    ] {
        if let (Ok(d), Ok(desc)) = (torch.getattr(name), dtype::from_dlpack(code, bits, 1)) {
            dtypes.push((d.unbind(), desc));
        }
    }
    let _ = TORCH.set(py, Torch { tensor, dtypes });
    TORCH.get(py)
}

// SAFETY: a `View` is plain addresses and an owned `Py_buffer`; the buffer is
// released under the GIL (`Drop` attaches), from whichever thread drops it.
unsafe impl Send for View {}

impl Drop for View {
    fn drop(&mut self) {
        if let Hold::Buffer(b) = &mut self.hold {
            Python::attach(|_| {
                // SAFETY: `b` was filled by a successful `PyObject_GetBuffer`
                // and is released exactly once, with the GIL held.
                unsafe { ffi::PyBuffer_Release(&mut **b) }
            });
        }
    }
}

/// `DLDevice`.
#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// `DLTensor`, the head of `DLManagedTensor` (the rest is the producer's).
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

/// DLPack's `kDLCPU` and `kDLCUDAHost` (pinned host memory).
const DL_CPU: i32 = 1;
const DL_CUDA_HOST: i32 = 3;

/// Whether row-major `shape` with element `strides` (`None`: compact) is one
/// contiguous run of elements.
pub(crate) fn dl_contiguous(shape: &[i64], strides: Option<&[i64]>) -> bool {
    let Some(strides) = strides else { return true };
    let mut expect = 1i64;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        // A dimension of one element may have any stride.
        if n != 1 && s != expect {
            return false;
        }
        expect = expect.saturating_mul(n);
    }
    true
}

impl View {
    /// The memory of `obj` (`what` names the argument in errors). A
    /// `writable` view refuses read-only memory; every view refuses memory
    /// that is not one C-contiguous run.
    pub(crate) fn of(obj: &Bound<'_, PyAny>, what: &dyn Display, writable: bool) -> PyResult<View> {
        // SAFETY: `obj` is a live object and the GIL is held.
        if unsafe { ffi::PyObject_CheckBuffer(obj.as_ptr()) } != 0 {
            return View::buffer(obj, what, writable);
        }
        if let Some(t) = torch(obj.py()) {
            if obj.is_instance(t.tensor.bind(obj.py()))? {
                return View::tensor(obj, t, what);
            }
        }
        if let Ok(export) = obj.getattr(pyo3::intern!(obj.py(), "__dlpack__")) {
            return View::dlpack(obj, &export.call0()?, what);
        }
        Err(invalid(format!(
            "{what}: a {} supports neither the buffer protocol nor DLPack",
            obj.get_type().name()?
        )))
    }

    fn buffer(obj: &Bound<'_, PyAny>, what: &dyn Display, writable: bool) -> PyResult<View> {
        let mut b: Box<ffi::Py_buffer> = Box::new(
            // SAFETY: `Py_buffer` is a C struct of pointers and integers, for
            // which all zeros is a valid (empty) value.
            unsafe { std::mem::zeroed() },
        );
        // Strides and format, so that layout and element type can be checked
        // here with clear messages (rather than the exporter's).
        let flags = ffi::PyBUF_STRIDES | ffi::PyBUF_FORMAT;
        // SAFETY: `obj` is live, `b` is writable, the GIL is held.
        if unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *b, flags) } != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        let mut view = View {
            ptr: b.buf.cast(),
            bytes: usize::try_from(b.len).unwrap_or(0),
            desc: Described {
                dtype: None,
                itemsize: 0,
                raw: false,
            },
            hold: Hold::Buffer(b),
        };
        let Hold::Buffer(b) = &view.hold else {
            unreachable!("made above")
        };
        if writable && b.readonly != 0 {
            return Err(invalid(format!(
                "{what} is read-only but the call writes it"
            )));
        }
        // SAFETY: `b` is a filled view.
        if unsafe { ffi::PyBuffer_IsContiguous(&**b, b'C' as c_char) } == 0 {
            return Err(invalid(format!(
                "{what} is not contiguous; pass a contiguous copy (numpy.ascontiguousarray, tensor.contiguous())"
            )));
        }
        let format = if b.format.is_null() {
            None
        } else {
            // SAFETY: a non-NULL format is a NUL-terminated string owned by
            // the view.
            Some(
                unsafe { CStr::from_ptr(b.format) }
                    .to_string_lossy()
                    .into_owned(),
            )
        };
        let itemsize = usize::try_from(b.itemsize).unwrap_or(0).max(1);
        view.desc = dtype::from_format(format.as_deref(), itemsize)
            .map_err(|e| invalid(format!("{what}: {e}")))?;
        Ok(view)
    }

    /// A torch tensor through its own methods (DLPack export costs
    /// microseconds per call in torch).
    fn tensor(obj: &Bound<'_, PyAny>, t: &Torch, what: &dyn Display) -> PyResult<View> {
        let py = obj.py();
        // Interned names: attribute lookups then hit the type's cache.
        let flag = |name: &Bound<'_, pyo3::types::PyString>| -> PyResult<bool> {
            obj.getattr(name)?.extract()
        };
        let call = |name: &Bound<'_, pyo3::types::PyString>| -> PyResult<usize> {
            obj.call_method0(name)?.extract()
        };
        if !flag(pyo3::intern!(py, "is_cpu"))? {
            return Err(invalid(format!(
                "{what} is in device memory ({}); the Python API takes host memory (CPU tensors)",
                obj.getattr("device")?
            )));
        }
        if flag(pyo3::intern!(py, "requires_grad"))? {
            return Err(invalid(format!(
                "{what} requires grad; pass tensor.detach()"
            )));
        }
        if !obj
            .call_method0(pyo3::intern!(py, "is_contiguous"))?
            .extract::<bool>()?
        {
            return Err(invalid(format!(
                "{what} is not contiguous; pass a contiguous copy (tensor.contiguous())"
            )));
        }
        let dt = obj.getattr(pyo3::intern!(py, "dtype"))?;
        let itemsize = call(pyo3::intern!(py, "element_size"))?;
        let desc = t
            .dtypes
            .iter()
            .find(|(d, _)| d.bind(py).is(&dt))
            .map(|(_, desc)| *desc)
            .unwrap_or(Described {
                dtype: None,
                itemsize,
                raw: false,
            });
        let numel = call(pyo3::intern!(py, "numel"))?;
        let ptr = call(pyo3::intern!(py, "data_ptr"))?;
        Ok(View {
            ptr: ptr as *mut u8,
            bytes: numel * itemsize,
            desc,
            hold: Hold::Object(obj.clone().unbind()),
        })
    }

    fn dlpack(
        obj: &Bound<'_, PyAny>,
        capsule: &Bound<'_, PyAny>,
        what: &dyn Display,
    ) -> PyResult<View> {
        let name = c"dltensor";
        // SAFETY: the GIL is held; a wrong object or name returns NULL with
        // an exception set.
        let p = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), name.as_ptr()) };
        if p.is_null() {
            return Err(PyErr::fetch(obj.py()));
        }
        // SAFETY: a "dltensor" capsule points at a `DLManagedTensor`, whose
        // first member is the `DLTensor`; it lives as long as the capsule,
        // which the returned view holds.
        let t = unsafe { &*(p as *const DlTensor) };
        if t.device.device_type != DL_CPU && t.device.device_type != DL_CUDA_HOST {
            return Err(invalid(format!(
                "{what} is in device memory (DLPack device type {}); the Python API takes host memory (CPU tensors)",
                t.device.device_type
            )));
        }
        let ndim = usize::try_from(t.ndim).unwrap_or(0);
        let shape: &[i64] = if ndim == 0 {
            &[]
        } else {
            // SAFETY: DLPack gives `ndim` extents.
            unsafe { std::slice::from_raw_parts(t.shape, ndim) }
        };
        let strides = (!t.strides.is_null() && ndim > 0)
            // SAFETY: non-NULL strides have `ndim` entries.
            .then(|| unsafe { std::slice::from_raw_parts(t.strides, ndim) });
        if !dl_contiguous(shape, strides) {
            return Err(invalid(format!(
                "{what} is not contiguous; pass a contiguous copy (tensor.contiguous())"
            )));
        }
        let desc = dtype::from_dlpack(t.dtype.code, t.dtype.bits, t.dtype.lanes)
            .map_err(|e| invalid(format!("{what}: {e}")))?;
        let elems: i64 = shape.iter().product();
        let bytes = usize::try_from(elems).unwrap_or(0) * desc.itemsize;
        let ptr = (t.data as *mut u8).wrapping_add(usize::try_from(t.byte_offset).unwrap_or(0));
        Ok(View {
            ptr,
            bytes,
            desc,
            hold: Hold::DlPack(capsule.clone().unbind()),
        })
    }
}
