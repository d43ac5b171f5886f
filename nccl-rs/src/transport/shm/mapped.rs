//! Single-copy frames whose source the receiver can map.
//!
//! A single-copy frame (see [`super::cma`]) names the sender's buffer by its
//! address, and the receiver copies it with `process_vm_readv`, which pins
//! the sender's pages and copies in the kernel: 1.3–2.3× the time of a
//! `memcpy` of the same bytes on the development machine
//! (`target/release/copy_floor`). When the sender's buffer lies in one of
//! its shared allocations (`ncclMemAlloc`, [`crate::ShmBuffer`]), the frame
//! also names that allocation ([`CMA_MAPPED`], the rest of the line), and
//! the receiver maps it once (`pidfd_getfd` + `mmap`, the mappings kept in
//! its [`PeerMaps`]) and copies with `memcpy`. The address stays in the
//! frame: a receiver that cannot map falls back to `process_vm_readv`, for
//! that frame and, having said why once, for the rest of the connection.
//! Completion is unchanged: the frame's line is released after the copy.
//!
//! [`CMA_MAPPED`]: super::ring::CMA_MAPPED

use crate::hostmem::{self, PeerMaps, RegionDesc};

/// Peer allocations a receiving connection keeps mapped (least recently
/// used first out). Small: a mapping keeps the allocation's pages alive
/// after its owner frees it, and a pipeline sends from a few buffers.
pub(super) const KEEP_MAPPED: usize = 8;

#[cfg(test)]
thread_local! {
    /// Single-copy frames this thread's receives copied from a mapping.
    pub(super) static MAPPED_FRAMES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Makes this thread's receives fail to map, as a kernel that refuses
    /// `pidfd_getfd` would.
    pub(super) static REFUSE_MAPPING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The INFO line logged the first time this process reads a message from
/// a mapping of the sender's buffer.
const MAPPED_LOG: &str = "SHM: received from a shared buffer of the sender";
/// Whether this process has logged [`MAPPED_LOG`].
static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Where the sender's message lies in one of its shared allocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct MappedSrc {
    serial: u64,
    fd: i32,
    alloc_len: u64,
    offset: u64,
}

/// Bytes of a [`MappedSrc`] in a frame line (after the address and flags).
pub(super) const MAPPED_BYTES: usize = 28;

impl MappedSrc {
    /// The shared allocation holding all `len` bytes at `data` in this
    /// process, if there is one.
    pub(super) fn locate(data: *const u8, len: usize) -> Option<MappedSrc> {
        let (serial, fd, alloc_len, offset) = hostmem::locate(data, len)?;
        Some(MappedSrc {
            serial,
            fd,
            alloc_len: alloc_len as u64,
            offset: offset as u64,
        })
    }

    pub(super) fn encode(&self) -> [u8; MAPPED_BYTES] {
        let mut w = [0u8; MAPPED_BYTES];
        w[0..8].copy_from_slice(&self.serial.to_le_bytes());
        w[8..16].copy_from_slice(&self.alloc_len.to_le_bytes());
        w[16..24].copy_from_slice(&self.offset.to_le_bytes());
        w[24..28].copy_from_slice(&self.fd.to_le_bytes());
        w
    }

    pub(super) fn decode(w: &[u8; MAPPED_BYTES]) -> MappedSrc {
        let u = |i: usize| u64::from_le_bytes(w[i..i + 8].try_into().expect("8 bytes"));
        MappedSrc {
            serial: u(0),
            alloc_len: u(8),
            offset: u(16),
            fd: i32::from_le_bytes(w[24..28].try_into().expect("4 bytes")),
        }
    }

    /// The `len`-byte message as a region the peer maps resolve; `None` if
    /// it does not fit the allocation the frame names (a corrupt frame).
    fn region(&self, len: usize) -> Option<RegionDesc> {
        let alloc_len = usize::try_from(self.alloc_len).ok()?;
        let offset = usize::try_from(self.offset).ok()?;
        (offset.checked_add(len)? <= alloc_len).then_some(RegionDesc {
            serial: self.serial,
            fd: self.fd,
            alloc_len,
            offset,
            len,
        })
    }
}

/// A receiving connection's mappings of its sender's allocations.
pub(super) struct SenderMaps {
    /// `None` once mapping failed: single copy by `process_vm_readv` from
    /// then on.
    maps: Option<PeerMaps>,
}

impl SenderMaps {
    pub(super) fn new() -> SenderMaps {
        SenderMaps {
            maps: Some(PeerMaps::with_capacity(KEEP_MAPPED)),
        }
    }

    /// This process's address of the `len`-byte message `src` of process
    /// `pid`, mapping its allocation if needed; `None` if it cannot be
    /// mapped (then the caller reads it by address).
    pub(super) fn resolve(&mut self, pid: i32, src: &MappedSrc, len: usize) -> Option<*const u8> {
        let maps = self.maps.as_mut()?;
        #[cfg(test)]
        if REFUSE_MAPPING.with(|r| r.get()) {
            self.maps = None;
            return None;
        }
        let result = match src.region(len) {
            Some(r) => maps.resolve(pid, &r, &[]),
            None => Err(format!(
                "frame names {len} bytes at offset {} of a {}-byte allocation",
                src.offset, src.alloc_len
            )),
        };
        match result {
            Ok(p) => {
                #[cfg(test)]
                MAPPED_FRAMES.with(|n| n.set(n.get() + 1));
                if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::info!(peer_pid = pid, "{MAPPED_LOG} (memcpy from a mapping)");
                }
                Some(p.cast_const())
            }
            Err(why) => {
                tracing::info!(
                    peer_pid = pid,
                    why,
                    "SHM: cannot map the sender's buffer; single copy by process_vm_readv on this connection"
                );
                self.maps = None;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ShmBuffer;

    #[test]
    fn a_shared_buffer_is_located_encoded_and_resolved() {
        let mut b = ShmBuffer::<u8>::zeroed(10_000).unwrap();
        b[1234] = 7;
        let at = b.as_ptr().wrapping_add(1000);
        let src = MappedSrc::locate(at, 500).expect("inside one shared allocation");
        assert_eq!(MappedSrc::decode(&src.encode()), src);
        let mut maps = SenderMaps::new();
        let p = maps.resolve(std::process::id() as i32, &src, 500).unwrap();
        assert_eq!(p, at);
        // SAFETY: `p` is byte 1000 of `b`, which has 10000 bytes.
        assert_eq!(unsafe { *p.add(234) }, 7);
        // Past the allocation's end, or not shared at all: not located.
        assert!(MappedSrc::locate(at, 9_001).is_none());
        let heap = [0u8; 100];
        assert!(MappedSrc::locate(heap.as_ptr(), 100).is_none());
    }

    #[test]
    fn a_frame_naming_too_much_turns_mapping_off() {
        let b = ShmBuffer::<u8>::zeroed(4096).unwrap();
        let src = MappedSrc::locate(b.as_ptr(), 4096).unwrap();
        let mut maps = SenderMaps::new();
        let pid = std::process::id() as i32;
        assert!(maps.resolve(pid, &src, 4097).is_none());
        // Off for good on this connection, even for a good frame.
        assert!(maps.resolve(pid, &src, 4096).is_none());
    }
}
