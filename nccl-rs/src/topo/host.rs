//! This process's [`HostRecord`]: which host it is on, the name that host
//! has in `topology.conf`, and its NICs (the interfaces
//! `NCCL_SOCKET_IFNAME` selects, so that the bootstrap, the TCP transport
//! and the topology agree), with a byte encoding for the exchange at init.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use transport_tcp::{AddrFamily, Iface};

/// Version of [`HostRecord::encode`]'s format.
pub const RECORD_VERSION: u8 = 1;
/// First byte of an encoded record.
const MAGIC: u8 = b'H';

/// One network interface of a host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nic {
    /// Interface name, e.g. `eth0`.
    pub name: String,
    /// Its address (the one the TCP transport would use).
    pub addr: IpAddr,
    /// Link speed in Mbit/s; 0 when unknown.
    pub speed_mbps: u32,
    /// Rail: its position among the TCP transport's rails (the selected
    /// interfaces in name order, `transport_tcp::rails::pick_rails`): the
    /// NIC of rail `i` on one host talks to rail `i` on others.
    pub rail: u32,
}

/// What one rank tells the others about its host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostRecord {
    /// Host identity: equal for exactly the ranks of one host
    /// (`NCCL_HOSTID`, else boot id and host name).
    pub id: Vec<u8>,
    /// The name this host has in `topology.conf` (`NCCL_HOSTID`, else the
    /// short host name).
    pub name: String,
    /// The interfaces `NCCL_SOCKET_IFNAME` selects, by rail.
    pub nics: Vec<Nic>,
}

/// A record that does not decode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad host record: {0}")]
pub struct DecodeError(pub String);

impl HostRecord {
    /// This process's record: `host_id` is `NCCL_HOSTID`, `ifname` and
    /// `family` select the NICs as the TCP transport does. Interfaces that
    /// cannot be listed leave the record without NICs (with a warning).
    pub fn detect(
        host_id: Option<&str>,
        ifname: Option<&str>,
        family: Option<AddrFamily>,
    ) -> HostRecord {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let ifaces = transport_tcp::enumerate_interfaces().unwrap_or_else(|e| {
            tracing::warn!("topology: cannot list network interfaces: {e}");
            Vec::new()
        });
        // The transport's rails, in its order: rail k here is the NIC its
        // data sockets of rail k use.
        let selected = transport_tcp::select_interfaces(&ifaces, ifname, family);
        let selected = transport_tcp::rails::pick_rails(selected, ifname).rails;
        HostRecord::from_parts(
            host_id,
            &read("/proc/sys/kernel/random/boot_id"),
            &read("/proc/sys/kernel/hostname"),
            &selected,
            |name| parse_speed(&read(&format!("/sys/class/net/{name}/speed"))),
        )
    }

    /// The record from its facts: `selected` the rails in rail order (a
    /// name listed twice counts once), `speed(name)` an interface's speed
    /// in Mbit/s.
    pub fn from_parts(
        host_id: Option<&str>,
        boot_id: &str,
        hostname: &str,
        selected: &[Iface],
        speed: impl Fn(&str) -> u32,
    ) -> HostRecord {
        let host_id = host_id.map(str::trim).filter(|h| !h.is_empty());
        let hostname = hostname.trim();
        let id = match host_id {
            Some(h) => h.as_bytes().to_vec(),
            None => format!("{}/{}", boot_id.trim(), hostname).into_bytes(),
        };
        let name = match host_id {
            Some(h) => h.to_string(),
            None => short_hostname(hostname).to_string(),
        };
        let mut rails: Vec<&Iface> = Vec::with_capacity(selected.len());
        for i in selected {
            if !rails.iter().any(|r| r.name == i.name) {
                rails.push(i);
            }
        }
        let nics = rails
            .iter()
            .enumerate()
            .map(|(rail, i)| Nic {
                name: i.name.clone(),
                addr: i.addr,
                speed_mbps: speed(&i.name),
                rail: rail as u32,
            })
            .collect();
        HostRecord { id, name, nics }
    }

    /// The same record with the verbs transport's rails as its NICs, in
    /// rail order (`transport_verbs::rail_summaries`): when connections go
    /// over verbs, rail `k` of a host is its `k`-th RDMA port. A NIC is
    /// named `device:port`; its address is the one in its RoCE GID, or the
    /// unspecified IPv4 address (InfiniBand).
    pub fn with_verbs_rails(mut self, rails: &[transport_verbs::RailSummary]) -> HostRecord {
        self.nics = rails
            .iter()
            .enumerate()
            .map(|(rail, r)| Nic {
                name: format!("{}:{}", r.port.device, r.port.port),
                addr: r.addr.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
                speed_mbps: u32::try_from(r.port.speed_mbps).unwrap_or(u32::MAX),
                rail: rail as u32,
            })
            .collect();
        self
    }

