use super::*;
use crate::observe::progress::WaitKind;
use crate::ras::wire::{CommTelemetry, PeerTelemetry};

/// A recorded wait: (peer, kind, ms).
type Wait = Option<(u32, WaitKind, u64)>;

/// Rank `rank` of an 8-rank communicator 0xc0, at `started`/`done`,
/// waiting on `wait`.
fn rank(rank: u32, started: u64, done: u64, wait: Wait) -> ProgressSnapshot {
    ProgressSnapshot {
        comm_id: 0xc0,
        rank,
        nranks: 8,
        coll_started: started,
        coll_done: done,
        op: "AllReduce".into(),
        p2p_started: 0,
        p2p_done: 0,
        wait: wait.map(|(peer, kind, ms)| WaitRecord {
            peer,
            kind,
            step: 3,
            steps: 14,
            ms,
        }),
        error: None,
    }
}

fn proc(i: u32, comms: Vec<ProgressSnapshot>) -> ProcState {
    ProcState {
        addr: format!("10.77.0.{}:4000", i / 2 + 1),
        pid: 100 + i,
        host: format!("h{}", i / 2),
        comms,
        link_errors: Vec::new(),
    }
}

fn peer(state: ProcState, status: PeerStatus, silent_ms: u64) -> PeerView {
    PeerView {
        state,
        status,
        silent_ms,
        telemetry: None,
    }
}

/// Eight single-rank processes, two per host, every rank in op 41 (40
/// completed), rank 3's process `status3`, rank `r` waiting as `waits`
/// says; served by rank 0's process.
fn ring_view(status3: PeerStatus, waits: &[(u32, Wait)]) -> JobView {
    let mut procs: Vec<ProcState> = (0..8)
        .map(|r| proc(r, vec![rank(r, 41, 40, None)]))
        .collect();
    for (r, w) in waits {
        procs[*r as usize].comms[0].wait = w.map(|(peer, kind, ms)| WaitRecord {
            peer,
            kind,
            step: 3,
            steps: 14,
            ms,
        });
    }
    let me = procs.remove(0);
    JobView {
        me,
        peers: procs
            .into_iter()
            .enumerate()
            .map(|(i, p)| match i + 1 {
                3 => peer(p, status3, 1300),
                _ => peer(p, PeerStatus::Ok, 50),
            })
            .collect(),
        stall_ms: 200,
        me_telemetry: None,
    }
}

#[test]
fn a_stopped_rank_is_named_with_its_op_and_waiters() {
    use WaitKind::*;
    // Ring 0..7: rank 4 waits on data from 3, rank 2 on its send to 3,
    // the others on their ring predecessors (transitively on 3).
    let v = ring_view(
        PeerStatus::Unresponsive,
        &[
            (4, Some((3, Recv, 900))),
            (2, Some((3, Send, 900))),
            (5, Some((4, Recv, 800))),
            (6, Some((5, Recv, 800))),
            (7, Some((6, Recv, 800))),
            (0, Some((7, Recv, 800))),
            (1, Some((0, Recv, 800))),
            // Its last heartbeat said it waited too: not followed.
            (3, Some((2, Recv, 5))),
        ],
    );
    let r = Report::build(&v);
    assert_eq!((r.hosts, r.processes.len(), r.ranks), (4, 8, 8));
    let c = &r.comms[0];
    assert_eq!(c.status, "ranks behind");
    assert_eq!(
        c.stuck,
        vec![Stuck {
            rank: 3,
            reason: "unresponsive",
            op: 41,
            waited_on_by: vec![(2, "send"), (4, "recv")],
            blocked: vec![0, 1, 2, 4, 5, 6, 7],
        }]
    );
    assert_eq!(c.ranks[3].state, RankState::Unresponsive);
    assert_eq!(c.ranks[4].state, RankState::Stalled);
    let json = r.to_json();
    assert!(json.contains(
        "\"stuck\":[{\"rank\":3,\"reason\":\"unresponsive\",\"op\":41,\"waited_on_by\":[{\"rank\":2,\"what\":\"send\"},{\"rank\":4,\"what\":\"recv\"}],\"blocked\":[0,1,2,4,5,6,7]}]"
    ), "{json}");
    let text = r.to_text(false);
    assert!(text.contains("    rank 3 UNRESPONSIVE (h1 pid 103; last heard: started #41, completed #40): holds up op #41\n      waited on by ranks 2 (send), 4 (recv)\n"), "{text}");
}

