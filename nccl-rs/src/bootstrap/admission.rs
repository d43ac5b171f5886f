//! Who may join the job: the bootstrap root's admission rules as a pure
//! state machine. It sees connections, bytes, closes and the clock as
//! events and answers with actions; `root.rs` does the socket I/O. No I/O
//! and no clock of its own, so tests and the fuzz target drive it exactly.
//!
//! Rules:
//! - A connection must send one hello frame within [`HELLO_DEADLINE`]; at
//!   most [`MAX_PENDING`] unauthenticated connections are held, each with at
//!   most one hello's bytes.
//! - A hello without the job's secret is dropped without an answer.
//! - The job size is what rank 0's own call said (given at start, or by a
//!   rank in the root's process before its hello). Every count and index a
//!   peer sends is checked against it before use, and nothing is allocated
//!   by it. Until it is known, hellos are held by the size they claim, and
//!   a size for which every rank has claimed is the job.
//! - Admitted ranks are held, unanswered, until every rank has joined; then
//!   all are answered `OK` together. So a refusal never strands a rank that
//!   was already told to go on.
//! - A second claim of a rank that is held fails the whole admission: every
//!   held rank and the claimant are refused with a message naming both
//!   addresses, and later hellos get the same answer. With the all-zero
//!   secret a stranger can cause this, and the message says how to stop it.
//! - While the job initialises (until every rank has spoken to the root), a
//!   claim of a rank that was admitted means one of the two is an impostor
//!   that came first: the job must be aborted, naming both addresses.

use super::wire::{secrets_equal, Hello, HELLO_LEN};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How long an unauthenticated connection may take to send its hello.
pub(crate) const HELLO_DEADLINE: Duration = Duration::from_secs(5);
/// Most unauthenticated connections held at once.
pub(crate) const MAX_PENDING: usize = 256;

/// Most distinct ranks remembered as told of a failed admission.
const MAX_TOLD: usize = 1 << 16;

/// A connection, named by the I/O layer.
pub(crate) type Key = u64;

/// What the I/O layer must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Close without an answer (not part of the job, or not our protocol).
    Drop { key: Key, why: String },
    /// Answer `ERR why`, then close.
    Refuse { key: Key, why: String },
    /// Answer `ERR why`, close, and abort the admitted job with `why`: a
    /// rank of it was claimed again.
    Impostor { key: Key, why: String },
    /// Every rank joined: answer `OK` to each and hand them, in rank order,
    /// to the monitor.
    Admit(Vec<Key>),
}

struct PendingConn {
    peer: SocketAddr,
    buf: Vec<u8>,
    since: Instant,
}

struct Held {
    key: Key,
    peer: SocketAddr,
}

/// The admission state of one root.
pub(crate) struct Admission {
    secret: [u8; 16],
    /// The job size from rank 0's own call, once known.
    size: Option<usize>,
    pending: BTreeMap<Key, PendingConn>,
    /// Authenticated ranks waiting for the rest, by (claimed size, rank).
    held: BTreeMap<(u32, u32), Held>,
    /// Why admission failed; answers every later authenticated hello.
    failed: Option<String>,
    /// Ranks that were given that answer.
    told: BTreeSet<u32>,
    /// The admitted ranks' addresses, in rank order (empty before).
    admitted_peers: Vec<SocketAddr>,
    admitted: bool,
}

impl Admission {
    /// A root for `secret`; `size` if rank 0's call is already known.
    pub(crate) fn new(secret: [u8; 16], size: Option<usize>) -> Admission {
        Admission {
            secret,
            size,
            pending: BTreeMap::new(),
            held: BTreeMap::new(),
            failed: None,
            told: BTreeSet::new(),
            admitted_peers: Vec::new(),
            admitted: false,
        }
    }

    /// Every rank was admitted (the root moves on to serving them).
    #[cfg(test)]
    pub(crate) fn admitted(&self) -> bool {
        self.admitted
    }

    /// Why admission failed, if it did.
    pub(crate) fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// Admission failed and every rank of the job has been told why, so
    /// the root has nothing left to say.
    pub(crate) fn failure_told(&self) -> bool {
        self.failed.is_some()
            && self
                .size
                .is_some_and(|n| self.told.range(..n.min(u32::MAX as usize) as u32).count() >= n)
    }

    /// The job size, if known.
    pub(crate) fn size(&self) -> Option<usize> {
        self.size
    }

    /// Ranks admitted so far (held until the rest arrive).
    pub(crate) fn held_ranks(&self) -> Vec<u32> {
        self.held.keys().map(|&(_, r)| r).collect()
    }

