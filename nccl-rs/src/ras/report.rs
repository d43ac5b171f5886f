//! The answer to a query, as a pure function of what the serving process
//! knows: its own state and each peer's last heartbeat with how long it
//! has been silent. A stopped process cannot answer, so it is found from
//! its missing heartbeats and from the other ranks' waits: each rank that
//! has waited longer than the stall threshold points at the peer it waits
//! on; following those pointers ends at the rank holding everyone up.

use super::wire::{CommTelemetry, PeerTelemetry, ProcState};
use crate::json;
use crate::observe::progress::{ProgressSnapshot, WaitRecord};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// How a peer process looks from the serving process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PeerStatus {
    /// Heartbeats arrive.
    Ok,
    /// Silent longer than the unresponsive deadline (stopped, hung, or
    /// its host or link is down).
    Unresponsive,
    /// Its connection closed while it still had communicators, or it was
    /// silent past the dead deadline.
    Dead,
    /// Closed its connection after its communicators were destroyed.
    Exited,
    /// Named at init, never heard from.
    NeverHeard,
}

impl PeerStatus {
    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            PeerStatus::Ok => "ok",
            PeerStatus::Unresponsive => "unresponsive",
            PeerStatus::Dead => "dead",
            PeerStatus::Exited => "exited",
            PeerStatus::NeverHeard => "never heard",
        }
    }
}

/// A process as the serving process knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerView {
    /// Its last heartbeat (for a process never heard from: only `addr`).
    pub state: ProcState,
    /// Its status.
    pub status: PeerStatus,
    /// Milliseconds since its last heartbeat.
    pub silent_ms: u64,
    /// Its telemetry, if it answered the query for it.
    pub telemetry: Option<Vec<CommTelemetry>>,
}

/// Everything a report is made of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobView {
    /// The serving process, as of now.
    pub me: ProcState,
    /// Every other process of the job.
    pub peers: Vec<PeerView>,
    /// A rank waiting this long (ms) on one peer and step is stalled.
    pub stall_ms: u64,
    /// The serving process's telemetry (`None`: not gathered).
    pub me_telemetry: Option<Vec<CommTelemetry>>,
}

/// What a rank is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RankState {
    /// No operation in flight.
    Idle,
    /// An operation in flight, moving (or waiting less than the stall
    /// threshold).
    Running,
    /// Waiting on one peer for longer than the stall threshold.
    Stalled,
    /// Its process is not heard from (its numbers are from its last
    /// heartbeat).
    Unresponsive,
    /// Its process died.
    Dead,
    /// Its process exited.
    Exited,
}

impl RankState {
    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            RankState::Idle => "idle",
            RankState::Running => "running",
            RankState::Stalled => "waiting",
            RankState::Unresponsive => "unresponsive",
            RankState::Dead => "dead",
            RankState::Exited => "exited",
        }
    }
}

/// One rank of a communicator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankRow {
    /// Its rank.
    pub rank: u32,
    /// Host and process id.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// What it does.
    pub state: RankState,
    /// Its record.
    pub progress: ProgressSnapshot,
    /// Its telemetry per peer (peers with anything counted); `None`: its
    /// process did not answer (or telemetry was not gathered).
    pub peers: Option<Vec<PeerTelemetry>>,
}

/// A rank that others wait on, or that is not heard from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stuck {
    /// The rank.
    pub rank: u32,
    /// Why: `unresponsive`, `dead`, `exited`, `missing`, `behind` (it has
    /// not started the operation the others wait in), `busy` (it is in
    /// that operation, not waiting) or `cycle` (the waits form a cycle).
    pub reason: &'static str,
    /// The operation (collective sequence number) it holds up: the one
    /// its waiters are in, else the one after its last completed.
    pub op: u64,
    /// The ranks waiting on it directly, with what for.
    pub waited_on_by: Vec<(u32, &'static str)>,
    /// Every stalled rank whose chain of waits ends at it.
    pub blocked: Vec<u32>,
}

