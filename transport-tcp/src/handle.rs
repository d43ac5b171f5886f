//! The connection handle and the connection greeting.
//!
//! # Handle (40 + 22 × (rails − 1) bytes, all integers big-endian)
//! | bytes  | field |
//! |--------|-------|
//! | 0..4   | magic `b"NTCP"` |
//! | 4      | format version, [`HANDLE_VERSION`] |
//! | 5..8   | rail 0: listening address family and port ([`nccl_net::encode_sockaddr`]) |
//! | 8..16  | nonce: 8 random bytes drawn by the listener |
//! | 16..36 | rail 0: listening IP address and IPv6 scope id (same codec) |
//! | 36     | data sockets per connection asked for (`nsocks`, 1..=[`MAX_SOCKS`]) |
//! | 37     | rails, 1..=[`MAX_RAILS`] |
//! | 38..40 | reserved, zero |
//! | 40 + 22 (i − 1) .. | rail i ≥ 1: port (2 bytes), IP address (16) and scope id (4), in rail 0's family ([`RAIL_BYTES`]) |
//!
//! Decoding accepts longer input (a bootstrap may zero-pad to
//! [`nccl_net::MAX_HANDLE_BYTES`]) and rejects unknown versions. A handle
//! holds [`MAX_RAILS`] = 5 rails within [`nccl_net::MAX_HANDLE_BYTES`].
//!
//! # Greeting (16 bytes)
//! A connection is one TCP socket if it has one data socket, else `n` data
//! sockets plus a control socket (see the `stripe` module), spread over
//! `r` rails (see [`crate::rails`]). Right after
//! each socket is established, the connecting side writes `b"NTCP"`, the
//! version byte, the socket's index (0 for the control socket, 1..=n
//! for data sockets), `n`, `r` and the nonce. The connecting side picks `r`
//! from both ends' rail counts and `n` from the listener's `nsocks`
//! ([`crate::rails::connection_nsocks`]), so the two sides agree however
//! each was configured (as NCCL, which makes the send side follow the
//! receive side). The listener only takes a socket presenting its nonce,
//! an `n` that follows from its `nsocks` and the `r` presented, the same
//! `n` and `r` as the connection's other sockets, and an index it does not
//! hold yet; once it holds them all it turns them into a receive comm.

use nccl_net::{decode_sockaddr, encode_sockaddr, NetError, NetResult, SOCKADDR_END};
use std::net::SocketAddr;

/// Size of an encoded one-rail handle, and of the fixed part of any.
pub const HANDLE_BYTES: usize = 40;
/// Size of each rail after rail 0 in a handle.
pub const RAIL_BYTES: usize = 22;
/// Most rails a handle carries: as many as fit in
/// [`nccl_net::MAX_HANDLE_BYTES`].
pub const MAX_RAILS: usize = 1 + (nccl_net::MAX_HANDLE_BYTES - HANDLE_BYTES) / RAIL_BYTES;
/// Current handle and greeting format version (2: several sockets per
/// connection, socket index and count in the greeting; 3: 16-byte message
/// headers and 64-byte units on the data stream, see the `wire` module;
/// 4: one listening address per rail, the rail count in the greeting).
pub const HANDLE_VERSION: u8 = 4;
/// Most data sockets one connection may use (as NCCL's `MAX_SOCKETS`).
pub const MAX_SOCKS: usize = 64;
/// Size of the greeting a connector sends.
pub const HELLO_BYTES: usize = 16;
const MAGIC: &[u8; 4] = b"NTCP";
/// Where rail `i ≥ 1` starts in a handle.
const fn rail_offset(i: usize) -> usize {
    HANDLE_BYTES + RAIL_BYTES * (i - 1)
}
const _: () = assert!(rail_offset(MAX_RAILS + 1) > nccl_net::MAX_HANDLE_BYTES);
const _: () = assert!(rail_offset(MAX_RAILS) <= nccl_net::MAX_HANDLE_BYTES);