    /// Connections the I/O layer must keep reading: pending and held.
    pub(crate) fn open_keys(&self) -> Vec<Key> {
        self.pending
            .keys()
            .chain(self.held.values().map(|h| &h.key))
            .copied()
            .collect()
    }

    /// Rank 0's call says the job has `n` ranks. Held ranks that claimed
    /// another size are refused.
    pub(crate) fn set_size(&mut self, n: usize) -> Vec<Action> {
        if self.size.is_some() || self.admitted || n == 0 {
            return Vec::new();
        }
        self.size = Some(n);
        let wrong: Vec<(u32, u32)> = self
            .held
            .keys()
            .filter(|&&(claim, _)| claim as usize != n)
            .copied()
            .collect();
        let mut out = Vec::new();
        for (claim, r) in wrong {
            let h = self.held.remove(&(claim, r)).expect("listed");
            out.push(Action::Refuse {
                key: h.key,
                why: format!(
                    "rank {r} ({}) says the job has {claim} ranks; rank 0 says {n}",
                    h.peer
                ),
            });
        }
        if let Ok(n) = u32::try_from(n) {
            self.complete(n, &mut out);
        }
        out
    }

    /// A new connection from `peer`. May evict the pending connection that
    /// has shown the least when [`MAX_PENDING`] are held.
    pub(crate) fn connect(&mut self, key: Key, peer: SocketAddr, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        if self.pending.len() >= MAX_PENDING {
            let least = self
                .pending
                .values()
                .map(|p| p.buf.len())
                .min()
                .unwrap_or(0);
            let victim = self
                .pending
                .iter()
                .filter(|(_, p)| p.buf.len() == least)
                .min_by_key(|(_, p)| p.since)
                .map(|(&k, _)| k);
            if let Some(k) = victim {
                self.pending.remove(&k);
                out.push(Action::Drop {
                    key: k,
                    why: "too many unauthenticated connections; dropping the one that sent least"
                        .into(),
                });
            }
        }
        self.pending.insert(
            key,
            PendingConn {
                peer,
                buf: Vec::with_capacity(4 + HELLO_LEN),
                since: now,
            },
        );
        out
    }

    /// Bytes arrived on `key`. Takes at most one hello frame's worth; more
    /// than that, or anything from a held rank, is a protocol violation.
    pub(crate) fn data(&mut self, key: Key, bytes: &[u8]) -> Vec<Action> {
        let mut out = Vec::new();
        if bytes.is_empty() {
            return out;
        }
        if let Some(at) = self.held_at(key) {
            let h = self.held.remove(&at).expect("found");
            out.push(Action::Drop {
                key,
                why: format!(
                    "rank {} ({}) sent more after its hello; dropping it",
                    at.1, h.peer
                ),
            });
            return out;
        }
        let Some(p) = self.pending.get_mut(&key) else {
            return out;
        };
        let want = 4 + HELLO_LEN;
        if p.buf.len() + bytes.len() > want {
            let peer = p.peer;
            self.pending.remove(&key);
            out.push(Action::Drop {
                key,
                why: format!("{peer}: sent more than a hello"),
            });
            return out;
        }
        p.buf.extend_from_slice(bytes);
        if p.buf.len() >= 4 {
            let len = u32::from_le_bytes(p.buf[..4].try_into().expect("4 bytes")) as usize;
            if len != HELLO_LEN {
                let peer = p.peer;
                self.pending.remove(&key);
                out.push(Action::Drop {
                    key,
                    why: format!("{peer}: not a hello (frame length {len})"),
                });
                return out;
            }
        }
        if p.buf.len() < want {
            return out;
        }
        let p = self.pending.remove(&key).expect("present");
        match Hello::decode(&p.buf[4..]) {
            Err(why) => out.push(Action::Drop {
                key,
                why: format!("{}: {why}", p.peer),
            }),
            Ok(h) => self.hello(key, p.peer, &h, &mut out),
        }
        out
    }

    /// `key` closed (or failed). A held rank that leaves frees its place.
    pub(crate) fn closed(&mut self, key: Key) -> Vec<Action> {
        self.pending.remove(&key);
        if let Some(at) = self.held_at(key) {
            self.held.remove(&at);
        }
        Vec::new()
    }

