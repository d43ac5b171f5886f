//! The one codec for the listener's socket address in a connection handle.
//!
//! The TCP (`NTCP`) and verbs (`NIBV`) handles both carry the address at
//! the same offsets, between bytes that belong to the transport (magic and
//! version in 0..5, nonce in 8..16). Every field is in network byte order
//! (big-endian), as in a `sockaddr`, so one rule covers all of them:
//!
//! | bytes  | field |
//! |--------|-------|
//! | 5      | address family: 4 or 6 |
//! | 6..8   | port |
//! | 16..32 | IP address: IPv4 in 16..20 (20..32 zero), or IPv6 |
//! | 32..36 | IPv6 scope id (zero for IPv4) |
//!
//! The IPv6 flow label is not carried: a listening address has none.
//! [`decode_sockaddr`] returns an error, never panics, on any input.

use crate::{NetError, NetResult};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// Bytes a handle needs to hold the address (it ends with the scope id).
pub const SOCKADDR_END: usize = 36;

const FAMILY: usize = 5;
const PORT: usize = 6;
const IP: usize = 16;
const SCOPE: usize = 32;

/// Writes `addr` into its bytes of `handle` (see the module docs); the
/// transport's bytes 0..5 and 8..16 are left as they are.
pub fn encode_sockaddr<const N: usize>(addr: &SocketAddr, handle: &mut [u8; N]) {
    const { assert!(N >= SOCKADDR_END, "handle too short for a socket address") };
    handle[PORT..PORT + 2].copy_from_slice(&addr.port().to_be_bytes());
    handle[IP..SOCKADDR_END].fill(0);
    match addr {
        SocketAddr::V4(a) => {
            handle[FAMILY] = 4;
            handle[IP..IP + 4].copy_from_slice(&a.ip().octets());
        }
        SocketAddr::V6(a) => {
            handle[FAMILY] = 6;
            handle[IP..SCOPE].copy_from_slice(&a.ip().octets());
            handle[SCOPE..SOCKADDR_END].copy_from_slice(&a.scope_id().to_be_bytes());
        }
    }
}

