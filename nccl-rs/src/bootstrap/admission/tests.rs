//! Decision tables for the admission rules: given these hellos, these
//! actions.

use super::*;

const S: [u8; 16] = [7; 16];
const Z: [u8; 16] = [0; 16];

fn frame(secret: [u8; 16], rank: u32, nranks: u32) -> Vec<u8> {
    let mut f = (HELLO_LEN as u32).to_le_bytes().to_vec();
    f.extend(
        Hello {
            secret,
            rank,
            nranks,
        }
        .encode(),
    );
    f
}

fn peer(k: Key) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 40000 + k as u16))
}

/// Connects `key` and sends `bytes` in one piece.
fn send(a: &mut Admission, key: Key, bytes: &[u8], now: Instant) -> Vec<Action> {
    let mut out = a.connect(key, peer(key), now);
    out.extend(a.data(key, bytes));
    out
}

fn refused(out: &[Action]) -> Vec<(Key, String)> {
    out.iter()
        .filter_map(|a| match a {
            Action::Refuse { key, why } => Some((*key, why.clone())),
            _ => None,
        })
        .collect()
}

fn dropped(out: &[Action]) -> Vec<Key> {
    out.iter()
        .filter_map(|a| match a {
            Action::Drop { key, .. } => Some(*key),
            _ => None,
        })
        .collect()
}

fn admitted(out: &[Action]) -> Option<Vec<Key>> {
    out.iter().find_map(|a| match a {
        Action::Admit(k) => Some(k.clone()),
        _ => None,
    })
}

#[test]
fn every_rank_is_answered_together_in_rank_order() {
    let now = Instant::now();
    let mut a = Admission::new(S, Some(3));
    assert!(send(&mut a, 10, &frame(S, 2, 3), now).is_empty());
    assert!(send(&mut a, 11, &frame(S, 0, 3), now).is_empty());
    assert_eq!(a.held_ranks(), vec![0, 2]);
    let out = send(&mut a, 12, &frame(S, 1, 3), now);
    assert_eq!(admitted(&out), Some(vec![11, 12, 10]));
    assert!(a.admitted());
}

/// The crash repro: a stranger's well-formed, zero-secret hello claiming
/// 2^32-1 ranks before the real ranks arrive.
#[test]
fn hostile_sizes_are_refused_without_allocating() {
    let now = Instant::now();
    for (size, hostile) in [
        (Some(4), u32::MAX),
        (Some(4), 50_000_000),
        (Some(4), 5),
        (Some(4), 0),
    ] {
        let mut a = Admission::new(Z, size);
        let out = send(&mut a, 1, &frame(Z, 0, hostile), now);
        assert_eq!(refused(&out).len(), 1, "{hostile}: {out:?}");
        for r in 0..4 {
            let out = send(&mut a, 10 + r as Key, &frame(Z, r, 4), now);
            assert!(refused(&out).is_empty(), "{out:?}");
        }
        assert!(a.admitted(), "size {hostile}");
    }
}

#[test]
fn a_hostile_size_before_rank_zero_registers_is_refused_then() {
    let now = Instant::now();
    let mut a = Admission::new(Z, None);
    assert!(send(&mut a, 1, &frame(Z, 3, u32::MAX), now).is_empty());
    let out = a.set_size(4);
    let r = refused(&out);
    assert_eq!(r.len(), 1);
    assert!(
        r[0].1.contains("4294967295 ranks; rank 0 says 4"),
        "{}",
        r[0].1
    );
    for rank in 0..4 {
        let out = send(&mut a, 10 + rank as Key, &frame(Z, rank, 4), now);
        assert!(refused(&out).is_empty(), "{out:?}");
    }
    assert!(a.admitted());
}

