//! The side TCP socket that completes the connection handshake (NCCL's IB
//! transport does the same: the handle names a socket, and the QP details
//! of both sides travel over it). After the handshake the socket stays open
//! for the life of the connection: end-of-file on it is how each side learns
//! promptly that its peer closed, instead of waiting out RDMA retries.
//!
//! All sockets are non-blocking; reads and writes make what progress they
//! can and report whether they finished.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};

/// Binds a non-blocking listener on `ip`, any port.
pub(crate) fn listen(ip: std::net::IpAddr) -> io::Result<TcpListener> {
    let l = TcpListener::bind(SocketAddr::new(ip, 0))?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Accepts one pending connection, if any.
pub(crate) fn accept(l: &TcpListener) -> io::Result<Option<(TcpStream, SocketAddr)>> {
    match l.accept() {
        Ok((s, a)) => {
            s.set_nonblocking(true)?;
            s.set_nodelay(true)?;
            Ok(Some((s, a)))
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Starts a non-blocking connect to `addr`.
pub(crate) fn start_connect(addr: &SocketAddr) -> io::Result<TcpStream> {
    let (domain, storage, len) = sockaddr(addr);
    // SAFETY: socket() takes no pointers; the result is checked.
    let fd = unsafe {
        libc::socket(
            domain,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket nobody else owns.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    // SAFETY: `storage` holds a sockaddr of `len` bytes for `domain`.
    let rc = unsafe { libc::connect(fd, (&storage as *const libc::sockaddr_storage).cast(), len) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
    }
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Whether a connect started by [`start_connect`] has finished
/// (`Ok(false)`: still in progress; `Err`: it failed).
pub(crate) fn poll_connected(s: &TcpStream) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n == 0 {
        return Ok(false);
    }
    match s.take_error()? {
        Some(e) => Err(e),
        None => Ok(true),
    }
}

fn sockaddr(addr: &SocketAddr) -> (libc::c_int, libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all-zero is valid.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for
            // sockaddr_in.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
            (
                libc::AF_INET,
                storage,
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
            (
                libc::AF_INET6,
                storage,
                std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            )
        }
    }
}

/// Reads a fixed number of bytes across polls.
#[derive(Debug)]
pub(crate) struct ReadExact {
    pub(crate) buf: Vec<u8>,
    got: usize,
}

impl ReadExact {
    pub(crate) fn new(n: usize) -> Self {
        ReadExact {
            buf: vec![0; n],
            got: 0,
        }
    }

    /// Grows the expected length to `n` (no-op if already that long), keeping
    /// what was read.
    pub(crate) fn extend_to(&mut self, n: usize) {
        if n > self.buf.len() {
            self.buf.resize(n, 0);
        }
    }

    /// Bytes read so far.
    pub(crate) fn filled(&self) -> &[u8] {
        &self.buf[..self.got]
    }

    /// Reads what is available; `Ok(true)` once complete. End-of-file
    /// before that is `UnexpectedEof`.
    pub(crate) fn poll(&mut self, s: &mut TcpStream) -> io::Result<bool> {
        while self.got < self.buf.len() {
            match s.read(&mut self.buf[self.got..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

/// Writes a buffer across polls.
#[derive(Debug)]
pub(crate) struct WriteAll {
    buf: Vec<u8>,
    sent: usize,
}

impl WriteAll {
    pub(crate) fn new(buf: Vec<u8>) -> Self {
        WriteAll { buf, sent: 0 }
    }

    /// Writes what the socket takes; `Ok(true)` once all is written.
    pub(crate) fn poll(&mut self, s: &mut TcpStream) -> io::Result<bool> {
        while self.sent < self.buf.len() {
            match s.write(&self.buf[self.sent..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

/// Whether the peer closed the (otherwise silent) socket.
pub(crate) fn peer_closed(s: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    match s.peek(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
        ),
    }
}

/// 8 random bytes (nonces) and 24-bit PSNs, from the kernel.
pub(crate) fn random_bytes<const N: usize>() -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The non-blocking helpers over loopback TCP (no RDMA involved).
    #[test]
    fn handshake_helpers_over_loopback() {
        let l = listen("127.0.0.1".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let mut c = start_connect(&addr).unwrap();
        let t = std::time::Instant::now();
        let mut server = None;
        while server.is_none() || !poll_connected(&c).unwrap() {
            assert!(t.elapsed().as_secs() < 10);
            if server.is_none() {
                server = accept(&l).unwrap();
            }
        }
        let (mut s, _) = server.unwrap();
        let mut w = WriteAll::new(b"hello world".to_vec());
        let mut r = ReadExact::new(11);
        while !w.poll(&mut c).unwrap() {}
        while !r.poll(&mut s).unwrap() {
            assert!(t.elapsed().as_secs() < 10);
        }
        assert_eq!(r.filled(), b"hello world");
        assert!(!peer_closed(&s));
        drop(c);
        while !peer_closed(&s) {
            assert!(t.elapsed().as_secs() < 10);
        }
        let mut r = ReadExact::new(1);
        assert_eq!(
            r.poll(&mut s).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        assert_ne!(random_bytes::<8>().unwrap(), [0; 8]);
    }
}
