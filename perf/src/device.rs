//! Device buffers (`--device 1`): each rank's send and receive buffers in
//! GPU memory (`cuMemAlloc`), every operation run through nccl-rs's
//! `nccl_rs::cuda::Stager` (the `cuda` feature) on the default stream and waited
//! for, so the times include the staging copies, as nccl-tests' include
//! its kernels. The check fills and compares host copies: the input is
//! copied to the device before the checked operation and the output back
//! after it, so `-c 1` stays exact.
//!
//! Needs the `cuda` feature (`cargo build -p nccl-perf --features cuda`)
//! and a usable CUDA driver; without either, [`DeviceBuffers::new`] fails
//! with a message and the tool exits with status 1.

use crate::coll::{Collective, Counts};
use nccl_rs::{Communicator, Element, RedOp};

/// Errors of the device path (messages for the user).
pub type DeviceResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// One rank's device buffers of `bytes` bytes each.
pub struct DeviceBuffers {
    #[cfg(feature = "cuda")]
    imp: imp::Bufs,
}

impl std::fmt::Debug for DeviceBuffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffers").finish_non_exhaustive()
    }
}

/// What [`DeviceBuffers::new`] says in a build without the `cuda` feature.
pub const NO_CUDA_BUILD: &str = "--device 1 needs a build with CUDA support: \
     rebuild the perf tools with `cargo build -p nccl-perf --features cuda`";

/// Checks, before any communicator exists, that `--device 1` can work
/// here: a `cuda` build and a CUDA driver that sees a device.
pub fn available() -> DeviceResult<()> {
    #[cfg(feature = "cuda")]
    {
        let info = nccl_rs::cuda::probe().map_err(|e| format!("--device 1: {e}"))?;
        if info.devices.is_empty() {
            return Err("--device 1: the CUDA driver found no device".into());
        }
        Ok(())
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(NO_CUDA_BUILD.into())
    }
}

/// Chooses the GPU of a rank whose local rank (its index among the ranks
/// of this host) is `local_rank`: device `local_rank % device count`, as
/// nccl-tests does with one GPU per rank; returns its ordinal.
pub fn select(local_rank: usize) -> DeviceResult<i32> {
    #[cfg(feature = "cuda")]
    {
        let n = nccl_rs::cuda::device_count().map_err(|e| format!("--device 1: {e}"))?;
        if n == 0 {
            return Err("--device 1: the CUDA driver found no device".into());
        }
        let ordinal = i32::try_from(local_rank % n)?;
        nccl_rs::cuda::copy::set_device(ordinal)
            .map_err(|e| format!("--device 1: selecting device {ordinal}: {e}"))?;
        Ok(ordinal)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = local_rank;
        Err(NO_CUDA_BUILD.into())
    }
}

/// The device `--device 1` uses (`dddd:bb:dd.0 name`), for the header.
pub fn describe() -> String {
    #[cfg(feature = "cuda")]
    {
        imp::describe()
    }
    #[cfg(not(feature = "cuda"))]
    {
        String::new()
    }
}

impl DeviceBuffers {
    /// Allocates send and receive buffers of `bytes` bytes on the current
    /// device (device 0 unless the thread chose another), and logs at INFO
    /// how they would travel through `comm`'s network transport
    /// (GPUDirect RDMA or staging, and why; `NCCL_NET_GDR_LEVEL`,
    /// `NCCL_DMABUF_ENABLE`). The operations themselves are staged.
    pub fn new(bytes: usize, comm: &Communicator) -> DeviceResult<DeviceBuffers> {
        #[cfg(feature = "cuda")]
        {
            let b = imp::Bufs::new(bytes)?;
            b.log_net_path(comm)?;
            Ok(DeviceBuffers { imp: b })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (bytes, comm);
            Err(NO_CUDA_BUILD.into())
        }
    }

    /// Copies the first elements of `send` and `recv` (the host buffers
    /// [`crate::check::prepare`] filled) to the device buffers.
    pub fn upload<T: Element>(&mut self, send: &[T], recv: &[T]) -> DeviceResult<()> {
        #[cfg(feature = "cuda")]
        {
            self.imp
                .upload(bytemuck::cast_slice(send), bytemuck::cast_slice(recv))
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (send, recv);
            Err(NO_CUDA_BUILD.into())
        }
    }

