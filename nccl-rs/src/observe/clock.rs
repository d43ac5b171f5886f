//! The clock of per-call latencies, read twice per call and so kept cheap.
//!
//! Where the kernel keeps time with the CPU's time-stamp counter (its
//! clocksource is `tsc`: the counter is invariant and agrees across CPUs),
//! a stamp is one `rdtsc`, converted to nanoseconds at a rate measured
//! once per process; that is what `clock_gettime` reads too, without its
//! conversion on every read. Elsewhere a stamp is an [`Instant`].

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// When a call started, in the clock's own units.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stamp(u64);

#[derive(Clone, Copy, Debug)]
enum Source {
    /// The time-stamp counter, at this many nanoseconds per tick.
    Tsc { ns_per_tick: f64 },
    /// Nanoseconds since the process's first stamp.
    Monotonic,
}

static SOURCE: OnceLock<Source> = OnceLock::new();
static EPOCH: OnceLock<Instant> = OnceLock::new();

/// How long the rate of the counter is measured against `Instant`: long
/// enough that the two clocks' read costs (tens of ns) do not matter.
const CALIBRATION: Duration = Duration::from_millis(2);

/// Chooses and calibrates the clock; the first communicator of a process
/// calls it at init, so no call pays for the calibration.
pub(crate) fn init() {
    source();
}

/// Now.
#[inline]
pub(crate) fn now() -> Stamp {
    match source() {
        Source::Tsc { .. } => Stamp(ticks()),
        Source::Monotonic => Stamp(monotonic_ns()),
    }
}

/// The time since `start`.
#[inline]
pub(crate) fn since(start: Stamp) -> Duration {
    match source() {
        Source::Tsc { ns_per_tick } => {
            Duration::from_nanos((ticks().saturating_sub(start.0) as f64 * ns_per_tick) as u64)
        }
        Source::Monotonic => Duration::from_nanos(monotonic_ns().saturating_sub(start.0)),
    }
}

fn source() -> Source {
    *SOURCE.get_or_init(|| {
        if !kernel_uses_tsc() {
            return Source::Monotonic;
        }
        let (i0, t0) = (Instant::now(), ticks());
        while i0.elapsed() < CALIBRATION {
            std::hint::spin_loop();
        }
        let (i1, t1) = (Instant::now(), ticks());
        match t1.checked_sub(t0) {
            Some(d) if d > 0 => Source::Tsc {
                ns_per_tick: (i1 - i0).as_nanos() as f64 / d as f64,
            },
            _ => Source::Monotonic,
        }
    })
}

fn monotonic_ns() -> u64 {
    let epoch = *EPOCH.get_or_init(Instant::now);
    epoch.elapsed().as_nanos().min(u64::MAX as u128) as u64
}

/// Whether the kernel's clocksource is the time-stamp counter (and this
/// is x86-64, where `rdtsc` reads it).
fn kernel_uses_tsc() -> bool {
    cfg!(target_arch = "x86_64")
        && std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .is_ok_and(|s| s.trim() == "tsc")
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn ticks() -> u64 {
    // SAFETY: `rdtsc` has no preconditions; it reads a counter every
    // x86-64 CPU has.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn ticks() -> u64 {
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees_with_instant() {
        init();
        let (s, i) = (now(), Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let (ours, theirs) = (since(s), i.elapsed());
        // Both read after the same sleep: within 1% of each other (the
        // rate's error is far smaller; the rest is the reads' order).
        let diff = ours.abs_diff(theirs);
        assert!(diff < theirs / 100, "ours {ours:?} instant {theirs:?}");
        assert!(since(now()) < Duration::from_millis(5));
    }
}