#[test]
fn sizes_and_ranks_out_of_range_are_refused() {
    let now = Instant::now();
    let table: [(Option<usize>, u32, u32, &str); 5] = [
        (Some(4), 4, 4, "rank 4 of 4 is out of range"),
        (Some(4), 0, 0, "rank 0 of 0 is out of range"),
        (Some(4), 1, 8, "says the job has 8 ranks; rank 0 says 4"),
        (None, u32::MAX, u32::MAX, "out of range"),
        (Some(2), 0, 1, "says the job has 1 ranks; rank 0 says 2"),
    ];
    for (size, rank, nranks, want) in table {
        let mut a = Admission::new(S, size);
        let out = send(&mut a, 1, &frame(S, rank, nranks), now);
        let r = refused(&out);
        assert_eq!(r.len(), 1, "{rank}/{nranks}: {out:?}");
        assert!(r[0].1.contains(want), "{rank}/{nranks}: {}", r[0].1);
    }
}

/// Before rank 0 gives the size, claims are held by the size they claim:
/// a stranger's claim turns no real rank away, and the size every rank
/// claimed is the job.
#[test]
fn unknown_size_admits_the_size_every_rank_claimed() {
    let now = Instant::now();
    let mut a = Admission::new(Z, None);
    assert!(send(&mut a, 1, &frame(Z, 0, u32::MAX), now).is_empty());
    assert!(send(&mut a, 2, &frame(Z, 1, 2), now).is_empty());
    assert!(send(&mut a, 3, &frame(Z, 1, 50_000_000), now).is_empty());
    let out = send(&mut a, 4, &frame(Z, 0, 2), now);
    assert_eq!(admitted(&out), Some(vec![4, 2]));
    let r = refused(&out);
    assert_eq!(r.iter().map(|(k, _)| *k).collect::<Vec<_>>(), vec![3, 1]);
    assert!(r[1].1.contains("4294967295 ranks; it has 2"), "{}", r[1].1);
}

#[test]
fn a_duplicate_claim_refuses_everyone_naming_both_addresses() {
    let now = Instant::now();
    let mut a = Admission::new(Z, Some(4));
    // The stranger claims rank 1 first.
    assert!(send(&mut a, 5, &frame(Z, 1, 4), now).is_empty());
    assert!(send(&mut a, 10, &frame(Z, 0, 4), now).is_empty());
    let out = send(&mut a, 11, &frame(Z, 1, 4), now);
    let r = refused(&out);
    let keys: Vec<Key> = r.iter().map(|(k, _)| *k).collect();
    assert_eq!(keys, vec![10, 5, 11]);
    for (_, why) in &r {
        assert!(why.contains("rank 1 was claimed twice"), "{why}");
        assert!(why.contains(&peer(5).to_string()), "{why}");
        assert!(why.contains(&peer(11).to_string()), "{why}");
        assert!(why.contains("NCCL_RS_JOB_SECRET"), "{why}");
    }
    // Later ranks get the same answer; nobody is admitted.
    let out = send(&mut a, 12, &frame(Z, 2, 4), now);
    assert!(refused(&out)[0].1.contains("claimed twice"));
    assert!(!a.admitted());
    assert!(a.failure().is_some());
}

#[test]
fn a_held_rank_that_leaves_frees_its_place() {
    let now = Instant::now();
    let mut a = Admission::new(S, Some(2));
    assert!(send(&mut a, 1, &frame(S, 1, 2), now).is_empty());
    a.closed(1);
    assert!(send(&mut a, 2, &frame(S, 1, 2), now).is_empty());
    let out = send(&mut a, 3, &frame(S, 0, 2), now);
    assert_eq!(admitted(&out), Some(vec![3, 2]));
}

