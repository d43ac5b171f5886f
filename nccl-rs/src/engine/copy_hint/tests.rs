//! Tests of the single-copy policy and the copy hint.

use super::*;
use crate::datatype::{DataType, RedOp};
use crate::engine::Region;
use crate::schedule::{Loc, Schedule, Step};

const MIB: usize = 1 << 20;

fn allowed(coll: Option<Coll>, receives: bool, out_bytes: usize, p: SingleCopyPolicy) -> bool {
    let mut steps = vec![Step::Send {
        to: 1,
        src: Loc::In(0),
        count: 1,
    }];
    if receives {
        steps.push(Step::Recv {
            from: 1,
            dst: Loc::Out(0),
            count: 1,
        });
    }
    allowed_for(&Schedule { steps, scratch: 0 }, coll, out_bytes, p)
}

fn allowed_for(
    sched: &Schedule,
    coll: Option<Coll>,
    out_bytes: usize,
    p: SingleCopyPolicy,
) -> bool {
    let bufs = CallBufs {
        input: Region::empty(),
        output: Region::new(std::ptr::null_mut(), out_bytes),
        group: Vec::new(),
    };
    copy_hint(&call_of(sched, coll), &bufs, p).single_copy
}

/// A byte-sum call of `sched`: the collective `coll`, or a send/recv group.
fn call_of(sched: &Schedule, coll: Option<Coll>) -> Call<'_> {
    let what = match coll {
        Some(coll) => OpLabel::Coll {
            coll,
            dtype: DataType::Uint8,
            op: RedOp::Sum,
            seq: 1,
        },
        None => OpLabel::Group { ops: 2 },
    };
    Call {
        sched,
        dtype: DataType::Uint8,
        op: RedOp::Sum,
        tag: 1,
        what,
    }
}

#[test]
fn copy_only_calls_up_to_the_cap() {
    let p = SingleCopyPolicy {
        max_bytes: 2 * MIB,
        oversubscribed: false,
        uniform: false,
        pair: false,
        split: false,
        ring_from: usize::MAX,
        apart_ns: 0,
        placement: Placement::Unknown,
    };
    let ag = Some(Coll::AllGather { send_count: 1 });
    let a2a = Some(Coll::AllToAll { count: 1 });
    let ar = Some(Coll::AllReduce { count: 1 });
    let bc = Some(Coll::Broadcast { count: 1, root: 0 });
    assert!(allowed(ag, true, 2 * MIB, p));
    assert!(!allowed(ag, true, 2 * MIB + 1, p));
    assert!(!allowed(a2a, true, 16 * MIB, p));
    assert!(!allowed(ar, true, 1024, p), "reductions never");
    assert!(
        allowed(bc, false, MIB / 2, p),
        "a root: a quarter of the cap"
    );
    assert!(!allowed(bc, false, MIB, p));
    assert!(allowed(None, true, MIB, p), "send/recv groups");
}

#[test]
fn oversubscribed_all_to_all_only_in_its_window() {
    let p = SingleCopyPolicy {
        max_bytes: 2 * MIB,
        oversubscribed: true,
        uniform: false,
        pair: false,
        split: false,
        ring_from: usize::MAX,
        apart_ns: 0,
        placement: Placement::Unknown,
    };
    let a2a = Some(Coll::AllToAll { count: 1 });
    assert!(allowed(a2a, true, 4 * MIB, p));
    assert!(!allowed(a2a, true, 4 * MIB + 1, p));
    assert!(allowed(a2a, true, (64 << 10) + 1, p));
    assert!(!allowed(a2a, true, 64 << 10, p));
    let ag = Some(Coll::AllGather { send_count: 1 });
    assert!(!allowed(ag, true, 64 << 10, p));
    let bc = Some(Coll::Broadcast { count: 1, root: 0 });
    assert!(!allowed(bc, false, 64 << 10, p));
    assert!(!allowed(None, true, 64 << 10, p), "send/recv groups");
    assert!(!p.whole_blocks(MIB), "not agreed by every rank");
}

#[test]
fn one_host_all_to_all_at_any_size_in_whole_blocks() {
    let mut p = SingleCopyPolicy {
        max_bytes: 2 * MIB,
        oversubscribed: false,
        uniform: true,
        pair: false,
        split: false,
        ring_from: usize::MAX,
        apart_ns: 0,
        placement: Placement::Unknown,
    };
    let a2a = Some(Coll::AllToAll { count: 1 });
    assert!(allowed(a2a, true, 1 << 30, p));
    assert!(allowed(a2a, true, 1024, p));
    assert!(p.whole_blocks(1 << 30));
    assert!(!allowed(
        Some(Coll::AllGather { send_count: 1 }),
        true,
        4 * MIB,
        p
    ));
    p.oversubscribed = true;
    assert!(allowed(a2a, true, 1 << 30, p));
    assert!(!allowed(a2a, true, 64 << 10, p));
    assert!(!p.whole_blocks(64 << 10));
    assert!(p.whole_blocks(1 << 30));
}

