//! [`VerbsOptions`]: every setting of the verbs transport, with NCCL's
//! names and defaults. The library reads no environment itself: nccl-rs
//! reads these variables once into its `Config` and passes its lookup to
//! [`VerbsOptions::from_env_lookup`].
//!
//! | variable | field | default |
//! |---|---|---|
//! | `NCCL_IB_HCA` | `hca` | every active port (see [`crate::hca`]) |
//! | `NCCL_IB_GID_INDEX` | `gid_index` | scan the GID table (see [`crate::gid`]) |
//! | `NCCL_IB_ADDR_FAMILY` | `addr_family` | `AF_INET` |
//! | `NCCL_IB_ADDR_RANGE` | `addr_range` | any (CIDR, e.g. `10.0.0.0/8`) |
//! | `NCCL_IB_ROCE_VERSION_NUM` | `roce_version` | 2 |
//! | `NCCL_IB_TIMEOUT` | `timeout` | 20 (4.096 µs × 2^20 ≈ 4.3 s per try) |
//! | `NCCL_IB_RETRY_CNT` | `retry_cnt` | 7 |
//! | `NCCL_IB_TC` | `traffic_class` | 0 |
//! | `NCCL_IB_SL` | `service_level` | 0 |
//! | `NCCL_IB_QPS_PER_CONNECTION` | `qps_per_connection` | 1 |
//!
//! `oob_ip` (no variable; nccl-rs fills it with the bootstrap interface's
//! address, as NCCL opens its IB side socket on `NCCL_SOCKET_IFNAME`) is
//! where the side socket that completes the connection handshake listens.

use crate::error::VerbsError;
use crate::gid::{AddrFamily, Cidr};
use crate::rails::CrossNic;
use std::net::IpAddr;
use std::path::PathBuf;

/// Most queue pairs per connection (NCCL's `NCCL_IB_MAX_QPS`).
pub const MAX_QPS_PER_CONNECTION: usize = 128;

/// Settings of the verbs transport.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerbsOptions {
    /// `NCCL_IB_HCA`: device/port filter; `None` uses every active port.
    pub hca: Option<String>,
    /// `NCCL_IB_GID_INDEX`: fixed GID index (RoCE); `None` scans.
    pub gid_index: Option<u32>,
    /// `NCCL_IB_ADDR_FAMILY`: family of the RoCE GID to pick.
    pub addr_family: AddrFamily,
    /// `NCCL_IB_ADDR_RANGE`: subnet the RoCE GID must be in.
    pub addr_range: Option<Cidr>,
    /// `NCCL_IB_ROCE_VERSION_NUM`: 1 or 2.
    pub roce_version: u8,
    /// `NCCL_IB_TIMEOUT`: local ACK timeout exponent, 1..=31.
    pub timeout: u8,
    /// `NCCL_IB_RETRY_CNT`: transport retries, 0..=7.
    pub retry_cnt: u8,
    /// `NCCL_IB_TC`: traffic class (RoCE / GRH).
    pub traffic_class: u8,
    /// `NCCL_IB_SL`: service level, 0..=15.
    pub service_level: u8,
    /// `NCCL_IB_QPS_PER_CONNECTION`: messages are split over this many
    /// queue pairs.
    pub qps_per_connection: usize,
    /// Address of the handshake side socket; `None` uses the address inside
    /// the RoCE GID (IPv4-mapped or IPv6), which InfiniBand lacks.
    pub oob_ip: Option<IpAddr>,
    /// Root of sysfs (`/sys`); tests point it at a fake tree.
    pub sysfs_root: PathBuf,
    /// `NCCL_CROSS_NIC`: whether a connection may pair different rails
    /// (see [`crate::rails`]); applied by the connecting side.
    pub cross_nic: CrossNic,
}

