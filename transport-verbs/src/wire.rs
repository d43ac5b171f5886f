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
//! | 38 | queue pairs per connection |
//! | 39 | reserved |
//! | 40..42 | LID |
//! | 42..44 | reserved |
//! | 44..60 | GID |
//! | 60..64 | reserved |
//!
//! # Handshake over the side socket
//! connector → listener: greeting (16 bytes: `b"NIBH"`, version, 3 zero
//! bytes, nonce), then its [`Endpoint`]; listener → connector: its
//! `Endpoint`; connector → listener: one byte [`READY`]. An endpoint is
//! [`ENDPOINT_FIXED`] bytes plus 4 per queue pair, so both sides know every
//! length in advance.
//!
//! # Data path records
//! [`Cts`] (64 bytes), written by the receiver into the sender's FIFO, and
//! [`Record`] (32 bytes), written by the sender into the receiver's record
//! array with the final write-with-immediate; see the `comm` module.

use crate::options::MAX_QPS_PER_CONNECTION;
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

/// What the listener tells the connector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerbsHandle {
    /// The side socket.
    pub addr: SocketAddr,
    /// Random bytes the connector must present.
    pub nonce: [u8; 8],
    /// Link layer (1 InfiniBand, 2 Ethernet).
    pub link_layer: u8,
    /// Active MTU (`enum ibv_mtu`).
    pub mtu: u8,
    /// Queue pairs per connection.
    pub nqps: u8,
    /// LID (InfiniBand).
    pub lid: u16,
    /// GID (RoCE).
    pub gid: [u8; 16],
}

