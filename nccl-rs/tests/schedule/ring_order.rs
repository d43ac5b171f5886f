//! Rings through any order of the ranks (`RingOrder`, the `_on` schedules):
//! every collective still leaves every rank the exact result, and its
//! messages only travel between ring neighbours.

use super::*;

/// Orders a topology-aware ring may take: reversed, srun's cyclic placement
/// sorted by host (hosts of `h` ranks), and a fixed shuffle.
fn orders(n: usize) -> Vec<Vec<usize>> {
    let mut v = vec![(0..n).rev().collect::<Vec<_>>()];
    for h in [2, 3] {
        if n > h {
            let hosts = n.div_ceil(h);
            v.push(
                (0..hosts)
                    .flat_map(|host| (host..n).step_by(hosts))
                    .collect(),
            );
        }
    }
    let mut shuffled: Vec<usize> = (0..n).collect();
    let mut x = 0x9e37_79b9_u64;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        shuffled.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v.push(shuffled);
    v
}

/// Every message of `sched` (rank `r`) goes to the next rank of `ring` and
/// comes from the previous one.
fn neighbours_only(ring: &RingOrder, r: usize, sched: &Schedule, what: &str) {
    for s in &sched.steps {
        if let Some(to) = s.send_peer() {
            assert_eq!(to, ring.ahead(r, 1), "{what}: rank {r} sends to {to}");
        }
        if let Some(from) = s.recv_peer() {
            assert_eq!(
                from,
                ring.back(r, 1),
                "{what}: rank {r} receives from {from}"
            );
        }
    }
}

#[test]
fn ring_order_is_checked() {
    assert!(RingOrder::new(vec![1, 0, 2]).is_some());
    assert!(RingOrder::new(vec![1, 1, 2]).is_none());
    assert!(RingOrder::new(vec![0, 3, 1]).is_none());
    let ring = RingOrder::new(vec![2, 0, 3, 1]).unwrap();
    assert_eq!(
        (ring.position(3), ring.ahead(1, 1), ring.back(2, 1)),
        (2, 2, 1)
    );
    assert_eq!((ring.ahead(0, 6), ring.back(0, 5)), (1, 2));
    assert!(!ring.is_identity() && RingOrder::identity(4).is_identity());
}

#[test]
fn every_ring_collective_is_exact_around_any_order() {
    for &n in &[2usize, 3, 4, 5, 7, 8, 13] {
        for order in orders(n) {
            let ring = RingOrder::new(order.clone()).unwrap();
            for &c in &[0usize, 1, 7, 64] {
                for &ch in &[1usize, 3, 1 << 20] {
                    let what = format!("order {order:?} c={c} chunk={ch}");
                    check_all_reduce(n, c, &what, |r| {
                        let s = all_reduce_on(&ring, r, c, ch);
                        neighbours_only(&ring, r, &s, &what);
                        s
                    });
                    check_reduce_scatter(n, c, &what, |r| {
                        let s = reduce_scatter_on(&ring, r, c, ch);
                        neighbours_only(&ring, r, &s, &what);
                        s
                    });
                    let b = run(
                        n,
                        |r| {
                            let s = all_gather_on(&ring, r, c, ch);
                            neighbours_only(&ring, r, &s, &what);
                            s
                        },
                        |r| (0..c).map(|i| v(r, r * c + i)).collect(),
                        n * c,
                    );
                    for r in 0..n {
                        let block = |i: usize| Val {
                            ranks: 1 << (i / c),
                            index: i as u64,
                        };
                        expect(&b[r].output, block, &format!("all_gather {what} rank {r}"));
                    }
                    for root in [order[0], order[n / 2], n - 1] {
                        let b = run(n, |r| broadcast_on(&ring, r, root, c, ch), own(c), c);
                        for r in 0..n {
                            let from_root = |i: usize| Val {
                                ranks: 1 << root,
                                index: i as u64,
                            };
                            let what = format!("broadcast {what} root={root} rank {r}");
                            expect(&b[r].output, from_root, &what);
                        }
                        let b = run(n, |r| reduce_on(&ring, r, root, c, ch), own(c), c);
                        expect(
                            &b[root].output,
                            reduced(n),
                            &format!("reduce {what} root={root}"),
                        );
                    }
                }
            }
        }
    }
}
