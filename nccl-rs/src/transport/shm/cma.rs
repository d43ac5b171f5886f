//! Single-copy transfers by cross-memory attach (`process_vm_readv`).
//!
//! For a message of at least [`ShmOptions::cma_min_bytes`] the sender
//! writes no payload into the ring: its frame is one line carrying the
//! address of its send buffer ([`FRAME_MARK_CMA`] frames, see
//! [`super::ring`]). The receiver copies the bytes straight from the
//! sender's address space into its destination with one
//! `process_vm_readv`, and only then releases the frame's line. The sender's
//! request completes once the consumer counter has passed the frame: the
//! receiver's `tail.store(Release)` after its read pairs with the sender's
//! `tail.load(Acquire)`, so the read is over before the sender reuses its
//! buffer.
//!
//! Whether the kernel lets the receiver read the sender (same user, ptrace
//! rules, seccomp, pid namespaces) is probed once per connection, when the
//! listener accepts: the connector stores the address of [`PROBE`] in the
//! header, the receiver reads it with `process_vm_readv` and publishes the
//! outcome ([`CMA_YES`] / [`CMA_NO`]). The sender copies through the ring
//! until it sees [`CMA_YES`], and for good when it sees [`CMA_NO`].
//!
//! The kernel copies with `rep movsb`, which on AMD Zen runs several times
//! slower when the destination lies 1 to 15 bytes after the source modulo
//! 4096 (see `reduce::copy`). A transfer at such a distance goes through a
//! small bounce buffer placed at distance 0 from the remote range, piece by
//! piece, and the local side of each piece is copied by `reduce::copy_mem`,
//! which avoids the cliff.
//!
//! [`ShmOptions::cma_min_bytes`]: super::ShmOptions::cma_min_bytes
//! [`FRAME_MARK_CMA`]: super::ring::FRAME_MARK_CMA

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};

/// Bytes a bounced transfer moves per system call (stays in the cache).
const BOUNCE_PIECE: usize = 128 << 10;

