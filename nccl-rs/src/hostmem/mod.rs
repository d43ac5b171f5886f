//! Host memory that other ranks of this host can map: the host side of
//! `ncclMemAlloc` and user buffer registration.
//!
//! A [`ShmBuffer`] is backed by its own `memfd` mapped shared. Every live
//! allocation is in a process-wide registry (address range → file
//! descriptor and serial number), so a collective can tell whether its
//! buffers are shareable and describe them to its peers
//! (`BufferDesc`). A peer maps the same pages with `pidfd_getfd` and
//! `mmap` (`PeerMaps`); then the collective runs without any transport
//! copy: each rank reads its peers' inputs and writes their outputs
//! directly (see `comm::zero_copy`). Buffers from anywhere else (a `Vec`,
//! `malloc`) simply take the transport path; registering one
//! ([`prefer_huge_pages`], `ncclCommRegister`) moves it onto huge pages,
//! which peers read faster.

mod huge;
mod peer_map;

pub(crate) use huge::registered_huge;
pub use huge::{forget_huge_pages, prefer_huge_pages, register_host_buffer, HugePages, HUGE_PAGE};
pub(crate) use peer_map::PeerMaps;

use crate::datatype::Element;
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// One live shared allocation.
#[derive(Clone, Copy, Debug)]
struct Entry {
    len: usize,
    fd: i32,
    serial: u64,
}

/// Live allocations by start address.
static REGISTRY: Mutex<BTreeMap<usize, Entry>> = Mutex::new(BTreeMap::new());
/// Serial numbers: an allocation is known to peers by (pid, serial), never
/// by its file descriptor alone (numbers are reused after a close).
static SERIAL: AtomicU64 = AtomicU64::new(1);
/// Live allocations: [`locate`] answers without the lock while there are
/// none (every single-copy send asks). Relaxed suffices: a pointer into an
/// allocation reached this thread after the allocation's increment, by
/// whatever synchronised its passing.
static LIVE: AtomicUsize = AtomicUsize::new(0);

fn registry() -> MutexGuard<'static, BTreeMap<usize, Entry>> {
    // A panic while holding the lock cannot leave the map inconsistent
    // (every update is one insert or remove).
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Allocates `len` bytes (at least 1) of zeroed, page-aligned shared memory.
pub fn alloc_raw(len: usize) -> Result<*mut u8> {
    let len = len.max(1);
    // SAFETY: the name is a NUL-terminated literal; flags are valid.
    let fd = unsafe {
        libc::memfd_create(
            c"nccl-rs-buffer".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(os_error("memfd_create"));
    }
    let fail = |what: &str| {
        let e = os_error(what);
        // SAFETY: `fd` is ours and closed once, here.
        unsafe { libc::close(fd) };
        e
    };
    let Ok(size) = libc::off_t::try_from(len) else {
        return Err(fail("allocation size"));
    };
    // SAFETY: `fd` is a memfd we own.
    if unsafe { libc::ftruncate(fd, size) } != 0 {
        return Err(fail("ftruncate"));
    }
    // Fixed size from here on: a peer that mapped the file can never find
    // it shorter than its mapping (a read past the end would be SIGBUS),
    // and it checks this seal before mapping.
    // SAFETY: `fd` is a memfd we own, created with sealing allowed.
    if unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, FIXED_SIZE | libc::F_SEAL_SEAL) } != 0 {
        return Err(fail("sealing the size"));
    }
    let p = match map_shared(fd, len) {
        Ok(p) => p.as_ptr(),
        Err(_) => return Err(fail("mmap")),
    };
    let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
    registry().insert(p as usize, Entry { len, fd, serial });
    LIVE.fetch_add(1, Ordering::Relaxed);
    Ok(p.cast())
}

/// The seals of every allocation: its size never changes.
pub(crate) const FIXED_SIZE: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

/// Maps `len` bytes of the open file `fd` shared, read-write, at an address
/// the kernel picks, prefaulted (`MAP_POPULATE`: the page tables are filled
/// here, once, not by a fault per page inside a collective). The mapping
/// keeps the file alive after `fd` is closed. Used for our allocations, the
/// peers' allocations and the shared-memory transport's rings.
pub(crate) fn map_shared(fd: libc::c_int, len: usize) -> std::io::Result<std::ptr::NonNull<u8>> {
    // SAFETY: a fresh mapping at no fixed address: it cannot alias anything
    // of ours; the kernel checks `fd` and `len`.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    std::ptr::NonNull::new(p.cast()).ok_or_else(|| std::io::Error::other("mmap returned null"))
}

