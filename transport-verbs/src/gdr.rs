//! GPUDirect RDMA: registering device memory with the adapter.
//!
//! Two ways exist, both probed, never assumed:
//! * **DMA-BUF** (`ibv_reg_dmabuf_mr`, rdma-core 34+, Linux 5.12+): the
//!   CUDA driver exports the device range as a DMA-BUF file descriptor and
//!   the adapter maps it. The port probes support when it opens
//!   ([`VerbsNet::dmabuf_supported`](crate::VerbsNet::dmabuf_supported));
//!   the comms' `reg_mr_dmabuf` registers through it.
//! * **peer memory** (the `nvidia-peermem` module, or the older
//!   `nv_peer_mem`): plain `ibv_reg_mr` accepts device addresses. The
//!   comms' ordinary `reg_mr` then works on device pointers.
//!
//! The transport's properties report `ptr_support.dmabuf` and
//! `ptr_support.cuda` accordingly (NCCL's `NCCL_PTR_DMABUF` and
//! `NCCL_PTR_CUDA`). Device memory must always be passed to `isend` /
//! `irecv` with the handle of such a registration: without one the
//! transport copies small messages through host bounce buffers, which the
//! CPU cannot do for device memory.
//!
//! DMA-BUF registrations live in the comm's [registration
//! cache](crate::regcache) next to host ones, keyed by the address range
//! peers use: the device virtual address (the registration's `iova`).
//! CUDA's unified addressing keeps device and host ranges apart, so an
//! entry covering a device range is a registration of that same memory.

use crate::regcache::{page_range, EntryId, RegCache};
use crate::verbs::{MemRegion, Mr, PdInner};
use nccl_net::{NetError, NetResult};
use std::path::Path;
use std::sync::Arc;

/// Paths (under the sysfs root's parent, normally `/`) whose presence
/// means a peer-memory module is loaded.
const PEERMEM_PATHS: [&str; 3] = [
    "sys/module/nvidia_peermem",
    "sys/module/nv_peer_mem",
    "sys/kernel/mm/memory_peers/nv_mem/version",
];

/// Whether `nvidia-peermem` (or `nv_peer_mem`) is loaded on this host.
pub fn peermem_loaded() -> bool {
    peermem_loaded_in(Path::new("/"))
}

/// [`peermem_loaded`] under another root directory (tests).
pub fn peermem_loaded_in(root: &Path) -> bool {
    PEERMEM_PATHS.iter().any(|p| root.join(p).exists())
}

/// The DMA-BUF offset of `start`, given that `data` lies at `offset` in the
/// DMA-BUF and `start <= data`: `None` when `start` would lie before the
/// DMA-BUF's beginning.
pub fn offset_of(start: usize, data: usize, offset: u64) -> Option<u64> {
    let back = u64::try_from(data.checked_sub(start)?).ok()?;
    offset.checked_sub(back)
}

