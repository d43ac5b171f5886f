//! Connection setup: [`TcpListener`] (accepting side) and [`TcpConnector`]
//! (connecting side).
//!
//! The listener accepts every incoming TCP connection but only turns the one
//! that presents the greeting of its handle (magic, version, nonce; see
//! [`crate::handle`]) into a receive comm. Anything else — a wrong nonce,
//! garbage, a connection closed early or one that stays silent too long —
//! is dropped with a warning. At most [`HELLO_BYTES`] bytes are ever read
//! from a connection before it is judged, at most [`MAX_PENDING`]
//! unjudged connections are held (the oldest is dropped to make room), and
//! each is held at most [`HELLO_TIMEOUT`].

use crate::comm::{TcpRecvComm, TcpSendComm};
use crate::handle::{TcpHandle, HANDLE_BYTES, HELLO_BYTES};
use crate::{sys, MAX_REQUESTS};
use nccl_net::{Connector, Listener, NetError, NetResult, RecvComm, SendComm};
use std::io;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

/// Most connections accepted per `accept` poll.
const MAX_ACCEPTS_PER_POLL: usize = 16;
/// Most accepted connections waiting for their greeting.
pub const MAX_PENDING: usize = 16;
/// How long an accepted connection may take to send its greeting.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause between connect attempts refused by the peer.
const RETRY_INTERVAL: Duration = Duration::from_millis(20);
/// Connect attempts refused (or timed out) before giving up.
const MAX_RETRIES: u32 = 50;

struct Pending {
    fd: OwnedFd,
    peer: String,
    buf: [u8; HELLO_BYTES],
    got: usize,
    since: Instant,
}

enum Verdict {
    Wait,
    Good,
    Bad(&'static str),
}

/// The accepting side of one connection.
pub(crate) struct TcpListener {
    fd: OwnedFd,
    handle: [u8; HANDLE_BYTES],
    hello: [u8; HELLO_BYTES],
    buf_bytes: usize,
    pending: Vec<Pending>,
    accepted: bool,
}

impl TcpListener {
    /// Binds to `ip` (port 0) and listens.
    pub(crate) fn bind(ip: std::net::IpAddr, buf_bytes: usize, nsocks: u8) -> NetResult<Self> {
        let addr = SocketAddr::new(ip, 0);
        let fd = sys::tcp_socket(&addr).map_err(|e| NetError::io("socket", e))?;
        // Buffer sizes must be set before listen() to take effect on the
        // window scale negotiated for accepted connections.
        sys::set_buffers(&fd, buf_bytes).map_err(|e| NetError::io("setsockopt", e))?;
        sys::bind(&fd, &addr).map_err(|e| NetError::io("bind", e))?;
        sys::listen(&fd, libc::SOMAXCONN).map_err(|e| NetError::io("listen", e))?;
        let local = sys::local_addr(&fd).map_err(|e| NetError::io("getsockname", e))?;
        let nonce = sys::random_bytes::<8>().map_err(|e| NetError::io("read /dev/urandom", e))?;
        let h = TcpHandle {
            addr: local,
            nonce,
            nsocks,
        };
        tracing::debug!(%local, "NET/Socket: listening");
        Ok(TcpListener {
            fd,
            handle: h.encode(),
            hello: h.hello(),
            buf_bytes,
            pending: Vec::new(),
            accepted: false,
        })
    }

    /// Reads what is there of `p`'s greeting and judges it.
    fn judge(hello: &[u8; HELLO_BYTES], p: &mut Pending) -> Verdict {
        while p.got < HELLO_BYTES {
            match sys::recv(&p.fd, &mut p.buf[p.got..]) {
                Ok(0) => return Verdict::Bad("closed before completing the greeting"),
                Ok(n) => {
                    let end = p.got + n;
                    if let Some(j) = (p.got..end).find(|&j| p.buf[j] != hello[j]) {
                        // Bytes 0..8 are magic, version and padding.
                        return Verdict::Bad(if j < 8 {
                            "not a greeting (garbage or other version)"
                        } else {
                            "wrong nonce"
                        });
                    }
                    p.got = end;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return if p.since.elapsed() > HELLO_TIMEOUT {
                        Verdict::Bad("no greeting in time")
                    } else {
                        Verdict::Wait
                    };
                }
                Err(_) => return Verdict::Bad("error before completing the greeting"),
            }
        }
        Verdict::Good
    }
}

impl Listener for TcpListener {
    fn handle(&self) -> &[u8] {
        &self.handle
    }