    /// Drops pending connections that sent no hello within
    /// [`HELLO_DEADLINE`] of connecting.
    pub(crate) fn tick(&mut self, now: Instant) -> Vec<Action> {
        let late: Vec<Key> = self
            .pending
            .iter()
            .filter(|(_, p)| now.saturating_duration_since(p.since) >= HELLO_DEADLINE)
            .map(|(&k, _)| k)
            .collect();
        late.into_iter()
            .map(|key| {
                let p = self.pending.remove(&key).expect("listed");
                Action::Drop {
                    key,
                    why: format!("{}: sent no hello within {HELLO_DEADLINE:?}", p.peer),
                }
            })
            .collect()
    }

    fn held_at(&self, key: Key) -> Option<(u32, u32)> {
        self.held
            .iter()
            .find(|(_, h)| h.key == key)
            .map(|(&at, _)| at)
    }

    fn hello(&mut self, key: Key, peer: SocketAddr, h: &Hello, out: &mut Vec<Action>) {
        if !secrets_equal(&h.secret, &self.secret) {
            out.push(Action::Drop {
                key,
                why: format!("{peer}: wrong secret (not part of this job)"),
            });
            return;
        }
        let refuse = |why: String| Action::Refuse { key, why };
        if let Some(why) = &self.failed {
            // Counted against the size once rank 0 gives it; bounded so
            // strangers naming ever new ranks cannot grow it.
            if self.told.len() < MAX_TOLD {
                self.told.insert(h.rank);
            }
            out.push(refuse(why.clone()));
            return;
        }
        if self.admitted {
            let claimed = (h.nranks as usize == self.admitted_peers.len())
                .then(|| self.admitted_peers.get(h.rank as usize))
                .flatten();
            out.push(match claimed {
                Some(first) => Action::Impostor {
                    key,
                    why: duplicate(&self.secret, h.rank, *first, peer, "aborting the job"),
                },
                None => refuse("every rank has already joined this job".into()),
            });
            return;
        }
        let (rank, nranks) = (h.rank, h.nranks);
        let problem = if nranks == 0 || rank >= nranks {
            Some(format!("{peer}: rank {rank} of {nranks} is out of range"))
        } else {
            self.size.filter(|&n| n != nranks as usize).map(|n| {
                format!("rank {rank} ({peer}) says the job has {nranks} ranks; rank 0 says {n}")
            })
        };
        if let Some(why) = problem {
            out.push(refuse(why));
            return;
        }
        if let Some(first) = self.held.get(&(nranks, rank)) {
            let why = duplicate(&self.secret, rank, first.peer, peer, "refusing the job");
            self.failed = Some(why.clone());
            self.told.insert(rank);
            self.told.extend(self.held.keys().map(|&(_, r)| r));
            for (_, h) in std::mem::take(&mut self.held) {
                out.push(Action::Refuse {
                    key: h.key,
                    why: why.clone(),
                });
            }
            out.push(refuse(why));
            return;
        }
        self.held.insert((nranks, rank), Held { key, peer });
        self.complete(nranks, out);
    }

    /// Admits the ranks that claimed a job of `n` once all `n` have.
    /// Claims of other sizes (strangers', while rank 0's is not known) are
    /// refused then.
    fn complete(&mut self, n: u32, out: &mut Vec<Action>) {
        if self.held.range((n, 0)..=(n, u32::MAX)).count() == n as usize {
            self.admitted = true;
            let mut keys = Vec::with_capacity(n as usize);
            for ((claim, r), h) in std::mem::take(&mut self.held) {
                if claim == n {
                    keys.push(h.key);
                    self.admitted_peers.push(h.peer);
                } else {
                    out.push(Action::Refuse {
                        key: h.key,
                        why: format!(
                            "rank {r} ({}) says the job has {claim} ranks; it has {n}",
                            h.peer
                        ),
                    });
                }
            }
            // Unauthenticated leftovers have no business once the job is in.
            for (key, p) in std::mem::take(&mut self.pending) {
                out.push(Action::Drop {
                    key,
                    why: format!("{}: every rank has joined", p.peer),
                });
            }
            out.push(Action::Admit(keys));
        }
    }
}

/// The answer to a second claim of `rank`.
fn duplicate(
    secret: &[u8; 16],
    rank: u32,
    first: SocketAddr,
    second: SocketAddr,
    verdict: &str,
) -> String {
    let mut why = format!("rank {rank} was claimed twice: by {first} and by {second}; {verdict}");
    if *secret == [0; 16] {
        why.push_str(
            " (the rendezvous has no secret: set the same NCCL_RS_JOB_SECRET on every rank, as ncclrun does, to keep strangers out)",
        );
    }
    why
}

#[cfg(test)]
mod tests;
