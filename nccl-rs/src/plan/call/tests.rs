//! Decision tables of the call plan: given these facts, this plan.

use super::*;
use crate::plan::Planner;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const F32: DataType = DataType::Float32;
/// The streaming size of the tables' host (half a 32 MiB cache).
const STREAM: usize = 16 * MIB;
const CHUNK: usize = 512 * KIB;

/// Two ranks on their own CPUs of one host, over shared memory.
fn pair() -> Topology {
    Topology {
        nranks: 2,
        rank: 0,
        single_copy: true,
        oversubscribed: false,
        sockets: false,
        single_copy_max: 2 * MIB,
        stream_from: STREAM,
        chunk_bytes: CHUNK,
        placement: Placement::Near,
        sharing_cpu: 0,
    }
}

/// Four ranks on two CPUs.
fn crowded() -> Topology {
    Topology {
        nranks: 4,
        oversubscribed: true,
        placement: Placement::Unknown,
        ..pair()
    }
}

/// Four ranks on four hosts, over sockets.
fn hosts() -> Topology {
    Topology {
        nranks: 4,
        single_copy: false,
        sockets: true,
        placement: Placement::Unknown,
        ..pair()
    }
}

/// A collective of `bytes` output from a heap buffer, out of place.
fn coll(c: Coll, in_bytes: usize, out_bytes: usize) -> CallFacts {
    CallFacts {
        coll: Some(c),
        dtype: F32,
        in_bytes,
        out_bytes,
        overlaps: false,
        in_place: false,
        exact_in_place: false,
        input_heap: true,
        sends_mapped: false,
    }
}

fn all_gather(t: &Topology, out_bytes: usize) -> CallFacts {
    let send_count = out_bytes / t.nranks / 4;
    coll(
        Coll::AllGather { send_count },
        out_bytes / t.nranks,
        out_bytes,
    )
}

fn all_to_all(t: &Topology, bytes: usize) -> CallFacts {
    coll(
        Coll::AllToAll {
            count: bytes / t.nranks / 4,
        },
        bytes,
        bytes,
    )
}

fn broadcast(bytes: usize) -> CallFacts {
    coll(
        Coll::Broadcast {
            count: bytes / 4,
            root: 0,
        },
        bytes,
        bytes,
    )
}

fn all_reduce(bytes: usize) -> CallFacts {
    coll(Coll::AllReduce { count: bytes / 4 }, bytes, bytes)
}

fn plan(t: &Topology, c: &CallFacts, p: Placement) -> CallPlan {
    let planner = Planner::new("SHM", None, None).unwrap();
    plan_with(&planner, t, c, p)
}

fn plan_with(planner: &Planner, t: &Topology, c: &CallFacts, p: Placement) -> CallPlan {
    let coll = c.coll;
    let mut shaped = |shape| match coll {
        Some(coll) => {
            let sched = schedule_of(planner, coll, shape, t.nranks, t.rank, c.dtype);
            Shaped::of(planner, coll, shape, t.nranks, c.dtype, &sched)
        }
        None => Shaped {
            facts: SchedFacts {
                receives: true,
                one_message_per_peer: true,
                ..SchedFacts::default()
            },
            algo: Choice::RING,
        },
    };
    plan_call(planner, t, c, p, &mut shaped)
}

/// What a row checks: the shape's kind, the staging, and the messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Row {
    shape: &'static str,
    staging: Staging,
    single_copy: bool,
    ring_max: usize,
    ring_stores: Stores,
    recv_stores: Stores,
}

fn row(p: &CallPlan) -> Row {
    Row {
        shape: match p.shape {
            Shape::Chunked(_) => "chunked",
            Shape::DirectAllGather => "one hop",
            Shape::InPlaceAllToAll(_) => "in place",
        },
        staging: p.staging,
        single_copy: p.messages.single_copy,
        ring_max: p.messages.ring_max,
        ring_stores: p.messages.ring_stores,
        recv_stores: p.messages.recv_stores,
    }
}

