//! The `cuda` feature against a fake CUDA driver (`ffi/tests/cuda/fake_libcuda.c`,
//! built here with `cc`): device memory the CPU cannot touch, streams that
//! run their copies later on their own threads. So these tests run the
//! whole staging path (classification, contexts, stream ordering, the
//! chunked pipeline, exact results) on machines without a GPU.
//!
//! With `NCCL_RS_CUDA_TESTS=real` the same tests run on the real driver
//! and GPU instead (`scripts/gpu-check.sh` does this).
#![cfg(feature = "cuda")]

use nccl_rs::comm::raw::{RawArgs, RawColl, RawP2p};
use nccl_rs::cuda::gdr::{self, DataPath, GdrConfig, GdrLevel};
use nccl_rs::cuda::{classify, DeviceReduce, MemKind, Stager, StagingOptions};
use nccl_rs::{Communicator, Config, DataType, RedOp, UniqueId};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The few driver calls the tests make themselves (streams, copies,
/// pinned memory), looked up in the driver `nccl_rs::cuda` loaded
/// (globally). cudarc's typed layer is tested on a real GPU only
/// (`cuda_gpu.rs`): its loader wants every symbol of its bindings, which
/// the fake does not have.
mod drv {
    use std::ffi::{c_int, c_void, CString};
    use std::marker::PhantomData;

    fn sym(name: &str) -> *mut c_void {
        nccl_rs::cuda::probe().expect("the CUDA driver");
        let c = CString::new(name).unwrap();
        // SAFETY: a symbol lookup in the loaded libraries.
        let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c.as_ptr()) };
        assert!(!p.is_null(), "the driver lacks {name}");
        p
    }

    macro_rules! call {
        ($name:literal ($($t:ty),*) ($($a:expr),*)) => {{
            let f = sym($name);
            // SAFETY: the driver function of that name has this signature
            // (cuda.h); the tests pass valid arguments.
            let rc = unsafe {
                std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($t),*) -> c_int>(f)($($a),*)
            };
            assert_eq!(rc, 0, "{} failed: {rc}", $name);
        }};
    }

    /// Makes device 0's primary context current on this thread.
    pub(crate) fn bind_device0() {
        let mut ctx: *mut c_void = std::ptr::null_mut();
        call!("cuDevicePrimaryCtxRetain" (*mut *mut c_void, c_int) (&mut ctx, 0));
        call!("cuCtxSetCurrent" (*mut c_void) (ctx));
    }

    /// A stream of the current context.
    pub(crate) struct Stream(*mut c_void);

    impl Stream {
        pub(crate) fn new() -> Stream {
            let mut s: *mut c_void = std::ptr::null_mut();
            call!("cuStreamCreate" (*mut *mut c_void, u32) (&mut s, 1));
            Stream(s)
        }

        pub(crate) fn sync(&self) {
            call!("cuStreamSynchronize" (*mut c_void) (self.0));
        }

        pub(crate) fn id(&self) -> nccl_rs::cuda::Stream {
            nccl_rs::cuda::Stream(self.0 as usize)
        }
    }

    impl Drop for Stream {
        fn drop(&mut self) {
            call!("cuStreamDestroy_v2" (*mut c_void) (self.0));
        }
    }

    /// A device allocation of `len` elements.
    pub(crate) struct Dev<T> {
        ptr: *mut c_void,
        len: usize,
        _t: PhantomData<T>,
    }

    impl<T: Copy + Default> Dev<T> {
        pub(crate) fn zeros(len: usize, s: &Stream) -> Dev<T> {
            Dev::from(&vec![T::default(); len], s)
        }

        /// A copy of `data` (written through `s`, which waits for the
        /// pageable source as cudaMemcpyAsync does).
        pub(crate) fn from(data: &[T], s: &Stream) -> Dev<T> {
            let bytes = std::mem::size_of_val(data).max(1);
            let ptr = nccl_rs::cuda::device_alloc(bytes).unwrap();
            let d = Dev {
                ptr,
                len: data.len(),
                _t: PhantomData,
            };
            d.write(data, s);
            d
        }

        pub(crate) fn write(&self, data: &[T], s: &Stream) {
            assert_eq!(data.len(), self.len);
            call!("cuMemcpyHtoDAsync_v2" (u64, *const c_void, usize, *mut c_void)
                (self.ptr as u64, data.as_ptr().cast(), std::mem::size_of_val(data), s.0));
        }

        /// The contents, once `s` has run everything enqueued so far.
        pub(crate) fn read(&self, s: &Stream) -> Vec<T> {
            let mut v = vec![T::default(); self.len];
            call!("cuMemcpyDtoHAsync_v2" (*mut c_void, u64, usize, *mut c_void)
                (v.as_mut_ptr().cast(), self.ptr as u64, std::mem::size_of_val(&v[..]), s.0));
            s.sync();
            v
        }

        pub(crate) fn ptr(&self) -> *mut u8 {
            self.ptr.cast()
        }
    }

    impl<T> Drop for Dev<T> {
        fn drop(&mut self) {
            // SAFETY: from device_alloc; the tests synchronize before
            // dropping.
            unsafe { nccl_rs::cuda::device_free(self.ptr) }.unwrap();
        }
    }

    /// Pinned host memory (`cuMemAllocHost`): copies from and to it are
    /// asynchronous.
    pub(crate) struct Pinned<T> {
        ptr: *mut T,
        len: usize,
    }

    impl<T: Copy> Pinned<T> {
        pub(crate) fn new(len: usize) -> Pinned<T> {
            let mut p: *mut c_void = std::ptr::null_mut();
            call!("cuMemAllocHost_v2" (*mut *mut c_void, usize) (&mut p, len * std::mem::size_of::<T>()));
            Pinned { ptr: p.cast(), len }
        }

        pub(crate) fn slice(&mut self) -> &mut [T] {
            // SAFETY: `len` elements of pinned memory owned by us; callers
            // synchronize the stream before touching them.
            unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
        }

        /// Enqueues pinned → device on `s`.
        pub(crate) fn upload(&self, d: &Dev<T>, s: &Stream) {
            call!("cuMemcpyHtoDAsync_v2" (u64, *const c_void, usize, *mut c_void)
                (d.ptr as u64, self.ptr.cast(), self.len * std::mem::size_of::<T>(), s.0));
        }

        /// Enqueues device → pinned on `s`.
        pub(crate) fn download(&self, d: &Dev<T>, s: &Stream) {
            call!("cuMemcpyDtoHAsync_v2" (*mut c_void, u64, usize, *mut c_void)
                (self.ptr.cast(), d.ptr as u64, self.len * std::mem::size_of::<T>(), s.0));
        }
    }

    impl<T> Drop for Pinned<T> {
        fn drop(&mut self) {
            call!("cuMemFreeHost" (*mut c_void) (self.ptr.cast()));
        }
    }
}

