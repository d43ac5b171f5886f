//! How each rank ended, and which rank a failed job is blamed on.
//!
//! The culprit is the first rank, in the order ncclrun saw them end, of the
//! first tier that has one:
//! 1. killed by a signal ncclrun did not send (a crash, the OOM killer);
//! 2. stopped (SIGSTOP, SIGTSTP, a debugger) when ncclrun gave up and killed
//!    it: a stopped rank never answers, so its peers' timeouts are its doing;
//! 3. the first to exit non-zero (or to vanish from `waitpid`).
//!
//! A rank that was merely still running when ncclrun killed it is never
//! blamed: after a peer failed it is usually waiting for that peer (say, in
//! rendezvous, which has no dead socket to notice).

use std::process::ExitStatus;

/// How one rank ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// It exited by itself with this status.
    Exited(i32),
    /// A signal that ncclrun did not send killed it.
    Signaled(i32),
    /// ncclrun killed it while it was stopped, by this signal when known.
    KilledStopped(Option<i32>),
    /// ncclrun killed it while it ran (or slept).
    KilledRunning,
    /// `waitpid` failed for it; the message says why.
    Lost(String),
}

impl End {
    /// How a rank that ended by itself ended.
    pub(crate) fn of(st: ExitStatus) -> End {
        use std::os::unix::process::ExitStatusExt;
        match (st.code(), st.signal()) {
            (Some(code), _) => End::Exited(code),
            (None, Some(sig)) => End::Signaled(sig),
            (None, None) => End::Lost(format!("unknown status {st}")),
        }
    }

    /// How a rank ended that ncclrun killed with SIGKILL after seeing it in
    /// `state`: its own exit or another signal that raced ours stay its own.
    pub(crate) fn after_kill(st: ExitStatus, state: State) -> End {
        match End::of(st) {
            End::Signaled(libc::SIGKILL) => match state {
                State::Stopped(sig) => End::KilledStopped(sig),
                State::Running => End::KilledRunning,
            },
            other => other,
        }
    }

    /// Whether this end fails the job.
    pub(crate) fn failed(&self) -> bool {
        *self != End::Exited(0)
    }

    /// Blame tier (lower is blamed first); `None` is never blamed.
    fn tier(&self) -> Option<u8> {
        match self {
            End::Signaled(_) => Some(1),
            End::KilledStopped(_) => Some(2),
            End::Exited(0) | End::KilledRunning => None,
            End::Exited(_) | End::Lost(_) => Some(3),
        }
    }

    /// ncclrun's exit status when this rank is the culprit: its own exit
    /// status, or 128 + the signal that killed it (SIGKILL when ncclrun did).
    pub(crate) fn exit_code(&self) -> u8 {
        let killed = 128 + libc::SIGKILL;
        let code = match self {
            End::Exited(c) => *c,
            End::Signaled(s) => 128 + s,
            End::KilledStopped(_) | End::KilledRunning => killed,
            End::Lost(_) => 1,
        };
        u8::try_from(code).unwrap_or(1).max(1)
    }

    /// What happened, after "rank R " / "ranks R, S ".
    pub(crate) fn describe(&self) -> String {
        match self {
            End::Exited(c) => format!("exited with status {c}"),
            End::Signaled(s) => format!("killed by signal {s}{}", paren_name(*s)),
            End::KilledStopped(Some(s)) => {
                format!(
                    "stopped ({}) and did not exit",
                    signal_name(*s).unwrap_or("signal")
                )
            }
            End::KilledStopped(None) => "stopped and did not exit".into(),
            End::KilledRunning => "did not exit (killed by ncclrun)".into(),
            End::Lost(why) => format!("could not be waited for ({why})"),
        }
    }
}

/// A rank's scheduling state when ncclrun gave up on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Running, sleeping or anything but stopped.
    Running,
    /// Stopped (`T`) or stopped by a tracer (`t`), by this signal when known.
    Stopped(Option<i32>),
}

/// The state of child `pid` from `/proc/<pid>/stat`, and for a stopped one
/// the signal that stopped it.
pub(crate) fn state_of(pid: u32) -> State {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    match proc_state(&stat) {
        Some('T' | 't') => State::Stopped(stop_signal(pid)),
        _ => State::Running,
    }
}

