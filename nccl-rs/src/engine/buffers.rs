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

    /// Whether the two ranges share a byte.
    pub(crate) fn overlaps(&self, other: Region) -> bool {
        (self.ptr as usize) < other.ptr as usize + other.len
            && (other.ptr as usize) < self.ptr as usize + self.len
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
        unsafe { crate::reduce::move_mem(src.ptr, dst.ptr, src.len) };
    }
}

/// Reusable memory for data a call sends from (the input an in-place
/// all-to-all copies aside), grown on demand: shared memory (a
/// `hostmem` allocation) where it can be had, so that a co-located reader
/// of a single-copy message maps it and copies with `memcpy` instead of
/// `process_vm_readv` (the shared-memory transport's mapped frames); heap
/// memory otherwise.
#[derive(Default)]
pub(crate) struct SendStaging {
    /// The shared allocation and its length, if any.
    shared: Option<(std::ptr::NonNull<u8>, usize)>,
    /// Shared memory could not be had: heap from then on (no `memfd`
    /// attempt per call).
    heap_only: bool,
    heap: AlignedBuf,
}

// SAFETY: the allocation is owned by this value alone (freed in `drop`);
// moving it to another thread moves that ownership.
unsafe impl Send for SendStaging {}

impl SendStaging {
    /// At least `bytes` bytes of staging, valid until the next call.
    pub(crate) fn ensure(&mut self, bytes: usize) -> *mut u8 {
        if let Some((p, len)) = self.shared {
            if len >= bytes {
                return p.as_ptr();
            }
        }
        if self.heap_only {
            self.heap.ensure(bytes);
            return self.heap.as_mut_ptr();
        }
        self.free_shared();
        // Grown in powers of two: each allocation is a file a reader may
        // keep mapped after we drop it.
        let want = bytes.max(1).checked_next_power_of_two().unwrap_or(bytes);
        match crate::hostmem::alloc_raw(want).map(std::ptr::NonNull::new) {
            Ok(Some(p)) => {
                self.shared = Some((p, want));
                p.as_ptr()
            }
            _ => {
                self.heap_only = true;
                self.heap.ensure(bytes);
                self.heap.as_mut_ptr()
            }
        }
    }

    fn free_shared(&mut self) {
        if let Some((p, _)) = self.shared.take() {
            // SAFETY: from `alloc_raw`, freed once; no call uses it now
            // (staging lives for one call, and a send completes only after
            // its reader has copied).
            unsafe { crate::hostmem::free_raw(p.as_ptr()) };
        }
    }
}

impl Drop for SendStaging {
    fn drop(&mut self) {
        self.free_shared();
    }
}

#[cfg(test)]
mod tests {
    use super::SendStaging;
    use crate::hostmem::locate;

    #[test]
    fn send_staging_is_shared_memory_that_grows_and_is_reused() {
        // Allocations are told apart by serial: other tests may map new
        // ones at freed addresses meanwhile.
        let serial = |p: *mut u8| locate(p, 1).map(|(serial, ..)| serial);
        let mut s = SendStaging::default();
        let a = s.ensure(3000);
        assert!(locate(a, 3000).is_some(), "staging in a shared allocation");
        let first = serial(a);
        assert_eq!(s.ensure(4096), a, "fits: the same memory");
        let b = s.ensure(5000);
        let (_, _, alloc_len, offset) = locate(b, 5000).unwrap();
        assert_eq!((alloc_len, offset), (8192, 0), "grown to a power of two");
        assert_ne!(serial(a), first, "the old allocation is freed");
        let second = serial(b);
        drop(s);
        assert_ne!(serial(b), second, "freed on drop");
    }
}
