//! One log line as NCCL prints it: `host:pid:tid [rank] NCCL LEVEL text`,
//! and its single write to stderr.

use std::cell::Cell;
use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::OnceLock;

/// The level words of a line. NCCL's debug levels have no ERROR or DEBUG:
/// errors are WARN, and `tracing`'s DEBUG is TRACE, since only
/// `NCCL_DEBUG=TRACE` shows those events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Word {
    Warn,
    Info,
    Trace,
}

impl Word {
    pub(crate) fn of(level: &tracing::Level) -> Word {
        match *level {
            tracing::Level::ERROR | tracing::Level::WARN => Word::Warn,
            tracing::Level::INFO => Word::Info,
            _ => Word::Trace,
        }
    }

    fn text(self) -> &'static str {
        match self {
            Word::Warn => "WARN",
            Word::Info => "INFO",
            Word::Trace => "TRACE",
        }
    }

    /// SGR colour of the word on a terminal: yellow, green, magenta.
    fn colour(self) -> &'static str {
        match self {
            Word::Warn => "\x1b[33m",
            Word::Info => "\x1b[32m",
            Word::Trace => "\x1b[35m",
        }
    }
}

/// The host name up to its first dot, as NCCL shortens it.
fn host() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        let mut buf = [0u8; 256];
        // SAFETY: `buf` is writable for `buf.len()` bytes; gethostname
        // writes at most that many and does not keep the pointer.
        let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
        let name = if rc == 0 {
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            String::from_utf8_lossy(&buf[..end]).into_owned()
        } else {
            String::new()
        };
        match name.split('.').next() {
            Some(h) if !h.is_empty() => h.to_string(),
            _ => "localhost".to_string(),
        }
    })
}

/// This thread's kernel thread id (as NCCL and `top -H` show it), cached.
pub(crate) fn tid() -> u32 {
    thread_local! {
        static TID: Cell<u32> = const { Cell::new(0) };
    }
    let cached = TID.try_with(Cell::get).unwrap_or(0);
    if cached != 0 {
        return cached;
    }
    let id = os_tid();
    let _ = TID.try_with(|t| t.set(id));
    id
}

#[cfg(target_os = "linux")]
fn os_tid() -> u32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    let id = unsafe { libc::syscall(libc::SYS_gettid) };
    u32::try_from(id).unwrap_or(0)
}

#[cfg(not(target_os = "linux"))]
fn os_tid() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    // No kernel thread id to show: number threads in the order they log.
    static NEXT: AtomicU32 = AtomicU32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Appends `text` to `out` as lines of `word` naming `rank` (`-` if
/// unknown): every line of a multi-line text gets the prefix, so that each
/// can be told apart when ranks share a terminal.
pub(crate) fn push(out: &mut String, word: Word, rank: Option<usize>, text: &str, ansi: bool) {
    let text = text.strip_suffix('\n').unwrap_or(text);
    for part in text.split('\n') {
        let _ = write!(out, "{}:{}:{} [", host(), std::process::id(), tid());
        match rank {
            Some(r) => {
                let _ = write!(out, "{r}");
            }
            None => out.push('-'),
        }
        out.push_str("] NCCL ");
        if ansi {
            let _ = write!(out, "{}{}\x1b[0m ", word.colour(), word.text());
        } else {
            let _ = write!(out, "{} ", word.text());
        }
        out.push_str(part);
        out.push('\n');
    }
}

/// Writes `bytes` to stderr with one `write_all` on the locked, unbuffered
/// handle: up to `PIPE_BUF` bytes that is one atomic `write`, so lines of
/// processes sharing a pipe or terminal do not interleave.
pub(crate) fn write_stderr(bytes: &[u8]) {
    let _ = std::io::stderr().lock().write_all(bytes);
}