const PLAIN: Stores = Stores::Plain;
const STREAMED: Stores = Stores::Streaming;
const NEAR: Placement = Placement::Near;
const APART: Placement = Placement::Apart;
const UNKNOWN: Placement = Placement::Unknown;

fn expect(shape: &'static str, staging: Staging, single_copy: bool) -> Row {
    Row {
        shape,
        staging,
        single_copy,
        ring_max: 0,
        ring_stores: PLAIN,
        recv_stores: PLAIN,
    }
}

impl Row {
    /// Near, on a rank that also receives.
    fn near(self) -> Row {
        Row {
            ring_max: APART_RING_MAX_BYTES,
            ..self
        }
    }
    /// Near, on a rank that only sends.
    fn near_sender(self) -> Row {
        Row {
            ring_max: NEAR_RING_MAX_BYTES,
            ..self
        }
    }
    fn apart(self) -> Row {
        Row {
            ring_max: APART_RING_MAX_BYTES,
            ring_stores: STREAMED,
            ..self
        }
    }
    fn streams_output(self) -> Row {
        Row {
            recv_stores: STREAMED,
            ..self
        }
    }
}

#[test]
fn two_ranks_on_their_own_cpus() {
    let t = pair();
    let none = Staging::None;
    #[rustfmt::skip]
    let table = [
        // All-gather: one hop single copy below the streaming size, the
        // ring in chunks from it (streamed while apart).
        (all_gather(&t, 64 * KIB), NEAR, expect("one hop", none, true).near()),
        (all_gather(&t, 64 * KIB), APART, expect("one hop", none, true).apart()),
        (all_gather(&t, 64 * KIB), UNKNOWN, expect("one hop", none, true)),
        (all_gather(&t, STREAM), NEAR, expect("chunked", none, false).near().streams_output()),
        (all_gather(&t, STREAM), APART, expect("chunked", none, false).apart().streams_output()),
        // All-to-all: whole blocks single copy, but the ring in chunks
        // while near at the streaming size; there, apart, sent from a
        // streamed copy in shared staging.
        (all_to_all(&t, MIB), NEAR, expect("chunked", none, true).near()),
        (all_to_all(&t, STREAM), NEAR, expect("chunked", none, false).near().streams_output()),
        (all_to_all(&t, STREAM), APART,
            expect("in place", Staging::OtherBlocksOwnToOutput(STREAMED), true).apart().streams_output()),
        // Broadcast: one message, single copy, the root helping.
        (broadcast(64 * MIB), NEAR, expect("chunked", none, true).near_sender().streams_output()),
        (broadcast(KIB), APART, expect("chunked", none, true).apart()),
        // All-reduce: never single copy; streamed ring stores while apart.
        (all_reduce(MIB), NEAR, expect("chunked", none, false).near()),
        (all_reduce(STREAM), APART, expect("chunked", none, false).apart()),
    ];
    for (call, placement, want) in table {
        let got = plan(&t, &call, placement);
        assert_eq!(row(&got), want, "{:?} {placement:?}", call.coll);
    }
}

