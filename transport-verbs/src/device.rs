//! Device and port discovery, and the chosen port (`Port`) that every
//! connection of a [`crate::VerbsNet`] uses.

use crate::error::VerbsError;
use crate::gid::{self, GidChoice, GidWanted};
use crate::hca::HcaFilter;
use crate::options::VerbsOptions;
use crate::sys::{self, Lib};
use crate::verbs::{self, ContextInner, PdInner};
use std::net::IpAddr;
use std::sync::Arc;

/// Link layer of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// InfiniBand: LID addressing.
    InfiniBand,
    /// Ethernet: RoCE, GID addressing.
    Ethernet,
}

impl LinkLayer {
    /// From `ibv_port_attr.link_layer` (unspecified means InfiniBand, as in
    /// libibverbs).
    pub fn from_raw(v: u8) -> Option<LinkLayer> {
        match v {
            sys::IBV_LINK_LAYER_INFINIBAND | sys::IBV_LINK_LAYER_UNSPECIFIED => {
                Some(LinkLayer::InfiniBand)
            }
            sys::IBV_LINK_LAYER_ETHERNET => Some(LinkLayer::Ethernet),
            _ => None,
        }
    }

    pub(crate) fn raw(self) -> u8 {
        match self {
            LinkLayer::InfiniBand => sys::IBV_LINK_LAYER_INFINIBAND,
            LinkLayer::Ethernet => sys::IBV_LINK_LAYER_ETHERNET,
        }
    }

    /// NCCL's name for it: `"IB"` or `"RoCE"`.
    pub fn nccl_name(self) -> &'static str {
        match self {
            LinkLayer::InfiniBand => "IB",
            LinkLayer::Ethernet => "RoCE",
        }
    }
}

/// One port of one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// Device name, e.g. `mlx5_0` or `rxe0`.
    pub device: String,
    /// Port number (from 1).
    pub port: u8,
    /// Link layer, `None` if unknown.
    pub link_layer: Option<LinkLayer>,
    /// `IBV_PORT_ACTIVE`.
    pub active: bool,
    /// Active MTU (`enum ibv_mtu`: 1 = 256 … 5 = 4096).
    pub mtu: u8,
    /// LID (InfiniBand).
    pub lid: u16,
    /// GID table length.
    pub gid_tbl_len: u32,
    /// Largest message one work request may carry.
    pub max_msg_sz: u32,
    /// Link speed in Mbit/s.
    pub speed_mbps: u64,
}

/// Mbit/s of a port from `active_width` and `active_speed` codes, as
/// NCCL's `ncclIbSpeed` / `ncclIbWidth` (0 if unknown).
pub fn speed_mbps(width: u8, speed: u8) -> u64 {
    let lanes = match width {
        1 => 1,
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => 0,
    };
    let lane_mbps = match speed {
        1 => 2_500,
        2 => 5_000,
        4 | 8 => 10_000,
        16 => 14_000,
        32 => 25_000,
        64 => 50_000,
        128 => 100_000,
        _ => 0,
    };
    lanes * lane_mbps
}

/// Bytes of an `enum ibv_mtu` value.
pub fn mtu_bytes(mtu: u8) -> usize {
    match mtu {
        1..=5 => 128 << mtu,
        _ => 0,
    }
}

fn list_device_ports(ctx: &ContextInner) -> Result<Vec<PortInfo>, VerbsError> {
    let dev = ctx.query_device()?;
    (1..=dev.phys_port_cnt)
        .map(|p| {
            let a = ctx.query_port(p)?;
            Ok(PortInfo {
                device: ctx.name.clone(),
                port: p,
                link_layer: LinkLayer::from_raw(a.link_layer),
                active: a.state == sys::IBV_PORT_ACTIVE,
                mtu: u8::try_from(a.active_mtu).unwrap_or(0),
                lid: a.lid,
                gid_tbl_len: u32::try_from(a.gid_tbl_len).unwrap_or(0),
                max_msg_sz: a.max_msg_sz,
                speed_mbps: speed_mbps(a.active_width, a.active_speed),
            })
        })
        .collect()
}

/// Every port of every RDMA device (loads libibverbs if needed).
pub fn list_ports() -> Result<Vec<PortInfo>, VerbsError> {
    list_ports_with(crate::load_lib()?)
}

