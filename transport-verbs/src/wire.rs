//! Byte layouts: the connection handle, the side-socket handshake, and the
//! two small records of the data path (clear-to-send and completion). All
//! integers are little-endian except the side-socket address, which is in
//! network byte order as every handle's address (`nccl_net`'s sockaddr codec).
//!
//! # Handle (64 bytes; at most `nccl_net::MAX_HANDLE_BYTES`)
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `b"NIBV"` |
//! | 4 | version [`VERSION`] |
//! | 5..8 | side-socket address family and port ([`nccl_net::encode_sockaddr`]) |
//! | 8..16 | nonce the connector must present |
//! | 16..36 | side-socket IP and IPv6 scope id (same codec, big-endian) |
//! | 36 | link layer of the listener's port (1 IB, 2 Ethernet) |
//! | 37 | active MTU (`enum ibv_mtu`) |
//! | 38 | queue pairs per connection and rail |
//! | 39 | rails - 1 (0 for one rail) |
//! | 40..42 | LID of rail 0 |
//! | 42..44 | reserved |
//! | 44..60 | GID of rail 0 |
//! | 60..64 | reserved |
//! | 64 + 20·(k-1).. | rail k ≥ 1: link layer, MTU, LID (LE), GID ([`RAIL_BYTES`]) |
//!
//! A one-rail handle is the 64 bytes above (as before rails existed); each
//! extra rail adds 20, so `nccl_net::MAX_HANDLE_BYTES` (128) holds
//! [`MAX_RAILS`] = 4 rails (124 bytes).
//!
//! # Handshake over the side socket
//! connector → listener: greeting (16 bytes: `b"NIBH"`, version, 3 zero
//! bytes, nonce), then its [`Endpoint`]; listener → connector: its
//! `Endpoint`; connector → listener: one byte [`READY`]. An endpoint is
//! [`ENDPOINT_FIXED`] bytes (rail 0's address; byte 10 = rails - 1), 4 per
//! queue pair, and [`RAIL_BYTES`] per extra rail; the connector picks the
//! connection's rail count, the listener learns it from the fixed part.
//!
//! # Data path records
//! [`Cts`] (64 bytes), written by the receiver into the sender's FIFO, and
//! [`Record`] (32 bytes), written by the sender into the receiver's record
//! array with the final write-with-immediate; see the `comm` module.

use crate::options::MAX_QPS_PER_CONNECTION;
use crate::rails::MAX_RAILS;
use nccl_net::{decode_sockaddr, encode_sockaddr, NetError, NetResult};
use std::net::SocketAddr;

/// Handle, greeting and endpoint format version.
pub const VERSION: u8 = 1;
/// Encoded handle size.
pub const HANDLE_BYTES: usize = 64;
/// Greeting size.
pub const HELLO_BYTES: usize = 16;
/// Endpoint size without the QP numbers.
pub const ENDPOINT_FIXED: usize = 48;
/// The connector's last handshake byte.
pub const READY: u8 = 0x5a;
/// Size of a clear-to-send entry.
pub const CTS_BYTES: usize = 64;
// The extra rails' rkeys fit between `slot` and the trailing `seq`.
const _: () = assert!(36 + 4 * (MAX_RAILS - 1) <= CTS_BYTES - 8);
// A handle with every rail fits the trait's limit.
const _: () = assert!(HANDLE_BYTES + RAIL_BYTES * (MAX_RAILS - 1) <= nccl_net::MAX_HANDLE_BYTES);
/// Size of a completion record.
pub const RECORD_BYTES: usize = 32;

const MAGIC: &[u8; 4] = b"NIBV";
const HELLO_MAGIC: &[u8; 4] = b"NIBH";
const ENDPOINT_MAGIC: &[u8; 4] = b"NIBE";

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn le64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// How one rail (port) of a side is addressed: what a queue pair on it
/// needs to reach it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RailAddr {
    /// Link layer (1 InfiniBand, 2 Ethernet).
    pub link_layer: u8,
    /// Active MTU (`enum ibv_mtu`).
    pub mtu: u8,
    /// LID (InfiniBand).
    pub lid: u16,
    /// GID (RoCE).
    pub gid: [u8; 16],
}