#[test]
fn more_local_ranks_than_cpus() {
    let t = crowded();
    let none = Staging::None;
    #[rustfmt::skip]
    let table = [
        // All-to-all above 64 KiB: whole blocks from shared staging.
        (all_to_all(&t, 64 * KIB), expect("chunked", none, false)),
        // Staging streams from 2 MiB of input.
        (all_to_all(&t, MIB), expect("in place", Staging::OtherBlocksOwnToOutput(PLAIN), true)),
        (all_to_all(&t, 2 * MIB - 4), expect("in place", Staging::OtherBlocksOwnToOutput(PLAIN), true)),
        (all_to_all(&t, 2 * MIB), expect("in place", Staging::OtherBlocksOwnToOutput(STREAMED), true)),
        (all_to_all(&t, 4 * MIB), expect("in place", Staging::OtherBlocksOwnToOutput(STREAMED), true)),
        // All-gather above 64 KiB: one hop from shared staging, copied in
        // with plain stores at any size (every other rank reads it next).
        (all_gather(&t, 64 * KIB), expect("chunked", none, false)),
        (all_gather(&t, MIB), expect("one hop", Staging::Input(PLAIN), true)),
        (all_gather(&t, 8 * MIB), expect("one hop", Staging::Input(PLAIN), true)),
        (all_gather(&t, 16 * MIB), expect("one hop", Staging::Input(PLAIN), true).streams_output()),
        // Nothing else goes single copy.
        (broadcast(MIB), expect("chunked", none, false)),
        (all_reduce(MIB), expect("chunked", none, false)),
    ];
    for (call, want) in table {
        for placement in [NEAR, APART, UNKNOWN] {
            let got = plan(&t, &call, placement);
            assert_eq!(row(&got), want, "{:?} {placement:?}", call.coll);
        }
    }
}

#[test]
fn ranks_on_other_hosts() {
    let t = hosts();
    let got = plan(&t, &broadcast(8 * MIB), UNKNOWN);
    assert_eq!(
        got.shape,
        Shape::Chunked(SOCKET_BROADCAST_CHUNK_BYTES / 4),
        "broadcast over sockets in large chunks"
    );
    // Every peer remote: all-to-all keeps the cap, in the planner's chunks.
    let small = plan(&t, &all_to_all(&t, MIB), UNKNOWN);
    assert_eq!(row(&small), expect("chunked", Staging::None, true));
    assert_eq!(small.shape, Shape::Chunked(CHUNK / 4));
    let large = plan(&t, &all_to_all(&t, 4 * MIB), UNKNOWN);
    assert_eq!(row(&large), expect("chunked", Staging::None, false));
    assert_eq!(
        plan(&t, &all_gather(&t, MIB), UNKNOWN).shape,
        Shape::Chunked(CHUNK / 4)
    );
}

#[test]
fn in_place_all_to_all_stages_the_other_blocks() {
    let t = pair();
    let mut c = all_to_all(&t, MIB);
    c.overlaps = true;
    c.in_place = true;
    c.exact_in_place = true;
    let got = plan(&t, &c, NEAR);
    assert_eq!(got.staging, Staging::OtherBlocks(PLAIN));
    assert!(matches!(got.shape, Shape::InPlaceAllToAll(_)));
    // Overlapping but not exactly in place: the whole input is copied.
    c.exact_in_place = false;
    let got = plan(&t, &c, NEAR);
    assert_eq!(got.staging, Staging::Input(PLAIN));
    assert!(matches!(got.shape, Shape::Chunked(_)));
}

#[test]
fn shared_or_huge_inputs_are_not_staged() {
    let t = crowded();
    for mut c in [all_to_all(&t, MIB), all_gather(&t, MIB)] {
        c.input_heap = false;
        assert_eq!(plan(&t, &c, UNKNOWN).staging, Staging::None, "{c:?}");
    }
}

#[test]
fn single_copy_cap_for_copies_and_groups() {
    let t = Topology {
        nranks: 3,
        placement: UNKNOWN,
        ..pair()
    };
    // Three ranks: all-gather takes the ring, single copy up to the cap.
    assert!(
        plan(&t, &all_gather(&t, 3 * 512 * KIB), UNKNOWN)
            .messages
            .single_copy
    );
    assert!(
        !plan(&t, &all_gather(&t, 3 * MIB), UNKNOWN)
            .messages
            .single_copy
    );
    // A rank that only sends: a quarter of the cap.
    let b = plan(&t, &broadcast(MIB), UNKNOWN);
    assert!(!b.messages.single_copy, "the root only sends");
    let group = |out_bytes, sends_mapped| CallFacts {
        coll: None,
        dtype: DataType::Uint8,
        in_bytes: 0,
        out_bytes,
        overlaps: false,
        in_place: false,
        exact_in_place: false,
        input_heap: false,
        sends_mapped,
    };
    assert!(
        plan(&t, &group(2 * MIB, false), UNKNOWN)
            .messages
            .single_copy
    );
    assert!(
        !plan(&t, &group(2 * MIB + 1, false), UNKNOWN)
            .messages
            .single_copy
    );
    assert!(
        plan(&t, &group(64 * MIB, true), UNKNOWN)
            .messages
            .single_copy,
        "from shared buffers at any size"
    );
    let crowded = crowded();
    assert!(
        !plan(&crowded, &group(KIB, true), UNKNOWN)
            .messages
            .single_copy
    );
}