#[test]
fn short_waits_are_not_stalls() {
    let v = ring_view(PeerStatus::Ok, &[(4, Some((3, WaitKind::Recv, 150)))]);
    let r = Report::build(&v);
    assert_eq!(r.comms[0].status, "ok");
    assert!(r.comms[0].stuck.is_empty());
    assert_eq!(r.comms[0].ranks[4].state, RankState::Running);
}

#[test]
fn a_rank_that_never_called_is_behind() {
    // Rank 5 finished op 40 and never started 41: idle, waited on.
    let mut v = ring_view(PeerStatus::Ok, &[(6, Some((5, WaitKind::Recv, 5000)))]);
    v.peers[4].state.comms[0].coll_started = 40;
    let r = Report::build(&v);
    let c = &r.comms[0];
    assert_eq!(c.ranks[5].state, RankState::Idle);
    assert_eq!(
        c.stuck,
        vec![Stuck {
            rank: 5,
            reason: "behind",
            op: 41,
            waited_on_by: vec![(6, "recv")],
            blocked: vec![6],
        }]
    );
}

#[test]
fn waits_in_a_cycle_are_reported_once() {
    use WaitKind::*;
    let v = ring_view(
        PeerStatus::Ok,
        &[(1, Some((2, Recv, 900))), (2, Some((1, Recv, 900)))],
    );
    let c = &Report::build(&v).comms[0];
    assert_eq!(c.stuck.len(), 1);
    assert_eq!((c.stuck[0].rank, c.stuck[0].reason), (1, "cycle"));
    assert_eq!(c.stuck[0].blocked, vec![2]);
}

#[test]
fn dead_and_missing_ranks() {
    let mut v = ring_view(PeerStatus::Dead, &[]);
    v.peers.remove(6); // rank 7's process: no record at all
    let r = Report::build(&v);
    let c = &r.comms[0];
    assert_eq!(c.status, "errors");
    assert_eq!(c.missing, vec![7]);
    assert_eq!(c.stuck.len(), 1);
    assert_eq!(
        (c.stuck[0].rank, c.stuck[0].reason, c.stuck[0].op),
        (3, "dead", 41)
    );
    assert!(r
        .to_json()
        .contains("\"dead_peers\":[{\"host\":\"h1\",\"pid\":103,"));
    assert!(r
        .to_text(false)
        .contains("Dead peers: h1 pid 103 ranks [3]\n"));
}

#[test]
fn a_waiter_on_a_rank_nobody_reports_names_it_missing() {
    let mut v = ring_view(PeerStatus::Ok, &[(0, Some((7, WaitKind::Recv, 900)))]);
    v.peers.remove(6);
    let c = &Report::build(&v).comms[0];
    assert_eq!(c.status, "ranks missing");
    assert_eq!((c.stuck[0].rank, c.stuck[0].reason), (7, "missing"));
}

#[test]
fn errors_and_link_errors_are_reported() {
    let mut v = ring_view(PeerStatus::Ok, &[]);
    v.peers[1].state.comms[0].error = Some("rank 2: peer 3: connection reset".into());
    v.peers[1].state.link_errors = vec!["connecting to peer 10.77.0.2:4000: refused".into()];
    let r = Report::build(&v);
    assert_eq!(r.comms[0].status, "errors");
    assert_eq!(
        r.link_errors,
        vec!["h1 pid 102: connecting to peer 10.77.0.2:4000: refused".to_string()]
    );
    let t = r.to_text(true);
    assert!(
        t.contains("    rank 2 error: rank 2: peer 3: connection reset\n"),
        "{t}"
    );
}

#[test]
fn healthy_job_text_is_exact() {
    let v = ring_view(PeerStatus::Ok, &[]);
    let mut v = v;
    v.peers.truncate(1);
    for p in &mut v.peers {
        p.state.comms[0].nranks = 2;
        p.state.comms[0].coll_done = 41;
    }
    v.me.comms[0].nranks = 2;
    v.me.comms[0].coll_done = 41;
    let text = Report::build(&v).to_text(true);
    let want = "\
nccl-rs RAS status, served by h0 pid 100 (10.77.0.1:4000)

Job summary
===========
  1 hosts, 2 processes, 2 ranks
  processes: 2 ok

Communicators
=============
  id                ranks  status           ops started    ops completed
  00000000000000c0    2/2  OK                        41               41
     rank  host                 pid  state           started  completed  waiting on
        0  h0                   100  idle                 41         41  -
        1  h0                   101  idle                 41         41  -

Dead peers: none
Link errors: none
";
    assert_eq!(text, want);
}