/// The status of a communicator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommReport {
    /// Its identity.
    pub id: u64,
    /// Its size.
    pub nranks: u32,
    /// `ok`, `ranks behind`, `ranks missing` or `errors`.
    pub status: &'static str,
    /// Every rank heard of, by rank.
    pub ranks: Vec<RankRow>,
    /// Ranks no process reports.
    pub missing: Vec<u32>,
    /// Ranks holding others up.
    pub stuck: Vec<Stuck>,
    /// Its links with traffic, errors or retransmits, by rank pair.
    pub links: Vec<LinkRow>,
}

/// The link between two ranks of a communicator, both ends' counts
/// together (each end counts what it sent, its own errors and its own
/// sockets' retransmits).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkRow {
    /// The communicator.
    pub comm: u64,
    /// The lower rank, and its host.
    pub a: (u32, String),
    /// The higher rank, and its host.
    pub b: (u32, String),
    /// Payload bytes both ways.
    pub bytes: u64,
    /// Retransmitted segments or packets, both ends.
    pub retransmits: u64,
    /// Errors both ends saw on it: io, protocol, timeout, other.
    pub errors: [u64; 4],
    /// Whether [`rank_links`] flags it.
    pub outlier: bool,
}

impl LinkRow {
    /// Retransmits per MB (10^6 bytes) moved; 0 with nothing moved.
    pub fn per_mb(&self) -> f64 {
        if self.bytes == 0 {
            return if self.retransmits > 0 {
                f64::INFINITY
            } else {
                0.0
            };
        }
        self.retransmits as f64 * 1e6 / self.bytes as f64
    }

    /// `rank A (host X) <-> rank B (host Y)`.
    pub fn name(&self) -> String {
        format!(
            "rank {} (host {}) <-> rank {} (host {})",
            self.a.0, self.a.1, self.b.0, self.b.1
        )
    }
}

/// A link is an outlier with at least this many retransmits ...
pub const OUTLIER_MIN_RETRANSMITS: u64 = 3;
/// ... and at least this many times the median link's retransmits per MB.
pub const OUTLIER_FACTOR: f64 = 4.0;

/// Orders links worst first, by retransmits per MB, then retransmits, then
/// rank pair, and flags outliers: at least [`OUTLIER_MIN_RETRANSMITS`]
/// retransmits and at least [`OUTLIER_FACTOR`] times the median rate (the
/// lower median over every link; a clean fabric's median is 0, so there
/// any link retransmitting that often stands out).
pub fn rank_links(links: &mut [LinkRow]) {
    links.sort_by(|x, y| {
        y.per_mb()
            .total_cmp(&x.per_mb())
            .then(y.retransmits.cmp(&x.retransmits))
            .then(x.comm.cmp(&y.comm))
            .then(x.a.0.cmp(&y.a.0))
            .then(x.b.0.cmp(&y.b.0))
    });
    let mut rates: Vec<f64> = links.iter().map(LinkRow::per_mb).collect();
    rates.sort_by(f64::total_cmp);
    let median = match rates.len() {
        0 => 0.0,
        n => rates[(n - 1) / 2],
    };
    for l in links.iter_mut() {
        let r = l.per_mb();
        l.outlier =
            l.retransmits >= OUTLIER_MIN_RETRANSMITS && r > 0.0 && r >= OUTLIER_FACTOR * median;
    }
}