/// The state letter of a `/proc/<pid>/stat` line: the field after the
/// command name, which is in parentheses and may itself hold `)`.
fn proc_state(stat: &str) -> Option<char> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.trim_start().chars().next()
}

/// The signal that stopped child `pid`, if it is stopped and this process
/// may be told (a tracer's stop is told to the tracer only).
fn stop_signal(pid: u32) -> Option<i32> {
    let id = libc::id_t::try_from(pid).ok()?;
    // SAFETY: `siginfo_t` is plain data, valid when zeroed.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // Only WSTOPPED, and WNOWAIT: this neither reaps the child nor consumes
    // the stop, so `Child::try_wait` still sees everything it would.
    let flags = libc::WSTOPPED | libc::WNOHANG | libc::WNOWAIT;
    // SAFETY: `info` is a valid, writable `siginfo_t`; `id` names our child.
    if unsafe { libc::waitid(libc::P_PID, id, &mut info, flags) } != 0 {
        return None;
    }
    // SAFETY: waitid filled `info` (si_pid 0 when there was nothing to
    // report); for CLD_STOPPED the status field is the stopping signal.
    let (who, status) = unsafe { (info.si_pid(), info.si_status()) };
    (u32::try_from(who) == Ok(pid) && info.si_code == libc::CLD_STOPPED).then_some(status)
}

/// The name of a common signal.
pub(crate) fn signal_name(sig: i32) -> Option<&'static str> {
    let names = [
        (libc::SIGHUP, "SIGHUP"),
        (libc::SIGINT, "SIGINT"),
        (libc::SIGQUIT, "SIGQUIT"),
        (libc::SIGILL, "SIGILL"),
        (libc::SIGTRAP, "SIGTRAP"),
        (libc::SIGABRT, "SIGABRT"),
        (libc::SIGBUS, "SIGBUS"),
        (libc::SIGFPE, "SIGFPE"),
        (libc::SIGKILL, "SIGKILL"),
        (libc::SIGUSR1, "SIGUSR1"),
        (libc::SIGSEGV, "SIGSEGV"),
        (libc::SIGUSR2, "SIGUSR2"),
        (libc::SIGPIPE, "SIGPIPE"),
        (libc::SIGALRM, "SIGALRM"),
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGSTOP, "SIGSTOP"),
        (libc::SIGTSTP, "SIGTSTP"),
        (libc::SIGTTIN, "SIGTTIN"),
        (libc::SIGTTOU, "SIGTTOU"),
        (libc::SIGXCPU, "SIGXCPU"),
        (libc::SIGSYS, "SIGSYS"),
    ];
    names.iter().find(|(s, _)| *s == sig).map(|(_, n)| *n)
}

/// " (SIGSEGV)" for a named signal, "" otherwise.
fn paren_name(sig: i32) -> String {
    signal_name(sig)
        .map(|n| format!(" ({n})"))
        .unwrap_or_default()
}

/// The index in `ends` (in the order ncclrun saw them) of the rank to
/// blame, by the tiers of this module's rule; `None` when no rank is.
pub(crate) fn culprit(ends: &[(usize, End)]) -> Option<usize> {
    (1..=3).find_map(|tier| ends.iter().position(|(_, e)| e.tier() == Some(tier)))
}

/// "rank 2" or "ranks 0, 1, 3".
fn ranks(list: &[usize]) -> String {
    let s: Vec<String> = list.iter().map(usize::to_string).collect();
    match list.len() {
        1 => format!("rank {}", s[0]),
        _ => format!("ranks {}", s.join(", ")),
    }
}

