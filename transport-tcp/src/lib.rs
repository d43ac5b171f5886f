//! TCP sockets transport for nccl-rs: NCCL's `Socket` net, implementing
//! [`nccl_net::Net`].
//!
//! * [`TcpNet::new`] picks the local interfaces as NCCL does from
//!   `NCCL_SOCKET_IFNAME` / `NCCL_SOCKET_FAMILY` (given here as
//!   [`TcpOptions`]; see [`iface`]). With an explicit `NCCL_SOCKET_IFNAME`
//!   every interface selected is a rail (see [`rails`]).
//! * [`Net::listen`] binds a non-blocking listener on each rail's address,
//!   port 0; its handle ([`handle`]) carries the addresses and ports and a
//!   random nonce.
//! * [`Net::connect`] starts a non-blocking connect; once connected it sends
//!   a greeting with the nonce. The listener only accepts a connection that
//!   presents it and drops strays.
//! * A connection is [`TcpOptions::nsocks`] data sockets (the listener's
//!   count wins, rounded up to a multiple of the rails both ends have; see
//!   [`handle`] and [`rails`]), plus a control socket if there are
//!   several, as in NCCL. Data socket k leaves local rail k mod R for the
//!   peer's rail k mod R; the control socket stays on rail 0. Messages are framed as a 16-byte header (tag,
//!   length, alignment) on socket 0 and matched in posting order; small ones
//!   follow their header inline, large ones are striped over the data sockets
//!   in chunks of at least 64 KiB (see the `stripe` and `comm` modules);
//!   every write is padded to whole 64-byte units so that the kernel's
//!   copies run at full speed (see the `wire` module).
//! * With [`TcpOptions::nthreads`] ≥ 2, sockets 1.. are serviced by that
//!   many helper threads per comm (see the `helper` module); otherwise by
//!   the thread calling `test`.
//! * Striped messages of [`TcpOptions::splice_min_bytes`] to
//!   [`TcpOptions::splice_max_bytes`] from a caller that receives nothing
//!   meanwhile ([`nccl_net::CopyHint`]) are
//!   spliced: `vmsplice` maps the caller's pages into a pipe and `splice`
//!   hands them to the socket, so the sender copies nothing and, over
//!   loopback, the receiver's `recvmsg` is the only copy. Such a message
//!   completes on the receiver's 8-byte acknowledgement on socket 0, since
//!   its pages are the socket's buffer until read (see the `lanes` and
//!   `wire` modules).
//!
//! # Sockets and helper threads: the defaults
//! Over a network interface, one data socket per rail (NCCL's default of
//! one socket per NIC): there the link is the bottleneck, and a message
//! striped over several flows sharing a link completes only when its
//! slowest stripe does, so every extra flow can only delay it. Over loopback, where the kernel's per-socket work is
//! the bottleneck, [`DEFAULT_NSOCKS_PERTHREAD`] × [`DEFAULT_NTHREADS`] = 3
//! data sockets, serviced by the thread calling `test` (no helper
//! threads). `NCCL_NSOCKS_PERTHREAD` and `NCCL_SOCKET_NTHREADS`, when set,
//! apply everywhere. Why 3 over loopback:
//! * More sockets let the kernel overlap more per-socket work (buffers,
//!   acknowledgements) on messages of 16 MiB and more; a fourth socket did
//!   not pay. Small messages never leave the control socket, so 8-byte
//!   latency does not depend on the count.
//! * Helper threads cost more than they give while the ranks' own threads
//!   fill the cores: every helper wake-up is a context switch that takes a
//!   core from a thread doing copies (2-2.5× slower at 1 MiB and more).
//!   This was fitted on a 2-core VM; on hosts with more cores than ranks,
//!   `NCCL_SOCKET_NTHREADS=2..4` is worth measuring.
//!
//! Measure a host with `NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo ncclrun -n
//! 2 all_reduce_perf -b S -e S -c 0` under each
//! `NCCL_NSOCKS_PERTHREAD:NCCL_SOCKET_NTHREADS`, compared in paired rounds
//! (`scripts/paired.sh`).
//!
//! Linux only (like NCCL): it relies on `accept4`, `SOCK_NONBLOCK` and
//! `MSG_NOSIGNAL`.

pub mod cache;
mod comm;
mod connect;
pub mod handle;
mod helper;
pub mod iface;
mod lanes;
mod probe;
pub mod rails;
mod stripe;
mod sys;
mod wire;

