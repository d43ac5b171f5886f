//! One socket of `tcp_floor`'s sending side and the ways it sends: plain
//! copies, `MSG_ZEROCOPY` with its completions, `vmsplice` + `splice`.

use super::{os_err, Way};
use std::net::TcpStream;
use std::os::fd::AsRawFd;

/// `SO_ZEROCOPY` (asm-generic/socket.h; not exported by `libc` for every
/// target).
const SO_ZEROCOPY: libc::c_int = 60;
/// `SO_EE_ORIGIN_ZEROCOPY` (linux/errqueue.h).
const SO_EE_ORIGIN_ZEROCOPY: u8 = 5;
/// `SO_EE_CODE_ZEROCOPY_COPIED`: the kernel copied the pages after all.
const SO_EE_CODE_ZEROCOPY_COPIED: u8 = 1;
/// The pipe a spliced send goes through.
const PIPE_BYTES: usize = 1 << 20;
/// The largest piece given to one `send` with `MSG_ZEROCOPY`.
const ZC_PIECE: usize = 4 << 20;

/// One socket of the sending side and what each way needs besides it.
pub(crate) struct Lane {
    pub(crate) sock: TcpStream,
    /// The pipe of spliced sends (read end, write end).
    pipe: (libc::c_int, libc::c_int),
    /// Bytes of the current part sent (given to the kernel); the caller
    /// sets 0 before each message.
    pub(crate) at: usize,
    /// Bytes spliced into the pipe and not yet into the socket.
    in_pipe: usize,
    /// Zero-copy sends issued and completed (the kernel numbers them from 0).
    zc_sent: u32,
    zc_done: u32,
    /// Whether a completion said the kernel copied after all.
    pub(crate) zc_copied: bool,
}