    fn accept(&mut self) -> NetResult<Option<Box<dyn RecvComm>>> {
        if self.accepted {
            return Err(NetError::Other(
                "listener already accepted its connection".into(),
            ));
        }
        for _ in 0..MAX_ACCEPTS_PER_POLL {
            match sys::accept(&self.fd) {
                Ok((fd, peer)) => {
                    if self.pending.len() >= MAX_PENDING {
                        let old = self.pending.remove(0);
                        tracing::warn!(peer = %old.peer, "NET/Socket: dropping connection: too many awaiting their greeting");
                    }
                    let peer = peer.map_or_else(|| "unknown".to_owned(), |a| a.to_string());
                    self.pending.push(Pending {
                        fd,
                        peer,
                        buf: [0; HELLO_BYTES],
                        got: 0,
                        since: Instant::now(),
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // The peer gave up between SYN and accept(): nothing to do.
                Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => continue,
                Err(e) => return Err(NetError::io("accept", e)),
            }
        }
        let mut i = 0;
        while i < self.pending.len() {
            match Self::judge(&self.hello, &mut self.pending[i]) {
                Verdict::Wait => i += 1,
                Verdict::Bad(why) => {
                    let p = self.pending.remove(i);
                    tracing::warn!(peer = %p.peer, "NET/Socket: dropping incoming connection: {why}");
                }
                Verdict::Good => {
                    let p = self.pending.swap_remove(i);
                    for other in self.pending.drain(..) {
                        tracing::debug!(peer = %other.peer, "NET/Socket: dropping unjudged connection");
                    }
                    sys::set_nodelay(&p.fd).map_err(|e| NetError::io("setsockopt", e))?;
                    sys::set_buffers(&p.fd, self.buf_bytes)
                        .map_err(|e| NetError::io("setsockopt", e))?;
                    self.accepted = true;
                    tracing::debug!(peer = %p.peer, "NET/Socket: accepted connection");
                    return Ok(Some(Box::new(TcpRecvComm::new(p.fd, p.peer, MAX_REQUESTS))));
                }
            }
        }
        Ok(None)
    }
}

enum State {
    /// Waiting to retry a refused connect.
    Backoff(Instant),
    /// Non-blocking connect in flight.
    Connecting(OwnedFd),
    /// Connected; writing the greeting.
    Hello(OwnedFd, usize),
    /// Handed out its comm (or failed).
    Done,
}

/// The connecting side of one connection.
pub(crate) struct TcpConnector {
    target: SocketAddr,
    hello: [u8; HELLO_BYTES],
    buf_bytes: usize,
    retries: u32,
    state: State,
}

impl TcpConnector {
    /// Starts connecting to the listener of `handle`.
    pub(crate) fn start(handle: &TcpHandle, buf_bytes: usize) -> NetResult<Self> {
        let mut c = TcpConnector {
            target: handle.addr,
            hello: handle.hello(),
            buf_bytes,
            retries: 0,
            state: State::Done,
        };
        c.state = c.attempt()?;
        Ok(c)
    }

    fn attempt(&mut self) -> NetResult<State> {
        let fd = sys::tcp_socket(&self.target).map_err(|e| NetError::io("socket", e))?;
        sys::set_nodelay(&fd).map_err(|e| NetError::io("setsockopt", e))?;
        sys::set_buffers(&fd, self.buf_bytes).map_err(|e| NetError::io("setsockopt", e))?;
        match sys::connect(&fd, &self.target) {
            Ok(()) => Ok(State::Hello(fd, 0)),
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(State::Connecting(fd)),
            Err(e) => self.retry_or_fail(e),
        }
    }

    fn retry_or_fail(&mut self, e: io::Error) -> NetResult<State> {
        let retryable = matches!(
            e.raw_os_error(),
            Some(libc::ECONNREFUSED) | Some(libc::ETIMEDOUT) | Some(libc::EAGAIN)
        );
        if retryable && self.retries < MAX_RETRIES {
            self.retries += 1;
            tracing::debug!(target_addr = %self.target, error = %e, retry = self.retries, "NET/Socket: connect retry");
            Ok(State::Backoff(Instant::now() + RETRY_INTERVAL))
        } else {
            Err(NetError::Io {
                call: "connect",
                source: io::Error::new(e.kind(), format!("to {}: {e}", self.target)),
            })
        }
    }

    fn step(&mut self, state: State) -> NetResult<(State, Option<Box<dyn SendComm>>)> {
        Ok(match state {
            State::Backoff(until) if Instant::now() < until => (State::Backoff(until), None),
            State::Backoff(_) => (self.attempt()?, None),
            State::Connecting(fd) => {
                if !sys::poll_writable(&fd).map_err(|e| NetError::io("poll", e))? {
                    (State::Connecting(fd), None)
                } else {
                    match sys::take_error(&fd).map_err(|e| NetError::io("getsockopt", e))? {
                        None => (State::Hello(fd, 0), None),
                        Some(e) => (self.retry_or_fail(e)?, None),
                    }
                }
            }
            State::Hello(fd, mut sent) => {
                while sent < HELLO_BYTES {
                    match sys::send(&fd, &self.hello[sent..]) {
                        Ok(n) => sent += n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            return Ok((State::Hello(fd, sent), None));
                        }
                        Err(e) if sys::is_disconnect(&e) => {
                            return Err(NetError::Closed(self.target.to_string()));
                        }
                        Err(e) => return Err(NetError::io("send", e)),
                    }
                }
                tracing::debug!(peer = %self.target, "NET/Socket: connected");
                let comm = TcpSendComm::new(fd, self.target.to_string(), MAX_REQUESTS);
                (State::Done, Some(Box::new(comm)))
            }
            State::Done => {
                return Err(NetError::Other(
                    "connector already completed or failed".into(),
                ))
            }
        })
    }
}

impl Connector for TcpConnector {
    fn poll_connect(&mut self) -> NetResult<Option<Box<dyn SendComm>>> {
        // Run the state machine until it waits (connect -> greeting can
        // finish within one poll on a fast network).
        loop {
            let state = std::mem::replace(&mut self.state, State::Done);
            let before = std::mem::discriminant(&state);
            let (next, comm) = self.step(state)?;
            let progressed = std::mem::discriminant(&next) != before;
            self.state = next;
            if comm.is_some() {
                return Ok(comm);
            }
            if !progressed || matches!(self.state, State::Backoff(_)) {
                return Ok(None);
            }
        }
    }
}