use drv::{Dev, Pinned, Stream};

/// Whether the tests run on the real driver (`NCCL_RS_CUDA_TESTS=real`).
fn real() -> bool {
    std::env::var("NCCL_RS_CUDA_TESTS").is_ok_and(|v| v == "real")
}

/// Builds the fake driver once and points `NCCL_CUDA_DRIVER` at it (unless
/// [`real`]). Every test calls this first, so the variables are set before
/// any thread reads the environment.
fn fake_driver() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        if real() {
            return PathBuf::new();
        }
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ffi/tests/cuda/fake_libcuda.c");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fakecuda");
        std::fs::create_dir_all(&dir).unwrap();
        let lib = dir.join("libcuda.so.1");
        let tmp = dir.join(format!(".libcuda.{}", std::process::id()));
        let o = Command::new("cc")
            .args([
                "-shared",
                "-fPIC",
                "-O1",
                "-pthread",
                "-Wl,-soname,libcuda.so.1",
            ])
            .arg(&src)
            .arg("-o")
            .arg(&tmp)
            .output()
            .expect("running cc");
        assert!(
            o.status.success(),
            "building the fake driver: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        std::fs::rename(&tmp, &lib).unwrap();
        std::env::set_var("NCCL_CUDA_DRIVER", &lib);
        std::env::set_var("FAKE_CUDA_DELAY_US", "50");
        std::env::set_var("FAKE_CUDA_DMABUF", "1");
        lib
    })
}

fn config() -> Config {
    Config {
        socket_ifname: Some("lo".into()),
        timeout: std::time::Duration::from_secs(60),
        bootstrap_timeout: std::time::Duration::from_secs(60),
        ..Config::default()
    }
}

