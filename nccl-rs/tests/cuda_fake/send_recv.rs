//! Point-to-point: a send/receive ring mixing device and host buffers.

use crate::drv::Dev;
use crate::{ranks, same};
use nccl_rs::comm::raw::RawP2p;

#[test]
fn send_recv_ring_and_mixed_host_and_device_buffers() {
    ranks(3, |r, comm, s, st| {
        let n = 3;
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        let c = 10_000usize;
        let out: Vec<u8> = (0..c).map(|i| (i * 7 + r) as u8).collect();
        let dev_out = Dev::from(&out, s);
        let dev_back = Dev::<u8>::zeros(c, s);
        let mut host_back = vec![0u8; c];
        let ops = [
            (
                RawP2p {
                    is_send: true,
                    peer: next,
                    ptr: dev_out.ptr(),
                    bytes: c,
                },
                s.id(),
            ),
            (
                RawP2p {
                    is_send: true,
                    peer: next,
                    ptr: out.as_ptr().cast_mut(),
                    bytes: c,
                },
                s.id(),
            ),
            (
                RawP2p {
                    is_send: false,
                    peer: prev,
                    ptr: dev_back.ptr(),
                    bytes: c,
                },
                s.id(),
            ),
            (
                RawP2p {
                    is_send: false,
                    peer: prev,
                    ptr: host_back.as_mut_ptr(),
                    bytes: c,
                },
                s.id(),
            ),
        ];
        // SAFETY: live buffers of `c` bytes; receive buffers distinct.
        unsafe { st.p2p(r, &ops, |host| comm.run_group_raw(host)) }.unwrap();
        let want: Vec<u8> = (0..c).map(|i| (i * 7 + prev) as u8).collect();
        same(&dev_back.read(s), &want, "device receive");
        same(&host_back, &want, "host receive");
    });
}