impl RailAddr {
    /// Encodes as [`RAIL_BYTES`]: link layer, MTU, LID (LE), GID.
    fn encode_into(&self, b: &mut [u8]) {
        b[0] = self.link_layer;
        b[1] = self.mtu;
        b[2..4].copy_from_slice(&self.lid.to_le_bytes());
        b[4..20].copy_from_slice(&self.gid);
    }

    fn decode_from(b: &[u8]) -> RailAddr {
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[4..20]);
        RailAddr {
            link_layer: b[0],
            mtu: b[1],
            lid: u16::from_le_bytes([b[2], b[3]]),
            gid,
        }
    }
}

/// Bytes of one extra rail's [`RailAddr`] in a handle or an endpoint.
pub const RAIL_BYTES: usize = 20;

/// Encoded handle size for `rails` rails (1..=[`MAX_RAILS`]): 64 bytes for
/// one, [`RAIL_BYTES`] more per extra rail.
pub fn handle_len(rails: usize) -> usize {
    HANDLE_BYTES + RAIL_BYTES * rails.saturating_sub(1)
}

/// What the listener tells the connector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerbsHandle {
    /// The side socket.
    pub addr: SocketAddr,
    /// Random bytes the connector must present.
    pub nonce: [u8; 8],
    /// Queue pairs per connection and rail.
    pub nqps: u8,
    /// The listener's rails, rail 0 first (1..=[`MAX_RAILS`]).
    pub rails: Vec<RailAddr>,
}

impl VerbsHandle {
    /// Encodes per the module docs ([`handle_len`] bytes; rails beyond
    /// [`MAX_RAILS`] are not encoded).
    pub fn encode(&self) -> Vec<u8> {
        let n = self.rails.len().clamp(1, MAX_RAILS);
        let mut head = [0u8; HANDLE_BYTES];
        encode_sockaddr(&self.addr, &mut head);
        let mut b = head.to_vec();
        b.resize(handle_len(n), 0);
        b[0..4].copy_from_slice(MAGIC);
        b[4] = VERSION;
        b[8..16].copy_from_slice(&self.nonce);
        let r0 = self.rails.first().copied().unwrap_or(RailAddr {
            link_layer: 0,
            mtu: 0,
            lid: 0,
            gid: [0; 16],
        });
        b[36] = r0.link_layer;
        b[37] = r0.mtu;
        b[38] = self.nqps;
        b[39] = (n - 1) as u8;
        b[40..42].copy_from_slice(&r0.lid.to_le_bytes());
        b[44..60].copy_from_slice(&r0.gid);
        for (k, r) in self.rails.iter().enumerate().take(n).skip(1) {
            let at = HANDLE_BYTES + RAIL_BYTES * (k - 1);
            r.encode_into(&mut b[at..at + RAIL_BYTES]);
        }
        b
    }

    /// Decodes; accepts trailing padding.
    pub fn decode(b: &[u8]) -> NetResult<VerbsHandle> {
        let bad = |why: String| Err(NetError::BadHandle(why));
        if b.len() < HANDLE_BYTES {
            return bad(format!("{} bytes, need {HANDLE_BYTES}", b.len()));
        }
        if &b[0..4] != MAGIC {
            return bad("not a verbs transport handle (bad magic)".into());
        }
        if b[4] != VERSION {
            return bad(format!(
                "handle version {} (this build speaks {VERSION})",
                b[4]
            ));
        }
        let addr = decode_sockaddr(b)?;
        // The connector creates this many QPs: no more than a listener may ask.
        if b[38] == 0 || usize::from(b[38]) > MAX_QPS_PER_CONNECTION {
            return bad(format!(
                "{} queue pairs (must be 1..={MAX_QPS_PER_CONNECTION})",
                b[38]
            ));
        }
        let nrails = usize::from(b[39]) + 1;
        if nrails > MAX_RAILS {
            return bad(format!("{nrails} rails (at most {MAX_RAILS})"));
        }
        if b.len() < handle_len(nrails) {
            return bad(format!(
                "{} bytes for {nrails} rails, need {}",
                b.len(),
                handle_len(nrails)
            ));
        }
        let mut nonce = [0u8; 8];
        nonce.copy_from_slice(&b[8..16]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[44..60]);
        let mut rails = vec![RailAddr {
            link_layer: b[36],
            mtu: b[37],
            lid: u16::from_le_bytes([b[40], b[41]]),
            gid,
        }];
        for k in 1..nrails {
            let at = HANDLE_BYTES + RAIL_BYTES * (k - 1);
            rails.push(RailAddr::decode_from(&b[at..at + RAIL_BYTES]));
        }
        Ok(VerbsHandle {
            addr,
            nonce,
            nqps: b[38],
            rails,
        })
    }

