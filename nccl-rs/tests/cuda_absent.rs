//! The `cuda` feature on a machine without a CUDA driver (CI): loading
//! fails cleanly, every pointer is host memory, and host buffers take the
//! ordinary path. (With a driver present, the probe's answer is printed.)
#![cfg(feature = "cuda")]

use nccl_rs::comm::raw::{RawArgs, RawColl, RawP2p};
use nccl_rs::cuda::{classify, CudaError, MemKind, Stager, Stream};
use nccl_rs::testing::{on_threads, Over};
use nccl_rs::{Config, DataType, RedOp};

fn driver_present() -> bool {
    // SAFETY: dlopen/dlclose of a library name; nothing is called.
    unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if !h.is_null() {
            libc::dlclose(h);
        }
        !h.is_null()
    }
}

#[test]
fn probe_without_a_driver_is_an_error_not_a_panic() {
    let got = std::panic::catch_unwind(nccl_rs::cuda::probe).expect("probe panicked");
    match got {
        Ok(info) => {
            assert!(driver_present());
            eprintln!("CUDA present: {info}");
        }
        Err(e) => {
            eprintln!("no CUDA: {e}");
            if !driver_present() && std::env::var_os("NCCL_RS_CUDA_DRIVER").is_none() {
                assert!(
                    matches!(e, CudaError::NotFound | CudaError::Disabled),
                    "{e:?}"
                );
            }
            assert!(!nccl_rs::cuda::available());
            assert!(nccl_rs::cuda::device_count().is_err());
            assert!(nccl_rs::cuda::device_alloc(64).is_err());
            assert_eq!(nccl_rs::cuda::current_device(), None);
        }
    }
    // A second probe gives the same answer (loaded once).
    assert_eq!(nccl_rs::cuda::probe().is_ok(), got_ok());
}

fn got_ok() -> bool {
    nccl_rs::cuda::available()
}

#[test]
fn host_pointers_are_host_memory() {
    let v = [0u32; 16];
    assert_eq!(classify(v.as_ptr().cast()), MemKind::Host);
    let b = Box::new(5u8);
    assert_eq!(classify((&*b as *const u8).cast()), MemKind::Host);
    assert_eq!(classify(std::ptr::null()), MemKind::Host);
    assert!(!Stager::needs_staging(&[v.as_ptr().cast()]));
    // SAFETY: host memory, 64 bytes.
    let bytes =
        unsafe { nccl_rs::cuda::read_bytes(v.as_ptr().cast(), 64, Stream::DEFAULT) }.unwrap();
    assert_eq!(bytes, vec![0u8; 64]);
}

#[test]
fn collectives_on_host_buffers_through_the_stager() {
    let cfg = Config {
        socket_ifname: Some("lo".into()),
        ..Config::default()
    };
    let n = 2;
    on_threads(n, &cfg, Over::Config, |r, mut comm| {
        let mut st = Stager::default();
        let x = vec![r as i64 + 1; 5000];
        let mut y = vec![0i64; 5000];
        let args = RawArgs {
            coll: RawColl::AllReduce,
            send: x.as_ptr().cast(),
            recv: y.as_mut_ptr().cast(),
            count: 5000,
            dtype: DataType::Int64,
            op: RedOp::Sum,
            root: 0,
        };
        // SAFETY: host buffers of 5000 i64.
        unsafe { st.collective(&mut comm, &args, Stream::DEFAULT, None) }.unwrap();
        assert_eq!(y, vec![3; 5000]);
        // PreMulSum on host memory: the stager scales a copy.
        let two = 2i64.to_ne_bytes();
        // SAFETY: as above.
        unsafe { st.collective(&mut comm, &args, Stream(0x1234), Some(&two)) }.unwrap();
        assert_eq!(y, vec![6; 5000]);
        assert_eq!(x, vec![r as i64 + 1; 5000]);
        let mut got = vec![0u8; 8];
        let mine = [r as u8; 8];
        let ops = [
            (
                RawP2p {
                    is_send: true,
                    peer: 1 - r,
                    ptr: mine.as_ptr().cast_mut(),
                    bytes: 8,
                },
                Stream::DEFAULT,
            ),
            (
                RawP2p {
                    is_send: false,
                    peer: 1 - r,
                    ptr: got.as_mut_ptr(),
                    bytes: 8,
                },
                Stream::DEFAULT,
            ),
        ];
        // SAFETY: host buffers of 8 bytes.
        unsafe { st.p2p(r, &ops, |h| comm.run_group_raw(h)) }.unwrap();
        assert_eq!(got, vec![1 - r as u8; 8]);
    });
}
