//! Connection setup: [`TcpListener`] (accepting side) and [`TcpConnector`]
//! (connecting side).
//!
//! A connection is `nsocks` data sockets (the listener's count, carried in
//! its handle), plus a control socket when `nsocks` ≥ 2 (see
//! [`crate::stripe`]). The connector opens them all at once, each with its own
//! connect / retry / greeting state machine, and yields the send comm once
//! every one has sent its greeting.
//!
//! The listener accepts every incoming TCP socket but only keeps the ones
//! that present the greeting of its handle (magic, version, nonce, socket
//! count, an index it does not hold yet; see [`crate::handle`]); once it
//! holds them all it turns them into a receive comm. Anything else — a
//! wrong nonce, garbage, a duplicate index, a socket closed early or one
//! that stays silent too long — is dropped with a warning. At most
//! [`HELLO_BYTES`] bytes are ever read from a socket before it is judged,
//! at most [`MAX_PENDING`] unjudged sockets beyond the connection's own
//! are held (the oldest is dropped to make room), and each is held at most
//! [`HELLO_TIMEOUT`].

use crate::comm::{SpliceSizes, TcpRecvComm, TcpSendComm};
use crate::handle::{TcpHandle, HANDLE_BYTES, HELLO_BYTES};
use crate::{sys, MAX_REQUESTS};
use nccl_net::{Connector, Listener, NetError, NetResult, RecvComm, SendComm};
use std::io;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

/// Most connections accepted per `accept` poll.
const MAX_ACCEPTS_PER_POLL: usize = 16;
/// Most accepted sockets waiting for their greeting, beyond the
/// connection's own sockets.
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
    /// A valid greeting for socket `.0`.
    Good(usize),
    Bad(&'static str),
}

/// The accepting side of one connection.
pub(crate) struct TcpListener {
    fd: OwnedFd,
    handle: [u8; HANDLE_BYTES],
    /// The greeting of socket 0 (byte 5, the index, varies).
    hello: [u8; HELLO_BYTES],
    buf_bytes: usize,
    nthreads: usize,
    pending: Vec<Pending>,
    /// The sockets judged good so far, by index.
    held: Vec<Option<(OwnedFd, String)>>,
    accepted: bool,
}

