//! The heartbeat: one process's state, sent to every peer process at each
//! interval. Frames are a 4-byte little-endian length and the payload;
//! every decode is bounds-checked (a malformed frame is an error, never a
//! panic).

use crate::observe::progress::{ProgressSnapshot, WaitKind, WaitRecord};

const MAGIC: &[u8; 4] = b"RAS1";
/// Largest heartbeat accepted.
pub(crate) const MAX_FRAME: usize = 1 << 20;

/// One process's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcState {
    /// The address its RAS thread listens on for peers (its identity).
    pub addr: String,
    /// Process id.
    pub pid: u32,
    /// Host name.
    pub host: String,
    /// Its communicators' records.
    pub comms: Vec<ProgressSnapshot>,
    /// Link errors it saw (connections to peers that failed).
    pub link_errors: Vec<String>,
}

struct W(Vec<u8>);

impl W {
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn str(&mut self, s: &str) {
        let b = &s.as_bytes()[..s.len().min(4096)];
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }
}

struct R<'a>(&'a [u8]);

impl R<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        if self.0.len() < n {
            return Err("heartbeat truncated".into());
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn str(&mut self) -> Result<String, String> {
        let n = self.u32()? as usize;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }
    /// A count of items of at least `min` bytes each that fits what is left.
    fn count(&mut self, min: usize) -> Result<usize, String> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min) > self.0.len() {
            return Err(format!(
                "heartbeat claims {n} items in {} bytes",
                self.0.len()
            ));
        }
        Ok(n)
    }
}

impl ProcState {
    /// The payload of a heartbeat.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = W(Vec::with_capacity(128 + 96 * self.comms.len()));
        w.0.extend_from_slice(MAGIC);
        w.str(&self.addr);
        w.u32(self.pid);
        w.str(&self.host);
        w.u32(self.comms.len() as u32);
        for c in &self.comms {
            w.u64(c.comm_id);
            w.u32(c.rank);
            w.u32(c.nranks);
            w.u64(c.coll_started);
            w.u64(c.coll_done);
            w.str(&c.op);
            w.u64(c.p2p_started);
            w.u64(c.p2p_done);
            match &c.wait {
                None => w.0.push(0),
                Some(x) => {
                    w.0.push(x.kind as u8);
                    w.u32(x.peer);
                    w.u32(x.step);
                    w.u32(x.steps);
                    w.u64(x.ms);
                }
            }
            match &c.error {
                None => w.0.push(0),
                Some(e) => {
                    w.0.push(1);
                    w.str(e);
                }
            }
        }
        w.u32(self.link_errors.len() as u32);
        for e in &self.link_errors {
            w.str(e);
        }
        w.0
    }

    /// Parses [`ProcState::encode`]'s bytes.
    pub fn decode(b: &[u8]) -> Result<ProcState, String> {
        let mut r = R(b);
        if r.take(4)? != MAGIC {
            return Err("not a RAS heartbeat".into());
        }
        let addr = r.str()?;
        let pid = r.u32()?;
        let host = r.str()?;
        let n = r.count(50)?;
        let mut comms = Vec::with_capacity(n);
        for _ in 0..n {
            let comm_id = r.u64()?;
            let rank = r.u32()?;
            let nranks = r.u32()?;
            let coll_started = r.u64()?;
            let coll_done = r.u64()?;
            let op = r.str()?;
            let p2p_started = r.u64()?;
            let p2p_done = r.u64()?;
            let wait = match r.u8()? {
                0 => None,
                k => Some(WaitRecord {
                    kind: WaitKind::from_code(k as u64)
                        .ok_or_else(|| format!("unknown wait kind {k}"))?,
                    peer: r.u32()?,
                    step: r.u32()?,
                    steps: r.u32()?,
                    ms: r.u64()?,
                }),
            };
            let error = match r.u8()? {
                0 => None,
                _ => Some(r.str()?),
            };
            if rank >= nranks {
                return Err(format!("rank {rank} of {nranks}"));
            }
            comms.push(ProgressSnapshot {
                comm_id,
                rank,
                nranks,
                coll_started,
                coll_done,
                op,
                p2p_started,
                p2p_done,
                wait,
                error,
            });
        }
        let n = r.count(4)?;
        let link_errors = (0..n).map(|_| r.str()).collect::<Result<_, _>>()?;
        if !r.0.is_empty() {
            return Err(format!("{} bytes after the heartbeat", r.0.len()));
        }
        Ok(ProcState {
            addr,
            pid,
            host,
            comms,
            link_errors,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> ProcState {
        ProcState {
            addr: "10.0.0.1:4000".into(),
            pid: 42,
            host: "h0".into(),
            comms: vec![
                ProgressSnapshot {
                    comm_id: 0xabc,
                    rank: 1,
                    nranks: 4,
                    coll_started: 9,
                    coll_done: 8,
                    op: "AllReduce".into(),
                    p2p_started: 2,
                    p2p_done: 2,
                    wait: Some(WaitRecord {
                        peer: 0,
                        kind: WaitKind::Send,
                        step: 5,
                        steps: 12,
                        ms: 1500,
                    }),
                    error: None,
                },
                ProgressSnapshot {
                    comm_id: 0xdef,
                    rank: 0,
                    nranks: 2,
                    coll_started: 0,
                    coll_done: 0,
                    op: String::new(),
                    p2p_started: 0,
                    p2p_done: 0,
                    wait: None,
                    error: Some("rank 0: connection reset".into()),
                },
            ],
            link_errors: vec!["10.0.0.2:5000: connection refused".into()],
        }
    }

    #[test]
    fn heartbeat_round_trips() {
        let s = sample();
        assert_eq!(ProcState::decode(&s.encode()).unwrap(), s);
    }

    #[test]
    fn malformed_heartbeats_are_errors() {
        let b = sample().encode();
        for n in 0..b.len() {
            assert!(ProcState::decode(&b[..n]).is_err(), "prefix of {n} bytes");
        }
        let mut extra = b.clone();
        extra.push(0);
        assert!(ProcState::decode(&extra).is_err());
        let mut huge = b"RAS1".to_vec();
        huge.extend_from_slice(&0u32.to_le_bytes());
        huge.extend_from_slice(&1u32.to_le_bytes());
        huge.extend_from_slice(&0u32.to_le_bytes());
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            ProcState::decode(&huge).unwrap_err(),
            "heartbeat claims 4294967295 items in 0 bytes"
        );
    }
}
