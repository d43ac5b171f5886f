//! Every environment variable the library reads, read once into one typed
//! [`Config`]; the variables, their defaults and meanings are listed in
//! `docs/configuration.md` (a test checks that list against [`VARS`]).

mod cuda;

pub use cuda::{CudaConfig, DeviceReduce, GdrLevel};

use crate::error::{Error, Result};
use std::sync::OnceLock;
use std::time::Duration;
pub use transport_tcp::{AddrFamily, CrossNic};

/// Staging per connection (`NCCL_BUFFSIZE` unset) when every rank of a
/// communicator is on one host and they outnumber its CPUs. Ranks that take
/// turns on a core hand every chunk over between them: fewer, larger
/// chunks and rings than the default's cost fewer hand-overs, and smaller
/// rings stay in the caches the ranks share. Fitted on a 2-core VM (paired
/// rounds at 4 ranks); refit on real hardware with `scripts/paired.sh`.
pub const OVERSUBSCRIBED_BUFFSIZE: usize = 2 << 20;

/// Every variable [`Config::from_lookup`] reads (the `NCCL_IB_*` ones
/// through `transport_verbs::VerbsOptions`, the device ones through
/// [`CudaConfig`]). The library reads no other `NCCL_*` variable; the
/// launcher variables of [`crate::launch::LaunchEnv`] (`RANK`,
/// `WORLD_SIZE`, `MASTER_ADDR`, ...) and `tracing`'s `RUST_LOG` are not
/// settings of the library and are read where they are used.
pub const VARS: &[&str] = &[
    "NCCL_DEBUG",
    "NCCL_DEBUG_FILE",
    "NCCL_DEBUG_SUBSYS",
    "NCCL_SOCKET_IFNAME",
    "NCCL_SOCKET_FAMILY",
    "NCCL_COMM_ID",
    "NCCL_RS_JOB_SECRET",
    "NCCL_COMM_BLOCKING",
    "NCCL_BUFFSIZE",
    "NCCL_RS_STEPS",
    "NCCL_RS_TIMEOUT",
    "NCCL_RS_BOOTSTRAP_TIMEOUT",
    "NCCL_NSOCKS_PERTHREAD",
    "NCCL_SOCKET_NTHREADS",
    "NCCL_CROSS_NIC",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_NET",
    "NCCL_IB_DISABLE",
    "NCCL_SHM_DISABLE",
    "NCCL_RS_SHM_SINGLE_COPY",
    "NCCL_RS_SHM_SINGLE_COPY_MIN_BYTES",
    "NCCL_RS_SHM_SINGLE_COPY_MAX_BYTES",
    "NCCL_RS_SHM_STREAM_BYTES",
    "NCCL_RS_PLACEMENT",
    "NCCL_LOCAL_REGISTER",
    "NCCL_RS_ZERO_COPY_MIN_BYTES",
    "NCCL_RS_SOCKET_BUF_BYTES",
    "NCCL_RS_SOCKET_SPLICE_MIN_BYTES",
    "NCCL_HOSTID",
    "NCCL_RS_TOPO_FILE",
    "NCCL_RS_RING_ORDER",
    "NCCL_RS_TOPO_OVERSUB",
    "NCCL_TOPO_DUMP_FILE",
    "NCCL_RS_PROM_FILE",
    "NCCL_RS_PROM_INTERVAL_MS",
    "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX",
    "NCCL_IB_ADDR_FAMILY",
    "NCCL_IB_ADDR_RANGE",
    "NCCL_IB_ROCE_VERSION_NUM",
    "NCCL_IB_TIMEOUT",
    "NCCL_IB_RETRY_CNT",
    "NCCL_IB_TC",
    "NCCL_IB_SL",
    "NCCL_IB_QPS_PER_CONNECTION",
    "NCCL_NET_GDR_LEVEL",
    "NCCL_DMABUF_ENABLE",
    "NCCL_RS_CUDA_DISABLE",
    "NCCL_RS_CUDA_DRIVER",
    "NCCL_RS_CUDA_STAGING_CHUNK",
    "NCCL_RS_CUDA_PIPELINE",
    "NCCL_RS_CUDA_ASYNC",
    "NCCL_RS_CUDA_REDUCE",
    "NCCL_RS_NVRTC_LIBRARY",
    "NCCL_RAS_ENABLE",
    "NCCL_RAS_ADDR",
    "NCCL_RAS_TIMEOUT_FACTOR",
    "NCCL_PROFILER_PLUGIN",
];