/// The links of a communicator from its ranks' telemetry.
fn links_of(id: u64, ranks: &[RankRow]) -> Vec<LinkRow> {
    #[derive(Default)]
    struct Acc {
        ab: u64,
        ba: u64,
        retransmits: u64,
        errors: [u64; 4],
    }
    let host = |r: u32| {
        ranks
            .iter()
            .find(|x| x.rank == r)
            .map_or_else(|| "?".to_string(), |x| x.host.clone())
    };
    let mut m: BTreeMap<(u32, u32), Acc> = BTreeMap::new();
    for row in ranks {
        for p in row.peers.iter().flatten() {
            if p.peer == row.rank {
                continue;
            }
            let (a, b) = (row.rank.min(p.peer), row.rank.max(p.peer));
            let acc = m.entry((a, b)).or_default();
            // Each direction as the end that saw more of it counts it (the
            // other end may not have answered).
            let (ab, ba) = if row.rank == a {
                (p.bytes_sent, p.bytes_recv)
            } else {
                (p.bytes_recv, p.bytes_sent)
            };
            acc.ab = acc.ab.max(ab);
            acc.ba = acc.ba.max(ba);
            acc.retransmits = acc.retransmits.saturating_add(p.retransmits);
            let e = [
                p.io_errors,
                p.protocol_errors,
                p.timeout_errors,
                p.other_errors,
            ];
            for (x, y) in acc.errors.iter_mut().zip(e) {
                *x = x.saturating_add(y);
            }
        }
    }
    m.into_iter()
        .filter(|(_, acc)| {
            acc.ab > 0 || acc.ba > 0 || acc.retransmits > 0 || acc.errors.iter().any(|&e| e > 0)
        })
        .map(|((a, b), acc)| LinkRow {
            comm: id,
            a: (a, host(a)),
            b: (b, host(b)),
            bytes: acc.ab.saturating_add(acc.ba),
            retransmits: acc.retransmits,
            errors: acc.errors,
            outlier: false,
        })
        .collect()
}

/// A process row of the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcRow {
    /// Peer address of its RAS thread.
    pub addr: String,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Status (the serving process is `ok`).
    pub status: PeerStatus,
    /// Milliseconds since its last heartbeat.
    pub silent_ms: u64,
    /// Its ranks in the largest communicator.
    pub ranks: Vec<u32>,
}

/// The answer to a status query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The serving process.
    pub served_by: ProcRow,
    /// Distinct hosts.
    pub hosts: usize,
    /// Every process, serving one first.
    pub processes: Vec<ProcRow>,
    /// Ranks of the largest communicator.
    pub ranks: u32,
    /// Every communicator, by id.
    pub comms: Vec<CommReport>,
    /// Link errors: the transport's (links with errors or retransmits,
    /// worst first), then the RAS connections', each prefixed with the
    /// process that saw it.
    pub link_errors: Vec<String>,
    /// Every communicator's links, ranked by [`rank_links`].
    pub links: Vec<LinkRow>,
    /// Processes whose telemetry is in (the serving one included), of all
    /// processes; `None`: telemetry was not gathered.
    pub telemetry: Option<(usize, usize)>,
    /// With telemetry gathered: the processes that did not answer.
    pub no_telemetry: Vec<ProcRow>,
}