impl TcpListener {
    /// Binds to `ip` (port 0) and listens for a connection of `nsocks`
    /// data sockets, to be serviced by `nthreads` helper threads (see
    /// [`crate::lanes`]).
    pub(crate) fn bind(
        ip: std::net::IpAddr,
        buf_bytes: usize,
        nsocks: u8,
        nthreads: usize,
    ) -> NetResult<Self> {
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
            nthreads,
            pending: Vec::new(),
            held: (0..crate::stripe::total_sockets(usize::from(nsocks)))
                .map(|_| None)
                .collect(),
            accepted: false,
        })
    }

    /// Reads what is there of `p`'s greeting and judges it.
    fn judge(hello: &[u8; HELLO_BYTES], p: &mut Pending) -> Verdict {
        let total = crate::stripe::total_sockets(usize::from(hello[6]));
        while p.got < HELLO_BYTES {
            match sys::recv(&p.fd, &mut p.buf[p.got..]) {
                Ok(0) => return Verdict::Bad("closed before completing the greeting"),
                Ok(n) => {
                    let end = p.got + n;
                    let wrong = |j: usize| match j {
                        5 => usize::from(p.buf[j]) >= total,
                        _ => p.buf[j] != hello[j],
                    };
                    if let Some(j) = (p.got..end).find(|&j| wrong(j)) {
                        return Verdict::Bad(match j {
                            0..=4 | 7 => "not a greeting (garbage or other version)",
                            5 | 6 => "socket index or count does not match",
                            _ => "wrong nonce",
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
        Verdict::Good(usize::from(p.buf[5]))
    }

    /// Keeps a socket judged good; returns the receive comm once all are in.
    fn hold(&mut self, index: usize, p: Pending) -> NetResult<Option<Box<dyn RecvComm>>> {
        if self.held[index].is_some() {
            tracing::warn!(peer = %p.peer, index, "NET/Socket: dropping incoming connection: duplicate socket index");
            return Ok(None);
        }
        sys::set_nodelay(&p.fd).map_err(|e| NetError::io("setsockopt", e))?;
        sys::set_buffers(&p.fd, self.buf_bytes).map_err(|e| NetError::io("setsockopt", e))?;
        self.held[index] = Some((p.fd, p.peer));
        if self.held.iter().any(Option::is_none) {
            return Ok(None);
        }
        for other in self.pending.drain(..) {
            tracing::debug!(peer = %other.peer, "NET/Socket: dropping unjudged connection");
        }
        let mut peer = String::new();
        let mut fds = Vec::with_capacity(self.held.len());
        for (fd, p) in self.held.drain(..).flatten() {
            if fds.is_empty() {
                peer = p;
            }
            fds.push(fd);
        }
        self.accepted = true;
        tracing::debug!(%peer, nsocks = fds.len(), "NET/Socket: accepted connection");
        let comm = TcpRecvComm::new(fds, peer, MAX_REQUESTS, self.nthreads)
            .map_err(|e| NetError::io("start helper thread", e))?;
        Ok(Some(Box::new(comm)))
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
                    if self.pending.len() >= MAX_PENDING + self.held.len() {
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
                Verdict::Good(index) => {
                    let p = self.pending.remove(i);
                    if let Some(comm) = self.hold(index, p)? {
                        return Ok(Some(comm));
                    }
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
    /// Greeting sent.
    Ready(OwnedFd),
    /// Failed, or handed over to the comm.
    Gone,
}

/// One socket of a connection being set up.
struct Sock {
    index: u8,
    state: State,
    retries: u32,
}

/// The connecting side of one connection.
pub(crate) struct TcpConnector {
    target: SocketAddr,
    handle: TcpHandle,
    buf_bytes: usize,
    nthreads: usize,
    splice: SpliceSizes,
    socks: Vec<Sock>,
    finished: bool,
}

impl TcpConnector {
    /// Starts connecting the sockets of a connection (`handle.nsocks` data
    /// sockets, see [`crate::stripe::total_sockets`]) to
    /// the listener of `handle`; the comm will use `nthreads` helper
    /// threads and splice striped messages of `splice` sizes.
    pub(crate) fn start(
        handle: &TcpHandle,
        buf_bytes: usize,
        nthreads: usize,
        splice: SpliceSizes,
    ) -> NetResult<Self> {
        let mut c = TcpConnector {
            target: handle.addr,
            handle: *handle,
            buf_bytes,
            nthreads,
            splice,
            socks: (0..crate::stripe::total_sockets(usize::from(handle.nsocks)))
                .map(|index| Sock {
                    // total_sockets(64) = 65 fits a u8.
                    index: index as u8,
                    state: State::Gone,
                    retries: 0,
                })
                .collect(),
            finished: false,
        };
        for k in 0..c.socks.len() {
            let mut retries = c.socks[k].retries;
            c.socks[k].state = c.attempt(&mut retries)?;
            c.socks[k].retries = retries;
        }
        Ok(c)
    }

    fn attempt(&self, retries: &mut u32) -> NetResult<State> {
        let fd = sys::tcp_socket(&self.target).map_err(|e| NetError::io("socket", e))?;
        sys::set_nodelay(&fd).map_err(|e| NetError::io("setsockopt", e))?;
        sys::set_buffers(&fd, self.buf_bytes).map_err(|e| NetError::io("setsockopt", e))?;
        match sys::connect(&fd, &self.target) {
            Ok(()) => Ok(State::Hello(fd, 0)),
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(State::Connecting(fd)),
            Err(e) => self.retry_or_fail(retries, e),
        }
    }

    fn retry_or_fail(&self, retries: &mut u32, e: io::Error) -> NetResult<State> {
        let retryable = matches!(
            e.raw_os_error(),
            Some(libc::ECONNREFUSED) | Some(libc::ETIMEDOUT) | Some(libc::EAGAIN)
        );
        if retryable && *retries < MAX_RETRIES {
            *retries += 1;
            tracing::debug!(target_addr = %self.target, error = %e, retry = *retries, "NET/Socket: connect retry");
            Ok(State::Backoff(Instant::now() + RETRY_INTERVAL))
        } else {
            Err(NetError::Io {
                call: "connect",
                source: io::Error::new(e.kind(), format!("to {}: {e}", self.target)),
            })
        }
    }

    /// Advances one socket's state machine by one step.
    fn step(&self, sock: &mut Sock, state: State) -> NetResult<State> {
        Ok(match state {
            State::Backoff(until) if Instant::now() < until => State::Backoff(until),
            State::Backoff(_) => self.attempt(&mut sock.retries)?,
            State::Connecting(fd) => {
                if !sys::poll_writable(&fd).map_err(|e| NetError::io("poll", e))? {
                    State::Connecting(fd)
                } else {
                    match sys::take_error(&fd).map_err(|e| NetError::io("getsockopt", e))? {
                        None => State::Hello(fd, 0),
                        Some(e) => self.retry_or_fail(&mut sock.retries, e)?,
                    }
                }
            }
            State::Hello(fd, mut sent) => {
                let hello = self.handle.hello_for(sock.index);
                while sent < HELLO_BYTES {
                    match sys::send(&fd, &hello[sent..]) {
                        Ok(n) => sent += n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            return Ok(State::Hello(fd, sent));
                        }
                        Err(e) if sys::is_disconnect(&e) => {
                            return Err(NetError::Closed(self.target.to_string()));
                        }
                        Err(e) => return Err(NetError::io("send", e)),
                    }
                }
                State::Ready(fd)
            }
            s @ (State::Ready(_) | State::Gone) => s,
        })
    }

    /// Runs every socket's state machine until it waits.
    fn advance(&mut self) -> NetResult<bool> {
        let mut socks = std::mem::take(&mut self.socks);
        let mut r = Ok(true);
        for sock in &mut socks {
            // Connect -> greeting can finish within one poll on a fast network.
            loop {
                let state = std::mem::replace(&mut sock.state, State::Gone);
                let before = std::mem::discriminant(&state);
                match self.step(sock, state) {
                    Ok(next) => sock.state = next,
                    Err(e) => {
                        r = Err(e);
                        break;
                    }
                }
                let progressed = std::mem::discriminant(&sock.state) != before;
                if !progressed || matches!(sock.state, State::Backoff(_) | State::Ready(_)) {
                    break;
                }
            }
            if r.is_err() {
                break;
            }
            if !matches!(sock.state, State::Ready(_)) {
                r = Ok(false);
            }
        }
        self.socks = socks;
        r
    }
}

impl Connector for TcpConnector {
    fn poll_connect(&mut self) -> NetResult<Option<Box<dyn SendComm>>> {
        if self.finished {
            return Err(NetError::Other(
                "connector already completed or failed".into(),
            ));
        }
        let all_ready = match self.advance() {
            Ok(all) => all,
            Err(e) => {
                self.finished = true;
                self.socks.clear();
                return Err(e);
            }
        };
        if !all_ready {
            return Ok(None);
        }
        self.finished = true;
        let fds: Vec<OwnedFd> = self
            .socks
            .drain(..)
            .filter_map(|s| match s.state {
                State::Ready(fd) => Some(fd),
                _ => None,
            })
            .collect();
        tracing::debug!(peer = %self.target, nsocks = fds.len(), "NET/Socket: connected");
        let comm = TcpSendComm::new(
            fds,
            self.target.to_string(),
            MAX_REQUESTS,
            self.nthreads,
            self.splice,
        )
        .map_err(|e| NetError::io("start helper thread", e))?;
        Ok(Some(Box::new(comm)))
    }
}