/// Runs `f(rank, comm, stream, stager)` on `n` ranks, threads of this
/// process sharing the (fake) GPU, each with its own stream and stager.
fn ranks(n: usize, f: impl Fn(usize, &mut Communicator, &Stream, &mut Stager) + Sync) {
    fake_driver();
    let cfg = config();
    let id = UniqueId::new(&cfg).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (id, cfg, f) = (&id, &cfg, &f);
                s.spawn(move || {
                    let mut comm = Communicator::init(id, n, r, cfg).unwrap();
                    drv::bind_device0();
                    let stream = Stream::new();
                    let mut stager = Stager::new(StagingOptions {
                        chunk_bytes: 4096,
                        pipeline: true,
                    });
                    f(r, &mut comm, &stream, &mut stager);
                    stream.sync();
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
}

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

/// Compares two vectors, reporting the first difference (not all of it).
#[track_caller]
fn same<T: PartialEq + std::fmt::Debug>(got: &[T], want: &[T], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "{what}: element {i} is {:?}, expected {:?}",
            got[i], want[i]
        );
    }
}

/// Element i of rank r's input: exact in f32 and i32 sums and products.
fn val(r: usize, i: usize) -> i32 {
    (r as i32 + 1) * 1000 + (i % 97) as i32
}

/// Runs one raw collective on device buffers through the stager.
#[allow(clippy::too_many_arguments)]
fn coll(
    stager: &mut Stager,
    comm: &mut Communicator,
    stream: &Stream,
    coll: RawColl,
    send: Option<&Dev<i32>>,
    recv: &Dev<i32>,
    count: usize,
    op: RedOp,
    root: usize,
) {
    let args = RawArgs {
        coll,
        send: send.map_or(recv.ptr(), Dev::ptr).cast_const(),
        recv: recv.ptr(),
        count,
        dtype: DataType::Int32,
        op,
        root,
    };
    // SAFETY: device allocations of the sizes NCCL defines.
    unsafe { stager.collective(comm, &args, stream.id(), None) }.unwrap();
}

#[test]
fn every_collective_on_device_buffers_is_exact() {
    for n in [2usize, 3] {
        ranks(n, |r, comm, s, st| {
            let c = 1000; // 4096-byte chunks: several per call
            let mine: Vec<i32> = (0..c).map(|i| val(r, i)).collect();
            let send = Dev::from(&mine, s);
            let sum: Vec<i32> = (0..c).map(|i| (0..n).map(|q| val(q, i)).sum()).collect();

            // All-reduce, out of place and in place (max).
            let out = Dev::zeros(c, s);
            coll(
                st,
                comm,
                s,
                RawColl::AllReduce,
                Some(&send),
                &out,
                c,
                RedOp::Sum,
                0,
            );
            same(&out.read(s), &sum, &format!("rank {r}: all-reduce"));
            let inplace = Dev::from(&mine, s);
            coll(
                st,
                comm,
                s,
                RawColl::AllReduce,
                None,
                &inplace,
                c,
                RedOp::Max,
                0,
            );
            let max: Vec<i32> = (0..c).map(|i| val(n - 1, i)).collect();
            same(&inplace.read(s), &max, &format!("rank {r}: in-place max"));

            // All-gather.
            let all = Dev::zeros(n * c, s);
            coll(
                st,
                comm,
                s,
                RawColl::AllGather,
                Some(&send),
                &all,
                c,
                RedOp::Sum,
                0,
            );
            let want: Vec<i32> = (0..n * c).map(|j| val(j / c, j % c)).collect();
            same(&all.read(s), &want, &format!("rank {r}: all-gather"));

            // Reduce-scatter: block q of every rank's input goes to rank q.
            let big: Vec<i32> = (0..n * c).map(|j| val(r, j) + j as i32).collect();
            let big_d = Dev::from(&big, s);
            let part = Dev::zeros(c, s);
            coll(
                st,
                comm,
                s,
                RawColl::ReduceScatter,
                Some(&big_d),
                &part,
                c,
                RedOp::Sum,
                0,
            );
            let want: Vec<i32> = (0..c)
                .map(|i| {
                    let j = r * c + i;
                    (0..n).map(|q| val(q, j) + j as i32).sum()
                })
                .collect();
            same(&part.read(s), &want, &format!("rank {r}: reduce-scatter"));

            // All-to-all: block q of rank p lands as block p at rank q.
            let a2a = Dev::zeros(n * c, s);
            coll(
                st,
                comm,
                s,
                RawColl::AllToAll,
                Some(&big_d),
                &a2a,
                c,
                RedOp::Sum,
                0,
            );
            let want: Vec<i32> = (0..n * c)
                .map(|j| {
                    let (p, i) = (j / c, j % c);
                    val(p, r * c + i) + (r * c + i) as i32
                })
                .collect();
            same(&a2a.read(s), &want, &format!("rank {r}: all-to-all"));

            // Broadcast from the last rank, in place.
            let root = n - 1;
            let b = Dev::from(&mine, s);
            coll(
                st,
                comm,
                s,
                RawColl::Broadcast,
                None,
                &b,
                c,
                RedOp::Sum,
                root,
            );
            let want: Vec<i32> = (0..c).map(|i| val(root, i)).collect();
            same(&b.read(s), &want, &format!("rank {r}: broadcast"));

            // Reduce to rank 0 (others pass a receive buffer NCCL ignores).
            let red = Dev::zeros(c, s);
            coll(
                st,
                comm,
                s,
                RawColl::Reduce,
                Some(&send),
                &red,
                c,
                RedOp::Sum,
                0,
            );
            if r == 0 {
                same(&red.read(s), &sum, "reduce");
            }

            // Gather to rank 1, scatter from rank 1.
            let g = Dev::zeros(n * c, s);
            coll(
                st,
                comm,
                s,
                RawColl::Gather,
                Some(&send),
                &g,
                c,
                RedOp::Sum,
                1,
            );
            if r == 1 {
                let want: Vec<i32> = (0..n * c).map(|j| val(j / c, j % c)).collect();
                same(&g.read(s), &want, "gather");
            }
            let sc = Dev::zeros(c, s);
            coll(
                st,
                comm,
                s,
                RawColl::Scatter,
                Some(&big_d),
                &sc,
                c,
                RedOp::Sum,
                1,
            );
            let want: Vec<i32> = (0..c)
                .map(|i| val(1, r * c + i) + (r * c + i) as i32)
                .collect();
            same(&sc.read(s), &want, &format!("rank {r}: scatter"));
        });
    }
}

