//! Registering device buffers with the network transport (GPUDirect
//! RDMA), or falling back to staging.
//!
//! [`gdr::choose`] answers what the GPU side allows (level, DMA-BUF,
//! peer memory); this module adds what the *transport* can take, from its
//! [`Properties::ptr_support`] (NCCL's `NCCL_PTR_DMABUF` /
//! `NCCL_PTR_CUDA`): [`plan`] is the pure decision, [`decide`] probes and
//! logs it at INFO, and [`register`] performs it on a send or receive comm
//! (`reg_mr_dmabuf` with the descriptor from [`gdr::dmabuf_for`], or
//! `reg_mr` on the device address under `nvidia-peermem`), falling back to
//! staging, with an INFO line saying why, when a registration fails.
//!
//! Order of the checks (as NCCL's): the transport must accept device
//! memory at all; `NCCL_NET_GDR_LEVEL` (and the NIC distance when known)
//! must allow GPUDirect; the device must support GPUDirect RDMA; then
//! DMA-BUF is preferred (unless `NCCL_DMABUF_ENABLE=0`, or the driver or
//! transport lacks it), then peer memory.

use super::gdr::{self, GdrConfig, GdrLevel, GdrSupport};
use super::{pointer, CudaError};
use nccl_net::{MemHandle, NetError, NetResult, Properties, RecvComm, SendComm};
use std::ffi::c_void;

/// How a buffer travels through the network transport.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NetPath {
    /// Host memory: registered as it is.
    Host,
    /// Device memory registered through a DMA-BUF (`reg_mr_dmabuf`).
    DmaBuf,
    /// Device memory registered by address (`nvidia-peermem`, `reg_mr`).
    PeerMem,
    /// Device memory copied through pinned host buffers.
    Staging {
        /// Why GPUDirect is not used.
        reason: String,
    },
}

impl NetPath {
    /// `host`, `dmabuf`, `peermem` or `staging`.
    pub fn name(&self) -> &'static str {
        match self {
            NetPath::Host => "host",
            NetPath::DmaBuf => "dmabuf",
            NetPath::PeerMem => "peermem",
            NetPath::Staging { .. } => "staging",
        }
    }
}

/// The path of device memory of a GPU with support `gpu` (or the reason
/// probing it failed) through a transport with properties `net`, under
/// `cfg`, with the NIC at `distance` from the GPU if known. Pure; never
/// [`NetPath::Host`].
pub fn plan(
    net: &Properties,
    cfg: &GdrConfig,
    gpu: &Result<GdrSupport, CudaError>,
    distance: Option<GdrLevel>,
) -> NetPath {
    let staging = |reason: String| NetPath::Staging { reason };
    let ptr = net.ptr_support;
    if !ptr.cuda && !ptr.dmabuf {
        return staging(format!(
            "transport {} cannot access device memory (no NCCL_PTR_CUDA or NCCL_PTR_DMABUF support)",
            net.name
        ));
    }
    if cfg.level == GdrLevel::Loc {
        return staging("NCCL_NET_GDR_LEVEL=LOC".into());
    }
    if let Some(d) = distance.filter(|d| *d > cfg.level) {
        return staging(format!(
            "NIC at distance {d}, beyond NCCL_NET_GDR_LEVEL={}",
            cfg.level
        ));
    }
    let sup = match gpu {
        Ok(s) => s,
        Err(e) => return staging(format!("probing the device failed: {e}")),
    };
    if !sup.gpudirect_rdma {
        return staging("the device does not support GPUDirect RDMA".into());
    }
    let mut why = Vec::new();
    match (cfg.dmabuf, sup.dmabuf, ptr.dmabuf) {
        (true, true, true) => return NetPath::DmaBuf,
        (false, _, _) => why.push("NCCL_DMABUF_ENABLE=0".to_string()),
        (true, false, _) => why.push("no DMA-BUF support in the driver or device".into()),
        (true, true, false) => why.push(format!("transport {} has no DMA-BUF support", net.name)),
    }
    match (sup.peermem, ptr.cuda) {
        (true, true) => return NetPath::PeerMem,
        (false, _) => why.push("nvidia-peermem is not loaded".into()),
        (true, false) => why.push(format!(
            "transport {} does not register device addresses",
            net.name
        )),
    }
    staging(why.join("; "))
}

