//! What the driver reports: the device, pointer kinds, DMA-BUF export
//! and the GPUDirect data path chosen for a buffer.

use crate::{fake_driver, real};
use nccl_rs::cuda::gdr::{self, DataPath, GdrConfig, GdrLevel};
use nccl_rs::cuda::{classify, MemKind, Stager};

#[test]
fn probe_finds_the_fake_device() {
    fake_driver();
    let info = nccl_rs::cuda::probe().unwrap();
    eprintln!("{info}");
    if real() {
        assert!(!info.devices.is_empty());
        return;
    }
    assert_eq!(info.driver_version, 13000);
    assert_eq!(info.devices.len(), 1);
    assert_eq!(info.devices[0].name, "Fake CUDA Device 0");
    assert!(
        info.to_string().contains("CUDA driver 13.0, 1 device(s)"),
        "{info}"
    );
    assert_eq!(nccl_rs::cuda::device_count().unwrap(), 1);
}

#[test]
fn host_and_device_pointers_are_told_apart() {
    fake_driver();
    let host = [1u8; 100];
    assert_eq!(classify(host.as_ptr().cast()), MemKind::Host);
    assert_eq!(classify(std::ptr::null()), MemKind::Host);
    let dev = nccl_rs::cuda::device_alloc(1000).unwrap();
    assert_eq!(
        classify(dev),
        MemKind::Device {
            ordinal: 0,
            managed: false
        }
    );
    assert_eq!(
        classify(dev.cast::<u8>().wrapping_add(999).cast()),
        classify(dev)
    );
    assert!(Stager::needs_staging(&[host.as_ptr(), dev.cast()]));
    assert!(!Stager::needs_staging(&[host.as_ptr()]));
    // SAFETY: from device_alloc, unused.
    unsafe { nccl_rs::cuda::device_free(dev) }.unwrap();
}

#[test]
fn dmabuf_export_and_path_choice() {
    fake_driver();
    let sup = gdr::support(0).unwrap();
    eprintln!("GPUDirect support of device 0: {sup:?}");
    let dev = nccl_rs::cuda::device_alloc(3 << 20).unwrap();
    if real() {
        // Report what this machine can do; only the fake's answers are known.
        // SAFETY: inside a live device allocation.
        let d = unsafe { gdr::dmabuf_for(dev, 1 << 20) };
        eprintln!("DMA-BUF export of 1 MiB: {d:?}");
        if sup.dmabuf && d.is_err() {
            eprintln!("WARNING: the device reports DMA-BUF support but the export failed");
        }
        // SAFETY: from device_alloc, unused.
        unsafe { nccl_rs::cuda::device_free(dev) }.unwrap();
        return;
    }
    assert!(sup.dmabuf && sup.gpudirect_rdma, "{sup:?}");
    let p = dev.cast::<u8>().wrapping_add(4100).cast();
    // SAFETY: inside a live device allocation.
    let d = unsafe { gdr::dmabuf_for(p, 1000) }.unwrap();
    assert!(d.fd() >= 0);
    assert_eq!((d.offset(), d.len(), d.iova()), (4, 1000, p as u64));
    let cfg = GdrConfig::default();
    // SAFETY: as above.
    unsafe {
        assert!(matches!(
            gdr::choose(p, 1000, &cfg, true, None),
            DataPath::DmaBuf(_)
        ));
        assert!(matches!(
            gdr::choose(p, 1000, &cfg, false, None),
            DataPath::Staging { .. }
        ));
        let loc = GdrConfig {
            level: GdrLevel::Loc,
            ..cfg.clone()
        };
        assert!(matches!(
            gdr::choose(p, 1000, &loc, true, None),
            DataPath::Staging { .. }
        ));
        assert!(matches!(
            gdr::choose(p, 1000, &cfg, true, Some(GdrLevel::Sys)),
            DataPath::Staging { .. }
        ));
        let nodmabuf = GdrConfig {
            dmabuf: false,
            ..cfg
        };
        match gdr::choose(p, 1000, &nodmabuf, true, None) {
            DataPath::Staging { reason } => {
                assert!(reason.contains("NCCL_DMABUF_ENABLE=0"), "{reason}")
            }
            DataPath::PeerMem => {} // a machine with nvidia-peermem loaded
            other => panic!("{other:?}"),
        }
        nccl_rs::cuda::device_free(dev).unwrap();
    }
}
