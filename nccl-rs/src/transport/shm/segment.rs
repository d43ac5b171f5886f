//! The shared-memory segment: header layout, creation by the listener,
//! mapping by the connector, unlinking, and the sweep of stale segments.
//!
//! A segment is a POSIX shared-memory object `/nccl-rs-<pid>-<random>` (a
//! file under `/dev/shm`, mode 0600) of [`DATA_OFFSET`] header bytes followed
//! by the ring. Its name lives only between `listen` and the connection: the
//! connector unlinks it as soon as it has mapped the segment and claimed the
//! sending side, the listener unlinks it again (harmlessly) in `accept`, and
//! a listener dropped unconnected unlinks it too. A listener that dies before
//! anyone connects leaves a name behind; [`sweep_stale`] removes those whose
//! creator is gone.

use super::handle::valid_name;
use super::peer::{own_pid, own_pidns, pid_alive};
use super::ring::{Counter, FRAME_ALIGN};
use super::split::Offer;
use nccl_net::{NetError, NetResult};
use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// `"NCCLRSHM"`; stored last when the listener has initialised the header.
pub(super) const MAGIC: u64 = u64::from_le_bytes(*b"NCCLRSHM");
/// Version of the segment layout and ring protocol.
pub(super) const VERSION: u64 = 4;
/// Every segment name starts with this.
pub(super) const NAME_PREFIX: &str = "nccl-rs-";
/// Where the ring starts (one page, so the ring is page-aligned).
pub(super) const DATA_OFFSET: usize = 4096;
/// Largest ring (`Config`'s largest `NCCL_BUFFSIZE`). A connector maps and
/// prefaults the size a handle names, so it refuses anything larger.
pub(super) const MAX_RING_BYTES: usize = 1 << 30;
/// Largest segment: header and ring.
pub(super) const MAX_SEGMENT_BYTES: usize = DATA_OFFSET + MAX_RING_BYTES;
/// Where segments live on Linux.
const SHM_DIR: &str = "/dev/shm";

/// A cache-line-sized (two lines, against the adjacent-line prefetcher)
/// container, so that fields written by different sides never share a line.
#[repr(C, align(128))]
pub(super) struct Line<T>(pub(super) T);

/// Constant after creation.
#[repr(C)]
pub(super) struct Info {
    pub(super) magic: AtomicU64,
    pub(super) version: AtomicU64,
    pub(super) nonce: [AtomicU64; 2],
    pub(super) total_bytes: AtomicU64,
    pub(super) ring_bytes: AtomicU64,
    pub(super) slot_bytes: AtomicU64,
}

/// What one side publishes about itself.
#[repr(C)]
pub(super) struct Side {
    /// Its pid; 0 until set. The sender's pid doubles as the "connected"
    /// flag (set with a compare-exchange, so only one connector wins).
    pub(super) pid: AtomicU32,
    /// Set to 1 (Release) when its comm or listener is dropped.
    pub(super) closed: AtomicU32,
    /// Inode of its pid namespace (0: unknown).
    pub(super) pidns: AtomicU64,
    /// Address of its single-copy probe word (0: none): the sender's for
    /// the receiver to read, the receiver's for a sender that helps
    /// (`split`). The sender stores it before its pid (Release).
    pub(super) cma_probe: AtomicU64,
    /// Receiver: outcome of the single-copy probe (`cma::CMA_*`), stored
    /// with Release once known. Sender: `CMA_YES` when it helps copy split
    /// messages, stored before its pid.
    pub(super) cma: AtomicU32,
}

/// The segment header. Every field is atomic: the peer may write any of
/// them at any time, and any bit pattern is valid.
#[repr(C)]
pub(super) struct Header {
    pub(super) info: Line<Info>,
    /// The listener (receiving side).
    pub(super) recv: Line<Side>,
    /// The connector (sending side).
    pub(super) send: Line<Side>,
    /// Bytes published by the producer (written by the sender only).
    pub(super) head: Line<Counter>,
    /// Bytes consumed by the consumer (written by the receiver only).
    pub(super) tail: Line<Counter>,
    /// The receiver's offer of a split single-copy message (both sides
    /// claim in it; see `split`).
    pub(super) offer: Line<Offer>,
    /// The sender's count of split pieces copied (written by the sender
    /// only).
    pub(super) helped: Line<AtomicU64>,
}

const _: () = assert!(std::mem::size_of::<Header>() <= DATA_OFFSET);
const _: () = assert!(std::mem::align_of::<Header>() <= DATA_OFFSET);