fn log(path: &NetPath, net: &Properties, len: usize, ptr: *const c_void, ordinal: i32) {
    match path {
        NetPath::Staging { reason } => tracing::info!(
            "NET/GDR: {len} bytes of device {ordinal} at {ptr:?} through {}: staging through pinned host memory ({reason})",
            net.name
        ),
        p => tracing::info!(
            "NET/GDR: {len} bytes of device {ordinal} at {ptr:?} through {}: {} registration",
            net.name,
            p.name()
        ),
    }
}

/// Decides (probing the GPU) and logs at INFO the path of `len` bytes at
/// `ptr` through the transport with properties `net`. Host memory (and
/// every pointer when CUDA is unavailable) is [`NetPath::Host`], unlogged.
pub fn decide(
    ptr: *const c_void,
    len: usize,
    net: &Properties,
    cfg: &GdrConfig,
    distance: Option<GdrLevel>,
) -> NetPath {
    let Some(ordinal) = pointer::info(ptr.cast()).ordinal() else {
        return NetPath::Host;
    };
    let path = plan(net, cfg, &gdr::support(ordinal), distance);
    log(&path, net, len, ptr, ordinal);
    path
}

/// One half of a connection to register memory with.
pub enum NetComm<'a> {
    /// The sending half.
    Send(&'a mut dyn SendComm),
    /// The receiving half.
    Recv(&'a mut dyn RecvComm),
}

impl NetComm<'_> {
    fn reg_mr(&mut self, ptr: *const c_void, len: usize) -> NetResult<MemHandle> {
        match self {
            NetComm::Send(c) => c.reg_mr(ptr.cast(), len),
            NetComm::Recv(c) => c.reg_mr(ptr.cast_mut().cast(), len),
        }
    }

    fn reg_mr_dmabuf(
        &mut self,
        ptr: *const c_void,
        len: usize,
        offset: u64,
        fd: i32,
    ) -> NetResult<MemHandle> {
        match self {
            NetComm::Send(c) => c.reg_mr_dmabuf(ptr.cast(), len, offset, fd),
            NetComm::Recv(c) => c.reg_mr_dmabuf(ptr.cast_mut().cast(), len, offset, fd),
        }
    }
}

/// The outcome of [`register`].
#[derive(Debug, PartialEq, Eq)]
pub enum Registered {
    /// Registered with the transport (release with the comm's `dereg_mr`);
    /// `path` is [`NetPath::Host`], [`NetPath::DmaBuf`] or
    /// [`NetPath::PeerMem`].
    Net {
        /// The transport's handle.
        handle: MemHandle,
        /// How.
        path: NetPath,
    },
    /// Device memory that must be staged; nothing was registered.
    Staging {
        /// Why.
        reason: String,
    },
}

