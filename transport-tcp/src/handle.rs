//! The connection handle and the connection greeting.
//!
//! # Handle (40 bytes, all integers big-endian)
//! | bytes  | field |
//! |--------|-------|
//! | 0..4   | magic `b"NTCP"` |
//! | 4      | format version, [`HANDLE_VERSION`] |
//! | 5..8   | listening address family and port ([`nccl_net::encode_sockaddr`]) |
//! | 8..16  | nonce: 8 random bytes drawn by the listener |
//! | 16..36 | listening IP address and IPv6 scope id (same codec) |
//! | 36     | data sockets per connection (`nsocks`, 1..=[`MAX_SOCKS`]) |
//! | 37..40 | reserved, zero |
//!
//! Decoding accepts longer input (a bootstrap may zero-pad to
//! [`nccl_net::MAX_HANDLE_BYTES`]) and rejects unknown versions.
//!
//! # Greeting (16 bytes)
//! A connection is one TCP socket if `nsocks` is 1, else `nsocks` data
//! sockets plus a control socket (see the `stripe` module). Right after
//! each socket is established, the connecting side writes `b"NTCP"`, the
//! version byte, the socket's index (0 for the control socket, 1..=nsocks
//! for data sockets), `nsocks`, one zero byte and the nonce. The listener
//! only takes a socket presenting its nonce, its `nsocks` and an index it
//! does not hold yet; once it holds them all it turns them into a receive
//! comm. The connecting side
//! always uses the listener's socket count (from the handle), so the two
//! sides agree however each was configured (as NCCL, which makes the send
//! side follow the receive side).

use nccl_net::{decode_sockaddr, encode_sockaddr, NetError, NetResult};
use std::net::SocketAddr;

/// Size of an encoded handle.
pub const HANDLE_BYTES: usize = 40;
/// Current handle and greeting format version (2: several sockets per
/// connection, socket index and count in the greeting; 3: 16-byte message
/// headers and 64-byte units on the data stream, see the `wire` module).
pub const HANDLE_VERSION: u8 = 3;
/// Most data sockets one connection may use (as NCCL's `MAX_SOCKETS`).
pub const MAX_SOCKS: usize = 64;
/// Size of the greeting a connector sends.
pub const HELLO_BYTES: usize = 16;
const MAGIC: &[u8; 4] = b"NTCP";

/// What a listener tells the connecting side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpHandle {
    /// Where the listener listens.
    pub addr: SocketAddr,
    /// Random bytes the connector must present.
    pub nonce: [u8; 8],
    /// Data sockets per connection, 1..=[`MAX_SOCKS`].
    pub nsocks: u8,
}

impl TcpHandle {
    /// Encodes the handle (see the module docs for the layout).
    pub fn encode(&self) -> [u8; HANDLE_BYTES] {
        let mut b = [0u8; HANDLE_BYTES];
        b[0..4].copy_from_slice(MAGIC);
        b[4] = HANDLE_VERSION;
        encode_sockaddr(&self.addr, &mut b);
        b[8..16].copy_from_slice(&self.nonce);
        b[36] = self.nsocks;
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
        Ok(TcpHandle {
            addr,
            nonce,
            nsocks,
        })
    }

    /// The greeting on socket 0 (the control socket) of a connection to
    /// this handle.
    pub fn hello(&self) -> [u8; HELLO_BYTES] {
        self.hello_for(0)
    }

    /// The greeting on socket `index` of a connection to this handle.
    pub fn hello_for(&self, index: u8) -> [u8; HELLO_BYTES] {
        let mut h = [0u8; HELLO_BYTES];
        h[0..4].copy_from_slice(MAGIC);
        h[4] = HANDLE_VERSION;
        h[5] = index;
        h[6] = self.nsocks;
        h[8..16].copy_from_slice(&self.nonce);
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_v4_v6() {
        for addr in ["127.0.0.1:4242", "[fd00::2]:65535", "[::1]:1"] {
            let h = TcpHandle {
                addr: addr.parse().unwrap(),
                nonce: [1, 2, 3, 4, 5, 6, 7, 8],
                nsocks: 1,
            };
            let b = h.encode();
            assert!(b.len() <= nccl_net::MAX_HANDLE_BYTES);
            assert_eq!(TcpHandle::decode(&b).unwrap(), h);
            // Zero padding to the maximum handle size is accepted.
            let mut padded = [0u8; nccl_net::MAX_HANDLE_BYTES];
            padded[..HANDLE_BYTES].copy_from_slice(&b);
            assert_eq!(TcpHandle::decode(&padded).unwrap(), h);
        }
    }

    #[test]
    fn rejects_bad_handles() {
        let h = TcpHandle {
            addr: "10.0.0.1:80".parse().unwrap(),
            nonce: [9; 8],
            nsocks: 2,
        };
        let good = h.encode();
        let is_bad = |b: &[u8]| matches!(TcpHandle::decode(b), Err(NetError::BadHandle(_)));
        assert!(is_bad(&good[..HANDLE_BYTES - 1]));
        assert!(is_bad(&[]));
        let mut b = good;
        b[0] = b'X';
        assert!(is_bad(&b));
        let mut b = good;
        b[4] = 1;
        assert!(is_bad(&b));
        let mut b = good;
        b[5] = 5;
        assert!(is_bad(&b));
        let mut b = good;
        b[6] = 0;
        b[7] = 0;
        assert!(is_bad(&b));
        let mut b = good;
        b[36] = 0;
        assert!(is_bad(&b));
        b[36] = MAX_SOCKS as u8 + 1;
        assert!(is_bad(&b));
    }

    #[test]
    fn handle_layout() {
        let h = TcpHandle {
            addr: "[fe80::1%258]:4660".parse().unwrap(),
            nonce: *b"abcdefgh",
            nsocks: 2,
        };
        let mut want = Vec::new();
        want.extend_from_slice(b"NTCP\x03\x06\x12\x34abcdefgh");
        want.extend_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        want.extend_from_slice(&[0, 0, 1, 2, 2, 0, 0, 0]);
        assert_eq!(h.encode()[..], want[..]);
    }

    #[test]
    fn hello_layout() {
        let h = TcpHandle {
            addr: "10.0.0.1:80".parse().unwrap(),
            nonce: *b"abcdefgh",
            nsocks: 3,
        };
        assert_eq!(&h.hello(), b"NTCP\x03\0\x03\0abcdefgh");
        assert_eq!(&h.hello_for(2), b"NTCP\x03\x02\x03\0abcdefgh");
    }
}