#[test]
fn in_place_all_gather_and_reduce_scatter_layouts() {
    ranks(3, |r, comm, s, st| {
        let (n, c) = (3, 777);
        // All-gather in place: this rank's part already sits at r * c.
        let mut buf: Vec<i32> = vec![-1; n * c];
        for i in 0..c {
            buf[r * c + i] = val(r, i);
        }
        let d = Dev::from(&buf, s);
        let args = RawArgs {
            coll: RawColl::AllGather,
            send: d.ptr().wrapping_add(r * c * 4),
            recv: d.ptr(),
            count: c,
            dtype: DataType::Int32,
            op: RedOp::Sum,
            root: 0,
        };
        // SAFETY: NCCL's in-place all-gather layout in one allocation.
        unsafe { st.collective(comm, &args, s.id(), None) }.unwrap();
        let want: Vec<i32> = (0..n * c).map(|j| val(j / c, j % c)).collect();
        same(&d.read(s), &want, "in-place all-gather");

        // Reduce-scatter in place: the result lands at block r.
        let input: Vec<i32> = (0..n * c).map(|j| val(r, j)).collect();
        let d = Dev::from(&input, s);
        let args = RawArgs {
            coll: RawColl::ReduceScatter,
            send: d.ptr(),
            recv: d.ptr().wrapping_add(r * c * 4),
            ..args
        };
        // SAFETY: NCCL's in-place reduce-scatter layout.
        unsafe { st.collective(comm, &args, s.id(), None) }.unwrap();
        let got = d.read(s);
        let want: Vec<i32> = (0..c)
            .map(|i| (0..n).map(|q| val(q, r * c + i)).sum())
            .collect();
        same(&got[r * c..(r + 1) * c], &want, "in-place reduce-scatter");
    });
}