    /// The record as bytes: magic, version, then length-prefixed fields
    /// (little-endian).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![MAGIC, RECORD_VERSION];
        put_bytes(&mut b, &self.id);
        put_bytes(&mut b, self.name.as_bytes());
        b.extend_from_slice(&(self.nics.len() as u32).to_le_bytes());
        for n in &self.nics {
            put_bytes(&mut b, n.name.as_bytes());
            match n.addr {
                IpAddr::V4(a) => {
                    b.push(4);
                    b.extend_from_slice(&a.octets());
                }
                IpAddr::V6(a) => {
                    b.push(6);
                    b.extend_from_slice(&a.octets());
                }
            }
            b.extend_from_slice(&n.speed_mbps.to_le_bytes());
            b.extend_from_slice(&n.rail.to_le_bytes());
        }
        b
    }

    /// Decodes [`HostRecord::encode`]'s bytes; anything else (truncated,
    /// another version, trailing bytes, text that is not UTF-8) is an error.
    pub fn decode(bytes: &[u8]) -> Result<HostRecord, DecodeError> {
        let mut r = Reader(bytes);
        match r.take(2)? {
            [MAGIC, RECORD_VERSION] => {}
            [MAGIC, v] => {
                return Err(DecodeError(format!(
                    "version {v}, expected {RECORD_VERSION}"
                )))
            }
            _ => return Err(DecodeError("not a host record".into())),
        }
        let id = r.bytes()?.to_vec();
        let name = r.text()?;
        let count = r.u32()? as usize;
        // Each NIC takes at least 13 bytes: a count beyond what is left is
        // garbage, refused before allocating for it.
        if count > r.0.len() / 13 {
            return Err(DecodeError(format!("{count} NICs in {} bytes", r.0.len())));
        }
        let mut nics = Vec::with_capacity(count);
        for _ in 0..count {
            let name = r.text()?;
            let addr = match r.take(1)?[0] {
                4 => IpAddr::V4(Ipv4Addr::from(
                    <[u8; 4]>::try_from(r.take(4)?).expect("4 bytes"),
                )),
                6 => IpAddr::V6(Ipv6Addr::from(
                    <[u8; 16]>::try_from(r.take(16)?).expect("16 bytes"),
                )),
                f => return Err(DecodeError(format!("address family {f}"))),
            };
            let speed_mbps = r.u32()?;
            let rail = r.u32()?;
            nics.push(Nic {
                name,
                addr,
                speed_mbps,
                rail,
            });
        }
        if !r.0.is_empty() {
            return Err(DecodeError(format!("{} trailing bytes", r.0.len())));
        }
        Ok(HostRecord { id, name, nics })
    }
}

fn put_bytes(b: &mut Vec<u8>, v: &[u8]) {
    b.extend_from_slice(&(v.len() as u32).to_le_bytes());
    b.extend_from_slice(v);
}

/// A bounds-checked cursor over an encoded record.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.0.len() {
            return Err(DecodeError(format!(
                "truncated: {n} bytes wanted, {} left",
                self.0.len()
            )));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn text(&mut self) -> Result<String, DecodeError> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| DecodeError("text that is not UTF-8".into()))
    }
}

/// The host name up to its first dot (`node7.cluster` → `node7`), as Slurm
/// names nodes.
pub fn short_hostname(name: &str) -> &str {
    name.split('.').next().unwrap_or(name)
}

