//! RoCE GID selection.
//!
//! On Ethernet (RoCE) a port has a GID table: one entry per IP address of
//! the netdev and RoCE version, plus link-local entries. `NCCL_IB_GID_INDEX`
//! fixes the index; otherwise [`select_gid`] picks, in table order:
//! 1. the first *valid* GID (configured, i.e. non-zero, and not link-local
//!    `fe80::/10`) of the wanted address family (`NCCL_IB_ADDR_FAMILY`;
//!    IPv4 addresses appear IPv4-mapped, `::ffff:a.b.c.d`), inside
//!    `NCCL_IB_ADDR_RANGE` if set, of the wanted RoCE version
//!    (`NCCL_IB_ROCE_VERSION_NUM`, from `gid_attrs/types/<i>`);
//! 2. failing that, the first valid GID of the family and range, any version;
//! 3. failing that, index 0 (what NCCL falls back to).
//!
//! The table comes from sysfs ([`read_gid_table`]):
//! `<sysfs>/class/infiniband/<dev>/ports/<port>/gids/<i>` holds the GID as
//! eight colon-separated groups of four hex digits, and
//! `.../gid_attrs/types/<i>` holds `"RoCE v2"` or `"IB/RoCE v1"` (reading it
//! fails for unset entries). Everything but the file reading is pure and
//! tested on fake tables and a fake sysfs tree.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

/// Address family of a RoCE GID (`NCCL_IB_ADDR_FAMILY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AddrFamily {
    /// IPv4 (`AF_INET`): IPv4-mapped GIDs.
    V4,
    /// IPv6 (`AF_INET6`).
    V6,
}

/// RoCE version of a GID entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GidType {
    /// `"IB/RoCE v1"`.
    RoceV1,
    /// `"RoCE v2"`.
    RoceV2,
    /// Missing or unreadable type.
    Unknown,
}

impl GidType {
    /// Parses the content of a `gid_attrs/types/<i>` file.
    pub fn parse(s: &str) -> GidType {
        match s.trim() {
            "RoCE v2" => GidType::RoceV2,
            "IB/RoCE v1" | "RoCE v1" => GidType::RoceV1,
            _ => GidType::Unknown,
        }
    }

    fn version(self) -> Option<u8> {
        match self {
            GidType::RoceV1 => Some(1),
            GidType::RoceV2 => Some(2),
            GidType::Unknown => None,
        }
    }
}

/// One entry of a port's GID table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in the table.
    pub index: u32,
    /// The 16 raw bytes (network order).
    pub gid: [u8; 16],
    /// RoCE version.
    pub kind: GidType,
}

/// An IP prefix such as `10.0.0.0/8` (`NCCL_IB_ADDR_RANGE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    /// Network address.
    pub addr: IpAddr,
    /// Prefix length in bits.
    pub prefix: u8,
}

impl Cidr {
    /// Parses `addr/len`; `None` if malformed or the length is too long.
    pub fn parse(s: &str) -> Option<Cidr> {
        let (a, p) = s.trim().split_once('/')?;
        let addr: IpAddr = a.parse().ok()?;
        let prefix: u8 = p.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (prefix <= max).then_some(Cidr { addr, prefix })
    }

    /// Whether `ip` lies inside (families must agree).
    pub fn contains(&self, ip: IpAddr) -> bool {
        fn prefix_eq(a: &[u8], b: &[u8], bits: u8) -> bool {
            let (full, rest) = (usize::from(bits / 8), bits % 8);
            if a[..full] != b[..full] {
                return false;
            }
            rest == 0 || (a[full] ^ b[full]) >> (8 - rest) == 0
        }
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(i)) => prefix_eq(&n.octets(), &i.octets(), self.prefix),
            (IpAddr::V6(n), IpAddr::V6(i)) => prefix_eq(&n.octets(), &i.octets(), self.prefix),
            _ => false,
        }
    }
}