/// What a listener tells the connecting side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpHandle {
    /// Where the listener listens on rail 0.
    pub addr: SocketAddr,
    /// Where it listens on rails 1.. (same family as `addr`; at most
    /// [`MAX_RAILS`] − 1 are encoded, others dropped).
    pub more_rails: Vec<SocketAddr>,
    /// Random bytes the connector must present.
    pub nonce: [u8; 8],
    /// Data sockets per connection asked for, 1..=[`MAX_SOCKS`].
    pub nsocks: u8,
}

impl TcpHandle {
    /// A one-rail handle.
    pub fn single(addr: SocketAddr, nonce: [u8; 8], nsocks: u8) -> TcpHandle {
        TcpHandle {
            addr,
            more_rails: Vec::new(),
            nonce,
            nsocks,
        }
    }

    /// The rails [`TcpHandle::encode`] writes: `addr`, then those of
    /// `more_rails` in `addr`'s family, up to [`MAX_RAILS`] in all.
    pub fn rails(&self) -> Vec<SocketAddr> {
        std::iter::once(self.addr)
            .chain(
                self.more_rails
                    .iter()
                    .copied()
                    .filter(|a| a.is_ipv4() == self.addr.is_ipv4()),
            )
            .take(MAX_RAILS)
            .collect()
    }

    /// Encodes the handle (see the module docs for the layout).
    pub fn encode(&self) -> Vec<u8> {
        let rails = self.rails();
        let mut fixed = [0u8; HANDLE_BYTES];
        fixed[0..4].copy_from_slice(MAGIC);
        fixed[4] = HANDLE_VERSION;
        encode_sockaddr(&self.addr, &mut fixed);
        fixed[8..16].copy_from_slice(&self.nonce);
        fixed[36] = self.nsocks;
        // rails.len() is 1..=MAX_RAILS (5).
        fixed[37] = rails.len() as u8;
        let mut b = fixed.to_vec();
        for a in &rails[1..] {
            let mut one = [0u8; SOCKADDR_END];
            encode_sockaddr(a, &mut one);
            b.extend_from_slice(&one[6..8]);
            b.extend_from_slice(&one[16..SOCKADDR_END]);
        }
        b
    }

    /// Decodes a handle produced by [`TcpHandle::encode`].
    pub fn decode(bytes: &[u8]) -> NetResult<TcpHandle> {
        let bad = |why: String| Err(NetError::BadHandle(why));
        if bytes.len() < HANDLE_BYTES {
            return bad(format!("{} bytes, need {HANDLE_BYTES}", bytes.len()));
        }
        if &bytes[0..4] != MAGIC {
            return bad("not a TCP transport handle (bad magic)".into());
        }
        if bytes[4] != HANDLE_VERSION {
            return bad(format!(
                "handle version {} (this build speaks {HANDLE_VERSION})",
                bytes[4]
            ));
        }
        let addr = decode_sockaddr(bytes)?;
        let mut nonce = [0u8; 8];
        nonce.copy_from_slice(&bytes[8..16]);
        let nsocks = bytes[36];
        if nsocks == 0 || usize::from(nsocks) > MAX_SOCKS {
            return bad(format!("nsocks {nsocks} (must be 1..={MAX_SOCKS})"));
        }
        let rails = usize::from(bytes[37]);
        if rails == 0 || rails > MAX_RAILS {
            return bad(format!("{rails} rails (must be 1..={MAX_RAILS})"));
        }
        let need = rail_offset(rails);
        if bytes.len() < need {
            return bad(format!("{} bytes, {rails} rails need {need}", bytes.len()));
        }
        let mut more_rails = Vec::with_capacity(rails - 1);
        for i in 1..rails {
            let at = rail_offset(i);
            let mut one = [0u8; SOCKADDR_END];
            one[5] = bytes[5];
            one[6..8].copy_from_slice(&bytes[at..at + 2]);
            one[16..SOCKADDR_END].copy_from_slice(&bytes[at + 2..at + RAIL_BYTES]);
            more_rails.push(
                decode_sockaddr(&one).map_err(|e| NetError::BadHandle(format!("rail {i}: {e}")))?,
            );
        }
        Ok(TcpHandle {
            addr,
            more_rails,
            nonce,
            nsocks,
        })
    }

    /// The greeting on socket 0 (the control socket) of a one-rail
    /// connection to this handle.
    pub fn hello(&self) -> [u8; HELLO_BYTES] {
        self.hello_for(0)
    }

