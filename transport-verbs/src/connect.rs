//! Connection setup: [`VerbsListener`] (receiving side) and
//! [`VerbsConnector`] (sending side), as non-blocking state machines.
//!
//! The trait hands one handle from listener to connector, but an RC
//! connection needs each side's QP numbers. As NCCL does, the handle names a
//! small TCP side socket, and the rest travels over it:
//!
//! ```text
//!  connector (sender)                          listener (receiver)
//!  QPs RESET→INIT, FIFO registered             (listening on the side socket)
//!  connect ─────────────────────────────────▶ accept
//!  greeting + endpoint (QPNs, PSN, GID/LID,
//!  MTU, FIFO addr+rkey) ────────────────────▶ check nonce; QPs RESET→INIT,
//!                                             receives posted, INIT→RTR→RTS
//!                     ◀──────────────────────  endpoint (QPNs, PSN, GID/LID,
//!                                              MTU, record+bounce addr+rkey)
//!  QPs INIT→RTR→RTS
//!  READY ───────────────────────────────────▶  comm ready (it may now send
//!  comm ready                                  clear-to-send entries: the
//!                                              sender's QPs are in RTR)
//! ```
//!
//! The listener only serves a connection presenting its nonce; strays are
//! dropped with a warning, as in the TCP transport.

use crate::comm::{
    self, Conn, RecvBuffers, SendBuffers, VerbsRecvComm, VerbsSendComm, RECVS_PER_QP, RECV_SIDE_SQ,
    SLOTS,
};
use crate::device::{LinkLayer, Port};
use crate::error::VerbsError;
use crate::oob::{self, ReadExact, WriteAll};
use crate::qp::{state, InitParams, Qp, QpCaps, RemoteAddr, RtrParams, RtsParams};
use crate::sys;
use crate::verbs::CqInner;
use crate::wire::{Endpoint, VerbsHandle, HANDLE_BYTES, HELLO_BYTES, READY};
use nccl_net::{Connector, Listener, NetError, NetResult, RecvComm, SendComm};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most accepted connections awaiting their greeting.
const MAX_PENDING: usize = 16;
/// How long an accepted connection may take to greet.
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause between refused connect attempts, and how many.
const RETRY_INTERVAL: Duration = Duration::from_millis(20);
const MAX_RETRIES: u32 = 50;

/// Which half a set of QPs serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Send,
    Recv,
}

/// QPs in INIT, before the peer is known.
struct Prepared {
    cq: Arc<CqInner>,
    qps: Vec<Qp<state::Init>>,
    psn: u32,
}

fn prepare(port: &Port, nqps: usize, role: Role) -> Result<Prepared, VerbsError> {
    let cap = port.max_qp_wr.max(64);
    let (caps, cq_depth) = match role {
        Role::Send => (
            QpCaps {
                send_wr: comm::send_queue_depth(comm::wr_chunk(port)).min(cap),
                recv_wr: 1,
            },
            nqps * (SLOTS + 4) + 16,
        ),
        Role::Recv => (
            QpCaps {
                send_wr: RECV_SIDE_SQ.min(cap),
                recv_wr: u32::try_from(RECVS_PER_QP).unwrap_or(u32::MAX).min(cap),
            },
            nqps * (RECVS_PER_QP + 4) + SLOTS + 16,
        ),
    };
    let cq = CqInner::new(port.ctx(), cq_depth)?;
    let init = InitParams {
        port: port.info.port,
        access: (sys::IBV_ACCESS_LOCAL_WRITE
            | sys::IBV_ACCESS_REMOTE_WRITE
            | sys::IBV_ACCESS_REMOTE_READ) as u32,
    };
    let mut qps = Vec::with_capacity(nqps);
    for _ in 0..nqps {
        let qp = Qp::create(&port.pd, &cq, caps)?.init(&init)?;
        if role == Role::Recv {
            qp.post_empty_recvs(RECVS_PER_QP, 1 << 63)?;
        }
        qps.push(qp);
    }
    let r = oob::random_bytes::<4>().map_err(|e| VerbsError::Verb {
        call: "read /dev/urandom",
        device: port.name(),
        source: e,
    })?;
    Ok(Prepared {
        cq,
        qps,
        psn: u32::from_le_bytes(r) & 0x00ff_ffff,
    })
}

