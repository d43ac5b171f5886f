//! `NCCL_DEBUG`, `NCCL_DEBUG_SUBSYS` and `NCCL_DEBUG_FILE`, through
//! `tracing`. Started by the first API call.
//!
//! With neither `NCCL_DEBUG_SUBSYS` nor `NCCL_DEBUG_FILE` set, the core's
//! `init_logging` does the job (stderr, level from `NCCL_DEBUG`). Otherwise
//! a subscriber is installed here:
//! * `NCCL_DEBUG_FILE`: log to this file instead of stderr; `%h` becomes
//!   the host name and `%p` the process id, as in NCCL.
//! * `NCCL_DEBUG_SUBSYS`: comma-separated NCCL subsystems (`INIT`, `COLL`,
//!   `P2P`, `NET`, `SHM`, `BOOTSTRAP`, `ENV`, `GRAPH`, `TUNING`, `ALLOC`,
//!   `CALL`, `ALL`; a leading `^` excludes the listed ones). They select the
//!   Rust modules whose INFO/TRACE events are shown; warnings always are.
//!   Default: `INIT,BOOTSTRAP,ENV`, as NCCL.

use std::sync::Once;

/// Starts logging once per process.
pub(crate) fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Read once with every other variable (`nccl_rs::Config`).
        let log = nccl_rs::Config::global_log();
        let file = log.debug_file.clone();
        let subsys = log.debug_subsys.clone();
        if file.is_none() && subsys.is_none() {
            nccl_rs::init_logging();
            return;
        }
        let level = level(log.debug.as_deref());
        // `RUST_LOG` is `tracing`'s own variable, not a setting of the
        // library (not in `nccl_rs::config::VARS`): read where it is used.
        let directives = std::env::var("RUST_LOG")
            .unwrap_or_else(|_| filter(level, subsys.as_deref().unwrap_or("INIT,BOOTSTRAP,ENV")));
        // A file that cannot be created leaves the lines on stderr.
        let file = file.and_then(|f| std::fs::File::create(file_name(&f)).ok());
        nccl_rs::init_logging_to(Some(directives), file);
    });
}

/// The tracing level for an `NCCL_DEBUG` value.
fn level(debug: Option<&str>) -> &'static str {
    match debug.map(|s| s.trim().to_ascii_uppercase()).as_deref() {
        Some("TRACE") => "trace",
        Some("INFO") => "info",
        Some("NONE") => "off",
        Some("ABORT") => "error",
        _ => "warn",
    }
}

/// Rust modules of each NCCL subsystem.
fn targets(subsys: &str) -> &'static [&'static str] {
    match subsys {
        "INIT" => &[
            "nccl::init",
            "nccl::manage",
            "nccl::device",
            "nccl_rs::comm",
            "nccl_rs::launch",
            "nccl_rs::cuda",
        ],
        "COLL" => &[
            "nccl::coll",
            "nccl::group",
            "nccl_rs::comm",
            "nccl_rs::engine",
        ],
        "P2P" => &["nccl::coll", "nccl_rs::comm", "nccl_rs::engine"],
        "NET" => &[
            "transport_tcp",
            "nccl_net",
            "nccl_rs::transport",
            "nccl_rs::cuda",
        ],
        "SHM" => &["nccl_rs::transport"],
        "BOOTSTRAP" => &["nccl_rs::bootstrap"],
        "ENV" => &["nccl::config", "nccl::stubs", "nccl_rs::config"],
        "GRAPH" | "TUNING" => &["nccl_rs::plan", "nccl_rs::schedule"],
        "ALLOC" => &["nccl::mem", "nccl_rs::engine", "nccl_rs::cuda"],
        "CALL" => &["nccl"],
        _ => &[],
    }
}

/// `EnvFilter` directives for a level and an `NCCL_DEBUG_SUBSYS` value.
fn filter(level: &str, subsys: &str) -> String {
    let (exclude, list) = match subsys.trim().strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, subsys.trim()),
    };
    let names: Vec<String> = list
        .split(',')
        .map(|s| s.trim().to_ascii_uppercase())
        .filter(|s| !s.is_empty())
        .collect();
    let quiet = if level == "off" || level == "error" {
        level
    } else {
        "warn"
    };
    if names.iter().any(|n| n == "ALL") {
        return if exclude {
            quiet.to_string()
        } else {
            level.to_string()
        };
    }
    let mut out = vec![if exclude { level } else { quiet }.to_string()];
    for t in names.iter().flat_map(|n| targets(n)) {
        out.push(format!("{t}={}", if exclude { quiet } else { level }));
    }
    out.join(",")
}

/// `NCCL_DEBUG_FILE` with `%h` and `%p` replaced.
fn file_name(pattern: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    pattern
        .replace("%h", &host)
        .replace("%p", &std::process::id().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subsys_filters() {
        assert_eq!(filter("info", "ALL"), "info");
        assert_eq!(filter("info", "BOOTSTRAP"), "warn,nccl_rs::bootstrap=info");
        assert_eq!(
            filter("info", "^NET"),
            "info,transport_tcp=warn,nccl_net=warn,nccl_rs::transport=warn,nccl_rs::cuda=warn"
        );
        assert_eq!(level(Some("info")), "info");
        assert_eq!(level(None), "warn");
        assert!(file_name("nccl.%h.%p.log").contains(&std::process::id().to_string()));
    }
}