/// The summary of a failed job: the culprit first (if there is one), then
/// every other rank, grouped by how it ended, in rank order.
pub(crate) fn summary(ends: &[(usize, End)]) -> String {
    let blamed = culprit(ends);
    let mut parts = Vec::new();
    if let Some(i) = blamed {
        let (rank, end) = &ends[i];
        parts.push(format!("rank {rank} {}", end.describe()));
    }
    let mut rest: Vec<(usize, String)> = ends
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != blamed)
        .map(|(_, (r, e))| (*r, e.describe()))
        .collect();
    rest.sort();
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    for (rank, what) in rest {
        match groups.iter_mut().find(|(w, _)| *w == what) {
            Some((_, list)) => list.push(rank),
            None => groups.push((what, vec![rank])),
        }
    }
    parts.extend(
        groups
            .iter()
            .map(|(what, list)| format!("{} {what}", ranks(list))),
    );
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn stopped_rank_is_blamed_before_the_first_exit() {
        let ends = vec![
            (1, End::Exited(1)),
            (3, End::Exited(1)),
            (0, End::Exited(1)),
            (2, End::KilledStopped(Some(libc::SIGSTOP))),
        ];
        assert_eq!(culprit(&ends), Some(3));
        assert_eq!(
            summary(&ends),
            "rank 2 stopped (SIGSTOP) and did not exit; ranks 0, 1, 3 exited with status 1"
        );
        assert_eq!(ends[3].1.exit_code(), 137);
    }

    #[test]
    fn crash_first_then_stop_then_first_exit() {
        let ends = vec![
            (0, End::Exited(1)),
            (1, End::KilledStopped(None)),
            (2, End::Signaled(libc::SIGSEGV)),
        ];
        assert_eq!(culprit(&ends), Some(2));
        assert_eq!(ends[2].1.exit_code(), 128 + 11);
        assert!(summary(&ends).starts_with("rank 2 killed by signal 11 (SIGSEGV); rank 0 exited"));
        // The first non-zero exit, not ranks still running at the grace's end.
        let ends = vec![
            (3, End::Exited(0)),
            (1, End::Exited(4)),
            (0, End::KilledRunning),
            (2, End::KilledRunning),
        ];
        assert_eq!(culprit(&ends), Some(1));
        assert_eq!(ends[1].1.exit_code(), 4);
        assert_eq!(
            summary(&ends),
            "rank 1 exited with status 4; ranks 0, 2 did not exit (killed by ncclrun); rank 3 exited with status 0"
        );
        // Nobody to blame (say, --timeout with every rank running).
        let ends = vec![(0, End::KilledRunning), (1, End::KilledRunning)];
        assert_eq!(culprit(&ends), None);
        assert_eq!(
            summary(&ends),
            "ranks 0, 1 did not exit (killed by ncclrun)"
        );
    }

    #[test]
    fn statuses_and_kills() {
        let exit3 = ExitStatus::from_raw(3 << 8);
        let sigkill = ExitStatus::from_raw(libc::SIGKILL);
        let sigsegv = ExitStatus::from_raw(libc::SIGSEGV);
        assert_eq!(End::of(exit3), End::Exited(3));
        assert_eq!(End::of(sigsegv), End::Signaled(libc::SIGSEGV));
        assert_eq!(End::of(sigkill).exit_code(), 137);
        let stopped = State::Stopped(Some(libc::SIGTSTP));
        assert_eq!(
            End::after_kill(sigkill, stopped),
            End::KilledStopped(Some(libc::SIGTSTP))
        );
        assert_eq!(End::after_kill(sigkill, State::Running), End::KilledRunning);
        // It exited, or something else killed it, before our SIGKILL landed.
        assert_eq!(End::after_kill(exit3, stopped), End::Exited(3));
        assert_eq!(
            End::after_kill(sigsegv, State::Running),
            End::Signaled(libc::SIGSEGV)
        );
        assert!(!End::Exited(0).failed() && End::KilledRunning.failed());
        assert_eq!(
            End::Exited(0).exit_code(),
            1,
            "a culprit never maps to success"
        );
        assert_eq!(End::Exited(300).exit_code(), 1);
    }

    #[test]
    fn proc_stat_state() {
        assert_eq!(proc_state("42 (a) b) T 1 2"), Some('T'));
        assert_eq!(proc_state("42 (all_reduce_perf) S 1"), Some('S'));
        assert_eq!(proc_state(""), None);
        assert_eq!(proc_state("42 (x)"), None);
        assert_eq!(state_of(std::process::id()), State::Running);
    }
}