    /// The greeting a connector to this handle sends.
    pub fn hello(&self) -> [u8; HELLO_BYTES] {
        let mut h = [0u8; HELLO_BYTES];
        h[0..4].copy_from_slice(HELLO_MAGIC);
        h[4] = VERSION;
        h[8..16].copy_from_slice(&self.nonce);
        h
    }
}

/// One side's queue pairs and the memory the peer may write, as exchanged
/// over the side socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The connection's rails as this side uses them, rail 0 first: rail
    /// `r` of the connection is this side's port `r mod (its rail count)`.
    pub rails: Vec<RailAddr>,
    /// First packet sequence number of every QP.
    pub psn: u32,
    /// Sender: its clear-to-send FIFO; receiver: its record array and
    /// bounce buffers. Address the peer writes to (over rail 0)…
    pub mem_addr: u64,
    /// …with this key (rail 0's).
    pub mem_rkey: u32,
    /// Slots in the FIFO / record array (must match on both sides).
    pub slots: u32,
    /// Bounce bytes per slot (receiver), 0 for the sender.
    pub bounce_bytes: u32,
    /// QP numbers in connection order: QP `i` is on rail `i mod rails`
    /// (so `rails × QPs per rail` of them).
    pub qpns: Vec<u32>,
}

impl Endpoint {
    /// Encoded size for `nqps` queue pairs per rail on `rails` rails.
    pub fn encoded_len(nqps: usize, rails: usize) -> usize {
        let rails = rails.max(1);
        ENDPOINT_FIXED + 4 * nqps * rails + RAIL_BYTES * (rails - 1)
    }

    /// Rails announced by the fixed part of an encoded endpoint (byte 10),
    /// so a reader knows the full length; `None` past [`MAX_RAILS`].
    pub fn rails_in(fixed: &[u8]) -> Option<usize> {
        let n = usize::from(*fixed.get(10)?) + 1;
        (n <= MAX_RAILS).then_some(n)
    }

    /// Encodes (rail 0 in the fixed part, byte 10 = rails - 1, extra rails
    /// after the QP numbers).
    pub fn encode(&self) -> Vec<u8> {
        let nrails = self.rails.len().max(1);
        let per_rail = self.qpns.len() / nrails;
        let mut b = vec![0u8; Endpoint::encoded_len(per_rail, nrails)];
        let r0 = self.rails[0];
        b[0..4].copy_from_slice(ENDPOINT_MAGIC);
        b[4] = VERSION;
        b[5] = r0.link_layer;
        b[6] = r0.mtu;
        b[7] = u8::try_from(per_rail).unwrap_or(u8::MAX);
        b[8..10].copy_from_slice(&r0.lid.to_le_bytes());
        b[10] = u8::try_from(nrails - 1).unwrap_or(u8::MAX);
        b[12..28].copy_from_slice(&r0.gid);
        b[28..32].copy_from_slice(&self.psn.to_le_bytes());
        b[32..40].copy_from_slice(&self.mem_addr.to_le_bytes());
        b[40..44].copy_from_slice(&self.mem_rkey.to_le_bytes());
        b[44..46].copy_from_slice(&u16::try_from(self.slots).unwrap_or(u16::MAX).to_le_bytes());
        b[46..48].copy_from_slice(
            &u16::try_from(self.bounce_bytes / 1024)
                .unwrap_or(u16::MAX)
                .to_le_bytes(),
        );
        for (i, q) in self.qpns.iter().take(per_rail * nrails).enumerate() {
            b[ENDPOINT_FIXED + 4 * i..ENDPOINT_FIXED + 4 * i + 4].copy_from_slice(&q.to_le_bytes());
        }
        let tail = ENDPOINT_FIXED + 4 * per_rail * nrails;
        for (k, r) in self.rails.iter().enumerate().skip(1) {
            let at = tail + RAIL_BYTES * (k - 1);
            r.encode_into(&mut b[at..at + RAIL_BYTES]);
        }
        b
    }

