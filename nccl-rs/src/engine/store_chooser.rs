//! Plain or streaming stores for copies into the shared staging buffer,
//! chosen by how fast the plain ones run.
//!
//! A rank stages a heap input in shared memory (`Core::stage_input`) and
//! the other ranks copy it out of their mapping; below the size rules'
//! streaming thresholds it copies with plain stores, so that the readers
//! find the staged bytes in the last-level cache. That holds while the
//! CPUs share that cache. This development host moves its two vCPUs
//! between cores that share one and cores that do not, every few seconds,
//! and apart, a plain store into a line that a reader on the other CPU
//! took last call waits for that line to be taken back across the caches.
//! 4 ranks on 2 cores, all-to-all of 1 MiB, heap buffers: the staging copy
//! of 768 KiB took 21-24 us (33-37 GB/s) in the launches that ran the call
//! in 116-135 us and 238-290 us (2.7-3.3 GB/s) in those that ran it in
//! 663-795 us. Block by block it depends on where the block's reader ran:
//! in such a slow launch a rank's 256 KiB block for one reader copied in
//! 10 us and its 512 KiB for the two others in 290 us. Streaming stores
//! do not wait so (768 KiB in 37-53 us in either state), but they leave
//! the bytes in memory, where the readers then fetch them: streaming every
//! staging copy ran the call in 203-303 us whatever the state.
//!
//! So each copy of [`TIMED_MIN_BYTES`] or more is timed, and a chooser
//! (one per reader where a block has one) switches to streaming stores
//! after [`SLOW_RUNS`] plain copies in a row ran under
//! [`SLOW_BYTES_PER_US`], for [`STREAM_HOLD`]; then one plain copy looks
//! again, and another hold follows if it is slow too. Measured with
//! `CFGS="BEFORE;target/release" scripts/paired.sh 4 OP 1048576 40`
//! (BEFORE a build without the chooser; the medians of the per-round
//! ratios of the times, new over before, split by the placement probe
//! before each round): all-to-all 0.29 in the 12 rounds with the vCPUs
//! apart and 0.96 in the 28 with them together (ours 115-250 us in all 40
//! rounds, the build before 118-812), all-gather (its staged input, one
//! chooser) 0.44 apart and 1.01 together (132-227 against 128-463 us).
//! The slow copies do not follow the probe's reading closely: the vCPUs
//! also move during a run.
//!
//! Only the copying rank's choice: the readers copy the same bytes
//! whichever stores wrote them, so ranks need not agree.

use super::buffers::{copy_region, Region};
use std::time::{Duration, Instant};

/// Copies of fewer bytes are not timed (too short to tell the states apart
/// reliably); the callers copy them with plain stores.
pub(crate) const TIMED_MIN_BYTES: usize = 64 << 10;

/// A plain copy slower than this (bytes per microsecond: 4 GB/s) counts as
/// slow. Plain stores ran at 10-37 GB/s on the host above while its CPUs
/// shared a cache (a 4-rank all-gather's 256 KiB block in 20-27 us on
/// average, single copies past 33 us now and then: at 8 GB/s, 5-50% of a
/// launch's copies went streaming, and those launches ran slower) and at
/// 1.8-3.3 GB/s while they did not; streaming ones at 15-25 GB/s in both
/// states.
pub(crate) const SLOW_BYTES_PER_US: u64 = 4_000;

/// Slow plain copies in a row that switch to streaming stores: one alone
/// may be a rank descheduled in the middle of its copy.
pub(crate) const SLOW_RUNS: u32 = 2;

/// How long streaming stores stay chosen before a plain copy looks again.
/// While the CPUs stay apart each look costs about one slow copy (a few
/// hundred microseconds at 1 MiB) per hold; the vCPUs move every few
/// seconds.
pub(crate) const STREAM_HOLD: Duration = Duration::from_millis(10);

/// The chooser's state (see the module comment).
#[derive(Debug, Default)]
pub(crate) struct StoreChooser {
    /// Streaming until this instant, if plain copies were found slow.
    streaming_until: Option<Instant>,
    /// Slow plain copies in a row.
    slow_runs: u32,
}

impl StoreChooser {
    /// Whether the copy about to start at `now` uses streaming stores.
    pub(crate) fn streams(&self, now: Instant) -> bool {
        self.streaming_until.is_some_and(|until| now < until)
    }

    /// Takes the outcome of a copy of `bytes` that started at `start`,
    /// used streaming stores if `streamed`, and took `took`.
    pub(crate) fn record(&mut self, start: Instant, streamed: bool, bytes: usize, took: Duration) {
        if streamed || bytes < TIMED_MIN_BYTES {
            return;
        }
        let us = took.as_micros().max(1);
        let slow = (bytes as u128) < us.saturating_mul(SLOW_BYTES_PER_US as u128);
        if !slow {
            if self.streaming_until.take().is_some() {
                tracing::debug!(
                    bytes,
                    us = took.as_micros() as u64,
                    "staging copies: plain stores again"
                );
            }
            self.slow_runs = 0;
            return;
        }
        self.slow_runs = self.slow_runs.saturating_add(1);
        // A look after a hold needs one slow copy to stay; a switch from
        // plain stores needs SLOW_RUNS.
        if self.streaming_until.is_some() || self.slow_runs >= SLOW_RUNS {
            if self.streaming_until.is_none() {
                tracing::debug!(
                    bytes,
                    us = took.as_micros() as u64,
                    "staging copies: streaming stores (plain ones slow)"
                );
            }
            self.streaming_until = Some(start + took + STREAM_HOLD);
        }
    }