impl Lane {
    pub(crate) fn new(sock: TcpStream) -> Result<Self, String> {
        sock.set_nodelay(true)
            .map_err(|e| format!("nodelay: {e}"))?;
        let one: libc::c_int = 1;
        // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a live
        // c_int on the stack; the descriptor is the stream's own.
        let r = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_ZEROCOPY,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(os_err("SO_ZEROCOPY"));
        }
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2 writes two descriptors into the two-element array.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(os_err("pipe2"));
        }
        let lane = Self {
            sock,
            pipe: (fds[0], fds[1]),
            at: 0,
            in_pipe: 0,
            zc_sent: 0,
            zc_done: 0,
            zc_copied: false,
        };
        // SAFETY: F_SETPIPE_SZ on a pipe this process just made; no memory
        // is passed.
        if unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, PIPE_BYTES as libc::c_int) } < 0 {
            return Err(os_err("F_SETPIPE_SZ (see /proc/sys/fs/pipe-max-size)"));
        }
        Ok(lane)
    }

    /// Whether all of `part` has left through this lane (and, sent
    /// zero-copy, been completed).
    pub(crate) fn done(&self, part: &[u8]) -> bool {
        self.at == part.len() && self.in_pipe == 0 && self.zc_done == self.zc_sent
    }

    /// One non-blocking attempt to move more of `part` one way (one way
    /// only: `both` goes through [`exchange`]); whether anything moved.
    /// `part` stays unwritten until the receiver answers.
    pub(crate) fn step(&mut self, way: Way, part: &[u8]) -> Result<bool, String> {
        let fd = self.sock.as_raw_fd();
        let rest = &part[self.at..];
        match way {
            Way::Plain | Way::Both => {
                if rest.is_empty() {
                    return Ok(false);
                }
                // SAFETY: send reads `rest.len()` bytes of a live slice.
                let n =
                    unsafe { libc::send(fd, rest.as_ptr().cast(), rest.len(), libc::MSG_DONTWAIT) };
                self.advance(n, "send")
            }
            Way::ZeroCopy => {
                let reaped = self.reap()?;
                if rest.is_empty() {
                    return Ok(reaped);
                }
                let piece = &rest[..rest.len().min(ZC_PIECE)];
                // SAFETY: send reads `piece.len()` bytes of a live slice;
                // with MSG_ZEROCOPY the kernel may read them until the
                // completion arrives, and the caller leaves `part` unwritten
                // until the receiver has answered, after every completion.
                let n = unsafe {
                    libc::send(
                        fd,
                        piece.as_ptr().cast(),
                        piece.len(),
                        libc::MSG_ZEROCOPY | libc::MSG_DONTWAIT,
                    )
                };
                if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOBUFS) {
                    return Ok(reaped); // too many completions pending
                }
                let moved = self.advance(n, "send MSG_ZEROCOPY")?;
                self.zc_sent += u32::from(moved);
                Ok(moved || reaped)
            }
            Way::Splice => {
                let (rd, wr) = self.pipe;
                let mut moved = false;
                if self.in_pipe == 0 && !rest.is_empty() {
                    let piece = &rest[..rest.len().min(PIPE_BYTES)];
                    let iov = libc::iovec {
                        iov_base: piece.as_ptr() as *mut _,
                        iov_len: piece.len(),
                    };
                    // SAFETY: vmsplice maps the pages of a live slice into
                    // an empty pipe; they stay referenced until the receiver
                    // has read them, and the caller leaves `part` unwritten
                    // until the receiver has answered.
                    let n = unsafe { libc::vmsplice(wr, &iov, 1, libc::SPLICE_F_NONBLOCK) };
                    if n < 0 {
                        return Err(os_err("vmsplice"));
                    }
                    (self.at, self.in_pipe, moved) = (self.at + n as usize, n as usize, true);
                }
                if self.in_pipe == 0 {
                    return Ok(moved);
                }
                // More follows unless these are the part's last bytes (a
                // last piece held back for more would wait for a timer).
                let more = if self.at < part.len() {
                    libc::SPLICE_F_MORE
                } else {
                    0
                };
                // SAFETY: splice between two descriptors this lane owns; no
                // memory is passed.
                let n = unsafe {
                    libc::splice(
                        rd,
                        std::ptr::null_mut(),
                        fd,
                        std::ptr::null_mut(),
                        self.in_pipe,
                        more | libc::SPLICE_F_NONBLOCK,
                    )
                };
                if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock
                {
                    return Ok(moved);
                }
                if n <= 0 {
                    return Err(os_err("splice"));
                }
                self.in_pipe -= n as usize;
                Ok(true)
            }
        }
    }

    /// Counts `n` bytes a non-blocking call moved (none if it would block).
    fn advance(&mut self, n: isize, what: &str) -> Result<bool, String> {
        if n >= 0 {
            self.at += n as usize;
            return Ok(n > 0);
        }
        match std::io::Error::last_os_error() {
            e if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
            e => Err(format!("{what}: {e}")),
        }
    }

    /// Reads the zero-copy completions waiting in the error queue; whether
    /// there were any.
    fn reap(&mut self) -> Result<bool, String> {
        let fd = self.sock.as_raw_fd();
        let mut any = false;
        loop {
            let mut control = [0u64; 16];
            // SAFETY: an all-zero msghdr is valid (no name, no data).
            let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
            m.msg_control = control.as_mut_ptr().cast();
            m.msg_controllen = std::mem::size_of_val(&control);
            // SAFETY: recvmsg writes at most msg_controllen bytes into
            // `control`, which outlives the call; no data buffers.
            let r = unsafe { libc::recvmsg(fd, &mut m, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::WouldBlock {
                    return Ok(any);
                }
                return Err(format!("error queue: {e}"));
            }
            // SAFETY: CMSG_FIRSTHDR reads the msghdr recvmsg just filled.
            let c = unsafe { libc::CMSG_FIRSTHDR(&m) };
            if c.is_null() {
                return Err("an error-queue message without control data".into());
            }
            // SAFETY: `c` points into `control`, at a header the kernel
            // wrote; its data is a sock_extended_err for IP_RECVERR, read
            // unaligned since `control` only promises 8-byte alignment.
            let e: libc::sock_extended_err =
                unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c).cast()) };
            if e.ee_origin != SO_EE_ORIGIN_ZEROCOPY {
                return Err(format!(
                    "error queue: errno {} origin {}",
                    e.ee_errno, e.ee_origin
                ));
            }
            self.zc_copied |= e.ee_code & SO_EE_CODE_ZEROCOPY_COPIED != 0;
            // A completion covers the sends numbered ee_info..=ee_data.
            self.zc_done = self.zc_done.max(e.ee_data.wrapping_add(1));
            any = true;
        }
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        // SAFETY: the pipe's descriptors are this lane's own, closed once.
        unsafe {
            libc::close(self.pipe.0);
            libc::close(self.pipe.1);
        }
    }
}
