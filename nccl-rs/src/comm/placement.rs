//! Measuring where the two ranks' CPUs are, for the calls whose plan
//! depends on it (`plan::call::placement_matters`): rank 0 times round
//! trips with rank 1 through the engine's eager path and the communicator's
//! [`PlacementSource`](crate::plan::PlacementSource) judges them; rank 0's
//! verdict travels to rank 1 as one more round trip, so both ranks plan the
//! call alike.

use super::core::Core;
use crate::datatype::{DataType, RedOp};
use crate::engine::{CallBufs, Hints, OpLabel, Region};
use crate::error::Result;
use crate::plan::Placement;
use crate::schedule::{self, Schedule};
use std::time::{Duration, Instant};

/// Rank 0's verdict, as it travels to rank 1.
const VERDICT_NEAR: u8 = 0;
const VERDICT_APART: u8 = 1;
/// Near, but a rank's side of the call cannot take the ring (an all-to-all
/// in place): the call keeps the shape that does not depend on placement.
const VERDICT_NEAR_NO_RING: u8 = 2;
const VERDICT_UNKNOWN: u8 = 3;

/// Rank 0's verdict from its judgement and whether both sides may ring.
fn verdict(judged: Placement, both_ring: bool) -> u8 {
    match (judged, both_ring) {
        (Placement::Apart, _) => VERDICT_APART,
        (Placement::Near, true) => VERDICT_NEAR,
        (Placement::Near, false) => VERDICT_NEAR_NO_RING,
        (Placement::Unknown, _) => VERDICT_UNKNOWN,
    }
}

fn placement_of(verdict: u8) -> Placement {
    match verdict {
        VERDICT_NEAR => Placement::Near,
        VERDICT_APART => Placement::Apart,
        _ => Placement::Unknown,
    }
}

/// A round trip's buffers: what this rank sends, and where it receives.
fn trip_bufs(sent: &[u8], heard: &mut [u8]) -> CallBufs {
    CallBufs {
        input: Region::read_only(sent.as_ptr(), sent.len()),
        output: Region::new(heard.as_mut_ptr(), heard.len()),
        group: Vec::new(),
    }
}

impl Core {
    /// Runs one round trip of the probe as operation `label`.
    fn trip(&mut self, sched: &Schedule, tag: u32, label: OpLabel, bufs: CallBufs) -> Result<()> {
        let hints = Hints::default();
        self.engine.control = true;
        let res = self.execute(sched, DataType::Uint8, RedOp::Sum, tag, label, bufs, hints);
        self.engine.control = false;
        res
    }

    /// Where the two ranks' CPUs are right now, as rank 0 times and judges
    /// it and tells rank 1; `ring_ok`: this rank's side of the call may take
    /// the ring. Runs as operation `label` with `tag`, so its deadline,
    /// abort and mismatch handling are the call's.
    #[inline(never)]
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
        let mut best: Option<Duration> = None;
        for _ in 0..self.placement_source().round_trips().max(1) {
            let bufs = trip_bufs(&mine, &mut theirs);
            let start = Instant::now();
            self.trip(&trip, tag, label, bufs)?;
            let took = start.elapsed();
            best = Some(best.map_or(took, |b| b.min(took)));
        }
        let judged = self.placement_source().judge(best);
        let sent = [verdict(judged, ring_ok && theirs[0] != 0)];
        let mut heard = [0u8; 1];
        let one = schedule::round_trip(peer, 1, leads);
        let bufs = trip_bufs(&sent, &mut heard);
        self.trip(&one, tag, label, bufs)?;
        let placement = placement_of(if leads { sent[0] } else { heard[0] });
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_round_trip() {
        for (judged, both, want) in [
            (Placement::Apart, false, Placement::Apart),
            (Placement::Near, true, Placement::Near),
            (Placement::Near, false, Placement::Unknown),
            (Placement::Unknown, true, Placement::Unknown),
        ] {
            assert_eq!(placement_of(verdict(judged, both)), want);
        }
    }
}