fn link(a: u32, b: u32, bytes: u64, retransmits: u64) -> LinkRow {
    LinkRow {
        comm: 0xc0,
        a: (a, format!("h{a}")),
        b: (b, format!("h{b}")),
        bytes,
        retransmits,
        errors: [0; 4],
        outlier: false,
    }
}

#[test]
fn links_rank_by_retransmits_per_mb_and_flag_outliers() {
    // (links as (a, b, bytes, retransmits), expected order as (a, b), outliers)
    type Case = (Vec<(u32, u32, u64, u64)>, Vec<(u32, u32)>, Vec<(u32, u32)>);
    let table: Vec<Case> = vec![
        // A clean fabric: nothing flagged, order by rank pair.
        (
            vec![(0, 1, 1_000_000, 0), (1, 2, 1_000_000, 0)],
            vec![(0, 1), (1, 2)],
            vec![],
        ),
        // One lossy link among clean ones.
        (
            vec![
                (0, 1, 6_000_000, 0),
                (1, 2, 6_000_000, 300),
                (2, 3, 6_000_000, 2),
                (0, 3, 6_000_000, 0),
            ],
            vec![(1, 2), (2, 3), (0, 1), (0, 3)],
            vec![(1, 2)],
        ),
        // Rate, not count: fewer retransmits on far fewer bytes rank first
        // (10 per MB against 0.5, the lower median: an outlier).
        (
            vec![(0, 1, 100_000_000, 50), (2, 3, 1_000_000, 10)],
            vec![(2, 3), (0, 1)],
            vec![(2, 3)],
        ),
        // Close rates: neither stands out.
        (
            vec![(0, 1, 1_000_000, 5), (2, 3, 1_000_000, 12)],
            vec![(2, 3), (0, 1)],
            vec![],
        ),
        // Below the minimum count: never an outlier.
        (
            vec![(0, 1, 1_000, 2), (1, 2, 1_000_000, 0), (2, 3, 1_000_000, 0)],
            vec![(0, 1), (1, 2), (2, 3)],
            vec![],
        ),
        // Everyone retransmits alike: the median is high, nobody stands out;
        // a link at 4x the median does.
        (
            vec![
                (0, 1, 1_000_000, 10),
                (1, 2, 1_000_000, 10),
                (2, 3, 1_000_000, 10),
                (0, 3, 1_000_000, 40),
            ],
            vec![(0, 3), (0, 1), (1, 2), (2, 3)],
            vec![(0, 3)],
        ),
        // Retransmits with no bytes counted rank first.
        (
            vec![(0, 1, 1_000_000, 5), (1, 2, 0, 3)],
            vec![(1, 2), (0, 1)],
            vec![(1, 2)],
        ),
        (vec![], vec![], vec![]),
    ];
    for (links, order, outliers) in table {
        let mut v: Vec<LinkRow> = links.iter().map(|&(a, b, x, r)| link(a, b, x, r)).collect();
        rank_links(&mut v);
        let got: Vec<(u32, u32)> = v.iter().map(|l| (l.a.0, l.b.0)).collect();
        assert_eq!(got, order, "{links:?}");
        let flagged: Vec<(u32, u32)> = v
            .iter()
            .filter(|l| l.outlier)
            .map(|l| (l.a.0, l.b.0))
            .collect();
        assert_eq!(flagged, outliers, "{links:?}");
    }
}

/// Rank `r`'s telemetry: sends `bytes` to `next`, receives as much from
/// `prev`, with `retrans` retransmits towards `next`.
fn ring_tel(r: u32, next: u32, prev: u32, bytes: u64, retrans: u64) -> Vec<CommTelemetry> {
    let mut peers = vec![
        PeerTelemetry {
            peer: next,
            bytes_sent: bytes,
            msgs_sent: 14,
            send_wait_ns: 2_000_000,
            retransmits: retrans,
            ..PeerTelemetry::default()
        },
        PeerTelemetry {
            peer: prev,
            bytes_recv: bytes,
            msgs_recv: 14,
            recv_wait_ns: 1_500_000,
            ..PeerTelemetry::default()
        },
    ];
    peers.sort_by_key(|p| p.peer);
    vec![CommTelemetry {
        comm_id: 0xc0,
        rank: r,
        nranks: 8,
        peers,
    }]
}