/// Ring size and publication granularity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Geometry {
    /// Ring bytes: `slots * slot_bytes`.
    pub(super) ring_bytes: usize,
    /// Slot bytes: a multiple of [`FRAME_ALIGN`].
    pub(super) slot_bytes: usize,
}

impl Geometry {
    /// `slots` slots of `buffsize / slots` bytes, rounded down to a multiple
    /// of [`FRAME_ALIGN`].
    pub(super) fn new(buffsize: usize, slots: usize) -> NetResult<Geometry> {
        if slots == 0 {
            return Err(NetError::Other("SHM: slots must be at least 1".into()));
        }
        let slot_bytes = buffsize / slots / FRAME_ALIGN * FRAME_ALIGN;
        if slot_bytes == 0 {
            return Err(NetError::Other(format!(
                "SHM: buffer of {buffsize} bytes is too small for {slots} slots of at least {FRAME_ALIGN} bytes"
            )));
        }
        let ring_bytes = slot_bytes
            .checked_mul(slots)
            .filter(|&r| r <= MAX_RING_BYTES)
            .ok_or_else(|| {
                NetError::Other(format!(
                    "SHM: buffer of {buffsize} bytes is too large (at most {MAX_RING_BYTES})"
                ))
            })?;
        Ok(Geometry {
            ring_bytes,
            slot_bytes,
        })
    }

    /// Validates a geometry read from a segment of `total` bytes.
    fn from_header(info: &Info, total: usize) -> NetResult<Geometry> {
        let ring = usize::try_from(info.ring_bytes.load(Ordering::Relaxed)).ok();
        let slot = usize::try_from(info.slot_bytes.load(Ordering::Relaxed)).ok();
        match (ring, slot) {
            (Some(ring_bytes), Some(slot_bytes))
                if slot_bytes > 0
                    && slot_bytes & (FRAME_ALIGN - 1) == 0
                    && ring_bytes / slot_bytes * slot_bytes == ring_bytes
                    && ring_bytes > 0
                    && ring_bytes.checked_add(DATA_OFFSET) == Some(total) =>
            {
                Ok(Geometry {
                    ring_bytes,
                    slot_bytes,
                })
            }
            _ => Err(NetError::BadHandle(
                "SHM: segment has an invalid ring geometry".into(),
            )),
        }
    }

    /// Size of the whole segment.
    pub(super) fn total_bytes(&self) -> Option<usize> {
        self.ring_bytes.checked_add(DATA_OFFSET)
    }
}

/// One mapping of a segment.
pub(super) struct Segment {
    base: NonNull<u8>,
    len: usize,
    /// `/nccl-rs-...`, as `shm_open` / `shm_unlink` want it.
    path: CString,
    geom: Geometry,
    /// Whether we still have to unlink the name.
    linked: bool,
    /// Whether dropping this mapping unlinks the name (the listener's).
    owner: bool,
}

// SAFETY: the mapping is plain shared memory, usable from any thread; the
// header is all atomics and the ring is only touched through raw pointers
// by the one comm that owns this segment.
unsafe impl Send for Segment {}
// SAFETY: `&Segment` only hands out `&Header` (atomics) and raw pointers.
unsafe impl Sync for Segment {}

fn os_err(call: &'static str) -> NetError {
    NetError::io(call, std::io::Error::last_os_error())
}

fn random_u64() -> NetResult<u64> {
    let mut b = [0u8; 8];
    getrandom::getrandom(&mut b)
        .map_err(|e| NetError::Other(format!("SHM: getrandom failed: {e}")))?;
    Ok(u64::from_le_bytes(b))
}

/// A fresh random nonce.
pub(super) fn new_nonce() -> NetResult<[u64; 2]> {
    Ok([random_u64()?, random_u64()?])
}

/// Maps `len` bytes of `fd` shared, read-write, prefaulted, so the data path
/// never takes a first-touch fault.
fn map(fd: libc::c_int, len: usize) -> NetResult<NonNull<u8>> {
    crate::hostmem::map_shared(fd, len).map_err(|e| NetError::io("mmap", e))
}

fn close(fd: libc::c_int) {
    // SAFETY: `fd` is a descriptor we opened and close exactly once; the
    // mapping stays valid after closing it.
    unsafe { libc::close(fd) };
}

