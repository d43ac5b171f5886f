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
//! With several rails the connector picks the connection's rail count
//! (`crate::rails::connection_rails`, from its rails, the handle's and
//! `NCCL_CROSS_NIC`) and its endpoint says it; each side then builds one
//! completion queue and `NCCL_IB_QPS_PER_CONNECTION` QPs per connection
//! rail, on the port `crate::rails::port_of_rail` names.
//!
//! The listener only serves a connection presenting its nonce; strays are
//! dropped with a warning, as in the TCP transport.

mod connector;
mod listener;

pub(crate) use connector::VerbsConnector;
pub(crate) use listener::VerbsListener;

use crate::comm::{self, RECVS_PER_QP, RECV_SIDE_SQ, SLOTS};
use crate::device::{LinkLayer, Port};
use crate::error::VerbsError;
use crate::oob;
use crate::qp::{state, InitParams, Qp, QpCaps, RemoteAddr, RtrParams, RtsParams};
use crate::rails::{port_of_rail, qp_rail};
use crate::sys;
use crate::verbs::CqInner;
use crate::wire::{Endpoint, RailAddr};
use nccl_net::NetError;
use std::io;
use std::sync::Arc;

/// Which half a set of QPs serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Send,
    Recv,
}

/// QPs in INIT, before the peer is known.
struct Prepared {
    /// One completion queue per connection rail.
    cqs: Vec<Arc<CqInner>>,
    /// In connection order: QP `i` is on rail `qp_rail(i, rails)`.
    qps: Vec<Qp<state::Init>>,
    psn: u32,
}

/// The local port of each of a connection's `rails` rails, out of this
/// side's `local` rails.
fn conn_ports(local: &[Arc<Port>], rails: usize) -> Vec<Arc<Port>> {
    (0..rails)
        .map(|k| Arc::clone(&local[port_of_rail(k, local.len())]))
        .collect()
}

/// Send-queue depth of a sender QP on `port` for a connection over `ports`.
fn send_depth(ports: &[Arc<Port>], port: &Port) -> u32 {
    comm::send_queue_depth(comm::conn_wr_chunk(ports)).min(port.max_qp_wr.max(64))
}

fn prepare(ports: &[Arc<Port>], per_rail: usize, role: Role) -> Result<Prepared, VerbsError> {
    let rails = ports.len();
    let mut cqs = Vec::with_capacity(rails);
    for port in ports {
        let depth = match role {
            Role::Send => per_rail * (SLOTS + 4) + 16,
            Role::Recv => per_rail * (RECVS_PER_QP + 4) + SLOTS + 16,
        };
        cqs.push(CqInner::new(port.ctx(), depth)?);
    }
    let mut qps = Vec::with_capacity(per_rail * rails);
    for i in 0..per_rail * rails {
        let rail = qp_rail(i, rails);
        let port = &ports[rail];
        let cap = port.max_qp_wr.max(64);
        let caps = match role {
            Role::Send => QpCaps {
                send_wr: send_depth(ports, port),
                recv_wr: 1,
            },
            Role::Recv => QpCaps {
                send_wr: RECV_SIDE_SQ.min(cap),
                recv_wr: u32::try_from(RECVS_PER_QP).unwrap_or(u32::MAX).min(cap),
            },
        };
        let init = InitParams {
            port: port.info.port,
            access: (sys::IBV_ACCESS_LOCAL_WRITE
                | sys::IBV_ACCESS_REMOTE_WRITE
                | sys::IBV_ACCESS_REMOTE_READ) as u32,
        };
        let qp = Qp::create(&port.pd, &cqs[rail], caps)?.init(&init)?;
        if role == Role::Recv {
            qp.post_empty_recvs(RECVS_PER_QP, 1 << 63)?;
        }
        qps.push(qp);
    }
    let r = oob::random_bytes::<4>().map_err(|e| VerbsError::Verb {
        call: "read /dev/urandom",
        device: ports[0].name(),
        source: e,
    })?;
    Ok(Prepared {
        cqs,
        qps,
        psn: u32::from_le_bytes(r) & 0x00ff_ffff,
    })
}

fn rail_addr(port: &Port) -> RailAddr {
    RailAddr {
        link_layer: port.link_layer.raw(),
        mtu: port.info.mtu,
        lid: port.info.lid,
        gid: port.gid,
    }
}

fn local_endpoint(
    ports: &[Arc<Port>],
    p: &Prepared,
    mem_addr: u64,
    mem_rkey: u32,
    bounce_bytes: u32,
) -> Endpoint {
    Endpoint {
        rails: ports.iter().map(|p| rail_addr(p)).collect(),
        psn: p.psn,
        mem_addr,
        mem_rkey,
        slots: SLOTS as u32,
        bounce_bytes,
        qpns: p.qps.iter().map(Qp::qpn).collect(),
    }
}

/// One completion queue per connection rail, and the connected QPs.
type ConnectedQps = (Vec<Arc<CqInner>>, Vec<Qp<state::Rts>>);

/// INIT → RTR → RTS for every QP, against the peer's endpoint: QP `i` joins
/// local port `ports[r]` to the peer's rail `r = qp_rail(i, rails)`.
fn bring_up(
    ports: &[Arc<Port>],
    p: Prepared,
    remote: &Endpoint,
    peer: &str,
) -> Result<ConnectedQps, VerbsError> {
    let rails = ports.len();
    if remote.rails.len() != rails || remote.qpns.len() != p.qps.len() {
        return Err(VerbsError::Incompatible {
            peer: peer.to_owned(),
            why: format!(
                "{} rails / {} QPs here, {} / {} there",
                rails,
                p.qps.len(),
                remote.rails.len(),
                remote.qpns.len()
            ),
        });
    }
    for (k, (port, r)) in ports.iter().zip(&remote.rails).enumerate() {
        if r.link_layer != port.link_layer.raw() {
            return Err(VerbsError::Incompatible {
                peer: peer.to_owned(),
                why: format!(
                    "rail {k}: link layer {} here ({}), {} there",
                    port.link_layer.raw(),
                    port.name(),
                    r.link_layer
                ),
            });
        }
    }
    if remote.slots != SLOTS as u32 {
        return Err(VerbsError::Incompatible {
            peer: peer.to_owned(),
            why: format!("{SLOTS} slots here, {} there", remote.slots),
        });
    }
    let mut up = Vec::with_capacity(p.qps.len());
    for (i, (q, &dest)) in p.qps.into_iter().zip(&remote.qpns).enumerate() {
        let rail = qp_rail(i, rails);
        let port = &ports[rail];
        let there = &remote.rails[rail];
        let o = &port.opts;
        let addr = match port.link_layer {
            LinkLayer::InfiniBand => RemoteAddr::Lid(there.lid),
            LinkLayer::Ethernet => RemoteAddr::Gid {
                gid: there.gid,
                sgid_index: u8::try_from(port.gid_index).unwrap_or(u8::MAX),
                traffic_class: o.traffic_class,
            },
        };
        let rtr = RtrParams {
            port: port.info.port,
            mtu: u32::from(port.info.mtu.min(there.mtu)),
            dest_qpn: dest,
            rq_psn: remote.psn,
            remote: addr,
            service_level: o.service_level,
        };
        let rts = RtsParams {
            sq_psn: p.psn,
            timeout: o.timeout,
            retry_cnt: o.retry_cnt,
        };
        up.push(q.ready_to_receive(&rtr, peer)?.ready_to_send(&rts, peer)?);
    }
    tracing::debug!(peer, qps = up.len(), rails, "NET/IB: queue pairs ready");
    Ok((p.cqs, up))
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