#[test]
fn telemetry_of_every_process_and_the_link_errors_it_names() {
    let mut v = ring_view(PeerStatus::Unresponsive, &[]);
    let bytes = 7_000_000;
    v.me_telemetry = Some(ring_tel(0, 1, 7, bytes, 0));
    for (i, p) in v.peers.iter_mut().enumerate() {
        let r = i as u32 + 1;
        // Rank 3's process is silent: not asked, no answer. Rank 4 lost
        // packets on its way from rank 4 to rank 5.
        if r != 3 {
            let retrans = if r == 4 { 70 } else { 0 };
            p.telemetry = Some(ring_tel(r, (r + 1) % 8, (r + 7) % 8, bytes, retrans));
        }
    }
    v.peers[3].telemetry.as_mut().unwrap()[0].peers[1].io_errors = 1;
    let r = Report::build(&v);
    assert_eq!(r.telemetry, Some((7, 8)));
    let c = &r.comms[0];
    assert_eq!(c.ranks[3].peers, None);
    assert_eq!(c.ranks[0].peers.as_ref().unwrap().len(), 2);
    // 8 ring links; the one with retransmits first, the others by pair.
    let names: Vec<(u32, u32)> = r.links.iter().map(|l| (l.a.0, l.b.0)).collect();
    assert_eq!(
        names,
        [
            (4, 5),
            (0, 1),
            (0, 7),
            (1, 2),
            (2, 3),
            (3, 4),
            (5, 6),
            (6, 7)
        ]
    );
    let top = &r.links[0];
    assert_eq!(
        (top.bytes, top.retransmits, top.errors, top.outlier),
        (bytes, 70, [1, 0, 0, 0], true)
    );
    // Rank 3 did not answer: its links are counted from the other end.
    let l23 = r.links.iter().find(|l| (l.a.0, l.b.0) == (2, 3)).unwrap();
    assert_eq!(l23.bytes, bytes);
    assert_eq!(
        r.link_errors,
        vec!["comm 00000000000000c0: rank 4 (host h2) <-> rank 5 (host h2): 70 retransmits (10.000 per MB of 7000000 B), errors io 1 protocol 0 timeout 0 other 0 OUTLIER".to_string()]
    );
    let t = r.to_text(true);
    assert!(
        t.contains(
            "  telemetry: 7 of 8 processes answered; 8 links, 1 with retransmits, 1 outliers\n"
        ),
        "{t}"
    );
    assert!(t.contains("        3  telemetry: no answer\n"), "{t}");
    assert!(
        t.contains("  NO TELEMETRY from h1 pid 103 (10.77.0.2:4000), ranks [3]\n"),
        "{t}"
    );
    assert_eq!(r.no_telemetry.len(), 1);
    assert!(
        t.contains("        4      5         7000000         14               0          0       0.0ms       2.0ms          1/0/0/0       70\n"),
        "{t}"
    );
    let j = r.to_json();
    assert!(
        j.contains("\"telemetry\":{\"answered\":7,\"processes\":8,\"no_answer\":[{\"host\":\"h1\",\"pid\":103,\"addr\":\"10.77.0.2:4000\",\"status\":\"unresponsive\",\"silent_ms\":1300,\"ranks\":[3]}]}"),
        "{j}"
    );
    assert!(j.contains("\"error\":null,\"telemetry\":null}"), "{j}");
    assert!(j.contains("{\"peer\":5,\"bytes_sent\":7000000,\"bytes_recv\":0,\"msgs_sent\":14,\"msgs_recv\":0,\"recv_wait_ns\":0,\"send_wait_ns\":2000000,\"errors\":{\"io\":1,\"protocol\":0,\"timeout\":0,\"other\":0},\"retransmits\":70,\"direct_bytes\":0}"), "{j}");
    assert!(j.contains("\"links\":[{\"comm\":\"00000000000000c0\",\"a\":{\"rank\":4,\"host\":\"h2\"},\"b\":{\"rank\":5,\"host\":\"h2\"},\"name\":\"rank 4 (host h2) <-> rank 5 (host h2)\",\"bytes\":7000000,\"retransmits\":70,\"retransmits_per_mb\":10.000000,\"errors\":{\"io\":1,\"protocol\":0,\"timeout\":0,\"other\":0},\"outlier\":true}"), "{j}");
}

#[test]
fn without_telemetry_the_report_says_nothing_of_it() {
    let r = Report::build(&ring_view(PeerStatus::Ok, &[]));
    assert_eq!(r.telemetry, None);
    assert!(r.links.is_empty());
    assert!(r.comms[0].ranks.iter().all(|x| x.peers.is_none()));
    assert!(r.to_json().contains("\"links\":[],\"telemetry\":null}"));
}