/// All `NCCL_*` settings, parsed once.
#[derive(Clone, Debug)]
pub struct Config {
    /// `NCCL_DEBUG`.
    pub debug: Option<String>,
    /// `NCCL_DEBUG_FILE`: the file log lines go to (`%h` the host name,
    /// `%p` the process id) instead of stderr (the C library).
    pub debug_file: Option<String>,
    /// `NCCL_DEBUG_SUBSYS`: the subsystems whose INFO and TRACE lines are
    /// shown (the C library).
    pub debug_subsys: Option<String>,
    /// `NCCL_SOCKET_IFNAME`: NCCL's interface list syntax (`^` excludes, `=` exact).
    pub socket_ifname: Option<String>,
    /// `NCCL_SOCKET_FAMILY`.
    pub socket_family: Option<AddrFamily>,
    /// `NCCL_COMM_ID`: `host:port` where rank 0 runs the bootstrap root.
    pub comm_id: Option<String>,
    /// `NCCL_RS_JOB_SECRET`: the secret ranks present to a root at a fixed
    /// rendezvous address (the id of `ncclGetUniqueId` carries its own).
    pub job_secret: Option<[u8; 16]>,
    /// `NCCL_COMM_BLOCKING`: whether calls of the C library complete
    /// before returning; overrides `ncclConfig_t.blocking` (`None`: unset).
    pub comm_blocking: Option<bool>,
    /// `NCCL_BUFFSIZE`: staging bytes per connection.
    pub buffsize: usize,
    /// Staging bytes per connection of a communicator whose ranks all share
    /// one host and outnumber its CPUs: `NCCL_BUFFSIZE` when that is set,
    /// else [`OVERSUBSCRIBED_BUFFSIZE`] (half the default: rings that stay
    /// in the caches the ranks sharing a core also share, chunks large
    /// enough that handing them over between those ranks stays rare).
    pub oversubscribed_buffsize: usize,
    /// `NCCL_RS_STEPS`: staging slots (chunks in flight) per connection.
    pub steps: usize,
    /// `NCCL_RS_TIMEOUT`: deadline of one collective.
    pub timeout: Duration,
    /// `NCCL_RS_BOOTSTRAP_TIMEOUT`: deadline of rendezvous and connection setup.
    pub bootstrap_timeout: Duration,
    /// `NCCL_NSOCKS_PERTHREAD`.
    pub nsocks_perthread: usize,
    /// Neither `NCCL_NSOCKS_PERTHREAD` nor `NCCL_SOCKET_NTHREADS` is set:
    /// over a network interface a connection uses one socket per rail.
    pub nsocks_by_link: bool,
    /// `NCCL_SOCKET_NTHREADS`.
    pub socket_nthreads: usize,
    /// `NCCL_CROSS_NIC`: whether a TCP connection may join different
    /// rails (NICs) when the two ends have different rail counts.
    pub cross_nic: CrossNic,
    /// `NCCL_ALGO`, unparsed (the planner reads it).
    pub algo: Option<String>,
    /// `NCCL_PROTO`, unparsed.
    pub proto: Option<String>,
    /// `NCCL_NET`.
    pub net: Option<String>,
    /// `NCCL_IB_DISABLE`.
    pub ib_disable: bool,
    /// `NCCL_SHM_DISABLE`.
    pub shm_disable: bool,
    /// `NCCL_RS_SHM_SINGLE_COPY`: single-copy (cross-memory attach) for
    /// shared-memory messages of copy-only calls.
    pub shm_use_cma: bool,
    /// `NCCL_RS_SHM_SINGLE_COPY_MIN_BYTES`: smallest message sent single-copy.
    pub shm_cma_min_bytes: usize,
    /// `NCCL_RS_SHM_SINGLE_COPY_MAX_BYTES`: largest call (output bytes of this rank)
    /// whose messages may go single-copy.
    pub shm_cma_max_bytes: usize,
    /// `NCCL_RS_SHM_STREAM_BYTES`: outputs of at least this many bytes are
    /// received with streaming stores and make a 2-rank all-gather's and
    /// all-to-all's shape depend on placement (`None`: half the last-level
    /// cache, 4-32 MiB; `usize::MAX`: never).
    pub shm_stream_bytes: Option<usize>,
    /// `NCCL_RS_PLACEMENT`: where the ranks' CPUs are, measured or fixed.
    pub placement: crate::plan::PlacementMode,
    /// `NCCL_LOCAL_REGISTER`: zero-copy collectives over shared host
    /// buffers of co-located ranks.
    pub local_register: bool,
    /// `NCCL_PROFILER_PLUGIN`: the profiler plugin library (a path or a
    /// name; `none` disables; unset: `libnccl-profiler.so` if present).
    /// Read by the first communicator of a process.
    pub profiler_plugin: Option<String>,
    /// `NCCL_RS_ZERO_COPY_MIN_BYTES`: smallest collective that tries it.
    pub zero_copy_min_bytes: usize,
    /// `NCCL_RS_SOCKET_BUF_BYTES`: kernel socket buffer size (`SO_SNDBUF`
    /// and `SO_RCVBUF`; 0: the kernel's autotuning).
    pub socket_buf_bytes: usize,
    /// `NCCL_RS_SOCKET_SPLICE_MIN_BYTES`: smallest TCP message sent
    /// spliced (0: never).
    pub socket_splice_min_bytes: usize,
    /// Largest TCP message sent spliced: no variable, derived from the
    /// host's last-level cache
    /// ([`transport_tcp::default_splice_max_bytes`]).
    pub socket_splice_max_bytes: usize,
    /// `NCCL_HOSTID`: this host's identity and its name in the topology
    /// file, instead of boot id and host name (ranks with equal values
    /// share a host).
    pub host_id: Option<String>,
    /// `NCCL_RS_TOPO_FILE`: a Slurm `topology.conf` (tree plugin) naming
    /// the leaf switch of each host.
    pub topo_file: Option<String>,
    /// `NCCL_RS_RING_ORDER`: rings run in topology order (by leaf, host and
    /// local rank; `true`, the default) or in rank order.
    pub ring_by_topology: bool,
    /// `NCCL_RS_TOPO_OVERSUB`: oversubscription ratio per switch level,
    /// from the leaves up (empty: unknown).
    pub topo_oversub: Vec<f64>,
    /// `NCCL_TOPO_DUMP_FILE`: rank 0 writes the detected topology there,
    /// as XML.
    pub topo_dump_file: Option<String>,
    /// `NCCL_RS_PROM_FILE`: the Prometheus text file of this process's
    /// communicators' telemetry (`{rank}`, `{pid}` expanded).
    pub prom_file: Option<String>,
    /// `NCCL_RS_PROM_INTERVAL_MS`: how often that file is rewritten (0:
    /// only when a communicator is destroyed).
    pub prom_interval: Duration,
    /// The `NCCL_IB_*` settings of the verbs transport.
    pub ib: transport_verbs::VerbsOptions,
    /// The settings of device buffers (the `cuda` feature).
    pub cuda: CudaConfig,
    /// `NCCL_RAS_ENABLE`: a RAS thread per process and the query port.
    pub ras_enable: bool,
    /// `NCCL_RAS_ADDR`: `host:port` of the RAS query port.
    pub ras_addr: String,
    /// `NCCL_RAS_TIMEOUT_FACTOR`: multiplies the RAS heartbeat interval
    /// and deadlines.
    pub ras_timeout_factor: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            debug: None,
            debug_file: None,
            debug_subsys: None,
            socket_ifname: None,
            socket_family: None,
            comm_id: None,
            job_secret: None,
            comm_blocking: None,
            buffsize: 4 << 20,
            oversubscribed_buffsize: OVERSUBSCRIBED_BUFFSIZE,
            steps: 8,
            timeout: Duration::from_secs(1800),
            bootstrap_timeout: Duration::from_secs(120),
            nsocks_perthread: transport_tcp::DEFAULT_NSOCKS_PERTHREAD,
            nsocks_by_link: true,
            socket_nthreads: transport_tcp::DEFAULT_NTHREADS,
            cross_nic: CrossNic::Auto,
            algo: None,
            proto: None,
            net: None,
            ib_disable: false,
            shm_disable: false,
            shm_use_cma: true,
            shm_cma_min_bytes: 16 << 10,
            shm_cma_max_bytes: 2 << 20,
            shm_stream_bytes: None,
            placement: crate::plan::PlacementMode::Adaptive,
            local_register: true,
            profiler_plugin: None,
            zero_copy_min_bytes: 32 << 10,
            socket_buf_bytes: 4 << 20,
            socket_splice_min_bytes: transport_tcp::DEFAULT_SPLICE_MIN_BYTES,
            socket_splice_max_bytes: transport_tcp::default_splice_max_bytes(),
            host_id: None,
            topo_file: None,
            ring_by_topology: true,
            topo_oversub: Vec::new(),
            topo_dump_file: None,
            prom_file: None,
            prom_interval: Duration::from_secs(10),
            ib: transport_verbs::VerbsOptions::default(),
            cuda: CudaConfig::default(),
            ras_enable: true,
            ras_addr: format!("localhost:{}", crate::ras::DEFAULT_PORT),
            ras_timeout_factor: 1,
        }
    }
}