fn unlink_path(path: &CString) -> std::io::Result<()> {
    // SAFETY: `path` is a valid NUL-terminated string.
    if unsafe { libc::shm_unlink(path.as_ptr()) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl Segment {
    /// Creates, sizes, maps and initialises a new segment (the listener's
    /// side), recording our pid as the receiver.
    pub(super) fn create(geom: Geometry, nonce: [u64; 2]) -> NetResult<Segment> {
        let total = geom
            .total_bytes()
            .ok_or_else(|| NetError::Other("SHM: segment too large".into()))?;
        let mut tries = 0;
        let (fd, path) = loop {
            let name = format!("/{NAME_PREFIX}{}-{:016x}", own_pid(), random_u64()?);
            let path = CString::new(name).expect("no NUL in a formatted name");
            // SAFETY: `path` is NUL-terminated; O_EXCL never opens an
            // existing object.
            let fd = unsafe {
                libc::shm_open(
                    path.as_ptr(),
                    libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC,
                    0o600,
                )
            };
            if fd >= 0 {
                break (fd, path);
            }
            let e = std::io::Error::last_os_error();
            tries += 1;
            if e.raw_os_error() != Some(libc::EEXIST) || tries >= 8 {
                return Err(NetError::io("shm_open", e));
            }
        };
        let fail = |call: &'static str| {
            let e = os_err(call);
            close(fd);
            let _ = unlink_path(&path);
            e
        };
        // SAFETY: `fd` is our open descriptor.
        if unsafe { libc::ftruncate(fd, total as libc::off_t) } != 0 {
            return Err(fail("ftruncate"));
        }
        let base = match map(fd, total) {
            Ok(b) => b,
            Err(e) => {
                close(fd);
                let _ = unlink_path(&path);
                return Err(e);
            }
        };
        close(fd);
        let seg = Segment {
            base,
            len: total,
            path,
            geom,
            linked: true,
            owner: true,
        };
        let h = seg.header();
        let info = &h.info.0;
        info.version.store(VERSION, Ordering::Relaxed);
        info.nonce[0].store(nonce[0], Ordering::Relaxed);
        info.nonce[1].store(nonce[1], Ordering::Relaxed);
        info.total_bytes.store(total as u64, Ordering::Relaxed);
        info.ring_bytes
            .store(geom.ring_bytes as u64, Ordering::Relaxed);
        info.slot_bytes
            .store(geom.slot_bytes as u64, Ordering::Relaxed);
        h.recv.0.pidns.store(own_pidns(), Ordering::Relaxed);
        h.recv.0.pid.store(own_pid() as u32, Ordering::Relaxed);
        // Publishes everything above to whoever reads MAGIC with Acquire.
        info.magic.store(MAGIC, Ordering::Release);
        Ok(seg)
    }

    /// Opens and maps an existing segment (the connector's side) and checks
    /// size, magic, version, nonce and geometry. Claims nothing.
    pub(super) fn open(name: &str, size: u64, nonce: [u64; 2]) -> NetResult<Segment> {
        if !valid_name(name) {
            return Err(NetError::BadHandle(format!(
                "SHM: invalid segment name {name:?}"
            )));
        }
        let total = usize::try_from(size)
            .ok()
            .filter(|&t| t > DATA_OFFSET && t <= MAX_SEGMENT_BYTES)
            .ok_or_else(|| NetError::BadHandle(format!("SHM: invalid segment size {size}")))?;
        let path = CString::new(format!("/{name}")).expect("validated name has no NUL");
        // SAFETY: `path` is NUL-terminated; no O_CREAT.
        let fd = unsafe { libc::shm_open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENOENT) {
                return Err(NetError::BadHandle(format!(
                    "SHM: segment {name} does not exist (already connected, or its listener is gone)"
                )));
            }
            return Err(NetError::io("shm_open", e));
        }
        // SAFETY: all-zero is a valid `stat`; fstat fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open and `st` is writable.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            let e = os_err("fstat");
            close(fd);
            return Err(e);
        }
        if u64::try_from(st.st_size).ok() != Some(size) {
            close(fd);
            return Err(NetError::BadHandle(format!(
                "SHM: segment {name} has {} bytes, the handle says {size}",
                st.st_size
            )));
        }
        let base = map(fd, total);
        close(fd);
        let mut seg = Segment {
            base: base?,
            len: total,
            path,
            geom: Geometry {
                ring_bytes: total - DATA_OFFSET,
                slot_bytes: FRAME_ALIGN,
            },
            linked: true,
            owner: false,
        };
        let info = &seg.header().info.0;
        let bad = |why: &str| NetError::BadHandle(format!("SHM: segment {name}: {why}"));
        if info.magic.load(Ordering::Acquire) != MAGIC {
            return Err(bad("bad magic"));
        }
        let v = info.version.load(Ordering::Relaxed);
        if v != VERSION {
            return Err(bad(&format!(
                "layout version {v}, this build speaks {VERSION}"
            )));
        }
        let theirs = [
            info.nonce[0].load(Ordering::Relaxed),
            info.nonce[1].load(Ordering::Relaxed),
        ];
        if theirs != nonce {
            return Err(bad("nonce mismatch (stale or forged handle)"));
        }
        if info.total_bytes.load(Ordering::Relaxed) != size {
            return Err(bad("size mismatch"));
        }
        seg.geom = Geometry::from_header(info, total)?;
        Ok(seg)
    }

    /// The header.
    pub(super) fn header(&self) -> &Header {
        // SAFETY: `base` is page-aligned (mmap), the mapping is at least
        // DATA_OFFSET >= size_of::<Header>() bytes and lives as long as
        // `self`; every field is an atomic, so shared access from both
        // processes is sound and every bit pattern is a valid value.
        unsafe { self.base.cast::<Header>().as_ref() }
    }

    /// Start of the ring (`geometry().ring_bytes` bytes).
    pub(super) fn data(&self) -> NonNull<u8> {
        // SAFETY: DATA_OFFSET < len, so the result stays inside the mapping
        // and is non-null.
        unsafe { self.base.add(DATA_OFFSET) }
    }

    /// The validated ring geometry.
    pub(super) fn geometry(&self) -> Geometry {
        self.geom
    }

    /// The name under `/dev/shm`.
    pub(super) fn name(&self) -> &str {
        let s = self.path.to_str().expect("ASCII name");
        &s[1..]
    }

    /// Removes the name (idempotent; a name already gone is fine). The
    /// mapping stays valid.
    pub(super) fn unlink(&mut self) {
        if !self.linked {
            return;
        }
        self.linked = false;
        if let Err(e) = unlink_path(&self.path) {
            if e.raw_os_error() != Some(libc::ENOENT) {
                tracing::warn!(segment = self.name(), error = %e, "SHM: shm_unlink failed");
            }
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if self.owner {
            self.unlink();
        }
        // SAFETY: `base..base+len` is our mapping, unmapped exactly once;
        // nothing borrowed from it outlives `self` (comms keep raw pointers
        // into it only while they own it).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Removes stale segments: `nccl-rs-<pid>-*` under `/dev/shm` whose
/// creator `pid` is dead, provided the header says it was created in our
/// pid namespace (a pid from another namespace means nothing here).
/// Best effort: errors are ignored. Returns how many were removed.
pub(super) fn sweep_stale() -> usize {
    use std::os::unix::fs::FileExt;
    let Ok(dir) = std::fs::read_dir(SHM_DIR) else {
        return 0;
    };
    let me = own_pid();
    let ours = own_pidns();
    let mut removed = 0;
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !valid_name(name) {
            continue;
        }
        let Some(pid) = name[NAME_PREFIX.len()..]
            .split('-')
            .next()
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        if pid <= 0 || pid == me || pid_alive(pid) {
            continue;
        }
        // Read the creator's pid namespace from the header.
        let Ok(f) = std::fs::File::open(entry.path()) else {
            continue;
        };
        let mut b = [0u8; 8];
        let off = std::mem::offset_of!(Header, recv) + std::mem::offset_of!(Side, pidns);
        if f.read_exact_at(&mut b, off as u64).is_err() {
            continue;
        }
        let theirs = u64::from_le_bytes(b);
        if theirs != ours {
            continue;
        }
        let Ok(path) = CString::new(format!("/{name}")) else {
            continue;
        };
        if unlink_path(&path).is_ok() {
            tracing::info!(
                segment = name,
                pid,
                "SHM: removed stale segment of a dead process"
            );
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_larger_than_connectors_map_is_refused_on_both_sides() {
        assert!(Geometry::new(MAX_RING_BYTES, 8).is_ok());
        assert!(Geometry::new(MAX_RING_BYTES + (1 << 20), 8).is_err());
        assert!(Geometry::new(usize::MAX, 1).is_err());
        let name = format!("{NAME_PREFIX}1-0000000000000000");
        for hostile in [MAX_SEGMENT_BYTES as u64 + 1, 1 << 40, u64::MAX] {
            let e = Segment::open(&name, hostile, [0, 0])
                .err()
                .map(|e| e.to_string());
            let e = e.expect("refused before shm_open");
            assert!(e.contains("invalid segment size"), "{hostile}: {e}");
        }
    }
}
