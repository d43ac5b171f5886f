//! Logging as NCCL prints it, through `tracing`.
//!
//! Every line reads `host:pid:tid [rank] NCCL LEVEL message key=value...`
//! (NCCL puts the CUDA device in the brackets; the rank says more here).
//! The level words are WARN (also `tracing`'s ERROR), INFO and TRACE (also
//! DEBUG, since only `NCCL_DEBUG=TRACE` shows those events). The rank is
//! the event's `rank` field, else an enclosing span's, else the rank of the
//! operation the thread runs, of the thread's first communicator, of the
//! process, or the launcher's `RANK`-style variable; `-` if none is known.
//! Each line is written with one `write`, so ranks sharing a terminal do
//! not interleave; colour only where stderr is a terminal. An identical WARN within a minute is printed once.
//!
//! The version line (`NCCL version nccl-rs X.Y.Z`) comes once per process:
//! with `NCCL_DEBUG=VERSION` or `WARN` bare, at the first communicator's
//! init (as NCCL; `VERSION` prints nothing else); with `INFO` or `TRACE`
//! as the first INFO line.

mod layer;
mod line;
mod rank;
#[cfg(test)]
mod tests;

pub(crate) use rank::OpRank;

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Once;

/// The target of the event asking for the version line.
const VERSION_TARGET: &str = "nccl_rs::version";

/// `NCCL_DEBUG`, in NCCL's order of verbosity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Verbosity {
    /// `NONE`: nothing.
    Off,
    /// Not set (or not understood): warnings, no version line (NCCL prints
    /// nothing by default; warnings are kept here).
    Unset,
    /// `VERSION`: the version line only.
    Version,
    /// `WARN` (and `ABORT`): the version line and warnings.
    Warn,
    /// `INFO`.
    Info,
    /// `TRACE`.
    Trace,
}

impl Verbosity {
    pub(crate) fn parse(debug: Option<&str>) -> Verbosity {
        match debug.map(|s| s.trim().to_ascii_uppercase()).as_deref() {
            Some("TRACE") => Verbosity::Trace,
            Some("INFO") => Verbosity::Info,
            Some("ABORT") | Some("WARN") => Verbosity::Warn,
            Some("VERSION") => Verbosity::Version,
            Some("NONE") => Verbosity::Off,
            _ => Verbosity::Unset,
        }
    }

    /// The `tracing` filter.
    fn filter(self) -> &'static str {
        match self {
            Verbosity::Trace => "trace",
            Verbosity::Info => "info",
            Verbosity::Warn | Verbosity::Unset => "warn",
            Verbosity::Version | Verbosity::Off => "off",
        }
    }
}

/// How logging was set up: 0 by someone else (or not yet), else our layer
/// at `Verbosity as u8 + 1`.
static INSTALLED: AtomicU8 = AtomicU8::new(0);

/// Set once the version line is out.
static VERSION_SHOWN: AtomicBool = AtomicBool::new(false);

/// The version line: this crate's version (the NCCL API version is the C
/// library's, `ncclGetVersion`, which this crate does not see), and the CUDA
/// driver API it binds where built with `cuda`.
pub(crate) fn version() -> String {
    let cuda = if cfg!(feature = "cuda") {
        "+cuda12.8"
    } else {
        ""
    };
    format!("NCCL version nccl-rs {}{cuda}", env!("CARGO_PKG_VERSION"))
}

/// Installs a `tracing` subscriber writing NCCL-style lines to stderr, at
/// the level given by `NCCL_DEBUG` (of [`crate::Config::global_log`]) (`VERSION` → the version line only,
/// `WARN` → warnings, `INFO`, `TRACE`; unset → warnings). `RUST_LOG`, if
/// set, overrides the filter. Calling it again does nothing; if the program
/// already installed a subscriber, that one is kept.
pub fn init_logging() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| install(None, None));
}

/// As [`init_logging`], with the `tracing` filter `directives` (as
/// `RUST_LOG` takes them) in place of the one `NCCL_DEBUG` gives, and the
/// lines written to `file` instead of stderr when there is one (the C
/// library's `NCCL_DEBUG_SUBSYS` and `NCCL_DEBUG_FILE`). The lines keep
/// their NCCL form. Does nothing if a subscriber is already installed.
pub fn init_logging_to(directives: Option<String>, file: Option<std::fs::File>) {
    install(directives, file);
}

fn install(directives: Option<String>, file: Option<std::fs::File>) {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let verbosity = Verbosity::parse(crate::Config::global_log().debug.as_deref());
    // `RUST_LOG` is `tracing`'s own variable, not a setting of this library
    // (not in `config::VARS`): read here, where the filter is made.
    let filter = directives
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| verbosity.filter().to_string());
    rank::set_launcher(crate::launch::LaunchEnv::detect().map(|e| e.rank));
    let (out, ansi) = match file {
        Some(f) => (layer::Out::File(std::sync::Mutex::new(f)), false),
        None => (layer::Out::Stderr, std::io::stderr().is_terminal()),
    };
    let layer = layer::NcclLayer {
        out,
        ansi,
        verbosity,
        version_shown: &VERSION_SHOWN,
        warned: Default::default(),
    };
    let installed = tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new(filter))
        .with(layer)
        .try_init()
        .is_ok();
    if installed {
        INSTALLED.store(verbosity as u8 + 1, Ordering::Relaxed);
    }
}

/// Our layer's verbosity, if our layer is the one installed.
fn installed() -> Option<Verbosity> {
    const ALL: [Verbosity; 6] = [
        Verbosity::Off,
        Verbosity::Unset,
        Verbosity::Version,
        Verbosity::Warn,
        Verbosity::Info,
        Verbosity::Trace,
    ];
    let v = INSTALLED.load(Ordering::Relaxed);
    ALL.into_iter().find(|a| *a as u8 + 1 == v)
}

/// Registers `rank` as this thread's (and, unless other threads hold other
/// ranks, this process's) rank for log lines, and prints the version line
/// if it is due. Called when a communicator is created.
pub(crate) fn set_process_rank(rank: usize) {
    rank::register(rank);
    if VERSION_SHOWN.load(Ordering::Relaxed) {
        return;
    }
    match installed() {
        Some(Verbosity::Version | Verbosity::Warn) => {
            if !VERSION_SHOWN.swap(true, Ordering::Relaxed) {
                line::write_stderr(format!("{}\n", version()).as_bytes());
            }
        }
        // Our layer prints it, unless a line already led with it.
        Some(Verbosity::Info | Verbosity::Trace) => {
            tracing::info!(target: VERSION_TARGET, rank, "{}", version());
        }
        Some(Verbosity::Unset | Verbosity::Off) => {}
        // Someone else's subscriber: an INFO event, once.
        None => {
            if !VERSION_SHOWN.swap(true, Ordering::Relaxed) {
                tracing::info!(rank, "{}", version());
            }
        }
    }
}

/// The tracing filter for an `NCCL_DEBUG` value.
#[cfg(test)]
pub(crate) fn level_for(debug: Option<&str>) -> &'static str {
    Verbosity::parse(debug).filter()
}
