//! The messages between RAS threads. Frames are a 4-byte little-endian
//! length and the payload; the payload starts with a 4-byte magic that
//! names its kind and version; every decode is bounds-checked (a malformed
//! frame is an error, never a panic).
//! - The heartbeat (`RAS1`): one process's state, sent to every peer
//!   process at each interval.
//! - The telemetry query (`RTQ1`): a serving process asks a peer for its
//!   telemetry (on a client's query, not periodically, so heartbeats stay
//!   small).
//! - The telemetry reply (`RTR1`): the peer's per-communicator, per-peer
//!   counters, answering one query.

use crate::observe::progress::{ProgressSnapshot, WaitKind, WaitRecord};
use crate::observe::telemetry::CommStats;

const MAGIC: &[u8; 4] = b"RAS1";
/// Largest heartbeat accepted.
pub(crate) const MAX_FRAME: usize = 1 << 20;

/// One process's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcState {
    /// The address its RAS thread listens on for peers (its identity).
    pub addr: String,
    /// Process id.
    pub pid: u32,
    /// Host name.
    pub host: String,
    /// Its communicators' records.
    pub comms: Vec<ProgressSnapshot>,
    /// Link errors it saw (connections to peers that failed).
    pub link_errors: Vec<String>,
}

struct W(Vec<u8>);

impl W {
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn str(&mut self, s: &str) {
        let b = &s.as_bytes()[..s.len().min(4096)];
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }
}

struct R<'a>(&'a [u8]);

impl R<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        if self.0.len() < n {
            return Err("heartbeat truncated".into());
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn str(&mut self) -> Result<String, String> {
        let n = self.u32()? as usize;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }
    /// A count of items of at least `min` bytes each that fits what is left.
    fn count(&mut self, min: usize) -> Result<usize, String> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min) > self.0.len() {
            return Err(format!(
                "heartbeat claims {n} items in {} bytes",
                self.0.len()
            ));
        }
        Ok(n)
    }
}

impl ProcState {
    /// The payload of a heartbeat.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = W(Vec::with_capacity(128 + 96 * self.comms.len()));
        w.0.extend_from_slice(MAGIC);
        w.str(&self.addr);
        w.u32(self.pid);
        w.str(&self.host);
        w.u32(self.comms.len() as u32);
        for c in &self.comms {
            w.u64(c.comm_id);
            w.u32(c.rank);
            w.u32(c.nranks);
            w.u64(c.coll_started);
            w.u64(c.coll_done);
            w.str(&c.op);
            w.u64(c.p2p_started);
            w.u64(c.p2p_done);
            match &c.wait {
                None => w.0.push(0),
                Some(x) => {
                    w.0.push(x.kind as u8);
                    w.u32(x.peer);
                    w.u32(x.step);
                    w.u32(x.steps);
                    w.u64(x.ms);
                }
            }
            match &c.error {
                None => w.0.push(0),
                Some(e) => {
                    w.0.push(1);
                    w.str(e);
                }
            }
        }
        w.u32(self.link_errors.len() as u32);
        for e in &self.link_errors {
            w.str(e);
        }
        w.0
    }

    /// Parses [`ProcState::encode`]'s bytes.
    pub fn decode(b: &[u8]) -> Result<ProcState, String> {
        let mut r = R(b);
        if r.take(4)? != MAGIC {
            return Err("not a RAS heartbeat".into());
        }
        let addr = r.str()?;
        let pid = r.u32()?;
        let host = r.str()?;
        let n = r.count(50)?;
        let mut comms = Vec::with_capacity(n);
        for _ in 0..n {
            let comm_id = r.u64()?;
            let rank = r.u32()?;
            let nranks = r.u32()?;
            let coll_started = r.u64()?;
            let coll_done = r.u64()?;
            let op = r.str()?;
            let p2p_started = r.u64()?;
            let p2p_done = r.u64()?;
            let wait = match r.u8()? {
                0 => None,
                k => Some(WaitRecord {
                    kind: WaitKind::from_code(k as u64)
                        .ok_or_else(|| format!("unknown wait kind {k}"))?,
                    peer: r.u32()?,
                    step: r.u32()?,
                    steps: r.u32()?,
                    ms: r.u64()?,
                }),
            };
            let error = match r.u8()? {
                0 => None,
                _ => Some(r.str()?),
            };
            if rank >= nranks {
                return Err(format!("rank {rank} of {nranks}"));
            }
            comms.push(ProgressSnapshot {
                comm_id,
                rank,
                nranks,
                coll_started,
                coll_done,
                op,
                p2p_started,
                p2p_done,
                wait,
                error,
            });
        }
        let n = r.count(4)?;
        let link_errors = (0..n).map(|_| r.str()).collect::<Result<_, _>>()?;
        if !r.0.is_empty() {
            return Err(format!("{} bytes after the heartbeat", r.0.len()));
        }
        Ok(ProcState {
            addr,
            pid,
            host,
            comms,
            link_errors,
        })
    }
}

