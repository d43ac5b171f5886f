//! TCP sockets transport for nccl-rs: NCCL's `Socket` net, implementing
//! [`nccl_net::Net`].
//!
//! * [`TcpNet::new`] picks the local interface as NCCL does from
//!   `NCCL_SOCKET_IFNAME` / `NCCL_SOCKET_FAMILY` (given here as
//!   [`TcpOptions`]; see [`iface`]).
//! * [`Net::listen`] binds a non-blocking listener on that address, port 0;
//!   its handle ([`handle`]) carries address, port and a random nonce.
//! * [`Net::connect`] starts a non-blocking connect; once connected it sends
//!   a greeting with the nonce. The listener only accepts a connection that
//!   presents it and drops strays.
//! * A connection is [`TcpOptions::nsocks`] data sockets (the listener's
//!   count wins; see [`handle`]), plus a control socket if there are
//!   several, as in NCCL. Messages are framed as a 16-byte header (tag,
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
//! [`DEFAULT_NSOCKS_PERTHREAD`] × [`DEFAULT_NTHREADS`] = 3 data sockets,
//! serviced by the thread calling `test` (no helper threads). Why:
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
mod stripe;
mod sys;
mod wire;

pub use cache::{default_splice_max_bytes, last_level_cache_bytes};
pub use connect::{HELLO_TIMEOUT, MAX_PENDING};
pub use handle::{TcpHandle, HANDLE_BYTES, HANDLE_VERSION, HELLO_BYTES, MAX_SOCKS};
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
        }
    }
}

/// The TCP transport: one local address, any number of connections.
#[derive(Debug)]
pub struct TcpNet {
    opts: TcpOptions,
    ip: IpAddr,
    ifname: Option<String>,
    speed_mbps: u64,
}

impl TcpNet {
    /// Selects the interfaces per `opts.ifname` / `opts.family` and uses the
    /// address of the first one.
    pub fn new(opts: TcpOptions) -> NetResult<TcpNet> {
        check_options(&opts)?;
        let chosen = iface::find_interfaces(opts.ifname.as_deref(), opts.family)
            .map_err(|e| NetError::io("getifaddrs", e))?;
        let Some(first) = chosen.into_iter().next() else {
            return Err(NetError::Other(format!(
                "NET/Socket: no usable network interface (NCCL_SOCKET_IFNAME={:?}, family {:?})",
                opts.ifname.as_deref().unwrap_or(""),
                opts.family
            )));
        };
        let speed_mbps = link_speed(&first.name);
        let line = format!(
            "NET/Socket: using {}:{} ({} Mb/s)",
            first.name, first.addr, speed_mbps
        );
        if iface::first_time(&line) {
            tracing::info!("{line}");
        }
        Ok(TcpNet {
            opts,
            ip: first.addr,
            ifname: Some(first.name),
            speed_mbps,
        })
    }

    /// Uses `ip` as the local address without interface selection
    /// (`opts.ifname` / `opts.family` are ignored). Handy for tests and for
    /// callers that already know the address.
    pub fn with_local_ip(ip: IpAddr, opts: TcpOptions) -> NetResult<TcpNet> {
        check_options(&opts)?;
        Ok(TcpNet {
            opts,
            ip,
            ifname: None,
            speed_mbps: DEFAULT_SPEED_MBPS,
        })
    }

    /// The local address listeners bind to.
    pub fn local_ip(&self) -> IpAddr {
        self.ip
    }

    /// The interface chosen by [`TcpNet::new`] (`None` with
    /// [`TcpNet::with_local_ip`]).
    pub fn interface_name(&self) -> Option<&str> {
        self.ifname.as_deref()
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
            speed_mbps: self.speed_mbps,
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
        Ok(Box::new(connect::TcpListener::bind(
            self.ip,
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
        Ok(Box::new(connect::TcpConnector::start(
            &h,
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
        let none = TcpNet::new(TcpOptions {
            ifname: Some("=no-such-interface".into()),
            ..TcpOptions::default()
        });
        assert!(none.is_err());
    }
}