/// Registers `len` bytes of device memory at `data` (device virtual
/// address), which lie at `offset` in DMA-BUF `fd`, as a pinned entry of
/// `cache` (or pins an entry that covers it already). The registration
/// spans `data`'s pages, as host ones do; its `iova` is the page-aligned
/// start, so peers write to device addresses unchanged.
pub(crate) fn pin_dmabuf(
    cache: &mut RegCache<Vec<Mr>>,
    pds: &[Arc<PdInner>],
    data: usize,
    len: usize,
    offset: u64,
    fd: i32,
    access: i32,
) -> NetResult<EntryId> {
    if fd < 0 {
        return Err(NetError::Other(format!(
            "reg_mr_dmabuf: invalid DMA-BUF file descriptor {fd}"
        )));
    }
    let Some(pd) = pds.first() else {
        return Err(NetError::Other("reg_mr_dmabuf: no device".into()));
    };
    if pd.ctx.lib.reg_dmabuf_mr.is_none() {
        return Err(NetError::Unsupported(format!(
            "DMA-BUF registration on {}: libibverbs lacks ibv_reg_dmabuf_mr (rdma-core 34+ needed)",
            pd.ctx.name
        )));
    }
    let (start, _) = page_range(data, len);
    let Some(start_offset) = offset_of(start, data, offset) else {
        return Err(NetError::Other(format!(
            "reg_mr_dmabuf: {data:#x} lies at offset {offset} of the DMA-BUF, less than its \
             distance {} from the page start {start:#x}",
            data - start
        )));
    };
    let id = cache.pin(data, len, |s, l| {
        debug_assert_eq!(s, start);
        // One registration per rail's PD (each device maps the buffer).
        pds.iter()
            .map(|pd| {
                // SAFETY: the caller of reg_mr_dmabuf hands us a DMA-BUF
                // that covers the range (the trait's contract) and keeps the
                // memory allocated until dereg_mr; the cache drops the Mrs
                // no later.
                unsafe {
                    Mr::register_region(
                        pd,
                        MemRegion::DmaBuf {
                            fd,
                            offset: start_offset,
                            len: l,
                            iova: s as u64,
                        },
                        access,
                    )
                }
            })
            .collect::<Result<Vec<Mr>, _>>()
    })?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::regcache::PAGE;
    use crate::stub_lib;
    use crate::verbs::ACCESS_REMOTE_WRITE;
    use crate::VerbsError;

    #[test]
    fn peermem_probe_looks_for_either_module() {
        let dir = std::env::temp_dir().join(format!("verbs-peermem-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sys/module/ib_core")).unwrap();
        assert!(!peermem_loaded_in(&dir));
        std::fs::create_dir_all(dir.join("sys/module/nv_peer_mem")).unwrap();
        assert!(peermem_loaded_in(&dir));
        std::fs::remove_dir_all(dir.join("sys/module/nv_peer_mem")).unwrap();
        std::fs::create_dir_all(dir.join("sys/module/nvidia_peermem")).unwrap();
        assert!(peermem_loaded_in(&dir));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn offsets_move_back_to_the_page_start() {
        assert_eq!(offset_of(0x10000, 0x10000, 0), Some(0));
        assert_eq!(offset_of(0x10000, 0x10100, 0x100), Some(0));
        assert_eq!(offset_of(0x10000, 0x10100, 0x5100), Some(0x5000));
        assert_eq!(offset_of(0x10000, 0x10100, 0xff), None);
        assert_eq!(offset_of(0x10100, 0x10000, 0), None);
    }

    /// The fd, offset, length and iova reach `ibv_reg_dmabuf_mr` as the
    /// cache's page-aligned entry needs them; covered ranges share the
    /// entry; the last `unpin` deregisters.
    #[test]
    fn dmabuf_registration_plumbing() {
        let pd = stub_lib::pd(true);
        let mut cache = RegCache::new();
        let base = 0x7f00_0000_0000usize; // a device VA
        let fd = 42;
        let id = pin_dmabuf(
            &mut cache,
            std::slice::from_ref(&pd),
            base + 0x100,
            10_000,
            0x100,
            fd,
            ACCESS_REMOTE_WRITE,
        )
        .unwrap();
        let (s, e) = page_range(base + 0x100, 10_000);
        assert_eq!(s, base);
        assert_eq!(
            stub_lib::take_dmabuf_calls(),
            [(0, e - s, base as u64, fd, ACCESS_REMOTE_WRITE)]
        );
        assert_eq!(cache.get(id).map(|m| m[0].lkey()), Some(fd as u32));
        // Inside the same pages: the entry is shared, nothing registered.
        let again = pin_dmabuf(
            &mut cache,
            std::slice::from_ref(&pd),
            base + PAGE,
            100,
            0x1000 + PAGE as u64,
            fd,
            0,
        )
        .unwrap();
        assert_eq!(again, id);
        assert!(stub_lib::take_dmabuf_calls().is_empty());
        assert_eq!(stub_lib::live_mrs(), 1);
        assert!(cache.unpin(id).unwrap().is_none());
        drop(cache.unpin(id).unwrap().expect("last pin releases the MR"));
        assert_eq!(stub_lib::live_mrs(), 0);
        // A buffer deep inside a DMA-BUF: the page start's offset is passed.
        let id = pin_dmabuf(
            &mut cache,
            std::slice::from_ref(&pd),
            base + 0x3_0010,
            64,
            0x2_0010,
            7,
            0,
        )
        .unwrap();
        assert_eq!(
            stub_lib::take_dmabuf_calls(),
            [(0x2_0000, PAGE, (base + 0x3_0000) as u64, 7, 0)]
        );
        drop(cache.unpin(id).unwrap());
        assert_eq!(stub_lib::live_mrs(), 0);
    }

    /// No panic and no cache entry when the library lacks the symbol, the
    /// device rejects the buffer, or the arguments are wrong.
    #[test]
    fn dmabuf_registration_errors_are_clean() {
        let mut cache = RegCache::new();
        let e = pin_dmabuf(&mut cache, &[stub_lib::pd(false)], 0x10000, 64, 0, 3, 0).unwrap_err();
        assert!(
            matches!(&e, NetError::Unsupported(m) if m.contains("ibv_reg_dmabuf_mr")),
            "{e}"
        );

        let pd = stub_lib::pd(true);
        let e = pin_dmabuf(
            &mut cache,
            std::slice::from_ref(&pd),
            0x10000,
            64,
            0,
            stub_lib::REJECTED_FD,
            0,
        )
        .unwrap_err();
        match VerbsError::from_net(&e) {
            Some(VerbsError::Verb { call, source, .. }) => {
                assert_eq!(*call, "ibv_reg_dmabuf_mr");
                assert_eq!(source.raw_os_error(), Some(libc::EINVAL));
            }
            other => panic!("unexpected error {e}: {other:?}"),
        }
        let e =
            pin_dmabuf(&mut cache, std::slice::from_ref(&pd), 0x10000, 64, 0, -1, 0).unwrap_err();
        assert!(
            e.to_string().contains("invalid DMA-BUF file descriptor -1"),
            "{e}"
        );
        let e = pin_dmabuf(
            &mut cache,
            std::slice::from_ref(&pd),
            0x10040,
            64,
            0x20,
            3,
            0,
        )
        .unwrap_err();
        assert!(e.to_string().contains("offset 32"), "{e}");
        assert!(cache.is_empty());
        assert!(stub_lib::take_dmabuf_calls().is_empty());
        assert_eq!(stub_lib::live_mrs(), 0);
    }

    /// A real DMA-BUF (from `/dev/udmabuf`, where the kernel has it)
    /// reaches `ibv_reg_dmabuf_mr` unchanged, and stays usable after.
    #[test]
    fn real_dmabuf_descriptor_plumbing() {
        let Some(buf) = crate::udmabuf::UDmaBuf::new(2 * PAGE) else {
            eprintln!("/dev/udmabuf is absent here: nothing to check");
            return;
        };
        let buf = buf.expect("creating a udmabuf");
        let pd = stub_lib::pd(true);
        let mut cache = RegCache::new();
        let va = buf.ptr() as usize;
        let id = pin_dmabuf(
            &mut cache,
            std::slice::from_ref(&pd),
            va + 8,
            PAGE,
            8,
            buf.fd(),
            0,
        )
        .unwrap();
        assert_eq!(
            stub_lib::take_dmabuf_calls(),
            [(0, 2 * PAGE, va as u64, buf.fd(), 0)]
        );
        // SAFETY: F_GETFD only inspects the descriptor table.
        assert!(unsafe { libc::fcntl(buf.fd(), libc::F_GETFD) } >= 0);
        drop(cache.unpin(id).unwrap());
        assert_eq!(stub_lib::live_mrs(), 0);
    }

    /// The symbol-less library gives a clean error from the verbs layer
    /// too (what `register_region` callers see).
    #[test]
    fn register_dmabuf_without_symbol() {
        let pd = stub_lib::pd(false);
        // SAFETY: the stub library maps nothing.
        let e = unsafe { Mr::register_dmabuf(&pd, 3, 0, 4096, 0x10000, 0) }.unwrap_err();
        assert!(
            matches!(&e, VerbsError::Verb { call: "ibv_reg_dmabuf_mr", source, .. }
                if source.raw_os_error() == Some(libc::EOPNOTSUPP)),
            "{e}"
        );
    }
}
