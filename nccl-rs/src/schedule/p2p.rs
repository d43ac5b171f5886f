//! Point-to-point schedules: all-to-all, gather, scatter and grouped
//! send/recv. Every rank posts all its sends before its receives, so with
//! non-blocking sends no cyclic wait can form.

use super::{Loc, Schedule, Step};

/// Pairwise-exchange all-to-all: `count` elements to and from every rank,
/// in rounds of at most `chunk` elements per pair. In each round a rank
/// posts its sends, copies its own block's slice while they travel, then
/// receives: the transfer starts at once and the local copy overlaps it,
/// and per-pair messages keep the round order on both sides.
pub fn all_to_all(n: usize, r: usize, count: usize, chunk: usize) -> Schedule {
    all_to_all_rounds(n, r, count, chunk, Order::AllSends { own: true })
}

/// [`all_to_all`] for a rank whose output is its input (in place): its own
/// block is already where it belongs, so it copies nothing. The caller
/// must send from a copy of the other blocks, which the receives
/// overwrite. The messages are those of [`all_to_all`], so ranks in place
/// and out of place mix.
pub fn all_to_all_in_place(n: usize, r: usize, count: usize, chunk: usize) -> Schedule {
    all_to_all_rounds(n, r, count, chunk, Order::AllSends { own: false })
}

/// [`all_to_all`] one peer at a time, for ranks on several hosts: in each
/// round a rank copies its own block's slice, then sends to rank `r + s`
/// and receives from rank `r - s`, for `s` = 1, 2, ... in turn. Each rank
/// then receives from one peer at a time instead of from all at once: a
/// burst from every peer into one host's link overflows the switch's
/// queue, and TCP waits out a retransmission timeout (incast). Sends are
/// non-blocking, so the pairs cannot wait on each other in a cycle; the
/// messages are those of [`all_to_all`].
pub fn all_to_all_paced(n: usize, r: usize, count: usize, chunk: usize) -> Schedule {
    all_to_all_rounds(n, r, count, chunk, Order::Paced)
}

/// [`all_to_all_paced`] where each rank acknowledges every message it
/// receives, and a sender waits for that acknowledgement before it sends
/// to its next peer. A send completes once its bytes are in the
/// transport's buffers, not at the receiver, so without it a rank's next
/// message starts while the last one is still on the wire, and each host
/// link carries several fresh flows at once: their bursts overflow the
/// switch queues and TCP loses whole windows. The acknowledgement is one
/// element of the block just received, sent into the sender's scratch
/// element (so the schedule has one element of scratch).
pub fn all_to_all_acked(n: usize, r: usize, count: usize, chunk: usize) -> Schedule {
    all_to_all_rounds(n, r, count, chunk, Order::Acked)
}

/// How a round of [`all_to_all`] orders its steps.
#[derive(Clone, Copy, PartialEq)]
enum Order {
    /// Every send, the own block's copy, every receive.
    AllSends { own: bool },
    /// The copy, then each send followed by its receive.
    Paced,
    /// As `Paced`, each receive followed by its acknowledgement to the
    /// sender and the wait for the acknowledgement of the send.
    Acked,
}

