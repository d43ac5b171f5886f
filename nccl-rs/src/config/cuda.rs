//! The device-buffer settings of [`Config`](super::Config): parsed here
//! whether or not the crate is built with `cuda` (the `cuda` module reads
//! them), so that every build reads the same variables.

use super::{bad, flag, Text};
use crate::error::Result;

/// Where staged reductions on device buffers run (`NCCL_RS_CUDA_REDUCE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceReduce {
    /// The GPU if its kernels load, else the host.
    Auto,
    /// The GPU; an error if its kernels cannot be loaded.
    Gpu,
    /// The host.
    Host,
}

impl DeviceReduce {
    /// Parses `gpu` (or `device`), `host` (or `cpu`) or `auto`, any case
    /// (None or blank: `Auto`).
    pub fn parse(v: Option<&str>) -> Result<DeviceReduce> {
        match v.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            None | Some("") | Some("auto") => Ok(DeviceReduce::Auto),
            Some("gpu") | Some("device") => Ok(DeviceReduce::Gpu),
            Some("host") | Some("cpu") => Ok(DeviceReduce::Host),
            Some(other) => Err(bad("NCCL_RS_CUDA_REDUCE", other, "gpu, host or auto")),
        }
    }
}

/// A NIC↔GPU path distance, nearest first (NCCL's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GdrLevel {
    /// Same device only: GPUDirect never used.
    Loc,
    /// Behind the same PCI switch port.
    Pix,
    /// Across PCI switches, not the CPU.
    Pxb,
    /// Through the CPU's host bridge.
    Phb,
    /// Across CPU sockets.
    Sys,
}

impl GdrLevel {
    /// `LOC`, `PIX`, `PXB`, `PHB`, `SYS` (any case), or NCCL's legacy
    /// integers 0 to 4 (larger values are `SYS`).
    pub fn parse(s: &str) -> Option<GdrLevel> {
        let s = s.trim();
        if let Ok(n) = s.parse::<u32>() {
            return Some(match n {
                0 => GdrLevel::Loc,
                1 => GdrLevel::Pix,
                2 => GdrLevel::Pxb,
                3 => GdrLevel::Phb,
                _ => GdrLevel::Sys,
            });
        }
        Some(match s.to_ascii_uppercase().as_str() {
            "LOC" => GdrLevel::Loc,
            "PIX" => GdrLevel::Pix,
            "PXB" => GdrLevel::Pxb,
            "PHB" => GdrLevel::Phb,
            "SYS" => GdrLevel::Sys,
            _ => return None,
        })
    }
}

impl std::fmt::Display for GdrLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            GdrLevel::Loc => "LOC",
            GdrLevel::Pix => "PIX",
            GdrLevel::Pxb => "PXB",
            GdrLevel::Phb => "PHB",
            GdrLevel::Sys => "SYS",
        })
    }
}

/// Settings of device (GPU) buffers; see `docs/configuration.md`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaConfig {
    /// `NCCL_RS_CUDA_DISABLE`: never load CUDA (every pointer is host
    /// memory). Set by any value but `0`, `false`, `no`, `off` (any case).
    pub disable: bool,
    /// `NCCL_RS_CUDA_DRIVER`: the driver library to load instead of
    /// `libcuda.so.1` / `libcuda.so`.
    pub driver: Option<String>,
    /// `NCCL_RS_CUDA_STAGING_CHUNK`: bytes staged per pipeline step
    /// (4 KiB to 1 GiB; suffixes K, M, G).
    pub staging_chunk_bytes: usize,
    /// `NCCL_RS_CUDA_PIPELINE`: split buffers larger than one chunk.
    pub pipeline: bool,
    /// `NCCL_RS_CUDA_ASYNC`: calls on device buffers may return before the
    /// stream's earlier work is done (where stream memory operations
    /// work). Only `0` turns it off.
    pub async_calls: bool,
    /// `NCCL_RS_CUDA_REDUCE`: where staged reductions run.
    pub reduce: DeviceReduce,
    /// `NCCL_RS_NVRTC_LIBRARY`: the NVRTC library to load instead of
    /// `libnvrtc.so.13`, `.so.12`, `libnvrtc.so`.
    pub nvrtc_library: Option<String>,
    /// `NCCL_NET_GDR_LEVEL`: the farthest NIC↔GPU path that uses GPUDirect.
    pub gdr_level: GdrLevel,
    /// `NCCL_DMABUF_ENABLE`: DMA-BUF registration allowed.
    pub dmabuf_enable: bool,
}

impl Default for CudaConfig {
    fn default() -> Self {
        CudaConfig {
            disable: false,
            driver: None,
            staging_chunk_bytes: 2 << 20,
            pipeline: true,
            async_calls: true,
            reduce: DeviceReduce::Auto,
            nvrtc_library: None,
            gdr_level: GdrLevel::Pxb,
            dmabuf_enable: true,
        }
    }
}

impl CudaConfig {
    /// Reads the device settings through `text` (trimmed, blank as unset).
    pub(super) fn from_text(text: &Text<'_>) -> Result<CudaConfig> {
        let d = CudaConfig::default();
        let staging_chunk_bytes = match text("NCCL_RS_CUDA_STAGING_CHUNK") {
            None => d.staging_chunk_bytes,
            Some(v) => parse_bytes(&v)
                .filter(|b| (4096..=(1usize << 30)).contains(b))
                .ok_or_else(|| {
                    bad(
                        "NCCL_RS_CUDA_STAGING_CHUNK",
                        &v,
                        "bytes from 4096 to 1G (suffix K, M or G allowed)",
                    )
                })?,
        };
        let gdr_level = match text("NCCL_NET_GDR_LEVEL") {
            None => d.gdr_level,
            Some(v) => GdrLevel::parse(&v)
                .ok_or_else(|| bad("NCCL_NET_GDR_LEVEL", &v, "LOC, PIX, PXB, PHB, SYS or 0-4"))?,
        };
        Ok(CudaConfig {
            disable: text("NCCL_RS_CUDA_DISABLE").is_some_and(|v| {
                !["0", "false", "no", "off"].contains(&v.to_ascii_lowercase().as_str())
            }),
            driver: text("NCCL_RS_CUDA_DRIVER"),
            staging_chunk_bytes,
            pipeline: text("NCCL_RS_CUDA_PIPELINE").is_none()
                || flag(&text, "NCCL_RS_CUDA_PIPELINE")?,
            async_calls: text("NCCL_RS_CUDA_ASYNC").is_none_or(|v| v != "0"),
            reduce: DeviceReduce::parse(text("NCCL_RS_CUDA_REDUCE").as_deref())?,
            nvrtc_library: text("NCCL_RS_NVRTC_LIBRARY"),
            gdr_level,
            dmabuf_enable: text("NCCL_DMABUF_ENABLE").is_none()
                || flag(&text, "NCCL_DMABUF_ENABLE")?,
        })
    }
}

/// `123`, `64K`, `2M`, `1G` (binary units).
fn parse_bytes(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, shift) = match s.chars().last()?.to_ascii_uppercase() {
        'K' => (&s[..s.len() - 1], 10),
        'M' => (&s[..s.len() - 1], 20),
        'G' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    num.trim().parse::<usize>().ok()?.checked_mul(1 << shift)
}