    /// Decodes an endpoint expected to carry `nqps` queue pairs per rail on
    /// `rails` rails.
    pub fn decode(b: &[u8], nqps: usize, rails: usize) -> NetResult<Endpoint> {
        let bad = |why: String| Err(NetError::Protocol(format!("bad endpoint from peer: {why}")));
        let rails = rails.max(1);
        if b.len() != Endpoint::encoded_len(nqps, rails) {
            return bad(format!("{} bytes for {nqps} QPs on {rails} rails", b.len()));
        }
        if &b[0..4] != ENDPOINT_MAGIC || b[4] != VERSION {
            return bad("magic or version".into());
        }
        if usize::from(b[7]) != nqps {
            return bad(format!("{} QPs, expected {nqps}", b[7]));
        }
        if usize::from(b[10]) + 1 != rails {
            return bad(format!(
                "{} rails, expected {rails}",
                usize::from(b[10]) + 1
            ));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[12..28]);
        let mut rail_addrs = vec![RailAddr {
            link_layer: b[5],
            mtu: b[6],
            lid: u16::from_le_bytes([b[8], b[9]]),
            gid,
        }];
        let tail = ENDPOINT_FIXED + 4 * nqps * rails;
        for k in 1..rails {
            let at = tail + RAIL_BYTES * (k - 1);
            rail_addrs.push(RailAddr::decode_from(&b[at..at + RAIL_BYTES]));
        }
        Ok(Endpoint {
            rails: rail_addrs,
            psn: le32(&b[28..32]),
            mem_addr: le64(&b[32..40]),
            mem_rkey: le32(&b[40..44]),
            slots: u32::from(u16::from_le_bytes([b[44], b[45]])),
            bounce_bytes: u32::from(u16::from_le_bytes([b[46], b[47]])) * 1024,
            qpns: (0..nqps * rails)
                .map(|i| le32(&b[ENDPOINT_FIXED + 4 * i..]))
                .collect(),
        })
    }
}

/// A clear-to-send entry: "message `seq` may be written to `addr` with
/// `rkey`, at most `size` bytes, and must carry `tag`".
///
/// Layout: `seq` (u64) at 0, `addr` (u64) at 8, rail 0's `rkey` (u32) at
/// 16, `tag` (u32) at 20, `size` (u64) at 24, `slot` (u32) at 32, the rkeys
/// of rails 1..[`MAX_RAILS`] (u32 each) at 36, and `seq` again at 56. (One
/// rail leaves 36..56 zero, as before rails existed.) The sender polls the last 8 bytes; the entry is complete once both
/// copies of `seq` hold the expected value (an RDMA write lands in address
/// order in practice, as NCCL's FIFO also assumes; the leading copy catches
/// a torn read anyway).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cts {
    /// Message sequence number + 1 (0 never appears, so a zeroed slot is
    /// empty).
    pub seq: u64,
    /// Destination address.
    pub addr: u64,
    /// Destination key per connection rail (the buffer is registered with
    /// each rail's device); unused rails are 0.
    pub rkeys: [u32; MAX_RAILS],
    /// Tag of the posted receive.
    pub tag: u32,
    /// Capacity of the posted receive.
    pub size: u64,
    /// FIFO slot (`seq - 1` modulo the slot count), for checking.
    pub slot: u32,
}

impl Cts {
    /// Encodes.
    pub fn encode(&self) -> [u8; CTS_BYTES] {
        let mut b = [0u8; CTS_BYTES];
        b[0..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..16].copy_from_slice(&self.addr.to_le_bytes());
        b[16..20].copy_from_slice(&self.rkeys[0].to_le_bytes());
        b[20..24].copy_from_slice(&self.tag.to_le_bytes());
        b[24..32].copy_from_slice(&self.size.to_le_bytes());
        b[32..36].copy_from_slice(&self.slot.to_le_bytes());
        for (k, r) in self.rkeys.iter().enumerate().skip(1) {
            b[32 + 4 * k..36 + 4 * k].copy_from_slice(&r.to_le_bytes());
        }
        b[56..64].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    /// Decodes if the entry is the complete entry for `seq`.
    pub fn decode(b: &[u8; CTS_BYTES], seq: u64) -> Option<Cts> {
        if le64(&b[56..64]) != seq || le64(&b[0..8]) != seq {
            return None;
        }
        let mut rkeys = [0u32; MAX_RAILS];
        rkeys[0] = le32(&b[16..20]);
        for (k, r) in rkeys.iter_mut().enumerate().skip(1) {
            *r = le32(&b[32 + 4 * k..]);
        }
        Some(Cts {
            seq,
            addr: le64(&b[8..16]),
            rkeys,
            tag: le32(&b[20..24]),
            size: le64(&b[24..32]),
            slot: le32(&b[32..36]),
        })
    }
}

/// What the sender made of a clear-to-send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordStatus {
    /// Payload written.
    Ok = 0,
    /// The send's tag differs from the receive's; no payload.
    TagMismatch = 1,
    /// The send is larger than the receive; no payload.
    Truncated = 2,
}

