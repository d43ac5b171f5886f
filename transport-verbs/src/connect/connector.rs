//! [`VerbsConnector`]: connects to the listener's side socket (retrying
//! while refused), sends greeting and endpoint, brings up the sending QPs
//! against the listener's endpoint and sends READY.

use super::{bring_up, conn_ports, io_err, local_endpoint, prepare, send_depth, Prepared, Role};
use crate::comm::{Conn, SendBuffers, VerbsSendComm};
use crate::device::Port;
use crate::error::VerbsError;
use crate::oob::{self, ReadExact, WriteAll};
use crate::qp::{state, Qp};
use crate::rails::{connection_rails, qp_rail};
use crate::verbs::CqInner;
use crate::wire::{Endpoint, VerbsHandle, READY};
use nccl_net::{Connector, NetError, NetResult, SendComm};
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Pause between refused connect attempts, and how many.
const RETRY_INTERVAL: Duration = Duration::from_millis(20);
const MAX_RETRIES: u32 = 50;

/// The sending half, connected but READY not yet sent.
struct SendParts {
    cqs: Vec<Arc<CqInner>>,
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
    /// The local port of each connection rail.
    ports: Vec<Arc<Port>>,
    target: SocketAddr,
    peer: String,
    /// Queue pairs per rail.
    nqps: usize,
    greeting: Vec<u8>,
    prep: Option<Prepared>,
    bufs: Option<SendBuffers>,
    retries: u32,
}

impl VerbsConnector {
    pub(crate) fn start(local: &[Arc<Port>], h: &VerbsHandle) -> NetResult<VerbsConnector> {
        let peer = h.addr.to_string();
        let port = &local[0];
        let theirs = h.rails.first().map_or(0, |r| r.link_layer);
        if theirs != port.link_layer.raw() {
            return Err(VerbsError::Incompatible {
                peer,
                why: format!(
                    "listener's port has link layer {}, ours ({}) has {}",
                    theirs,
                    port.name(),
                    port.link_layer.raw()
                ),
            }
            .into());
        }
        let rails = connection_rails(local.len(), h.rails.len(), port.opts.cross_nic);
        let ports = conn_ports(local, rails);
        if rails > 1 || local.len() > 1 || h.rails.len() > 1 {
            tracing::debug!(
                peer = %peer,
                rails,
                local = local.len(),
                remote = h.rails.len(),
                cross_nic = ?port.opts.cross_nic,
                "NET/IB: connection rails"
            );
        }
        let nqps = usize::from(h.nqps);
        let prep = prepare(&ports, nqps, Role::Send)?;
        let bufs = SendBuffers::new(&ports)?;
        let ours = local_endpoint(
            &ports,
            &prep,
            bufs.fifo.ptr() as u64,
            bufs.fifo.mr().rkey(),
            0,
        );
        let mut greeting = h.hello().to_vec();
        greeting.extend_from_slice(&ours.encode());
        let mut c = VerbsConnector {
            ports,
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
                        ConnState::AwaitPeer(
                            s,
                            ReadExact::new(Endpoint::encoded_len(self.nqps, self.ports.len())),
                        ),
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
                let remote = Endpoint::decode(&rd.buf, self.nqps, self.ports.len())?;
                let prep = self
                    .prep
                    .take()
                    .ok_or_else(|| NetError::Other("connector reused".into()))?;
                let (cqs, qps) = bring_up(&self.ports, prep, &remote, &self.peer)?;
                let parts = SendParts {
                    cqs,
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
                let rails = self.ports.len();
                let sq_depth: Vec<u32> = (0..p.qps.len())
                    .map(|i| send_depth(&self.ports, &self.ports[qp_rail(i, rails)]))
                    .collect();
                let conn = Conn::new(p.qps, p.cqs, self.ports.clone(), self.peer.clone(), s);
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