fn local_endpoint(
    port: &Port,
    p: &Prepared,
    mem_addr: u64,
    mem_rkey: u32,
    bounce_bytes: u32,
) -> Endpoint {
    Endpoint {
        link_layer: port.link_layer.raw(),
        mtu: port.info.mtu,
        lid: port.info.lid,
        gid: port.gid,
        psn: p.psn,
        mem_addr,
        mem_rkey,
        slots: SLOTS as u32,
        bounce_bytes,
        qpns: p.qps.iter().map(Qp::qpn).collect(),
    }
}

/// INIT → RTR → RTS for every QP, against the peer's endpoint.
fn bring_up(
    port: &Port,
    p: Prepared,
    remote: &Endpoint,
    peer: &str,
) -> Result<(Arc<CqInner>, Vec<Qp<state::Rts>>), VerbsError> {
    if remote.link_layer != port.link_layer.raw() {
        return Err(VerbsError::Incompatible {
            peer: peer.to_owned(),
            why: format!(
                "link layer {} here, {} there",
                port.link_layer.raw(),
                remote.link_layer
            ),
        });
    }
    if remote.slots != SLOTS as u32 {
        return Err(VerbsError::Incompatible {
            peer: peer.to_owned(),
            why: format!("{SLOTS} slots here, {} there", remote.slots),
        });
    }
    let o = &port.opts;
    let addr = match port.link_layer {
        LinkLayer::InfiniBand => RemoteAddr::Lid(remote.lid),
        LinkLayer::Ethernet => RemoteAddr::Gid {
            gid: remote.gid,
            sgid_index: u8::try_from(port.gid_index).unwrap_or(u8::MAX),
            traffic_class: o.traffic_class,
        },
    };
    let rtr = RtrParams {
        port: port.info.port,
        mtu: u32::from(port.info.mtu.min(remote.mtu)),
        dest_qpn: 0,
        rq_psn: remote.psn,
        remote: addr,
        service_level: o.service_level,
    };
    let rts = RtsParams {
        sq_psn: p.psn,
        timeout: o.timeout,
        retry_cnt: o.retry_cnt,
    };
    let mut up = Vec::with_capacity(p.qps.len());
    for (q, &dest) in p.qps.into_iter().zip(&remote.qpns) {
        let rtr = RtrParams {
            dest_qpn: dest,
            ..rtr
        };
        up.push(q.ready_to_receive(&rtr, peer)?.ready_to_send(&rts, peer)?);
    }
    tracing::debug!(
        peer,
        qps = up.len(),
        mtu = crate::device::mtu_bytes(port.info.mtu.min(remote.mtu)),
        "NET/IB: queue pairs ready"
    );
    Ok((p.cq, up))
}

fn io_err(call: &'static str, peer: &str, e: io::Error) -> NetError {
    if e.kind() == io::ErrorKind::UnexpectedEof || e.kind() == io::ErrorKind::BrokenPipe {
        NetError::Closed(peer.to_owned())
    } else {
        NetError::Io {
            call,
            source: io::Error::new(e.kind(), format!("{peer}: {e}")),
        }
    }
}

struct Pending {
    stream: TcpStream,
    peer: SocketAddr,
    rd: ReadExact,
    since: Instant,
}

/// The receiving half, connected but not yet confirmed by the peer.
struct RecvParts {
    cq: Arc<CqInner>,
    qps: Vec<Qp<state::Rts>>,
    bufs: RecvBuffers,
    fifo_addr: u64,
    fifo_rkey: u32,
}

enum ListenState {
    /// Accepting and judging greetings.
    Accepting,
    /// Sending our endpoint.
    Replying(TcpStream, String, Box<RecvParts>, WriteAll),
    /// Waiting for the connector's READY byte.
    AwaitReady(TcpStream, String, Box<RecvParts>, ReadExact),
    /// Handed out its comm, or failed.
    Done,
}

/// The accepting side of one connection.
pub(crate) struct VerbsListener {
    port: Arc<Port>,
    sock: TcpListener,
    handle: [u8; HANDLE_BYTES],
    hello: [u8; HELLO_BYTES],
    nqps: usize,
    pending: Vec<Pending>,
    state: ListenState,
}

