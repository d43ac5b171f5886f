//! [`VerbsListener`]: accepts the side-socket connection whose greeting
//! carries our nonce, brings up the receiving QPs, replies with our
//! endpoint and waits for the connector's READY.

use super::{bring_up, conn_ports, io_err, local_endpoint, prepare, rail_addr, Role};
use crate::comm::{self, Conn, RecvBuffers, VerbsRecvComm};
use crate::device::Port;
use crate::oob::{self, ReadExact, WriteAll};
use crate::qp::{state, Qp};
use crate::rails::MAX_RAILS;
use crate::verbs::CqInner;
use crate::wire::{Endpoint, VerbsHandle, ENDPOINT_FIXED, HELLO_BYTES, READY};
use nccl_net::{Listener, NetError, NetResult, RecvComm};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most accepted connections awaiting their greeting.
const MAX_PENDING: usize = 16;
/// How long an accepted connection may take to greet.
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);

struct Pending {
    stream: TcpStream,
    peer: SocketAddr,
    rd: ReadExact,
    since: Instant,
}

/// The receiving half, connected but not yet confirmed by the peer.
struct RecvParts {
    cqs: Vec<Arc<CqInner>>,
    ports: Vec<Arc<Port>>,
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
    /// This side's rails (the handle advertises at most `MAX_RAILS`).
    rails: Vec<Arc<Port>>,
    sock: TcpListener,
    handle: Vec<u8>,
    hello: [u8; HELLO_BYTES],
    nqps: usize,
    pending: Vec<Pending>,
    state: ListenState,
}

impl VerbsListener {
    pub(crate) fn bind(rails: &[Arc<Port>]) -> NetResult<VerbsListener> {
        let port = &rails[0];
        let sock = oob::listen(port.oob_ip).map_err(|e| NetError::io("bind", e))?;
        let addr = sock
            .local_addr()
            .map_err(|e| NetError::io("getsockname", e))?;
        let nonce = oob::random_bytes::<8>().map_err(|e| NetError::io("read /dev/urandom", e))?;
        let nqps = port.opts.qps_per_connection;
        if rails.len() > MAX_RAILS {
            tracing::warn!(
                "NET/IB: {} rails, a handle holds {MAX_RAILS}; the rest are not offered",
                rails.len()
            );
        }
        let rails: Vec<Arc<Port>> = rails.iter().take(MAX_RAILS).cloned().collect();
        let h = VerbsHandle {
            addr,
            nonce,
            nqps: u8::try_from(nqps).unwrap_or(u8::MAX),
            rails: rails.iter().map(|p| rail_addr(p)).collect(),
        };
        tracing::debug!(%addr, rails = rails.len(), "NET/IB: listening");
        Ok(VerbsListener {
            rails,
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
                // The fixed part first: it says how many rails follow.
                rd: ReadExact::new(HELLO_BYTES + ENDPOINT_FIXED),
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
                    } else if done && p.rd.buf.len() == HELLO_BYTES + ENDPOINT_FIXED {
                        match Endpoint::rails_in(&got[HELLO_BYTES..]) {
                            Some(r) => {
                                p.rd.extend_to(HELLO_BYTES + Endpoint::encoded_len(self.nqps, r));
                                p.rd.poll(&mut p.stream)
                                    .map_err(|_| "connection lost during the greeting")
                            }
                            None => Err("endpoint announces too many rails"),
                        }
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
        let body = &p.rd.buf[HELLO_BYTES..];
        let rails = Endpoint::rails_in(body)
            .ok_or_else(|| NetError::Protocol(format!("peer {peer}: bad rail count")))?;
        let remote = Endpoint::decode(body, self.nqps, rails)?;
        let ports = conn_ports(&self.rails, rails);
        let prep = prepare(&ports, self.nqps, Role::Recv)?;
        let bufs = RecvBuffers::new(&ports)?;
        let ours = local_endpoint(
            &ports,
            &prep,
            bufs.remote.ptr() as u64,
            bufs.remote.mr().rkey(),
            comm::BOUNCE_BYTES as u32,
        );
        let (cqs, qps) = bring_up(&ports, prep, &remote, &peer)?;
        let parts = RecvParts {
            cqs,
            ports,
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
                let conn = Conn::new(p.qps, p.cqs, p.ports, peer, s);
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