pub(crate) fn list_ports_with(lib: &'static Lib) -> Result<Vec<PortInfo>, VerbsError> {
    let names = verbs::device_names(lib).map_err(|e| match e {
        VerbsError::Verb { call, source, .. } => VerbsError::NoDevice(format!(
            "{call}: {source}; no RDMA device, or a kernel without RDMA support"
        )),
        other => other,
    })?;
    let mut out = Vec::new();
    for name in names {
        match verbs::open_device(lib, &name).and_then(|ctx| list_device_ports(&ctx)) {
            Ok(ports) => out.extend(ports),
            Err(e) => tracing::warn!("NET/IB: skipping device {name}: {e}"),
        }
    }
    Ok(out)
}

/// The ports `filter` selects that can carry traffic, in discovery order.
pub fn usable_ports<'a>(ports: &'a [PortInfo], filter: &HcaFilter) -> Vec<&'a PortInfo> {
    ports
        .iter()
        .filter(|p| p.active && p.link_layer.is_some() && filter.matches(&p.device, p.port))
        .collect()
}

/// The RoCE GID `Port::open` would choose for `info` under `opts`, read
/// from sysfs without opening the device; `None` if that entry is not
/// readable.
pub(crate) fn chosen_gid(info: &PortInfo, opts: &VerbsOptions) -> Option<[u8; 16]> {
    let table = gid::read_gid_table(&opts.sysfs_root, &info.device, info.port, info.gid_tbl_len);
    let index = match opts.gid_index {
        Some(i) => i,
        None => gid::select_gid(
            &table,
            &GidWanted {
                family: opts.addr_family,
                range: opts.addr_range,
                roce_version: opts.roce_version,
            },
        )
        .index(),
    };
    table.iter().find(|e| e.index == index).map(|e| e.gid)
}

/// A port a `VerbsNet` uses as a rail, opened, with its protection domain and the
/// addressing it advertises.
pub(crate) struct Port {
    pub(crate) pd: Arc<PdInner>,
    pub(crate) info: PortInfo,
    pub(crate) link_layer: LinkLayer,
    pub(crate) gid_index: u32,
    pub(crate) gid: [u8; 16],
    pub(crate) max_qp_wr: u32,
    pub(crate) dmabuf: bool,
    /// `ibv_reg_mr` takes device addresses (peer-memory module loaded).
    pub(crate) peermem: bool,
    pub(crate) oob_ip: IpAddr,
    pub(crate) opts: VerbsOptions,
}

impl std::fmt::Debug for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.info.device, self.info.port)
    }
}

impl Port {
    pub(crate) fn ctx(&self) -> &Arc<ContextInner> {
        &self.pd.ctx
    }

    pub(crate) fn name(&self) -> String {
        format!("{}:{}", self.info.device, self.info.port)
    }

