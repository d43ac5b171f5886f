//! Single-copy messages whose far end can be mapped.
//!
//! A single-copy frame (see [`super::cma`]) names the sender's buffer by its
//! address, and the receiver copies it with `process_vm_readv`, which pins
//! the sender's pages and copies in the kernel, slower than a `memcpy` of
//! the same bytes (`target/release/copy_floor` compares the two). When the
//! sender's buffer lies in one of its shared allocations (`ncclMemAlloc`,
//! [`crate::ShmBuffer`]), the frame also names that allocation
//! ([`CMA_MAPPED`], the rest of the line), and the receiver maps it once
//! (`pidfd_getfd` + `mmap`, the mappings kept in its [`PeerMaps`]) and
//! copies with `memcpy`. The address stays in the frame: a receiver that
//! cannot map falls back to `process_vm_readv`, for that frame and, having
//! said why once, for the rest of the connection.
//! Completion is unchanged: the frame's line is released after the copy.
//!
//! The other direction is the same: a receiver that offers a message for
//! splitting (`split`) names its destination's shared allocation in the
//! offer, if it has one, and the sender writes its pieces by `memcpy` into
//! a mapping of it instead of `process_vm_writev`.
//!
//! Allocations are sealed at a fixed size (`hostmem`), and [`PeerMaps`]
//! maps only sealed ones, so a copy through a mapping cannot fault.
//!
//! [`CMA_MAPPED`]: super::ring::CMA_MAPPED

use crate::hostmem::{self, PeerMaps, RegionDesc};

/// Peer allocations a connection keeps mapped (least recently used first
/// out). Small: a pipeline sends from (and receives into) a few buffers.
pub(super) const KEEP_MAPPED: usize = 8;

#[cfg(test)]
thread_local! {
    /// Single-copy frames this thread's receives copied from a mapping.
    pub(super) static MAPPED_FRAMES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Split pieces this thread's sends wrote into a mapping.
    pub(super) static MAPPED_WRITES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Makes this thread's connections fail to map, as a kernel that
    /// refuses `pidfd_getfd` would.
    pub(super) static REFUSE_MAPPING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Which end of a connection maps the other's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MapSide {
    /// The receiver, reading single-copy frames from the sender's buffer.
    Receiver,
    /// The sender, writing its pieces of split messages into the
    /// receiver's buffer.
    Sender,
}

impl MapSide {
    /// The INFO line logged the first time this process copies through a
    /// mapping on this side.
    fn mapped_log(self) -> &'static str {
        match self {
            MapSide::Receiver => "SHM: received from a shared buffer of the sender",
            MapSide::Sender => "SHM: wrote split pieces into a shared buffer of the receiver",
        }
    }

    /// The INFO line logged when a connection cannot map.
    fn fallback_log(self) -> &'static str {
        match self {
            MapSide::Receiver => "SHM: cannot map the sender's buffer; single copy by process_vm_readv on this connection",
            MapSide::Sender => "SHM: cannot map the receiver's buffer; split pieces by process_vm_writev on this connection",
        }
    }

    /// Whether this process has logged [`MapSide::mapped_log`].
    fn said(self) -> &'static std::sync::atomic::AtomicBool {
        static RECEIVER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        static SENDER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        match self {
            MapSide::Receiver => &RECEIVER,
            MapSide::Sender => &SENDER,
        }
    }
}

/// Where a message (the sender's source, or the receiver's destination of
/// a split one) lies in one of its owner's shared allocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SharedRegion {
    serial: u64,
    fd: i32,
    alloc_len: u64,
    offset: u64,
}

/// Bytes of a [`SharedRegion`] in a frame line (after the address and flags)
/// or in a split offer.
pub(super) const MAPPED_BYTES: usize = 28;

