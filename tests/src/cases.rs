//! The test matrix: every collective × datatype × op × in/out-of-place ×
//! count × root, and the code that runs one case and counts wrong elements.

use crate::data::{count_wrong, move_input, reduce_expected, reduce_input, TestElem};
use half::{bf16, f16};
use nccl_rs::fp8::{F8E4M3, F8E5M2};
use nccl_rs::{Communicator, DataType, P2pGroup, RedOp, ShmBuffer};
use std::sync::OnceLock;

/// The collectives under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coll {
    /// all_reduce.
    AllReduce,
    /// reduce_scatter (count per rank).
    ReduceScatter,
    /// reduce to a root.
    Reduce,
    /// all_gather (count per rank).
    AllGather,
    /// broadcast from a root.
    Broadcast,
    /// all_to_all (count per peer).
    AllToAll,
    /// gather to a root (count per rank).
    Gather,
    /// scatter from a root (count per rank).
    Scatter,
    /// send to the next rank, receive from the previous, in one group.
    SendRecvRing,
    /// one group sending to and receiving from every other rank.
    SendRecvAll,
}

impl Coll {
    /// Every collective.
    pub const ALL: [Coll; 10] = [
        Coll::AllReduce,
        Coll::ReduceScatter,
        Coll::Reduce,
        Coll::AllGather,
        Coll::Broadcast,
        Coll::AllToAll,
        Coll::Gather,
        Coll::Scatter,
        Coll::SendRecvRing,
        Coll::SendRecvAll,
    ];

    fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce)
    }

    fn has_in_place(self) -> bool {
        !matches!(
            self,
            Coll::Gather | Coll::Scatter | Coll::SendRecvRing | Coll::SendRecvAll
        )
    }

    fn rooted(self) -> bool {
        matches!(
            self,
            Coll::Reduce | Coll::Broadcast | Coll::Gather | Coll::Scatter
        )
    }
}

/// One test case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Case {
    /// Collective.
    pub coll: Coll,
    /// Element type.
    pub dtype: DataType,
    /// Reduction (reducing collectives only).
    pub op: Option<RedOp>,
    /// In place.
    pub in_place: bool,
    /// Elements (per rank or per peer where the collective says so).
    pub count: usize,
    /// Root (rooted collectives).
    pub root: usize,
}

/// The counts of the matrix: including 0, 1, and counts that do not divide
/// by common world sizes.
pub const COUNTS: [usize; 5] = [0, 1, 7, 1023, 1_000_003];

/// One more count for all-to-all (elements per peer) and all-gather
/// (elements per rank): at 4 ranks their calls move 80 KiB (1-byte
/// elements) to 640 KiB (8-byte) per rank, where, with more local ranks
/// than CPUs, an out-of-place call sends its blocks single copy from a copy
/// in shared memory (all-to-all at every size, the copy with streaming
/// stores from 2 MiB of input, as in the large cases).
pub const STAGED_COUNT: usize = 20_011;

/// Every case for `n` ranks.
pub fn matrix(n: usize) -> Vec<Case> {
    let mut out = Vec::new();
    for coll in Coll::ALL {
        if matches!(coll, Coll::SendRecvRing | Coll::SendRecvAll) && n == 1 {
            continue;
        }
        for dtype in DataType::ALL {
            let ops: Vec<Option<RedOp>> = if coll.reduces() {
                RedOp::ALL.map(Some).to_vec()
            } else {
                vec![None]
            };
            for op in ops {
                for in_place in [false, true] {
                    if in_place && !coll.has_in_place() {
                        continue;
                    }
                    let extra = match coll {
                        Coll::AllToAll | Coll::AllGather => Some(STAGED_COUNT),
                        _ => None,
                    };
                    for count in COUNTS.into_iter().chain(extra) {
                        let root = if coll.rooted() {
                            (out.len() * 7 + 3) % n
                        } else {
                            0
                        };
                        out.push(Case {
                            coll,
                            dtype,
                            op,
                            in_place,
                            count,
                            root,
                        });
                    }
                }
            }
        }
    }
    out
}