const QUERY_MAGIC: &[u8; 4] = b"RTQ1";
const REPLY_MAGIC: &[u8; 4] = b"RTR1";
/// Bytes of one peer's entry in a telemetry reply.
const PEER_BYTES: usize = 4 + 12 * 8;
/// Bytes of a communicator's entry before its peers.
const COMM_BYTES: usize = 8 + 4 + 4 + 4;

/// A serving process asks a peer process for its telemetry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TelemetryQuery {
    /// Matches the reply to the query.
    pub id: u64,
    /// The asking process's RAS address (where the reply goes).
    pub from: String,
}

/// One peer of one rank, as a telemetry reply carries it (see
/// [`crate::observe::telemetry::PeerStats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerTelemetry {
    /// The peer's rank.
    pub peer: u32,
    /// Payload bytes sent to the peer.
    pub bytes_sent: u64,
    /// Payload bytes received from the peer.
    pub bytes_recv: u64,
    /// Payload messages sent to the peer.
    pub msgs_sent: u64,
    /// Payload messages received from the peer.
    pub msgs_recv: u64,
    /// Nanoseconds spent idle waiting for the peer's data.
    pub recv_wait_ns: u64,
    /// Nanoseconds spent idle waiting for the peer to take a send.
    pub send_wait_ns: u64,
    /// Errors by kind: socket or verbs failures.
    pub io_errors: u64,
    /// Errors by kind: malformed or mismatched messages.
    pub protocol_errors: u64,
    /// Errors by kind: operations that timed out on this peer.
    pub timeout_errors: u64,
    /// Errors by kind: anything else.
    pub other_errors: u64,
    /// Retransmitted segments or packets on the connections with the peer.
    pub retransmits: u64,
    /// Bytes moved straight through shared buffers (zero-copy path),
    /// read and written.
    pub direct_bytes: u64,
}

impl PeerTelemetry {
    /// All errors, every kind.
    pub fn errors(&self) -> u64 {
        self.io_errors
            .saturating_add(self.protocol_errors)
            .saturating_add(self.timeout_errors)
            .saturating_add(self.other_errors)
    }
}

/// One rank's telemetry of one communicator: its peers with anything
/// counted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommTelemetry {
    /// The communicator's id.
    pub comm_id: u64,
    /// The rank.
    pub rank: u32,
    /// Ranks of the communicator.
    pub nranks: u32,
    /// Peers with a counter above zero, by rank.
    pub peers: Vec<PeerTelemetry>,
}

impl CommTelemetry {
    /// The wire form of a snapshot (peers with nothing counted left out).
    pub fn of(s: &CommStats) -> CommTelemetry {
        let ns = |d: std::time::Duration| d.as_nanos().min(u64::MAX as u128) as u64;
        CommTelemetry {
            comm_id: s.comm,
            rank: s.rank as u32,
            nranks: s.nranks as u32,
            peers: s
                .peers
                .iter()
                .filter(|p| p.peer != s.rank && !p.is_zero())
                .map(|p| PeerTelemetry {
                    peer: p.peer as u32,
                    bytes_sent: p.bytes_sent,
                    bytes_recv: p.bytes_recv,
                    msgs_sent: p.msgs_sent,
                    msgs_recv: p.msgs_recv,
                    recv_wait_ns: ns(p.recv_wait),
                    send_wait_ns: ns(p.send_wait),
                    io_errors: p.errors.io,
                    protocol_errors: p.errors.protocol,
                    timeout_errors: p.errors.timeout,
                    other_errors: p.errors.other,
                    retransmits: p.retransmits,
                    direct_bytes: p.direct_bytes_read.saturating_add(p.direct_bytes_written),
                })
                .collect(),
        }
    }
}