#[test]
fn nccl_algo_can_rule_out_the_one_hop_all_gather() {
    let t = pair();
    let ring = Planner::new("SHM", Some("allgather:ring"), None).unwrap();
    let got = plan_with(&ring, &t, &all_gather(&t, 64 * KIB), NEAR);
    assert_eq!(got.shape, Shape::Chunked(CHUNK / 4));
    assert_eq!(got.algo, Choice::RING);
    // The ring's messages go single copy under the cap rule.
    assert!(got.messages.single_copy);
    let big = plan_with(&ring, &t, &all_gather(&t, 4 * MIB), NEAR);
    assert!(!big.messages.single_copy);
    let got = plan(&t, &all_gather(&t, 64 * KIB), NEAR);
    assert_eq!(got.algo, Choice::DIRECT);
}

#[test]
fn placement_matters_only_between_two_ranks_on_their_own_cpus() {
    let t = pair();
    let big = all_gather(&t, STREAM);
    assert_eq!(placement_matters(&t, &big, 5), Some(true), "every call");
    let mid = broadcast(64 * KIB);
    assert_eq!(placement_matters(&t, &mid, 0), Some(true));
    assert_eq!(placement_matters(&t, &mid, 1), Some(false), "reuses");
    assert_eq!(placement_matters(&t, &mid, PLACEMENT_EVERY), Some(true));
    assert_eq!(placement_matters(&t, &broadcast(KIB), 0), None, "tiny");
    assert_eq!(placement_matters(&crowded(), &big, 0), None);
    assert_eq!(placement_matters(&hosts(), &big, 0), None);
    let three = Topology { nranks: 3, ..t };
    assert_eq!(placement_matters(&three, &big, 0), None);
}

#[test]
fn senders_are_idle_only_with_nothing_else_to_do() {
    let t = Topology {
        nranks: 3,
        ..pair()
    };
    // The broadcast root of a chain only sends (in place: no local copy,
    // or a copy of a large output, better done after the sends).
    let mut in_place = broadcast(MIB);
    in_place.in_place = true;
    let root = plan(&t, &in_place, NEAR);
    assert!(root.messages.sender_idle && !root.messages.receives);
    assert!(plan(&t, &broadcast(2 * MIB), NEAR).messages.sender_idle);
    assert!(!plan(&t, &broadcast(MIB), NEAR).messages.sender_idle);
    // An all-gather rank also receives.
    let ag = plan(&t, &all_gather(&t, 3 * MIB), NEAR);
    assert!(!ag.messages.sender_idle && ag.messages.receives);
}

#[test]
fn message_paths() {
    let m = Messages {
        single_copy: true,
        ring_max: 64 * KIB,
        ring_stores: STREAMED,
        ..Messages::default()
    };
    assert_eq!(m.path(64 * KIB, 16 * KIB), Path::Ring(STREAMED));
    assert_eq!(m.path(64 * KIB + 1, 16 * KIB), Path::SingleCopy);
    let ring_only = Messages {
        single_copy: false,
        ..m
    };
    assert_eq!(ring_only.path(MIB, 16 * KIB), Path::Ring(STREAMED));
}

