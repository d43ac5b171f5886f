//! Messages on a rank's bootstrap connection after it joined. Each frame
//! starts with a kind byte.
//!
//! ```text
//! rank → root   GATHER  bytes            contribution to an all-gather
//! root → rank   GATHER  gather-encoding  everyone's contributions
//! rank → root   ABORT   text             "I failed: ..." (forwarded to all)
//! root → rank   ABORT   kind:u8 text     the job failed (kind 0 remote, 1 mismatch)
//! rank → root   BYE                      clean leave (communicator dropped)
//! rank → root   MISMATCH seq:u64 text    "my op #seq met data of another op"
//! root → rank   OPINFO?  seq:u64         "describe your op #seq"
//! rank → root   OPINFO   seq:u64 text    the description
//! ```

/// Frame kinds.
pub(crate) const GATHER: u8 = 0;
pub(crate) const ABORT: u8 = 1;
pub(crate) const BYE: u8 = 2;
pub(crate) const MISMATCH: u8 = 3;
pub(crate) const OPINFO_REQ: u8 = 4;
pub(crate) const OPINFO: u8 = 5;

/// Why the root aborted the job.
pub(crate) const ABORT_REMOTE: u8 = 0;
pub(crate) const ABORT_MISMATCH: u8 = 1;

/// `kind` followed by `body`.
pub(crate) fn frame(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(1 + body.len());
    f.push(kind);
    f.extend_from_slice(body);
    f
}

/// `kind`, a sequence number, then text.
pub(crate) fn seq_frame(kind: u8, seq: u64, text: &str) -> Vec<u8> {
    let mut f = frame(kind, &seq.to_le_bytes());
    f.extend_from_slice(text.as_bytes());
    f
}

/// Splits a `seq_frame` body.
pub(crate) fn parse_seq(body: &[u8]) -> Option<(u64, String)> {
    let seq = u64::from_le_bytes(body.get(..8)?.try_into().ok()?);
    Some((seq, String::from_utf8_lossy(&body[8..]).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq_frames_round_trip_and_reject_short() {
        let f = seq_frame(OPINFO, 57, "all_reduce(count=4)");
        assert_eq!(f[0], OPINFO);
        assert_eq!(parse_seq(&f[1..]), Some((57, "all_reduce(count=4)".into())));
        assert_eq!(parse_seq(&[1, 2, 3]), None);
    }
}
