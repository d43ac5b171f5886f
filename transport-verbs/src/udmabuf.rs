//! Test helper: a real DMA-BUF over host memory, from `/dev/udmabuf` (a
//! sealed memfd exported by the kernel's `udmabuf` driver), also mapped
//! into this process so tests can see what the adapter wrote.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `UDMABUF_CREATE`: `_IOW('u', 0x42, struct udmabuf_create)` (24 bytes).
const UDMABUF_CREATE: libc::c_ulong = 0x4018_7542;
/// `UDMABUF_FLAGS_CLOEXEC`.
const UDMABUF_FLAGS_CLOEXEC: u32 = 1;

/// `struct udmabuf_create` (`linux/udmabuf.h`).
#[repr(C)]
struct UdmabufCreate {
    memfd: u32,
    flags: u32,
    offset: u64,
    size: u64,
}

/// `len` bytes (page multiple) of memfd memory, as a DMA-BUF and a mapping.
pub(crate) struct UDmaBuf {
    dmabuf: OwnedFd,
    _memfd: OwnedFd,
    map: *mut u8,
    len: usize,
}

impl UDmaBuf {
    /// `None` where `/dev/udmabuf` is absent.
    pub(crate) fn new(len: usize) -> Option<io::Result<UDmaBuf>> {
        let dev = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/udmabuf")
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
            Err(e) => return Some(Err(e)),
        };
        Some(Self::create(&dev, len))
    }

    fn create(dev: &std::fs::File, len: usize) -> io::Result<UDmaBuf> {
        let last = io::Error::last_os_error;
        // SAFETY: a NUL-terminated name and valid flags.
        let fd = unsafe {
            libc::memfd_create(
                c"verbs-udmabuf".as_ptr(),
                libc::MFD_ALLOW_SEALING | libc::MFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(last());
        }
        // SAFETY: a fresh descriptor we own.
        let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain calls on our descriptor.
        unsafe {
            if libc::ftruncate(fd, len as libc::off_t) != 0
                || libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) != 0
            {
                return Err(last());
            }
        }
        let req = UdmabufCreate {
            memfd: fd as u32,
            flags: UDMABUF_FLAGS_CLOEXEC,
            offset: 0,
            size: len as u64,
        };
        // SAFETY: the ioctl reads one `udmabuf_create`.
        let dfd = unsafe { libc::ioctl(dev.as_raw_fd(), UDMABUF_CREATE, &req) };
        if dfd < 0 {
            return Err(last());
        }
        // SAFETY: a fresh descriptor the kernel gave us.
        let dmabuf = unsafe { OwnedFd::from_raw_fd(dfd) };
        // SAFETY: maps our memfd; unmapped in Drop.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(last());
        }
        Ok(UDmaBuf {
            dmabuf,
            _memfd: memfd,
            map: map.cast(),
            len,
        })
    }

    /// The DMA-BUF descriptor.
    pub(crate) fn fd(&self) -> RawFd {
        self.dmabuf.as_raw_fd()
    }

    /// The same pages, mapped here.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.map
    }
}

impl Drop for UDmaBuf {
    fn drop(&mut self) {
        // SAFETY: mapped in `create` with this length; unmapped once.
        unsafe { libc::munmap(self.map.cast(), self.len) };
    }
}