/// Frees memory from [`alloc_raw`]. Returns `false` (and does nothing) for a
/// pointer that is not the start of a live allocation.
///
/// Peers keep their mappings of an allocation for reuse (`PeerMaps`), which
/// would keep its pages alive after the free; so the pages are released
/// here first (a hole punched over the whole file). A peer's stale mapping
/// then holds no memory and, if ever read, reads zeros (never SIGBUS: the
/// size is sealed).
///
/// # Safety
/// Nothing may access the allocation after this call, in this process or
/// through a peer's mapping (collectives end with every peer done with
/// the buffers they were given).
pub unsafe fn free_raw(p: *mut u8) -> bool {
    let Some(e) = registry().remove(&(p as usize)) else {
        return false;
    };
    LIVE.fetch_sub(1, Ordering::Relaxed);
    // SAFETY: the registry held exactly this mapping and descriptor; the
    // caller promises no further use, here or by a peer.
    unsafe {
        let punched = libc::fallocate(
            e.fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            0,
            e.len as libc::off_t,
        );
        if punched != 0 {
            tracing::debug!(
                "shared host memory: releasing {} bytes: {}",
                e.len,
                std::io::Error::last_os_error()
            );
        }
        libc::munmap(p.cast(), e.len);
        libc::close(e.fd);
    }
    true
}

fn os_error(what: &str) -> Error {
    Error::Internal {
        rank: 0,
        msg: format!(
            "shared host memory: {what}: {}",
            std::io::Error::last_os_error()
        ),
    }
}

/// Where `len` bytes at `p` live, if entirely inside one shared allocation:
/// `(serial, fd, allocation length, offset)`.
pub(crate) fn locate(p: *const u8, len: usize) -> Option<(u64, i32, usize, usize)> {
    if LIVE.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let addr = p as usize;
    let reg = registry();
    let (&start, e) = reg.range(..=addr).next_back()?;
    let off = addr - start;
    (off.checked_add(len)? <= e.len).then_some((e.serial, e.fd, e.len, off))
}

/// The start address of this process's live allocation `serial`.
pub(crate) fn base_of(serial: u64) -> Option<*mut u8> {
    registry()
        .iter()
        .find(|(_, e)| e.serial == serial)
        .map(|(&start, _)| start as *mut u8)
}

/// A buffer of `T` in shared host memory (`ncclMemAlloc` for host memory).
/// Collectives whose buffers all come from these, on ranks that all share
/// one host, copy straight between the ranks' buffers.
pub struct ShmBuffer<T: Element> {
    ptr: *mut T,
    len: usize,
    _own: PhantomData<T>,
}

// SAFETY: the buffer owns its mapping like a `Vec<T>` owns its heap memory;
// `T: Element` is plain data.
unsafe impl<T: Element> Send for ShmBuffer<T> {}
// SAFETY: shared access only hands out `&[T]`.
unsafe impl<T: Element> Sync for ShmBuffer<T> {}

impl<T: Element> ShmBuffer<T> {
    /// `len` zeroed elements.
    pub fn zeroed(len: usize) -> Result<ShmBuffer<T>> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::invalid(format!("ShmBuffer of {len} elements overflows")))?;
        let ptr = alloc_raw(bytes)?.cast::<T>();
        Ok(ShmBuffer {
            ptr,
            len,
            _own: PhantomData,
        })
    }
}

impl<T: Element> std::ops::Deref for ShmBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` is a page-aligned mapping of at least `len`
        // elements, zero-initialised (a valid `T`: `Element` is plain data),
        // owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl<T: Element> std::ops::DerefMut for ShmBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` makes the access unique in
        // this process (peers write it only during a collective that holds
        // a borrow of it).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// So the async collectives (which take any `AsMut<[T]> + Send + 'static`
/// buffer and hand it back) accept shared buffers, and run zero-copy.
impl<T: Element> AsRef<[T]> for ShmBuffer<T> {
    fn as_ref(&self) -> &[T] {
        self
    }
}

impl<T: Element> AsMut<[T]> for ShmBuffer<T> {
    fn as_mut(&mut self) -> &mut [T] {
        self
    }
}

impl<T: Element> Drop for ShmBuffer<T> {
    fn drop(&mut self) {
        // SAFETY: allocated by `alloc_raw` in `zeroed`, freed once.
        unsafe { free_raw(self.ptr.cast()) };
    }
}

impl<T: Element> std::fmt::Debug for ShmBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ShmBuffer({} elements)", self.len)
    }
}

/// Words of one rank's [`BufferDesc`] on the wire.
pub(crate) const DESC_WORDS: usize = 12;
/// First word of a descriptor of shareable buffers.
const DESC_MAGIC: u64 = u64::from_le_bytes(*b"NCCLZC01");

/// One region of a collective's buffers as a peer finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RegionDesc {
    pub(crate) serial: u64,
    pub(crate) fd: i32,
    pub(crate) alloc_len: usize,
    pub(crate) offset: usize,
    /// Bytes of the region (from `offset`).
    pub(crate) len: usize,
}

/// A rank's input and output buffers of one call, as its peers map them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BufferDesc {
    pub(crate) pid: i32,
    pub(crate) input: RegionDesc,
    pub(crate) output: RegionDesc,
}

impl BufferDesc {
    /// Whether the input and output are the same bytes.
    pub(crate) fn exactly_in_place(&self) -> bool {
        let (i, o) = (&self.input, &self.output);
        i.serial == o.serial && i.len > 0 && i.offset == o.offset && i.len == o.len
    }