fn all_to_all_rounds(n: usize, r: usize, count: usize, chunk: usize, order: Order) -> Schedule {
    let chunk = chunk.max(1);
    let mut steps = Vec::new();
    let mut o = 0;
    loop {
        let c = chunk.min(count - o);
        let send = |s: usize| {
            let to = (r + s) % n;
            Step::Send {
                to,
                src: Loc::In(to * count + o),
                count: c,
            }
        };
        let recv = |s: usize| {
            let from = (r + n - s) % n;
            Step::Recv {
                from,
                dst: Loc::Out(from * count + o),
                count: c,
            }
        };
        let copy = Step::Copy {
            src: Loc::In(r * count + o),
            dst: Loc::Out(r * count + o),
            count: c,
        };
        match order {
            Order::AllSends { own } => {
                steps.extend((1..n).map(send));
                if own {
                    steps.push(copy);
                }
                steps.extend((1..n).map(recv));
            }
            Order::Paced => {
                steps.push(copy);
                steps.extend((1..n).flat_map(|s| [send(s), recv(s)]));
            }
            Order::Acked => {
                steps.push(copy);
                for s in 1..n {
                    let (to, from) = ((r + s) % n, (r + n - s) % n);
                    let ack = Step::Send {
                        to: from,
                        src: Loc::Out(from * count + o),
                        count: c.min(1),
                    };
                    let acked = Step::Recv {
                        from: to,
                        dst: Loc::Scratch(0),
                        count: c.min(1),
                    };
                    steps.extend([send(s), recv(s), ack, acked]);
                }
            }
        }
        o += c;
        if o >= count {
            break;
        }
    }
    let mut schedule = finish(steps);
    if order == Order::Acked && count > 0 {
        schedule.scratch = 1;
    }
    schedule
}

/// All-gather in one hop: every rank sends its `count` elements (the input)
/// to every other rank, receives theirs into `Out[q * count..]` and copies
/// its own. For tiny exchanges, where a ring's `n - 1` hops of latency
/// would dominate, and for large ones that go single copy (each receiver
/// reads the block straight from its owner's input).
///
/// Each rank copies its own block first and then receives from `r - 1`,
/// `r - 2`, ...: at every step each input has one reader. Between two
/// ranks, rank 1 receives first instead, so that both ranks read rank 0's
/// input at the same time (rank 0 copying it, rank 1 reading it across
/// processes), then rank 1's: each input comes from memory once and is
/// shared in the caches (a gain of a few to 20%, larger the slower the
/// memory). At more ranks the same order puts several readers on one input
/// at once, which lost, so more ranks keep one reader per input.
pub fn all_gather_direct(n: usize, r: usize, count: usize) -> Schedule {
    let mut steps = Vec::with_capacity(2 * n);
    for s in 1..n {
        steps.push(Step::Send {
            to: (r + s) % n,
            src: Loc::In(0),
            count,
        });
    }
    let copy = Step::Copy {
        src: Loc::In(0),
        dst: Loc::Out(r * count),
        count,
    };
    // Rank 1 of 2 reads rank 0's input while rank 0 copies it.
    let copy_last = n == 2 && r == 1;
    if !copy_last {
        steps.push(copy);
    }
    for s in 1..n {
        let from = (r + n - s) % n;
        steps.push(Step::Recv {
            from,
            dst: Loc::Out(from * count),
            count,
        });
    }
    if copy_last {
        steps.push(copy);
    }
    finish(steps)
}

/// Gather `count` elements from every rank into `root`'s output.
pub fn gather(n: usize, r: usize, root: usize, count: usize) -> Schedule {
    let steps = if r == root {
        (0..n)
            .map(|p| match p == root {
                true => Step::Copy {
                    src: Loc::In(0),
                    dst: Loc::Out(p * count),
                    count,
                },
                false => Step::Recv {
                    from: p,
                    dst: Loc::Out(p * count),
                    count,
                },
            })
            .collect()
    } else {
        vec![Step::Send {
            to: root,
            src: Loc::In(0),
            count,
        }]
    };
    finish(steps)
}

/// Scatter `count` elements from `root`'s input to every rank.
pub fn scatter(n: usize, r: usize, root: usize, count: usize) -> Schedule {
    fan_out(n, r, root, count, |p| Loc::In(p * count))
}

/// Broadcast in one hop: the root sends its `count` elements to every other
/// rank (and copies them to its own output); the others receive.
pub fn broadcast_direct(n: usize, r: usize, root: usize, count: usize) -> Schedule {
    fan_out(n, r, root, count, |_| Loc::In(0))
}

