//! The RAS thread of a process: heartbeats to and from every peer process,
//! and the query port. One thread, non-blocking sockets, a short sleep
//! between rounds; a client query is answered on a thread of its own.
//!
//! Telemetry is pulled on query: the client's thread posts a query id, the
//! RAS thread sends a telemetry query to every peer process on its
//! heartbeat connection, each peer's RAS thread answers on its own
//! connection back, and the client's thread waits for the answers of the
//! processes heard from until [`Timing::telemetry`]; the others are
//! reported as not answering.

use super::report::{JobView, PeerStatus, PeerView, Report};
use super::wire::{
    framed, CommTelemetry, Frame, ProcState, TelemetryQuery, TelemetryReply, MAX_FRAME,
};
use super::Timing;
use crate::config::Config;
use crate::observe::progress::snapshot_all;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long the thread sleeps between rounds.
const ROUND: Duration = Duration::from_millis(10);
/// How often a process that does not serve the query port tries to bind it
/// again (the one that did may have exited).
const REBIND_EVERY: Duration = Duration::from_secs(1);
/// Link errors kept (the most recent).
const LINK_ERRORS: usize = 16;
/// Deadline of a client's commands.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// A peer process as this one knows it.
struct Peer {
    last: Option<ProcState>,
    heard: Option<Instant>,
    added: Instant,
    /// Its connection to us closed: `true` while it still had communicators.
    closed: Option<bool>,
}

/// What the thread and the query handlers share.
pub(crate) struct Shared {
    addr: SocketAddr,
    host: String,
    timing: Timing,
    peers: Mutex<BTreeMap<SocketAddr, Peer>>,
    link_errors: Mutex<Vec<String>>,
    /// Telemetry query ids for the RAS thread to send.
    queries: Mutex<Vec<u64>>,
    /// The last telemetry reply of each peer process.
    replies: Mutex<BTreeMap<SocketAddr, TelemetryReply>>,
    next_query: AtomicU64,
}

/// The process's RAS service.
pub(crate) struct Service(Arc<Shared>);