impl Report {
    /// Analyses `view`.
    pub fn build(view: &JobView) -> Report {
        let me = PeerView {
            state: view.me.clone(),
            status: PeerStatus::Ok,
            silent_ms: 0,
            telemetry: view.me_telemetry.clone(),
        };
        let all: Vec<&PeerView> = std::iter::once(&me).chain(view.peers.iter()).collect();
        // The largest communicator (the world, usually): the lowest id of
        // the largest size, so the choice is the same on every query.
        let world = all
            .iter()
            .flat_map(|p| p.state.comms.iter())
            .map(|c| (std::cmp::Reverse(c.nranks), c.comm_id))
            .min()
            .map(|(n, id)| (n.0, id));
        let processes: Vec<ProcRow> = all
            .iter()
            .map(|p| ProcRow {
                addr: p.state.addr.clone(),
                host: p.state.host.clone(),
                pid: p.state.pid,
                status: p.status,
                silent_ms: p.silent_ms,
                ranks: p
                    .state
                    .comms
                    .iter()
                    .filter(|c| Some(c.comm_id) == world.map(|w| w.1))
                    .map(|c| c.rank)
                    .collect(),
            })
            .collect();
        let hosts = all
            .iter()
            .filter(|p| p.status != PeerStatus::NeverHeard)
            .map(|p| p.state.host.as_str())
            .collect::<BTreeSet<_>>()
            .len();
        let mut by_comm: BTreeMap<u64, Vec<RankRow>> = BTreeMap::new();
        for p in &all {
            for c in &p.state.comms {
                let state = match p.status {
                    PeerStatus::Unresponsive | PeerStatus::NeverHeard => RankState::Unresponsive,
                    PeerStatus::Dead => RankState::Dead,
                    PeerStatus::Exited => RankState::Exited,
                    PeerStatus::Ok => match &c.wait {
                        _ if c.coll_started == c.coll_done && c.p2p_started == c.p2p_done => {
                            RankState::Idle
                        }
                        Some(w) if w.ms >= view.stall_ms => RankState::Stalled,
                        _ => RankState::Running,
                    },
                };
                let peers = p.telemetry.as_ref().map(|t| {
                    t.iter()
                        .find(|x| x.comm_id == c.comm_id && x.rank == c.rank)
                        .map(|x| x.peers.clone())
                        .unwrap_or_default()
                });
                by_comm.entry(c.comm_id).or_default().push(RankRow {
                    rank: c.rank,
                    host: p.state.host.clone(),
                    pid: p.state.pid,
                    state,
                    progress: c.clone(),
                    peers,
                });
            }
        }
        let comms: Vec<CommReport> = by_comm
            .into_iter()
            .map(|(id, mut ranks)| {
                ranks.sort_by_key(|r| r.rank);
                ranks.dedup_by_key(|r| r.rank);
                comm_report(id, ranks)
            })
            .collect();
        let mut links: Vec<LinkRow> = comms.iter().flat_map(|c| c.links.clone()).collect();
        rank_links(&mut links);
        let mut link_errors: Vec<String> = links
            .iter()
            .filter(|l| l.retransmits > 0 || l.errors.iter().any(|&e| e > 0))
            .map(|l| {
                format!(
                    "comm {}: {}: {} retransmits ({:.3} per MB of {} B), errors io {} protocol {} timeout {} other {}{}",
                    comm_id_hex(l.comm),
                    l.name(),
                    l.retransmits,
                    l.per_mb(),
                    l.bytes,
                    l.errors[0],
                    l.errors[1],
                    l.errors[2],
                    l.errors[3],
                    if l.outlier { " OUTLIER" } else { "" }
                )
            })
            .collect();
        let telemetry = all.iter().any(|p| p.telemetry.is_some()).then(|| {
            (
                all.iter().filter(|p| p.telemetry.is_some()).count(),
                all.len(),
            )
        });
        let no_telemetry: Vec<ProcRow> = match telemetry {
            None => Vec::new(),
            Some(_) => all
                .iter()
                .zip(&processes)
                .filter(|(p, _)| p.telemetry.is_none())
                .map(|(_, row)| row.clone())
                .collect(),
        };
        for p in &all {
            for e in &p.state.link_errors {
                link_errors.push(format!("{} pid {}: {e}", p.state.host, p.state.pid));
            }
        }
        Report {
            served_by: processes[0].clone(),
            hosts,
            processes,
            ranks: world.map_or(0, |w| w.0),
            comms,
            link_errors,
            links,
            telemetry,
            no_telemetry,
        }
    }
}

