//! The data path: [`VerbsSendComm`] (`send.rs`) and [`VerbsRecvComm`]
//! (`recv.rs`), and what they share (this file).
//!
//! # Protocol (receiver-driven, as NCCL's IB transport)
//! Message `k` (0-based, per connection) uses slot `k % SLOTS` everywhere.
//! 1. `irecv` chooses where the payload lands: the caller's buffer when it
//!    is registered (a `reg_mr` handle, or a large buffer registered through
//!    the [registration cache](crate::regcache)), else the slot's
//!    pre-registered bounce buffer. It RDMA-writes a clear-to-send entry
//!    ([`Cts`]: address, rkey, capacity, tag, slot) into slot `k` of the
//!    sender's FIFO.
//! 2. The sender polls its FIFO. When `isend` `k` meets CTS `k` it checks
//!    tag and size, then splits the payload over the connection's QPs
//!    ([`split_parts`]) and RDMA-writes each part straight into the
//!    receiver's buffer (from the caller's registered buffer, or from its
//!    own bounce slot for small unregistered sends). The last work request
//!    on every QP used is a write-with-immediate carrying `k`; on QP 0 it
//!    writes the completion [`Record`] (size, tag, status, number of parts)
//!    into the receiver's record slot `k`.
//! 3. Each write-with-immediate consumes one empty receive at the receiver
//!    and yields a completion. Once the record and as many completions as
//!    it announces have arrived, receive `k` is complete (bounce data is
//!    copied out first). A tag mismatch or an oversize send travels as the
//!    record's status, with no payload; both ends then report it.
//!
//! At most `SLOTS` requests are outstanding per comm, so slot `k` is free
//! again when request `k + SLOTS` is posted. Send work requests are
//! unsignaled except the last one per QP per message; each QP counts its
//! free send-queue entries.
//!
//! # Closing
//! The handshake socket stays open. Each comm peeks at it now and then
//! while requests are pending; end-of-file means the peer dropped its comm,
//! reported as [`NetError::Closed`] after a short grace period (so
//! completions already on their way are not misreported). Dropping a comm
//! destroys its QPs first (the adapter stops touching memory), then the
//! registrations and buffers.

mod recv;
mod send;

pub(crate) use recv::{RecvBuffers, VerbsRecvComm, RECVS_PER_QP, RECV_SIDE_SQ};
pub(crate) use send::{conn_wr_chunk, send_queue_depth, SendBuffers, VerbsSendComm};

use crate::device::Port;
use crate::error::{VerbsError, WcStatus};
use crate::qp::{state, Qp};
use crate::rails::{qp_rail, MAX_RAILS};
use crate::sys;
use crate::verbs::{CqInner, MemRegion, Mr, PdInner, ACCESS_LOCAL_READ, ACCESS_REMOTE_WRITE};
use nccl_net::{NetError, Request};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Requests outstanding per comm, FIFO and record slots.
pub(crate) const SLOTS: usize = 32;
/// Bounce buffer bytes per slot: unregistered messages up to this size are
/// copied; larger ones are registered through the cache.
pub(crate) const BOUNCE_BYTES: usize = 64 << 10;
/// Largest message.
pub(crate) const MAX_MESSAGE_BYTES: usize = 1 << 30;
/// Smallest part worth a QP of its own.
const MIN_PART: usize = 8 << 10;
/// Parts start at multiples of this (cache-line friendly, as NCCL's 128).
const PART_ALIGN: usize = 128;
/// How long a closed side socket may precede a missing completion before
/// the comm reports `Closed`.
const CLOSE_GRACE: Duration = Duration::from_millis(200);
/// Minimum interval between side-socket checks.
const SOCK_CHECK_EVERY: Duration = Duration::from_millis(2);
/// Work completions polled per call.
const POLL_BATCH: usize = 32;
/// Receiver `wr_id`s: empty receives, and clear-to-send writes (| seq).
const WR_RECV: u64 = 1 << 63;
const WR_CTS: u64 = 1 << 62;
/// Sender `wr_id`s: `seq << WR_QP_BITS | QP index` (QP index below
/// `MAX_RAILS × MAX_QPS_PER_CONNECTION`).
const WR_QP_BITS: u32 = 16;
const WR_QP_MASK: u64 = (1 << WR_QP_BITS) - 1;
const _: () = assert!(MAX_RAILS * crate::options::MAX_QPS_PER_CONNECTION <= WR_QP_MASK as usize);