#[test]
fn strangers_are_dropped_without_an_answer() {
    let now = Instant::now();
    let table: [(&str, Vec<u8>); 5] = [
        ("wrong secret", frame(Z, 0, 2)),
        ("http", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        ("huge frame length", vec![0xff, 0xff, 0xff, 0xff, 1, 2]),
        ("more than a hello", [frame(S, 0, 2), vec![0; 8]].concat()),
        ("bad version", {
            let mut f = frame(S, 0, 2);
            f[8] = 9;
            f
        }),
    ];
    for (what, bytes) in table {
        let mut a = Admission::new(S, Some(2));
        let out = send(&mut a, 1, &bytes, now);
        assert_eq!(dropped(&out), vec![1], "{what}: {out:?}");
        assert!(a.open_keys().is_empty(), "{what}");
    }
}

#[test]
fn a_held_rank_that_sends_more_is_dropped() {
    let now = Instant::now();
    let mut a = Admission::new(S, Some(2));
    assert!(send(&mut a, 1, &frame(S, 0, 2), now).is_empty());
    assert_eq!(dropped(&a.data(1, b"x")), vec![1]);
    assert!(a.held_ranks().is_empty());
}

#[test]
fn slow_and_excess_strangers_are_shed() {
    let t0 = Instant::now();
    let mut a = Admission::new(S, Some(2));
    for k in 0..MAX_PENDING as Key {
        assert!(a.connect(k, peer(k), t0).is_empty());
    }
    // One byte from the first: the evicted one is the oldest silent one.
    assert!(a.data(0, &[HELLO_LEN as u8]).is_empty());
    let out = a.connect(999, peer(999), t0);
    assert_eq!(dropped(&out), vec![1]);
    assert_eq!(a.open_keys().len(), MAX_PENDING);
    let out = a.tick(t0 + HELLO_DEADLINE);
    assert_eq!(dropped(&out).len(), MAX_PENDING);
    assert!(a.open_keys().is_empty());
}

#[test]
fn a_hello_in_pieces_joins() {
    let now = Instant::now();
    let mut a = Admission::new(S, Some(1));
    let f = frame(S, 0, 1);
    assert!(a.connect(1, peer(1), now).is_empty());
    for b in &f[..f.len() - 1] {
        assert!(a.data(1, std::slice::from_ref(b)).is_empty());
    }
    assert_eq!(admitted(&a.data(1, &f[f.len() - 1..])), Some(vec![1]));
}

/// Ranks refused before rank 0 gave the size still count as told once it
/// does, so the root ends as soon as every rank has heard the verdict.
#[test]
fn a_failed_admission_ends_once_every_rank_is_told() {
    let now = Instant::now();
    let mut a = Admission::new(Z, None);
    assert!(send(&mut a, 5, &frame(Z, 1, 4), now).is_empty());
    assert_eq!(refused(&send(&mut a, 11, &frame(Z, 1, 4), now)).len(), 2);
    assert_eq!(refused(&send(&mut a, 12, &frame(Z, 2, 4), now)).len(), 1);
    assert!(!a.failure_told());
    assert!(a.set_size(4).is_empty());
    assert_eq!(refused(&send(&mut a, 10, &frame(Z, 0, 4), now)).len(), 1);
    assert!(!a.failure_told());
    assert_eq!(refused(&send(&mut a, 13, &frame(Z, 3, 4), now)).len(), 1);
    assert!(a.failure_told());
}

/// After admission, a claim of an admitted rank of the same job means one
/// of the two took the other's place: the job is to be aborted, naming both.
/// Other hellos are only refused.
#[test]
fn a_late_claim_of_an_admitted_rank_aborts_the_job() {
    let now = Instant::now();
    let mut a = Admission::new(Z, Some(2));
    assert!(send(&mut a, 5, &frame(Z, 1, 2), now).is_empty());
    assert_eq!(
        admitted(&send(&mut a, 1, &frame(Z, 0, 2), now)),
        Some(vec![1, 5])
    );
    let out = send(&mut a, 7, &frame(Z, 1, 2), now);
    match out.as_slice() {
        [Action::Impostor { key: 7, why }] => {
            assert!(why.contains("rank 1 was claimed twice"), "{why}");
            assert!(why.contains(&peer(5).to_string()), "{why}");
            assert!(why.contains(&peer(7).to_string()), "{why}");
            assert!(why.contains("aborting the job"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    for other in [frame(Z, 1, 3), frame(Z, 2, 2)] {
        let out = send(&mut a, 8, &other, now);
        assert!(refused(&out)[0].1.contains("already joined"), "{out:?}");
    }
}