fn comm_report(id: u64, ranks: Vec<RankRow>) -> CommReport {
    let nranks = ranks.iter().map(|r| r.progress.nranks).max().unwrap_or(0);
    let have: BTreeSet<u32> = ranks.iter().map(|r| r.rank).collect();
    let missing: Vec<u32> = (0..nranks).filter(|r| !have.contains(r)).collect();
    let row = |r: u32| ranks.iter().find(|x| x.rank == r);
    let stalled_on = |x: &RankRow| -> Option<WaitRecord> {
        match x.state {
            RankState::Stalled => x.progress.wait,
            _ => None,
        }
    };
    // Follow each stalled rank's waits to where they end.
    let mut ends: BTreeMap<u32, (&'static str, BTreeSet<u32>)> = BTreeMap::new();
    for x in &ranks {
        if stalled_on(x).is_none() {
            continue;
        }
        let mut seen = vec![x.rank];
        let mut at = x;
        let (end, reason) = loop {
            let w = stalled_on(at).expect("only stalled ranks are followed");
            let Some(next) = row(w.peer) else {
                break (w.peer, "missing");
            };
            match next.state {
                RankState::Stalled if seen.contains(&next.rank) => {
                    break (seen.iter().copied().min().unwrap_or(next.rank), "cycle")
                }
                RankState::Stalled => {
                    seen.push(next.rank);
                    at = next;
                }
                RankState::Unresponsive => break (next.rank, "unresponsive"),
                RankState::Dead => break (next.rank, "dead"),
                RankState::Exited => break (next.rank, "exited"),
                RankState::Idle | RankState::Running => {
                    let behind = next.progress.coll_started < at.progress.coll_started
                        || next.state == RankState::Idle;
                    break (next.rank, if behind { "behind" } else { "busy" });
                }
            }
        };
        let e = ends.entry(end).or_insert((reason, BTreeSet::new()));
        e.1.insert(x.rank);
    }
    // Ranks not heard from are holding up whoever comes to need them.
    for x in &ranks {
        let reason = match x.state {
            RankState::Unresponsive => "unresponsive",
            RankState::Dead => "dead",
            _ => continue,
        };
        ends.entry(x.rank).or_insert((reason, BTreeSet::new()));
    }
    let stuck = ends
        .into_iter()
        .map(|(rank, (reason, blocked))| {
            let mut waited_on_by: Vec<(u32, &'static str)> = ranks
                .iter()
                .filter_map(|x| {
                    let w = stalled_on(x)?;
                    (w.peer == rank && x.rank != rank).then_some((x.rank, w.kind.name()))
                })
                .collect();
            waited_on_by.sort_unstable();
            let op = blocked
                .iter()
                .filter_map(|b| row(*b))
                .map(|b| b.progress.coll_started)
                .max()
                .or_else(|| row(rank).map(|r| r.progress.coll_done + 1))
                .unwrap_or(0);
            Stuck {
                rank,
                reason,
                op,
                waited_on_by,
                blocked: blocked.into_iter().filter(|b| *b != rank).collect(),
            }
        })
        .collect::<Vec<_>>();
    let errors = ranks
        .iter()
        .any(|r| r.progress.error.is_some() || r.state == RankState::Dead);
    let status = if errors {
        "errors"
    } else if !missing.is_empty() {
        "ranks missing"
    } else if !stuck.is_empty() {
        "ranks behind"
    } else {
        "ok"
    };
    let mut links = links_of(id, &ranks);
    rank_links(&mut links);
    CommReport {
        id,
        nranks,
        status,
        ranks,
        missing,
        stuck,
        links,
    }
}

fn list<T>(items: &[T], f: impl Fn(&T) -> String) -> String {
    let v: Vec<String> = items.iter().map(f).collect();
    format!("[{}]", v.join(","))
}

fn proc_json(p: &ProcRow) -> String {
    format!(
        "{{\"host\":{},\"pid\":{},\"addr\":{},\"status\":{},\"silent_ms\":{},\"ranks\":{}}}",
        json::string(&p.host),
        p.pid,
        json::string(&p.addr),
        json::string(p.status.name()),
        p.silent_ms,
        list(&p.ranks, |r| r.to_string())
    )
}

fn wait_json(w: &Option<WaitRecord>) -> String {
    match w {
        None => "null".into(),
        Some(w) => format!(
            "{{\"peer\":{},\"what\":{},\"step\":{},\"steps\":{},\"ms\":{}}}",
            w.peer,
            json::string(w.kind.name()),
            w.step,
            w.steps,
            w.ms
        ),
    }
}

fn peer_json(p: &PeerTelemetry) -> String {
    format!(
        "{{\"peer\":{},\"bytes_sent\":{},\"bytes_recv\":{},\"msgs_sent\":{},\"msgs_recv\":{},\"recv_wait_ns\":{},\"send_wait_ns\":{},\"errors\":{{\"io\":{},\"protocol\":{},\"timeout\":{},\"other\":{}}},\"retransmits\":{},\"direct_bytes\":{}}}",
        p.peer,
        p.bytes_sent,
        p.bytes_recv,
        p.msgs_sent,
        p.msgs_recv,
        p.recv_wait_ns,
        p.send_wait_ns,
        p.io_errors,
        p.protocol_errors,
        p.timeout_errors,
        p.other_errors,
        p.retransmits,
        p.direct_bytes
    )
}

fn link_json(l: &LinkRow) -> String {
    let rate = l.per_mb();
    format!(
        "{{\"comm\":{},\"a\":{{\"rank\":{},\"host\":{}}},\"b\":{{\"rank\":{},\"host\":{}}},\"name\":{},\"bytes\":{},\"retransmits\":{},\"retransmits_per_mb\":{},\"errors\":{{\"io\":{},\"protocol\":{},\"timeout\":{},\"other\":{}}},\"outlier\":{}}}",
        json::string(&comm_id_hex(l.comm)),
        l.a.0,
        json::string(&l.a.1),
        l.b.0,
        json::string(&l.b.1),
        json::string(&l.name()),
        l.bytes,
        l.retransmits,
        if rate.is_finite() { format!("{rate:.6}") } else { "null".into() },
        l.errors[0],
        l.errors[1],
        l.errors[2],
        l.errors[3],
        l.outlier
    )
}

fn comm_id_hex(id: u64) -> String {
    format!("{id:016x}")
}

impl Report {
    /// The JSON form (one object, one line).
    pub fn to_json(&self) -> String {
        let comms = list(&self.comms, |c| {
            let ranks = list(&c.ranks, |r| {
                let p = &r.progress;
                format!(
                    "{{\"rank\":{},\"host\":{},\"pid\":{},\"state\":{},\"last_started\":{},\"last_completed\":{},\"op\":{},\"p2p_started\":{},\"p2p_completed\":{},\"waiting_on\":{},\"error\":{},\"telemetry\":{}}}",
                    r.rank,
                    json::string(&r.host),
                    r.pid,
                    json::string(r.state.name()),
                    p.coll_started,
                    p.coll_done,
                    json::string(&p.op),
                    p.p2p_started,
                    p.p2p_done,
                    wait_json(&p.wait),
                    p.error.as_deref().map_or("null".into(), json::string),
                    r.peers
                        .as_ref()
                        .map_or("null".into(), |v| list(v, peer_json))
                )
            });
            let stuck = list(&c.stuck, |s| {
                format!(
                    "{{\"rank\":{},\"reason\":{},\"op\":{},\"waited_on_by\":{},\"blocked\":{}}}",
                    s.rank,
                    json::string(s.reason),
                    s.op,
                    list(&s.waited_on_by, |(r, k)| format!(
                        "{{\"rank\":{r},\"what\":{}}}",
                        json::string(k)
                    )),
                    list(&s.blocked, |r| r.to_string())
                )
            });
            format!(
                "{{\"id\":{},\"nranks\":{},\"status\":{},\"missing_ranks\":{},\"stuck\":{},\"ranks\":{},\"links\":{}}}",
                json::string(&comm_id_hex(c.id)),
                c.nranks,
                json::string(c.status),
                list(&c.missing, |r| r.to_string()),
                stuck,
                ranks,
                list(&c.links, link_json)
            )
        });
        let dead: Vec<&ProcRow> = self
            .processes
            .iter()
            .filter(|p| p.status == PeerStatus::Dead)
            .collect();
        format!(
            "{{\"nccl_rs_ras\":1,\"served_by\":{},\"job\":{{\"hosts\":{},\"processes\":{},\"ranks\":{}}},\"processes\":{},\"communicators\":{},\"dead_peers\":{},\"link_errors\":{},\"links\":{},\"telemetry\":{}}}\n",
            proc_json(&self.served_by),
            self.hosts,
            self.processes.len(),
            self.ranks,
            list(&self.processes, proc_json),
            comms,
            list(&dead, |p| proc_json(p)),
            list(&self.link_errors, |e| json::string(e)),
            list(&self.links, link_json),
            self.telemetry.map_or("null".into(), |(n, m)| format!(
                "{{\"answered\":{n},\"processes\":{m},\"no_answer\":{}}}",
                list(&self.no_telemetry, proc_json)
            ))
        )
    }

    /// The text form; `verbose` adds every rank's row.
    pub fn to_text(&self, verbose: bool) -> String {
        let mut o = String::new();
        let s = &self.served_by;
        let _ = writeln!(
            o,
            "nccl-rs RAS status, served by {} pid {} ({})\n",
            s.host, s.pid, s.addr
        );
        let _ = writeln!(o, "Job summary");
        let _ = writeln!(o, "===========");
        let _ = writeln!(
            o,
            "  {} hosts, {} processes, {} ranks",
            self.hosts,
            self.processes.len(),
            self.ranks
        );
        let mut count: BTreeMap<PeerStatus, usize> = BTreeMap::new();
        for p in &self.processes {
            *count.entry(p.status).or_default() += 1;
        }
        let counts: Vec<String> = count
            .iter()
            .map(|(k, n)| format!("{n} {}", k.name()))
            .collect();
        let _ = writeln!(o, "  processes: {}", counts.join(", "));
        if let Some((n, m)) = self.telemetry {
            let bad = self.links.iter().filter(|l| l.retransmits > 0).count();
            let _ = writeln!(
                o,
                "  telemetry: {n} of {m} processes answered; {} links, {bad} with retransmits{}",
                self.links.len(),
                match self.links.iter().filter(|l| l.outlier).count() {
                    0 => String::new(),
                    k => format!(", {k} outliers"),
                }
            );
            for p in &self.no_telemetry {
                let _ = writeln!(
                    o,
                    "  NO TELEMETRY from {} pid {} ({}), ranks {:?}",
                    p.host, p.pid, p.addr, p.ranks
                );
            }
        }
        for p in self.processes.iter().filter(|p| p.status != PeerStatus::Ok) {
            let _ = writeln!(
                o,
                "  {} process {} pid {} ({}), ranks {:?}, silent {:.1} s",
                p.status.name().to_uppercase(),
                p.host,
                p.pid,
                p.addr,
                p.ranks,
                p.silent_ms as f64 / 1000.0
            );
        }
        let _ = writeln!(o, "\nCommunicators");
        let _ = writeln!(o, "=============");
        let _ = writeln!(
            o,
            "  {:<16}  {:>5}  {:<13}  {:>13}  {:>15}",
            "id", "ranks", "status", "ops started", "ops completed"
        );
        for c in &self.comms {
            let span = |f: fn(&ProgressSnapshot) -> u64| {
                let v: Vec<u64> = c.ranks.iter().map(|r| f(&r.progress)).collect();
                let (lo, hi) = (v.iter().min(), v.iter().max());
                match (lo, hi) {
                    (Some(l), Some(h)) if l == h => l.to_string(),
                    (Some(l), Some(h)) => format!("{l}..{h}"),
                    _ => "-".into(),
                }
            };
            let _ = writeln!(
                o,
                "  {:<16}  {:>5}  {:<13}  {:>13}  {:>15}",
                comm_id_hex(c.id),
                format!("{}/{}", c.ranks.len(), c.nranks),
                c.status.to_uppercase(),
                span(|p| p.coll_started),
                span(|p| p.coll_done)
            );
            if !c.missing.is_empty() {
                let _ = writeln!(o, "    missing ranks: {:?}", c.missing);
            }
            for st in &c.stuck {
                let r = c.ranks.iter().find(|r| r.rank == st.rank);
                let at = r.map_or(String::new(), |r| {
                    // A silent process's numbers are from its last heartbeat.
                    let heard = match r.state {
                        RankState::Unresponsive | RankState::Dead | RankState::Exited => {
                            "last heard: "
                        }
                        _ => "",
                    };
                    format!(
                        " ({} pid {}; {heard}started #{}, completed #{})",
                        r.host, r.pid, r.progress.coll_started, r.progress.coll_done
                    )
                });
                let _ = writeln!(
                    o,
                    "    rank {} {}{at}: holds up op #{}",
                    st.rank,
                    st.reason.to_uppercase(),
                    st.op
                );
                if !st.waited_on_by.is_empty() {
                    let w: Vec<String> = st
                        .waited_on_by
                        .iter()
                        .map(|(r, k)| format!("{r} ({k})"))
                        .collect();
                    let _ = writeln!(o, "      waited on by ranks {}", w.join(", "));
                }
                if st.blocked.len() > st.waited_on_by.len() {
                    let _ = writeln!(o, "      blocking ranks {:?}", st.blocked);
                }
            }
            for r in c.ranks.iter().filter(|r| r.progress.error.is_some()) {
                let _ = writeln!(
                    o,
                    "    rank {} error: {}",
                    r.rank,
                    r.progress.error.as_deref().unwrap_or("")
                );
            }
            if verbose {
                let _ = writeln!(
                    o,
                    "    {:>5}  {:<14}  {:>8}  {:<12}  {:>9}  {:>9}  waiting on",
                    "rank", "host", "pid", "state", "started", "completed"
                );
                for r in &c.ranks {
                    let w = match &r.progress.wait {
                        Some(w) if r.state != RankState::Idle => format!(
                            "rank {} ({}, step {}/{}, {} ms)",
                            w.peer,
                            w.kind.name(),
                            w.step,
                            w.steps,
                            w.ms
                        ),
                        _ => "-".into(),
                    };
                    let _ = writeln!(
                        o,
                        "    {:>5}  {:<14}  {:>8}  {:<12}  {:>9}  {:>9}  {w}",
                        r.rank,
                        r.host,
                        r.pid,
                        r.state.name(),
                        r.progress.coll_started,
                        r.progress.coll_done
                    );
                }
                if c.ranks.iter().any(|r| r.peers.is_some()) {
                    peer_table(&mut o, c);
                }
            }
        }
        let dead: Vec<String> = self
            .processes
            .iter()
            .filter(|p| p.status == PeerStatus::Dead)
            .map(|p| format!("{} pid {} ranks {:?}", p.host, p.pid, p.ranks))
            .collect();
        let _ = writeln!(
            o,
            "\nDead peers: {}",
            if dead.is_empty() {
                "none".into()
            } else {
                dead.join("; ")
            }
        );
        let _ = writeln!(
            o,
            "Link errors:{}",
            if self.link_errors.is_empty() {
                " none"
            } else {
                ""
            }
        );
        for e in &self.link_errors {
            let _ = writeln!(o, "  {e}");
        }
        o
    }
}

/// The verbose per-rank, per-peer telemetry table of a communicator.
fn peer_table(o: &mut String, c: &CommReport) {
    let _ = writeln!(
        o,
        "    {:>5}  {:>5}  {:>14}  {:>9}  {:>14}  {:>9}  {:>10}  {:>10}  {:>15}  {:>7}",
        "rank",
        "peer",
        "bytes sent",
        "msgs sent",
        "bytes recv",
        "msgs recv",
        "wait recv",
        "wait send",
        "errors i/p/t/o",
        "retrans"
    );
    for r in &c.ranks {
        match &r.peers {
            None => {
                let _ = writeln!(o, "    {:>5}  telemetry: no answer", r.rank);
            }
            Some(v) => {
                for p in v {
                    let _ = writeln!(
                        o,
                        "    {:>5}  {:>5}  {:>14}  {:>9}  {:>14}  {:>9}  {:>8.1}ms  {:>8.1}ms  {:>15}  {:>7}",
                        r.rank,
                        p.peer,
                        p.bytes_sent,
                        p.msgs_sent,
                        p.bytes_recv,
                        p.msgs_recv,
                        p.recv_wait_ns as f64 / 1e6,
                        p.send_wait_ns as f64 / 1e6,
                        format!(
                            "{}/{}/{}/{}",
                            p.io_errors, p.protocol_errors, p.timeout_errors, p.other_errors
                        ),
                        p.retransmits
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