impl VerbsListener {
    pub(crate) fn bind(port: &Arc<Port>) -> NetResult<VerbsListener> {
        let sock = oob::listen(port.oob_ip).map_err(|e| NetError::io("bind", e))?;
        let addr = sock
            .local_addr()
            .map_err(|e| NetError::io("getsockname", e))?;
        let nonce = oob::random_bytes::<8>().map_err(|e| NetError::io("read /dev/urandom", e))?;
        let nqps = port.opts.qps_per_connection;
        let h = VerbsHandle {
            addr,
            nonce,
            link_layer: port.link_layer.raw(),
            mtu: port.info.mtu,
            nqps: u8::try_from(nqps).unwrap_or(u8::MAX),
            lid: port.info.lid,
            gid: port.gid,
        };
        tracing::debug!(%addr, "NET/IB: listening");
        Ok(VerbsListener {
            port: Arc::clone(port),
            sock,
            handle: h.encode(),
            hello: h.hello(),
            nqps,
            pending: Vec::new(),
            state: ListenState::Accepting,
        })
    }

    /// Accepts new connections and reads greetings; returns the first
    /// complete, valid one.
    fn judge(&mut self) -> NetResult<Option<Pending>> {
        while let Some((stream, peer)) =
            oob::accept(&self.sock).map_err(|e| NetError::io("accept", e))?
        {
            if self.pending.len() >= MAX_PENDING {
                let old = self.pending.remove(0);
                tracing::warn!(peer = %old.peer, "NET/IB: dropping connection: too many awaiting their greeting");
            }
            self.pending.push(Pending {
                stream,
                peer,
                rd: ReadExact::new(HELLO_BYTES + Endpoint::encoded_len(self.nqps)),
                since: Instant::now(),
            });
        }
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.pending[i];
            let verdict = match p.rd.poll(&mut p.stream) {
                Ok(done) => {
                    let got = p.rd.filled();
                    let n = got.len().min(HELLO_BYTES);
                    if got[..n] != self.hello[..n] {
                        Err("bad greeting (wrong nonce, or not our protocol)")
                    } else if done {
                        Ok(true)
                    } else if p.since.elapsed() > HELLO_TIMEOUT {
                        Err("no greeting in time")
                    } else {
                        Ok(false)
                    }
                }
                Err(_) => Err("connection lost during the greeting"),
            };
            match verdict {
                Ok(false) => i += 1,
                Ok(true) => {
                    let p = self.pending.swap_remove(i);
                    self.pending.clear();
                    return Ok(Some(p));
                }
                Err(why) => {
                    let p = self.pending.remove(i);
                    tracing::warn!(peer = %p.peer, "NET/IB: dropping incoming connection: {why}");
                }
            }
        }
        Ok(None)
    }

    /// Builds the receiving half for a greeted connection.
    fn start_reply(&mut self, p: Pending) -> NetResult<ListenState> {
        let peer = p.peer.to_string();
        let remote = Endpoint::decode(&p.rd.buf[HELLO_BYTES..], self.nqps)?;
        let port = &self.port;
        let prep = prepare(port, self.nqps, Role::Recv)?;
        let bufs = RecvBuffers::new(port)?;
        let ours = local_endpoint(
            port,
            &prep,
            bufs.remote.ptr() as u64,
            bufs.remote.mr().rkey(),
            comm::BOUNCE_BYTES as u32,
        );
        let (cq, qps) = bring_up(port, prep, &remote, &peer)?;
        let parts = RecvParts {
            cq,
            qps,
            bufs,
            fifo_addr: remote.mem_addr,
            fifo_rkey: remote.mem_rkey,
        };
        Ok(ListenState::Replying(
            p.stream,
            peer,
            Box::new(parts),
            WriteAll::new(ours.encode()),
        ))
    }

    fn step(&mut self, state: ListenState) -> NetResult<(ListenState, Option<VerbsRecvComm>)> {
        Ok(match state {
            ListenState::Accepting => match self.judge()? {
                Some(p) => (self.start_reply(p)?, None),
                None => (ListenState::Accepting, None),
            },
            ListenState::Replying(mut s, peer, parts, mut out) => {
                if out.poll(&mut s).map_err(|e| io_err("send", &peer, e))? {
                    (
                        ListenState::AwaitReady(s, peer, parts, ReadExact::new(1)),
                        None,
                    )
                } else {
                    (ListenState::Replying(s, peer, parts, out), None)
                }
            }
            ListenState::AwaitReady(mut s, peer, parts, mut rd) => {
                if !rd.poll(&mut s).map_err(|e| io_err("recv", &peer, e))? {
                    return Ok((ListenState::AwaitReady(s, peer, parts, rd), None));
                }
                if rd.buf[0] != READY {
                    return Err(NetError::Protocol(format!(
                        "peer {peer} sent {:#x} instead of READY",
                        rd.buf[0]
                    )));
                }
                tracing::debug!(%peer, "NET/IB: accepted connection");
                let p = *parts;
                let conn = Conn::new(p.qps, p.cq, Arc::clone(&self.port), peer, s);
                let comm = VerbsRecvComm::new(conn, p.bufs, p.fifo_addr, p.fifo_rkey);
                (ListenState::Done, Some(comm))
            }
            ListenState::Done => {
                return Err(NetError::Other(
                    "listener already accepted its connection (or failed)".into(),
                ))
            }
        })
    }
}