#[test]
fn one_host_all_gather_in_one_hop() {
    let mut p = SingleCopyPolicy {
        max_bytes: 2 * MIB,
        oversubscribed: false,
        uniform: true,
        pair: true,
        split: false,
        ring_from: usize::MAX,
        apart_ns: 0,
        placement: Placement::Unknown,
    };
    let ag = Some(Coll::AllGather { send_count: 1 });
    assert!(p.whole_block_all_gather(1024));
    assert!(allowed(ag, true, 1 << 30, p));
    let bc = Some(Coll::Broadcast { count: 1, root: 0 });
    assert!(!allowed(bc, false, 4 * MIB, p), "broadcast keeps its cap");
    let send = Step::Send {
        to: 1,
        src: Loc::In(0),
        count: 1,
    };
    let chunked = Schedule {
        steps: vec![send, send],
        scratch: 0,
    };
    assert!(
        !allowed_for(&chunked, ag, 4 * MIB, p),
        "the ring in chunks keeps the cap"
    );
    p.pair = false;
    assert!(
        !p.whole_block_all_gather(4 * MIB),
        "3+ ranks, not oversubscribed"
    );
    assert!(!allowed(ag, true, 4 * MIB, p));
    p.oversubscribed = true;
    assert!(p.whole_block_all_gather((64 << 10) + 1));
    assert!(!p.whole_block_all_gather(64 << 10));
    assert!(allowed(ag, true, 1 << 30, p));
    p.uniform = false;
    assert!(!p.whole_block_all_gather(4 * MIB));
    assert!(!allowed(ag, true, 4 * MIB, p));
}

#[test]
fn two_rank_broadcast_goes_single_copy_when_the_root_helps() {
    let mut p = SingleCopyPolicy {
        max_bytes: 2 * MIB,
        oversubscribed: false,
        uniform: true,
        pair: true,
        split: true,
        ring_from: usize::MAX,
        apart_ns: 0,
        placement: Placement::Unknown,
    };
    let bc = Some(Coll::Broadcast { count: 1, root: 0 });
    assert!(allowed(bc, false, 1 << 30, p));
    assert!(allowed(bc, true, 1 << 30, p), "the receiving side too");
    p.split = false;
    assert!(!allowed(bc, false, MIB, p), "no help: the cap");
    p.split = true;
    p.pair = false;
    assert!(!allowed(bc, false, MIB, p), "3+ ranks relay");
    p.pair = true;
    p.uniform = false;
    assert!(!allowed(bc, false, MIB, p), "not every rank splits");
    p.uniform = true;
    p.oversubscribed = true;
    assert!(!allowed(bc, false, MIB, p));
}

/// The hint for a send/recv group of `steps` on `bufs` under `p`.
fn group_hint(steps: Vec<Step>, bufs: CallBufs, p: SingleCopyPolicy) -> CopyHint {
    let sched = Schedule { steps, scratch: 0 };
    copy_hint(&call_of(&sched, None), &bufs, p)
}

/// The hint for `steps` with input at `input` and `out_bytes` of output
/// at a fixed address.
fn hint_for(steps: Vec<Step>, input: usize, out_bytes: usize) -> CopyHint {
    let bufs = CallBufs {
        input: Region::new(input as *mut u8, out_bytes),
        output: Region::new(0x10000 as *mut u8, out_bytes),
        group: Vec::new(),
    };
    group_hint(steps, bufs, SingleCopyPolicy::default())
}

#[test]
fn a_sender_is_idle_only_with_nothing_else_to_do() {
    let send = Step::Send {
        to: 1,
        src: Loc::In(0),
        count: 1,
    };
    let copy = Step::Copy {
        src: Loc::In(0),
        dst: Loc::Out(0),
        count: 1,
    };
    let recv = Step::Recv {
        from: 1,
        dst: Loc::Out(0),
        count: 1,
    };
    let other = 0x90000;
    assert!(hint_for(vec![send], other, MIB).sender_idle);
    assert!(
        !hint_for(vec![send, copy], other, MIB).sender_idle,
        "its own copy"
    );
    assert!(
        hint_for(vec![send, copy], 0x10000, MIB).sender_idle,
        "in place"
    );
    assert!(hint_for(vec![send, copy], other, IDLE_COPY_MIN_BYTES).sender_idle);
    assert!(
        !hint_for(vec![send, recv], 0x10000, MIB).sender_idle,
        "it receives"
    );
}

