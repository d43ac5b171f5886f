//! Thin wrappers over the few libc socket calls the transport needs.
//!
//! Everything here is Linux flavoured (`SOCK_NONBLOCK`, `accept4`,
//! `MSG_NOSIGNAL`), like NCCL itself. Sends always pass `MSG_NOSIGNAL`, so a
//! peer that went away yields `EPIPE` instead of killing a host process that
//! did not ignore `SIGPIPE` (this crate may end up inside a C program).

use std::io;
use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A new non-blocking, close-on-exec TCP socket for `addr`'s family.
pub(crate) fn tcp_socket(addr: &SocketAddr) -> io::Result<OwnedFd> {
    let domain = match addr {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: socket() takes no pointers; the result is checked below.
    let fd = cvt(unsafe {
        libc::socket(
            domain,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    })?;
    // SAFETY: `fd` was just returned by socket(); nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn setsockopt_int(
    fd: &OwnedFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `value` is a live c_int and the length passed is its size.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(drop)
}

fn getsockopt_int(fd: &OwnedFd, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are live out-parameters of the sizes declared.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    })?;
    Ok(value)
}

/// Disables Nagle's algorithm.
pub(crate) fn set_nodelay(fd: &OwnedFd) -> io::Result<()> {
    setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)
}

/// Sets `TCP_QUICKACK`: `false` puts the socket in delayed-ACK ("ping-pong")
/// mode, which the kernel leaves when a delayed ACK's timer fires.
pub(crate) fn set_quickack(fd: &OwnedFd, on: bool) -> io::Result<()> {
    setsockopt_int(
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_QUICKACK,
        libc::c_int::from(on),
    )
}

/// Whether the socket is in quick-ACK mode (`TCP_QUICKACK`).
#[cfg(test)]
pub(crate) fn quickack(fd: &OwnedFd) -> io::Result<bool> {
    Ok(getsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_QUICKACK)? != 0)
}

/// Sets `SO_SNDBUF` and `SO_RCVBUF` to `bytes` (0 leaves the kernel's
/// autotuning alone). The kernel caps the value at `net.core.[rw]mem_max`.
pub(crate) fn set_buffers(fd: &OwnedFd, bytes: usize) -> io::Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, v)?;
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, v)
}

/// Takes the pending socket error (`SO_ERROR`), if any.
pub(crate) fn take_error(fd: &OwnedFd) -> io::Result<Option<io::Error>> {
    let e = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR)?;
    Ok((e != 0).then(|| io::Error::from_raw_os_error(e)))
}

fn to_sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data, all zeroes is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            // SAFETY: plain old data, all zeroes is valid.
            let mut sin: libc::sockaddr_in = unsafe { mem::zeroed() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
            // SAFETY: sockaddr_storage is larger than and aligned at least as
            // strictly as sockaddr_in (that is its purpose).
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
            (
                storage,
                mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        }
        SocketAddr::V6(a) => {
            // SAFETY: plain old data, all zeroes is valid.
            let mut sin6: libc::sockaddr_in6 = unsafe { mem::zeroed() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_scope_id = a.scope_id();
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
            (
                storage,
                mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            )
        }
    }
}

fn from_sockaddr(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match libc::c_int::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in, which
            // it is large and aligned enough for.
            let sin: libc::sockaddr_in =
                unsafe { std::ptr::read((storage as *const libc::sockaddr_storage).cast()) };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6: libc::sockaddr_in6 =
                unsafe { std::ptr::read((storage as *const libc::sockaddr_storage).cast()) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Binds `fd` to `addr`.
pub(crate) fn bind(fd: &OwnedFd, addr: &SocketAddr) -> io::Result<()> {
    let (storage, len) = to_sockaddr(addr);
    // SAFETY: `storage` holds a valid sockaddr of `len` bytes.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&storage as *const libc::sockaddr_storage).cast(),
            len,
        )
    })
    .map(drop)
}

/// Starts listening.
pub(crate) fn listen(fd: &OwnedFd, backlog: libc::c_int) -> io::Result<()> {
    // SAFETY: no pointers involved.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), backlog) }).map(drop)
}