/// How a message of `len` bytes is split over `nqps` queue pairs:
/// `(offset, len)` per QP used, in QP order. Always at least one part (a
/// 0-byte message is one empty part); parts are at least `MIN_PART` (8 KiB)
/// (except the last) and start at multiples of 128 bytes.
pub fn split_parts(len: usize, nqps: usize) -> Vec<(usize, usize)> {
    let nqps = nqps.max(1);
    let want = len.div_ceil(MIN_PART).clamp(1, nqps);
    let chunk = len.div_ceil(want).div_ceil(PART_ALIGN) * PART_ALIGN;
    let mut parts = Vec::with_capacity(want);
    let mut off = 0;
    while parts.is_empty() || off < len {
        let l = chunk.min(len - off);
        parts.push((off, l));
        off += l;
        if chunk == 0 {
            break;
        }
    }
    parts
}

/// A remembered failure; rebuilt into a [`NetError`] on every report.
#[derive(Clone, Debug)]
enum Fault {
    Closed,
    Tag {
        expected: u32,
        got: u32,
    },
    Truncated {
        posted: usize,
        got: usize,
    },
    Completion {
        op: &'static str,
        /// Connection rail the completion came from.
        rail: usize,
        status: WcStatus,
        vendor_err: u32,
    },
    Verb {
        call: &'static str,
        errno: i32,
    },
    Protocol(String),
}

impl Fault {
    /// `rails`: the local port name of each connection rail (rail 0 first).
    fn to_error(&self, peer: &str, rails: &[String]) -> NetError {
        let device = rails.join("+");
        match self {
            Fault::Closed => NetError::Closed(peer.to_owned()),
            Fault::Tag { expected, got } => NetError::TagMismatch {
                expected: *expected,
                got: *got,
            },
            Fault::Truncated { posted, got } => NetError::Truncated {
                posted: *posted,
                got: *got,
            },
            Fault::Completion {
                op,
                rail,
                status,
                vendor_err,
            } => VerbsError::Completion {
                peer: peer.to_owned(),
                rail: format!(
                    "rail {rail} ({})",
                    rails.get(*rail).map_or("?", String::as_str)
                ),
                op,
                status: *status,
                vendor_err: *vendor_err,
                hint: status.hint(),
            }
            .into(),
            Fault::Verb { call, errno } => VerbsError::Verb {
                call,
                device,
                source: std::io::Error::from_raw_os_error(*errno),
            }
            .into(),
            Fault::Protocol(s) => NetError::Protocol(format!("{s} (peer {peer})")),
        }
    }

    fn from_verbs(e: &VerbsError) -> Fault {
        match e {
            VerbsError::Verb { call, source, .. } => Fault::Verb {
                call,
                errno: source.raw_os_error().unwrap_or(libc::EIO),
            },
            other => Fault::Protocol(other.to_string()),
        }
    }
}

fn unknown_request(req: Request) -> NetError {
    NetError::Other(format!(
        "unknown request {} (never posted on this comm, or already reported complete)",
        req.0
    ))
}

/// What both halves share: the QPs, the CQs, the side socket and the fault.
pub(crate) struct Conn {
    /// Declared first: dropped (destroyed) before everything else.
    qps: Vec<Qp<state::Rts>>,
    /// Connection rail of each QP (`crate::rails::qp_rail`).
    qp_rails: Vec<usize>,
    /// One per connection rail.
    cqs: Vec<Arc<CqInner>>,
    /// Local port of each connection rail, rail 0 first.
    ports: Vec<Arc<Port>>,
    /// `ports`' names, for errors.
    names: Vec<String>,
    peer: String,
    sock: TcpStream,
    last_check: Instant,
    closed_since: Option<Instant>,
    fault: Option<Fault>,
    wc: Vec<sys::ibv_wc>,
}

impl Conn {
    pub(crate) fn new(
        qps: Vec<Qp<state::Rts>>,
        cqs: Vec<Arc<CqInner>>,
        ports: Vec<Arc<Port>>,
        peer: String,
        sock: TcpStream,
    ) -> Conn {
        let rails = ports.len();
        Conn {
            qp_rails: (0..qps.len()).map(|i| qp_rail(i, rails)).collect(),
            qps,
            cqs,
            names: ports.iter().map(|p| p.name()).collect(),
            ports,
            peer,
            sock,
            last_check: Instant::now(),
            closed_since: None,
            fault: None,
            wc: vec![sys::ibv_wc::default(); POLL_BATCH],
        }
    }