impl Service {
    /// The address peers reach this process's RAS thread on.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.0.addr
    }

    /// Adds the RAS addresses of a new communicator's processes.
    pub(crate) fn add_peers(&self, addrs: &[SocketAddr]) {
        let mut peers = lock(&self.0.peers);
        for a in addrs {
            if *a != self.0.addr {
                peers.entry(*a).or_insert_with(|| Peer {
                    last: None,
                    heard: None,
                    added: Instant::now(),
                    closed: None,
                });
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The process's service, started on first call (listening for peers on
/// `ip`); `None` if it could not start (logged once).
pub(crate) fn start(ip: IpAddr, config: &Config) -> Option<Service> {
    static SVC: OnceLock<Option<Arc<Shared>>> = OnceLock::new();
    SVC.get_or_init(|| match spawn(ip, config) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!("RAS: not started: {e}");
            None
        }
    })
    .clone()
    .map(Service)
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

fn spawn(ip: IpAddr, config: &Config) -> std::io::Result<Arc<Shared>> {
    // Resolved here, once: name lookups on the RAS thread would keep
    // resolver state in a thread that never exits.
    let client_addr: Vec<SocketAddr> = config.ras_addr.to_socket_addrs()?.collect();
    let listener = TcpListener::bind((ip, 0))?;
    listener.set_nonblocking(true)?;
    let shared = Arc::new(Shared {
        addr: listener.local_addr()?,
        host: config.host_id.clone().unwrap_or_else(host_name),
        timing: Timing::new(config.ras_timeout_factor),
        peers: Mutex::new(BTreeMap::new()),
        link_errors: Mutex::new(Vec::new()),
        queries: Mutex::new(Vec::new()),
        replies: Mutex::new(BTreeMap::new()),
        next_query: AtomicU64::new(0),
    });
    let mut thread = Thread {
        shared: shared.clone(),
        listener,
        inbound: Vec::new(),
        out: BTreeMap::new(),
        client_addr,
        client: None,
        last_bind: None,
        last_beat: None,
    };
    std::thread::Builder::new()
        .name("nccl-ras".into())
        .spawn(move || thread.run())?;
    tracing::debug!(addr = %shared.addr, "RAS thread started");
    Ok(shared)
}

impl Shared {
    fn link_error(&self, e: String) {
        tracing::debug!("RAS: {e}");
        let mut v = lock(&self.link_errors);
        if v.last() != Some(&e) {
            v.push(e);
        }
        let n = v.len();
        if n > LINK_ERRORS {
            v.drain(..n - LINK_ERRORS);
        }
    }

    /// This process's state now.
    fn me(&self) -> ProcState {
        ProcState {
            addr: self.addr.to_string(),
            pid: std::process::id(),
            host: self.host.clone(),
            comms: snapshot_all(),
            link_errors: lock(&self.link_errors).clone(),
        }
    }

    /// This process's telemetry now (link counters sampled).
    fn my_telemetry() -> Vec<CommTelemetry> {
        crate::observe::telemetry::snapshot_all()
            .iter()
            .map(CommTelemetry::of)
            .collect()
    }

    /// Asks every peer process heard from lately (within three heartbeat
    /// intervals: one silent longer is likely stopped, and would only make
    /// the query wait) for its telemetry, and waits for their answers
    /// until the telemetry deadline: the answers, by process.
    fn gather_telemetry(&self) -> BTreeMap<SocketAddr, Vec<CommTelemetry>> {
        let id = self.next_query.fetch_add(1, Ordering::Relaxed) + 1;
        let now = Instant::now();
        let fresh = self.timing.heartbeat * 3;
        let asked: Vec<SocketAddr> = lock(&self.peers)
            .iter()
            .filter(|(_, p)| p.closed.is_none() && p.heard.is_some_and(|h| now - h < fresh))
            .map(|(a, _)| *a)
            .collect();
        let mut got = BTreeMap::new();
        if asked.is_empty() {
            return got;
        }
        lock(&self.queries).push(id);
        let deadline = now + self.timing.telemetry;
        loop {
            {
                // A newer query's answer is as good.
                let replies = lock(&self.replies);
                got = asked
                    .iter()
                    .filter_map(|a| {
                        let r = replies.get(a).filter(|r| r.id >= id)?;
                        Some((*a, r.comms.clone()))
                    })
                    .collect();
            }
            if got.len() == asked.len() || Instant::now() >= deadline {
                return got;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// What a query is answered from, with telemetry.
    fn view_with_telemetry(&self) -> JobView {
        let tel = self.gather_telemetry();
        let mut v = self.view();
        v.me_telemetry = Some(Self::my_telemetry());
        for p in &mut v.peers {
            if let Ok(a) = p.state.addr.parse::<SocketAddr>() {
                p.telemetry = tel.get(&a).cloned();
            }
        }
        v
    }

    /// What a query is answered from.
    fn view(&self) -> JobView {
        let now = Instant::now();
        let t = self.timing;
        let peers = lock(&self.peers)
            .iter()
            .map(|(addr, p)| {
                let silent = now - p.heard.unwrap_or(p.added);
                let status = match (p.closed, &p.last) {
                    (Some(true), _) => PeerStatus::Dead,
                    (Some(false), _) => PeerStatus::Exited,
                    (None, None) => PeerStatus::NeverHeard,
                    _ if silent >= t.dead => PeerStatus::Dead,
                    _ if silent >= t.unresponsive => PeerStatus::Unresponsive,
                    _ => PeerStatus::Ok,
                };
                PeerView {
                    state: p.last.clone().unwrap_or_else(|| ProcState {
                        addr: addr.to_string(),
                        pid: 0,
                        host: addr.ip().to_string(),
                        comms: Vec::new(),
                        link_errors: Vec::new(),
                    }),
                    status,
                    silent_ms: silent.as_millis() as u64,
                    telemetry: None,
                }
            })
            .collect();
        JobView {
            me: self.me(),
            peers,
            stall_ms: t.stall.as_millis() as u64,
            me_telemetry: None,
        }
    }
}

struct Inbound {
    stream: TcpStream,
    buf: Vec<u8>,
    from: Option<SocketAddr>,
}

struct Outbound {
    stream: TcpStream,
    pending: Vec<u8>,
}

struct Thread {
    shared: Arc<Shared>,
    listener: TcpListener,
    inbound: Vec<Inbound>,
    out: BTreeMap<SocketAddr, Outbound>,
    client_addr: Vec<SocketAddr>,
    client: Option<TcpListener>,
    last_bind: Option<Instant>,
    last_beat: Option<Instant>,
}

impl Thread {
    fn run(&mut self) {
        loop {
            self.accept_peers();
            let asked = self.read_peers();
            self.answer(asked);
            self.send_queries();
            let now = Instant::now();
            if self
                .last_beat
                .is_none_or(|t| now - t >= self.shared.timing.heartbeat)
            {
                self.last_beat = Some(now);
                self.heartbeat();
            }
            self.flush();
            self.serve_clients(now);
            std::thread::sleep(ROUND);
        }
    }

    fn accept_peers(&mut self) {
        while let Ok((stream, _)) = self.listener.accept() {
            if stream.set_nonblocking(true).is_ok() {
                self.inbound.push(Inbound {
                    stream,
                    buf: Vec::new(),
                    from: None,
                });
            }
        }
    }

    /// Opens the connection to peer `a` unless it is open; false (and a
    /// link error recorded) when that fails.
    fn connect(&mut self, a: SocketAddr) -> bool {
        if self.out.contains_key(&a) {
            return true;
        }
        let wait = self.shared.timing.heartbeat.min(Duration::from_millis(200));
        match TcpStream::connect_timeout(&a, wait) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                if s.set_nonblocking(true).is_ok() {
                    self.out.insert(
                        a,
                        Outbound {
                            stream: s,
                            pending: Vec::new(),
                        },
                    );
                }
                true
            }
            Err(e) => {
                self.shared
                    .link_error(format!("connecting to peer {a}: {e}"));
                false
            }
        }
    }

    /// Queues `frame` for peer `a` (connecting first if need be), unless
    /// that peer's backlog is already a frame's worth (it is not reading).
    fn queue(&mut self, a: SocketAddr, frame: &[u8]) {
        if !self.connect(a) {
            return;
        }
        if let Some(o) = self.out.get_mut(&a) {
            if o.pending.len() <= MAX_FRAME {
                o.pending.extend_from_slice(frame);
            }
        }
    }

    /// Sends the telemetry queries the client threads posted.
    fn send_queries(&mut self) {
        let ids: Vec<u64> = std::mem::take(&mut *lock(&self.shared.queries));
        let Some(&id) = ids.iter().max() else {
            return;
        };
        let frame = framed(
            &TelemetryQuery {
                id,
                from: self.shared.addr.to_string(),
            }
            .encode(),
        );
        let targets: Vec<SocketAddr> = lock(&self.shared.peers)
            .iter()
            .filter(|(_, p)| p.closed.is_none() && p.heard.is_some())
            .map(|(a, _)| *a)
            .collect();
        for a in targets {
            self.queue(a, &frame);
        }
    }

    /// Answers telemetry queries (asker, id) with this process's telemetry.
    fn answer(&mut self, asked: Vec<(SocketAddr, u64)>) {
        if asked.is_empty() {
            return;
        }
        let comms = Shared::my_telemetry();
        for (a, id) in asked {
            let body = TelemetryReply {
                id,
                addr: self.shared.addr.to_string(),
                comms: comms.clone(),
                truncated: false,
            }
            .encode();
            self.queue(a, &framed(&body));
        }
    }

    /// Reads the peers' frames: heartbeats and telemetry replies are
    /// stored; the telemetry queries are returned (asker, id).
    fn read_peers(&mut self) -> Vec<(SocketAddr, u64)> {
        let shared = &self.shared;
        let mut asked = Vec::new();
        self.inbound.retain_mut(|c| {
            let mut chunk = [0u8; 16 << 10];
            let closed = loop {
                match c.stream.read(&mut chunk) {
                    Ok(0) => break Some("closed".to_string()),
                    Ok(n) => c.buf.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break None,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => break Some(e.to_string()),
                }
            };
            let mut bad = None;
            loop {
                if c.buf.len() < 4 {
                    break;
                }
                let n = u32::from_le_bytes([c.buf[0], c.buf[1], c.buf[2], c.buf[3]]) as usize;
                if n > MAX_FRAME {
                    bad = Some(format!("frame of {n} bytes"));
                    break;
                }
                if c.buf.len() < 4 + n {
                    break;
                }
                match Frame::decode(&c.buf[4..4 + n]) {
                    Ok(Frame::Query(q)) => match q.from.parse::<SocketAddr>() {
                        Ok(a) => asked.push((a, q.id)),
                        Err(_) => bad = Some(format!("telemetry query from {:?}", q.from)),
                    },
                    Ok(Frame::Reply(r)) => match r.addr.parse::<SocketAddr>() {
                        Ok(a) => {
                            lock(&shared.replies).insert(a, r);
                        }
                        Err(_) => bad = Some(format!("telemetry reply from {:?}", r.addr)),
                    },
                    Ok(Frame::Heartbeat(st)) => match st.addr.parse::<SocketAddr>() {
                        Ok(a) => {
                            c.from = Some(a);
                            let mut peers = lock(&shared.peers);
                            let p = peers.entry(a).or_insert_with(|| Peer {
                                last: None,
                                heard: None,
                                added: Instant::now(),
                                closed: None,
                            });
                            p.last = Some(st);
                            p.heard = Some(Instant::now());
                            p.closed = None;
                        }
                        Err(_) => bad = Some(format!("heartbeat from {:?}", st.addr)),
                    },
                    Err(e) => bad = Some(e),
                }
                c.buf.drain(..4 + n);
                if bad.is_some() {
                    break;
                }
            }
            let peer = c.stream.peer_addr().map_or("?".into(), |a| a.to_string());
            if let Some(e) = &bad {
                shared.link_error(format!("from {peer}: malformed {e}; connection dropped"));
            }
            match (closed, bad) {
                (None, None) => true,
                (why, _) => {
                    if let Some(a) = c.from {
                        let mut peers = lock(&shared.peers);
                        if let Some(p) = peers.get_mut(&a) {
                            let had_comms = p.last.as_ref().is_some_and(|s| !s.comms.is_empty());
                            p.closed = Some(had_comms);
                            if had_comms {
                                drop(peers);
                                let why = why.unwrap_or_else(|| "dropped".into());
                                shared.link_error(format!(
                                    "RAS connection from {a} {why} while it had communicators"
                                ));
                            }
                        }
                    }
                    false
                }
            }
        });
        asked
    }

    fn heartbeat(&mut self) {
        let frame = framed(&self.shared.me().encode());
        let targets: Vec<SocketAddr> = lock(&self.shared.peers)
            .iter()
            .filter(|(_, p)| p.closed.is_none())
            .map(|(a, _)| *a)
            .collect();
        for a in targets {
            if !self.connect(a) {
                continue;
            }
            if let Some(o) = self.out.get_mut(&a) {
                // A peer that does not read (stopped) gets no backlog: its
                // next heartbeat replaces this one.
                if o.pending.is_empty() {
                    o.pending.extend_from_slice(&frame);
                }
            }
        }
    }

    fn flush(&mut self) {
        let shared = &self.shared;
        self.out.retain(|a, o| {
            while !o.pending.is_empty() {
                match o.stream.write(&o.pending) {
                    Ok(n) => {
                        o.pending.drain(..n);
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => {
                        shared.link_error(format!("sending to peer {a}: {e}"));
                        return false;
                    }
                }
            }
            true
        });
    }

    fn serve_clients(&mut self, now: Instant) {
        if self.client.is_none() && self.last_bind.is_none_or(|t| now - t >= REBIND_EVERY) {
            self.last_bind = Some(now);
            match TcpListener::bind(&self.client_addr[..]) {
                Ok(l) if l.set_nonblocking(true).is_ok() => {
                    tracing::debug!("RAS: serving queries on {:?}", self.client_addr);
                    self.client = Some(l);
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::trace!("RAS: query port {:?}: {e}", self.client_addr)
                }
            }
        }
        let Some(l) = &self.client else { return };
        while let Ok((stream, _)) = l.accept() {
            let shared = self.shared.clone();
            let _ = std::thread::Builder::new()
                .name("nccl-ras-client".into())
                .spawn(move || {
                    if let Err(e) = handle_client(stream, &shared) {
                        tracing::debug!("RAS client: {e}");
                    }
                });
        }
    }
}

/// Answers one client: NCCL's line protocol (commands case-insensitive).
fn handle_client(stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut w = stream.try_clone()?;
    let mut r = BufReader::new(stream).take(64 << 10);
    let mut json = false;
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let cmd = line.trim().to_ascii_uppercase();
        let words: Vec<&str> = cmd.split_whitespace().collect();
        match words.as_slice() {
            [] => {}
            ["CLIENT", "PROTOCOL", ..] => {
                writeln!(w, "SERVER PROTOCOL {}", super::CLIENT_PROTOCOL)?
            }
            ["TIMEOUT", _] => writeln!(w, "OK")?,
            ["SET", "FORMAT", "JSON"] => {
                json = true;
                writeln!(w, "OK")?
            }
            ["SET", "FORMAT", "TEXT"] => {
                json = false;
                writeln!(w, "OK")?
            }
            ["STATUS"] | ["VERBOSE", "STATUS"] => {
                let verbose = words.len() == 2;
                let report = Report::build(&shared.view_with_telemetry());
                let out = match json {
                    true => report.to_json(),
                    false => report.to_text(verbose),
                };
                w.write_all(out.as_bytes())?;
                return Ok(());
            }
            _ => writeln!(w, "ERROR: unknown command {:?}", line.trim())?,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Reads frames from `s` until `want` accepts one (5 s at most).
    fn read_until(s: &mut TcpStream, want: impl Fn(&Frame) -> bool) -> Result<Frame, String> {
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        while Instant::now() < deadline {
            while buf.len() >= 4 {
                let n = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
                if buf.len() < 4 + n {
                    break;
                }
                let f = Frame::decode(&buf[4..4 + n])?;
                buf.drain(..4 + n);
                if want(&f) {
                    return Ok(f);
                }
            }
            match s.read(&mut chunk) {
                Ok(0) => return Err("closed".into()),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        Err("no such frame before the deadline".into())
    }

    /// The process's RAS thread, started once, answering on a port of its
    /// own; a fake peer process (`me`, listening) that introduced itself
    /// with a heartbeat on `to`.
    #[test]
    fn a_telemetry_query_is_answered_and_a_malformed_message_drops_the_connection() {
        let config = Config {
            ras_addr: "127.0.0.1:0".into(),
            ..Config::default()
        };
        let svc = start("127.0.0.1".parse().unwrap(), &config).expect("RAS thread");
        let me = TcpListener::bind("127.0.0.1:0").unwrap();
        let me_addr = me.local_addr().unwrap();
        svc.add_peers(&[me_addr]);
        let mut to = TcpStream::connect(svc.addr()).unwrap();
        let hello = ProcState {
            addr: me_addr.to_string(),
            pid: 1,
            host: "fake".into(),
            comms: Vec::new(),
            link_errors: Vec::new(),
        };
        to.write_all(&framed(&hello.encode())).unwrap();
        let query = TelemetryQuery {
            id: 4242,
            from: me_addr.to_string(),
        };
        to.write_all(&framed(&query.encode())).unwrap();
        // The service connects back (heartbeats) and answers there.
        me.set_nonblocking(false).unwrap();
        let (mut back, _) = me.accept().unwrap();
        let reply = read_until(&mut back, |f| matches!(f, Frame::Reply(_))).unwrap();
        match reply {
            Frame::Reply(r) => {
                assert_eq!(r.id, 4242);
                assert_eq!(r.addr, svc.addr().to_string());
                assert!(!r.truncated);
            }
            f => panic!("{f:?}"),
        }
        // A frame of an unknown kind: the service drops the connection and
        // records why.
        to.write_all(&framed(b"RTX1junk")).unwrap();
        to.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 1];
        assert_eq!(to.read(&mut b).unwrap_or(0), 0, "connection kept");
        let errors = lock(&svc.0.link_errors).clone();
        assert!(
            errors
                .iter()
                .any(|e| e.contains("malformed unknown RAS message [52, 54, 58, 31]")),
            "{errors:?}"
        );
    }
}
