//! Finding and opening the plugin library, as NCCL does, once per process.

use super::ffi::{self, FinalizeFn, RecordFn, StartFn, StopFn};
use std::ffi::{c_char, c_int, c_ulong, c_void, CStr, CString};
use std::sync::OnceLock;

/// The interface versions looked up, newest first.
pub(crate) const VERSIONS: [u32; 2] = [5, 4];

/// The library names `dlopen` is asked for, in order, for a value of
/// `NCCL_PROFILER_PLUGIN` (`None`: unset), following NCCL: unset, the
/// default `libnccl-profiler.so`; `none` (any case), nothing; otherwise
/// the value itself (a path or a library name), then, where the value is
/// neither a path (no `/`) nor a library name (`lib…` or `….so`),
/// `libnccl-profiler-VALUE.so`.
pub(crate) fn candidates(value: Option<&str>) -> Vec<String> {
    match value.map(str::trim) {
        None | Some("") => vec!["libnccl-profiler.so".into()],
        Some(v) if v.eq_ignore_ascii_case("none") => Vec::new(),
        Some(v) => {
            let mut names = vec![v.to_string()];
            if !v.contains('/') && !v.starts_with("lib") && !v.ends_with(".so") {
                names.push(format!("libnccl-profiler-{v}.so"));
            }
            names
        }
    }
}

/// The entry points of one loaded plugin, whichever version it exports.
pub(crate) struct Plugin {
    pub(crate) version: u32,
    pub(crate) name: String,
    init_v5: Option<ffi::ProfilerV5Init>,
    init_v4: Option<ffi::ProfilerV4Init>,
    pub(crate) start: StartFn,
    pub(crate) stop: StopFn,
    pub(crate) record: RecordFn,
    pub(crate) finalize: FinalizeFn,
}

// SAFETY: the plugin is a table of C function pointers into a library that
// stays loaded for the life of the process; the interface lets NCCL call
// them from any thread.
unsafe impl Send for Plugin {}
// SAFETY: as for `Send`; `Plugin` itself is never mutated after loading.
unsafe impl Sync for Plugin {}

static PLUGIN: OnceLock<Option<Plugin>> = OnceLock::new();

/// The process's plugin: opened on the first call (with that call's
/// `NCCL_PROFILER_PLUGIN`), kept loaded until the process exits.
pub(crate) fn plugin(value: Option<&str>) -> Option<&'static Plugin> {
    PLUGIN.get_or_init(|| open(value)).as_ref()
}

fn open(value: Option<&str>) -> Option<Plugin> {
    let names = candidates(value);
    if names.is_empty() {
        tracing::info!("PROFILER/Plugin: disabled (NCCL_PROFILER_PLUGIN=none)");
        return None;
    }
    let mut tried = Vec::new();
    for name in &names {
        let Ok(c) = CString::new(name.as_str()) else {
            tried.push(format!("{name}: contains a NUL byte"));
            continue;
        };
        // SAFETY: `c` is a NUL-terminated path; loading a library runs its
        // constructors, which is what naming it in NCCL_PROFILER_PLUGIN asks for.
        let lib = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            tried.push(dl_error());
            continue;
        }
        match lookup(lib) {
            Some(p) => {
                tracing::info!(
                    "PROFILER/Plugin: loaded {} (v{}) from {name}",
                    p.name,
                    p.version
                );
                return Some(p);
            }
            None => {
                tracing::warn!(
                    "PROFILER/Plugin: {name} exports no usable ncclProfiler_v5 or ncclProfiler_v4; continuing without a profiler"
                );
                // SAFETY: `lib` came from `dlopen` and nothing of it is kept.
                unsafe { libc::dlclose(lib) };
                return None;
            }
        }
    }
    // Unset and absent is the usual case: INFO, as NCCL; a named plugin
    // that cannot be opened is worth a warning.
    match value {
        None => tracing::info!("PROFILER/Plugin: no plugin found ({})", tried.join("; ")),
        Some(_) => tracing::warn!(
            "PROFILER/Plugin: could not open NCCL_PROFILER_PLUGIN ({}); continuing without a profiler",
            tried.join("; ")
        ),
    }
    None
}