    /// Copies `src` into `dst` (same length): with streaming stores when
    /// `stream` (the caller's size rule) says so; otherwise copies of at
    /// least [`TIMED_MIN_BYTES`] with the stores chosen here, timed.
    ///
    /// # Safety
    /// As [`copy_region`]: both regions valid (`src` for reads, `dst` for
    /// writes) and nothing else accesses them during the call.
    pub(crate) unsafe fn copy(&mut self, src: Region, dst: Region, stream: bool) {
        if stream || src.len < TIMED_MIN_BYTES {
            // SAFETY: the caller's contract.
            return unsafe { copy_region(src, dst, stream) };
        }
        let start = Instant::now();
        let streamed = self.streams(start);
        // SAFETY: the caller's contract.
        unsafe { copy_region(src, dst, streamed) };
        let took = start.elapsed();
        tracing::trace!(
            bytes = src.len,
            ns = took.as_nanos() as u64,
            streamed,
            "timed copy"
        );
        self.record(start, streamed, src.len, took);
    }
}

#[cfg(test)]
mod tests {
    use super::{StoreChooser, SLOW_RUNS, STREAM_HOLD, TIMED_MIN_BYTES};
    use crate::engine::Region;
    use std::time::{Duration, Instant};

    const MIB: usize = 1 << 20;
    /// 1 MiB at 2 and at 40 GB/s.
    const SLOW: Duration = Duration::from_micros(500);
    const FAST: Duration = Duration::from_micros(25);

    #[test]
    fn two_slow_plain_copies_in_a_row_switch_to_streaming_for_the_hold() {
        let t0 = Instant::now();
        let mut s = StoreChooser::default();
        assert!(!s.streams(t0));
        s.record(t0, false, MIB, SLOW);
        assert!(!s.streams(t0 + SLOW), "one slow copy is not enough");
        s.record(t0, false, MIB, FAST);
        s.record(t0, false, MIB, SLOW);
        assert!(
            !s.streams(t0 + SLOW),
            "a fast copy in between resets the run"
        );
        s.record(t0, false, MIB, SLOW);
        assert_eq!(SLOW_RUNS, 2);
        let end = t0 + SLOW;
        assert!(s.streams(end));
        assert!(s.streams(end + STREAM_HOLD - Duration::from_micros(1)));
        assert!(
            !s.streams(end + STREAM_HOLD),
            "the hold ends: plain looks again"
        );
    }

    #[test]
    fn a_look_decides_alone_whether_streaming_goes_on() {
        let t0 = Instant::now();
        let mut s = StoreChooser::default();
        s.record(t0, false, MIB, SLOW);
        s.record(t0, false, MIB, SLOW);
        // Streamed copies say nothing about plain ones.
        s.record(t0 + SLOW, true, MIB, SLOW);
        s.record(t0 + SLOW, true, MIB, FAST);
        assert!(s.streams(t0 + SLOW));
        // The look after the hold: slow, another hold.
        let look = t0 + SLOW + STREAM_HOLD;
        assert!(!s.streams(look));
        s.record(look, false, MIB, SLOW);
        assert!(s.streams(look + SLOW));
        assert!(!s.streams(look + SLOW + STREAM_HOLD));
        // The next look is fast: plain from then on.
        let look = look + SLOW + STREAM_HOLD;
        s.record(look, false, MIB, FAST);
        assert!(!s.streams(look + FAST));
        s.record(look, false, MIB, SLOW);
        assert!(!s.streams(look + FAST + SLOW), "back to needing a run");
    }

    #[test]
    fn small_copies_are_not_judged() {
        let t0 = Instant::now();
        let mut s = StoreChooser::default();
        for _ in 0..4 {
            s.record(t0, false, TIMED_MIN_BYTES - 1, Duration::from_secs(1));
        }
        assert!(!s.streams(t0));
        // At the threshold they are: 64 KiB in 17 us is 3.9 GB/s.
        for _ in 0..2 {
            s.record(t0, false, TIMED_MIN_BYTES, Duration::from_micros(17));
        }
        assert!(s.streams(t0));
        let mut s = StoreChooser::default();
        for _ in 0..4 {
            s.record(t0, false, TIMED_MIN_BYTES, Duration::from_micros(16));
        }
        assert!(!s.streams(t0), "4.1 GB/s is not slow");
    }

    #[test]
    fn copies_are_exact_with_either_stores() {
        let src: Vec<u8> = (0..TIMED_MIN_BYTES + 77)
            .map(|i| (i * 7 + i / 251) as u8)
            .collect();
        let mut s = StoreChooser::default();
        for streaming in [false, true] {
            if streaming {
                let now = Instant::now();
                s.record(now, false, MIB, SLOW);
                s.record(now, false, MIB, SLOW);
                assert!(s.streams(Instant::now()));
            }
            // Both at an odd offset, so the streaming loop's head and tail
            // run too.
            let mut dst = vec![0u8; src.len() + 1];
            let from = Region::read_only(src[1..].as_ptr(), src.len() - 1);
            let to = Region::new(dst[2..].as_mut_ptr(), src.len() - 1);
            // SAFETY: both ranges lie within their vectors, which nothing
            // else touches meanwhile.
            unsafe { s.copy(from, to, false) };
            assert_eq!(&dst[2..], &src[1..], "streaming {streaming}");
            assert_eq!(dst[..2], [0, 0]);
        }
    }
}