/// A peer process's answer to a [`TelemetryQuery`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TelemetryReply {
    /// The query's id.
    pub id: u64,
    /// The answering process's RAS address.
    pub addr: String,
    /// Its ranks' telemetry.
    pub comms: Vec<CommTelemetry>,
    /// Communicators were left out to fit a frame.
    pub truncated: bool,
}

/// Any frame's payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// A heartbeat.
    Heartbeat(ProcState),
    /// A telemetry query.
    Query(TelemetryQuery),
    /// A telemetry reply.
    Reply(TelemetryReply),
}

impl Frame {
    /// Parses a frame's payload by its magic.
    pub fn decode(b: &[u8]) -> Result<Frame, String> {
        match b.get(..4) {
            Some(m) if m == MAGIC => ProcState::decode(b).map(Frame::Heartbeat),
            Some(m) if m == QUERY_MAGIC => TelemetryQuery::decode(b).map(Frame::Query),
            Some(m) if m == REPLY_MAGIC => TelemetryReply::decode(b).map(Frame::Reply),
            Some(m) => Err(format!("unknown RAS message {m:02x?}")),
            None => Err("RAS message truncated".into()),
        }
    }
}

/// `payload` with its 4-byte length in front.
pub fn framed(payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(4 + payload.len());
    f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    f.extend_from_slice(payload);
    f
}

impl TelemetryQuery {
    /// The payload of a query.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = W(Vec::with_capacity(32 + self.from.len()));
        w.0.extend_from_slice(QUERY_MAGIC);
        w.u64(self.id);
        w.str(&self.from);
        w.0
    }

    /// Parses [`TelemetryQuery::encode`]'s bytes.
    pub fn decode(b: &[u8]) -> Result<TelemetryQuery, String> {
        let mut r = R(b);
        if r.take(4)? != QUERY_MAGIC {
            return Err("not a RAS telemetry query".into());
        }
        let id = r.u64()?;
        let from = r.str()?;
        if !r.0.is_empty() {
            return Err(format!("{} bytes after the telemetry query", r.0.len()));
        }
        Ok(TelemetryQuery { id, from })
    }
}

