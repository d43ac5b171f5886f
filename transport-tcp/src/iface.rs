//! Network interface selection, following NCCL's `NCCL_SOCKET_IFNAME` rules.
//!
//! * `eth,ib` — interfaces whose name starts with `eth` or `ib`;
//! * `^docker,lo` — every interface whose name starts with neither;
//! * `=eth0,eth1` — exactly `eth0` and `eth1`;
//! * `^=eth0` — every interface but exactly `eth0`.
//!
//! A `:port` suffix on an entry (NCCL's list syntax) is ignored. Without a
//! spec, every interface but `lo` and `docker*` is taken; if there is none,
//! `docker*`, and if there is none either, `lo` (as NCCL does, minus its
//! preference for `ib*`). Only one address per interface is kept, the first
//! one listed (with no family restriction `getifaddrs` lists IPv4 first).
//!
//! The matching logic, [`select_interfaces`], is a pure function over a list
//! of [`Iface`]s; [`enumerate_interfaces`] reads the list from the OS.

use crate::AddrFamily;
use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One address of one network interface.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Iface {
    /// Interface name, e.g. `eth0`.
    pub name: String,
    /// One of its addresses.
    pub addr: IpAddr,
}

impl Iface {
    /// Convenience constructor.
    pub fn new(name: impl Into<String>, addr: IpAddr) -> Self {
        Iface {
            name: name.into(),
            addr,
        }
    }
}

impl AddrFamily {
    /// Whether `ip` belongs to this family.
    pub fn matches(self, ip: &IpAddr) -> bool {
        matches!(
            (self, ip),
            (AddrFamily::V4, IpAddr::V4(_)) | (AddrFamily::V6, IpAddr::V6(_))
        )
    }
}

/// A parsed `NCCL_SOCKET_IFNAME`-style list.
struct IfSpec<'a> {
    exclude: bool,
    exact: bool,
    names: Vec<&'a str>,
}

impl<'a> IfSpec<'a> {
    fn parse(spec: &'a str) -> Self {
        let mut s = spec.trim();
        let exclude = s.starts_with('^');
        if exclude {
            s = &s[1..];
        }
        let exact = s.starts_with('=');
        if exact {
            s = &s[1..];
        }
        let names = s
            .split(',')
            .map(|e| e.split(':').next().unwrap_or("").trim())
            .filter(|e| !e.is_empty())
            .collect();
        IfSpec {
            exclude,
            exact,
            names,
        }
    }

    fn matches(&self, name: &str) -> bool {
        let listed = self.names.iter().any(|n| {
            if self.exact {
                name == *n
            } else {
                name.starts_with(n)
            }
        });
        listed != self.exclude
    }

    fn select(&self, ifaces: &[Iface], family: Option<AddrFamily>) -> Vec<Iface> {
        let mut out: Vec<Iface> = Vec::new();
        for i in ifaces {
            if family.is_some_and(|f| !f.matches(&i.addr)) {
                continue;
            }
            if !self.matches(&i.name) || out.iter().any(|o| o.name == i.name) {
                continue;
            }
            out.push(i.clone());
        }
        out
    }
}

/// Picks the interfaces to use out of `ifaces` (in their order, one address
/// per interface name), following `NCCL_SOCKET_IFNAME` syntax for `spec` (see
/// the module docs) and keeping only addresses of `family` when given. A
/// `None` or blank `spec` applies the default rule: not `lo` or `docker*`
/// unless nothing else exists.
pub fn select_interfaces(
    ifaces: &[Iface],
    spec: Option<&str>,
    family: Option<AddrFamily>,
) -> Vec<Iface> {
    match spec.map(str::trim).filter(|s| !s.is_empty()) {
        Some(s) => IfSpec::parse(s).select(ifaces, family),
        None => {
            for default in ["^docker,lo", "docker", "lo"] {
                let found = IfSpec::parse(default).select(ifaces, family);
                if !found.is_empty() {
                    return found;
                }
            }
            Vec::new()
        }
    }
}

