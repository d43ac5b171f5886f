//! RDMA transport for nccl-rs: NCCL's `IB` net over libibverbs
//! reliable-connected queue pairs, on InfiniBand and RoCE v2, implementing
//! [`nccl_net::Net`].
//!
//! # Quick start
//! ```no_run
//! use transport_verbs::{VerbsNet, VerbsOptions};
//! use nccl_net::Net;
//! // nccl-rs reads these into its `Config`; a program of its own passes
//! // its lookup.
//! let opts = VerbsOptions::from_env_lookup(|k| std::env::var(k).ok())
//!     .expect("valid NCCL_IB_* settings");
//! match VerbsNet::new(opts) {
//!     Ok(net) => println!("RDMA via {}", net.properties().name),
//!     // No libibverbs, no device, no active port: fall back to TCP.
//!     Err(e) => println!("{e}; using sockets"),
//! }
//! ```
//!
//! # Loading
//! libibverbs is opened with `dlopen("libibverbs.so.1")` at run time, as
//! NCCL does, so one binary runs with or without rdma-core. The existing
//! binding crates cannot do that: `rdma-sys` and `ibverbs-sys` (under
//! `ibverbs`) link libibverbs at build time (`cargo:rustc-link-lib`), which
//! makes the loader refuse to start the program where rdma-core is missing.
//! So the private `sys` module declares the dozen structs and fifteen
//! functions we use from rdma-core's `verbs.h`, resolves them with
//! `libloading`, re-implements the `static inline` data-path calls
//! (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`) through the provider's
//! `context->ops` table, and pins every size and offset in a unit test. [`VerbsNet::new`] fails cleanly with
//! [`VerbsError::LibraryMissing`] where it is absent, and with
//! [`VerbsError::NoDevice`] where no port is usable; the caller logs that at
//! INFO and uses TCP.
//!
//! # Layers
//! * [`hca`]: `NCCL_IB_HCA` parsing and matching (pure);
//! * [`rails`]: which ports are rails, and how a connection uses them
//!   (pure);
//! * [`gid`]: RoCE GID selection over the sysfs GID table (pure + reader);
//! * [`qp`]: the RESET→INIT→RTR→RTS typestate and its mask table (pure);
//! * [`wire`]: handle, handshake and data-path record layouts (pure);
//! * [`regcache`]: the reference-counted registration cache (pure);
//! * [`gdr`]: device memory (GPUDirect RDMA) through DMA-BUF or peer memory;
//! * `connect`: listener / connector state machines over a side socket;
//! * `comm`: the receiver-driven data path (see its docs for the protocol);
//! * `verbs`, `sys`: owned verbs objects over the run-time-loaded library.
//!
//! # Thread safety
//! [`VerbsNet`] is `Send + Sync` and shared by all comms of a process.
//! Listeners, connectors and comms are `Send` (each is driven by one thread
//! at a time, as the trait's `&mut self` methods imply).
//!
//! # Resource cleanup
//! Dropping a comm destroys its queue pairs first, then deregisters its
//! memory and frees its buffers; the device context and protection domain
//! live until the last comm and the `VerbsNet` are gone.

mod comm;
mod connect;
pub mod device;
pub mod error;
pub mod gdr;
pub mod gid;
pub mod hca;
pub mod hw_counters;
#[cfg(test)]
mod hw_tests;
mod oob;
pub mod options;
pub mod qp;
pub mod rails;
pub mod regcache;
#[cfg(test)]
mod stub_lib;
mod sys;
#[cfg(test)]
mod udmabuf;
mod verbs;
pub mod wire;

pub use comm::split_parts;
pub use device::{list_ports, LinkLayer, PortInfo};
pub use error::{VerbsError, WcStatus};
pub use gid::{AddrFamily, Cidr};
pub use hca::HcaFilter;
pub use options::VerbsOptions;
pub use rails::CrossNic;

use device::Port;
use nccl_net::{Connector, Listener, Net, NetResult, Properties, PtrSupport};
use std::sync::Arc;

/// Requests that may be outstanding on one comm.
pub const MAX_REQUESTS: usize = comm::SLOTS;
/// Largest single message.
pub const MAX_MESSAGE_BYTES: usize = comm::MAX_MESSAGE_BYTES;
/// Unregistered messages up to this size go through pre-registered bounce
/// buffers; larger ones are registered on the fly (zero copy).
pub const BOUNCE_BYTES: usize = comm::BOUNCE_BYTES;
/// One-way latency estimate of an RDMA hop, in µs.
const LATENCY_US: f64 = 2.0;

