//! Where the two ranks' CPUs are, asked before a 2-rank all-gather,
//! all-to-all or all-reduce of `NCCL_SHM_STREAM_RING_BYTES` or more.
//!
//! On a virtual machine the host moves the vCPUs between cores that share a
//! cache and cores that do not, every few seconds. A 2-rank all-gather of
//! at least `NCCL_SHM_STREAM_RING_BYTES` (half the last-level cache) is
//! fastest through the ring in chunks while the cores share a cache, and
//! about twice as slow while they do not: a plain store into a ring line
//! the other rank read last lap waits for the line to come back across the
//! caches. Single copy in whole blocks (`process_vm_readv` straight from
//! the sender's buffer) does not care (paired rounds, `scripts/paired.sh`,
//! 2 ranks, heap buffers, 64 MiB out of place, by the placement probe
//! before each round, `copy_floor --pair`: near, 62-73 ns, 6.1-7.7 against
//! 9.5-11.2 ms; apart, 318-323 ns, 15.1-16.1 against 10.0-11.1 ms; Open MPI
//! 10.6-13.6 ms throughout), and neither does the ring written with
//! streaming stores (`CopyHint::receiver_apart`), which beats it: 24
//! paired rounds of 16 MiB with the call's probe choosing between the ring
//! and the ring streamed (`X_AG_RING_APART`, a temporary switch) against
//! between the ring and single copy, medians 2.16 against 2.43 ms (x1.07
//! by the rounds' ratios; six rounds at 3.1-3.6 ms with single copy,
//! 1.75-2.17 ms in the same rounds streamed; Open MPI 3.51 ms), 16 rounds
//! of 64 MiB 8.94 against 9.07 ms (x1.04; four at 11.8-14.4 ms against
//! 7.9-9.6; Open MPI 15.1 ms). So an all-gather keeps the ring, and the
//! probe chooses its stores. Both ranks must agree on how the call's
//! messages are cut (an all-to-all's, below), so the choice is the
//! leader's (rank 0): it times a few 8-byte round trips with rank 1, as the
//! call's own messages (its tag, so a mismatched call still fails as one),
//! and sends its verdict.
//!
//! An out-of-place all-to-all of that size otherwise sends from a streamed
//! copy of its input in shared memory, read in whole blocks
//! (`Core::stage_input`); found near, it takes the ring in chunks as well
//! (`engine::Placement::Near`), if it is out of place on both ranks (each
//! says so in its round trips). Paired rounds against the probe off
//! (`CFGS="target/release;target/release NCCL_SHM_APART_NS=0;mpi-shm" bash
//! scripts/paired.sh 2 alltoall S 16`, heap buffers): 16 MiB 2.00 against
//! 2.25 ms (x1.07) and 1.90 against 2.25 ms (x1.12), 32 MiB 4.52 against
//! 4.63 ms (x0.99), 64 MiB 8.37 against 8.96 ms (x1.05) and 8.93 against
//! 9.04 ms (x1.00); Open MPI 2.85-2.93, 6.51 and 12.2-12.3 ms. In place it
//! sends from staging and stays single copy, where the ring lost (x0.81-0.83
//! at 16 and 64 MiB). Found apart it stays single copy too: the ring
//! streamed instead measured x1.03 and x1.02 at 16 and 64 MiB (16 paired
//! rounds each), within the rounds' noise.
//!
//! A 2-rank all-reduce of that size keeps the ring either way, but found
//! apart it writes the ring with streaming stores
//! (`CopyHint::receiver_apart`): a plain store into a ring line the other
//! rank read last lap waits for the line to come back across the caches
//! (16 KiB pieces in 2.3-3.0 us against 1.0-1.4 us near; streamed, 1.3-1.7
//! us in either state), while near, streamed pieces leave the receiver to
//! fetch them from memory (streaming always: 4.2-5.4 ms against 3.8-4.7 ms
//! near). 24 paired rounds of 16 MiB against the probe off (`CFGS=
//! "target/release;target/release NCCL_SHM_APART_NS=0;mpi-shm" bash
//! scripts/paired.sh 2 allreduce 16777216 24`): medians 3.92 against 4.13
//! ms, five rounds at 6.5-7.6 ms with the probe off and none over 5.1 ms
//! with it; Open MPI's time over ours 1.73 against 1.25 at the tenth
//! percentile of the rounds, 2.13 against 2.11 at the median. The transport's
//! own placement samples (`transport::shm::placement`) come from messages
//! that may go single copy, which the ring's chunks are not, and a rank's
//! view of them may differ from its peer's.

