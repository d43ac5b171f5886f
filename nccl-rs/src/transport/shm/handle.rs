//! The connection handle: which segment to map and the nonce that proves the
//! connector got the handle from the listener.
//!
//! Layout (little-endian), at most [`MAX_HANDLE_BYTES`] bytes; trailing zero
//! padding added by the bootstrap is ignored:
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | `b"NRSM"` |
//! | 4 | handle version ([`HANDLE_VERSION`]) |
//! | 5 | name length `n` |
//! | 6..8 | zero |
//! | 8..16 | segment size in bytes (`u64`) |
//! | 16..32 | nonce (two `u64`) |
//! | 32..32+n | segment name, without the leading `/` |

use super::segment::{DATA_OFFSET, MAX_SEGMENT_BYTES, NAME_PREFIX};
use nccl_net::{NetError, NetResult, MAX_HANDLE_BYTES};

const HANDLE_MAGIC: [u8; 4] = *b"NRSM";
/// Version of the handle layout.
pub(super) const HANDLE_VERSION: u8 = 1;
/// Fixed part before the name.
const FIXED: usize = 32;
/// Longest segment name a handle can carry.
pub(super) const MAX_NAME: usize = MAX_HANDLE_BYTES - FIXED;

/// A decoded handle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ShmHandle {
    /// Segment name without the leading `/`, e.g. `nccl-rs-123-0f..`.
    pub(super) name: String,
    /// Segment size in bytes.
    pub(super) size: u64,
    /// Random nonce, also stored in the segment header.
    pub(super) nonce: [u64; 2],
}

/// Whether `name` is a segment name this transport creates: the prefix,
/// then only ASCII alphanumerics and `-`. Rejects anything that could
/// leave `/dev/shm` (`/`, `..`).
pub(super) fn valid_name(name: &str) -> bool {
    name.len() <= MAX_NAME
        && name.len() > NAME_PREFIX.len()
        && name.starts_with(NAME_PREFIX)
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

impl ShmHandle {
    /// The wire bytes.
    pub(super) fn encode(&self) -> Vec<u8> {
        debug_assert!(valid_name(&self.name));
        let mut b = Vec::with_capacity(FIXED + self.name.len());
        b.extend_from_slice(&HANDLE_MAGIC);
        b.push(HANDLE_VERSION);
        b.push(self.name.len() as u8);
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(&self.size.to_le_bytes());
        b.extend_from_slice(&self.nonce[0].to_le_bytes());
        b.extend_from_slice(&self.nonce[1].to_le_bytes());
        b.extend_from_slice(self.name.as_bytes());
        b
    }

    /// Parses and validates handle bytes.
    pub(super) fn decode(b: &[u8]) -> NetResult<ShmHandle> {
        let bad = |why: &str| NetError::BadHandle(format!("SHM: {why}"));
        if b.len() < FIXED {
            return Err(bad("too short"));
        }
        if b.len() > MAX_HANDLE_BYTES {
            return Err(bad("too long"));
        }
        if b[0..4] != HANDLE_MAGIC {
            return Err(bad("not a shared-memory handle"));
        }
        if b[4] != HANDLE_VERSION {
            return Err(bad(&format!(
                "handle version {} (this build speaks {HANDLE_VERSION})",
                b[4]
            )));
        }
        let n = usize::from(b[5]);
        let name = b
            .get(FIXED..FIXED + n)
            .ok_or_else(|| bad("name runs past the end"))?;
        let name = std::str::from_utf8(name)
            .ok()
            .filter(|s| valid_name(s))
            .ok_or_else(|| bad("invalid segment name"))?;
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        // The connector maps (and prefaults) this many bytes.
        let size = u64_at(8);
        if !(DATA_OFFSET as u64 + 1..=MAX_SEGMENT_BYTES as u64).contains(&size) {
            return Err(bad(&format!(
                "segment size {size} (must be {}..={MAX_SEGMENT_BYTES})",
                DATA_OFFSET + 1
            )));
        }
        Ok(ShmHandle {
            name: name.to_owned(),
            size,
            nonce: [u64_at(16), u64_at(24)],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ShmHandle {
        ShmHandle {
            name: "nccl-rs-42-0123456789abcdef".into(),
            size: 4096 + (4 << 20),
            nonce: [7, u64::MAX],
        }
    }

    #[test]
    fn round_trip_with_padding() {
        let h = sample();
        let mut b = h.encode();
        assert!(b.len() <= MAX_HANDLE_BYTES);
        assert_eq!(ShmHandle::decode(&b).unwrap(), h);
        b.resize(MAX_HANDLE_BYTES, 0);
        assert_eq!(ShmHandle::decode(&b).unwrap(), h);
    }

    #[test]
    fn rejects_garbage() {
        let b = sample().encode();
        assert!(ShmHandle::decode(&b[..20]).is_err());
        let mut m = b.clone();
        m[0] = b'X';
        assert!(ShmHandle::decode(&m).is_err());
        let mut m = b.clone();
        m[4] = 99;
        assert!(ShmHandle::decode(&m).is_err());
        let mut m = b.clone();
        m[5] = 100; // name longer than the bytes
        assert!(ShmHandle::decode(&m).is_err());
        for evil in ["../../etc/passwd", "nccl-rs-1/x", "other-1-2", "nccl-rs-"] {
            let mut h = sample();
            h.name = evil.into();
            let mut m = h.encode_unchecked();
            m.truncate(FIXED + evil.len());
            assert!(ShmHandle::decode(&m).is_err(), "{evil}");
        }
    }

    #[test]
    fn rejects_segment_sizes_no_listener_creates() {
        let mut h = sample();
        h.size = MAX_SEGMENT_BYTES as u64;
        assert_eq!(ShmHandle::decode(&h.encode()).unwrap(), h);
        for hostile in [
            0,
            DATA_OFFSET as u64,
            MAX_SEGMENT_BYTES as u64 + 1,
            1 << 40,
            u64::MAX,
        ] {
            h.size = hostile;
            assert!(ShmHandle::decode(&h.encode()).is_err(), "{hostile}");
        }
    }

    impl ShmHandle {
        fn encode_unchecked(&self) -> Vec<u8> {
            let mut b = Vec::new();
            b.extend_from_slice(&HANDLE_MAGIC);
            b.push(HANDLE_VERSION);
            b.push(self.name.len() as u8);
            b.extend_from_slice(&[0; 26]);
            b.extend_from_slice(self.name.as_bytes());
            b
        }
    }
}