impl VerbsListener {
    /// [`Listener::accept`], returning the concrete comm.
    pub(crate) fn accept_comm(&mut self) -> NetResult<Option<VerbsRecvComm>> {
        loop {
            let state = std::mem::replace(&mut self.state, ListenState::Done);
            let before = std::mem::discriminant(&state);
            let (next, comm) = self.step(state)?;
            let progressed = std::mem::discriminant(&next) != before;
            self.state = next;
            if comm.is_some() || !progressed {
                return Ok(comm);
            }
        }
    }
}

impl Listener for VerbsListener {
    fn handle(&self) -> &[u8] {
        &self.handle
    }

    fn accept(&mut self) -> NetResult<Option<Box<dyn RecvComm>>> {
        Ok(self
            .accept_comm()?
            .map(|c| Box::new(c) as Box<dyn RecvComm>))
    }
}

/// The sending half, connected but READY not yet sent.
struct SendParts {
    cq: Arc<CqInner>,
    qps: Vec<Qp<state::Rts>>,
    remote_records: u64,
    remote_rkey: u32,
}

enum ConnState {
    /// Waiting to retry a refused connect.
    Backoff(Instant),
    /// Non-blocking connect in flight.
    Connecting(TcpStream),
    /// Writing greeting and endpoint.
    Greeting(TcpStream, WriteAll),
    /// Reading the listener's endpoint.
    AwaitPeer(TcpStream, ReadExact),
    /// Writing READY.
    Ready(TcpStream, Box<SendParts>, WriteAll),
    /// Handed out its comm, or failed.
    Done,
}

/// The connecting side of one connection.
pub(crate) struct VerbsConnector {
    /// Declared first: connected QPs (in `Ready`) are destroyed before the
    /// buffers they expose.
    state: ConnState,
    port: Arc<Port>,
    target: SocketAddr,
    peer: String,
    nqps: usize,
    greeting: Vec<u8>,
    prep: Option<Prepared>,
    bufs: Option<SendBuffers>,
    retries: u32,
}

impl VerbsConnector {
    pub(crate) fn start(port: &Arc<Port>, h: &VerbsHandle) -> NetResult<VerbsConnector> {
        let peer = h.addr.to_string();
        if h.link_layer != port.link_layer.raw() {
            return Err(VerbsError::Incompatible {
                peer,
                why: format!(
                    "listener's port has link layer {}, ours ({}) has {}",
                    h.link_layer,
                    port.name(),
                    port.link_layer.raw()
                ),
            }
            .into());
        }
        let nqps = usize::from(h.nqps);
        let prep = prepare(port, nqps, Role::Send)?;
        let bufs = SendBuffers::new(port)?;
        let ours = local_endpoint(
            port,
            &prep,
            bufs.fifo.ptr() as u64,
            bufs.fifo.mr().rkey(),
            0,
        );
        let mut greeting = h.hello().to_vec();
        greeting.extend_from_slice(&ours.encode());
        let mut c = VerbsConnector {
            port: Arc::clone(port),
            target: h.addr,
            peer,
            nqps,
            greeting,
            prep: Some(prep),
            bufs: Some(bufs),
            retries: 0,
            state: ConnState::Done,
        };
        c.state = c.attempt()?;
        Ok(c)
    }

    fn attempt(&mut self) -> NetResult<ConnState> {
        match oob::start_connect(&self.target) {
            Ok(s) => Ok(ConnState::Connecting(s)),
            Err(e) => self.retry_or_fail(e),
        }
    }

