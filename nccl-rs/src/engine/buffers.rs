//! Raw buffer views of one call, and the engine's reusable aligned memory.

/// A byte range of memory the engine may read or write during one call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Region {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
}

impl Region {
    pub(crate) fn new(ptr: *mut u8, len: usize) -> Region {
        Region { ptr, len }
    }

    /// A read-only region (the engine never writes through it: schedules
    /// only read `Loc::In`).
    pub(crate) fn read_only(ptr: *const u8, len: usize) -> Region {
        Region {
            ptr: ptr as *mut u8,
            len,
        }
    }

    pub(crate) fn empty() -> Region {
        Region {
            ptr: std::ptr::NonNull::<u64>::dangling().as_ptr().cast(),
            len: 0,
        }
    }
}

/// The user buffers of one call.
///
/// Invariant (upheld by the callers in `comm`): every region is valid for the
/// whole call — `input` for reads, `output` and writable group buffers for
/// reads and writes — and nothing else accesses them meanwhile. `input` and
/// `output` may be the same memory (in-place operations).
#[derive(Clone, Debug)]
pub(crate) struct CallBufs {
    pub(crate) input: Region,
    pub(crate) output: Region,
    pub(crate) group: Vec<Region>,
}

/// Heap memory aligned to 8 bytes that grows on demand and is reused, so
/// the cost of first touching fresh pages is paid once.
#[derive(Default)]
pub(crate) struct AlignedBuf(Vec<u64>);

impl AlignedBuf {
    pub(crate) fn ensure(&mut self, bytes: usize) {
        let words = bytes.div_ceil(8);
        if self.0.len() < words {
            self.0.resize(words, 0);
        }
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr().cast()
    }
}

/// Copies `src` into `dst` (same length): nothing when they are the same
/// bytes, streaming stores when `stream` and the copy is large and the
/// ranges are apart (see `reduce::copy_streaming`), else `memmove`.
///
/// # Safety
/// Both regions must be valid (`src` for reads, `dst` for writes) and
/// nothing else may access them during the call.
pub(crate) unsafe fn copy_region(src: Region, dst: Region, stream: bool) {
    debug_assert_eq!(src.len, dst.len);
    let (s, d) = (src.ptr as usize, dst.ptr as usize);
    let apart = s + src.len <= d || d + dst.len <= s;
    if stream && apart && src.len >= crate::reduce::STREAM_COPY_MIN {
        // SAFETY: disjoint, valid and unshared for the call (contract).
        let (from, to) = unsafe {
            (
                std::slice::from_raw_parts(src.ptr.cast_const(), src.len),
                std::slice::from_raw_parts_mut(dst.ptr, dst.len),
            )
        };
        crate::reduce::copy_streaming(to, from);
    } else if s != d && src.len > 0 {
        // SAFETY: valid for the call (contract); `copy` tolerates overlap.
        unsafe { std::ptr::copy(src.ptr, dst.ptr, src.len) };
    }
}