impl VerbsHandle {
    /// Encodes per the module docs.
    pub fn encode(&self) -> [u8; HANDLE_BYTES] {
        let mut b = [0u8; HANDLE_BYTES];
        b[0..4].copy_from_slice(MAGIC);
        b[4] = VERSION;
        encode_sockaddr(&self.addr, &mut b);
        b[8..16].copy_from_slice(&self.nonce);
        b[36] = self.link_layer;
        b[37] = self.mtu;
        b[38] = self.nqps;
        b[40..42].copy_from_slice(&self.lid.to_le_bytes());
        b[44..60].copy_from_slice(&self.gid);
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
        let mut nonce = [0u8; 8];
        nonce.copy_from_slice(&b[8..16]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[44..60]);
        Ok(VerbsHandle {
            addr,
            nonce,
            link_layer: b[36],
            mtu: b[37],
            nqps: b[38],
            lid: u16::from_le_bytes([b[40], b[41]]),
            gid,
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
    /// Link layer (1 InfiniBand, 2 Ethernet).
    pub link_layer: u8,
    /// Active MTU (`enum ibv_mtu`).
    pub mtu: u8,
    /// LID.
    pub lid: u16,
    /// GID.
    pub gid: [u8; 16],
    /// First packet sequence number of every QP.
    pub psn: u32,
    /// Sender: its clear-to-send FIFO; receiver: its record array and
    /// bounce buffers. Address the peer writes to…
    pub mem_addr: u64,
    /// …with this key.
    pub mem_rkey: u32,
    /// Slots in the FIFO / record array (must match on both sides).
    pub slots: u32,
    /// Bounce bytes per slot (receiver), 0 for the sender.
    pub bounce_bytes: u32,
    /// QP numbers, one per queue pair.
    pub qpns: Vec<u32>,
}

impl Endpoint {
    /// Encoded size for `nqps` queue pairs.
    pub fn encoded_len(nqps: usize) -> usize {
        ENDPOINT_FIXED + 4 * nqps
    }

    /// Encodes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; Endpoint::encoded_len(self.qpns.len())];
        b[0..4].copy_from_slice(ENDPOINT_MAGIC);
        b[4] = VERSION;
        b[5] = self.link_layer;
        b[6] = self.mtu;
        b[7] = u8::try_from(self.qpns.len()).unwrap_or(u8::MAX);
        b[8..10].copy_from_slice(&self.lid.to_le_bytes());
        b[12..28].copy_from_slice(&self.gid);
        b[28..32].copy_from_slice(&self.psn.to_le_bytes());
        b[32..40].copy_from_slice(&self.mem_addr.to_le_bytes());
        b[40..44].copy_from_slice(&self.mem_rkey.to_le_bytes());
        b[44..46].copy_from_slice(&u16::try_from(self.slots).unwrap_or(u16::MAX).to_le_bytes());
        b[46..48].copy_from_slice(
            &u16::try_from(self.bounce_bytes / 1024)
                .unwrap_or(u16::MAX)
                .to_le_bytes(),
        );
        for (i, q) in self.qpns.iter().enumerate() {
            b[ENDPOINT_FIXED + 4 * i..ENDPOINT_FIXED + 4 * i + 4].copy_from_slice(&q.to_le_bytes());
        }
        b
    }

    /// Decodes an endpoint expected to carry `nqps` queue pairs.
    pub fn decode(b: &[u8], nqps: usize) -> NetResult<Endpoint> {
        let bad = |why: String| Err(NetError::Protocol(format!("bad endpoint from peer: {why}")));
        if b.len() != Endpoint::encoded_len(nqps) {
            return bad(format!("{} bytes for {nqps} QPs", b.len()));
        }
        if &b[0..4] != ENDPOINT_MAGIC || b[4] != VERSION {
            return bad("magic or version".into());
        }
        if usize::from(b[7]) != nqps {
            return bad(format!("{} QPs, expected {nqps}", b[7]));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[12..28]);
        Ok(Endpoint {
            link_layer: b[5],
            mtu: b[6],
            lid: u16::from_le_bytes([b[8], b[9]]),
            gid,
            psn: le32(&b[28..32]),
            mem_addr: le64(&b[32..40]),
            mem_rkey: le32(&b[40..44]),
            slots: u32::from(u16::from_le_bytes([b[44], b[45]])),
            bounce_bytes: u32::from(u16::from_le_bytes([b[46], b[47]])) * 1024,
            qpns: (0..nqps)
                .map(|i| le32(&b[ENDPOINT_FIXED + 4 * i..]))
                .collect(),
        })
    }
}

/// A clear-to-send entry: "message `seq` may be written to `addr` with
/// `rkey`, at most `size` bytes, and must carry `tag`".
///
/// Layout: `seq` (u64) at 0, `addr` (u64) at 8, `rkey` (u32) at 16, `tag`
/// (u32) at 20, `size` (u64) at 24, `slot` (u32) at 32, and `seq` again at
/// 56. The sender polls the last 8 bytes; the entry is complete once both
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
    /// Destination key.
    pub rkey: u32,
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
        b[16..20].copy_from_slice(&self.rkey.to_le_bytes());
        b[20..24].copy_from_slice(&self.tag.to_le_bytes());
        b[24..32].copy_from_slice(&self.size.to_le_bytes());
        b[32..36].copy_from_slice(&self.slot.to_le_bytes());
        b[56..64].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    /// Decodes if the entry is the complete entry for `seq`.
    pub fn decode(b: &[u8; CTS_BYTES], seq: u64) -> Option<Cts> {
        if le64(&b[56..64]) != seq || le64(&b[0..8]) != seq {
            return None;
        }
        Some(Cts {
            seq,
            addr: le64(&b[8..16]),
            rkey: le32(&b[16..20]),
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

    fn handle(addr: &str) -> VerbsHandle {
        VerbsHandle {
            addr: addr.parse().unwrap(),
            nonce: *b"12345678",
            link_layer: 2,
            mtu: 3,
            nqps: 4,
            lid: 0x1234,
            gid: [7; 16],
        }
    }

    #[test]
    fn handle_roundtrip_and_padding() {
        for a in ["10.0.2.15:4791", "[fd00::1]:1", "[fe80::1%2]:9"] {
            let h = handle(a);
            let b = h.encode();
            assert!(b.len() <= nccl_net::MAX_HANDLE_BYTES);
            assert_eq!(VerbsHandle::decode(&b).unwrap(), h);
            let mut padded = [0u8; nccl_net::MAX_HANDLE_BYTES];
            padded[..HANDLE_BYTES].copy_from_slice(&b);
            assert_eq!(VerbsHandle::decode(&padded).unwrap(), h);
        }
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
        assert_eq!(handle("[fe80::1%2]:9").encode()[..], want[..]);
    }

    #[test]
    fn handle_rejects_garbage() {
        let good = handle("10.0.0.1:80").encode();
        let bad = |b: &[u8]| matches!(VerbsHandle::decode(b), Err(NetError::BadHandle(_)));
        assert!(bad(&good[..HANDLE_BYTES - 1]));
        for (i, v) in [(0, b'X'), (4, 9), (5, 5), (38, 0)] {
            let mut b = good;
            b[i] = v;
            assert!(bad(&b), "byte {i} = {v}");
        }
        let mut b = good;
        b[6] = 0;
        b[7] = 0;
        assert!(bad(&b));
        // A TCP transport handle is refused.
        let mut tcp = [0u8; 64];
        tcp[0..4].copy_from_slice(b"NTCP");
        assert!(bad(&tcp));
        assert_eq!(&handle("10.0.0.1:80").hello()[..5], b"NIBH\x01");
    }

    #[test]
    fn endpoint_roundtrip() {
        let e = Endpoint {
            link_layer: 2,
            mtu: 5,
            lid: 0,
            gid: [0xab; 16],
            psn: 0x00ab_cdef,
            mem_addr: 0x7fff_0000_1000,
            mem_rkey: 0xdead_beef,
            slots: 32,
            bounce_bytes: 64 << 10,
            qpns: vec![0x11, 0x22, 0x33],
        };
        let b = e.encode();
        assert_eq!(b.len(), Endpoint::encoded_len(3));
        assert_eq!(Endpoint::decode(&b, 3).unwrap(), e);
        assert!(Endpoint::decode(&b, 2).is_err());
        let mut c = b.clone();
        c[0] = 0;
        assert!(Endpoint::decode(&c, 3).is_err());
    }

    #[test]
    fn cts_needs_both_sequence_copies() {
        let c = Cts {
            seq: 5,
            addr: 0x1000,
            rkey: 9,
            tag: 77,
            size: 4096,
            slot: 4,
        };
        let b = c.encode();
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