    /// Opens `info`'s device, allocates the PD, and picks the GID.
    pub(crate) fn open(
        lib: &'static Lib,
        info: &PortInfo,
        opts: &VerbsOptions,
    ) -> Result<Port, VerbsError> {
        let ctx = verbs::open_device(lib, &info.device)?;
        let dev = ctx.query_device()?;
        let pd = PdInner::new(&ctx)?;
        let link_layer = info.link_layer.ok_or_else(|| {
            VerbsError::NoDevice(format!(
                "{}:{} has an unknown link layer",
                info.device, info.port
            ))
        })?;
        let (gid_index, why) = match (link_layer, opts.gid_index) {
            (LinkLayer::InfiniBand, _) => (0, "InfiniBand".to_owned()),
            (LinkLayer::Ethernet, Some(i)) => (i, "NCCL_IB_GID_INDEX".to_owned()),
            (LinkLayer::Ethernet, None) => {
                let table = gid::read_gid_table(
                    &opts.sysfs_root,
                    &info.device,
                    info.port,
                    info.gid_tbl_len,
                );
                let want = GidWanted {
                    family: opts.addr_family,
                    range: opts.addr_range,
                    roce_version: opts.roce_version,
                };
                let choice = gid::select_gid(&table, &want);
                let why = match choice {
                    GidChoice::Exact(_) => {
                        format!("first {:?} RoCE v{} GID", want.family, want.roce_version)
                    }
                    GidChoice::OtherVersion(_) => format!(
                        "no {:?} RoCE v{} GID; first {:?} GID of another version",
                        want.family, want.roce_version, want.family
                    ),
                    GidChoice::Fallback => {
                        tracing::warn!(
                            "NET/IB: {}:{}: no configured {:?} GID{} in the GID table; using index 0",
                            info.device,
                            info.port,
                            want.family,
                            want.range.map(|r| format!(" in {}/{}", r.addr, r.prefix)).unwrap_or_default()
                        );
                        "fallback".to_owned()
                    }
                };
                (choice.index(), why)
            }
        };
        let gid = ctx.query_gid(info.port, gid_index)?;
        let oob_ip = match opts.oob_ip {
            Some(ip) => ip,
            None if link_layer == LinkLayer::Ethernet && gid::is_valid_gid(&gid) => {
                gid::gid_ip(&gid)
            }
            None => {
                return Err(VerbsError::NoDevice(format!(
                    "{}:{}: no IP address for the handshake socket (set VerbsOptions::oob_ip)",
                    info.device, info.port
                )))
            }
        };
        let dmabuf = verbs::probe_dmabuf(&pd);
        let peermem = crate::gdr::peermem_loaded();
        tracing::info!(
            "NET/IB: using {}:{} [{}] MTU {} speed {} Mb/s, GID index {} ({}) = {}, handshake on {}, DMA-BUF {}, peer memory {}",
            info.device,
            info.port,
            link_layer.nccl_name(),
            mtu_bytes(info.mtu),
            info.speed_mbps,
            gid_index,
            why,
            gid::format_gid(&gid),
            oob_ip,
            if dmabuf { "supported" } else { "not supported" },
            if peermem { "loaded" } else { "not loaded" },
        );
        Ok(Port {
            pd,
            info: info.clone(),
            link_layer,
            gid_index,
            gid,
            max_qp_wr: u32::try_from(dev.max_qp_wr).unwrap_or(0),
            dmabuf,
            peermem,
            oob_ip,
            opts: opts.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speeds_and_mtus() {
        assert_eq!(speed_mbps(2, 32), 100_000, "4x EDR");
        assert_eq!(speed_mbps(2, 64), 200_000, "4x HDR");
        assert_eq!(speed_mbps(2, 128), 400_000, "4x NDR");
        assert_eq!(speed_mbps(1, 1), 2_500, "1x SDR");
        assert_eq!(speed_mbps(0, 32), 0);
        assert_eq!(mtu_bytes(1), 256);
        assert_eq!(mtu_bytes(3), 1024);
        assert_eq!(mtu_bytes(5), 4096);
        assert_eq!(mtu_bytes(0), 0);
    }

    fn port(dev: &str, p: u8, active: bool, ll: Option<LinkLayer>) -> PortInfo {
        PortInfo {
            device: dev.into(),
            port: p,
            link_layer: ll,
            active,
            mtu: 3,
            lid: 0,
            gid_tbl_len: 16,
            max_msg_sz: 1 << 30,
            speed_mbps: 0,
        }
    }

    #[test]
    fn usable_ports_filters_state_link_layer_and_hca() {
        let eth = Some(LinkLayer::Ethernet);
        let ports = vec![
            port("mlx5_0", 1, true, Some(LinkLayer::InfiniBand)),
            port("mlx5_0", 2, false, Some(LinkLayer::InfiniBand)),
            port("mlx5_1", 1, true, eth),
            port("rxe0", 1, true, eth),
            port("odd0", 1, true, None),
        ];
        let names = |f: &str| -> Vec<String> {
            usable_ports(&ports, &HcaFilter::parse(f).unwrap())
                .iter()
                .map(|p| format!("{}:{}", p.device, p.port))
                .collect()
        };
        assert_eq!(names(""), ["mlx5_0:1", "mlx5_1:1", "rxe0:1"]);
        assert_eq!(names("=rxe0"), ["rxe0:1"]);
        assert_eq!(names("^mlx5"), ["rxe0:1"]);
        assert_eq!(names("mlx5_0:2"), Vec::<String>::new(), "inactive port");
        assert_eq!(LinkLayer::from_raw(0), Some(LinkLayer::InfiniBand));
        assert_eq!(
            LinkLayer::from_raw(2).map(LinkLayer::nccl_name),
            Some("RoCE")
        );
    }
}
