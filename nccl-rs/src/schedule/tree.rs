//! Double binary tree all-reduce.
//!
//! Tree 1 is a complete binary tree in breadth-first order over rank
//! positions; tree 2 mirrors it (position `p` holds rank `n-1-p`), so for an
//! even world size the interior ranks of one tree are the leaves of the
//! other and every rank sends and receives about the same amount, as in
//! NCCL's double binary tree (NCCL builds an in-order tree and mirrors or
//! shifts it; the balance property is the same).
//!
//! ```text
//!   tree 1 (n = 6)        tree 2 (mirror)
//!         0                     5
//!       /   \                 /   \
//!      1     2               4     3
//!     / \   /               / \   /
//!    3   4 5               2   1 0
//! ```
//!
//! Each tree carries half of the buffer, chunked; each chunk is reduced up
//! the tree and broadcast back down. The down phase of chunk `k` is ordered
//! `LAG` chunks after its up phase, so the up and down streams overlap.

use super::{part_len, part_start, Loc, Schedule, Step};

/// Chunks between a chunk's reduce-up and its broadcast-down.
const LAG: usize = 2;

/// One rank's place in a tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tree {
    /// Parent rank (`None` at the root).
    pub parent: Option<usize>,
    /// Child ranks (0, 1 or 2).
    pub children: Vec<usize>,
}

/// Rank `r`'s place in the breadth-first complete binary tree of `n` ranks.
pub fn btree(n: usize, r: usize) -> Tree {
    let parent = (r > 0).then(|| (r - 1) / 2);
    let children = [2 * r + 1, 2 * r + 2]
        .into_iter()
        .filter(|&c| c < n)
        .collect();
    Tree { parent, children }
}

/// Rank `r`'s places in the two trees of the double binary tree.
pub fn dtree(n: usize, r: usize) -> (Tree, Tree) {
    let m = |p: usize| n - 1 - p;
    let t2 = btree(n, m(r));
    let t2 = Tree {
        parent: t2.parent.map(m),
        children: t2.children.into_iter().map(m).collect(),
    };
    (btree(n, r), t2)
}

/// Double-binary-tree all-reduce of `count` elements in chunks of `chunk`.
pub fn all_reduce_tree(n: usize, r: usize, count: usize, chunk: usize) -> Schedule {
    if n == 1 {
        return super::all_reduce(1, 0, count, chunk);
    }
    let (t1, t2) = dtree(n, r);
    all_reduce_trees([&t1, &t2], count, chunk)
}

/// All-reduce over two trees of any shape (rank `r`'s place in each): tree
/// `t` reduces and broadcasts half `t` of the buffer, chunked, with the
/// keys of [`all_reduce_tree`] (so the per-link order holds for any pair of
/// trees that span the same ranks).
pub(super) fn all_reduce_trees(trees: [&Tree; 2], count: usize, chunk: usize) -> Schedule {
    let chunk = chunk.max(1);
    let mut keyed: Vec<((usize, usize, usize), Step)> = Vec::new();
    for (t, tree) in trees.into_iter().enumerate() {
        let (start, len) = (part_start(count, 2, t), part_len(count, 2, t));
        for k in 0..len.div_ceil(chunk) {
            let o = start + k * chunk;
            let c = chunk.min(start + len - o);
            for s in up(tree, o, c) {
                keyed.push(((k, 0, t), s));
            }
            for s in down(tree, o, c) {
                keyed.push(((k + LAG, 1, t), s));
            }
        }
    }
    keyed.sort_by_key(|(key, _)| *key);
    Schedule {
        steps: keyed.into_iter().map(|(_, s)| s).collect(),
        scratch: 0,
    }
}

/// Reduce one chunk up the tree: partial results collect in `Out`.
fn up(t: &Tree, o: usize, count: usize) -> Vec<Step> {
    let root = t.parent.is_none();
    match t.children.as_slice() {
        [] => t
            .parent
            .map(|p| Step::Send {
                to: p,
                src: Loc::In(o),
                count,
            })
            .into_iter()
            .collect(),
        [a, rest @ ..] => {
            let mut steps = Vec::new();
            let last = rest.is_empty();
            steps.push(Step::RecvReduceCopySend {
                from: *a,
                to: if last { t.parent } else { None },
                src: Loc::In(o),
                dst: Loc::Out(o),
                count,
                finalize: root && last,
            });
            for (i, b) in rest.iter().enumerate() {
                let last = i + 1 == rest.len();
                steps.push(Step::RecvReduceCopySend {
                    from: *b,
                    to: if last { t.parent } else { None },
                    src: Loc::Out(o),
                    dst: Loc::Out(o),
                    count,
                    finalize: root && last,
                });
            }
            steps
        }
    }
}

/// Broadcast one finished chunk down the tree.
fn down(t: &Tree, o: usize, count: usize) -> Vec<Step> {
    let dst = Loc::Out(o);
    let mut steps = Vec::new();
    let mut sends = t.children.iter();
    if let Some(p) = t.parent {
        steps.push(match sends.next() {
            Some(&c) => Step::RecvCopySend {
                from: p,
                to: c,
                dst,
                count,
            },
            None => Step::Recv {
                from: p,
                dst,
                count,
            },
        });
    }
    steps.extend(sends.map(|&c| Step::Send {
        to: c,
        src: dst,
        count,
    }));
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tree is connected, has one root, and parent/child links agree.
    #[test]
    fn trees_are_valid() {
        for n in 1..=64 {
            for tree in 0..2 {
                let nodes: Vec<Tree> = (0..n)
                    .map(|r| {
                        if tree == 0 {
                            dtree(n, r).0
                        } else {
                            dtree(n, r).1
                        }
                    })
                    .collect();
                assert_eq!(
                    nodes.iter().filter(|t| t.parent.is_none()).count(),
                    1,
                    "n={n}"
                );
                for (r, t) in nodes.iter().enumerate() {
                    for &c in &t.children {
                        assert_eq!(nodes[c].parent, Some(r), "n={n} tree={tree}");
                    }
                    // Walking up reaches the root.
                    let (mut x, mut hops) = (r, 0);
                    while let Some(p) = nodes[x].parent {
                        x = p;
                        hops += 1;
                        assert!(hops <= n);
                    }
                }
            }
        }
    }

    #[test]
    fn even_sizes_balance_interior_and_leaves() {
        for n in (2..=64).step_by(2) {
            for r in 0..n {
                let (a, b) = dtree(n, r);
                assert!(
                    a.children.is_empty() || b.children.is_empty(),
                    "n={n} rank {r} interior in both trees"
                );
            }
        }
    }
}
