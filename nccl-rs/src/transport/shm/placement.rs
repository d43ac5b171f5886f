//! Whether the peer's CPU shares a cache with ours right now, read off the
//! ring's own traffic.
//!
//! On a virtual machine the host moves the vCPUs between cores that share a
//! cache and cores that do not, every few seconds (`copy_floor --pair`: a
//! cache-line round trip of 25-90 ns against 330-460 ns on the development
//! machine). A message copied through the ring (the sender copies it in,
//! the receiver copies out lines the other core has just written) follows
//! that placement; the receiver's single copy by `process_vm_readv` does
//! not. While the two cores share a cache ("near") the ring wins; while
//! they do not, single copy does.
//!
//! The producer stamps the publication of each frame of a message that may
//! go single copy: the low 32 bits of the new counter and of the clock
//! (`CLOCK_MONOTONIC`, shared by all processes), in the counter's cache line
//! just before the counter ([`super::segment::Published`]). A consumer that
//! sees that counter takes the time since the stamp. A late look only makes
//! a sample longer, so a sample under [`NEAR_NS`] can only come from a
//! cache-line transfer between cores that share a cache. The receiver keeps
//! the time of its last such sample in its side of the segment (for the
//! sender of this connection) and in this process's table under the
//! sender's pid (for our own sends to that process: both directions join
//! the same two CPUs). A sender that finds a near sample younger than
//! [`FRESH_NS`] in either place sends the messages it may send single copy,
//! up to `NCCL_SHM_NEAR_RING_BYTES`, through the ring instead.

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

/// Samples below this many nanoseconds say "near". Two ranks pinned to the
/// two vCPUs of the development machine, 2-rank all-gathers of 64 KiB,
/// seven runs of about 800 windows of 2 ms each: while `copy_floor --pair`
/// read 77-84 ns the smallest sample of most windows was 60-100 ns (a few
/// windows had no prompt sight and read more); while it read 406-427 ns,
/// 260-500 ns, with 2 windows of about 1600 at 100-160 ns.
pub(super) const NEAR_NS: u32 = 120;

/// A near sample counts for this long: the placement holds for seconds,
/// and a sender that saw none for this long uses single copy again.
pub(super) const FRESH_NS: u64 = 2_000_000;

/// A receiver rewrites its "last near" time at most this often (the line
/// is read by the sender).
pub(super) const STORE_EVERY_NS: u64 = 100_000;

/// `CLOCK_MONOTONIC` in nanoseconds (the vDSO: about 30 ns here).
pub(super) fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// The stamp of publishing counter `head` at `now` ns.
pub(super) fn pack_stamp(head: u64, now: u64) -> u64 {
    (u64::from(head as u32) << 32) | u64::from(now as u32)
}

/// Nanoseconds from the publication `stamp` records to `now`, if `stamp`
/// is that of counter `head`.
pub(super) fn since_stamp(stamp: u64, head: u64, now: u64) -> Option<u32> {
    ((stamp >> 32) as u32 == head as u32).then(|| (now as u32).wrapping_sub(stamp as u32))
}

/// One process's last near sample from one peer process.
struct Slot {
    pid: AtomicI32,
    near_at: AtomicU64,
}

const SLOTS: usize = 64;
#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    pid: AtomicI32::new(0),
    near_at: AtomicU64::new(0),
};
/// This process's samples, by peer pid (a pid that finds no slot is not
/// recorded: the segment's copy still serves that connection's sender).
static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];

fn slot(pid: i32, insert: bool) -> Option<&'static Slot> {
    if pid <= 0 {
        return None;
    }
    for s in &TABLE {
        match s.pid.load(Ordering::Relaxed) {
            p if p == pid => return Some(s),
            0 if insert => {
                match s
                    .pid
                    .compare_exchange(0, pid, Ordering::Relaxed, Ordering::Relaxed)
                {
                    Ok(_) => return Some(s),
                    Err(p) if p == pid => return Some(s),
                    Err(_) => {}
                }
            }
            0 => return None,
            _ => {}
        }
    }
    None
}