#[test]
fn input_written_by_earlier_stream_work_is_waited_for() {
    // The input is copied in asynchronously (pinned host → device) right
    // before the call, and the result copied out asynchronously right
    // after; only then does the test synchronize. The fake stream delays
    // the copies, so a stager that read too early would see stale data.
    ranks(2, |r, comm, s, st| {
        let c = 5000;
        let mut pin = Pinned::<i32>::new(c);
        pin.slice()
            .copy_from_slice(&(0..c).map(|i| val(r, i)).collect::<Vec<_>>());
        let dev = Dev::<i32>::zeros(c, s);
        for round in 0..3 {
            pin.upload(&dev, s);
            let args = RawArgs {
                coll: RawColl::AllReduce,
                send: dev.ptr(),
                recv: dev.ptr(),
                count: c,
                dtype: DataType::Int32,
                op: RedOp::Sum,
                root: 0,
            };
            // SAFETY: a device buffer of `c` elements.
            unsafe { st.collective(comm, &args, s.id(), None) }.unwrap();
            pin.download(&dev, s);
            s.sync();
            let got = pin.slice().to_vec();
            let want: Vec<i32> = (0..c)
                .map(|i| (val(0, i) + val(1, i)) * (1 << round))
                .collect();
            same(&got, &want, &format!("rank {r} round {round}"));
            // Next round: both ranks feed the sum back in, doubling it.
        }
    });
}

#[test]
fn premultiplied_input_on_device() {
    ranks(2, |r, comm, s, st| {
        let c = 2000;
        let x: Vec<i32> = (0..c).map(|i| val(r, i)).collect();
        let send = Dev::from(&x, s);
        let recv = Dev::<i32>::zeros(c, s);
        let args = RawArgs {
            coll: RawColl::AllReduce,
            send: send.ptr(),
            recv: recv.ptr(),
            count: c,
            dtype: DataType::Int32,
            op: RedOp::Sum,
            root: 0,
        };
        let scalar = 3i32.to_ne_bytes();
        // SAFETY: device buffers of `c` elements.
        unsafe { st.collective(comm, &args, s.id(), Some(&scalar)) }.unwrap();
        let want: Vec<i32> = (0..c).map(|i| 3 * (val(0, i) + val(1, i))).collect();
        same(&recv.read(s), &want, "PreMulSum");
        // The input itself is untouched.
        same(&send.read(s), &x, "PreMulSum input");
    });
}

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