/// Registers `len` bytes at `ptr` with `comm` (of a transport with
/// properties `net`) along the path [`decide`] picks. A failed GPUDirect
/// registration is not an error: it falls back (DMA-BUF to peer memory
/// when that is possible, then staging) with an INFO line. Host memory is
/// registered with `reg_mr`, whose errors are returned.
///
/// # Safety
/// `ptr..ptr+len` must be memory (host or device) that stays allocated
/// until the registration is released, as for `reg_mr`.
pub unsafe fn register(
    mut comm: NetComm<'_>,
    net: &Properties,
    ptr: *const c_void,
    len: usize,
    cfg: &GdrConfig,
    distance: Option<GdrLevel>,
) -> NetResult<Registered> {
    let path = decide(ptr, len, net, cfg, distance);
    let ordinal = pointer::info(ptr.cast()).ordinal().unwrap_or(-1);
    let mut failures = Vec::new();
    if path == NetPath::DmaBuf {
        // SAFETY: device memory that stays allocated (contract).
        let r = unsafe { gdr::dmabuf_for(ptr, len) }
            .map_err(|e| NetError::Other(format!("DMA-BUF export failed: {e}")))
            .and_then(|d| comm.reg_mr_dmabuf(ptr, len, d.offset(), d.fd()));
        match r {
            Ok(handle) => return Ok(Registered::Net { handle, path }),
            Err(e) => failures.push(format!("DMA-BUF registration failed: {e}")),
        }
    }
    let peermem = match &path {
        NetPath::PeerMem => true,
        // DMA-BUF failed: peer memory if it is there too.
        NetPath::DmaBuf => net.ptr_support.cuda && gdr::support(ordinal).is_ok_and(|s| s.peermem),
        _ => false,
    };
    if peermem {
        match comm.reg_mr(ptr, len) {
            Ok(handle) => {
                if !failures.is_empty() {
                    tracing::info!(
                        "NET/GDR: {}; using peermem for {len} bytes at {ptr:?}",
                        failures.join("; ")
                    );
                }
                return Ok(Registered::Net {
                    handle,
                    path: NetPath::PeerMem,
                });
            }
            Err(e) => failures.push(format!("peer-memory registration failed: {e}")),
        }
    }
    match path {
        NetPath::Host => Ok(Registered::Net {
            handle: comm.reg_mr(ptr, len)?,
            path,
        }),
        NetPath::Staging { reason } => Ok(Registered::Staging { reason }),
        NetPath::DmaBuf | NetPath::PeerMem => {
            let reason = failures.join("; ");
            tracing::info!(
                "NET/GDR: {len} bytes of device {ordinal} at {ptr:?} through {}: staging through pinned host memory ({reason})",
                net.name
            );
            Ok(Registered::Staging { reason })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nccl_net::{PtrSupport, Request};

    fn props(cuda: bool, dmabuf: bool) -> Properties {
        Properties {
            name: "IB".into(),
            speed_mbps: 0,
            latency_us: 0.0,
            ptr_support: PtrSupport {
                host: true,
                cuda,
                dmabuf,
            },
            needs_registration: false,
            max_message_bytes: 1 << 30,
            max_requests: 8,
        }
    }

    fn gpu(gpudirect_rdma: bool, dmabuf: bool, peermem: bool) -> Result<GdrSupport, CudaError> {
        Ok(GdrSupport {
            gpudirect_rdma,
            dmabuf,
            peermem,
        })
    }

    fn reason(p: NetPath) -> String {
        match p {
            NetPath::Staging { reason } => reason,
            other => panic!("expected staging, got {other:?}"),
        }
    }

    #[test]
    fn plan_prefers_dmabuf_then_peermem() {
        let cfg = GdrConfig::default();
        let all = gpu(true, true, true);
        assert_eq!(plan(&props(true, true), &cfg, &all, None), NetPath::DmaBuf);
        assert_eq!(plan(&props(false, true), &cfg, &all, None), NetPath::DmaBuf);
        assert_eq!(
            plan(&props(true, false), &cfg, &all, None),
            NetPath::PeerMem
        );
        assert_eq!(
            plan(&props(true, true), &cfg, &gpu(true, false, true), None),
            NetPath::PeerMem
        );
        assert_eq!(
            plan(&props(true, true), &cfg, &all, Some(GdrLevel::Pxb)),
            NetPath::DmaBuf
        );
    }

    #[test]
    fn plan_stages_with_the_reason() {
        let cfg = GdrConfig::default();
        let all = gpu(true, true, true);
        let r = reason(plan(&props(false, false), &cfg, &all, None));
        assert!(
            r.contains("transport IB cannot access device memory"),
            "{r}"
        );
        let loc = GdrConfig {
            level: GdrLevel::Loc,
            ..cfg.clone()
        };
        assert_eq!(
            reason(plan(&props(true, true), &loc, &all, None)),
            "NCCL_NET_GDR_LEVEL=LOC"
        );
        let r = reason(plan(&props(true, true), &cfg, &all, Some(GdrLevel::Sys)));
        assert_eq!(r, "NIC at distance SYS, beyond NCCL_NET_GDR_LEVEL=PXB");
        let sys = GdrConfig {
            level: GdrLevel::Sys,
            ..cfg.clone()
        };
        assert_eq!(
            plan(&props(true, true), &sys, &all, Some(GdrLevel::Sys)),
            NetPath::DmaBuf
        );
        let nodmabuf = GdrConfig {
            dmabuf: false,
            ..cfg.clone()
        };
        assert_eq!(
            reason(plan(&props(false, true), &nodmabuf, &all, None)),
            "NCCL_DMABUF_ENABLE=0; transport IB does not register device addresses"
        );
        assert_eq!(
            reason(plan(
                &props(true, true),
                &nodmabuf,
                &gpu(true, true, false),
                None
            )),
            "NCCL_DMABUF_ENABLE=0; nvidia-peermem is not loaded"
        );
        assert_eq!(
            reason(plan(&props(false, true), &cfg, &gpu(true, false, true), None)),
            "no DMA-BUF support in the driver or device; transport IB does not register device addresses"
        );
        assert_eq!(
            reason(plan(
                &props(true, false),
                &cfg,
                &gpu(true, true, false),
                None
            )),
            "transport IB has no DMA-BUF support; nvidia-peermem is not loaded"
        );
        assert_eq!(
            reason(plan(
                &props(true, true),
                &cfg,
                &gpu(false, true, true),
                None
            )),
            "the device does not support GPUDirect RDMA"
        );
        let r = reason(plan(
            &props(true, true),
            &cfg,
            &Err(CudaError::NoDevice),
            None,
        ));
        assert!(r.starts_with("probing the device failed: "), "{r}");
    }

    /// A send comm recording its registrations; DMA-BUF through the
    /// trait's default (unsupported).
    #[derive(Default)]
    struct Recorder {
        regs: Vec<(usize, usize)>,
    }

    impl SendComm for Recorder {
        fn reg_mr(&mut self, ptr: *const u8, len: usize) -> NetResult<MemHandle> {
            self.regs.push((ptr as usize, len));
            Ok(MemHandle(self.regs.len() as u64))
        }
        fn dereg_mr(&mut self, _: MemHandle) -> NetResult<()> {
            Ok(())
        }
        unsafe fn isend(
            &mut self,
            _: *const u8,
            _: usize,
            _: u32,
            _: Option<MemHandle>,
        ) -> NetResult<Option<Request>> {
            Err(NetError::Other("not used".into()))
        }
        fn test(&mut self, _: Request) -> NetResult<bool> {
            Err(NetError::Other("not used".into()))
        }
    }

    #[test]
    fn host_memory_is_registered_as_it_is() {
        let buf = [0u8; 100];
        let mut c = Recorder::default();
        // SAFETY: a live host buffer.
        let r = unsafe {
            register(
                NetComm::Send(&mut c),
                &props(true, true),
                buf.as_ptr().cast(),
                100,
                &GdrConfig::default(),
                None,
            )
        }
        .unwrap();
        assert_eq!(
            r,
            Registered::Net {
                handle: MemHandle(1),
                path: NetPath::Host
            }
        );
        assert_eq!(c.regs, [(buf.as_ptr() as usize, 100)]);
        let e = c.reg_mr_dmabuf(buf.as_ptr(), 100, 0, 3).unwrap_err();
        assert!(matches!(e, NetError::Unsupported(_)), "{e}");
    }
}
