//! The `tracing` layer that prints NCCL-style lines.

use super::line::{self, Word};
use super::{rank, Verbosity, VERSION_TARGET};
use std::collections::VecDeque;
use std::fmt::{self, Write as _};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// Where the lines go.
pub(crate) enum Out {
    Stderr,
    /// A file (`NCCL_DEBUG_FILE`), one `write` per line.
    File(Mutex<std::fs::File>),
    /// A buffer (the tests read it).
    #[cfg(test)]
    Buffer(std::sync::Arc<Mutex<Vec<u8>>>),
}

impl Out {
    fn write(&self, bytes: &[u8]) {
        match self {
            Out::Stderr => line::write_stderr(bytes),
            Out::File(f) => {
                use std::io::Write;
                let _ = f.lock().unwrap_or_else(|p| p.into_inner()).write_all(bytes);
            }
            #[cfg(test)]
            Out::Buffer(b) => b
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(bytes),
        }
    }
}

/// Prints each event as one `host:pid:tid [rank] NCCL LEVEL message
/// key=value...` line (see the module's parent for the rank's sources).
pub(crate) struct NcclLayer {
    pub(crate) out: Out,
    /// Colour the level word (only when stderr is a terminal).
    pub(crate) ansi: bool,
    /// `NCCL_DEBUG`, which decides whether the version line leads.
    pub(crate) verbosity: Verbosity,
    /// Set once the version line is out (once per process).
    pub(crate) version_shown: &'static AtomicBool,
    /// Recent WARN texts, so that a failure logged where it happens and
    /// again by the layer that returns it (the C API logs every error it
    /// hands back) shows once.
    pub(crate) warned: Mutex<VecDeque<(u64, Instant)>>,
}

/// How long, and how many, WARN texts are remembered for [`NcclLayer::warned`].
const WARN_MEMORY: Duration = Duration::from_secs(60);
const WARN_MEMORY_LEN: usize = 32;

/// A span's `rank` field.
struct SpanRank(usize);

impl NcclLayer {
    /// Whether a WARN of this text is new (recording it if so).
    fn first_warn(&self, message: &str, rest: &str) -> bool {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (message, rest).hash(&mut h);
        let key = h.finish();
        let now = Instant::now();
        let mut seen = self.warned.lock().unwrap_or_else(|p| p.into_inner());
        seen.retain(|(_, at)| now.duration_since(*at) < WARN_MEMORY);
        if seen.iter().any(|(k, _)| *k == key) {
            return false;
        }
        if seen.len() >= WARN_MEMORY_LEN {
            seen.pop_front();
        }
        seen.push_back((key, now));
        true
    }

    /// Claims the version line if it is still due (once per process).
    fn claim_version(&self) -> bool {
        !self.version_shown.swap(true, Ordering::Relaxed)
    }
}

impl<S> tracing_subscriber::Layer<S> for NcclLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut v = RankOnly(None);
        attrs.record(&mut v);
        if let (Some(r), Some(span)) = (v.0, ctx.span(id)) {
            span.extensions_mut().replace(SpanRank(r));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let mut v = RankOnly(None);
        values.record(&mut v);
        if let (Some(r), Some(span)) = (v.0, ctx.span(id)) {
            span.extensions_mut().replace(SpanRank(r));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let meta = event.metadata();
        let word = Word::of(meta.level());
        let mut f = Fields::default();
        event.record(&mut f);
        let rank = f
            .rank
            .or_else(|| {
                let scope = ctx.event_scope(event)?;
                scope
                    .into_iter()
                    .find_map(|s| s.extensions().get::<SpanRank>().map(|r| r.0))
            })
            .or_else(rank::current);
        let mut out = String::with_capacity(128 + f.message.len() + f.rest.len());
        if meta.target() == VERSION_TARGET {
            // The communicator's request for the version line: printed
            // unless an earlier line already led with it.
            if self.claim_version() {
                line::push(&mut out, Word::Info, rank, &f.message, self.ansi);
                self.out.write(out.as_bytes());
            }
            return;
        }
        if word == Word::Warn && !self.first_warn(&f.message, &f.rest) {
            return;
        }
        if self.verbosity >= Verbosity::Info && self.claim_version() {
            line::push(&mut out, Word::Info, rank, &super::version(), self.ansi);
        }
        f.message.push_str(&f.rest);
        line::push(&mut out, word, rank, &f.message, self.ansi);
        self.out.write(out.as_bytes());
    }
}

/// Reads a `rank` field's value.
fn rank_value(v: &dyn fmt::Debug) -> Option<usize> {
    format!("{v:?}").trim_matches('"').parse().ok()
}

/// Finds the `rank` field of a span.
struct RankOnly(Option<usize>);

impl Visit for RankOnly {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "rank" {
            self.0 = usize::try_from(value).ok();
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if field.name() == "rank" {
            self.0 = usize::try_from(value).ok();
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "rank" {
            self.0 = rank_value(value);
        }
    }
}

/// An event's message, its `rank`, and its other fields as ` key=value`.
#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
    rank: Option<usize>,
}

impl Fields {
    /// Whether `field` is kept in `rest`: not the rank (it is in the
    /// brackets) nor the `log` crate's bookkeeping.
    fn kept(field: &Field) -> bool {
        field.name() != "rank" && !field.name().starts_with("log.")
    }
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "rank" {
            self.rank = usize::try_from(value).ok();
        } else if Fields::kept(field) {
            let _ = write!(self.rest, " {}={value}", field.name());
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if field.name() == "rank" {
            self.rank = usize::try_from(value).ok();
        } else if Fields::kept(field) {
            let _ = write!(self.rest, " {}={value}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else if field.name() == "rank" {
            self.rank = value.trim().parse().ok();
        } else if Fields::kept(field) {
            // Bare where that stays one word; quoted otherwise.
            if value.is_empty()
                || value.contains(|c: char| c.is_whitespace() || c == '"' || c == '=')
            {
                let _ = write!(self.rest, " {}={value:?}", field.name());
            } else {
                let _ = write!(self.rest, " {}={value}", field.name());
            }
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else if field.name() == "rank" {
            self.rank = rank_value(value);
        } else if Fields::kept(field) {
            let _ = write!(self.rest, " {}={value:?}", field.name());
        }
    }
}