pub use cache::{default_splice_max_bytes, last_level_cache_bytes};
pub use connect::{HELLO_TIMEOUT, MAX_PENDING};
pub use handle::{
    TcpHandle, HANDLE_BYTES, HANDLE_VERSION, HELLO_BYTES, MAX_RAILS, MAX_SOCKS, RAIL_BYTES,
};
pub use iface::{enumerate_interfaces, find_interfaces, select_interfaces, Iface};

use comm::SpliceSizes;
use nccl_net::{Connector, Listener, Net, NetError, NetResult, Properties, PtrSupport};
use std::net::IpAddr;

/// Default data sockets per helper thread (`NCCL_NSOCKS_PERTHREAD`); see
/// the crate docs for why.
pub const DEFAULT_NSOCKS_PERTHREAD: usize = 3;
/// Default helper threads per comm (`NCCL_SOCKET_NTHREADS`); see the crate
/// docs for why.
pub const DEFAULT_NTHREADS: usize = 1;
/// Default `SO_SNDBUF` / `SO_RCVBUF` size.
pub const DEFAULT_SOCKET_BUF_BYTES: usize = 4 << 20;
/// Default [`TcpOptions::splice_min_bytes`]. Below it a striped message
/// is two or three 64 KiB pieces, and the acknowledgement's round trip
/// costs more than the copy saves (128 KiB lost 14%; 256 KiB and more
/// gained 5-40%, measured in paired rounds of a 2-rank broadcast over
/// loopback).
pub const DEFAULT_SPLICE_MIN_BYTES: usize = 256 << 10;
/// Requests that may be outstanding on one comm (NCCL's
/// `NCCL_NET_MAX_REQUESTS`); `isend` / `irecv` return `Ok(None)` beyond.
pub const MAX_REQUESTS: usize = 32;
/// Largest single message (1 TiB, or the address space on 32-bit targets).
pub const MAX_MESSAGE_BYTES: usize = if usize::BITS > 40 {
    1 << 40
} else {
    usize::MAX
};
/// Link speed reported when the interface does not tell (Mbit/s), as NCCL.
const DEFAULT_SPEED_MBPS: u64 = 10_000;
/// One-way latency estimate of a TCP hop through the kernel, in µs.
const LATENCY_US: f64 = 20.0;

/// Address family restriction (`NCCL_SOCKET_FAMILY`: `AF_INET` /
/// `AF_INET6`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AddrFamily {
    /// IPv4 only (`AF_INET`).
    V4,
    /// IPv6 only (`AF_INET6`).
    V6,
}

/// `NCCL_CROSS_NIC` (see [`rails::connection_rails`]).
pub use nccl_net::CrossNic;

/// Settings of the TCP transport.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpOptions {
    /// `NCCL_SOCKET_IFNAME`-style interface list; `None` for the default
    /// rule (see [`iface`]).
    pub ifname: Option<String>,
    /// Address family restriction; `None` for any.
    pub family: Option<AddrFamily>,
    /// `SO_SNDBUF` / `SO_RCVBUF` of every socket (default 4 MiB; the kernel
    /// caps it at `net.core.wmem_max` / `rmem_max`). 0 leaves the kernel's
    /// buffer autotuning on.
    pub socket_buf_bytes: usize,
    /// Data sockets per connection, 1..=[`MAX_SOCKS`] (NCCL's
    /// `NCCL_NSOCKS_PERTHREAD` × `NCCL_SOCKET_NTHREADS`); with 2 or more a
    /// control socket is added. The listening side's count is used for a
    /// connection.
    pub nsocks: usize,
    /// Helper threads per comm servicing the data sockets (NCCL's
    /// `NCCL_SOCKET_NTHREADS`); 0 or 1: none, the thread calling `test`
    /// does all the I/O.
    pub nthreads: usize,
    /// Striped messages of at least this many bytes are sent with
    /// `vmsplice` + `splice` instead of a copy into the socket (see the
    /// `lanes` module); 0: never. Default [`DEFAULT_SPLICE_MIN_BYTES`].
    pub splice_min_bytes: usize,
    /// ... and of at most this many bytes. Default
    /// [`default_splice_max_bytes`], from the last-level cache.
    pub splice_max_bytes: usize,
    /// `NCCL_CROSS_NIC`; applied by the connecting side.
    pub cross_nic: CrossNic,
    /// `nsocks` is the default, not the user's: over a network interface
    /// a connection then uses one data socket per rail (see the crate docs).
    pub nsocks_by_link: bool,
}