#[test]
fn host_buffers_take_the_ordinary_path() {
    ranks(2, |r, comm, _s, st| {
        let x = vec![r as f64 + 0.5; 100];
        let mut y = vec![0.0f64; 100];
        let args = RawArgs {
            coll: RawColl::AllReduce,
            send: x.as_ptr().cast(),
            recv: y.as_mut_ptr().cast(),
            count: 100,
            dtype: DataType::Float64,
            op: RedOp::Sum,
            root: 0,
        };
        // SAFETY: host buffers of 100 f64.
        unsafe { st.collective(comm, &args, nccl_rs::cuda::Stream::DEFAULT, None) }.unwrap();
        assert_eq!(y, vec![2.0; 100]);
    });
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

/// One all-reduce, reduce-scatter or reduce of `i32` on device buffers,
/// returning the call's result instead of unwrapping it.
#[allow(clippy::too_many_arguments)]
fn try_coll(
    st: &mut Stager,
    comm: &mut Communicator,
    s: &Stream,
    coll: RawColl,
    send: &Dev<i32>,
    recv: &Dev<i32>,
    count: usize,
    op: RedOp,
) -> nccl_rs::Result<()> {
    let args = RawArgs {
        coll,
        send: send.ptr().cast_const(),
        recv: recv.ptr(),
        count,
        dtype: DataType::Int32,
        op,
        root: 1,
    };
    // SAFETY: device allocations of the sizes NCCL defines.
    unsafe { st.collective(comm, &args, s.id(), None) }
}

#[test]
fn device_reductions_fall_back_to_the_host_without_kernels() {
    fake_driver();
    let probe = nccl_rs::cuda::device_reduce_probe();
    if real() {
        println!(
            "device reduction kernels: {}",
            probe.expect("kernels on a real GPU")
        );
    } else {
        // No NVRTC, or (with NCCL_NVRTC_LIBRARY) a driver without modules.
        let e = probe
            .expect_err("the fake driver runs no kernels")
            .to_string();
        assert!(e.contains("NVRTC") || e.contains("cuModuleLoadData"), "{e}");
    }
    ranks(3, |r, comm, s, st| {
        st.set_device_reduce(DeviceReduce::Auto);
        let (n, c) = (3, 1001);
        let mine: Vec<i32> = (0..n * c).map(|i| val(r, i) - 3000).collect();
        let send = Dev::from(&mine, s);
        let at = |q: usize, i: usize| val(q, i) - 3000;
        for op in [RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Avg] {
            let fold = |i: usize| {
                let v = (0..n).map(|q| at(q, i));
                match op {
                    RedOp::Sum => v.fold(0i32, i32::wrapping_add),
                    RedOp::Prod => v.fold(1i32, i32::wrapping_mul),
                    RedOp::Min => v.min().unwrap(),
                    _ => v.fold(0i32, i32::wrapping_add) / n as i32,
                }
            };
            let out = Dev::zeros(c, s);
            try_coll(st, comm, s, RawColl::AllReduce, &send, &out, c, op).unwrap();
            let want: Vec<i32> = (0..c).map(fold).collect();
            same(&out.read(s), &want, &format!("rank {r}: all-reduce {op}"));
            try_coll(st, comm, s, RawColl::ReduceScatter, &send, &out, c, op).unwrap();
            let want: Vec<i32> = (0..c).map(|i| fold(r * c + i)).collect();
            same(
                &out.read(s),
                &want,
                &format!("rank {r}: reduce-scatter {op}"),
            );
            let root = Dev::zeros(c, s);
            try_coll(st, comm, s, RawColl::Reduce, &send, &root, c, op).unwrap();
            if r == 1 {
                let want: Vec<i32> = (0..c).map(fold).collect();
                same(&root.read(s), &want, &format!("rank {r}: reduce {op}"));
            }
        }
    });
}

#[test]
fn forced_gpu_reduction_without_kernels_fails_cleanly() {
    ranks(2, |r, comm, s, st| {
        st.set_device_reduce(DeviceReduce::Gpu);
        let send = Dev::from(&vec![r as i32 + 1; 100], s);
        let out = Dev::zeros(100, s);
        let got = try_coll(
            st,
            comm,
            s,
            RawColl::AllReduce,
            &send,
            &out,
            100,
            RedOp::Sum,
        );
        if !real() {
            let e = got.expect_err("no kernels on the fake driver");
            let cause = nccl_rs::cuda::CudaError::of(&e)
                .expect("a CUDA error")
                .to_string();
            assert!(cause.contains("NCCL_CUDA_REDUCE=gpu"), "{cause}");
            // The communicator is still usable, with host reductions.
            st.set_device_reduce(DeviceReduce::Host);
            try_coll(
                st,
                comm,
                s,
                RawColl::AllReduce,
                &send,
                &out,
                100,
                RedOp::Sum,
            )
            .unwrap();
        } else {
            got.unwrap();
        }
        same(&out.read(s), &[3; 100], &format!("rank {r}: all-reduce"));
    });
}

#[test]
fn gpu_float_reductions_fold_in_rank_order() {
    if !real() {
        println!("SKIPPED: needs a real GPU (NCCL_RS_CUDA_TESTS=real)");
        return;
    }
    if let Err(e) = nccl_rs::cuda::device_reduce_probe() {
        println!("SKIPPED: no GPU reduction kernels: {e}");
        return;
    }
    ranks(3, |r, comm, s, st| {
        st.set_device_reduce(DeviceReduce::Gpu);
        let (n, c) = (3usize, 3001usize);
        let at = |q: usize, i: usize| {
            let x = ((q * 7919 + i * 104729) % 65537) as f32;
            (x - 32768.0) / 7.0 * if i.is_multiple_of(5) { 1e-30 } else { 1.0 }
        };
        let mine: Vec<f32> = (0..c).map(|i| at(r, i)).collect();
        let send = Dev::from(&mine, s);
        for op in [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg] {
            let out = Dev::<f32>::zeros(c, s);
            let args = RawArgs {
                coll: RawColl::AllReduce,
                send: send.ptr().cast_const(),
                recv: out.ptr(),
                count: c,
                dtype: DataType::Float32,
                op,
                root: 0,
            };
            // SAFETY: device allocations of `c` floats.
            unsafe { st.collective(comm, &args, s.id(), None) }.unwrap();
            let want: Vec<u32> = (0..c)
                .map(|i| {
                    let mut acc = at(0, i);
                    for q in 1..n {
                        let x = at(q, i);
                        acc = match op {
                            RedOp::Prod => acc * x,
                            RedOp::Max => acc.max(x),
                            RedOp::Min => acc.min(x),
                            _ => acc + x,
                        };
                    }
                    if op == RedOp::Avg {
                        acc /= n as f32;
                    }
                    acc.to_bits()
                })
                .collect();
            let got: Vec<u32> = out.read(s).iter().map(|x| x.to_bits()).collect();
            same(
                &got,
                &want,
                &format!("rank {r}: f32 all-reduce {op} on the GPU"),
            );
        }
    });
}
