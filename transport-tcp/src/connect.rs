//! Connection setup: [`TcpListener`] (accepting side) and [`TcpConnector`]
//! (connecting side).
//!
//! A connection is `n` data sockets (the listener's count, carried in
//! its handle, rounded up to a multiple of the rails used; see
//! [`crate::rails`]), plus a control socket when `n` ≥ 2 (see
//! [`crate::stripe`]). The connector opens them all at once, each from its
//! local rail's address to the listener's address on the peer rail, each
//! with its own connect / retry / greeting state machine, and yields the
//! send comm once every one has sent its greeting.
//!
//! The listener listens on every local rail and accepts every incoming TCP
//! socket but only keeps the ones that present the greeting of its handle
//! (magic, version, nonce, a socket and rail count that agree with its
//! `nsocks` and with the connection's other sockets, an index it does not
//! hold yet; see [`crate::handle`]); once it
//! holds them all it turns them into a receive comm. Anything else — a
//! wrong nonce, garbage, a duplicate index, a socket closed early or one
//! that stays silent too long — is dropped with a warning. At most
//! [`HELLO_BYTES`] bytes are ever read from a socket before it is judged,
//! at most [`MAX_PENDING`] unjudged sockets beyond the connection's own
//! are held (the oldest is dropped to make room), and each is held at most
//! [`HELLO_TIMEOUT`].

use crate::comm::{SpliceSizes, TcpRecvComm, TcpSendComm};
use crate::handle::{TcpHandle, HELLO_BYTES};
use crate::rails::{connection_nsocks, connection_rails, socket_rails};
use crate::{sys, CrossNic, MAX_RAILS, MAX_REQUESTS};
use nccl_net::{Connector, Listener, NetError, NetResult, RecvComm, SendComm};
use std::io;
use std::net::{IpAddr, SocketAddr};
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

/// The socket and rail counts a greeting may present to a listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// Any consistent with the listener's `nsocks` (no socket held yet).
    Open(u8),
    /// Exactly these (`n`, `r`): those of the sockets already held.
    Fixed(u8, u8),
}

impl Shape {
    /// Whether greeting bytes 5..8 (`index`, `n`, `r`) fit this shape.
    pub(crate) fn admits(self, index: u8, n: u8, r: u8) -> bool {
        let fits = match self {
            Shape::Open(nsocks) => {
                (1..=MAX_RAILS).contains(&usize::from(r))
                    && usize::from(n) == connection_nsocks(usize::from(nsocks), usize::from(r))
            }
            Shape::Fixed(n0, r0) => (n, r) == (n0, r0),
        };
        fits && usize::from(index) < crate::stripe::total_sockets(usize::from(n))
    }
}

/// The accepting side of one connection.
pub(crate) struct TcpListener {
    /// One listening socket per rail.
    fds: Vec<OwnedFd>,
    handle: Vec<u8>,
    /// The greeting of socket 0 (bytes 5..8, index and counts, vary).
    hello: [u8; HELLO_BYTES],
    buf_bytes: usize,
    nthreads: usize,
    pending: Vec<Pending>,
    /// The counts presented by the sockets held, once there is one.
    shape: Shape,
    /// The sockets judged good so far, by index (empty until the first).
    held: Vec<Option<(OwnedFd, String)>>,
    /// Most sockets a connection to this listener may have.
    max_total: usize,
    accepted: bool,
}

impl TcpListener {
    /// Binds to each of `ips` (one per rail, port 0) and listens for a
    /// connection of `nsocks` data sockets (rounded up by the connector to
    /// a multiple of the rails it uses), to be serviced by `nthreads`
    /// helper threads (see [`crate::lanes`]).
    pub(crate) fn bind(
        ips: &[IpAddr],
        buf_bytes: usize,
        nsocks: u8,
        nthreads: usize,
    ) -> NetResult<Self> {
        let mut fds = Vec::with_capacity(ips.len());
        let mut locals = Vec::with_capacity(ips.len());
        for &ip in ips.iter().take(MAX_RAILS) {
            let addr = SocketAddr::new(ip, 0);
            let fd = sys::tcp_socket(&addr).map_err(|e| NetError::io("socket", e))?;
            // Buffer sizes must be set before listen() to take effect on the
            // window scale negotiated for accepted connections.
            sys::set_buffers(&fd, buf_bytes).map_err(|e| NetError::io("setsockopt", e))?;
            sys::bind(&fd, &addr).map_err(|e| NetError::io("bind", e))?;
            sys::listen(&fd, libc::SOMAXCONN).map_err(|e| NetError::io("listen", e))?;
            locals.push(sys::local_addr(&fd).map_err(|e| NetError::io("getsockname", e))?);
            fds.push(fd);
        }
        let Some((&first, more)) = locals.split_first() else {
            return Err(NetError::Other(
                "NET/Socket: no local address to listen on".into(),
            ));
        };
        let nonce = sys::random_bytes::<8>().map_err(|e| NetError::io("read /dev/urandom", e))?;
        let h = TcpHandle {
            addr: first,
            more_rails: more.to_vec(),
            nonce,
            nsocks,
        };
        tracing::debug!(?locals, "NET/Socket: listening");
        Ok(TcpListener {
            fds,
            handle: h.encode(),
            hello: h.hello(),
            buf_bytes,
            nthreads,
            pending: Vec::new(),
            shape: Shape::Open(nsocks),
            held: Vec::new(),
            max_total: (1..=MAX_RAILS)
                .map(|r| crate::stripe::total_sockets(connection_nsocks(usize::from(nsocks), r)))
                .max()
                .unwrap_or(1),
            accepted: false,
        })
    }