impl Default for TcpOptions {
    fn default() -> Self {
        TcpOptions {
            ifname: None,
            family: None,
            socket_buf_bytes: DEFAULT_SOCKET_BUF_BYTES,
            nsocks: DEFAULT_NSOCKS_PERTHREAD * DEFAULT_NTHREADS,
            nthreads: DEFAULT_NTHREADS,
            splice_min_bytes: DEFAULT_SPLICE_MIN_BYTES,
            splice_max_bytes: default_splice_max_bytes(),
            cross_nic: CrossNic::Auto,
            nsocks_by_link: true,
        }
    }
}

/// One local NIC of a [`TcpNet`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rail {
    /// Interface name (`None` with [`TcpNet::with_local_ip`]).
    pub ifname: Option<String>,
    /// The address listeners bind to and connections leave from.
    pub ip: IpAddr,
    /// Link speed, Mbit/s.
    pub speed_mbps: u64,
}

/// The TCP transport: one local address per rail, any number of
/// connections.
#[derive(Debug)]
pub struct TcpNet {
    opts: TcpOptions,
    rails: Vec<Rail>,
}

impl TcpNet {
    /// Selects the interfaces per `opts.ifname` / `opts.family`; see
    /// [`rails::pick_rails`] for which of them become rails.
    pub fn new(opts: TcpOptions) -> NetResult<TcpNet> {
        check_options(&opts)?;
        let chosen = iface::find_interfaces(opts.ifname.as_deref(), opts.family)
            .map_err(|e| NetError::io("getifaddrs", e))?;
        if chosen.is_empty() {
            return Err(NetError::Other(format!(
                "NET/Socket: no usable network interface (NCCL_SOCKET_IFNAME={:?}, family {:?})",
                opts.ifname.as_deref().unwrap_or(""),
                opts.family
            )));
        }
        let picked = rails::pick_rails(chosen, opts.ifname.as_deref());
        for (f, why) in &picked.dropped {
            let line = format!(
                "NET/Socket: not using {}:{} as a rail: {why}",
                f.name, f.addr
            );
            if iface::first_time(&line) {
                tracing::warn!("{line}");
            }
        }
        let mut opts = opts;
        if opts.nsocks_by_link && picked.rails.first().is_some_and(|f| !f.addr.is_loopback()) {
            opts.nsocks = 1;
        }
        let rails: Vec<Rail> = picked
            .rails
            .into_iter()
            .map(|f| Rail {
                speed_mbps: link_speed(&f.name),
                ip: f.addr,
                ifname: Some(f.name),
            })
            .collect();
        let list: Vec<String> = rails
            .iter()
            .map(|r| {
                format!(
                    "{}:{} ({} Mb/s)",
                    r.ifname.as_deref().unwrap_or(""),
                    r.ip,
                    r.speed_mbps
                )
            })
            .collect();
        let line = format!("NET/Socket: using {}", list.join(", "));
        if iface::first_time(&line) {
            tracing::info!(rails = rails.len(), "{line}");
        }
        Ok(TcpNet { opts, rails })
    }

    /// Uses `ip` as the only local address (one rail) without interface
    /// selection (`opts.ifname` / `opts.family` are ignored). Handy for
    /// tests and for callers that already know the address.
    pub fn with_local_ip(ip: IpAddr, opts: TcpOptions) -> NetResult<TcpNet> {
        check_options(&opts)?;
        Ok(TcpNet {
            opts,
            rails: vec![Rail {
                ifname: None,
                ip,
                speed_mbps: DEFAULT_SPEED_MBPS,
            }],
        })
    }

    /// The address of rail 0 (what the bootstrap advertises).
    pub fn local_ip(&self) -> IpAddr {
        self.rails[0].ip
    }

    /// Rail 0's interface, chosen by [`TcpNet::new`] (`None` with
    /// [`TcpNet::with_local_ip`]).
    pub fn interface_name(&self) -> Option<&str> {
        self.rails[0].ifname.as_deref()
    }

    /// The rails, rail 0 first (never empty).
    pub fn rails(&self) -> &[Rail] {
        &self.rails
    }

    /// The options in force.
    pub fn options(&self) -> &TcpOptions {
        &self.opts
    }
}

fn check_options(opts: &TcpOptions) -> NetResult<()> {
    if opts.nsocks == 0 || opts.nsocks > MAX_SOCKS {
        return Err(NetError::Other(format!(
            "nsocks must be in 1..={MAX_SOCKS}, got {}",
            opts.nsocks
        )));
    }
    if opts.nthreads > MAX_SOCKS {
        return Err(NetError::Other(format!(
            "nthreads must be in 0..={MAX_SOCKS}, got {}",
            opts.nthreads
        )));
    }
    Ok(())
}