/// The address `fd` is bound to.
pub(crate) fn local_addr(fd: &OwnedFd) -> io::Result<SocketAddr> {
    // SAFETY: plain old data, all zeroes is valid.
    let mut storage: libc::sockaddr_storage = unsafe { mem::zeroed() };
    let mut len = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `storage` / `len` are live out-parameters; `len` is its size.
    cvt(unsafe {
        libc::getsockname(
            fd.as_raw_fd(),
            (&mut storage as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    })?;
    from_sockaddr(&storage)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unknown address family"))
}

/// Starts a connect. On a non-blocking socket the usual answer is an error
/// with `EINPROGRESS`.
pub(crate) fn connect(fd: &OwnedFd, addr: &SocketAddr) -> io::Result<()> {
    let (storage, len) = to_sockaddr(addr);
    loop {
        // SAFETY: `storage` holds a valid sockaddr of `len` bytes.
        let r = unsafe {
            libc::connect(
                fd.as_raw_fd(),
                (&storage as *const libc::sockaddr_storage).cast(),
                len,
            )
        };
        match cvt(r) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other.map(drop),
        }
    }
}

/// Accepts one connection as a non-blocking, close-on-exec socket.
pub(crate) fn accept(fd: &OwnedFd) -> io::Result<(OwnedFd, Option<SocketAddr>)> {
    loop {
        // SAFETY: plain old data, all zeroes is valid.
        let mut storage: libc::sockaddr_storage = unsafe { mem::zeroed() };
        let mut len = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: `storage` / `len` are live out-parameters; `len` is its size.
        let r = unsafe {
            libc::accept4(
                fd.as_raw_fd(),
                (&mut storage as *mut libc::sockaddr_storage).cast(),
                &mut len,
                libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            )
        };
        match cvt(r) {
            // SAFETY: `fd` was just returned by accept4(); nobody else owns it.
            Ok(fd) => return Ok((unsafe { OwnedFd::from_raw_fd(fd) }, from_sockaddr(&storage))),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Whether `fd` is writable or has an error/hangup pending, without waiting.
pub(crate) fn poll_writable(fd: &OwnedFd) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    loop {
        // SAFETY: `p` is one live pollfd; timeout 0 never blocks.
        match cvt(unsafe { libc::poll(&mut p, 1, 0) }) {
            Ok(0) => return Ok(false),
            Ok(_) => return Ok(p.revents & (libc::POLLOUT | libc::POLLERR | libc::POLLHUP) != 0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

fn cvt_size(r: isize) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Non-blocking send of `buf` (never raises `SIGPIPE`).
pub(crate) fn send(fd: &OwnedFd, buf: &[u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is valid for reads of `buf.len()` bytes.
        let r = unsafe {
            libc::send(
                fd.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
        match cvt_size(r) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Non-blocking receive into `buf`; `Ok(0)` means end of stream.
pub(crate) fn recv(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes.
        let r = unsafe {
            libc::recv(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        match cvt_size(r) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Non-blocking gathering send (`sendmsg`, never raises `SIGPIPE`).
///
/// # Safety
/// Every element of `iov` must describe memory valid for reads of its
/// length for the duration of the call.
pub(crate) unsafe fn send_iov(fd: &OwnedFd, iov: &[libc::iovec]) -> io::Result<usize> {
    // SAFETY: msghdr is plain old data, all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len() as _;
    loop {
        // SAFETY: `msg` points at `iov`, whose entries the caller guarantees
        // readable; sendmsg only reads through them.
        let r = unsafe {
            libc::sendmsg(
                fd.as_raw_fd(),
                &msg,
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
        match cvt_size(r) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Non-blocking scattering receive (`recvmsg`); `Ok(0)` means end of stream.
///
/// # Safety
/// Every element of `iov` must describe memory valid for writes of its
/// length, and not otherwise accessed, for the duration of the call.
pub(crate) unsafe fn recv_iov(fd: &OwnedFd, iov: &[libc::iovec]) -> io::Result<usize> {
    // SAFETY: msghdr is plain old data, all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len() as _;
    loop {
        // SAFETY: `msg` points at `iov`, whose entries the caller guarantees
        // writable; recvmsg writes at most their lengths.
        let r = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
        match cvt_size(r) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Reads `N` random bytes from `/dev/urandom`.
pub(crate) fn random_bytes<const N: usize>() -> io::Result<[u8; N]> {
    use std::io::Read;
    let mut out = [0u8; N];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut out)?;
    Ok(out)
}

/// Whether an I/O error means the peer is gone.
pub(crate) fn is_disconnect(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EPIPE)
            | Some(libc::ECONNRESET)
            | Some(libc::ENOTCONN)
            | Some(libc::ECONNABORTED)
    )
}

/// A new non-blocking, close-on-exec `eventfd` (helper thread wake-ups).
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd() takes no pointers; the result is checked below.
    let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
    // SAFETY: `fd` was just returned by eventfd(); nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds 1 to an eventfd's counter, making it readable. Cannot fail in a
/// way worth reporting (a full counter is already readable).
pub(crate) fn eventfd_signal(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64, as eventfd requires.
    let _ = unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// Resets an eventfd's counter (non-blocking; nothing to do if zero).
pub(crate) fn eventfd_drain(fd: &OwnedFd) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64, as eventfd requires.
    let _ = unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
}

/// `poll(2)` on `fds` for at most `timeout_ms`; an interrupted call counts
/// as a timeout (the caller polls again).
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout_ms: libc::c_int) -> io::Result<usize> {
    // SAFETY: `fds` is a live slice of pollfd of the length passed.
    match cvt(unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) }) {
        Ok(n) => Ok(n as usize),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
        Err(e) => Err(e),
    }
}

/// A non-blocking, close-on-exec pipe that socket sends splice user pages
/// through (see [`crate::lanes`]).
pub(crate) struct Pipe {
    pub(crate) r: OwnedFd,
    pub(crate) w: OwnedFd,
    /// Bytes the pipe holds at most (from `F_GETPIPE_SZ`).
    pub(crate) cap: usize,
    /// Bytes in the pipe not yet spliced to the socket.
    pub(crate) held: usize,
}

/// A new [`Pipe`], grown to `bytes` where the kernel allows (an
/// unprivileged process gets at most `/proc/sys/fs/pipe-max-size`, 1 MiB by
/// default; a smaller pipe only costs more calls).
pub(crate) fn pipe(bytes: usize) -> io::Result<Pipe> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the live array.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) })?;
    // SAFETY: both descriptors were just returned by pipe2; nobody else
    // owns them.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let want = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: F_SETPIPE_SZ / F_GETPIPE_SZ take an int and no pointers.
    let _ = unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, want) };
    // SAFETY: as above.
    let cap = cvt(unsafe { libc::fcntl(w.as_raw_fd(), libc::F_GETPIPE_SZ) })?;
    Ok(Pipe {
        r,
        w,
        cap: cap as usize,
        held: 0,
    })
}

/// Maps up to `len` bytes at `ptr` into the pipe (`vmsplice` without
/// `SPLICE_F_GIFT`: the pipe takes references to the pages, it copies
/// nothing). Returns the bytes taken.
///
/// # Safety
/// `ptr..ptr + len` must be readable memory of this process, and must not be
/// written until every byte taken has been read at the far end of whatever
/// the pipe feeds: the kernel reads the pages themselves, later.
pub(crate) unsafe fn vmsplice(p: &Pipe, ptr: *const u8, len: usize) -> io::Result<usize> {
    let iov = libc::iovec {
        iov_base: ptr.cast_mut().cast(),
        iov_len: len,
    };
    loop {
        // SAFETY: `iov` is a live iovec; the caller vouches for the memory.
        let r = unsafe { libc::vmsplice(p.w.as_raw_fd(), &iov, 1, libc::SPLICE_F_NONBLOCK) };
        match cvt_size(r) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Moves up to `len` bytes from the pipe to the (non-blocking) socket
/// without copying them. Call only inside [`without_sigpipe`]: `splice`
/// has no `MSG_NOSIGNAL`.
pub(crate) fn splice_to_socket(p: &Pipe, fd: &OwnedFd, len: usize) -> io::Result<usize> {
    loop {
        // SAFETY: no pointers; both descriptors are live.
        let r = unsafe {
            libc::splice(
                p.r.as_raw_fd(),
                std::ptr::null_mut(),
                fd.as_raw_fd(),
                std::ptr::null_mut(),
                len,
                libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
            )
        };
        match cvt_size(r) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Runs `f` with `SIGPIPE` blocked in this thread and consumes a `SIGPIPE`
/// that `f` raised (one that was pending before is left alone), so that a
/// peer that went away yields `EPIPE` and does not kill a host process
/// that did not ignore the signal, as `MSG_NOSIGNAL` does for `sendmsg`.
pub(crate) fn without_sigpipe<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: sigset_t is plain old data; sigemptyset initialises it.
    let mut set: libc::sigset_t = unsafe { mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { mem::zeroed() };
    // SAFETY: as above.
    let mut pending: libc::sigset_t = unsafe { mem::zeroed() };
    // SAFETY: every pointer is to a live local sigset_t.
    let before = unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        libc::sigpending(&mut pending) == 0 && libc::sigismember(&pending, libc::SIGPIPE) == 1
    };
    let out = f();
    // SAFETY: as above; the zero timeout makes sigtimedwait a poll.
    unsafe {
        if !before
            && libc::sigpending(&mut pending) == 0
            && libc::sigismember(&pending, libc::SIGPIPE) == 1
        {
            let zero = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            libc::sigtimedwait(&set, std::ptr::null_mut(), &zero);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
    out
}

#[cfg(test)]
mod sigpipe_tests {
    use super::*;

    fn sigpipe_pending() -> bool {
        // SAFETY: a live local sigset_t, initialised by sigpending.
        unsafe {
            let mut set: libc::sigset_t = mem::zeroed();
            libc::sigpending(&mut set) == 0 && libc::sigismember(&set, libc::SIGPIPE) == 1
        }
    }

    fn sigpipe_blocked() -> bool {
        // SAFETY: a live local sigset_t, filled in by pthread_sigmask.
        unsafe {
            let mut set: libc::sigset_t = mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut set);
            libc::sigismember(&set, libc::SIGPIPE) == 1
        }
    }

    static DELIVERED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    extern "C" fn count(_: libc::c_int) {
        DELIVERED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// A `SIGPIPE` raised inside is held while blocked and consumed on the
    /// way out, never delivered (a counting handler stands in for the
    /// default action, which would kill the process); the thread's mask is
    /// as before.
    #[test]
    fn sigpipe_raised_inside_is_consumed() {
        // SAFETY: sigaction is plain old data; the handler only touches an
        // atomic, and the previous action is put back below.
        let old = unsafe {
            let mut act: libc::sigaction = mem::zeroed();
            let mut old: libc::sigaction = mem::zeroed();
            act.sa_sigaction = count as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigaction(libc::SIGPIPE, &act, &mut old);
            old
        };
        assert!(!sigpipe_blocked() && !sigpipe_pending());
        let seen = without_sigpipe(|| {
            // SAFETY: raise() takes no pointers; the signal is blocked here
            // (pending, not delivered).
            unsafe { libc::raise(libc::SIGPIPE) };
            (sigpipe_blocked(), sigpipe_pending())
        });
        let delivered = DELIVERED.load(std::sync::atomic::Ordering::SeqCst);
        // SAFETY: restores the action saved above.
        unsafe { libc::sigaction(libc::SIGPIPE, &old, std::ptr::null_mut()) };
        assert_eq!(seen, (true, true), "blocked and pending inside");
        assert_eq!(delivered, 0, "delivered instead of consumed");
        assert!(!sigpipe_pending() && !sigpipe_blocked(), "mask restored");
    }
}
