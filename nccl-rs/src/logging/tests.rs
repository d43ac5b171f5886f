use super::layer::{NcclLayer, Out};
use super::*;
use std::sync::{Arc, Mutex};
use tracing_subscriber::layer::SubscriberExt;

/// Runs `f` under our layer (writing to a buffer, as if stderr were not a
/// terminal unless `ansi`) and returns what it printed.
fn capture(verbosity: Verbosity, ansi: bool, f: impl FnOnce()) -> String {
    let buf = Arc::new(Mutex::new(Vec::new()));
    // Each capture has its own once-per-process flag.
    let shown: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let layer = NcclLayer {
        out: Out::Buffer(buf.clone()),
        ansi,
        verbosity,
        version_shown: shown,
        warned: Default::default(),
    };
    let subscriber = tracing_subscriber::registry()
        .with(tracing_subscriber::filter::LevelFilter::TRACE)
        .with(layer);
    tracing::subscriber::with_default(subscriber, f);
    let bytes = buf.lock().unwrap().clone();
    String::from_utf8(bytes).unwrap()
}

/// `host:pid:tid [rank] NCCL LEVEL ` and the rest, or `None` if `line`
/// lacks the prefix (`^[^:]+:\d+:\d+ \[(\d+|-)\] NCCL (WARN|INFO|TRACE) `).
fn parse(line: &str) -> Option<(String, &str, &str)> {
    let (host, rest) = line.split_once(':')?;
    let (pid, rest) = rest.split_once(':')?;
    let (tid, rest) = rest.split_once(" [")?;
    let (rank, rest) = rest.split_once("] NCCL ")?;
    let (word, text) = rest.split_once(' ')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let ok = !host.is_empty()
        && digits(pid)
        && digits(tid)
        && (digits(rank) || rank == "-")
        && ["WARN", "INFO", "TRACE"].contains(&word);
    ok.then(|| (rank.to_string(), word, text))
}

#[test]
fn nccl_debug_levels() {
    assert_eq!(level_for(Some("INFO")), "info");
    assert_eq!(level_for(Some("trace")), "trace");
    assert_eq!(level_for(Some("WARN")), "warn");
    assert_eq!(level_for(Some("VERSION")), "off");
    assert_eq!(level_for(None), "warn");
}

#[test]
fn lines_have_the_nccl_prefix() {
    let out = capture(Verbosity::Warn, false, || {
        tracing::info!(
            rank = 3,
            nranks = 4,
            transport = "SHM",
            "communicator ready"
        );
        tracing::warn!(spec = "", "no interface");
        tracing::debug!(rank = 0usize, "fine detail");
        tracing::error!(rank = 1, "broken");
    });
    let lines: Vec<_> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    for l in &lines {
        assert!(parse(l).is_some(), "no prefix: {l:?}");
    }
    let pid = std::process::id().to_string();
    assert!(
        lines[0].split(':').nth(1) == Some(pid.as_str()),
        "{}",
        lines[0]
    );
    let p = |i: usize| parse(lines[i]).unwrap();
    assert_eq!(
        p(0),
        (
            "3".into(),
            "INFO",
            "communicator ready nranks=4 transport=SHM"
        )
    );
    assert_eq!(p(1).1, "WARN");
    assert_eq!(p(1).2, "no interface spec=\"\"");
    assert_eq!((p(2).0.as_str(), p(2).1), ("0", "TRACE"));
    assert_eq!((p(3).0.as_str(), p(3).1), ("1", "WARN"));
}

#[test]
fn rank_from_span_then_thread() {
    let out = capture(Verbosity::Warn, false, || {
        let span = tracing::info_span!("op", rank = 6usize);
        let _g = span.enter();
        tracing::info!("inside");
        tracing::info!(rank = 2, "own field wins");
    });
    let lines: Vec<_> = out.lines().map(|l| parse(l).unwrap()).collect();
    assert_eq!(lines[0].0, "6");
    assert_eq!(lines[1].0, "2");
    // A thread of its own (no communicator, no operation): the op guard.
    let out = std::thread::spawn(|| {
        capture(Verbosity::Warn, false, || {
            let _r = OpRank::enter(9);
            tracing::info!("in an operation");
        })
    })
    .join()
    .unwrap();
    assert_eq!(parse(out.trim_end()).unwrap().0, "9");
}

#[test]
fn colour_only_on_a_terminal() {
    let plain = capture(Verbosity::Warn, false, || tracing::warn!("x"));
    assert!(!plain.contains('\x1b'), "{plain:?}");
    let tty = capture(Verbosity::Warn, true, || tracing::warn!("x"));
    assert!(tty.contains("\x1b[33mWARN\x1b[0m x"), "{tty:?}");
}

#[test]
fn multi_line_messages_prefix_every_line() {
    let out = capture(Verbosity::Warn, false, || {
        tracing::warn!(rank = 1, "first\nsecond")
    });
    let lines: Vec<_> = out.lines().map(|l| parse(l).unwrap()).collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(lines[1].2, "second");
}

#[test]
fn the_same_warn_prints_once() {
    let out = capture(Verbosity::Warn, false, || {
        tracing::warn!(rank = 0, "rank 0: all_reduce timed out");
        // The C API logging the error it returns, without the field.
        tracing::warn!("rank 0: all_reduce timed out");
        tracing::warn!("rank 1: all_reduce timed out");
    });
    assert_eq!(out.lines().count(), 2, "{out}");
}

#[test]
fn version_line_leads_at_info() {
    let out = capture(Verbosity::Info, false, || {
        tracing::info!(rank = 0, "first");
        tracing::info!(target: VERSION_TARGET, rank = 0, "{}", version());
        tracing::info!(rank = 0, "second");
    });
    let lines: Vec<_> = out.lines().map(|l| parse(l).unwrap()).collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert_eq!(lines[0].1, "INFO");
    assert_eq!(lines[0].2, version());
    assert!(version().starts_with("NCCL version nccl-rs "));
    assert_eq!(lines[1].2, "first");
    assert_eq!(lines[2].2, "second");
    // Below INFO no line leads with it.
    let warn = capture(Verbosity::Warn, false, || tracing::warn!("w"));
    assert!(!warn.contains("NCCL version"), "{warn}");
}

#[test]
fn version_parses_nccl_debug() {
    assert_eq!(Verbosity::parse(Some("version")), Verbosity::Version);
    assert_eq!(Verbosity::parse(Some(" Info ")), Verbosity::Info);
    assert_eq!(Verbosity::parse(Some("bogus")), Verbosity::Unset);
    assert!(Verbosity::Trace > Verbosity::Info && Verbosity::Info > Verbosity::Warn);
}