/// 32 hex digits as 16 bytes.
fn parse_secret(v: &str) -> Option<[u8; 16]> {
    if v.len() != 32 || !v.is_ascii() {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&v[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Switch levels `NCCL_RS_TOPO_OVERSUB` may give.
const MAX_SWITCH_LEVELS: usize = 8;

/// `NCCL_RS_TOPO_OVERSUB`: `2` or `2,1.5`, each ratio in 1..=1000 (a
/// ratio below 1 would be a switch with more uplink than downlink
/// bandwidth, which the ratio is not meant to describe).
fn parse_oversub(v: &str) -> Option<Vec<f64>> {
    let ratios: Vec<f64> = v
        .split(',')
        .map(|r| {
            r.trim()
                .parse::<f64>()
                .ok()
                .filter(|r| (1.0..=1000.0).contains(r))
        })
        .collect::<Option<_>>()?;
    (ratios.len() <= MAX_SWITCH_LEVELS).then_some(ratios)
}

/// The logging settings, which parse whatever their values (unknown
/// levels log at the default one), so that logging works even where
/// another variable is invalid.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogSettings {
    /// `NCCL_DEBUG`.
    pub debug: Option<String>,
    /// `NCCL_DEBUG_FILE`.
    pub debug_file: Option<String>,
    /// `NCCL_DEBUG_SUBSYS`.
    pub debug_subsys: Option<String>,
}

impl LogSettings {
    fn from_text(text: &Text<'_>) -> LogSettings {
        LogSettings {
            debug: text("NCCL_DEBUG"),
            debug_file: text("NCCL_DEBUG_FILE"),
            debug_subsys: text("NCCL_DEBUG_SUBSYS"),
        }
    }
}

/// A variable's value, trimmed; `None` when unset or blank.
pub(crate) type Text<'a> = dyn Fn(&str) -> Option<String> + 'a;

/// The process environment as read once: [`Config::global`].
struct Global {
    config: std::result::Result<Config, String>,
    log: LogSettings,
}

fn global() -> &'static Global {
    static GLOBAL: OnceLock<Global> = OnceLock::new();
    GLOBAL.get_or_init(|| {
        let env: Vec<(&str, std::ffi::OsString)> = VARS
            .iter()
            .filter_map(|k| Some((*k, std::env::var_os(k)?)))
            .collect();
        let get = |k: &str| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
        let text = |k: &str| {
            get(k)
                .and_then(|v| v.into_string().ok())
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        Global {
            // Kept as the message, returned as `InvalidArgument` again.
            config: Config::from_os_lookup(get).map_err(|e| match e {
                Error::InvalidArgument(m) => m,
                other => other.to_string(),
            }),
            log: LogSettings::from_text(&text),
        }
    })
}

impl Config {
    /// Reads every variable of [`VARS`] from the process environment.
    pub fn from_env() -> Result<Config> {
        Config::from_os_lookup(|k| std::env::var_os(k))
    }

    /// The process environment, read once, on first use, into a `Config`
    /// for the parts of the library no communicator's `Config` reaches
    /// (loading the CUDA driver and NVRTC, the stager's defaults, the
    /// launcher's `NCCL_COMM_ID`); an invalid variable is an error each
    /// time. A later change to the environment is not seen.
    pub fn global() -> Result<&'static Config> {
        global()
            .config
            .as_ref()
            .map_err(|e| Error::InvalidArgument(e.clone()))
    }

    /// The logging settings of the process environment as [`Config::global`]
    /// read them, valid even where another variable is not.
    pub fn global_log() -> &'static LogSettings {
        &global().log
    }

    /// This config's logging settings.
    pub fn log(&self) -> LogSettings {
        LogSettings {
            debug: self.debug.clone(),
            debug_file: self.debug_file.clone(),
            debug_subsys: self.debug_subsys.clone(),
        }
    }

    /// As [`Config::from_lookup`], for values that need not be UTF-8 (the
    /// environment's): one that is not is an error, not an unset variable.
    fn from_os_lookup(get: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<Config> {
        for var in VARS {
            if let Some(v) = get(var).filter(|v| v.to_str().is_none()) {
                return Err(bad(var, &v.to_string_lossy(), "UTF-8 text"));
            }
        }
        Config::from_lookup(|k| get(k).and_then(|v| v.into_string().ok()))
    }

    /// Reads settings through `get` (for tests and embedders). Unset,
    /// empty and blank variables keep their defaults (as NCCL's); any other
    /// value that is not valid is an error naming the variable.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let d = Config::default();
        let text = |k: &str| {
            get(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let algo = text("NCCL_ALGO");
        let proto = text("NCCL_PROTO");
        crate::plan::check(algo.as_deref(), proto.as_deref())?;
        let net = text("NCCL_NET");
        if let Some(v) = net.as_deref() {
            if !["ib", "socket"].contains(&v.to_ascii_lowercase().as_str()) {
                return Err(bad("NCCL_NET", v, "IB or Socket"));
            }
        }
        let socket_ifname = text("NCCL_SOCKET_IFNAME");
        if let Some(v) = socket_ifname.as_deref() {
            check_ifname(v)?;
        }
        let comm_id = text("NCCL_COMM_ID");
        if let Some(v) = comm_id.as_deref() {
            check_host_port(v)?;
        }
        if let Some(v) = text("NCCL_IB_HCA") {
            transport_verbs::HcaFilter::parse(&v).map_err(|e| {
                Error::InvalidArgument(format!("NCCL_IB_HCA={v:?} is not valid: {e}"))
            })?;
        }
        let job_secret = match text("NCCL_RS_JOB_SECRET") {
            None => None,
            Some(v) => Some(
                parse_secret(&v).ok_or_else(|| bad("NCCL_RS_JOB_SECRET", &v, "32 hex digits"))?,
            ),
        };
        let log = LogSettings::from_text(&text);
        let comm_blocking = match text("NCCL_COMM_BLOCKING") {
            None => None,
            Some(_) => Some(flag(&text, "NCCL_COMM_BLOCKING")?),
        };
        let cross_nic = match text("NCCL_CROSS_NIC") {
            None => d.cross_nic,
            Some(v) => CrossNic::parse(&v).ok_or_else(|| bad("NCCL_CROSS_NIC", &v, "0, 1 or 2"))?,
        };
        Ok(Config {
            debug: log.debug,
            debug_file: log.debug_file,
            debug_subsys: log.debug_subsys,
            socket_ifname,
            socket_family: match text("NCCL_SOCKET_FAMILY").as_deref() {
                None => None,
                Some("AF_INET") | Some("4") | Some("ipv4") => Some(AddrFamily::V4),
                Some("AF_INET6") | Some("6") | Some("ipv6") => Some(AddrFamily::V6),
                Some(v) => return Err(bad("NCCL_SOCKET_FAMILY", v, "AF_INET or AF_INET6")),
            },
            comm_id,
            job_secret,
            comm_blocking,
            buffsize: num(&text, "NCCL_BUFFSIZE", d.buffsize, 4096..=(1 << 30))?,
            oversubscribed_buffsize: num(
                &text,
                "NCCL_BUFFSIZE",
                d.oversubscribed_buffsize,
                4096..=(1 << 30),
            )?,
            steps: num(&text, "NCCL_RS_STEPS", d.steps, 2..=64)?,
            timeout: secs(&text, "NCCL_RS_TIMEOUT", d.timeout)?,
            bootstrap_timeout: secs(&text, "NCCL_RS_BOOTSTRAP_TIMEOUT", d.bootstrap_timeout)?,
            nsocks_perthread: num(&text, "NCCL_NSOCKS_PERTHREAD", d.nsocks_perthread, 1..=64)?,
            nsocks_by_link: text("NCCL_NSOCKS_PERTHREAD").is_none()
                && text("NCCL_SOCKET_NTHREADS").is_none(),
            socket_nthreads: num(&text, "NCCL_SOCKET_NTHREADS", d.socket_nthreads, 1..=16)?,
            cross_nic,
            algo,
            proto,
            net,
            ib_disable: flag(&text, "NCCL_IB_DISABLE")?,
            shm_disable: flag(&text, "NCCL_SHM_DISABLE")?,
            shm_use_cma: text("NCCL_RS_SHM_SINGLE_COPY").is_none()
                || flag(&text, "NCCL_RS_SHM_SINGLE_COPY")?,
            shm_cma_min_bytes: num(
                &text,
                "NCCL_RS_SHM_SINGLE_COPY_MIN_BYTES",
                d.shm_cma_min_bytes,
                0..=usize::MAX,
            )?,
            shm_cma_max_bytes: num(
                &text,
                "NCCL_RS_SHM_SINGLE_COPY_MAX_BYTES",
                d.shm_cma_max_bytes,
                0..=usize::MAX,
            )?,
            shm_stream_bytes: match text("NCCL_RS_SHM_STREAM_BYTES") {
                None => None,
                Some(_) => match num(&text, "NCCL_RS_SHM_STREAM_BYTES", 0, 0..=usize::MAX)? {
                    0 => Some(usize::MAX),
                    n => Some(n),
                },
            },
            placement: match text("NCCL_RS_PLACEMENT") {
                None => d.placement,
                Some(v) => crate::plan::PlacementMode::parse(&v).ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "NCCL_RS_PLACEMENT={v}: expected adaptive, near, apart, unknown or 0"
                    ))
                })?,
            },
            local_register: text("NCCL_LOCAL_REGISTER").is_none()
                || flag(&text, "NCCL_LOCAL_REGISTER")?,
            profiler_plugin: text("NCCL_PROFILER_PLUGIN"),
            zero_copy_min_bytes: num(
                &text,
                "NCCL_RS_ZERO_COPY_MIN_BYTES",
                d.zero_copy_min_bytes,
                0..=usize::MAX,
            )?,
            socket_buf_bytes: match text("NCCL_RS_SOCKET_BUF_BYTES").map(|v| v.parse::<usize>()) {
                // 0: the kernel's buffer autotuning (`TcpOptions`).
                Some(Ok(0)) => 0,
                _ => num(
                    &text,
                    "NCCL_RS_SOCKET_BUF_BYTES",
                    d.socket_buf_bytes,
                    4096..=(1 << 30),
                )?,
            },
            socket_splice_min_bytes: num(
                &text,
                "NCCL_RS_SOCKET_SPLICE_MIN_BYTES",
                d.socket_splice_min_bytes,
                0..=usize::MAX,
            )?,
            socket_splice_max_bytes: d.socket_splice_max_bytes,
            host_id: text("NCCL_HOSTID"),
            topo_file: text("NCCL_RS_TOPO_FILE"),
            ring_by_topology: match text("NCCL_RS_RING_ORDER").as_deref() {
                None | Some("topology") => true,
                Some("rank") => false,
                Some(v) => {
                    return Err(Error::InvalidArgument(format!(
                        "NCCL_RS_RING_ORDER={v}: expected topology or rank"
                    )))
                }
            },
            topo_oversub: match text("NCCL_RS_TOPO_OVERSUB") {
                None => Vec::new(),
                Some(v) => parse_oversub(&v).ok_or_else(|| {
                    bad(
                        "NCCL_RS_TOPO_OVERSUB",
                        &v,
                        "comma-separated ratios from 1 to 1000, one per switch level from the leaves up (at most 8)",
                    )
                })?,
            },
            topo_dump_file: text("NCCL_TOPO_DUMP_FILE"),
            prom_file: text("NCCL_RS_PROM_FILE").filter(|f| !f.is_empty()),
            prom_interval: Duration::from_millis(num(
                &text,
                "NCCL_RS_PROM_INTERVAL_MS",
                d.prom_interval.as_millis() as usize,
                0..=86_400_000,
            )? as u64),
            ib: transport_verbs::VerbsOptions {
                cross_nic,
                ..transport_verbs::VerbsOptions::from_env_lookup(&get)
                    .map_err(|e| Error::InvalidArgument(format!("NCCL_IB_* settings: {e}")))?
            },
            cuda: CudaConfig::from_text(&text)?,
            ras_enable: text("NCCL_RAS_ENABLE").is_none() || flag(&text, "NCCL_RAS_ENABLE")?,
            ras_addr: match text("NCCL_RAS_ADDR") {
                None => d.ras_addr,
                Some(v) => {
                    check_host_port(&v).map_err(|_| {
                        bad("NCCL_RAS_ADDR", &v, "host:port or [IPv6]:port with a port in 1..=65535")
                    })?;
                    v
                }
            },
            ras_timeout_factor: num(
                &text,
                "NCCL_RAS_TIMEOUT_FACTOR",
                d.ras_timeout_factor as usize,
                1..=1000,
            )? as u32,
        })
    }

    /// Bytes per staging slot: `buffsize / steps`, rounded down to 64 bytes.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes_for(false)
    }

    /// As [`Config::slot_bytes`], for a communicator whose ranks all share
    /// one host and outnumber its CPUs (`oversubscribed`): from
    /// `oversubscribed_buffsize`.
    pub fn slot_bytes_for(&self, oversubscribed: bool) -> usize {
        let buffsize = match oversubscribed {
            true => self.oversubscribed_buffsize,
            false => self.buffsize,
        };
        (buffsize / self.steps).max(64) & !63
    }
}

