//! `nccl_rs::cuda::netreg` against the fake CUDA driver
//! (`ffi/tests/cuda/fake_libcuda.c`, built here with `cc`, with DMA-BUF
//! export on): device memory reaches the transport's `reg_mr_dmabuf` with
//! a live descriptor and the buffer's offset in it, and every refusal
//! (transport, settings, a failing registration) ends in staging with
//! its reason.
#![cfg(feature = "cuda")]

use nccl_net::{MemHandle, NetError, NetResult, Properties, PtrSupport, Request, SendComm};
use nccl_rs::cuda::gdr::GdrConfig;
use nccl_rs::cuda::netreg::{register, NetComm, NetPath, Registered};
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

#[path = "../../ffi/tests/cuda/fake_driver.rs"]
mod fake_build;

fn fake_driver() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let lib = fake_build::build_in_tmp("fakecuda-netreg");
        std::env::set_var("NCCL_RS_CUDA_DRIVER", &lib);
        std::env::set_var("FAKE_CUDA_DMABUF", "1");
        lib
    })
}

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

/// Records DMA-BUF registrations `(ptr, len, offset, fd open?)`; refuses
/// them when `reject` is set.
#[derive(Default)]
struct Comm {
    reject: bool,
    dmabuf: Vec<(usize, usize, u64, bool)>,
    by_address: usize,
}

impl SendComm for Comm {
    fn reg_mr(&mut self, _: *const u8, _: usize) -> NetResult<MemHandle> {
        self.by_address += 1;
        Ok(MemHandle(1))
    }
    fn reg_mr_dmabuf(
        &mut self,
        data: *const u8,
        len: usize,
        offset: u64,
        fd: i32,
    ) -> NetResult<MemHandle> {
        // SAFETY: F_GETFD only inspects the descriptor table.
        let open = unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0;
        self.dmabuf.push((data as usize, len, offset, open));
        if self.reject {
            return Err(NetError::Other("device rejected the DMA-BUF".into()));
        }
        Ok(MemHandle(2))
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

fn staged(r: Registered) -> String {
    match r {
        Registered::Staging { reason } => reason,
        other => panic!("expected staging, got {other:?}"),
    }
}

#[test]
fn device_memory_registration_paths() {
    fake_driver();
    let dev = nccl_rs::cuda::device_alloc(1 << 20).unwrap();
    let p: *const c_void = dev.cast::<u8>().wrapping_add(4100).cast();
    let cfg = GdrConfig::default();
    let reg = |c: &mut Comm, net: &Properties, cfg: &GdrConfig| {
        // SAFETY: inside a live device allocation.
        unsafe { register(NetComm::Send(c), net, p, 1000, cfg, None) }.unwrap()
    };

    let mut c = Comm::default();
    assert_eq!(
        reg(&mut c, &props(false, true), &cfg),
        Registered::Net {
            handle: MemHandle(2),
            path: NetPath::DmaBuf
        }
    );
    assert_eq!(c.dmabuf, [(p as usize, 1000, 4, true)]);

    let mut c = Comm {
        reject: true,
        ..Comm::default()
    };
    let why = staged(reg(&mut c, &props(false, true), &cfg));
    assert!(
        why.contains("DMA-BUF registration failed: device rejected the DMA-BUF"),
        "{why}"
    );
    assert_eq!((c.dmabuf.len(), c.by_address), (1, 0));

    let mut c = Comm::default();
    let why = staged(reg(&mut c, &props(false, false), &cfg));
    assert!(why.contains("cannot access device memory"), "{why}");
    let off = GdrConfig {
        dmabuf: false,
        ..cfg.clone()
    };
    let why = staged(reg(&mut c, &props(false, true), &off));
    assert!(why.starts_with("NCCL_DMABUF_ENABLE=0; "), "{why}");
    let loc = GdrConfig {
        level: nccl_rs::cuda::gdr::GdrLevel::Loc,
        ..cfg
    };
    assert_eq!(
        staged(reg(&mut c, &props(true, true), &loc)),
        "NCCL_NET_GDR_LEVEL=LOC"
    );
    assert!(c.dmabuf.is_empty() && c.by_address == 0);
    // SAFETY: from device_alloc, unused now.
    unsafe { nccl_rs::cuda::device_free(dev) }.unwrap();
}