/// What [`select_gid`] looks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidWanted {
    /// Address family.
    pub family: AddrFamily,
    /// Optional subnet.
    pub range: Option<Cidr>,
    /// RoCE version (1 or 2).
    pub roce_version: u8,
}

/// Why [`select_gid`] chose its index (for the INFO line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidChoice {
    /// Matched family, range and version.
    Exact(u32),
    /// Matched family and range, but not the RoCE version.
    OtherVersion(u32),
    /// Nothing matched: index 0.
    Fallback,
}

impl GidChoice {
    /// The chosen index.
    pub fn index(self) -> u32 {
        match self {
            GidChoice::Exact(i) | GidChoice::OtherVersion(i) => i,
            GidChoice::Fallback => 0,
        }
    }
}

/// The IP address a GID stands for: IPv4 for `::ffff:a.b.c.d`, else IPv6.
pub fn gid_ip(gid: &[u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(*gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// Configured (non-zero interface id) and not link-local (`fe80::/10`).
pub fn is_valid_gid(gid: &[u8; 16]) -> bool {
    let configured = gid[8..].iter().any(|&b| b != 0) || gid[..8].iter().any(|&b| b != 0);
    let link_local = gid[0] == 0xfe && gid[1] & 0xc0 == 0x80;
    configured && !link_local
}

fn family_of(ip: IpAddr) -> AddrFamily {
    match ip {
        IpAddr::V4(_) => AddrFamily::V4,
        IpAddr::V6(_) => AddrFamily::V6,
    }
}

/// Picks a GID index from `table` (see the module docs for the rules).
pub fn select_gid(table: &[GidEntry], want: &GidWanted) -> GidChoice {
    let fits = |e: &&GidEntry| {
        let ip = gid_ip(&e.gid);
        is_valid_gid(&e.gid)
            && family_of(ip) == want.family
            && match want.range {
                Some(r) => r.contains(ip),
                None => true,
            }
    };
    if let Some(e) = table
        .iter()
        .filter(fits)
        .find(|e| e.kind.version() == Some(want.roce_version))
    {
        return GidChoice::Exact(e.index);
    }
    match table.iter().find(fits) {
        Some(e) => GidChoice::OtherVersion(e.index),
        None => GidChoice::Fallback,
    }
}

/// Parses a sysfs GID (`0000:0000:0000:0000:0000:ffff:0a00:020f`).
pub fn parse_sysfs_gid(s: &str) -> Option<[u8; 16]> {
    let groups: Vec<&str> = s.trim().split(':').collect();
    if groups.len() != 8 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, g) in groups.iter().enumerate() {
        if g.len() != 4 {
            return None;
        }
        let v = u16::from_str_radix(g, 16).ok()?;
        out[2 * i..2 * i + 2].copy_from_slice(&v.to_be_bytes());
    }
    Some(out)
}

/// Reads the first `len` entries of the GID table of `dev` port `port` from
/// a sysfs tree rooted at `sysfs` (normally `/sys`). Unreadable or
/// malformed entries are skipped.
pub fn read_gid_table(sysfs: &Path, dev: &str, port: u8, len: u32) -> Vec<GidEntry> {
    let base = sysfs
        .join("class/infiniband")
        .join(dev)
        .join("ports")
        .join(port.to_string());
    (0..len)
        .filter_map(|i| {
            let gid = std::fs::read_to_string(base.join("gids").join(i.to_string())).ok()?;
            let gid = parse_sysfs_gid(&gid)?;
            let kind = std::fs::read_to_string(base.join("gid_attrs/types").join(i.to_string()))
                .map_or(GidType::Unknown, |s| GidType::parse(&s));
            Some(GidEntry {
                index: i,
                gid,
                kind,
            })
        })
        .collect()
}

/// Formats a GID like sysfs does.
pub fn format_gid(gid: &[u8; 16]) -> String {
    gid.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// An IPv4-mapped GID for `ip` (tests and fake tables).
pub fn v4_mapped(ip: Ipv4Addr) -> [u8; 16] {
    ip.to_ipv6_mapped().octets()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v6(s: &str) -> [u8; 16] {
        s.parse::<Ipv6Addr>().unwrap().octets()
    }

    fn e(index: u32, gid: [u8; 16], kind: GidType) -> GidEntry {
        GidEntry { index, gid, kind }
    }

    /// A typical rxe / mlx5 RoCE table: link-local v1+v2, then IPv4 v1+v2,
    /// then a global IPv6 v1+v2.
    fn table() -> Vec<GidEntry> {
        let ll = v6("fe80::5054:ff:fe12:3456");
        let ip4 = v4_mapped(Ipv4Addr::new(10, 0, 2, 15));
        let ip6 = v6("fd00::15");
        vec![
            e(0, ll, GidType::RoceV1),
            e(1, ll, GidType::RoceV2),
            e(2, ip4, GidType::RoceV1),
            e(3, ip4, GidType::RoceV2),
            e(4, ip6, GidType::RoceV1),
            e(5, ip6, GidType::RoceV2),
        ]
    }

    fn want(family: AddrFamily, range: Option<&str>, v: u8) -> GidWanted {
        GidWanted {
            family,
            range: range.map(|r| Cidr::parse(r).unwrap()),
            roce_version: v,
        }
    }

    #[test]
    fn picks_ipv4_roce_v2_by_default() {
        assert_eq!(
            select_gid(&table(), &want(AddrFamily::V4, None, 2)),
            GidChoice::Exact(3)
        );
        assert_eq!(
            select_gid(&table(), &want(AddrFamily::V4, None, 1)),
            GidChoice::Exact(2)
        );
        assert_eq!(
            select_gid(&table(), &want(AddrFamily::V6, None, 2)),
            GidChoice::Exact(5)
        );
    }

    #[test]
    fn range_filters_and_falls_back() {
        let t = table();
        assert_eq!(
            select_gid(&t, &want(AddrFamily::V4, Some("10.0.0.0/8"), 2)),
            GidChoice::Exact(3)
        );
        assert_eq!(
            select_gid(&t, &want(AddrFamily::V4, Some("192.168.0.0/16"), 2)),
            GidChoice::Fallback
        );
        assert_eq!(
            select_gid(&t, &want(AddrFamily::V6, Some("fd00::/8"), 2)),
            GidChoice::Exact(5)
        );
        assert_eq!(
            select_gid(&t, &want(AddrFamily::V6, Some("2001:db8::/32"), 2)),
            GidChoice::Fallback
        );
        assert_eq!(GidChoice::Fallback.index(), 0);
    }

    #[test]
    fn version_fallback_and_unset_entries() {
        // Only a v1 entry of the family: chosen as OtherVersion.
        let ip4 = v4_mapped(Ipv4Addr::new(192, 168, 1, 7));
        let t = vec![
            e(0, [0; 16], GidType::Unknown),
            e(1, v6("fe80::1"), GidType::RoceV2),
            e(2, ip4, GidType::RoceV1),
        ];
        assert_eq!(
            select_gid(&t, &want(AddrFamily::V4, None, 2)),
            GidChoice::OtherVersion(2)
        );
        // Empty or link-local-only tables fall back to 0.
        assert_eq!(
            select_gid(&[], &want(AddrFamily::V4, None, 2)),
            GidChoice::Fallback
        );
        assert_eq!(
            select_gid(&t[..2], &want(AddrFamily::V4, None, 2)),
            GidChoice::Fallback
        );
    }

    #[test]
    fn gid_helpers() {
        assert!(!is_valid_gid(&[0; 16]));
        assert!(!is_valid_gid(&v6("fe80::1")));
        assert!(!is_valid_gid(&v6("febf::1")));
        assert!(is_valid_gid(&v6("fec0::1")));
        assert!(is_valid_gid(&v4_mapped(Ipv4Addr::new(10, 0, 2, 15))));
        assert_eq!(
            gid_ip(&v4_mapped(Ipv4Addr::new(10, 0, 2, 15))),
            "10.0.2.15".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            gid_ip(&v6("fd00::15")),
            "fd00::15".parse::<IpAddr>().unwrap()
        );
        let s = "0000:0000:0000:0000:0000:ffff:0a00:020f";
        let g = parse_sysfs_gid(s).unwrap();
        assert_eq!(g, v4_mapped(Ipv4Addr::new(10, 0, 2, 15)));
        assert_eq!(format_gid(&g), s);
        assert_eq!(parse_sysfs_gid("0000:0000"), None);
        assert_eq!(
            parse_sysfs_gid("000g:0000:0000:0000:0000:ffff:0a00:020f"),
            None
        );
        assert_eq!(GidType::parse("RoCE v2\n"), GidType::RoceV2);
        assert_eq!(GidType::parse("IB/RoCE v1\n"), GidType::RoceV1);
        assert_eq!(GidType::parse(""), GidType::Unknown);
    }

    #[test]
    fn cidr() {
        let c = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(c.contains("10.1.255.3".parse().unwrap()));
        assert!(!c.contains("10.2.0.1".parse().unwrap()));
        assert!(!c.contains("::1".parse().unwrap()));
        let c = Cidr::parse("10.0.0.0/9").unwrap();
        assert!(c.contains("10.127.0.1".parse().unwrap()));
        assert!(!c.contains("10.128.0.1".parse().unwrap()));
        assert!(Cidr::parse("0.0.0.0/0")
            .unwrap()
            .contains("1.2.3.4".parse().unwrap()));
        assert!(Cidr::parse("fd00::/7")
            .unwrap()
            .contains("fdff::1".parse().unwrap()));
        assert_eq!(Cidr::parse("10.0.0.0"), None);
        assert_eq!(Cidr::parse("10.0.0.0/33"), None);
        assert_eq!(Cidr::parse("::/129"), None);
    }

    /// A fake sysfs tree laid out like the kernel's, read back and selected.
    #[test]
    fn reads_a_fake_sysfs_tree() {
        let root = std::env::temp_dir().join(format!("verbs-gid-test-{}", std::process::id()));
        let port = root.join("class/infiniband/rxe0/ports/1");
        std::fs::create_dir_all(port.join("gids")).unwrap();
        std::fs::create_dir_all(port.join("gid_attrs/types")).unwrap();
        let rows = [
            (
                "fe80:0000:0000:0000:5054:00ff:fe12:3456",
                Some("IB/RoCE v1"),
            ),
            ("fe80:0000:0000:0000:5054:00ff:fe12:3456", Some("RoCE v2")),
            (
                "0000:0000:0000:0000:0000:ffff:0a00:020f",
                Some("IB/RoCE v1"),
            ),
            ("0000:0000:0000:0000:0000:ffff:0a00:020f", Some("RoCE v2")),
            ("0000:0000:0000:0000:0000:0000:0000:0000", None),
        ];
        for (i, (gid, ty)) in rows.iter().enumerate() {
            std::fs::write(port.join("gids").join(i.to_string()), format!("{gid}\n")).unwrap();
            if let Some(ty) = ty {
                std::fs::write(
                    port.join("gid_attrs/types").join(i.to_string()),
                    format!("{ty}\n"),
                )
                .unwrap();
            }
        }
        // Index 6 is past the files: skipped.
        let t = read_gid_table(&root, "rxe0", 1, 7);
        assert_eq!(t.len(), 5);
        assert_eq!(t[3].kind, GidType::RoceV2);
        assert_eq!(t[4].kind, GidType::Unknown);
        assert_eq!(
            select_gid(&t, &want(AddrFamily::V4, None, 2)),
            GidChoice::Exact(3)
        );
        assert_eq!(
            select_gid(&t, &want(AddrFamily::V6, None, 2)),
            GidChoice::Fallback
        );
        assert!(read_gid_table(&root, "mlx5_0", 1, 4).is_empty());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
