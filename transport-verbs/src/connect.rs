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

mod connector;
mod listener;

pub(crate) use connector::VerbsConnector;
pub(crate) use listener::VerbsListener;

use crate::comm::{self, RECVS_PER_QP, RECV_SIDE_SQ, SLOTS};
use crate::device::{LinkLayer, Port};
use crate::error::VerbsError;
use crate::oob;
use crate::qp::{state, InitParams, Qp, QpCaps, RemoteAddr, RtrParams, RtsParams};
use crate::sys;
use crate::verbs::CqInner;
use crate::wire::Endpoint;
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