    /// Copies the start of the device receive buffer into `recv`.
    pub fn download<T: Element>(&mut self, recv: &mut [T]) -> DeviceResult<()> {
        #[cfg(feature = "cuda")]
        {
            self.imp.download(bytemuck::cast_slice_mut(recv))
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = recv;
            Err(NO_CUDA_BUILD.into())
        }
    }

    /// Runs `coll` once on the device buffers, `shift` elements in (as
    /// [`crate::exec::run_op`] on host slices), and waits for it.
    #[allow(clippy::too_many_arguments)]
    pub fn run_op<T: Element>(
        &mut self,
        comm: &mut Communicator,
        coll: Collective,
        op: RedOp,
        root: usize,
        c: &Counts,
        in_place: bool,
        shift: usize,
    ) -> DeviceResult<()> {
        #[cfg(feature = "cuda")]
        {
            let es = std::mem::size_of::<T>();
            let call = imp::Call {
                coll,
                dtype: T::DTYPE,
                op,
                root,
                c: *c,
                in_place,
                shift_bytes: shift * es,
            };
            self.imp.run(comm, &call)
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (comm, coll, op, root, c, in_place, shift);
            Err(NO_CUDA_BUILD.into())
        }
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::DeviceResult;
    use crate::coll::{Collective, Counts};
    use nccl_rs::comm::raw::{RawArgs, RawP2p};
    use nccl_rs::cuda::{copy, Stager, Stream};
    use nccl_rs::{Communicator, DataType, RedOp};
    use std::ffi::c_void;

    /// One operation's arguments.
    pub(super) struct Call {
        pub(super) coll: Collective,
        pub(super) dtype: DataType,
        pub(super) op: RedOp,
        pub(super) root: usize,
        pub(super) c: Counts,
        pub(super) in_place: bool,
        pub(super) shift_bytes: usize,
    }

    pub(super) fn describe() -> String {
        let dev = nccl_rs::cuda::current_device().unwrap_or(0);
        match nccl_rs::cuda::probe() {
            Ok(i) => i
                .devices
                .iter()
                .find(|d| d.ordinal == dev)
                .map(|d| format!("{} {}", d.pci_bus_id, d.name))
                .unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    pub(super) struct Bufs {
        send: *mut c_void,
        recv: *mut c_void,
        bytes: usize,
        stager: Stager,
        stream: Stream,
    }

    // SAFETY: device addresses, not host memory; the driver may be called
    // from any thread (the stager binds the buffers' context per call).
    unsafe impl Send for Bufs {}

    impl Bufs {
        pub(super) fn new(bytes: usize) -> DeviceResult<Bufs> {
            super::available()?;
            let stager = Stager::from_env()?;
            let n = bytes.max(1);
            let send = nccl_rs::cuda::device_alloc(n).map_err(|e| format!("--device 1: {e}"))?;
            let recv = match nccl_rs::cuda::device_alloc(n) {
                Ok(p) => p,
                Err(e) => {
                    // SAFETY: allocated just above, unused.
                    let _ = unsafe { nccl_rs::cuda::device_free(send) };
                    return Err(format!("--device 1: {e}").into());
                }
            };
            Ok(Bufs {
                send,
                recv,
                bytes,
                stager,
                stream: Stream::DEFAULT,
            })
        }

        pub(super) fn log_net_path(&self, comm: &Communicator) -> DeviceResult<()> {
            let cfg = nccl_rs::cuda::gdr::GdrConfig::from_env()?;
            let net = comm.net_properties();
            let _ = nccl_rs::cuda::netreg::decide(self.send, self.bytes, &net, &cfg, None);
            Ok(())
        }

        fn check_len(&self, what: &str, len: usize) -> DeviceResult<()> {
            if len > self.bytes {
                return Err(format!(
                    "{what} of {len} bytes exceeds the {} byte buffers",
                    self.bytes
                )
                .into());
            }
            Ok(())
        }

        pub(super) fn upload(&mut self, send: &[u8], recv: &[u8]) -> DeviceResult<()> {
            self.check_len("upload", send.len().max(recv.len()))?;
            // SAFETY: our device buffers hold `bytes` >= len bytes; the
            // host slices are readable; copy_bytes waits for the copy.
            unsafe {
                copy::copy_bytes(self.send.cast(), send.as_ptr(), send.len(), self.stream)?;
                copy::copy_bytes(self.recv.cast(), recv.as_ptr(), recv.len(), self.stream)?;
            }
            Ok(())
        }

        pub(super) fn download(&mut self, recv: &mut [u8]) -> DeviceResult<()> {
            self.check_len("download", recv.len())?;
            // SAFETY: as in `upload`, the other way.
            unsafe {
                copy::copy_bytes(
                    recv.as_mut_ptr(),
                    self.recv.cast_const().cast(),
                    recv.len(),
                    self.stream,
                )
            }?;
            Ok(())
        }

        pub(super) fn run(&mut self, comm: &mut Communicator, k: &Call) -> DeviceResult<()> {
            let es = k.dtype.size();
            let c = &k.c;
            self.check_len("operation", k.shift_bytes + c.total() * es)?;
            let rank = comm.rank();
            let n = comm.size();
            let send = self.send.cast::<u8>().wrapping_add(k.shift_bytes);
            let recv = self.recv.cast::<u8>().wrapping_add(k.shift_bytes);
            if k.coll == Collective::SendRecv {
                let (from, into) = if k.in_place {
                    (recv, send)
                } else {
                    (send, recv)
                };
                let ops = [
                    (
                        RawP2p {
                            is_send: true,
                            peer: (rank + 1) % n,
                            ptr: from,
                            bytes: c.send * es,
                        },
                        self.stream,
                    ),
                    (
                        RawP2p {
                            is_send: false,
                            peer: (rank + n - 1) % n,
                            ptr: into,
                            bytes: c.recv * es,
                        },
                        self.stream,
                    ),
                ];
                // SAFETY: device buffers of ours, large enough (checked);
                // we wait for the stream below before touching them.
                unsafe {
                    self.stager
                        .p2p(rank, &ops, |host| run_p2p_host(comm, rank, host))
                }?;
            } else {
                let (s, r) = if k.in_place {
                    (
                        recv.wrapping_add(c.send_inplace_offset * rank * es)
                            .cast_const(),
                        recv.wrapping_add(c.recv_inplace_offset * rank * es),
                    )
                } else {
                    (send.cast_const(), recv)
                };
                let coll = k.coll.raw().expect("sendrecv is handled above");
                let args = RawArgs {
                    coll,
                    send: s,
                    recv: r,
                    count: c.param,
                    dtype: k.dtype,
                    op: k.op,
                    root: k.root,
                };
                // SAFETY: as above; NCCL's in-place layouts (Counts).
                unsafe { self.stager.collective(comm, &args, self.stream, None) }?;
            }
            copy::synchronize(self.stream, self.recv.cast_const().cast())?;
            Ok(())
        }
    }

    /// The host half of a staged send/recv: a send to this rank itself (one
    /// rank) is a copy; the rest is a group.
    fn run_p2p_host(comm: &mut Communicator, rank: usize, ops: &[RawP2p]) -> nccl_rs::Result<()> {
        let (local, remote): (Vec<RawP2p>, Vec<RawP2p>) = ops.iter().partition(|o| o.peer == rank);
        if let [s, r] = local[..] {
            let (s, r) = if s.is_send { (s, r) } else { (r, s) };
            if s.bytes > 0 {
                // SAFETY: the staged host buffers the stager lends for this
                // call, `bytes` long each; `copy` allows overlap.
                unsafe { std::ptr::copy(s.ptr.cast_const(), r.ptr, s.bytes.min(r.bytes)) };
            }
        }
        if remote.is_empty() {
            return Ok(());
        }
        // SAFETY: as above.
        unsafe { comm.run_group_raw(&remote) }
    }

    impl Drop for Bufs {
        fn drop(&mut self) {
            for p in [self.send, self.recv] {
                // SAFETY: allocated in `new`, freed once; every operation
                // was waited for.
                if let Err(e) = unsafe { nccl_rs::cuda::device_free(p) } {
                    eprintln!("freeing a device buffer failed: {e}");
                }
            }
        }
    }
}
