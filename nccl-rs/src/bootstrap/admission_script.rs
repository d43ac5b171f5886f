//! Drives [`Admission`] with arbitrary bytes read as a script of events —
//! connections, bytes, closes, clock steps, rank 0's size — and checks its
//! invariants after every step. The stateful fuzz target runs this; a frame
//! decoder alone never reaches `join`-like state.

use super::admission::{Action, Admission, Key, MAX_PENDING};
use super::wire::{Hello, HELLO_LEN};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const SECRET: [u8; 16] = [0x5a; 16];

/// Reads bytes off the front of the script.
struct Script<'a>(&'a [u8]);

impl Script<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn u32(&mut self) -> Option<u32> {
        let b: [u8; 4] = self.0.get(..4)?.try_into().ok()?;
        self.0 = &self.0[4..];
        Some(u32::from_le_bytes(b))
    }
    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
}

/// Interesting rank counts: small, edges, and the crash repro's.
const COUNTS: [u32; 8] = [0, 1, 2, 3, 4, 8, 50_000_000, u32::MAX];

/// Runs the script; panics if an invariant breaks.
pub(crate) fn run(data: &[u8]) {
    let mut s = Script(data);
    let (Some(mode), Some(size)) = (s.byte(), s.byte()) else {
        return;
    };
    let secret = if mode & 1 == 0 { [0; 16] } else { SECRET };
    let size = (mode & 2 != 0).then_some(1 + size as usize % 6);
    let mut adm = Admission::new(secret, size);
    let mut now = Instant::now();
    let mut next: Key = 0;
    let mut live: BTreeSet<Key> = BTreeSet::new();
    let mut admitted_once = false;
    let pick =
        |live: &BTreeSet<Key>, b: u8| live.iter().nth(b as usize % live.len().max(1)).copied();
    while let Some(op) = s.byte() {
        let out = match op % 7 {
            0 => {
                let key = next;
                next += 1;
                live.insert(key);
                let port = s.byte().unwrap_or(0) as u16;
                adm.connect(key, SocketAddr::from(([10, 0, 0, 1], port)), now)
            }
            1 => {
                let (Some(k), Some(n)) = (s.byte(), s.byte()) else {
                    break;
                };
                let bytes = s.take(n as usize).to_vec();
                match pick(&live, k) {
                    Some(key) => adm.data(key, &bytes),
                    None => Vec::new(),
                }
            }
            2 => {
                let k = s.byte().unwrap_or(0);
                match pick(&live, k) {
                    Some(key) => {
                        live.remove(&key);
                        adm.closed(key)
                    }
                    None => Vec::new(),
                }
            }
            3 => {
                let ms = s.byte().unwrap_or(0) as u64 * 40;
                now += Duration::from_millis(ms);
                adm.tick(now)
            }
            4 => adm.set_size(s.byte().unwrap_or(0) as usize % 8),
            _ => {
                // A whole hello frame: the fuzzer need not find the framing.
                let (Some(k), Some(flags), Some(rank)) = (s.byte(), s.byte(), s.byte()) else {
                    break;
                };
                let nranks = if flags & 0x80 != 0 {
                    s.u32().unwrap_or(0)
                } else {
                    COUNTS[flags as usize % COUNTS.len()]
                };
                let hello = Hello {
                    secret: if flags & 0x40 != 0 { [1; 16] } else { secret },
                    rank: rank as u32 % 8,
                    nranks,
                };
                let mut f = (HELLO_LEN as u32).to_le_bytes().to_vec();
                f.extend(hello.encode());
                match pick(&live, k) {
                    Some(key) => adm.data(key, &f),
                    None => Vec::new(),
                }
            }
        };
        for a in &out {
            match a {
                Action::Drop { key, .. } | Action::Refuse { key, .. } => {
                    assert!(live.remove(key), "action on a connection not open: {a:?}");
                }
                Action::Impostor { key, .. } => {
                    assert!(admitted_once, "an impostor before admission");
                    assert!(live.remove(key), "action on a connection not open: {a:?}");
                }
                Action::Admit(keys) => {
                    assert!(!admitted_once, "admitted twice");
                    assert!(adm.failure().is_none(), "admitted after failing");
                    admitted_once = true;
                    let n = adm.size().unwrap_or(keys.len());
                    assert_eq!(keys.len(), n, "admitted a job of the wrong size");
                    for key in keys {
                        assert!(live.remove(key), "admitted a connection not open");
                    }
                }
            }
        }
        let open = adm.open_keys();
        assert!(open.iter().all(|k| live.contains(k)), "open key not live");
        assert!(open.len() <= MAX_PENDING + adm.held_ranks().len());
        if let Some(n) = adm.size() {
            assert!(adm.held_ranks().iter().all(|&r| (r as usize) < n));
        }
    }
}