pub(crate) fn bad(var: &str, value: &str, want: &str) -> Error {
    Error::InvalidArgument(format!("{var}={value:?} is not valid: expected {want}"))
}

fn num(
    text: &impl Fn(&str) -> Option<String>,
    var: &str,
    default: usize,
    range: std::ops::RangeInclusive<usize>,
) -> Result<usize> {
    match text(var) {
        None => Ok(default),
        Some(v) => match v.parse::<usize>() {
            Ok(n) if range.contains(&n) => Ok(n),
            _ => Err(bad(
                var,
                &v,
                &format!("an integer in {}..={}", range.start(), range.end()),
            )),
        },
    }
}

fn secs(text: &impl Fn(&str) -> Option<String>, var: &str, default: Duration) -> Result<Duration> {
    match text(var) {
        None => Ok(default),
        // At least a millisecond: a shorter deadline expires before any reply.
        Some(v) => match v.parse::<f64>() {
            Ok(s) if (1e-3..1e9).contains(&s) => Ok(Duration::from_secs_f64(s)),
            _ => Err(bad(var, &v, "a number of seconds from 0.001 to 1e9")),
        },
    }
}

/// Longest interface name Linux allows (`IFNAMSIZ` less the NUL).
const IFNAME_MAX: usize = 15;

