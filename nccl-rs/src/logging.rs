//! Maps `NCCL_DEBUG` onto `tracing` levels.

use std::sync::Once;

/// Installs a `tracing` subscriber writing to stderr, at the level given by
/// `NCCL_DEBUG` (`VERSION`/`WARN` → warn, `INFO` → info, `TRACE` → trace;
/// unset → warn). `RUST_LOG`, if set, wins. Calling it again does nothing;
/// if the program already installed a subscriber, that one is kept.
pub fn init_logging() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let level = level_for(std::env::var("NCCL_DEBUG").ok().as_deref());
        let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| level.to_string());
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .with_target(false)
            .try_init();
    });
}

/// The tracing filter for an `NCCL_DEBUG` value.
pub(crate) fn level_for(debug: Option<&str>) -> &'static str {
    match debug.map(|s| s.trim().to_ascii_uppercase()).as_deref() {
        Some("TRACE") => "trace",
        Some("INFO") => "info",
        Some("ABORT") | Some("WARN") | Some("VERSION") => "warn",
        Some("NONE") => "off",
        _ => "warn",
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn nccl_debug_levels() {
        assert_eq!(super::level_for(Some("INFO")), "info");
        assert_eq!(super::level_for(Some("trace")), "trace");
        assert_eq!(super::level_for(Some("WARN")), "warn");
        assert_eq!(super::level_for(None), "warn");
    }
}