    /// Whether the input and output overlap (an in-place call).
    pub(crate) fn in_place(&self) -> bool {
        let (i, o) = (&self.input, &self.output);
        i.serial == o.serial
            && i.len > 0
            && o.len > 0
            && i.offset < o.offset + o.len
            && o.offset < i.offset + i.len
    }

    /// Describes this process's `input` and `output` ranges, if both are in
    /// shared allocations. An empty range (a rank's unused side of a
    /// rooted collective, perhaps NULL) counts as the other range's, with
    /// length 0; both empty: `None`.
    pub(crate) fn of(input: (*const u8, usize), output: (*const u8, usize)) -> Option<BufferDesc> {
        let region = |(p, len): (*const u8, usize)| {
            locate(p, len).map(|(serial, fd, alloc_len, offset)| RegionDesc {
                serial,
                fd,
                alloc_len,
                offset,
                len,
            })
        };
        let (inp, out) = match (input.1, output.1) {
            (0, 0) => return None,
            (0, _) => {
                let out = region(output)?;
                (RegionDesc { len: 0, ..out }, out)
            }
            (_, 0) => {
                let inp = region(input)?;
                (inp, RegionDesc { len: 0, ..inp })
            }
            _ => (region(input)?, region(output)?),
        };
        Some(BufferDesc {
            pid: std::process::id() as i32,
            input: inp,
            output: out,
        })
    }

    pub(crate) fn encode(d: Option<BufferDesc>) -> [u64; DESC_WORDS] {
        let mut w = [0u64; DESC_WORDS];
        if let Some(d) = d {
            let r = |r: RegionDesc| {
                [
                    r.serial,
                    r.fd as u64,
                    r.alloc_len as u64,
                    r.offset as u64,
                    r.len as u64,
                ]
            };
            w[0] = DESC_MAGIC;
            w[1] = d.pid as u64;
            w[2..7].copy_from_slice(&r(d.input));
            w[7..12].copy_from_slice(&r(d.output));
        }
        w
    }

    pub(crate) fn decode(w: &[u64]) -> Option<BufferDesc> {
        if w.len() != DESC_WORDS || w[0] != DESC_MAGIC {
            return None;
        }
        let r = |x: &[u64]| {
            Some(RegionDesc {
                serial: x[0],
                fd: i32::try_from(x[1]).ok()?,
                alloc_len: usize::try_from(x[2]).ok()?,
                offset: usize::try_from(x[3]).ok()?,
                len: usize::try_from(x[4]).ok()?,
            })
        };
        Some(BufferDesc {
            pid: i32::try_from(w[1]).ok()?,
            input: r(&w[2..7])?,
            output: r(&w[7..12])?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_registered_until_dropped() {
        let mut b = ShmBuffer::<f32>::zeroed(1000).unwrap();
        assert!(b.iter().all(|&x| x == 0.0));
        b[999] = 7.0;
        let p = b.as_ptr().cast::<u8>();
        let (serial, _, len, off) = locate(p.wrapping_add(40), 100).unwrap();
        assert_eq!((len, off), (4000, 40));
        assert!(
            locate(p, 4001).is_none(),
            "a range past the end is not shareable"
        );
        let d = BufferDesc::of((p, 4000), (p.wrapping_add(8), 8)).unwrap();
        assert_eq!(d.input.serial, serial);
        assert_eq!(BufferDesc::decode(&BufferDesc::encode(Some(d))), Some(d));
        assert_eq!(BufferDesc::decode(&BufferDesc::encode(None)), None);
        assert!(d.in_place());
        assert!(!d.exactly_in_place(), "overlapping, not the same bytes");
        let same = BufferDesc::of((p, 4000), (p, 4000)).unwrap();
        assert!(same.in_place() && same.exactly_in_place());
        let halves = BufferDesc::of((p, 2000), (p.wrapping_add(2000), 2000)).unwrap();
        assert!(!halves.in_place() && !halves.exactly_in_place());
        let only_in = BufferDesc::of((p, 4000), (std::ptr::null(), 0)).unwrap();
        assert_eq!((only_in.output.serial, only_in.output.len), (serial, 0));
        let only_out = BufferDesc::of((std::ptr::null(), 0), (p, 4000)).unwrap();
        assert_eq!((only_out.input.serial, only_out.input.len), (serial, 0));
        assert!(BufferDesc::of((std::ptr::null(), 0), (std::ptr::null(), 0)).is_none());
        let v = [0u8; 64];
        assert!(BufferDesc::of((v.as_ptr(), 64), (p, 4)).is_none());
        drop(b);
        // By serial: a test running in parallel may map a new buffer at
        // the address just freed.
        assert!(base_of(serial).is_none(), "still registered after drop");
        assert!(locate(p, 1).is_none_or(|(s, ..)| s != serial));
    }

    #[test]
    fn free_raw_refuses_foreign_pointers() {
        let mut x = 0u8;
        // SAFETY: not an allocation of ours: refused without touching it.
        assert!(!unsafe { free_raw(&mut x) });
        let p = alloc_raw(10).unwrap();
        // SAFETY: ours, freed once.
        assert!(unsafe { free_raw(p) });
    }
}