/// Checks an `NCCL_SOCKET_IFNAME` list (`^` excludes, `=` exact, commas
/// between names): at least one name, each one that some interface could
/// have (no blanks or control characters, at most [`IFNAME_MAX`] bytes;
/// a `:port` suffix, as NCCL's list syntax allows, is ignored).
fn check_ifname(v: &str) -> Result<()> {
    let want = "a comma-separated list of interface names or prefixes (^ excludes, = exact), \
                each 1 to 15 characters without blanks";
    let list = v.strip_prefix('^').unwrap_or(v);
    let list = list.strip_prefix('=').unwrap_or(list);
    let mut names = 0;
    for name in list
        .split(',')
        .map(|n| n.split(':').next().unwrap_or("").trim())
    {
        let ok = name.len() <= IFNAME_MAX
            && !name.contains('/')
            && name.chars().all(|c| !c.is_whitespace() && !c.is_control());
        if !ok {
            return Err(bad("NCCL_SOCKET_IFNAME", v, want));
        }
        names += usize::from(!name.is_empty());
    }
    match names {
        0 => Err(bad("NCCL_SOCKET_IFNAME", v, want)),
        _ => Ok(()),
    }
}

/// Checks the form of `NCCL_COMM_ID`: `host:port` or `[ipv6]:port`, a
/// port in 1..=65535 (the host is resolved when the id is made).
fn check_host_port(v: &str) -> Result<()> {
    let want = "host:port or [IPv6]:port with a port in 1..=65535";
    let ok = match v.starts_with('[') {
        true => v
            .parse::<std::net::SocketAddrV6>()
            .is_ok_and(|a| a.port() != 0),
        false => v.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty()
                && host
                    .chars()
                    .all(|c| c != ':' && !c.is_whitespace() && !c.is_control())
                && port.parse::<u16>().is_ok_and(|p| p != 0)
        }),
    };
    match ok {
        true => Ok(()),
        false => Err(bad("NCCL_COMM_ID", v, want)),
    }
}

pub(crate) fn flag(text: &impl Fn(&str) -> Option<String>, var: &str) -> Result<bool> {
    match text(var).as_deref() {
        None | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(v) => Err(bad(var, v, "0 or 1")),
    }
}

#[cfg(test)]
mod tests;