fn dl_error() -> String {
    // SAFETY: `dlerror` returns NULL or a NUL-terminated string valid
    // until the next dl call on this thread; it is copied at once.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown dlopen error".into()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

/// The newest supported `ncclProfiler_vN` of `lib` whose entry points are
/// all set.
fn lookup(lib: *mut c_void) -> Option<Plugin> {
    for v in VERSIONS {
        if v == 4 && cfg!(target_endian = "big") {
            // The v4 descriptor's `uint8_t type` is read from our `u64`.
            continue;
        }
        let sym = CString::new(format!("ncclProfiler_v{v}")).expect("no NUL");
        // SAFETY: `lib` is a live handle and `sym` NUL-terminated.
        let p = unsafe { libc::dlsym(lib, sym.as_ptr()) };
        if p.is_null() {
            continue;
        }
        // SAFETY: the symbol is the plugin's exported `ncclProfiler_vN_t`
        // struct (the interface's contract), which lives as long as the
        // library, never unloaded once a plugin is found.
        let found = unsafe {
            match v {
                5 => {
                    let t = &*(p as *const ffi::ProfilerV5);
                    table(
                        t.name,
                        v,
                        t.start_event,
                        t.stop_event,
                        t.record_event_state,
                        t.finalize,
                    )
                    .and_then(|mut pl| {
                        pl.init_v5 = Some(t.init?);
                        Some(pl)
                    })
                }
                _ => {
                    let t = &*(p as *const ffi::ProfilerV4);
                    table(
                        t.name,
                        v,
                        t.start_event,
                        t.stop_event,
                        t.record_event_state,
                        t.finalize,
                    )
                    .and_then(|mut pl| {
                        pl.init_v4 = Some(t.init?);
                        Some(pl)
                    })
                }
            }
        };
        if found.is_some() {
            return found;
        }
    }
    None
}

/// # Safety
/// `name` is NULL or a NUL-terminated string.
unsafe fn table(
    name: *const c_char,
    version: u32,
    start: Option<StartFn>,
    stop: Option<StopFn>,
    record: Option<RecordFn>,
    finalize: Option<FinalizeFn>,
) -> Option<Plugin> {
    let name = match name.is_null() {
        true => "(unnamed)".into(),
        // SAFETY: non-null, NUL-terminated (the caller's contract).
        false => unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned(),
    };
    Some(Plugin {
        version,
        name,
        init_v5: None,
        init_v4: None,
        start: start?,
        stop: stop?,
        record: record?,
        finalize: finalize?,
    })
}

impl Plugin {
    /// Calls the plugin's `init` for one communicator: its context, or
    /// `None` where init failed; `mask` receives the activation mask (and
    /// stays valid for the plugin to change it later, as NCCL's does).
    pub(crate) fn init(
        &self,
        comm_hash: u64,
        (nnodes, nranks, rank): (usize, usize, usize),
        mask: *mut c_int,
    ) -> Option<*mut c_void> {
        let mut ctx: *mut c_void = std::ptr::null_mut();
        let int = |v: usize| c_int::try_from(v).unwrap_or(c_int::MAX);
        // The communicator has no name (`commName` NULL, as NCCL's default).
        let name: *const c_char = std::ptr::null();
        let logger: Option<ffi::Logger> = Some(log_fn);
        // SAFETY: the plugin's own init, called with valid out-pointers
        // as the interface specifies.
        let rc = unsafe {
            match (self.init_v5, self.init_v4) {
                (Some(f), _) => f(
                    &mut ctx,
                    comm_hash,
                    mask,
                    name,
                    int(nnodes),
                    int(nranks),
                    int(rank),
                    logger,
                ),
                (None, Some(f)) => f(
                    &mut ctx,
                    mask,
                    name,
                    comm_hash,
                    int(nnodes),
                    int(nranks),
                    int(rank),
                    logger,
                ),
                (None, None) => return None,
            }
        };
        if rc != 0 {
            tracing::info!(
                rank,
                "PROFILER/Plugin: init failed ({rc}); continuing without the profiler"
            );
            return None;
        }
        Some(ctx)
    }
}

/// The logger handed to the plugin. The interface's logger is variadic;
/// it is called here through its fixed arguments only (the C calling
/// conventions of the supported targets pass them alike), and the format
/// is logged as it is, its arguments not expanded.
unsafe extern "C" fn log_fn(
    level: c_int,
    _flags: c_ulong,
    _file: *const c_char,
    _line: c_int,
    fmt: *const c_char,
) {
    if fmt.is_null() {
        return;
    }
    // SAFETY: the plugin passes a NUL-terminated format string.
    let msg = unsafe { CStr::from_ptr(fmt) }.to_string_lossy();
    match level {
        2 | 4 => tracing::warn!("PROFILER/Plugin: {msg}"),
        3 => tracing::info!("PROFILER/Plugin: {msg}"),
        _ => tracing::trace!("PROFILER/Plugin: {msg}"),
    }
}

#[cfg(test)]
#[test]
fn library_names_follow_nccl() {
    let table: &[(Option<&str>, &[&str])] = &[
        (None, &["libnccl-profiler.so"]),
        (Some(""), &["libnccl-profiler.so"]),
        (Some("none"), &[]),
        (Some("NONE"), &[]),
        (
            Some("inspector"),
            &["inspector", "libnccl-profiler-inspector.so"],
        ),
        (Some("/opt/p/libx.so"), &["/opt/p/libx.so"]),
        (Some("./rec"), &["./rec"]),
        (Some("librec.so"), &["librec.so"]),
        (Some("libfoo"), &["libfoo"]),
        (Some("rec.so"), &["rec.so"]),
    ];
    for (value, want) in table {
        assert_eq!(candidates(*value), *want, "{value:?}");
    }
}

/// A plugin of the given entry points, for tests (never unloaded).
#[cfg(test)]
pub(crate) fn fake(
    start: StartFn,
    stop: StopFn,
    record: RecordFn,
    finalize: FinalizeFn,
) -> &'static Plugin {
    Box::leak(Box::new(Plugin {
        version: 5,
        name: "fake".into(),
        init_v5: None,
        init_v4: None,
        start,
        stop,
        record,
        finalize,
    }))
}
