//! Symbolic runs of the halving-doubling all-reduce at every world size
//! 1..=64. (Its runs on real engines are unit tests: `src/schedule/tests.rs`.)

use super::{all, expect, run, v};
use nccl_rs::schedule::check::{simulate, SymBufs, Val};
use nccl_rs::schedule::{all_reduce_halving_doubling, Loc, Step};

#[test]
fn halving_doubling_all_reduce_every_element_reduced_once() {
    // Every world size 1..=64 (powers of two and not), counts below, at and
    // above the number of ranks, not divisible by the core size.
    for n in 1..=64 {
        for c in [0, 1, 5, n - 1, n + 3, 64, 1023] {
            for ch in [1, 3, 64, 1 << 20] {
                let b = run(
                    n,
                    |r| all_reduce_halving_doubling(n, r, c, ch),
                    |r| (0..c).map(|i| v(r, i)).collect(),
                    c,
                );
                for (r, bufs) in b.iter().enumerate() {
                    expect(
                        &bufs.output,
                        |i| Val {
                            ranks: all(n),
                            index: i as u64,
                        },
                        &format!("halving-doubling n={n} c={c} ch={ch} rank {r}"),
                    );
                }
            }
        }
    }
}

#[test]
fn halving_doubling_chunks_fit_a_slot_and_finalize_once() {
    for n in [2, 3, 6, 8, 13] {
        for r in 0..n {
            let s = all_reduce_halving_doubling(n, r, 1000, 7);
            assert!(s.steps.iter().all(|x| x.count() <= 7), "n={n} rank {r}");
            assert_eq!(s.scratch, 0);
        }
        // Each element is finalized exactly once, by its owner.
        let mut finalized = vec![0; 1000];
        for r in 0..n {
            for step in all_reduce_halving_doubling(n, r, 1000, 7).steps {
                if let Step::RecvReduceCopySend {
                    finalize: true,
                    dst: Loc::Out(o),
                    count,
                    ..
                } = step
                {
                    finalized[o..o + count].iter_mut().for_each(|f| *f += 1);
                }
            }
        }
        assert!(finalized.iter().all(|&f| f == 1), "n={n}");
    }
}

#[test]
fn a_broken_halving_doubling_schedule_is_caught() {
    // 6 ranks: rank 1 is the fold partner of extra rank 0. Dropping the
    // first result it sends back, or not forwarding its own block to the
    // partner, must fail the check.
    let (n, c) = (6, 37);
    let good: Vec<_> = (0..n)
        .map(|r| all_reduce_halving_doubling(n, r, c, 4))
        .collect();
    let bufs = || -> Vec<SymBufs> {
        (0..n)
            .map(|r| SymBufs {
                input: (0..c).map(|i| v(r, i)).collect(),
                output: vec![None; c],
                scratch: vec![],
            })
            .collect()
    };
    simulate(&good, &mut bufs()).unwrap();
    let mut dropped = good.clone();
    let i = dropped[1]
        .steps
        .iter()
        .position(|s| s.send_peer() == Some(0))
        .unwrap();
    dropped[1].steps.remove(i);
    assert!(simulate(&dropped, &mut bufs()).is_err());
    let mut unforwarded = good;
    for s in &mut unforwarded[1].steps {
        if let Step::RecvReduceCopySend {
            finalize: true, to, ..
        } = s
        {
            *to = None;
        }
    }
    assert!(simulate(&unforwarded, &mut bufs()).is_err());
}