/// `/sys/class/net/NAME/speed`'s text as Mbit/s: 0 when unknown (empty, not
/// a number, or negative: a virtual interface reports -1).
pub fn parse_speed(text: &str) -> u32 {
    text.trim()
        .parse::<i64>()
        .ok()
        .and_then(|s| u32::try_from(s).ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn speeds_parse_or_are_unknown() {
        let cases = [
            ("25000\n", 25000),
            ("100", 100),
            ("-1\n", 0),
            ("", 0),
            ("fast", 0),
            ("99999999999", 0),
        ];
        for (text, want) in cases {
            assert_eq!(parse_speed(text), want, "{text:?}");
        }
    }

    #[test]
    fn identity_and_name_follow_nccl_hostid() {
        // (NCCL_HOSTID, hostname) → (id, name)
        let cases: &[(Option<&str>, &str, &str, &str)] = &[
            (None, "node7.cluster\n", "b00t/node7.cluster", "node7"),
            (None, "fab-h3", "b00t/fab-h3", "fab-h3"),
            (Some("fab-h9"), "node7.cluster", "fab-h9", "fab-h9"),
            (Some("  "), "n1", "b00t/n1", "n1"),
        ];
        for (hostid, hostname, id, name) in cases {
            let r = HostRecord::from_parts(*hostid, "b00t\n", hostname, &[], |_| 0);
            assert_eq!(
                (r.id.as_slice(), r.name.as_str()),
                (id.as_bytes(), *name),
                "{hostid:?} {hostname:?}"
            );
        }
    }

    #[test]
    fn rails_are_the_given_interfaces_in_order() {
        let selected = [
            Iface::new("eth0", ip("10.0.0.2")),
            Iface::new("ib0", ip("fd00::2")),
            Iface::new("eth0", ip("10.0.0.3")),
            Iface::new("ib1", ip("10.1.0.2")),
        ];
        let speed = |n: &str| if n == "eth0" { 25000 } else { 0 };
        let r = HostRecord::from_parts(None, "b", "h", &selected, speed);
        let got: Vec<(&str, u32, u32)> = r
            .nics
            .iter()
            .map(|n| (n.name.as_str(), n.rail, n.speed_mbps))
            .collect();
        assert_eq!(got, [("eth0", 0, 25000), ("ib0", 1, 0), ("ib1", 2, 0)]);
        assert_eq!(r.nics[1].addr, ip("fd00::2"));
    }

    #[test]
    fn verbs_rails_replace_the_interfaces() {
        let port = |dev: &str, p: u8, speed| transport_verbs::PortInfo {
            device: dev.into(),
            port: p,
            link_layer: Some(transport_verbs::LinkLayer::Ethernet),
            active: true,
            mtu: 3,
            lid: 0,
            gid_tbl_len: 16,
            max_msg_sz: 1 << 30,
            speed_mbps: speed,
        };
        let rails = [
            transport_verbs::RailSummary {
                port: port("mlx5_1", 1, 100_000),
                addr: Some(ip("10.1.0.2")),
            },
            transport_verbs::RailSummary {
                port: port("mlx5_0", 2, 1 << 40),
                addr: None,
            },
        ];
        let selected = [Iface::new("eth0", ip("10.0.0.2"))];
        let r = HostRecord::from_parts(None, "b", "h", &selected, |_| 0).with_verbs_rails(&rails);
        assert_eq!(
            r.nics,
            [
                Nic {
                    name: "mlx5_1:1".into(),
                    addr: ip("10.1.0.2"),
                    speed_mbps: 100_000,
                    rail: 0,
                },
                Nic {
                    name: "mlx5_0:2".into(),
                    addr: ip("0.0.0.0"),
                    speed_mbps: u32::MAX,
                    rail: 1,
                },
            ]
        );
        assert_eq!(HostRecord::decode(&r.encode()), Ok(r));
    }

    #[test]
    fn detect_finds_loopback_when_asked() {
        let r = HostRecord::detect(Some("h"), Some("=lo"), Some(AddrFamily::V4));
        assert_eq!(r.name, "h");
        assert_eq!(r.nics.len(), 1);
        assert_eq!(
            (r.nics[0].name.as_str(), r.nics[0].addr, r.nics[0].rail),
            ("lo", ip("127.0.0.1"), 0)
        );
    }

    fn sample() -> HostRecord {
        HostRecord {
            id: b"boot/host\xff".to_vec(),
            name: "fab-h1".into(),
            nics: vec![
                Nic {
                    name: "eth0".into(),
                    addr: ip("10.78.0.2"),
                    speed_mbps: 10000,
                    rail: 0,
                },
                Nic {
                    name: "ib0".into(),
                    addr: ip("fd00::7"),
                    speed_mbps: 0,
                    rail: 1,
                },
            ],
        }
    }

    #[test]
    fn records_round_trip() {
        for r in [
            sample(),
            HostRecord {
                id: vec![],
                name: String::new(),
                nics: vec![],
            },
        ] {
            assert_eq!(HostRecord::decode(&r.encode()), Ok(r));
        }
        let b = sample().encode();
        assert_eq!(&b[..6], &[b'H', 1, 10, 0, 0, 0]);
    }

    #[test]
    fn truncated_or_garbage_records_are_errors() {
        let b = sample().encode();
        for n in 0..b.len() {
            assert!(HostRecord::decode(&b[..n]).is_err(), "truncated to {n}");
        }
        let mut trailing = b.clone();
        trailing.push(0);
        assert_eq!(
            HostRecord::decode(&trailing),
            Err(DecodeError("1 trailing bytes".into()))
        );
        let mut version = b.clone();
        version[1] = 2;
        assert_eq!(
            HostRecord::decode(&version),
            Err(DecodeError("version 2, expected 1".into()))
        );
        let mut huge = vec![b'H', 1, 0, 0, 0, 0, 0, 0, 0, 0];
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(HostRecord::decode(&huge).is_err());
        let mut rng = crate::testing::Rng(7);
        for _ in 0..20_000 {
            let mut g = b.clone();
            let i = (rng.next_u64() as usize) % g.len();
            g[i] = rng.next_u64() as u8;
            let _ = HostRecord::decode(&g);
            let len = (rng.next_u64() % 64) as usize;
            let junk: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            let _ = HostRecord::decode(&junk);
        }
    }
}
