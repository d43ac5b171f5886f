//! Is the process on the other end still there?
//!
//! Each side stores its pid (and its pid namespace) in the segment header
//! and sets a `closed` flag when its comm is dropped. A comm whose poll made
//! no progress first looks at the flag (one load of a cache line nobody
//! writes), and every [`CHECK_POLLS`] stalled polls or [`CHECK_INTERVAL`],
//! whichever comes first, asks the kernel whether the peer's pid still
//! exists (`kill(pid, 0)`) and is not a zombie (`/proc/<pid>/stat`). A peer
//! in another pid namespace cannot be checked by pid; only its flag counts.

use super::segment::Side;
use std::sync::atomic::Ordering;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Stalled polls between two liveness checks.
pub(super) const CHECK_POLLS: u32 = 1000;
/// Longest time between two liveness checks while stalled.
pub(super) const CHECK_INTERVAL: Duration = Duration::from_millis(10);

/// Watches the peer of one comm.
#[derive(Debug)]
pub(super) struct PeerWatch {
    pid: i32,
    by_pid: bool,
    stalls: u32,
    last: Instant,
}

impl PeerWatch {
    /// Watches `pid`, which lives in pid namespace `pidns` (0: unknown).
    pub(super) fn new(pid: i32, pidns: u64) -> PeerWatch {
        let ours = own_pidns();
        PeerWatch {
            pid,
            by_pid: pid > 0 && (pidns == 0 || ours == 0 || pidns == ours),
            stalls: 0,
            last: Instant::now(),
        }
    }

    /// The peer's pid.
    pub(super) fn pid(&self) -> i32 {
        self.pid
    }

    /// The comm moved data: the peer is evidently alive.
    pub(super) fn progressed(&mut self) {
        self.stalls = 0;
    }

    /// The comm made no progress although requests are pending. Returns
    /// true when the peer has closed its end or its process is gone; the
    /// caller must then look at the ring once more (everything the peer
    /// published before closing or dying is visible by now) before giving
    /// up.
    pub(super) fn stalled(&mut self, peer: &Side) -> bool {
        if peer.closed.load(Ordering::Acquire) != 0 {
            return true;
        }
        self.stalls = self.stalls.saturating_add(1);
        let due = self.stalls >= CHECK_POLLS
            || (self.stalls & 15 == 0 && self.last.elapsed() >= CHECK_INTERVAL);
        if !due {
            return false;
        }
        self.stalls = 0;
        self.last = Instant::now();
        self.by_pid && !pid_alive(self.pid)
    }
}

/// Our process id.
pub(super) fn own_pid() -> i32 {
    std::process::id() as i32
}

/// Whether process `pid` exists and is not a zombie. Unknown pids (≤ 0)
/// count as alive.
pub(super) fn pid_alive(pid: i32) -> bool {
    if pid <= 0 {
        return true;
    }
    // SAFETY: signal 0 delivers nothing; the kernel only checks that the
    // process exists and that we may signal it.
    let r = unsafe { libc::kill(pid, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    // EPERM: exists, owned by someone else. Either way it may be a zombie
    // that nobody has reaped yet.
    !is_zombie(pid)
}

/// Whether `/proc/<pid>/stat` shows state `Z` (zombie) or `X` (dead).
/// Allocation-free; false when it cannot tell.
fn is_zombie(pid: i32) -> bool {
    use std::io::Write;
    let mut path = [0u8; 40];
    {
        let room = path.len() - 1;
        let mut w = &mut path[..room];
        if write!(w, "/proc/{pid}/stat").is_err() {
            return false;
        }
    }
    // SAFETY: `path` is NUL-terminated: its last byte is never written and
    // was zero-initialised.
    let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return false;
    }
    let mut buf = [0u8; 512];
    // SAFETY: `fd` is an open descriptor we own; `buf` is writable for its
    // length.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    // SAFETY: `fd` is ours and closed exactly once.
    unsafe { libc::close(fd) };
    let Ok(n) = usize::try_from(n) else {
        return false;
    };
    // "pid (comm) S ...": the command may contain ')', so take the last one.
    let line = &buf[..n];
    match line.iter().rposition(|&b| b == b')') {
        Some(i) => matches!(line.get(i + 2), Some(b'Z' | b'X')),
        None => false,
    }
}

/// Inode of our pid namespace (`/proc/self/ns/pid`), 0 if unknown.
pub(super) fn own_pidns() -> u64 {
    static NS: OnceLock<u64> = OnceLock::new();
    *NS.get_or_init(|| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self/ns/pid")
            .map(|m| m.ino())
            .unwrap_or(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness() {
        assert!(pid_alive(own_pid()));
        assert!(!is_zombie(own_pid()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        // Exited but not reaped: a zombie.
        let deadline = Instant::now() + Duration::from_secs(20);
        while pid_alive(pid) {
            assert!(Instant::now() < deadline, "child {pid} never exited");
            std::thread::sleep(Duration::from_millis(1));
        }
        child.wait().unwrap();
        assert!(!pid_alive(pid));
    }
}
