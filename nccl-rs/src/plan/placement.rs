//! Where two ranks' CPUs sit relative to each other: the one fact about
//! placement the call plan reads, and the one source it comes from.
//!
//! A plain store into a line another CPU read last waits for that line to
//! come back across the caches; a streaming store does not, but leaves the
//! reader to fetch the data from memory. So while two CPUs share a
//! last-level cache, the plan copies through the shared-memory ring with
//! plain stores; while they do not, it streams, or has the receiver read
//! the sender's buffer once (single copy).
//!
//! [`PlacementSource`] says which, per call. `NCCL_RS_PLACEMENT` picks the
//! source: `adaptive` (the default) times round trips to the peer before
//! the calls whose plan depends on it ([`RoundTrips`]); `near`, `apart` or
//! `unknown` fix the answer ([`Fixed`]), and tests inject either.

use std::time::Duration;

/// Where a peer's CPU is, relative to ours, as the plan uses it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Not known: the plan takes the choices that do not depend on it.
    #[default]
    Unknown,
    /// The two CPUs share a last-level cache.
    Near,
    /// They do not (another socket, or a virtual CPU the host moved).
    Apart,
}

impl Placement {
    /// `NCCL_RS_PLACEMENT`'s fixed values.
    pub fn parse(s: &str) -> Option<Placement> {
        match s.trim().to_ascii_lowercase().as_str() {
            "near" => Some(Placement::Near),
            "apart" => Some(Placement::Apart),
            "unknown" => Some(Placement::Unknown),
            _ => None,
        }
    }
}

/// `NCCL_RS_PLACEMENT`: measured per call, or fixed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PlacementMode {
    /// Timed before the calls whose plan depends on it ([`RoundTrips`]).
    #[default]
    Adaptive,
    /// Always this ([`Fixed`]).
    Fixed(Placement),
}

impl PlacementMode {
    /// Parses `NCCL_RS_PLACEMENT`.
    pub fn parse(s: &str) -> Option<PlacementMode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "adaptive" | "1" | "on" => Some(PlacementMode::Adaptive),
            "0" | "off" => Some(PlacementMode::Fixed(Placement::Unknown)),
            other => Placement::parse(other).map(PlacementMode::Fixed),
        }
    }

    /// The source this mode names.
    pub(crate) fn source(self) -> Box<dyn PlacementSource> {
        match self {
            PlacementMode::Adaptive => Box::new(RoundTrips::default()),
            PlacementMode::Fixed(p) => Box::new(Fixed(p)),
        }
    }
}

/// Says where the peer's CPU is for one call. `round_trip` times one round
/// trip to the peer through the engine's eager path (both ranks take part
/// in as many as the leader asks for: the caller runs them as part of the
/// call, and the leader's verdict is the one both ranks plan with).
pub(crate) trait PlacementSource: Send {
    /// Whether the answer comes from measuring (the caller then runs the
    /// round trips on both ranks).
    fn measures(&self) -> bool;

    /// The placement, from up to [`PlacementSource::round_trips`] timed
    /// round trips (the fastest counts: a late look only adds time).
    fn judge(&self, fastest: Option<Duration>) -> Placement;

    /// How many round trips [`PlacementSource::judge`] wants.
    fn round_trips(&self) -> usize {
        if self.measures() {
            ROUND_TRIPS
        } else {
            0
        }
    }
}

/// Round trips timed per measurement.
pub(crate) const ROUND_TRIPS: usize = 5;

/// The fastest round trip this long or longer says the two CPUs do not
/// share a cache: a cache-line round trip inside one last-level cache
/// takes well under 100 ns, across sockets or caches several hundred, and
/// a round trip through the engine adds a few hundred of its own.
pub(crate) const APART_AT: Duration = Duration::from_nanos(600);

/// A placement that does not change: configured, or a test's.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fixed(pub(crate) Placement);

impl PlacementSource for Fixed {
    fn measures(&self) -> bool {
        false
    }

    fn judge(&self, _fastest: Option<Duration>) -> Placement {
        self.0
    }
}

/// Placement measured by timing round trips to the peer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RoundTrips {
    pub(crate) apart_at: Duration,
}

impl Default for RoundTrips {
    fn default() -> Self {
        RoundTrips { apart_at: APART_AT }
    }
}

impl PlacementSource for RoundTrips {
    fn measures(&self) -> bool {
        true
    }

    fn judge(&self, fastest: Option<Duration>) -> Placement {
        match fastest {
            Some(t) if t >= self.apart_at => Placement::Apart,
            Some(_) => Placement::Near,
            None => Placement::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse() {
        for (s, want) in [
            ("adaptive", Some(PlacementMode::Adaptive)),
            ("1", Some(PlacementMode::Adaptive)),
            ("0", Some(PlacementMode::Fixed(Placement::Unknown))),
            ("Near", Some(PlacementMode::Fixed(Placement::Near))),
            ("apart", Some(PlacementMode::Fixed(Placement::Apart))),
            ("unknown", Some(PlacementMode::Fixed(Placement::Unknown))),
            ("sideways", None),
        ] {
            assert_eq!(PlacementMode::parse(s), want, "{s}");
        }
    }

    #[test]
    fn round_trips_judge_by_the_fastest() {
        let r = RoundTrips::default();
        assert_eq!(r.round_trips(), ROUND_TRIPS);
        assert_eq!(r.judge(Some(APART_AT)), Placement::Apart);
        assert_eq!(
            r.judge(Some(APART_AT - Duration::from_nanos(1))),
            Placement::Near
        );
        assert_eq!(r.judge(None), Placement::Unknown);
        let f = Fixed(Placement::Apart);
        assert_eq!(f.round_trips(), 0);
        assert_eq!(f.judge(Some(Duration::ZERO)), Placement::Apart);
    }
}