/// A send/recv group of one send of `bytes` from `buf`.
fn group_send_allowed(buf: &[u8], p: SingleCopyPolicy) -> bool {
    let send = Step::Send {
        to: 1,
        src: Loc::Group(0, 0),
        count: buf.len(),
    };
    let bufs = CallBufs {
        input: Region::empty(),
        output: Region::empty(),
        group: vec![Region::new(buf.as_ptr().cast_mut(), buf.len())],
    };
    group_hint(vec![send], bufs, p).single_copy
}

#[test]
fn groups_sending_from_shared_buffers_go_single_copy_at_any_size() {
    let p = SingleCopyPolicy {
        max_bytes: 2 * MIB,
        ..SingleCopyPolicy::default()
    };
    let shared = crate::ShmBuffer::<u8>::zeroed(4 * MIB).unwrap();
    let heap = vec![0u8; 4 * MIB];
    assert!(group_send_allowed(&shared, p), "mapped: past the cap");
    assert!(!group_send_allowed(&heap, p), "heap: the cap holds");
    assert!(
        group_send_allowed(&heap[..MIB / 2], p),
        "heap: a quarter of the cap"
    );
    let over = SingleCopyPolicy {
        oversubscribed: true,
        ..p
    };
    assert!(!group_send_allowed(&shared, over), "oversubscribed: never");
}

#[test]
fn large_pair_all_gather_takes_the_ring_in_chunks() {
    let p = SingleCopyPolicy {
        max_bytes: 2 * MIB,
        oversubscribed: false,
        uniform: true,
        pair: true,
        split: true,
        ring_from: 16 * MIB,
        apart_ns: 0,
        placement: Placement::Unknown,
    };
    let ag = Some(Coll::AllGather { send_count: 1 });
    let a2a = Some(Coll::AllToAll { count: 1 });
    assert!(p.whole_block_all_gather(16 * MIB - 1));
    assert!(!p.whole_block_all_gather(16 * MIB));
    assert!(allowed(ag, true, 16 * MIB - 1, p));
    assert!(!allowed(ag, true, 16 * MIB, p));
    // All-to-all stays single copy in whole blocks.
    assert!(allowed(a2a, true, 1 << 30, p) && p.whole_blocks(1 << 30));
    let never = SingleCopyPolicy {
        ring_from: usize::MAX,
        ..p
    };
    assert!(allowed(ag, true, 1 << 30, never));
    assert!(never.whole_block_all_gather(1 << 30));
    // With more local ranks than CPUs single copy stays.
    let over = SingleCopyPolicy {
        oversubscribed: true,
        pair: false,
        ..p
    };
    assert!(allowed(ag, true, 1 << 30, over));
    assert!(over.whole_block_all_gather(1 << 30));
    // Only where the ring would be taken, and only if every rank probes,
    // do the ranks look at where their CPUs are.
    assert!(!p.watches_placement(1 << 30), "the probe is off");
    let probing = SingleCopyPolicy { apart_ns: 600, ..p };
    assert!(probing.watches_placement(16 * MIB));
    assert!(!probing.watches_placement(16 * MIB - 1));
    for q in [
        SingleCopyPolicy {
            uniform: false,
            ..probing
        },
        SingleCopyPolicy {
            pair: false,
            ..probing
        },
        SingleCopyPolicy {
            oversubscribed: true,
            ..probing
        },
    ] {
        assert!(!q.watches_placement(1 << 30), "{q:?}");
    }
    // CPUs found apart: all-gather keeps the ring (its writes stream, see
    // `ring_writes_stream_only_where_the_cpus_were_found_apart`), all-to-all
    // single copy in whole blocks.
    let apart = SingleCopyPolicy {
        placement: Placement::Apart,
        ..probing
    };
    assert!(!apart.whole_block_all_gather(1 << 30) && !allowed(ag, true, 1 << 30, apart));
    assert!(!probing.whole_block_all_gather(1 << 30));
    // Found near: both take the ring in chunks, all-to-all too (not staged).
    let near = SingleCopyPolicy {
        placement: Placement::Near,
        ..probing
    };
    assert!(!near.whole_block_all_gather(1 << 30) && !allowed(ag, true, 1 << 30, near));
    assert!(!allowed(a2a, true, 16 * MIB, near) && !near.whole_blocks(16 * MIB));
    assert!(!near.stages_all_to_all(16 * MIB));
    assert!(apart.whole_blocks(16 * MIB) && apart.stages_all_to_all(16 * MIB));
}