fn is_ipv6_link_local(ip: &Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

/// Lists the IPv4 and IPv6 addresses of the interfaces that are up, in
/// `getifaddrs` order, skipping link-local IPv6 addresses (`fe80::/10`).
pub fn enumerate_interfaces() -> std::io::Result<Vec<Iface>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; on success the list it receives
    // is freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list returned by getifaddrs, which
        // stays valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null()
            || ifa.ifa_name.is_null()
            || ifa.ifa_flags & (libc::IFF_UP as libc::c_uint) == 0
        {
            continue;
        }
        // SAFETY: `ifa_addr` is non-null and points at a sockaddr at least
        // as large as its common header.
        let family = libc::c_int::from(unsafe { (*ifa.ifa_addr).sa_family });
        let addr = match family {
            libc::AF_INET => {
                // SAFETY: the family says `ifa_addr` is a sockaddr_in;
                // read_unaligned makes no alignment assumption.
                let sin: libc::sockaddr_in =
                    unsafe { std::ptr::read_unaligned(ifa.ifa_addr.cast()) };
                IpAddr::V4(Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()))
            }
            libc::AF_INET6 => {
                // SAFETY: as above, for sockaddr_in6.
                let sin6: libc::sockaddr_in6 =
                    unsafe { std::ptr::read_unaligned(ifa.ifa_addr.cast()) };
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                if is_ipv6_link_local(&ip) {
                    continue;
                }
                IpAddr::V6(ip)
            }
            _ => continue,
        };
        // SAFETY: `ifa_name` is a non-null NUL-terminated string owned by the
        // list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        out.push(Iface { name, addr });
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once;
    // nothing borrowed from the list outlives this point.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// [`enumerate_interfaces`] then [`select_interfaces`], logging the outcome.
pub fn find_interfaces(
    spec: Option<&str>,
    family: Option<AddrFamily>,
) -> std::io::Result<Vec<Iface>> {
    let all = enumerate_interfaces()?;
    let chosen = select_interfaces(&all, spec, family);
    let list: Vec<String> = chosen
        .iter()
        .enumerate()
        .map(|(i, f)| format!("[{i}]{}:{}", f.name, f.addr))
        .collect();
    if chosen.is_empty() {
        tracing::warn!(
            spec = spec.unwrap_or(""),
            ?family,
            "NET/Socket: no interface matches (available: {:?})",
            all.iter().map(|f| f.name.as_str()).collect::<Vec<_>>()
        );
    } else {
        let text = format!("NET/Socket: interfaces {}", list.join(" "));
        if first_time(&text) {
            tracing::info!(spec = spec.unwrap_or(""), ?family, "{text}");
        }
    }
    Ok(chosen)
}

