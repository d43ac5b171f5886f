// Each test binary uses a part of this file.
#![allow(dead_code)]

use std::ffi::{c_int, c_void, CString};
use std::marker::PhantomData;

fn sym(name: &str) -> *mut c_void {
    nccl_rs::cuda::probe().expect("the CUDA driver");
    let c = CString::new(name).unwrap();
    // SAFETY: a symbol lookup in the loaded libraries.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c.as_ptr()) };
    assert!(!p.is_null(), "the driver lacks {name}");
    p
}

macro_rules! call {
    ($name:literal ($($t:ty),*) ($($a:expr),*)) => {{
        let f = sym($name);
        // SAFETY: the driver function of that name has this signature
        // (cuda.h); the tests pass valid arguments.
        let rc = unsafe {
            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($t),*) -> c_int>(f)($($a),*)
        };
        assert_eq!(rc, 0, "{} failed: {rc}", $name);
    }};
}

/// Makes device 0's primary context current on this thread.
pub(crate) fn bind_device0() {
    let mut ctx: *mut c_void = std::ptr::null_mut();
    call!("cuDevicePrimaryCtxRetain" (*mut *mut c_void, c_int) (&mut ctx, 0));
    call!("cuCtxSetCurrent" (*mut c_void) (ctx));
}

/// A stream of the current context.
pub(crate) struct Stream(*mut c_void);

impl Stream {
    pub(crate) fn new() -> Stream {
        let mut s: *mut c_void = std::ptr::null_mut();
        call!("cuStreamCreate" (*mut *mut c_void, u32) (&mut s, 1));
        Stream(s)
    }

    pub(crate) fn sync(&self) {
        call!("cuStreamSynchronize" (*mut c_void) (self.0));
    }

    pub(crate) fn id(&self) -> nccl_rs::cuda::Stream {
        nccl_rs::cuda::Stream(self.0 as usize)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        call!("cuStreamDestroy_v2" (*mut c_void) (self.0));
    }
}

/// A device allocation of `len` elements.
pub(crate) struct Dev<T> {
    ptr: *mut c_void,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Copy + Default> Dev<T> {
    pub(crate) fn zeros(len: usize, s: &Stream) -> Dev<T> {
        Dev::from(&vec![T::default(); len], s)
    }

    /// A copy of `data` (written through `s`, which waits for the
    /// pageable source as cudaMemcpyAsync does).
    pub(crate) fn from(data: &[T], s: &Stream) -> Dev<T> {
        let bytes = std::mem::size_of_val(data).max(1);
        let ptr = nccl_rs::cuda::device_alloc(bytes).unwrap();
        let d = Dev {
            ptr,
            len: data.len(),
            _t: PhantomData,
        };
        d.write(data, s);
        d
    }

    pub(crate) fn write(&self, data: &[T], s: &Stream) {
        assert_eq!(data.len(), self.len);
        call!("cuMemcpyHtoDAsync_v2" (u64, *const c_void, usize, *mut c_void)
            (self.ptr as u64, data.as_ptr().cast(), std::mem::size_of_val(data), s.0));
    }

    /// The contents, once `s` has run everything enqueued so far.
    pub(crate) fn read(&self, s: &Stream) -> Vec<T> {
        let mut v = vec![T::default(); self.len];
        call!("cuMemcpyDtoHAsync_v2" (*mut c_void, u64, usize, *mut c_void)
            (v.as_mut_ptr().cast(), self.ptr as u64, std::mem::size_of_val(&v[..]), s.0));
        s.sync();
        v
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.cast()
    }
}

impl<T> Drop for Dev<T> {
    fn drop(&mut self) {
        // SAFETY: from device_alloc; the tests synchronize before
        // dropping.
        unsafe { nccl_rs::cuda::device_free(self.ptr) }.unwrap();
    }
}

/// Pinned host memory (`cuMemAllocHost`): copies from and to it are
/// asynchronous.
pub(crate) struct Pinned<T> {
    ptr: *mut T,
    len: usize,
}

impl<T: Copy> Pinned<T> {
    pub(crate) fn new(len: usize) -> Pinned<T> {
        let mut p: *mut c_void = std::ptr::null_mut();
        call!("cuMemAllocHost_v2" (*mut *mut c_void, usize) (&mut p, len * std::mem::size_of::<T>()));
        Pinned { ptr: p.cast(), len }
    }

    pub(crate) fn slice(&mut self) -> &mut [T] {
        // SAFETY: `len` elements of pinned memory owned by us; callers
        // synchronize the stream before touching them.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Enqueues pinned → device on `s`.
    pub(crate) fn upload(&self, d: &Dev<T>, s: &Stream) {
        call!("cuMemcpyHtoDAsync_v2" (u64, *const c_void, usize, *mut c_void)
            (d.ptr as u64, self.ptr.cast(), self.len * std::mem::size_of::<T>(), s.0));
    }

    /// Enqueues device → pinned on `s`.
    pub(crate) fn download(&self, d: &Dev<T>, s: &Stream) {
        call!("cuMemcpyDtoHAsync_v2" (*mut c_void, u64, usize, *mut c_void)
            (self.ptr.cast(), d.ptr as u64, self.len * std::mem::size_of::<T>(), s.0));
    }
}

impl<T> Drop for Pinned<T> {
    fn drop(&mut self) {
        call!("cuMemFreeHost" (*mut c_void) (self.ptr.cast()));
    }
}