impl SharedRegion {
    /// The shared allocation holding all `len` bytes at `data` in this
    /// process, if there is one.
    pub(super) fn locate(data: *const u8, len: usize) -> Option<SharedRegion> {
        let (serial, fd, alloc_len, offset) = hostmem::locate(data, len)?;
        Some(SharedRegion {
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

    pub(super) fn decode(w: &[u8; MAPPED_BYTES]) -> SharedRegion {
        let u = |i: usize| u64::from_le_bytes(w[i..i + 8].try_into().expect("8 bytes"));
        SharedRegion {
            serial: u(0),
            alloc_len: u(8),
            offset: u(16),
            fd: i32::from_le_bytes(w[24..28].try_into().expect("4 bytes")),
        }
    }

    /// The `len`-byte message as a region the peer maps resolve; `None` if
    /// it does not fit the allocation named (a corrupt peer).
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

/// A connection's mappings of its peer's allocations.
pub(super) struct PeerMapping {
    side: MapSide,
    /// `None` once mapping failed: the kernel's cross-memory calls from
    /// then on.
    maps: Option<PeerMaps>,
}

impl PeerMapping {
    pub(super) fn new(side: MapSide) -> PeerMapping {
        PeerMapping {
            side,
            maps: Some(PeerMaps::with_capacity(KEEP_MAPPED)),
        }
    }

    /// This process's address of the `len`-byte message `at` of process
    /// `pid`, mapping its allocation if needed; `None` if it cannot be
    /// mapped (then the caller copies by address, through the kernel).
    pub(super) fn resolve(&mut self, pid: i32, at: &SharedRegion, len: usize) -> Option<*mut u8> {
        let maps = self.maps.as_mut()?;
        #[cfg(test)]
        if REFUSE_MAPPING.with(|r| r.get()) {
            self.maps = None;
            return None;
        }
        let result = match at.region(len) {
            Some(r) => maps.resolve(pid, &r, &[]),
            None => Err(format!(
                "{len} bytes at offset {} of a {}-byte allocation",
                at.offset, at.alloc_len
            )),
        };
        match result {
            Ok(p) => {
                #[cfg(test)]
                match self.side {
                    MapSide::Receiver => MAPPED_FRAMES.with(|n| n.set(n.get() + 1)),
                    MapSide::Sender => MAPPED_WRITES.with(|n| n.set(n.get() + 1)),
                }
                if !self
                    .side
                    .said()
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    tracing::info!(
                        peer_pid = pid,
                        "{} (memcpy through a mapping)",
                        self.side.mapped_log()
                    );
                }
                Some(p)
            }
            Err(why) => {
                tracing::info!(peer_pid = pid, why, "{}", self.side.fallback_log());
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
        let src = SharedRegion::locate(at, 500).expect("inside one shared allocation");
        assert_eq!(SharedRegion::decode(&src.encode()), src);
        let mut maps = PeerMapping::new(MapSide::Receiver);
        let p = maps.resolve(std::process::id() as i32, &src, 500).unwrap();
        assert_eq!(p.cast_const(), at);
        // SAFETY: `p` is byte 1000 of `b`, which has 10000 bytes.
        assert_eq!(unsafe { *p.add(234) }, 7);
        // Past the allocation's end, or not shared at all: not located.
        assert!(SharedRegion::locate(at, 9_001).is_none());
        let heap = [0u8; 100];
        assert!(SharedRegion::locate(heap.as_ptr(), 100).is_none());
    }

    #[test]
    fn a_frame_naming_too_much_turns_mapping_off() {
        let b = ShmBuffer::<u8>::zeroed(4096).unwrap();
        let src = SharedRegion::locate(b.as_ptr(), 4096).unwrap();
        let mut maps = PeerMapping::new(MapSide::Receiver);
        let pid = std::process::id() as i32;
        assert!(maps.resolve(pid, &src, 4097).is_none());
        // Off for good on this connection, even for a good frame.
        assert!(maps.resolve(pid, &src, 4096).is_none());
    }
}