/// Reads the address [`encode_sockaddr`] wrote into `handle`. Rejects, as
/// [`NetError::BadHandle`], input shorter than [`SOCKADDR_END`], a family
/// other than 4 or 6, port 0 (nobody listens there), and an IPv4 address
/// with non-zero bytes after it (no encoder writes them).
pub fn decode_sockaddr(handle: &[u8]) -> NetResult<SocketAddr> {
    let bad = |why: String| Err(NetError::BadHandle(why));
    let Some(b) = handle.first_chunk::<SOCKADDR_END>() else {
        return bad(format!(
            "{} bytes, a socket address needs {SOCKADDR_END}",
            handle.len()
        ));
    };
    let port = u16::from_be_bytes([b[PORT], b[PORT + 1]]);
    if port == 0 {
        return bad("port 0".into());
    }
    match b[FAMILY] {
        4 => {
            if b[IP + 4..SOCKADDR_END].iter().any(|&x| x != 0) {
                return bad("IPv4 address with non-zero bytes after it".into());
            }
            let ip = Ipv4Addr::new(b[IP], b[IP + 1], b[IP + 2], b[IP + 3]);
            Ok(SocketAddr::V4(SocketAddrV4::new(ip, port)))
        }
        6 => {
            let mut o = [0u8; 16];
            o.copy_from_slice(&b[IP..SCOPE]);
            let scope = u32::from_be_bytes([b[SCOPE], b[SCOPE + 1], b[SCOPE + 2], b[SCOPE + 3]]);
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(o),
                port,
                0,
                scope,
            )))
        }
        f => bad(format!("address family {f}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_bad(b: &[u8]) -> bool {
        matches!(decode_sockaddr(b), Err(NetError::BadHandle(_)))
    }

    #[test]
    fn ipv4_layout() {
        let mut b = [0xeeu8; SOCKADDR_END];
        encode_sockaddr(&"10.1.2.3:4660".parse().unwrap(), &mut b);
        #[rustfmt::skip]
        let want: [u8; SOCKADDR_END] = [
            0xee, 0xee, 0xee, 0xee, 0xee, // transport's: untouched
            4,                            // family
            0x12, 0x34,                   // port 4660
            0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, // transport's
            10, 1, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // IP
            0, 0, 0, 0,                   // scope id
        ];
        assert_eq!(b, want);
    }

    #[test]
    fn ipv6_with_scope_layout() {
        let ip: Ipv6Addr = "fe80::1:2".parse().unwrap();
        let addr = SocketAddr::V6(SocketAddrV6::new(ip, 0xabcd, 0, 0x0102_0304));
        let mut b = [0u8; 40];
        encode_sockaddr(&addr, &mut b);
        #[rustfmt::skip]
        let want: [u8; 40] = [
            0, 0, 0, 0, 0,
            6,
            0xab, 0xcd,
            0, 0, 0, 0, 0, 0, 0, 0,
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 2,
            1, 2, 3, 4, // scope id, big-endian
            0, 0, 0, 0, // past the address: untouched
        ];
        assert_eq!(b, want);
        assert_eq!(decode_sockaddr(&b).unwrap(), addr);
    }

    #[test]
    fn roundtrips() {
        for a in [
            "127.0.0.1:1",
            "255.255.255.255:65535",
            "[::1]:4242",
            "[fd00::2]:65535",
            "[fe80::1%7]:9",
        ] {
            let addr: SocketAddr = a.parse().unwrap();
            let mut b = [0u8; 64];
            encode_sockaddr(&addr, &mut b);
            assert_eq!(decode_sockaddr(&b).unwrap(), addr, "{a}");
            assert_eq!(decode_sockaddr(&b[..SOCKADDR_END]).unwrap(), addr, "{a}");
        }
        // The scope id's full range survives.
        let ip = Ipv6Addr::LOCALHOST;
        let addr = SocketAddr::V6(SocketAddrV6::new(ip, 1, 0, u32::MAX));
        let mut b = [0u8; SOCKADDR_END];
        encode_sockaddr(&addr, &mut b);
        assert_eq!(decode_sockaddr(&b).unwrap(), addr);
    }

    #[test]
    fn reencoding_over_a_v6_address_clears_it() {
        let mut b = [0u8; SOCKADDR_END];
        encode_sockaddr(&"[fe80::1%3]:9".parse().unwrap(), &mut b);
        let v4: SocketAddr = "10.0.0.1:80".parse().unwrap();
        encode_sockaddr(&v4, &mut b);
        assert_eq!(decode_sockaddr(&b).unwrap(), v4);
    }

    #[test]
    fn rejects_malformed() {
        let mut good = [0u8; SOCKADDR_END];
        encode_sockaddr(&"10.0.0.1:80".parse().unwrap(), &mut good);
        for n in 0..SOCKADDR_END {
            assert!(is_bad(&good[..n]), "{n} bytes");
        }
        for f in [0, 5, 7, 255] {
            let mut b = good;
            b[FAMILY] = f;
            assert!(is_bad(&b), "family {f}");
        }
        let mut b = good;
        b[PORT] = 0;
        b[PORT + 1] = 0;
        assert!(is_bad(&b), "port 0");
        for i in IP + 4..SOCKADDR_END {
            let mut b = good;
            b[i] = 1;
            assert!(is_bad(&b), "IPv4 with byte {i} set");
        }
    }

    #[test]
    fn garbage_never_panics_and_what_decodes_reencodes_the_same() {
        // A fixed xorshift stream: reproducible, no dependency.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..20_000 {
            let mut b = [0u8; SOCKADDR_END];
            for byte in b.iter_mut() {
                *byte = next() as u8;
            }
            // Make valid input common enough to reach every path.
            b[FAMILY] = [4, 6, b[FAMILY]][round % 3];
            if round % 2 == 0 {
                b[IP + 4..].fill(0);
            }
            let len = if round % 5 == 0 {
                (next() as usize) % SOCKADDR_END
            } else {
                SOCKADDR_END
            };
            if let Ok(addr) = decode_sockaddr(&b[..len]) {
                let mut again = b;
                encode_sockaddr(&addr, &mut again);
                assert_eq!(again, b, "round {round}");
            }
        }
    }
}