pub(crate) fn load_lib() -> Result<&'static sys::Lib, VerbsError> {
    sys::Lib::get().map_err(load_error)
}

fn load_error(e: sys::LoadError) -> VerbsError {
    match e {
        sys::LoadError::Open(reason) => VerbsError::LibraryMissing {
            lib: sys::LIBIBVERBS.into(),
            reason,
        },
        sys::LoadError::Symbol(symbol, reason) => VerbsError::MissingSymbol { symbol, reason },
    }
}

/// The verbs transport: every active port `NCCL_IB_HCA` selects, as rails
/// (see [`rails`]), and any number of connections striped over them.
#[derive(Debug, Clone)]
pub struct VerbsNet {
    /// Rail 0 first; never empty.
    rails: Vec<Arc<Port>>,
}

impl VerbsNet {
    /// Loads libibverbs, discovers devices, takes every active port that
    /// `opts.hca` selects as a rail ([`rails::pick_rails`]), opens each and
    /// chooses its GID. Logs the choice at INFO. Fails cleanly (no panic,
    /// nothing leaked) when the library, a device or an active port is
    /// missing.
    pub fn new(opts: VerbsOptions) -> Result<VerbsNet, VerbsError> {
        opts.validate()?;
        let (lib, picked, dropped) = selected_rails(&opts)?;
        for (p, why) in &dropped {
            tracing::warn!("NET/IB: not using {}:{} as a rail: {why}", p.device, p.port);
        }
        let mut opened = Vec::with_capacity(picked.len());
        for info in &picked {
            opened.push(Arc::new(Port::open(lib, info, &opts)?));
        }
        if opened.len() > 1 {
            tracing::info!(
                "NET/IB: {} rails: {}",
                opened.len(),
                opened
                    .iter()
                    .enumerate()
                    .map(|(k, p)| format!("{k}={}", p.name()))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        Ok(VerbsNet { rails: opened })
    }

    fn port(&self) -> &Arc<Port> {
        &self.rails[0]
    }

    /// Rail 0's device and port, e.g. `"rxe0:1"`.
    pub fn device_name(&self) -> String {
        self.port().name()
    }

    /// The rails' ports, rail 0 first (never empty).
    pub fn rails(&self) -> Vec<PortInfo> {
        self.rails.iter().map(|p| p.info.clone()).collect()
    }

    /// Link layer of the rails (all share rail 0's).
    pub fn link_layer(&self) -> LinkLayer {
        self.port().link_layer
    }

    /// Rail 0's GID index (0 on InfiniBand).
    pub fn gid_index(&self) -> u32 {
        self.port().gid_index
    }

    /// The GID rail 0 advertises to peers.
    pub fn gid(&self) -> [u8; 16] {
        self.port().gid
    }

    /// Whether every rail's device can register DMA-BUF memory (probed as
    /// NCCL does); GPUDirect via `ibv_reg_dmabuf_mr` builds on this.
    pub fn dmabuf_supported(&self) -> bool {
        self.rails.iter().all(|p| p.dmabuf)
    }

    /// Whether `ibv_reg_mr` accepts device addresses (`nvidia-peermem` or
    /// `nv_peer_mem` was loaded when the ports opened).
    pub fn peermem_supported(&self) -> bool {
        self.rails.iter().all(|p| p.peermem)
    }

    /// The options in force.
    pub fn options(&self) -> &VerbsOptions {
        &self.port().opts
    }
}

/// Ports `opts.hca` selects that become rails (in rail order), and those
/// selected but dropped, with why.
type Selected = (
    &'static sys::Lib,
    Vec<PortInfo>,
    Vec<(PortInfo, &'static str)>,
);

fn selected_rails(opts: &VerbsOptions) -> Result<Selected, VerbsError> {
    let filter = match &opts.hca {
        Some(s) => HcaFilter::parse(s).map_err(|_| VerbsError::BadOption {
            var: "NCCL_IB_HCA",
            value: s.clone(),
            want: "[^][=]dev[:port][,dev[:port]...]",
        })?,
        None => HcaFilter::default(),
    };
    let lib = load_lib()?;
    let ports = device::list_ports_with(lib)?;
    let usable = device::usable_ports(&ports, &filter);
    let picked = rails::pick_rails(&usable);
    if picked.rails.is_empty() {
        let seen: Vec<String> = ports
            .iter()
            .map(|p| {
                format!(
                    "{}:{} {}{}",
                    p.device,
                    p.port,
                    if p.active { "active" } else { "down" },
                    p.link_layer.map_or(", unknown link layer", |_| "")
                )
            })
            .collect();
        return Err(VerbsError::NoDevice(format!(
            "NCCL_IB_HCA={:?}; ports found: [{}]",
            opts.hca.as_deref().unwrap_or(""),
            seen.join(", ")
        )));
    }
    Ok((
        lib,
        picked.rails.into_iter().cloned().collect(),
        picked
            .dropped
            .into_iter()
            .map(|(p, why)| (p.clone(), why))
            .collect(),
    ))
}

/// A rail as a host's topology record shows it, found without opening it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RailSummary {
    /// The port.
    pub port: PortInfo,
    /// The IP address inside the GID [`VerbsNet::new`] would choose (RoCE),
    /// or `None` (InfiniBand, or no IP GID).
    pub addr: Option<std::net::IpAddr>,
}

/// The rails [`VerbsNet::new`] would take with `opts`, in rail order, and
/// their addresses: what a host's topology record lists as its NICs when
/// the verbs transport is in use.
pub fn rail_summaries(opts: &VerbsOptions) -> Result<Vec<RailSummary>, VerbsError> {
    opts.validate()?;
    let (_, picked, _) = selected_rails(opts)?;
    Ok(picked
        .into_iter()
        .map(|port| {
            let addr = match port.link_layer {
                Some(LinkLayer::Ethernet) => device::chosen_gid(&port, opts)
                    .filter(gid::is_valid_gid)
                    .map(|g| gid::gid_ip(&g)),
                _ => None,
            };
            RailSummary { port, addr }
        })
        .collect())
}

impl Net for VerbsNet {
    fn properties(&self) -> Properties {
        Properties {
            name: "IB".into(),
            speed_mbps: self.rails.iter().map(|p| p.info.speed_mbps).sum(),
            latency_us: LATENCY_US,
            ptr_support: PtrSupport {
                host: true,
                cuda: self.peermem_supported(),
                dmabuf: self.dmabuf_supported(),
            },
            needs_registration: false,
            max_message_bytes: MAX_MESSAGE_BYTES,
            max_requests: MAX_REQUESTS,
        }
    }

    fn listen(&self) -> NetResult<Box<dyn Listener>> {
        Ok(Box::new(connect::VerbsListener::bind(&self.rails)?))
    }

    fn connect(&self, handle: &[u8]) -> NetResult<Box<dyn Connector>> {
        let h = wire::VerbsHandle::decode(handle)?;
        Ok(Box::new(connect::VerbsConnector::start(&self.rails, &h)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without RDMA (this crate's CI host) `new` fails with a
    /// clean, typed error: the library is missing, or present but finds no
    /// device. With a device it must succeed.
    #[test]
    fn new_without_rdma_is_a_clean_error() {
        match VerbsNet::new(VerbsOptions::default()) {
            Ok(net) => eprintln!("RDMA present here: {}", net.device_name()),
            Err(VerbsError::LibraryMissing { lib, .. }) => assert_eq!(lib, "libibverbs.so.1"),
            Err(VerbsError::NoDevice(why)) => assert!(!why.is_empty()),
            Err(e) => panic!("unexpected error kind: {e}"),
        }
    }

    /// Where rdma-core is not installed, `dlopen` fails and the error says
    /// so (the message nccl-rs logs at INFO before using TCP).
    #[test]
    fn missing_library_maps_to_library_missing() {
        let e = load_error(sys::Lib::load("libibverbs-absent-for-test.so.1").unwrap_err());
        assert!(matches!(&e, VerbsError::LibraryMissing { lib, .. } if lib == "libibverbs.so.1"));
        let text = e.to_string();
        assert!(
            text.starts_with("NET/IB: cannot load libibverbs.so.1"),
            "{text}"
        );
        let net: nccl_net::NetError = e.into();
        assert!(matches!(
            VerbsError::from_net(&net),
            Some(VerbsError::LibraryMissing { .. })
        ));
    }

    #[test]
    fn bad_options_are_rejected_before_loading() {
        let o = VerbsOptions {
            timeout: 0,
            ..VerbsOptions::default()
        };
        assert!(matches!(
            VerbsNet::new(o),
            Err(VerbsError::BadOption {
                var: "NCCL_IB_TIMEOUT",
                ..
            })
        ));
        let o = VerbsOptions {
            hca: Some("mlx5_0:x".into()),
            ..VerbsOptions::default()
        };
        assert!(matches!(
            VerbsNet::new(o),
            Err(VerbsError::BadOption {
                var: "NCCL_IB_HCA",
                ..
            })
        ));
    }
}