/// The root sends `count` elements from `src(p)` to every other rank `p`,
/// then copies `src(root)` to its own output; every other rank receives
/// into its output.
fn fan_out(n: usize, r: usize, root: usize, count: usize, src: impl Fn(usize) -> Loc) -> Schedule {
    let steps = if r == root {
        (1..n)
            .map(|s| {
                let to = (root + s) % n;
                Step::Send {
                    to,
                    src: src(to),
                    count,
                }
            })
            .chain(std::iter::once(Step::Copy {
                src: src(root),
                dst: Loc::Out(0),
                count,
            }))
            .collect()
    } else {
        vec![Step::Recv {
            from: root,
            dst: Loc::Out(0),
            count,
        }]
    };
    finish(steps)
}

/// One operation of a send/recv group. `buf` indexes the group's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum P2pOp {
    /// Send `count` elements of buffer `buf` to `peer`.
    Send {
        /// Destination rank.
        peer: usize,
        /// Index of the group buffer.
        buf: usize,
        /// Elements.
        count: usize,
    },
    /// Receive `count` elements from `peer` into buffer `buf`.
    Recv {
        /// Source rank.
        peer: usize,
        /// Index of the group buffer.
        buf: usize,
        /// Elements.
        count: usize,
    },
}

/// A group of sends and receives of rank `me`: all sends first, then all
/// receives, each in the caller's order (so per-peer order is kept, as NCCL
/// matches it). Sends to `me` pair in order with receives from `me` and
/// become local copies; an unpaired one, or a pair of different sizes, is
/// an error naming it.
pub fn p2p_group(me: usize, ops: &[P2pOp]) -> Result<Schedule, String> {
    let mut steps = Vec::with_capacity(ops.len());
    let self_sends: Vec<(usize, usize)> = ops
        .iter()
        .filter_map(|op| match *op {
            P2pOp::Send { peer, buf, count } if peer == me => Some((buf, count)),
            _ => None,
        })
        .collect();
    let self_recvs: Vec<(usize, usize)> = ops
        .iter()
        .filter_map(|op| match *op {
            P2pOp::Recv { peer, buf, count } if peer == me => Some((buf, count)),
            _ => None,
        })
        .collect();
    if self_sends.len() != self_recvs.len() {
        return Err(format!(
            "{} sends to self but {} receives from self",
            self_sends.len(),
            self_recvs.len()
        ));
    }
    for ((sb, sc), (rb, rc)) in self_sends.into_iter().zip(self_recvs) {
        if sc != rc {
            return Err(format!(
                "a send to self of {sc} elements meets a receive of {rc}"
            ));
        }
        steps.push(Step::Copy {
            src: Loc::Group(sb, 0),
            dst: Loc::Group(rb, 0),
            count: sc,
        });
    }
    for op in ops {
        if let P2pOp::Send { peer, buf, count } = *op {
            if peer != me {
                steps.push(Step::Send {
                    to: peer,
                    src: Loc::Group(buf, 0),
                    count,
                });
            }
        }
    }
    for op in ops {
        if let P2pOp::Recv { peer, buf, count } = *op {
            if peer != me {
                steps.push(Step::Recv {
                    from: peer,
                    dst: Loc::Group(buf, 0),
                    count,
                });
            }
        }
    }
    Ok(finish(steps))
}

/// A round trip of `count` elements between two ranks, which swaps their
/// inputs: the leader sends its input to `peer` and then receives the
/// peer's into its output; the other rank receives first, then sends. The
/// communicator times the leader's runs to tell whether the two ranks'
/// CPUs share a cache, and the ranks trade what they need to agree on a
/// call's shape (see `Core::placement`); with `count` 0 nothing moves.
pub fn round_trip(peer: usize, count: usize, leads: bool) -> Schedule {
    let send = |src| Step::Send {
        to: peer,
        src,
        count,
    };
    let recv = Step::Recv {
        from: peer,
        dst: Loc::Out(0),
        count,
    };
    finish(match leads {
        true => vec![send(Loc::In(0)), recv],
        false => vec![recv, send(Loc::In(0))],
    })
}

fn finish(mut steps: Vec<Step>) -> Schedule {
    steps.retain(|s| s.count() > 0);
    Schedule { steps, scratch: 0 }
}