/// The cases to run: all of them when `full`, else every case with fewer
/// than 100000 elements plus a seeded 1-in-`large_every` sample of the rest
/// (at least one large case per collective).
pub fn select(cases: &[Case], seed: u64, full: bool, large_every: u64) -> Vec<Case> {
    let mut seen = Vec::new();
    cases
        .iter()
        .enumerate()
        .filter(|(i, c)| {
            if full || c.count < 100_000 {
                return true;
            }
            let h = (*i as u64 ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            let first = !seen.contains(&c.coll);
            if first || h % large_every == 0 {
                seen.push(c.coll);
                return true;
            }
            false
        })
        .map(|(_, c)| *c)
        .collect()
}

/// Runs `case` on `comm`; returns the number of wrong elements.
pub fn run(comm: &mut Communicator, case: &Case, seed: u64) -> nccl_rs::Result<usize> {
    CASES_STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    match case.dtype {
        DataType::Int8 => run_typed::<i8>(comm, case, seed),
        DataType::Uint8 => run_typed::<u8>(comm, case, seed),
        DataType::Int32 => run_typed::<i32>(comm, case, seed),
        DataType::Uint32 => run_typed::<u32>(comm, case, seed),
        DataType::Int64 => run_typed::<i64>(comm, case, seed),
        DataType::Uint64 => run_typed::<u64>(comm, case, seed),
        DataType::Float16 => run_typed::<f16>(comm, case, seed),
        DataType::Float32 => run_typed::<f32>(comm, case, seed),
        DataType::Float64 => run_typed::<f64>(comm, case, seed),
        DataType::Bfloat16 => run_typed::<bf16>(comm, case, seed),
        DataType::Float8e4m3 => run_typed::<F8E4M3>(comm, case, seed),
        DataType::Float8e5m2 => run_typed::<F8E5M2>(comm, case, seed),
    }
}

/// Where `run` allocates the buffers it passes to collectives, from
/// `NCCL_RS_TEST_BUFFERS` (read once): `vec` (default), `shared` (every
/// buffer an [`ShmBuffer`], so co-located ranks take the zero-copy path) or
/// `mixed` (shared on every rank but rank 1, which forces the fallback), or
/// `mixed-then-shared` (`mixed` for the first [`MIXED_CASES`] cases, then
/// `shared`: the zero-copy path must come back after its fallbacks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferMode {
    /// `Vec<T>` on every rank.
    Vec,
    /// `ShmBuffer<T>` on every rank.
    Shared,
    /// `ShmBuffer<T>` on every rank except rank 1 (`Vec<T>`).
    Mixed,
    /// `Mixed` for the first [`MIXED_CASES`] cases run, then `Shared`.
    MixedThenShared,
}

/// Cases run in `MixedThenShared` mode before every rank goes shared.
pub const MIXED_CASES: usize = 100;

/// Cases started by [`run`] in this process (every rank runs the same ones
/// in the same order).
static CASES_STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl BufferMode {
    /// The mode named by `NCCL_RS_TEST_BUFFERS`, read on first use.
    pub fn from_env() -> BufferMode {
        static MODE: OnceLock<BufferMode> = OnceLock::new();
        *MODE.get_or_init(|| {
            match std::env::var("NCCL_RS_TEST_BUFFERS")
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
                .as_str()
            {
                "" | "vec" => BufferMode::Vec,
                "shared" | "shm" => BufferMode::Shared,
                "mixed" => BufferMode::Mixed,
                "mixed-then-shared" => BufferMode::MixedThenShared,
                other => panic!(
                    "NCCL_RS_TEST_BUFFERS={other:?}: expected vec, shared, mixed or mixed-then-shared"
                ),
            }
        })
    }

    /// Whether `rank` allocates shared buffers.
    pub fn shared_on(self, rank: usize) -> bool {
        match self {
            BufferMode::Vec => false,
            BufferMode::Shared => true,
            BufferMode::Mixed => rank != 1,
            BufferMode::MixedThenShared => {
                rank != 1 || CASES_STARTED.load(std::sync::atomic::Ordering::Relaxed) > MIXED_CASES
            }
        }
    }
}