/// Whether this process logs `line` for the first time. Interfaces are
/// chosen again by every communicator and by the bootstrap, always alike:
/// the outcome is logged once per process (a different outcome, e.g. under
/// another `NCCL_SOCKET_IFNAME`, is logged too).
pub(crate) fn first_time(line: &str) -> bool {
    use std::sync::Mutex;
    /// Distinct lines remembered; more than a process sees in practice.
    const MAX: usize = 64;
    static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    if seen.iter().any(|s| s == line) {
        return false;
    }
    if seen.len() < MAX {
        seen.push(line.to_string());
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn sample() -> Vec<Iface> {
        vec![
            Iface::new("lo", ip("127.0.0.1")),
            Iface::new("lo", ip("::1")),
            Iface::new("eth0", ip("10.0.0.2")),
            Iface::new("eth0", ip("fd00::2")),
            Iface::new("eth10", ip("10.1.0.2")),
            Iface::new("docker0", ip("172.17.0.1")),
            Iface::new("ib0", ip("fd01::5")),
            Iface::new("ib0", ip("10.2.0.2")),
        ]
    }

    fn names(v: &[Iface]) -> Vec<&str> {
        v.iter().map(|i| i.name.as_str()).collect()
    }

    #[test]
    fn prefix_list() {
        let s = select_interfaces(&sample(), Some("eth"), None);
        assert_eq!(names(&s), ["eth0", "eth10"]);
        assert_eq!(s[0].addr, ip("10.0.0.2"), "first address per interface");
        let s = select_interfaces(&sample(), Some("ib, eth1"), None);
        assert_eq!(names(&s), ["eth10", "ib0"]);
        assert_eq!(s[1].addr, ip("fd01::5"));
        // `:port` suffixes are ignored.
        let s = select_interfaces(&sample(), Some("eth0:1234"), None);
        assert_eq!(names(&s), ["eth0"]);
        assert!(select_interfaces(&sample(), Some("wlan"), None).is_empty());
    }

    #[test]
    fn exclude_list() {
        let s = select_interfaces(&sample(), Some("^eth,lo"), None);
        assert_eq!(names(&s), ["docker0", "ib0"]);
        let s = select_interfaces(&sample(), Some("^eth1"), None);
        assert_eq!(names(&s), ["lo", "eth0", "docker0", "ib0"]);
    }

    #[test]
    fn exact_list() {
        let s = select_interfaces(&sample(), Some("=eth1"), None);
        assert!(s.is_empty());
        let s = select_interfaces(&sample(), Some("=eth10,ib0"), None);
        assert_eq!(names(&s), ["eth10", "ib0"]);
        let s = select_interfaces(&sample(), Some("=eth"), None);
        assert!(s.is_empty());
    }

    #[test]
    fn exclude_exact_list() {
        let s = select_interfaces(&sample(), Some("^=eth0,lo"), None);
        assert_eq!(names(&s), ["eth10", "docker0", "ib0"]);
    }

    #[test]
    fn default_skips_lo_and_docker() {
        for spec in [None, Some(""), Some("  ")] {
            let s = select_interfaces(&sample(), spec, None);
            assert_eq!(names(&s), ["eth0", "eth10", "ib0"]);
        }
    }

    #[test]
    fn default_falls_back_to_docker_then_lo() {
        let only = vec![
            Iface::new("lo", ip("127.0.0.1")),
            Iface::new("docker0", ip("172.17.0.1")),
        ];
        assert_eq!(names(&select_interfaces(&only, None, None)), ["docker0"]);
        let only_lo = vec![
            Iface::new("lo", ip("127.0.0.1")),
            Iface::new("lo", ip("::1")),
        ];
        let s = select_interfaces(&only_lo, None, None);
        assert_eq!(s, vec![Iface::new("lo", ip("127.0.0.1"))]);
        assert!(select_interfaces(&[], None, None).is_empty());
    }

    #[test]
    fn family_filter() {
        let s = select_interfaces(&sample(), None, Some(AddrFamily::V6));
        assert_eq!(names(&s), ["eth0", "ib0"]);
        assert_eq!(s[0].addr, ip("fd00::2"));
        let s = select_interfaces(&sample(), Some("ib"), Some(AddrFamily::V4));
        assert_eq!(s, vec![Iface::new("ib0", ip("10.2.0.2"))]);
        let v6_only_lo = vec![
            Iface::new("lo", ip("::1")),
            Iface::new("eth0", ip("10.0.0.2")),
        ];
        let s = select_interfaces(&v6_only_lo, None, Some(AddrFamily::V6));
        assert_eq!(s, vec![Iface::new("lo", ip("::1"))]);
    }

    #[test]
    fn link_local_detection() {
        assert!(is_ipv6_link_local(&"fe80::1".parse().unwrap()));
        assert!(is_ipv6_link_local(&"febf::1".parse().unwrap()));
        assert!(!is_ipv6_link_local(&"fec0::1".parse().unwrap()));
        assert!(!is_ipv6_link_local(&"::1".parse().unwrap()));
    }

    #[test]
    fn enumerate_finds_loopback() {
        let all = enumerate_interfaces().unwrap();
        assert!(all.iter().all(|i| match i.addr {
            IpAddr::V6(a) => !is_ipv6_link_local(&a),
            IpAddr::V4(_) => true,
        }));
        let lo = select_interfaces(&all, Some("=lo"), Some(AddrFamily::V4));
        assert_eq!(lo.first().map(|i| i.addr), Some(ip("127.0.0.1")));
    }
}