impl TelemetryReply {
    /// The payload of a reply: at most [`MAX_FRAME`] bytes (communicators
    /// that do not fit are left out, and `truncated` set).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = W(Vec::with_capacity(64));
        w.0.extend_from_slice(REPLY_MAGIC);
        w.u64(self.id);
        w.str(&self.addr);
        let head = w.0.len();
        let room = MAX_FRAME - head - 4 - 1;
        let mut used = 0usize;
        let fit: Vec<&CommTelemetry> = self
            .comms
            .iter()
            .take_while(|c| {
                used += COMM_BYTES + PEER_BYTES * c.peers.len();
                used <= room
            })
            .collect();
        w.u32(fit.len() as u32);
        for c in &fit {
            w.u64(c.comm_id);
            w.u32(c.rank);
            w.u32(c.nranks);
            w.u32(c.peers.len() as u32);
            for p in &c.peers {
                w.u32(p.peer);
                for v in [
                    p.bytes_sent,
                    p.bytes_recv,
                    p.msgs_sent,
                    p.msgs_recv,
                    p.recv_wait_ns,
                    p.send_wait_ns,
                    p.io_errors,
                    p.protocol_errors,
                    p.timeout_errors,
                    p.other_errors,
                    p.retransmits,
                    p.direct_bytes,
                ] {
                    w.u64(v);
                }
            }
        }
        w.0.push(u8::from(self.truncated || fit.len() < self.comms.len()));
        w.0
    }

    /// Parses [`TelemetryReply::encode`]'s bytes.
    pub fn decode(b: &[u8]) -> Result<TelemetryReply, String> {
        let mut r = R(b);
        if r.take(4)? != REPLY_MAGIC {
            return Err("not a RAS telemetry reply".into());
        }
        let id = r.u64()?;
        let addr = r.str()?;
        let n = r.count(COMM_BYTES)?;
        let mut comms = Vec::with_capacity(n);
        for _ in 0..n {
            let comm_id = r.u64()?;
            let rank = r.u32()?;
            let nranks = r.u32()?;
            if rank >= nranks {
                return Err(format!("rank {rank} of {nranks}"));
            }
            let m = r.count(PEER_BYTES)?;
            let mut peers = Vec::with_capacity(m);
            for _ in 0..m {
                let peer = r.u32()?;
                if peer >= nranks {
                    return Err(format!("peer {peer} of {nranks}"));
                }
                let mut v = [0u64; 12];
                for x in &mut v {
                    *x = r.u64()?;
                }
                peers.push(PeerTelemetry {
                    peer,
                    bytes_sent: v[0],
                    bytes_recv: v[1],
                    msgs_sent: v[2],
                    msgs_recv: v[3],
                    recv_wait_ns: v[4],
                    send_wait_ns: v[5],
                    io_errors: v[6],
                    protocol_errors: v[7],
                    timeout_errors: v[8],
                    other_errors: v[9],
                    retransmits: v[10],
                    direct_bytes: v[11],
                });
            }
            comms.push(CommTelemetry {
                comm_id,
                rank,
                nranks,
                peers,
            });
        }
        let truncated = match r.u8()? {
            0 => false,
            1 => true,
            x => return Err(format!("telemetry reply flag {x}")),
        };
        if !r.0.is_empty() {
            return Err(format!("{} bytes after the telemetry reply", r.0.len()));
        }
        Ok(TelemetryReply {
            id,
            addr,
            comms,
            truncated,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> ProcState {
        ProcState {
            addr: "10.0.0.1:4000".into(),
            pid: 42,
            host: "h0".into(),
            comms: vec![
                ProgressSnapshot {
                    comm_id: 0xabc,
                    rank: 1,
                    nranks: 4,
                    coll_started: 9,
                    coll_done: 8,
                    op: "AllReduce".into(),
                    p2p_started: 2,
                    p2p_done: 2,
                    wait: Some(WaitRecord {
                        peer: 0,
                        kind: WaitKind::Send,
                        step: 5,
                        steps: 12,
                        ms: 1500,
                    }),
                    error: None,
                },
                ProgressSnapshot {
                    comm_id: 0xdef,
                    rank: 0,
                    nranks: 2,
                    coll_started: 0,
                    coll_done: 0,
                    op: String::new(),
                    p2p_started: 0,
                    p2p_done: 0,
                    wait: None,
                    error: Some("rank 0: connection reset".into()),
                },
            ],
            link_errors: vec!["10.0.0.2:5000: connection refused".into()],
        }
    }

    #[test]
    fn heartbeat_round_trips() {
        let s = sample();
        assert_eq!(ProcState::decode(&s.encode()).unwrap(), s);
    }

    #[test]
    fn malformed_heartbeats_are_errors() {
        let b = sample().encode();
        for n in 0..b.len() {
            assert!(ProcState::decode(&b[..n]).is_err(), "prefix of {n} bytes");
        }
        let mut extra = b.clone();
        extra.push(0);
        assert!(ProcState::decode(&extra).is_err());
        let mut huge = b"RAS1".to_vec();
        huge.extend_from_slice(&0u32.to_le_bytes());
        huge.extend_from_slice(&1u32.to_le_bytes());
        huge.extend_from_slice(&0u32.to_le_bytes());
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            ProcState::decode(&huge).unwrap_err(),
            "heartbeat claims 4294967295 items in 0 bytes"
        );
    }

    pub(crate) fn sample_reply() -> TelemetryReply {
        let p = |peer, k: u64| PeerTelemetry {
            peer,
            bytes_sent: 1000 * k,
            bytes_recv: 2000 * k,
            msgs_sent: k,
            msgs_recv: 2 * k,
            recv_wait_ns: 7,
            send_wait_ns: 8,
            io_errors: 1,
            protocol_errors: 2,
            timeout_errors: 3,
            other_errors: 4,
            retransmits: 5 * k,
            direct_bytes: 9,
        };
        TelemetryReply {
            id: 0x1234_5678_9abc,
            addr: "10.0.0.2:4000".into(),
            comms: vec![
                CommTelemetry {
                    comm_id: 0xabc,
                    rank: 1,
                    nranks: 4,
                    peers: vec![p(0, 1), p(2, 3)],
                },
                CommTelemetry {
                    comm_id: 0xdef,
                    rank: 0,
                    nranks: 2,
                    peers: vec![],
                },
            ],
            truncated: false,
        }
    }

    #[test]
    fn telemetry_messages_round_trip_and_dispatch_by_magic() {
        let q = TelemetryQuery {
            id: 77,
            from: "10.0.0.1:4000".into(),
        };
        assert_eq!(TelemetryQuery::decode(&q.encode()).unwrap(), q);
        let r = sample_reply();
        assert_eq!(TelemetryReply::decode(&r.encode()).unwrap(), r);
        assert_eq!(Frame::decode(&q.encode()).unwrap(), Frame::Query(q));
        assert_eq!(Frame::decode(&r.encode()).unwrap(), Frame::Reply(r));
        let s = sample();
        assert_eq!(Frame::decode(&s.encode()).unwrap(), Frame::Heartbeat(s));
        assert_eq!(
            Frame::decode(b"RTX1....").unwrap_err(),
            "unknown RAS message [52, 54, 58, 31]"
        );
        assert_eq!(Frame::decode(b"RT").unwrap_err(), "RAS message truncated");
        let f = framed(b"abc");
        assert_eq!(f, [3, 0, 0, 0, b'a', b'b', b'c']);
    }

    #[test]
    fn malformed_telemetry_messages_are_errors() {
        for b in [
            TelemetryQuery {
                id: 1,
                from: "a:1".into(),
            }
            .encode(),
            sample_reply().encode(),
        ] {
            for n in 0..b.len() {
                assert!(Frame::decode(&b[..n]).is_err(), "prefix of {n} bytes");
            }
            let mut extra = b.clone();
            extra.push(0);
            assert!(Frame::decode(&extra).is_err());
        }
        // A bad flag byte, a peer out of range, a rank out of range, a
        // count larger than the bytes left.
        let mut b = sample_reply().encode();
        *b.last_mut().unwrap() = 2;
        assert_eq!(
            TelemetryReply::decode(&b).unwrap_err(),
            "telemetry reply flag 2"
        );
        let mut r = sample_reply();
        r.comms[0].peers[1].peer = 4;
        assert_eq!(
            TelemetryReply::decode(&r.encode()).unwrap_err(),
            "peer 4 of 4"
        );
        let mut r = sample_reply();
        r.comms[1].rank = 2;
        assert_eq!(
            TelemetryReply::decode(&r.encode()).unwrap_err(),
            "rank 2 of 2"
        );
        let mut huge = b"RTR1".to_vec();
        huge.extend_from_slice(&1u64.to_le_bytes());
        huge.extend_from_slice(&0u32.to_le_bytes());
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            TelemetryReply::decode(&huge).unwrap_err(),
            "heartbeat claims 4294967295 items in 0 bytes"
        );
    }

    #[test]
    fn a_reply_too_large_for_a_frame_is_cut_and_flagged() {
        let peers = vec![PeerTelemetry::default(); 4000];
        let c = CommTelemetry {
            comm_id: 1,
            rank: 0,
            nranks: 4000,
            peers,
        };
        let r = TelemetryReply {
            id: 1,
            addr: "a:1".into(),
            comms: vec![c.clone(), c.clone(), c.clone()],
            truncated: false,
        };
        let b = r.encode();
        assert!(b.len() <= MAX_FRAME, "{} bytes", b.len());
        let back = TelemetryReply::decode(&b).unwrap();
        assert_eq!(back.comms.len(), 2);
        assert!(back.truncated);
    }
}
