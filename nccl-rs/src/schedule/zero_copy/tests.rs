//! The plan checker at many world sizes, and the checks it must fail.

use super::*;

#[test]
fn every_output_element_is_written_once_from_the_right_inputs() {
    for n in 1..=9 {
        for count in [0, 1, 2, 5, 16, 17] {
            for (root, root_shares) in [(0, true), (n / 2, false), (n - 1, true), (n - 1, false)] {
                for coll in [
                    ZcColl::AllReduce { count },
                    ZcColl::ReduceScatter { recv_count: count },
                    ZcColl::AllGather { send_count: count },
                    ZcColl::Broadcast {
                        count,
                        root,
                        root_shares,
                    },
                    ZcColl::Reduce { count, root },
                    ZcColl::AllToAll { count },
                    ZcColl::AllToAllInPlace { count },
                    ZcColl::Gather { count, root },
                    ZcColl::Scatter { count, root },
                ] {
                    check_zero_copy(coll, n).unwrap_or_else(|e| panic!("{e}"));
                }
            }
        }
    }
}

#[test]
fn an_in_place_broadcast_root_copies_a_share() {
    let bc = |root_shares| ZcColl::Broadcast {
        count: 10,
        root: 0,
        root_shares,
    };
    let to_peer = |steps: Vec<ZcStep>| {
        steps
            .iter()
            .filter_map(|s| match s {
                ZcStep::Copy { dst, count, .. } if dst.buf == ZcBuf::Out(1) => Some(*count),
                _ => None,
            })
            .sum::<usize>()
    };
    assert_eq!(
        to_peer(zero_copy(bc(true), 2, 0)),
        5,
        "half of rank 1's output"
    );
    assert_eq!(to_peer(zero_copy(bc(true), 2, 1)), 5);
    assert_eq!(
        to_peer(zero_copy(bc(false), 2, 0)),
        0,
        "out of place: its own copy"
    );
    assert_eq!(to_peer(zero_copy(bc(false), 2, 1)), 10);
}

#[test]
fn the_checker_catches_wrong_plans() {
    let n = 3;
    let ag = ZcColl::AllGather { send_count: 4 };
    let dropped = |r: usize| {
        let mut p = zero_copy(ag, n, r);
        if r == 1 {
            p.pop();
        }
        p
    };
    assert!(check_plans(ag, n, dropped).unwrap_err().contains("missing"));
    let ar = ZcColl::AllReduce { count: 7 };
    let wrong_source = |r: usize| {
        let mut p = zero_copy(ar, n, r);
        if let Some(ZcStep::Reduce { srcs, .. }) = p.first_mut() {
            srcs[0].off += 1;
        }
        p
    };
    assert!(check_plans(ar, n, wrong_source)
        .unwrap_err()
        .contains("wrong"));
    let twice = |r: usize| {
        let mut p = zero_copy(ar, n, r);
        p.extend(zero_copy(ar, n, r));
        p
    };
    assert!(check_plans(ar, n, twice).unwrap_err().contains("twice"));
    // In place, both ranks of a pair swapping the whole block: each
    // swaps the pair back.
    let a2a = ZcColl::AllToAllInPlace { count: 6 };
    let whole = |r: usize| {
        let mut p = zero_copy(a2a, n, r);
        for s in &mut p {
            if let ZcStep::Swap { a, b, count } = s {
                a.off -= a.off % 6;
                b.off -= b.off % 6;
                *count = 6;
            }
        }
        p
    };
    assert!(check_plans(a2a, n, whole).unwrap_err().contains("twice"));
}