use super::core::Core;
use crate::datatype::{DataType, RedOp};
use crate::engine::{CallBufs, OpLabel, Placement, Region};
use crate::error::Result;
use crate::schedule;
use std::time::{Duration, Instant};

/// Round trips timed; the fastest counts (a late look only adds time).
const ROUND_TRIPS: usize = 5;

/// Default `NCCL_SHM_APART_NS`: the fastest of [`ROUND_TRIPS`] round
/// trips through the engine's eager path taking at least this many
/// nanoseconds says the CPUs do not share a cache. On the development
/// machine (2-rank all-gathers of 16 and 64 MiB, `NCCL_DEBUG=TRACE`, 25
/// calls per run) runs whose `copy_floor --pair` read 28-73 ns and that
/// ran fast timed 180-360 ns (a few up to 491-641 ns), runs that ran slow
/// (the vCPUs apart, `--pair` 313-342 ns, or moved during the run) timed
/// 621-1182 ns (one call 531 ns). The two states alternate every few
/// seconds, the shared one more often, so the cut leans towards it.
pub(crate) const APART_NS: u64 = 600;

/// Rank 0's verdict, as it travels to rank 1.
const VERDICT_NEAR: u8 = 0;
const VERDICT_APART: u8 = 1;
/// Near, but a rank's side of the call cannot take the ring (an all-to-all
/// in place): the call keeps its shape of old.
const VERDICT_NEAR_NO_RING: u8 = 2;

impl Core {
    /// Where the two ranks' CPUs are right now, as rank 0 times it and
    /// tells rank 1 (see the module docs); `ring_ok`: this rank's side of
    /// the call may take the ring (the ranks trade it, since an all-to-all
    /// may be in place on one rank only, and both must cut its messages
    /// alike). Runs as operation `label` with `tag`, so its deadline, abort
    /// and mismatch handling are the call's.
    pub(crate) fn probe_placement(
        &mut self,
        tag: u32,
        label: OpLabel,
        ring_ok: bool,
    ) -> Result<Placement> {
        let leads = self.rank == 0;
        let peer = 1 - self.rank;
        let trip = schedule::round_trip(peer, 8, leads);
        let mine = [u8::from(ring_ok); 8];
        let mut theirs = [0u8; 8];
        let mut best = Duration::MAX;
        for _ in 0..ROUND_TRIPS {
            let bufs = CallBufs {
                input: Region::read_only(mine.as_ptr(), mine.len()),
                output: Region::new(theirs.as_mut_ptr(), theirs.len()),
                group: Vec::new(),
            };
            let start = Instant::now();
            self.execute(&trip, DataType::Uint8, RedOp::Sum, tag, label, bufs)?;
            best = best.min(start.elapsed());
        }
        // Only the leader's timing and verdict count; it travels as one
        // more round trip (rank 1's side of that trip carries nothing).
        let apart_at = Duration::from_nanos(self.engine.single_copy.apart_ns);
        let verdict = match (best >= apart_at, ring_ok && theirs[0] != 0) {
            (true, _) => VERDICT_APART,
            (false, true) => VERDICT_NEAR,
            (false, false) => VERDICT_NEAR_NO_RING,
        };
        let sent = [verdict];
        let mut heard = [0u8; 1];
        let one = schedule::round_trip(peer, 1, leads);
        let bufs = CallBufs {
            input: Region::read_only(sent.as_ptr(), 1),
            output: Region::new(heard.as_mut_ptr(), 1),
            group: Vec::new(),
        };
        self.execute(&one, DataType::Uint8, RedOp::Sum, tag, label, bufs)?;
        let placement = match if leads { verdict } else { heard[0] } {
            VERDICT_NEAR => Placement::Near,
            VERDICT_APART => Placement::Apart,
            _ => Placement::Unknown,
        };
        tracing::trace!(
            rank = self.rank,
            ?best,
            ?placement,
            "cpu placement before {}",
            label.call()
        );
        Ok(placement)
    }
}
