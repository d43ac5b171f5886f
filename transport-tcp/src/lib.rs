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
//! * Messages are framed as a 12-byte header (tag, length) plus payload and
//!   matched in posting order; see the `comm` module docs for the data path.
//!
//! Linux only (like NCCL): it relies on `accept4`, `SOCK_NONBLOCK` and
//! `MSG_NOSIGNAL`.

mod comm;
mod connect;
pub mod handle;
pub mod iface;
mod sys;

pub use connect::{HELLO_TIMEOUT, MAX_PENDING};
pub use handle::{TcpHandle, HANDLE_BYTES, HANDLE_VERSION, HELLO_BYTES};
pub use iface::{enumerate_interfaces, find_interfaces, select_interfaces, Iface};

use nccl_net::{Connector, Listener, Net, NetError, NetResult, Properties, PtrSupport};
use std::net::IpAddr;

/// Default `SO_SNDBUF` / `SO_RCVBUF` size.
pub const DEFAULT_SOCKET_BUF_BYTES: usize = 4 << 20;
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
    /// Sockets per connection (default 1). Carried in the handle for future
    /// striping; only one socket is used for now.
    pub nsocks: usize,
}

impl Default for TcpOptions {
    fn default() -> Self {
        TcpOptions {
            ifname: None,
            family: None,
            socket_buf_bytes: DEFAULT_SOCKET_BUF_BYTES,
            nsocks: 1,
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
        tracing::info!(
            "NET/Socket: using {}:{} ({} Mb/s)",
            first.name,
            first.addr,
            speed_mbps
        );
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
    if opts.nsocks == 0 || opts.nsocks > 64 {
        return Err(NetError::Other(format!(
            "nsocks must be in 1..=64, got {}",
            opts.nsocks
        )));
    }
    if opts.nsocks > 1 {
        tracing::info!(
            nsocks = opts.nsocks,
            "NET/Socket: socket striping is not implemented yet; using 1 socket per connection"
        );
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
        let nsocks = u8::try_from(self.opts.nsocks).unwrap_or(u8::MAX);
        Ok(Box::new(connect::TcpListener::bind(
            self.ip,
            self.opts.socket_buf_bytes,
            nsocks,
        )?))
    }

    fn connect(&self, handle: &[u8]) -> NetResult<Box<dyn Connector>> {
        let h = TcpHandle::decode(handle)?;
        Ok(Box::new(connect::TcpConnector::start(
            &h,
            self.opts.socket_buf_bytes,
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
        assert_eq!(o.nsocks, 1);
        let bad = TcpOptions {
            nsocks: 0,
            ..TcpOptions::default()
        };
        assert!(TcpNet::with_local_ip("127.0.0.1".parse().unwrap(), bad).is_err());
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