#[test]
fn link_classes_order_their_costs() {
    let shm = LinkClass::SharedMemory.model();
    let leaf = LinkClass::SameLeaf.model();
    let spine = LinkClass::Spine {
        oversubscription: 4.0,
    }
    .model();
    assert!(shm.alpha < leaf.alpha && leaf.alpha < spine.alpha);
    assert!(spine.beta < leaf.beta);
    assert_eq!(LinkClass::of_transport("SHM"), LinkClass::SharedMemory);
    assert_eq!(LinkClass::of_transport("Socket"), LinkClass::SameLeaf);
}

#[test]
fn own_copies_stream_from_the_streaming_size() {
    let t = pair();
    for (bytes, want) in [(STREAM - 4, PLAIN), (STREAM, STREAMED)] {
        let got = plan(&t, &all_reduce(bytes), NEAR);
        assert_eq!(got.messages.copy_stores, want, "{bytes}");
    }
}

#[test]
fn the_heap_lookup_is_asked_only_where_staging_can_follow() {
    let (p, c) = (pair(), crowded());
    let ag = Coll::AllGather { send_count: 1 };
    let a2a = Coll::AllToAll { count: 1 };
    assert!(
        !may_stage(&p, ag, MIB),
        "two ranks never stage an all-gather"
    );
    assert!(may_stage(&c, ag, MIB));
    assert!(!may_stage(&p, a2a, MIB) && may_stage(&p, a2a, STREAM));
    assert!(may_stage(&c, a2a, KIB));
    assert!(!may_stage(&c, a2a, 0));
    assert!(!may_stage(&hosts(), a2a, STREAM));
    assert!(!may_stage(&c, Coll::Broadcast { count: 1, root: 0 }, MIB));
}

#[test]
fn readers_on_the_same_cpu_take_plain_staged_blocks() {
    // Rank 0 of four on two CPUs shares its CPU with rank 2.
    let t = Topology {
        sharing_cpu: 1 << 2,
        ..crowded()
    };
    let got = plan(&t, &all_to_all(&t, 4 * MIB), UNKNOWN);
    assert_eq!(got.staging, Staging::OtherBlocksOwnToOutput(STREAMED));
    assert_eq!(got.staging_plain_for, 1 << 2);
    // Below the streaming size every block goes plain anyway.
    let got = plan(&t, &all_to_all(&t, MIB), UNKNOWN);
    assert_eq!(
        (got.staging, got.staging_plain_for),
        (Staging::OtherBlocksOwnToOutput(PLAIN), 0)
    );
    // One copy that every reader takes next: plain for all.
    let ag = plan(&t, &all_gather(&t, 16 * MIB), UNKNOWN);
    assert_eq!(
        (ag.staging, ag.staging_plain_for),
        (Staging::Input(PLAIN), 0)
    );
}

/// A rooted collective's buffers differ by rank (only the root's output is
/// whole): whether placement is measured must not, or one rank would run
/// the probe's round trips against the other's data.
#[test]
fn every_rank_of_a_rooted_call_agrees_on_measuring_placement() {
    let t = pair();
    let count = 512 * 1024;
    for coll in [
        Coll::Gather { count, root: 0 },
        Coll::Scatter { count, root: 0 },
        Coll::Broadcast { count, root: 0 },
        Coll::Reduce { count, root: 0 },
    ] {
        let root = coll_facts(coll, 2 * count * 4, 2 * count * 4);
        let other = coll_facts(coll, count * 4, 0);
        for seq in [0, 1, PLACEMENT_EVERY] {
            assert_eq!(
                placement_matters(&t, &root, seq),
                placement_matters(&t, &other, seq),
                "{coll:?} call {seq}"
            );
        }
    }
}

fn coll_facts(c: Coll, in_bytes: usize, out_bytes: usize) -> CallFacts {
    coll(c, in_bytes, out_bytes)
}