    fn rails(&self) -> usize {
        self.ports.len()
    }

    fn pds(&self) -> Vec<Arc<PdInner>> {
        self.ports.iter().map(|p| Arc::clone(&p.pd)).collect()
    }

    fn error(&self) -> Option<NetError> {
        self.fault
            .as_ref()
            .map(|f| f.to_error(&self.peer, &self.names))
    }

    fn fail(&mut self, f: Fault) {
        if self.fault.is_none() {
            if !matches!(f, Fault::Tag { .. } | Fault::Truncated { .. }) {
                tracing::warn!(peer = %self.peer, "NET/IB: connection failed: {}", f.to_error(&self.peer, &self.names));
            }
            self.fault = Some(f);
        }
    }

    /// Peeks at the side socket (rate-limited) while requests are pending.
    fn check_peer(&mut self, pending: bool) {
        if !pending || self.fault.is_some() {
            return;
        }
        let now = Instant::now();
        if now.duration_since(self.last_check) < SOCK_CHECK_EVERY {
            return;
        }
        self.last_check = now;
        if self.closed_since.is_none() && crate::oob::peer_closed(&self.sock) {
            self.closed_since = Some(now);
        }
        if self
            .closed_since
            .is_some_and(|t| now.duration_since(t) > CLOSE_GRACE)
        {
            self.fail(Fault::Closed);
        }
    }

    /// Polls one batch of `rail`'s completions into `self.wc`; returns how
    /// many.
    fn poll(&mut self, rail: usize) -> usize {
        match self.cqs[rail].poll(&mut self.wc) {
            Ok(n) => n,
            Err(e) => {
                self.fail(Fault::from_verbs(&e));
                0
            }
        }
    }

    /// The QP of `rail` numbered `qpn` (QP numbers are per device).
    fn qp_index(&self, rail: usize, qpn: u32) -> Option<usize> {
        self.qps
            .iter()
            .zip(&self.qp_rails)
            .position(|(q, &r)| r == rail && q.qpn() == qpn)
    }
}

/// One registration per connection rail (index = rail).
pub(crate) type RailMrs = Vec<Mr>;

/// Registers `start..start+len` for sending with every rail's PD: with
/// local write access when possible (so pages are pinned writable, as NCCL
/// does), else read-only.
fn register_for_send(
    pds: &[Arc<PdInner>],
    start: usize,
    len: usize,
) -> Result<RailMrs, VerbsError> {
    let region = MemRegion::Host { addr: start, len };
    pds.iter()
        .map(|pd| {
            // SAFETY: the caller of isend/reg_mr guarantees the range is
            // mapped and valid until the request completes / dereg_mr; the
            // cache drops the registration no later than that.
            unsafe { Mr::register_region(pd, region, sys::IBV_ACCESS_LOCAL_WRITE) }
                // SAFETY: as above (read-only memory, e.g. a constant).
                .or_else(|_| unsafe { Mr::register_region(pd, region, ACCESS_LOCAL_READ) })
        })
        .collect()
}

fn register_for_recv(
    pds: &[Arc<PdInner>],
    start: usize,
    len: usize,
) -> Result<RailMrs, VerbsError> {
    pds.iter()
        .map(|pd| {
            // SAFETY: as in `register_for_send`; irecv buffers are writable.
            unsafe {
                Mr::register_region(
                    pd,
                    MemRegion::Host { addr: start, len },
                    ACCESS_REMOTE_WRITE,
                )
            }
        })
        .collect()
}

/// Keys of a registration per rail (0 past the rails registered).
fn lkeys(m: Option<&RailMrs>) -> [u32; MAX_RAILS] {
    let mut k = [0; MAX_RAILS];
    for (slot, mr) in k.iter_mut().zip(m.into_iter().flatten()) {
        *slot = mr.lkey();
    }
    k
}

fn rkeys(m: Option<&RailMrs>) -> [u32; MAX_RAILS] {
    let mut k = [0; MAX_RAILS];
    for (slot, mr) in k.iter_mut().zip(m.into_iter().flatten()) {
        *slot = mr.rkey();
    }
    k
}

