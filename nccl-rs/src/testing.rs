//! The test harnesses of this crate's unit tests and of the workspace's
//! integration tests (the `testing` feature), kept in one place: ranks as
//! threads of one process, over TCP on loopback or the in-memory transport
//! ([`MemNet`]); and transport links wired in a full mesh, for engines
//! driven by one thread; the shared-memory transport's test helpers
//! ([`shm`]) and its peer in another process ([`peer`]). Not part of the
//! API.

pub mod peer;
pub mod shm;

use crate::transport::mem::MemNet;
use crate::transport::{Net, RecvComm, SendComm};
use crate::{Communicator, Config, UniqueId};
use std::sync::Arc;
use std::time::Duration;

/// A configuration for ranks on this machine: TCP on loopback, and
/// `timeout` for operations and for the bootstrap.
pub fn loopback(timeout: Duration) -> Config {
    Config {
        socket_ifname: Some("lo".into()),
        timeout,
        bootstrap_timeout: timeout,
        ..Config::default()
    }
}

/// The transport ranks run over in [`on_threads`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Over {
    /// The one `config` chooses (TCP on loopback with [`loopback`]).
    Config,
    /// The in-memory transport: no sockets between the ranks.
    Mem,
}

/// Runs `f(rank, comm)` on `n` ranks, each a thread of this process with
/// its own communicator of one job, and returns their results in rank
/// order.
///
/// # Panics
/// If a rank cannot join the job, or `f` panics on any rank.
pub fn on_threads<R: Send>(
    n: usize,
    config: &Config,
    over: Over,
    f: impl Fn(usize, Communicator) -> R + Sync,
) -> Vec<R> {
    let id = UniqueId::new(config).expect("a unique id");
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (id, f) = (&id, &f);
                s.spawn(move || {
                    let comm = match over {
                        Over::Config => Communicator::init(id, n, r, config),
                        Over::Mem => {
                            Communicator::init_with_net(id, n, r, config, Arc::new(MemNet::new()))
                        }
                    };
                    f(r, comm.unwrap_or_else(|e| panic!("rank {r} of {n}: {e}")))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// Each rank's sending and receiving ends, indexed by peer (`None` for
/// itself).
pub type Links = (
    Vec<Vec<Option<Box<dyn SendComm>>>>,
    Vec<Vec<Option<Box<dyn RecvComm>>>>,
);

/// Connects every ordered pair of `n` ranks over `net`, in this thread:
/// `send[a][b]` sends from `a` to `b` and `recv[b][a]` receives it there.
///
/// # Panics
/// If a connection fails or does not complete at once (as with
/// [`MemNet`]).
pub fn full_mesh(net: &dyn Net, n: usize) -> Links {
    let mut send: Vec<Vec<Option<Box<dyn SendComm>>>> =
        (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
    let mut recv: Vec<Vec<Option<Box<dyn RecvComm>>>> =
        (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
    for a in 0..n {
        for b in 0..n {
            if a != b {
                let mut l = net.listen().unwrap();
                let mut c = net.connect(l.handle()).unwrap();
                send[a][b] = c.poll_connect().unwrap();
                recv[b][a] = l.accept().unwrap();
            }
        }
    }
    (send, recv)
}

/// Engines of `n` ranks over a [`full_mesh`] of `net`, with slots of
/// `slot_bytes`, for a test to drive by hand in one thread.
#[cfg(test)]
pub(crate) fn engine_mesh(
    net: &dyn Net,
    n: usize,
    slot_bytes: usize,
) -> Vec<crate::engine::Engine> {
    let (send, recv) = full_mesh(net, n);
    send.into_iter()
        .zip(recv)
        .enumerate()
        .map(|(r, (s, v))| {
            crate::engine::Engine::new(r, n, s, v, slot_bytes, 4, Duration::from_secs(5))
        })
        .collect()
}

/// The call a test makes of `sched`: tag 1, no hints.
#[cfg(test)]
pub(crate) fn test_call(
    sched: &crate::schedule::Schedule,
    dtype: crate::DataType,
    op: crate::RedOp,
) -> crate::engine::Call<'_> {
    crate::engine::Call {
        sched,
        dtype,
        op,
        tag: 1,
        what: crate::engine::OpLabel::Test,
        hints: Default::default(),
    }
}

/// Runs one call on every rank of `engines` (an [`engine_mesh`]), round-robin
/// in this thread: rank `r` runs `scheds[r]` ([`test_call`]) with the
/// `(input, output)` regions `bufs[r]`, which must stay valid for the whole
/// call.
///
/// # Panics
/// If a rank fails, or the call has not finished on every rank within a
/// million rounds (the panic names `what`).
#[cfg(test)]
pub(crate) fn drive_engines(
    engines: &mut [crate::engine::Engine],
    scheds: &[crate::schedule::Schedule],
    dtype: crate::DataType,
    op: crate::RedOp,
    bufs: Vec<(crate::engine::Region, crate::engine::Region)>,
    what: &str,
) {
    assert!(engines.len() == scheds.len() && scheds.len() == bufs.len());
    let mut runs: Vec<_> = engines
        .iter_mut()
        .zip(scheds)
        .zip(bufs)
        .map(|((e, s), (input, output))| {
            let bufs = crate::engine::CallBufs {
                input,
                output,
                group: vec![],
            };
            e.start(test_call(s, dtype, op), bufs)
        })
        .collect();
    let mut done = vec![false; runs.len()];
    for _ in 0..1_000_000 {
        for (r, run) in runs.iter_mut().enumerate() {
            if !done[r] {
                done[r] = run.poll().unwrap().0;
            }
        }
        if done.iter().all(|d| *d) {
            return;
        }
    }
    panic!("{what}: did not finish within the step bound");
}

/// A small deterministic generator (xorshift64*) for test data: the same
/// seed gives the same sequence on every run.
pub struct Rng(pub u64);

impl Rng {
    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}