#[test]
fn ring_writes_stream_only_where_the_cpus_were_found_apart() {
    let sched = Schedule {
        steps: vec![
            Step::Send {
                to: 1,
                src: Loc::In(0),
                count: 1,
            },
            Step::Recv {
                from: 1,
                dst: Loc::Out(0),
                count: 1,
            },
        ],
        scratch: 0,
    };
    let bufs = CallBufs {
        input: Region::empty(),
        output: Region::new(std::ptr::null_mut(), 64 * MIB),
        group: Vec::new(),
    };
    for coll in [
        Coll::AllGather { send_count: 1 },
        Coll::AllReduce { count: 1 },
        Coll::AllToAll { count: 1 },
    ] {
        for (placement, apart) in [
            (Placement::Unknown, false),
            (Placement::Near, false),
            (Placement::Apart, true),
        ] {
            let p = SingleCopyPolicy {
                placement,
                ..SingleCopyPolicy::default()
            };
            let hint = copy_hint(&call_of(&sched, Some(coll)), &bufs, p);
            assert_eq!(hint.receiver_apart, apart, "{coll:?} {placement:?}");
        }
    }
}

/// The receive hint for `steps` of `coll` with an output of `out_bytes` at
/// 0x10000, streaming from `min` bytes.
fn stream_range(steps: Vec<Step>, coll: Coll, out_bytes: usize, min: usize) -> (usize, usize) {
    let sched = Schedule { steps, scratch: 0 };
    let call = call_of(&sched, Some(coll));
    let bufs = CallBufs {
        input: Region::empty(),
        output: Region::new(0x10000 as *mut u8, out_bytes),
        group: Vec::new(),
    };
    recv_hint(&call, &bufs, min).stream
}

#[test]
fn receives_stream_into_large_outputs_that_are_not_read_again() {
    let recv = Step::Recv {
        from: 1,
        dst: Loc::Out(0),
        count: 1,
    };
    let forward = Step::RecvCopySend {
        from: 1,
        to: 2,
        dst: Loc::Out(0),
        count: 1,
    };
    let ag = Coll::AllGather { send_count: 1 };
    let ar = Coll::AllReduce { count: 1 };
    let none = (0, 0);
    assert_eq!(
        stream_range(vec![recv], ag, 4 * MIB, 4 * MIB),
        (0x10000, 0x10000 + 4 * MIB)
    );
    assert_eq!(
        stream_range(vec![recv], ag, 4 * MIB - 1, 4 * MIB),
        none,
        "small"
    );
    assert_eq!(
        stream_range(vec![recv], ar, 4 * MIB, 4 * MIB),
        none,
        "reduces"
    );
    assert_eq!(
        stream_range(vec![recv, forward], ag, 4 * MIB, 4 * MIB),
        none,
        "relays"
    );
    let hint = RecvHint {
        stream: (0x10000, 0x20000),
    };
    assert!(hint.streams(0x10000 as *const u8, 0x10000));
    assert!(hint.streams(0x18000 as *const u8, 10));
    assert!(!hint.streams(0x1ffff as *const u8, 2), "straddles the end");
    assert!(!hint.streams(0xffff as *const u8, 2), "starts before");
    assert!(!RecvHint::default().streams(std::ptr::null(), 0), "empty");
}

#[test]
fn all_to_all_is_staged_oversubscribed_or_large_and_streams_by_size() {
    let mut p = SingleCopyPolicy {
        max_bytes: 2 * MIB,
        oversubscribed: true,
        uniform: true,
        pair: false,
        split: false,
        ring_from: 16 * MIB,
        apart_ns: 0,
        placement: Placement::Unknown,
    };
    // More local ranks than CPUs: every size that goes in whole blocks.
    assert!(!p.stages_all_to_all(64 << 10), "not single copy");
    assert!(p.stages_all_to_all((64 << 10) + 1));
    assert!(p.stages_all_to_all(MIB));
    assert!(p.stages_all_to_all(STAGED_ALL_TO_ALL_MAX_BYTES));
    assert!(
        !p.stages_all_to_all(STAGED_ALL_TO_ALL_MAX_BYTES + 1),
        "memory bound"
    );
    assert!(!p.stage_streams(OVERSUBSCRIBED_STAGE_STREAM_MIN_BYTES - 1));
    assert!(p.stage_streams(OVERSUBSCRIBED_STAGE_STREAM_MIN_BYTES));
    // Ranks on their own CPUs: only from `ring_from`, where the copy streams.
    p.oversubscribed = false;
    assert!(!p.stages_all_to_all(16 * MIB - 1));
    assert!(p.stages_all_to_all(16 * MIB));
    assert!(!p.stage_streams(16 * MIB - 1));
    assert!(p.stage_streams(16 * MIB));
    p.ring_from = usize::MAX;
    assert!(
        !p.stages_all_to_all(64 * MIB),
        "`NCCL_SHM_STREAM_RING_BYTES=0`"
    );
    assert!(!p.stage_streams(64 * MIB));
    // Not every rank on this host with single copy: never.
    p.ring_from = 16 * MIB;
    p.uniform = false;
    assert!(!p.stages_all_to_all(64 * MIB));
    p.oversubscribed = true;
    assert!(!p.stages_all_to_all(MIB));
}