/// The completion record written with the last write-with-immediate of a
/// message on queue pair 0: `size` (u64) at 0, `tag` (u32) at 8, `status`
/// (u32) at 12, `nparts` (u32) at 16, `seq` (u32, low bits) at 20.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// Bytes the sender sent (or wanted to send).
    pub size: u64,
    /// The sender's tag.
    pub tag: u32,
    /// Outcome.
    pub status: RecordStatus,
    /// Write-with-immediate completions this message produces at the
    /// receiver (one per queue pair used).
    pub nparts: u32,
    /// Low 32 bits of the message sequence number.
    pub seq: u32,
}

impl Record {
    /// Encodes.
    pub fn encode(&self) -> [u8; RECORD_BYTES] {
        let mut b = [0u8; RECORD_BYTES];
        b[0..8].copy_from_slice(&self.size.to_le_bytes());
        b[8..12].copy_from_slice(&self.tag.to_le_bytes());
        b[12..16].copy_from_slice(&(self.status as u32).to_le_bytes());
        b[16..20].copy_from_slice(&self.nparts.to_le_bytes());
        b[20..24].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    /// Whether this is the record of message `seq` (low 32 bits) on a
    /// connection of `nqps` queue pairs: the receiver waits for `nparts`
    /// completions, one per queue pair used, so more than `nqps` never come.
    pub fn fits(&self, seq: u32, nqps: usize) -> bool {
        self.seq == seq && self.nparts >= 1 && usize::try_from(self.nparts).is_ok_and(|n| n <= nqps)
    }

    /// Decodes; `None` for an unknown status.
    pub fn decode(b: &[u8; RECORD_BYTES]) -> Option<Record> {
        let status = match le32(&b[12..16]) {
            0 => RecordStatus::Ok,
            1 => RecordStatus::TagMismatch,
            2 => RecordStatus::Truncated,
            _ => return None,
        };
        Some(Record {
            size: le64(&b[0..8]),
            tag: le32(&b[8..12]),
            status,
            nparts: le32(&b[16..20]),
            seq: le32(&b[20..24]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rail(k: u8) -> RailAddr {
        RailAddr {
            link_layer: 2,
            mtu: 3 + k,
            lid: 0x1234 + u16::from(k),
            gid: [7 + k; 16],
        }
    }

    fn handle_with(addr: &str, rails: usize) -> VerbsHandle {
        VerbsHandle {
            addr: addr.parse().unwrap(),
            nonce: *b"12345678",
            nqps: 4,
            rails: (0..rails as u8).map(rail).collect(),
        }
    }

    fn handle(addr: &str) -> VerbsHandle {
        handle_with(addr, 1)
    }

    #[test]
    fn handle_roundtrip_and_padding() {
        for rails in 1..=MAX_RAILS {
            for a in ["10.0.2.15:4791", "[fd00::1]:1", "[fe80::1%2]:9"] {
                let h = handle_with(a, rails);
                let b = h.encode();
                assert_eq!(b.len(), handle_len(rails));
                assert_eq!(b.len(), 64 + 20 * (rails - 1));
                assert!(b.len() <= nccl_net::MAX_HANDLE_BYTES);
                assert_eq!(VerbsHandle::decode(&b).unwrap(), h);
                let mut padded = [0u8; nccl_net::MAX_HANDLE_BYTES];
                padded[..b.len()].copy_from_slice(&b);
                assert_eq!(VerbsHandle::decode(&padded).unwrap(), h);
                // Cut inside the last rail: refused, not misread.
                if rails > 1 {
                    assert!(matches!(
                        VerbsHandle::decode(&b[..b.len() - 1]),
                        Err(NetError::BadHandle(_))
                    ));
                }
            }
        }
        // More rails than a handle holds: the first MAX_RAILS are encoded.
        let h = handle_with("10.0.0.1:80", MAX_RAILS + 2);
        let d = VerbsHandle::decode(&h.encode()).unwrap();
        assert_eq!(d.rails, h.rails[..MAX_RAILS]);
    }

    #[test]
    fn handle_layout() {
        let mut want = Vec::new();
        want.extend_from_slice(b"NIBV\x01\x06\x00\x0912345678");
        want.extend_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        want.extend_from_slice(&[0, 0, 0, 2]); // scope id, big-endian
        want.extend_from_slice(&[2, 3, 4, 0, 0x34, 0x12, 0, 0]);
        want.extend_from_slice(&[7; 16]);
        want.extend_from_slice(&[0; 4]);
        // One rail: the 64 bytes of a handle from before rails existed.
        assert_eq!(handle("[fe80::1%2]:9").encode()[..], want[..]);
        // Three rails: byte 39 = 2, then 20 bytes per extra rail.
        want[39] = 2;
        want.extend_from_slice(&[2, 4, 0x35, 0x12]);
        want.extend_from_slice(&[8; 16]);
        want.extend_from_slice(&[2, 5, 0x36, 0x12]);
        want.extend_from_slice(&[9; 16]);
        assert_eq!(handle_with("[fe80::1%2]:9", 3).encode()[..], want[..]);
    }

    #[test]
    fn handle_rejects_garbage() {
        let good = handle("10.0.0.1:80").encode();
        let bad = |b: &[u8]| matches!(VerbsHandle::decode(b), Err(NetError::BadHandle(_)));
        assert!(bad(&good[..HANDLE_BYTES - 1]));
        for (i, v) in [(0, b'X'), (4, 9), (5, 5), (38, 0)] {
            let mut b = good.clone();
            b[i] = v;
            assert!(bad(&b), "byte {i} = {v}");
        }
        let mut b = good.clone();
        b[6] = 0;
        b[7] = 0;
        assert!(bad(&b));
        // More rails than a handle holds, or than its bytes carry.
        let mut b = [0u8; nccl_net::MAX_HANDLE_BYTES];
        b[..HANDLE_BYTES].copy_from_slice(&good);
        b[39] = MAX_RAILS as u8;
        assert!(bad(&b), "{} rails", MAX_RAILS + 1);
        let mut b = good.clone();
        b[39] = 1;
        assert!(bad(&b), "two rails in 64 bytes");
        // A TCP transport handle is refused.
        let mut tcp = [0u8; 64];
        tcp[0..4].copy_from_slice(b"NTCP");
        assert!(bad(&tcp));
        assert_eq!(&handle("10.0.0.1:80").hello()[..5], b"NIBH\x01");
    }

    fn endpoint(rails: usize, per_rail: usize) -> Endpoint {
        Endpoint {
            rails: (0..rails as u8).map(rail).collect(),
            psn: 0x00ab_cdef,
            mem_addr: 0x7fff_0000_1000,
            mem_rkey: 0xdead_beef,
            slots: 32,
            bounce_bytes: 64 << 10,
            qpns: (0..(rails * per_rail) as u32)
                .map(|i| 0x11 * (i + 1))
                .collect(),
        }
    }

    #[test]
    fn endpoint_roundtrip() {
        for rails in 1..=MAX_RAILS {
            for per_rail in [1, 3] {
                let e = endpoint(rails, per_rail);
                let b = e.encode();
                assert_eq!(b.len(), Endpoint::encoded_len(per_rail, rails));
                assert_eq!(Endpoint::rails_in(&b[..ENDPOINT_FIXED]), Some(rails));
                assert_eq!(Endpoint::decode(&b, per_rail, rails).unwrap(), e);
                assert!(Endpoint::decode(&b, per_rail + 1, rails).is_err());
                assert!(Endpoint::decode(&b, per_rail, rails + 1).is_err());
                let mut c = b.clone();
                c[0] = 0;
                assert!(Endpoint::decode(&c, per_rail, rails).is_err());
            }
        }
        let mut fixed = [0u8; ENDPOINT_FIXED];
        fixed[10] = MAX_RAILS as u8;
        assert_eq!(Endpoint::rails_in(&fixed), None, "too many rails");
    }

    #[test]
    fn endpoint_layout() {
        let b = endpoint(2, 1).encode();
        let mut want = Vec::new();
        want.extend_from_slice(b"NIBE\x01\x02\x03\x01\x34\x12\x01\x00");
        want.extend_from_slice(&[7; 16]);
        want.extend_from_slice(&[0xef, 0xcd, 0xab, 0]);
        want.extend_from_slice(&0x7fff_0000_1000u64.to_le_bytes());
        want.extend_from_slice(&[0xef, 0xbe, 0xad, 0xde, 32, 0, 64, 0]);
        want.extend_from_slice(&[0x11, 0, 0, 0, 0x22, 0, 0, 0]);
        want.extend_from_slice(&[2, 4, 0x35, 0x12]);
        want.extend_from_slice(&[8; 16]);
        assert_eq!(b, want);
        // One rail: byte 10 is 0 and nothing follows the QP numbers.
        let one = endpoint(1, 2).encode();
        assert_eq!((one[10], one.len()), (0, ENDPOINT_FIXED + 8));
    }

    #[test]
    fn cts_needs_both_sequence_copies() {
        let c = Cts {
            seq: 5,
            addr: 0x1000,
            rkeys: [9, 0x0a0b_0c0d, 11, 12],
            tag: 77,
            size: 4096,
            slot: 4,
        };
        let b = c.encode();
        assert_eq!(b[16..20], [9, 0, 0, 0]);
        assert_eq!(
            b[36..48],
            [0x0d, 0x0c, 0x0b, 0x0a, 11, 0, 0, 0, 12, 0, 0, 0]
        );
        assert_eq!(b[48..56], [0; 8]);
        let one = Cts {
            rkeys: [9, 0, 0, 0],
            ..c
        };
        assert_eq!(one.encode()[36..56], [0; 20], "one rail: as before rails");
        assert_eq!(Cts::decode(&b, 5), Some(c));
        assert_eq!(Cts::decode(&b, 6), None, "stale slot");
        assert_eq!(Cts::decode(&[0; CTS_BYTES], 1), None, "empty slot");
        let mut torn = b;
        torn[0..8].copy_from_slice(&4u64.to_le_bytes());
        assert_eq!(Cts::decode(&torn, 5), None, "torn write");
    }

    #[test]
    fn record_roundtrip() {
        for status in [
            RecordStatus::Ok,
            RecordStatus::TagMismatch,
            RecordStatus::Truncated,
        ] {
            let r = Record {
                size: 1 << 33,
                tag: 3,
                status,
                nparts: 4,
                seq: 99,
            };
            assert_eq!(Record::decode(&r.encode()), Some(r));
        }
        let mut b = [0u8; RECORD_BYTES];
        b[12] = 9;
        assert_eq!(Record::decode(&b), None);
    }

    #[test]
    fn record_parts_are_bounded_by_the_queue_pairs() {
        let r = |nparts, seq| Record {
            size: 8,
            tag: 1,
            status: RecordStatus::Ok,
            nparts,
            seq,
        };
        assert!(r(1, 5).fits(5, 1));
        assert!(r(4, 5).fits(5, 4));
        assert!(!r(4, 6).fits(5, 4), "another message's record");
        assert!(!r(0, 5).fits(5, 4), "no part");
        for hostile in [5, u32::MAX] {
            let rec = Record::decode(&r(hostile, 5).encode()).unwrap();
            assert!(
                !rec.fits(5, 4),
                "{hostile} parts on 4 QPs would never complete"
            );
        }
    }

    #[test]
    fn handle_bounds_the_queue_pairs_a_connector_creates() {
        let mut b = handle("10.0.0.1:80").encode();
        b[38] = MAX_QPS_PER_CONNECTION as u8;
        assert_eq!(
            VerbsHandle::decode(&b).unwrap().nqps as usize,
            MAX_QPS_PER_CONNECTION
        );
        for hostile in [MAX_QPS_PER_CONNECTION as u8 + 1, u8::MAX] {
            b[38] = hostile;
            assert!(
                matches!(VerbsHandle::decode(&b), Err(NetError::BadHandle(_))),
                "{hostile} QPs"
            );
        }
    }
}
