//! Send/recv groups on device buffers, staged through pinned host memory.

use super::buf::Buf;
use super::{cuda, op_ctx, Stager, Stream};
use crate::comm::raw::RawP2p;
use crate::cuda::driver::copy_async;
use crate::cuda::pointer::{self, PtrInfo};
use crate::error::{Error, Result};

impl Stager {
    /// Runs a group of sends and receives, any of them on device memory,
    /// each ordered on its stream. `run` is called once with the host
    /// view of the group: device buffers replaced by pinned staging
    /// buffers (sends already filled); it runs the exchange (for the C ABI
    /// including sends to self).
    ///
    /// # Safety
    /// As [`Communicator::run_group_raw`](crate::Communicator::run_group_raw), except that buffers may be
    /// device memory, valid until the copies enqueued on their streams by
    /// this call have run.
    pub unsafe fn p2p(
        &mut self,
        rank: usize,
        ops: &[(RawP2p, Stream)],
        run: impl FnOnce(&[RawP2p]) -> Result<()>,
    ) -> Result<()> {
        let infos: Vec<PtrInfo> = ops
            .iter()
            .map(|(o, _)| {
                if o.bytes > 0 {
                    pointer::info(o.ptr)
                } else {
                    PtrInfo::HOST
                }
            })
            .collect();
        let Some(first) = infos.iter().position(PtrInfo::is_device) else {
            let plain: Vec<RawP2p> = ops.iter().map(|(o, _)| *o).collect();
            return run(&plain);
        };
        for (o, _) in ops {
            if o.bytes > 0 && o.ptr.is_null() {
                return Err(Error::InvalidArgument(format!(
                    "NULL buffer for {} bytes with peer {}",
                    o.bytes, o.peer
                )));
            }
        }
        let err = cuda(rank);
        let ctx = op_ctx(ops[first].1, &infos[first..=first]).map_err(&err)?;
        let _g = self.enter(ctx).map_err(&err)?;
        if self.p2p.len() < ops.len() {
            self.p2p.resize_with(ops.len(), Buf::default);
        }
        let mut host: Vec<RawP2p> = Vec::with_capacity(ops.len());
        for (i, ((o, st), info)) in ops.iter().zip(&infos).enumerate() {
            if !info.is_device() {
                host.push(*o);
                continue;
            }
            let buf = &mut self.p2p[i];
            let p = buf.reserve(o.bytes, &mut self.retired).map_err(&err)?;
            if o.is_send {
                let s = st.effective();
                // SAFETY: the send buffer is valid for `bytes` once the
                // stream reaches this point (contract); `p` is ours.
                unsafe { copy_async(p, o.ptr, o.bytes, s) }.map_err(&err)?;
                buf.mark(s).map_err(&err)?;
            }
            host.push(RawP2p { ptr: p, ..*o });
        }
        for (i, ((o, _), info)) in ops.iter().zip(&infos).enumerate() {
            if o.is_send && info.is_device() {
                self.p2p[i].settle().map_err(&err)?;
            }
        }
        run(&host)?;
        for (i, ((o, st), info)) in ops.iter().zip(&infos).enumerate() {
            if !o.is_send && info.is_device() {
                let s = st.effective();
                let buf = &mut self.p2p[i];
                // SAFETY: the receive buffer is valid for `bytes` until the
                // stream ran this copy (contract); the staging buffer is
                // kept until its event completes.
                unsafe { copy_async(o.ptr, buf.ptr(), o.bytes, s) }.map_err(&err)?;
                buf.mark(s).map_err(&err)?;
            }
        }
        Ok(())
    }
}