impl Default for VerbsOptions {
    fn default() -> Self {
        VerbsOptions {
            hca: None,
            gid_index: None,
            addr_family: AddrFamily::V4,
            addr_range: None,
            roce_version: 2,
            timeout: 20,
            retry_cnt: 7,
            traffic_class: 0,
            service_level: 0,
            qps_per_connection: 1,
            oob_ip: None,
            sysfs_root: PathBuf::from("/sys"),
            cross_nic: CrossNic::Auto,
        }
    }
}

impl VerbsOptions {
    /// Reads the `NCCL_IB_*` variables through `get` (nccl-rs's `Config`
    /// and tests use this). Unset or empty variables keep the defaults;
    /// malformed ones are errors naming the variable.
    pub fn from_env_lookup(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<VerbsOptions, VerbsError> {
        let text = |k: &str| {
            get(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let d = VerbsOptions::default();
        let gid_index = match text("NCCL_IB_GID_INDEX") {
            None => None,
            // NCCL treats a negative index as "choose automatically".
            Some(v) if v.starts_with('-') && v[1..].parse::<u32>().is_ok() => None,
            Some(v) => Some(int(&v, "NCCL_IB_GID_INDEX", 0, 65535, "a GID index")?),
        };
        let addr_family = match text("NCCL_IB_ADDR_FAMILY").as_deref() {
            None => d.addr_family,
            Some("AF_INET") | Some("4") => AddrFamily::V4,
            Some("AF_INET6") | Some("6") => AddrFamily::V6,
            Some(v) => return Err(bad("NCCL_IB_ADDR_FAMILY", v, "AF_INET or AF_INET6")),
        };
        let addr_range =
            match text("NCCL_IB_ADDR_RANGE") {
                None => None,
                Some(v) => Some(Cidr::parse(&v).ok_or_else(|| {
                    bad("NCCL_IB_ADDR_RANGE", &v, "a CIDR range such as 10.0.0.0/8")
                })?),
            };
        let opt_int = |var: &'static str, default: u32, lo: u32, hi: u32, want: &'static str| {
            text(var).map_or(Ok(default), |v| int(&v, var, lo, hi, want))
        };
        Ok(VerbsOptions {
            hca: text("NCCL_IB_HCA"),
            gid_index,
            addr_family,
            addr_range,
            roce_version: opt_int("NCCL_IB_ROCE_VERSION_NUM", 2, 1, 2, "1 or 2")? as u8,
            timeout: opt_int("NCCL_IB_TIMEOUT", d.timeout.into(), 1, 31, "1..=31")? as u8,
            retry_cnt: opt_int("NCCL_IB_RETRY_CNT", d.retry_cnt.into(), 0, 7, "0..=7")? as u8,
            traffic_class: opt_int("NCCL_IB_TC", 0, 0, 255, "0..=255")? as u8,
            service_level: opt_int("NCCL_IB_SL", 0, 0, 15, "0..=15")? as u8,
            qps_per_connection: opt_int(
                "NCCL_IB_QPS_PER_CONNECTION",
                1,
                1,
                MAX_QPS_PER_CONNECTION as u32,
                "1..=128",
            )? as usize,
            oob_ip: None,
            sysfs_root: d.sysfs_root,
            // NCCL_CROSS_NIC applies to every transport: the caller's
            // configuration reads it once and sets it here.
            cross_nic: d.cross_nic,
        })
    }

    /// Checks ranges (for options built by hand).
    pub fn validate(&self) -> Result<(), VerbsError> {
        let check = |ok: bool, var: &'static str, v: String, want: &'static str| {
            if ok {
                Ok(())
            } else {
                Err(VerbsError::BadOption {
                    var,
                    value: v,
                    want,
                })
            }
        };
        check(
            (1..=31).contains(&self.timeout),
            "NCCL_IB_TIMEOUT",
            self.timeout.to_string(),
            "1..=31",
        )?;
        check(
            self.retry_cnt <= 7,
            "NCCL_IB_RETRY_CNT",
            self.retry_cnt.to_string(),
            "0..=7",
        )?;
        check(
            self.service_level <= 15,
            "NCCL_IB_SL",
            self.service_level.to_string(),
            "0..=15",
        )?;
        check(
            (1..=2).contains(&self.roce_version),
            "NCCL_IB_ROCE_VERSION_NUM",
            self.roce_version.to_string(),
            "1 or 2",
        )?;
        check(
            (1..=MAX_QPS_PER_CONNECTION).contains(&self.qps_per_connection),
            "NCCL_IB_QPS_PER_CONNECTION",
            self.qps_per_connection.to_string(),
            "1..=128",
        )
    }
}

fn bad(var: &'static str, value: &str, want: &'static str) -> VerbsError {
    VerbsError::BadOption {
        var,
        value: value.to_owned(),
        want,
    }
}

fn int(
    v: &str,
    var: &'static str,
    lo: u32,
    hi: u32,
    want: &'static str,
) -> Result<u32, VerbsError> {
    match v.parse::<u32>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(bad(var, v, want)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn from(pairs: &[(&str, &str)]) -> Result<VerbsOptions, VerbsError> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        VerbsOptions::from_env_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn defaults_are_nccls() {
        let o = from(&[]).unwrap();
        assert_eq!(o, VerbsOptions::default());
        assert_eq!(
            (o.timeout, o.retry_cnt, o.service_level, o.traffic_class),
            (20, 7, 0, 0)
        );
        assert_eq!(o.qps_per_connection, 1);
        assert_eq!(o.addr_family, AddrFamily::V4);
        assert_eq!(o.roce_version, 2);
        o.validate().unwrap();
    }

    #[test]
    fn parses_every_variable() {
        let o = from(&[
            ("NCCL_IB_HCA", "=mlx5_0:1,rxe0"),
            ("NCCL_IB_GID_INDEX", "3"),
            ("NCCL_IB_ADDR_FAMILY", "AF_INET6"),
            ("NCCL_IB_ADDR_RANGE", "fd00::/8"),
            ("NCCL_IB_ROCE_VERSION_NUM", "1"),
            ("NCCL_IB_TIMEOUT", "14"),
            ("NCCL_IB_RETRY_CNT", " 3 "),
            ("NCCL_IB_TC", "106"),
            ("NCCL_IB_SL", "5"),
            ("NCCL_IB_QPS_PER_CONNECTION", "4"),
            ("NCCL_CROSS_NIC", "1"),
        ])
        .unwrap();
        // Not read here (nccl-rs's Config reads it for both transports).
        assert_eq!(o.cross_nic, CrossNic::Auto);
        assert_eq!(o.hca.as_deref(), Some("=mlx5_0:1,rxe0"));
        assert_eq!(o.gid_index, Some(3));
        assert_eq!(o.addr_family, AddrFamily::V6);
        assert_eq!(o.addr_range, Cidr::parse("fd00::/8"));
        assert_eq!(o.roce_version, 1);
        assert_eq!(
            (o.timeout, o.retry_cnt, o.traffic_class, o.service_level),
            (14, 3, 106, 5)
        );
        assert_eq!(o.qps_per_connection, 4);
        // NCCL's "-1" means automatic.
        assert_eq!(
            from(&[("NCCL_IB_GID_INDEX", "-1")]).unwrap().gid_index,
            None
        );
    }

    #[test]
    fn rejects_out_of_range_values_naming_the_variable() {
        for (k, v) in [
            ("NCCL_IB_TIMEOUT", "0"),
            ("NCCL_IB_TIMEOUT", "32"),
            ("NCCL_IB_RETRY_CNT", "8"),
            ("NCCL_IB_SL", "16"),
            ("NCCL_IB_TC", "256"),
            ("NCCL_IB_QPS_PER_CONNECTION", "0"),
            ("NCCL_IB_QPS_PER_CONNECTION", "129"),
            ("NCCL_IB_ADDR_FAMILY", "AF_UNIX"),
            ("NCCL_IB_ADDR_RANGE", "10.0.0.0/33"),
            ("NCCL_IB_GID_INDEX", "x"),
        ] {
            let e = from(&[(k, v)]).unwrap_err();
            assert!(e.to_string().contains(k), "{e}");
        }
    }
}