    /// The greeting on socket `index` of a one-rail connection to this
    /// handle (`nsocks` data sockets).
    pub fn hello_for(&self, index: u8) -> [u8; HELLO_BYTES] {
        self.hello_with(index, self.nsocks, 1)
    }

    /// The greeting on socket `index` of a connection to this handle of
    /// `nsocks` data sockets over `rails` rails.
    pub fn hello_with(&self, index: u8, nsocks: u8, rails: u8) -> [u8; HELLO_BYTES] {
        let mut h = [0u8; HELLO_BYTES];
        h[0..4].copy_from_slice(MAGIC);
        h[4] = HANDLE_VERSION;
        h[5] = index;
        h[6] = nsocks;
        h[7] = rails;
        h[8..16].copy_from_slice(&self.nonce);
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rails(n: usize, v6: bool) -> Vec<SocketAddr> {
        (0..n)
            .map(|i| {
                let s = if v6 {
                    format!("[fd00:{i}::2%{i}]:{}", 1000 + i)
                } else {
                    format!("10.76.{i}.2:{}", 1000 + i)
                };
                s.parse().unwrap()
            })
            .collect()
    }

    #[test]
    fn roundtrip_v4_v6() {
        for addr in ["127.0.0.1:4242", "[fd00::2]:65535", "[::1]:1"] {
            let h = TcpHandle::single(addr.parse().unwrap(), [1, 2, 3, 4, 5, 6, 7, 8], 1);
            let b = h.encode();
            assert_eq!(b.len(), HANDLE_BYTES);
            assert_eq!(TcpHandle::decode(&b).unwrap(), h);
            // Zero padding to the maximum handle size is accepted.
            let mut padded = [0u8; nccl_net::MAX_HANDLE_BYTES];
            padded[..HANDLE_BYTES].copy_from_slice(&b);
            assert_eq!(TcpHandle::decode(&padded).unwrap(), h);
        }
    }

    #[test]
    fn roundtrip_1_to_max_rails() {
        assert_eq!(MAX_RAILS, 5);
        for v6 in [false, true] {
            for n in 1..=MAX_RAILS {
                let all = rails(n, v6);
                let h = TcpHandle {
                    addr: all[0],
                    more_rails: all[1..].to_vec(),
                    nonce: *b"railrail",
                    nsocks: 3,
                };
                let b = h.encode();
                assert_eq!(b.len(), HANDLE_BYTES + RAIL_BYTES * (n - 1), "{n}");
                assert!(b.len() <= nccl_net::MAX_HANDLE_BYTES);
                assert_eq!(b[37], n as u8);
                let d = TcpHandle::decode(&b).unwrap();
                assert_eq!(d, h);
                assert_eq!(d.rails(), all);
                let mut padded = b.clone();
                padded.resize(nccl_net::MAX_HANDLE_BYTES, 0);
                assert_eq!(TcpHandle::decode(&padded).unwrap(), h);
                // One byte short of the last rail.
                assert!(matches!(
                    TcpHandle::decode(&b[..b.len() - 1]),
                    Err(NetError::BadHandle(_))
                ));
            }
        }
    }

    #[test]
    fn encode_keeps_at_most_max_rails_of_rail_0s_family() {
        let mut more = rails(MAX_RAILS + 2, false)[1..].to_vec();
        more.insert(1, "[fd00::9]:9".parse().unwrap());
        let h = TcpHandle {
            addr: "10.76.0.2:1000".parse().unwrap(),
            more_rails: more,
            nonce: [7; 8],
            nsocks: 1,
        };
        let want = rails(MAX_RAILS, false);
        assert_eq!(h.rails(), want);
        let d = TcpHandle::decode(&h.encode()).unwrap();
        assert_eq!(d.rails(), want);
        assert_eq!(h.encode().len(), nccl_net::MAX_HANDLE_BYTES);
    }

    #[test]
    fn rejects_bad_handles() {
        let h = TcpHandle::single("10.0.0.1:80".parse().unwrap(), [9; 8], 2);
        let good = h.encode();
        let is_bad = |b: &[u8]| matches!(TcpHandle::decode(b), Err(NetError::BadHandle(_)));
        assert!(!is_bad(&good));
        assert!(is_bad(&good[..HANDLE_BYTES - 1]));
        assert!(is_bad(&[]));
        let mut b = good.clone();
        b[0] = b'X';
        assert!(is_bad(&b));
        let mut b = good.clone();
        b[4] = 3;
        assert!(is_bad(&b));
        let mut b = good.clone();
        b[5] = 5;
        assert!(is_bad(&b));
        let mut b = good.clone();
        b[6] = 0;
        b[7] = 0;
        assert!(is_bad(&b));
        let mut b = good.clone();
        b[36] = 0;
        assert!(is_bad(&b));
        b[36] = MAX_SOCKS as u8 + 1;
        assert!(is_bad(&b));
        let mut b = good.clone();
        b[37] = 0;
        assert!(is_bad(&b));
        b[37] = MAX_RAILS as u8 + 1;
        b.resize(nccl_net::MAX_HANDLE_BYTES + 64, 0);
        assert!(is_bad(&b));
        // Two rails announced, the second has port 0 (zero padding).
        let mut b = good.clone();
        b[37] = 2;
        b.resize(nccl_net::MAX_HANDLE_BYTES, 0);
        assert!(is_bad(&b));
        // A second IPv4 rail with bytes after its address.
        let two = TcpHandle {
            more_rails: vec!["10.0.1.1:81".parse().unwrap()],
            ..h
        };
        let mut b = two.encode();
        assert!(!is_bad(&b));
        b[HANDLE_BYTES + 2 + 4] = 1;
        assert!(is_bad(&b));
    }

    #[test]
    fn handle_layout() {
        let h = TcpHandle::single("[fe80::1%258]:4660".parse().unwrap(), *b"abcdefgh", 2);
        let mut want = Vec::new();
        want.extend_from_slice(b"NTCP\x04\x06\x12\x34abcdefgh");
        want.extend_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        want.extend_from_slice(&[0, 0, 1, 2, 2, 1, 0, 0]);
        assert_eq!(h.encode()[..], want[..]);
    }

    #[test]
    fn handle_layout_three_rails() {
        let h = TcpHandle {
            addr: "10.76.0.2:4660".parse().unwrap(),
            more_rails: vec![
                "10.76.1.2:4661".parse().unwrap(),
                "10.76.2.2:258".parse().unwrap(),
            ],
            nonce: *b"abcdefgh",
            nsocks: 3,
        };
        let mut want = Vec::new();
        want.extend_from_slice(b"NTCP\x04\x04\x12\x34abcdefgh");
        want.extend_from_slice(&[10, 76, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        want.extend_from_slice(&[0, 0, 0, 0, 3, 3, 0, 0]);
        // Rail 1: port, IPv4 address padded to 16 bytes, scope id.
        want.extend_from_slice(&[0x12, 0x35, 10, 76, 1, 2]);
        want.extend_from_slice(&[0; 16]);
        // Rail 2.
        want.extend_from_slice(&[0x01, 0x02, 10, 76, 2, 2]);
        want.extend_from_slice(&[0; 16]);
        assert_eq!(h.encode(), want);
        let v6 = TcpHandle {
            addr: "[fd00::1]:1".parse().unwrap(),
            more_rails: vec!["[fd01::2%3]:2".parse().unwrap()],
            nonce: *b"abcdefgh",
            nsocks: 1,
        };
        let b = v6.encode();
        let mut rail1 = vec![0, 2, 0xfd, 0x01];
        rail1.extend_from_slice(&[0; 13]);
        rail1.extend_from_slice(&[2, 0, 0, 0, 3]);
        assert_eq!(b[HANDLE_BYTES..], rail1[..]);
        assert_eq!(b[37], 2);
    }

    #[test]
    fn hello_layout() {
        let h = TcpHandle::single("10.0.0.1:80".parse().unwrap(), *b"abcdefgh", 3);
        assert_eq!(&h.hello(), b"NTCP\x04\0\x03\x01abcdefgh");
        assert_eq!(&h.hello_for(2), b"NTCP\x04\x02\x03\x01abcdefgh");
        assert_eq!(&h.hello_with(5, 4, 2), b"NTCP\x04\x05\x04\x02abcdefgh");
    }
}