    /// Reads what is there of `p`'s greeting and judges it against the
    /// magic, version and nonce of `hello` and against `shape`.
    fn judge(hello: &[u8; HELLO_BYTES], shape: Shape, p: &mut Pending) -> Verdict {
        while p.got < HELLO_BYTES {
            match sys::recv(&p.fd, &mut p.buf[p.got..]) {
                Ok(0) => return Verdict::Bad("closed before completing the greeting"),
                Ok(n) => {
                    let end = p.got + n;
                    // Bytes 5 and 6 are judged with byte 7, which follows
                    // them on the stream.
                    let wrong = |j: usize| match j {
                        5 | 6 => false,
                        7 => !shape.admits(p.buf[5], p.buf[6], p.buf[7]),
                        _ => p.buf[j] != hello[j],
                    };
                    if let Some(j) = (p.got..end).find(|&j| wrong(j)) {
                        return Verdict::Bad(match j {
                            0..=4 => "not a greeting (garbage or other version)",
                            7 => "socket index, socket count or rail count does not match",
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
        if let Shape::Open(_) = self.shape {
            let (n, r) = (p.buf[6], p.buf[7]);
            self.shape = Shape::Fixed(n, r);
            self.held = (0..crate::stripe::total_sockets(usize::from(n)))
                .map(|_| None)
                .collect();
            if r > 1 {
                tracing::debug!(
                    nsocks = n,
                    rails = r,
                    "NET/Socket: incoming connection over several rails"
                );
            }
        }
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
        for lfd in &self.fds {
            for _ in 0..MAX_ACCEPTS_PER_POLL {
                match sys::accept(lfd) {
                    Ok((fd, peer)) => {
                        let held = self.held.iter().filter(|h| h.is_some()).count();
                        if self.pending.len() + held >= MAX_PENDING + self.max_total {
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
        }
        let mut i = 0;
        while i < self.pending.len() {
            match Self::judge(&self.hello, self.shape, &mut self.pending[i]) {
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
    /// The peer's listening address on this socket's rail.
    target: SocketAddr,
    /// The local rail's address to leave from (`None`: the kernel picks).
    local: Option<IpAddr>,
    state: State,
    retries: u32,
}

/// The connecting side of one connection.
pub(crate) struct TcpConnector {
    /// The peer's rail-0 address (the control socket's), for messages.
    target: SocketAddr,
    handle: TcpHandle,
    /// Data sockets and rails of this connection, as in the greeting.
    nsocks: u8,
    rails: u8,
    buf_bytes: usize,
    nthreads: usize,
    splice: SpliceSizes,
    socks: Vec<Sock>,
    finished: bool,
}

impl TcpConnector {
    /// Starts connecting the sockets of a connection to the listener of
    /// `handle` from the local rails `local_ips` (rail 0 first), spread
    /// over the rails per [`crate::rails`] under `cross`; the comm will use
    /// `nthreads` helper threads and splice striped messages of `splice`
    /// sizes. With one local rail, sockets are not bound before connecting
    /// (the kernel picks the source address, as for any single-NIC host).
    pub(crate) fn start(
        handle: &TcpHandle,
        local_ips: &[IpAddr],
        cross: CrossNic,
        buf_bytes: usize,
        nthreads: usize,
        splice: SpliceSizes,
    ) -> NetResult<Self> {
        let peer = handle.rails();
        let local: Vec<IpAddr> = local_ips
            .iter()
            .copied()
            .filter(|ip| ip.is_ipv4() == handle.addr.is_ipv4())
            .take(MAX_RAILS)
            .collect();
        let local_rails = local.len().max(1);
        let rails = connection_rails(local_rails, peer.len(), cross);
        let nsocks = connection_nsocks(usize::from(handle.nsocks), rails);
        if local_ips.len() > 1 && local_rails != peer.len() {
            tracing::info!(
                local = local_rails,
                peer = peer.len(),
                used = rails,
                ?cross,
                "NET/Socket: the peer has another number of rails"
            );
        }
        let bind = local_ips.len() > 1 && !local.is_empty();
        let mut socks: Vec<Sock> = (0..crate::stripe::total_sockets(nsocks))
            .map(|index| {
                let (l, p) = socket_rails(index, nsocks, rails, local_rails, peer.len());
                Sock {
                    // total_sockets(64) = 65 fits a u8.
                    index: index as u8,
                    target: peer[p],
                    local: bind.then(|| local[l]),
                    state: State::Gone,
                    retries: 0,
                }
            })
            .collect();
        let mut c = TcpConnector {
            target: handle.addr,
            handle: handle.clone(),
            // nsocks <= MAX_SOCKS (64), rails <= MAX_RAILS (5).
            nsocks: nsocks as u8,
            rails: rails as u8,
            buf_bytes,
            nthreads,
            splice,
            socks: Vec::new(),
            finished: false,
        };
        for sock in &mut socks {
            sock.state = c.attempt(sock)?;
        }
        c.socks = socks;
        Ok(c)
    }

    fn attempt(&self, sock: &mut Sock) -> NetResult<State> {
        let fd = sys::tcp_socket(&sock.target).map_err(|e| NetError::io("socket", e))?;
        sys::set_nodelay(&fd).map_err(|e| NetError::io("setsockopt", e))?;
        sys::set_buffers(&fd, self.buf_bytes).map_err(|e| NetError::io("setsockopt", e))?;
        if let Some(ip) = sock.local {
            // Leaving from the rail's own address makes the kernel route the
            // socket out of that NIC.
            sys::bind(&fd, &SocketAddr::new(ip, 0)).map_err(|e| NetError::Io {
                call: "bind",
                source: io::Error::new(e.kind(), format!("to local rail address {ip}: {e}")),
            })?;
        }
        match sys::connect(&fd, &sock.target) {
            Ok(()) => Ok(State::Hello(fd, 0)),
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(State::Connecting(fd)),
            Err(e) => Self::retry_or_fail(sock, e),
        }
    }

    fn retry_or_fail(sock: &mut Sock, e: io::Error) -> NetResult<State> {
        let retryable = matches!(
            e.raw_os_error(),
            Some(libc::ECONNREFUSED) | Some(libc::ETIMEDOUT) | Some(libc::EAGAIN)
        );
        if retryable && sock.retries < MAX_RETRIES {
            sock.retries += 1;
            tracing::debug!(target_addr = %sock.target, error = %e, retry = sock.retries, "NET/Socket: connect retry");
            Ok(State::Backoff(Instant::now() + RETRY_INTERVAL))
        } else {
            let from = sock
                .local
                .map(|ip| format!(" from {ip}"))
                .unwrap_or_default();
            Err(NetError::Io {
                call: "connect",
                source: io::Error::new(e.kind(), format!("to {}{from}: {e}", sock.target)),
            })
        }
    }

    /// Advances one socket's state machine by one step.
    fn step(&self, sock: &mut Sock, state: State) -> NetResult<State> {
        Ok(match state {
            State::Backoff(until) if Instant::now() < until => State::Backoff(until),
            State::Backoff(_) => self.attempt(sock)?,
            State::Connecting(fd) => {
                if !sys::poll_writable(&fd).map_err(|e| NetError::io("poll", e))? {
                    State::Connecting(fd)
                } else {
                    match sys::take_error(&fd).map_err(|e| NetError::io("getsockopt", e))? {
                        None => State::Hello(fd, 0),
                        Some(e) => Self::retry_or_fail(sock, e)?,
                    }
                }
            }
            State::Hello(fd, mut sent) => {
                let hello = self.handle.hello_with(sock.index, self.nsocks, self.rails);
                while sent < HELLO_BYTES {
                    match sys::send(&fd, &hello[sent..]) {
                        Ok(n) => sent += n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            return Ok(State::Hello(fd, sent));
                        }
                        Err(e) if sys::is_disconnect(&e) => {
                            return Err(NetError::Closed(sock.target.to_string()));
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
        tracing::debug!(peer = %self.target, nsocks = fds.len(), rails = self.rails, "NET/Socket: connected");
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

#[cfg(test)]
mod tests {
    use super::Shape;

    #[test]
    fn greeting_shapes() {
        // A listener asking for 3 data sockets: (index, n, r) -> admitted?
        let open = Shape::Open(3);
        let table = [
            ((0, 3, 1), true),
            ((3, 3, 1), true),
            ((4, 3, 1), false),
            ((0, 4, 2), true),
            ((4, 4, 2), true),
            ((5, 4, 2), false),
            ((0, 3, 2), false),
            ((0, 3, 3), true),
            ((0, 4, 4), true),
            ((0, 5, 5), true),
            ((0, 6, 6), false),
            ((0, 3, 0), false),
        ];
        for ((i, n, r), want) in table {
            assert_eq!(open.admits(i, n, r), want, "{i} {n} {r}");
        }
        // One socket asked for: one rail keeps one socket, two make two
        // data sockets and a control socket.
        assert!(Shape::Open(1).admits(0, 1, 1));
        assert!(!Shape::Open(1).admits(1, 1, 1));
        assert!(Shape::Open(1).admits(2, 2, 2));
        // Once a socket is held, only its counts.
        let fixed = Shape::Fixed(4, 2);
        assert!(fixed.admits(1, 4, 2));
        assert!(!fixed.admits(1, 3, 1));
        assert!(!fixed.admits(1, 4, 4));
    }
}