/// The placement bookkeeping of one comm: its samples go to its segment's
/// `near` line (which both sides write) and this process's table; the
/// segment's line, which the peer may have written, is merged into the
/// table.
#[derive(Debug, Default)]
pub(super) struct Sampler {
    /// The last near time we stored.
    stored: u64,
    /// The segment's value we last merged into the table.
    merged: u64,
}

impl Sampler {
    /// Takes `sample` (`(ns, clock)` from `take_sample`) on a connection
    /// with `peer_pid` whose segment's line is `near`.
    pub(super) fn note(&mut self, sample: Option<(u32, u64)>, peer_pid: i32, near: &AtomicU64) {
        if let Some((ns, now)) = sample {
            if ns < NEAR_NS && now.wrapping_sub(self.stored) >= STORE_EVERY_NS {
                self.stored = now;
                self.merged = now;
                near.store(now, Ordering::Relaxed);
                if let Some(s) = slot(peer_pid, true) {
                    s.near_at.fetch_max(now, Ordering::Relaxed);
                }
                return;
            }
        }
        let v = near.load(Ordering::Relaxed);
        if v != self.merged {
            self.merged = v;
            if let Some(s) = slot(peer_pid, true) {
                s.near_at.fetch_max(v, Ordering::Relaxed);
            }
        }
    }
}

/// Whether a connection with `peer_pid` whose segment's line is `near` has
/// seen, or this process has seen from that peer, a near sample younger
/// than [`FRESH_NS`] at `now`.
pub(super) fn is_near(peer_pid: i32, near: &AtomicU64, now: u64) -> bool {
    let fresh = |t: u64| t != 0 && now.wrapping_sub(t) < FRESH_NS;
    fresh(near.load(Ordering::Relaxed))
        || slot(peer_pid, false).is_some_and(|s| fresh(s.near_at.load(Ordering::Relaxed)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_pair_with_their_counter() {
        let s = pack_stamp(0x1_0000_0040, 5_000_000_123);
        assert_eq!(since_stamp(s, 0x1_0000_0040, 5_000_000_223), Some(100));
        assert_eq!(since_stamp(s, 0x1_0000_0080, 5_000_000_223), None);
        // The clock's low 32 bits wrap every 4.3 s.
        let w = pack_stamp(64, u64::from(u32::MAX) - 9);
        assert_eq!(since_stamp(w, 64, u64::from(u32::MAX) + 11), Some(20));
    }

    #[test]
    fn near_samples_age_out_and_spread() {
        let pid = i32::MAX - 7;
        let (seg, other) = (AtomicU64::new(0), AtomicU64::new(0));
        let t = 10 * FRESH_NS;
        assert!(!is_near(pid, &seg, t));
        let mut s = Sampler::default();
        s.note(Some((NEAR_NS, t)), pid, &seg);
        assert!(!is_near(pid, &seg, t), "{NEAR_NS} ns is not near");
        s.note(Some((NEAR_NS - 1, t)), pid, &seg);
        assert!(is_near(pid, &seg, t + FRESH_NS - 1));
        assert!(!is_near(pid, &seg, t + FRESH_NS));
        // The table serves this process's other connections with the peer,
        // and no other peer.
        assert!(is_near(pid, &other, t + 1));
        assert!(!is_near(pid - 1, &other, t + 1));
        // What the peer wrote into a segment reaches the table once a comm
        // of ours on it notes it.
        let pid2 = i32::MAX - 8;
        let seg2 = AtomicU64::new(0);
        seg2.store(3 * t, Ordering::Relaxed);
        assert!(!is_near(pid2, &other, 3 * t));
        Sampler::default().note(None, pid2, &seg2);
        assert!(is_near(pid2, &other, 3 * t));
    }
}