/// `/sys/class/net/<name>/speed`, or [`DEFAULT_SPEED_MBPS`] where it does not
/// tell (loopback, virtual interfaces, non-Linux).
fn link_speed(name: &str) -> u64 {
    if name.contains('/') || name.starts_with('.') {
        return DEFAULT_SPEED_MBPS;
    }
    std::fs::read_to_string(format!("/sys/class/net/{name}/speed"))
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .filter(|&s| s > 0)
        .map_or(DEFAULT_SPEED_MBPS, |s| s as u64)
}

impl Net for TcpNet {
    fn properties(&self) -> Properties {
        Properties {
            name: "Socket".into(),
            // A connection stripes over every rail: their speeds add up.
            speed_mbps: self.rails.iter().map(|r| r.speed_mbps).sum(),
            latency_us: LATENCY_US,
            ptr_support: PtrSupport {
                host: true,
                cuda: false,
                dmabuf: false,
            },
            needs_registration: false,
            max_message_bytes: MAX_MESSAGE_BYTES,
            max_requests: MAX_REQUESTS,
        }
    }

    fn listen(&self) -> NetResult<Box<dyn Listener>> {
        // check_options keeps nsocks within 1..=MAX_SOCKS (64).
        let nsocks = u8::try_from(self.opts.nsocks).unwrap_or(1);
        let ips: Vec<IpAddr> = self.rails.iter().map(|r| r.ip).collect();
        Ok(Box::new(connect::TcpListener::bind(
            &ips,
            self.opts.socket_buf_bytes,
            nsocks,
            self.opts.nthreads,
        )?))
    }

    fn connect(&self, handle: &[u8]) -> NetResult<Box<dyn Connector>> {
        let h = TcpHandle::decode(handle)?;
        if usize::from(h.nsocks) != self.opts.nsocks {
            tracing::info!(
                local = self.opts.nsocks,
                remote = h.nsocks,
                "NET/Socket: peer listens with another socket count; using the peer's"
            );
        }
        let ips: Vec<IpAddr> = self.rails.iter().map(|r| r.ip).collect();
        Ok(Box::new(connect::TcpConnector::start(
            &h,
            &ips,
            self.opts.cross_nic,
            self.opts.socket_buf_bytes,
            self.opts.nthreads,
            SpliceSizes {
                min: self.opts.splice_min_bytes,
                max: self.opts.splice_max_bytes,
            },
        )?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_and_properties() {
        let o = TcpOptions::default();
        assert_eq!(o.socket_buf_bytes, 4 << 20);
        assert_eq!(o.nsocks, 3);
        assert_eq!(o.nthreads, 1);
        let ip = "127.0.0.1".parse().unwrap();
        for (nsocks, nthreads) in [(0, 1), (MAX_SOCKS + 1, 1), (4, MAX_SOCKS + 1)] {
            let bad = TcpOptions {
                nsocks,
                nthreads,
                ..TcpOptions::default()
            };
            assert!(
                TcpNet::with_local_ip(ip, bad).is_err(),
                "{nsocks} {nthreads}"
            );
        }
        let net = TcpNet::with_local_ip("127.0.0.1".parse().unwrap(), o).unwrap();
        let p = net.properties();
        assert_eq!(p.name, "Socket");
        assert!(p.ptr_support.host && !p.ptr_support.cuda);
        assert!(!p.needs_registration);
        assert!(p.max_message_bytes >= 1 << 32);
        assert!(p.speed_mbps > 0);
    }

    #[test]
    fn new_picks_loopback_by_name() {
        let net = TcpNet::new(TcpOptions {
            ifname: Some("=lo".into()),
            family: Some(AddrFamily::V4),
            ..TcpOptions::default()
        })
        .unwrap();
        assert_eq!(net.local_ip(), "127.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(net.interface_name(), Some("lo"));
        // Over loopback the default keeps its sockets; a user's count stays.
        assert_eq!(net.options().nsocks, 3);
        let one = TcpNet::new(TcpOptions {
            ifname: Some("=lo".into()),
            nsocks: 5,
            nsocks_by_link: false,
            ..TcpOptions::default()
        })
        .unwrap();
        assert_eq!(one.options().nsocks, 5);
        let none = TcpNet::new(TcpOptions {
            ifname: Some("=no-such-interface".into()),
            ..TcpOptions::default()
        });
        assert!(none.is_err());
    }
}