/// A test buffer: a `Vec<T>` or an [`ShmBuffer<T>`] with the same contents.
pub enum Buf<T: TestElem> {
    /// Ordinary heap memory.
    Vec(Vec<T>),
    /// Shared host memory.
    Shm(ShmBuffer<T>),
}

impl<T: TestElem> Buf<T> {
    /// `data` as a shared buffer when `shared`, else as it is.
    pub fn new(data: Vec<T>, shared: bool) -> nccl_rs::Result<Buf<T>> {
        if !shared {
            return Ok(Buf::Vec(data));
        }
        let mut b = ShmBuffer::<T>::zeroed(data.len())?;
        b.copy_from_slice(&data);
        Ok(Buf::Shm(b))
    }

    /// A copy of the same kind.
    pub fn duplicate(&self) -> nccl_rs::Result<Buf<T>> {
        Buf::new(self.to_vec(), matches!(self, Buf::Shm(_)))
    }
}

impl<T: TestElem> std::ops::Deref for Buf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Buf::Vec(v) => v,
            Buf::Shm(s) => s,
        }
    }
}

impl<T: TestElem> std::ops::DerefMut for Buf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Buf::Vec(v) => v,
            Buf::Shm(s) => s,
        }
    }
}

fn sentinel<T: TestElem>(len: usize) -> Vec<T> {
    (0..len).map(|i| move_input(0xDEAD, i, 0)).collect()
}