/// Links `wrs[j]` to `sges[j]` and to `wrs[j + 1]`, stamps `wr_id`, and
/// posts the chain on `qp`.
///
/// # Safety
/// As [`Qp::post_send`]: every SGE must name registered memory valid until
/// the chain's signaled completion is polled.
unsafe fn post_chain(
    qp: &Qp<state::Rts>,
    wrs: &mut [sys::ibv_send_wr],
    sges: &mut [sys::ibv_sge],
    wr_id: u64,
) -> Result<(), VerbsError> {
    debug_assert_eq!(wrs.len(), sges.len());
    let n = wrs.len();
    let wp = wrs.as_mut_ptr();
    let sp = sges.as_mut_ptr();
    for j in 0..n {
        // SAFETY: j < n = wrs.len() = sges.len(); all pointers derive from
        // the two live slices, which outlive the post below.
        unsafe {
            let w = wp.add(j);
            (*w).wr_id = wr_id;
            (*w).sg_list = sp.add(j);
            (*w).next = if j + 1 < n {
                wp.add(j + 1)
            } else {
                std::ptr::null_mut()
            };
        }
    }
    // SAFETY: the chain is linked above; the caller guarantees the memory.
    unsafe { qp.post_send(wp) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(len: usize, nqps: usize) -> Vec<(usize, usize)> {
        let p = split_parts(len, nqps);
        assert!(
            !p.is_empty() && p.len() <= nqps.max(1),
            "{len}/{nqps}: {p:?}"
        );
        let mut off = 0;
        for &(o, l) in &p {
            assert_eq!(o, off, "parts are contiguous");
            assert_eq!(o % PART_ALIGN, 0);
            off += l;
        }
        assert_eq!(off, len);
        assert!(p.len() == 1 || p.iter().all(|&(_, l)| l > 0));
        p
    }

    #[test]
    fn split_over_queue_pairs() {
        assert_eq!(check(0, 4), [(0, 0)]);
        assert_eq!(check(100, 4), [(0, 100)]);
        assert_eq!(check(MIN_PART, 4), [(0, MIN_PART)]);
        assert_eq!(check(MIN_PART + 1, 4).len(), 2);
        assert_eq!(
            check(1 << 20, 4),
            [
                (0, 1 << 18),
                (1 << 18, 1 << 18),
                (2 << 18, 1 << 18),
                (3 << 18, 1 << 18)
            ]
        );
        assert_eq!(check(1 << 20, 1), [(0, 1 << 20)]);
        for len in [
            1,
            7,
            4095,
            4096,
            65_537,
            (1 << 20) + 1,
            3 * MIN_PART - 1,
            10_000_019,
        ] {
            for nqps in [1, 2, 3, 4, 7, 128] {
                check(len, nqps);
            }
        }
    }

    #[test]
    fn queue_depths() {
        // rxe: 8 MiB per work request -> 128 chunks for a 1 GiB message.
        assert_eq!(send_queue_depth(8 << 20), 2 * SLOTS as u32 + 128 + 2);
        assert_eq!(send_queue_depth(1 << 30), 2 * SLOTS as u32 + 1 + 2);
    }

    #[test]
    fn fault_errors() {
        let rails = ["mlx5_0:1".to_owned(), "mlx5_1:1".to_owned()];
        let e = Fault::Completion {
            op: "RDMA write",
            rail: 1,
            status: WcStatus::RETRY_EXC_ERR,
            vendor_err: 0,
        }
        .to_error("10.0.0.2:5000", &rails);
        let s = e.to_string();
        assert!(s.contains("RDMA write on rail 1 (mlx5_1:1)"), "{s}");
        let v = Fault::Verb {
            call: "ibv_post_send",
            errno: libc::ENOMEM,
        }
        .to_error("p", &rails)
        .to_string();
        assert!(v.contains("mlx5_0:1+mlx5_1:1"), "{v}");
        assert!(
            s.contains("10.0.0.2:5000")
                && s.contains("IBV_WC_RETRY_EXC_ERR")
                && s.contains("NCCL_IB_TIMEOUT"),
            "{s}"
        );
        assert!(
            matches!(Fault::Closed.to_error("p", &["d".to_owned()]), NetError::Closed(p) if p == "p")
        );
        assert!(matches!(
            Fault::Tag {
                expected: 1,
                got: 2
            }
            .to_error("p", &["d".to_owned()]),
            NetError::TagMismatch {
                expected: 1,
                got: 2
            }
        ));
        assert!(matches!(
            Fault::Truncated { posted: 1, got: 2 }.to_error("p", &["d".to_owned()]),
            NetError::Truncated { posted: 1, got: 2 }
        ));
    }
}