    fn retry_or_fail(&mut self, e: io::Error) -> NetResult<ConnState> {
        let retryable = matches!(
            e.raw_os_error(),
            Some(libc::ECONNREFUSED | libc::ETIMEDOUT | libc::EAGAIN)
        );
        if retryable && self.retries < MAX_RETRIES {
            self.retries += 1;
            Ok(ConnState::Backoff(Instant::now() + RETRY_INTERVAL))
        } else {
            Err(io_err("connect", &self.peer, e))
        }
    }

    fn step(&mut self, state: ConnState) -> NetResult<(ConnState, Option<VerbsSendComm>)> {
        Ok(match state {
            ConnState::Backoff(t) if Instant::now() < t => (ConnState::Backoff(t), None),
            ConnState::Backoff(_) => (self.attempt()?, None),
            ConnState::Connecting(s) => match oob::poll_connected(&s) {
                Ok(false) => (ConnState::Connecting(s), None),
                Ok(true) => {
                    let out = WriteAll::new(std::mem::take(&mut self.greeting));
                    (ConnState::Greeting(s, out), None)
                }
                Err(e) => (self.retry_or_fail(e)?, None),
            },
            ConnState::Greeting(mut s, mut out) => {
                if out
                    .poll(&mut s)
                    .map_err(|e| io_err("send", &self.peer, e))?
                {
                    (
                        ConnState::AwaitPeer(s, ReadExact::new(Endpoint::encoded_len(self.nqps))),
                        None,
                    )
                } else {
                    (ConnState::Greeting(s, out), None)
                }
            }
            ConnState::AwaitPeer(mut s, mut rd) => {
                if !rd.poll(&mut s).map_err(|e| io_err("recv", &self.peer, e))? {
                    return Ok((ConnState::AwaitPeer(s, rd), None));
                }
                let remote = Endpoint::decode(&rd.buf, self.nqps)?;
                let prep = self
                    .prep
                    .take()
                    .ok_or_else(|| NetError::Other("connector reused".into()))?;
                let (cq, qps) = bring_up(&self.port, prep, &remote, &self.peer)?;
                let parts = SendParts {
                    cq,
                    qps,
                    remote_records: remote.mem_addr,
                    remote_rkey: remote.mem_rkey,
                };
                (
                    ConnState::Ready(s, Box::new(parts), WriteAll::new(vec![READY])),
                    None,
                )
            }
            ConnState::Ready(mut s, parts, mut out) => {
                if !out
                    .poll(&mut s)
                    .map_err(|e| io_err("send", &self.peer, e))?
                {
                    return Ok((ConnState::Ready(s, parts, out), None));
                }
                let bufs = self
                    .bufs
                    .take()
                    .ok_or_else(|| NetError::Other("connector reused".into()))?;
                let p = *parts;
                let sq_depth = comm::send_queue_depth(comm::wr_chunk(&self.port))
                    .min(self.port.max_qp_wr.max(64));
                let conn = Conn::new(p.qps, p.cq, Arc::clone(&self.port), self.peer.clone(), s);
                tracing::debug!(peer = %self.peer, "NET/IB: connected");
                let comm =
                    VerbsSendComm::new(conn, bufs, p.remote_records, p.remote_rkey, sq_depth);
                (ConnState::Done, Some(comm))
            }
            ConnState::Done => {
                return Err(NetError::Other(
                    "connector already completed or failed".into(),
                ))
            }
        })
    }
}

impl VerbsConnector {
    /// [`Connector::poll_connect`], returning the concrete comm.
    pub(crate) fn poll_comm(&mut self) -> NetResult<Option<VerbsSendComm>> {
        loop {
            let state = std::mem::replace(&mut self.state, ConnState::Done);
            let before = std::mem::discriminant(&state);
            let (next, comm) = self.step(state)?;
            let progressed = std::mem::discriminant(&next) != before;
            self.state = next;
            if comm.is_some() || !progressed || matches!(self.state, ConnState::Backoff(_)) {
                return Ok(comm);
            }
        }
    }
}

impl Connector for VerbsConnector {
    fn poll_connect(&mut self) -> NetResult<Option<Box<dyn SendComm>>> {
        Ok(self.poll_comm()?.map(|c| Box::new(c) as Box<dyn SendComm>))
    }
}