fn run_typed<T: TestElem>(
    comm: &mut Communicator,
    case: &Case,
    seed: u64,
) -> nccl_rs::Result<usize> {
    let (n, rank, c, root) = (comm.size(), comm.rank(), case.count, case.root);
    let op = case.op.unwrap_or(RedOp::Sum);
    let shared = BufferMode::from_env().shared_on(rank);
    // Every buffer handed to a collective comes from `alloc`.
    let alloc = |v: Vec<T>| Buf::new(v, shared);
    let red = |len: usize| -> nccl_rs::Result<Buf<T>> {
        alloc((0..len).map(|i| reduce_input(op, rank, i, seed)).collect())
    };
    let sent = |len: usize| alloc(sentinel(len));
    let want_red = |i: usize| -> T { reduce_expected(op, n, i, seed) };
    let mv = |r: usize, i: usize| -> T { move_input(r, i, seed) };
    let untouched = |got: &[T], orig: &[T]| {
        got.iter()
            .zip(orig)
            .filter(|(a, b)| bytemuck::bytes_of(*a) != bytemuck::bytes_of(*b))
            .count()
    };
    Ok(match (case.coll, case.in_place) {
        (Coll::AllReduce, false) => {
            let mut recv = sent(c)?;
            comm.all_reduce(&red(c)?, &mut recv, op)?;
            count_wrong(&recv, want_red, case.op)
        }
        (Coll::AllReduce, true) => {
            let mut buf = red(c)?;
            comm.all_reduce_in_place(&mut buf, op)?;
            count_wrong(&buf, want_red, case.op)
        }
        (Coll::ReduceScatter, false) => {
            let mut recv = sent(c)?;
            comm.reduce_scatter(&red(n * c)?, &mut recv, op)?;
            count_wrong(&recv, |i| want_red(rank * c + i), case.op)
        }
        (Coll::ReduceScatter, true) => {
            let mut buf = red(n * c)?;
            comm.reduce_scatter_in_place(&mut buf, op)?;
            count_wrong(
                &buf[rank * c..(rank + 1) * c],
                |i| want_red(rank * c + i),
                case.op,
            )
        }
        (Coll::Reduce, in_place) => {
            let input = red(c)?;
            let mut out = if in_place {
                input.duplicate()?
            } else {
                sent(c)?
            };
            let orig = out.to_vec();
            if in_place {
                comm.reduce_in_place(&mut out, op, root)?;
            } else {
                comm.reduce(&input, &mut out, op, root)?;
            }
            if rank == root {
                count_wrong(&out, want_red, case.op)
            } else {
                untouched(&out, &orig)
            }
        }
        (Coll::AllGather, false) => {
            let send = alloc((0..c).map(|i| mv(rank, rank * c + i)).collect())?;
            let mut recv = sent(n * c)?;
            comm.all_gather(&send, &mut recv)?;
            count_wrong(&recv, |j| mv(j / c.max(1), j), None)
        }
        (Coll::AllGather, true) => {
            let mut buf = sent(n * c)?;
            for i in 0..c {
                buf[rank * c + i] = mv(rank, rank * c + i);
            }
            comm.all_gather_in_place(&mut buf)?;
            count_wrong(&buf, |j| mv(j / c.max(1), j), None)
        }
        (Coll::Broadcast, in_place) => {
            let send = alloc((0..c).map(|i| mv(root, i)).collect())?;
            let mut buf = if in_place && rank == root {
                send.duplicate()?
            } else {
                sent(c)?
            };
            if in_place {
                comm.broadcast_in_place(&mut buf, root)?;
            } else {
                comm.broadcast(&send, &mut buf, root)?;
            }
            count_wrong(&buf, |i| mv(root, i), None)
        }
        (Coll::AllToAll, in_place) => {
            let send = alloc((0..n * c).map(|j| mv(rank, j)).collect())?;
            let want = |j: usize| mv(j / c.max(1), rank * c + j % c.max(1));
            if in_place {
                let mut buf = send;
                comm.all_to_all_in_place(&mut buf)?;
                count_wrong(&buf, want, None)
            } else {
                let mut recv = sent(n * c)?;
                comm.all_to_all(&send, &mut recv)?;
                count_wrong(&recv, want, None)
            }
        }
        (Coll::Gather, _) => {
            let send = alloc((0..c).map(|i| mv(rank, rank * c + i)).collect())?;
            let mut recv = if rank == root {
                sent(n * c)?
            } else {
                alloc(Vec::new())?
            };
            comm.gather(&send, &mut recv, root)?;
            count_wrong(&recv, |j| mv(j / c.max(1), j), None)
        }
        (Coll::Scatter, _) => {
            let send = if rank == root {
                alloc((0..n * c).map(|j| mv(root, j)).collect())?
            } else {
                alloc(Vec::new())?
            };
            let mut recv = sent(c)?;
            comm.scatter(&send, &mut recv, root)?;
            count_wrong(&recv, |i| mv(root, rank * c + i), None)
        }
        (Coll::SendRecvRing, _) => {
            let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
            let send = alloc((0..c).map(|i| mv(rank, i)).collect())?;
            let mut recv = sent(c)?;
            let mut g = P2pGroup::new();
            g.recv(&mut recv, prev);
            g.send(&send, next);
            comm.run_group(g)?;
            count_wrong(&recv, |i| mv(prev, i), None)
        }
        (Coll::SendRecvAll, _) => {
            let send = alloc((0..n * c).map(|j| mv(rank, j)).collect())?;
            let mut recv = sent(n * c)?;
            let mut g = P2pGroup::new();
            let mut rest: &mut [T] = &mut recv;
            for p in 0..n {
                let (mine, tail) = rest.split_at_mut(c);
                rest = tail;
                if p != rank {
                    g.recv(mine, p);
                    g.send(&send[p * c..(p + 1) * c], p);
                }
            }
            comm.run_group(g)?;
            let want = |j: usize| {
                if j / c.max(1) == rank {
                    move_input(0xDEAD, j, 0)
                } else {
                    mv(j / c.max(1), rank * c + j % c.max(1))
                }
            };
            count_wrong(&recv, want, None)
        }
    })
}