thread_local! {
    /// The bounce buffer of this thread's transfers at slow distances:
    /// [`BOUNCE_PIECE`] bytes at any offset within a page.
    static BOUNCE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

#[cfg(test)]
thread_local! {
    /// Transfers of this thread that went through the bounce buffer
    /// (tests check the path is taken).
    pub(super) static BOUNCED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Single-copy settings of one connection end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct CmaOpts {
    /// Messages of at least this many bytes go single-copy.
    pub(super) min: usize,
    /// Whether large single-copy messages are split between both ends
    /// ([`super::split`]): the receiver offers them, the sender helps.
    pub(super) split: bool,
}

/// Outcome of the receiver's probe, in [`super::segment::Side::cma`] of the
/// receiving side: not probed yet.
pub(super) const CMA_UNKNOWN: u32 = 0;
/// The receiver can read the sender's memory.
pub(super) const CMA_YES: u32 = 1;
/// It cannot (or single copy is turned off): copy through the ring.
pub(super) const CMA_NO: u32 = 2;

/// What the probe reads from the sender: a value the receiver knows.
pub(super) const PROBE_VALUE: u64 = u64::from_le_bytes(*b"NCCLCMA1");
/// The sender's probe word; its address goes into the segment header.
pub(super) static PROBE: u64 = PROBE_VALUE;

/// Address of this process's [`PROBE`] word, as stored in the header.
pub(super) fn probe_addr() -> u64 {
    std::ptr::addr_of!(PROBE) as u64
}

/// Copies `len` bytes at address `src` of process `pid` into `dst`, looping
/// over partial transfers. Returns the OS error of a failed call (`ESRCH`:
/// the process is gone; `EFAULT`: the range is not mapped there; `EPERM`:
/// not allowed).
///
/// # Safety
/// `dst..dst+len` must be valid for writes and not accessed by anyone else
/// during the call.
pub(super) unsafe fn read(pid: i32, dst: *mut u8, src: u64, len: usize) -> std::io::Result<()> {
    // SAFETY: forwarded: the caller's contract is `transfer`'s for a read.
    unsafe { transfer(pid, dst, src, len, false) }
}

/// Copies `len` bytes at `src` into address `dst` of process `pid` (see
/// [`super::split`]), looping over partial transfers; errors as for
/// [`read`].
///
/// # Safety
/// `src..src+len` must be valid for reads. (What lies at `dst` in the other
/// process is its business: it offered that range.)
pub(super) unsafe fn write(pid: i32, src: *const u8, dst: u64, len: usize) -> std::io::Result<()> {
    // SAFETY: forwarded; `transfer` only reads the local range when writing.
    unsafe { transfer(pid, src.cast_mut(), dst, len, true) }
}

/// `process_vm_readv` (`write == false`: remote to `local`) or
/// `process_vm_writev` (`local` to remote) of `len` bytes, through the
/// bounce buffer when the kernel's copy would run at a slow distance.
///
/// # Safety
/// `local..local+len` must be valid for writes (reads when `write`) and
/// not accessed by anyone else during the call.
unsafe fn transfer(
    pid: i32,
    local: *mut u8,
    remote: u64,
    len: usize,
    write: bool,
) -> std::io::Result<()> {
    let (dst, src) = match write {
        true => (remote as usize, local as usize),
        false => (local as usize, remote as usize),
    };
    if len < 4096 || !crate::reduce::on_cliff(src as *const u8, dst as *const u8) {
        // SAFETY: the caller's contract.
        return unsafe { transfer_direct(pid, local, remote, len, write) };
    }
    #[cfg(test)]
    BOUNCED.set(BOUNCED.get() + 1);
    BOUNCE.with_borrow_mut(|bounce| {
        if bounce.len() < BOUNCE_PIECE + 4096 {
            bounce.resize(BOUNCE_PIECE + 4096, 0);
        }
        // The kernel's side of each piece at distance 0: the bounce range
        // starts at the remote address's offset within its page.
        let base = bounce.as_mut_ptr();
        let at = (remote as usize).wrapping_sub(base as usize) % 4096;
        // Stays inside the bounce buffer: at < 4096.
        let b = base.wrapping_add(at);
        let mut done = 0;
        while done < len {
            let n = BOUNCE_PIECE.min(len - done);
            let (l, r) = (local.wrapping_add(done), remote + done as u64);
            if write {
                // SAFETY: `l..l+n` is readable (caller's contract) and
                // `b..b+n` lies in our bounce buffer (at + n <= 4096 +
                // BOUNCE_PIECE); they do not overlap. Then the kernel reads
                // the bounce range, which nothing else touches.
                unsafe {
                    crate::reduce::copy_mem(l, b, n);
                    transfer_direct(pid, b, r, n, true)?;
                }
            } else {
                // SAFETY: the bounce range is ours and writable; then
                // `l..l+n` is writable and unshared (caller's contract) and
                // does not overlap the bounce buffer.
                unsafe {
                    transfer_direct(pid, b, r, n, false)?;
                    crate::reduce::copy_mem(b, l, n);
                }
            }
            done += n;
        }
        Ok(())
    })
}

/// One `process_vm_readv` / `process_vm_writev` range, looping over
/// partial transfers.
///
/// # Safety
/// As [`transfer`].
unsafe fn transfer_direct(
    pid: i32,
    local: *mut u8,
    remote: u64,
    len: usize,
    write: bool,
) -> std::io::Result<()> {
    let mut done = 0usize;
    while done < len {
        let local = libc::iovec {
            iov_base: local.wrapping_add(done).cast(),
            iov_len: len - done,
        };
        let remote = libc::iovec {
            iov_base: (remote as usize).wrapping_add(done) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: `local` describes memory valid for the direction of the
        // copy per the caller's contract; the kernel checks `remote` against
        // the other process's mappings and fails with EFAULT rather than
        // touching anything else.
        let n = unsafe {
            if write {
                libc::process_vm_writev(pid, &local, 1, &remote, 1, 0)
            } else {
                libc::process_vm_readv(pid, &local, 1, &remote, 1, 0)
            }
        };
        match usize::try_from(n) {
            Ok(0) => return Err(std::io::Error::from_raw_os_error(libc::EFAULT)),
            Ok(n) => done += n,
            Err(_) => {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EINTR) {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// Whether we can read process `pid`'s memory: reads its probe word at
/// `addr` and compares it with [`PROBE_VALUE`].
pub(super) fn probe(pid: i32, addr: u64) -> Result<(), String> {
    if pid <= 0 || addr == 0 {
        return Err("the sender published no probe address".into());
    }
    let mut word = 0u64;
    // SAFETY: `word` is a local, writable for 8 bytes and not aliased.
    match unsafe { read(pid, std::ptr::addr_of_mut!(word).cast(), addr, 8) } {
        Ok(()) if word == PROBE_VALUE => Ok(()),
        Ok(()) => Err("the probe read back a wrong value".into()),
        Err(e) => Err(format!("process_vm_readv: {e}")),
    }
}

/// Logs at INFO, once per process and outcome, which path the shared-memory
/// transport uses for large messages.
pub(super) fn log_outcome(outcome: &Result<(), String>, min_bytes: usize) {
    static LOGGED_YES: AtomicBool = AtomicBool::new(false);
    static LOGGED_NO: AtomicBool = AtomicBool::new(false);
    match outcome {
        Ok(()) => {
            if !LOGGED_YES.swap(true, Ordering::Relaxed) {
                tracing::info!(
                    min_bytes,
                    "SHM: single copy by process_vm_readv for messages of at least {min_bytes} bytes"
                );
            }
        }
        Err(why) => {
            if !LOGGED_NO.swap(true, Ordering::Relaxed) {
                tracing::info!("SHM: single copy unavailable ({why}); copying through the ring");
            }
        }
    }
}
