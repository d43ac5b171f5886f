//! Bootstrap wire format: length-prefixed frames and the hello message.
//!
//! ```text
//! frame  = len:u32le payload[len]            (len <= MAX_FRAME)
//! hello  = "NCRH" version:u32le secret[16] rank:u32le nranks:u32le
//! reply  = "OK" | "ERR" text
//! gather = count:u32le (len:u32le bytes[len]){count}
//! ```

use std::io::{self, Read, Write};

/// Largest frame accepted from anyone.
pub(crate) const MAX_FRAME: usize = 64 << 20;
/// Largest hello accepted from an unauthenticated connection.
pub(crate) const HELLO_LEN: usize = 4 + 4 + 16 + 4 + 4;
pub(crate) const MAGIC: &[u8; 4] = b"NCRH";
pub(crate) const VERSION: u32 = 1;

/// Writes one frame.
pub(crate) fn write_frame(w: &mut impl Write, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(payload);
    w.write_all(&buf)?;
    w.flush()
}

/// Reads one frame of at most `max` bytes.
pub(crate) fn read_frame(r: &mut impl Read, max: usize) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds {max}"),
        ));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf)?;
    Ok(buf)
}

/// Accumulates bytes from a non-blocking stream and splits them into
/// frames.
#[derive(Default)]
pub(crate) struct FrameBuf {
    buf: Vec<u8>,
    /// Bytes of `buf` already handed out as frames (compacted lazily, so
    /// many small frames cost linear time).
    start: usize,
}

impl FrameBuf {
    /// Reads what is available without blocking (the stream must be in
    /// non-blocking mode), up to one largest frame beyond what is
    /// unconsumed: a peer that floods cannot grow the buffer further until
    /// its frames are taken. Returns `Ok(true)` at end of stream.
    pub(crate) fn fill(&mut self, r: &mut impl Read) -> io::Result<bool> {
        let mut tmp = [0u8; 16 * 1024];
        loop {
            if self.buf.len() - self.start >= 4 + MAX_FRAME {
                return Ok(false);
            }
            match r.read(&mut tmp) {
                Ok(0) => return Ok(true),
                Ok(n) => self.buf.extend_from_slice(&tmp[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The next complete, non-empty frame, if any; an error for a frame
    /// that is empty or larger than `MAX_FRAME`.
    pub(crate) fn next_frame(&mut self) -> Result<Option<Vec<u8>>, String> {
        if self.start > 0 && self.start * 2 >= self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        let rest = &self.buf[self.start..];
        if rest.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        if len == 0 || len > MAX_FRAME {
            return Err(format!("bad frame length {len}"));
        }
        if rest.len() < 4 + len {
            return Ok(None);
        }
        let f = rest[4..4 + len].to_vec();
        self.start += 4 + len;
        Ok(Some(f))
    }
}

/// A rank's hello.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    pub(crate) secret: [u8; 16],
    pub(crate) rank: u32,
    pub(crate) nranks: u32,
}

impl Hello {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HELLO_LEN);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&self.secret);
        b.extend_from_slice(&self.rank.to_le_bytes());
        b.extend_from_slice(&self.nranks.to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Hello, String> {
        if b.len() != HELLO_LEN {
            return Err(format!("hello of {} bytes, expected {HELLO_LEN}", b.len()));
        }
        if &b[..4] != MAGIC {
            return Err("bad magic".into());
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        if u32_at(4) != VERSION {
            return Err(format!(
                "protocol version {} (we speak {VERSION})",
                u32_at(4)
            ));
        }
        Ok(Hello {
            secret: b[8..24].try_into().expect("16 bytes"),
            rank: u32_at(24),
            nranks: u32_at(28),
        })
    }
}

/// Encodes the root's reply to an all-gather.
pub(crate) fn encode_gather(parts: &[Vec<u8>]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    for p in parts {
        b.extend_from_slice(&(p.len() as u32).to_le_bytes());
        b.extend_from_slice(p);
    }
    b
}

/// Decodes the root's reply to an all-gather.
pub(crate) fn decode_gather(b: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut pos = 0;
    let mut take = |n: usize| -> Result<&[u8], String> {
        let s = b.get(pos..pos + n).ok_or("truncated all-gather reply")?;
        pos += n;
        Ok(s)
    };
    let count = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes")) as usize;
    let mut parts = Vec::with_capacity(count.min(1 << 16));
    for _ in 0..count {
        let len = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes")) as usize;
        parts.push(take(len)?.to_vec());
    }
    Ok(parts)
}

/// Compares secrets in time independent of where they differ.
pub(crate) fn secrets_equal(a: &[u8; 16], b: &[u8; 16]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trip_and_garbage() {
        let h = Hello {
            secret: [7; 16],
            rank: 3,
            nranks: 8,
        };
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        assert!(Hello::decode(b"GET / HTTP/1.1\r\n").is_err());
        let mut bad = h.encode();
        bad[0] = b'X';
        assert!(Hello::decode(&bad).is_err());
    }

    #[test]
    fn gather_round_trip_and_truncation() {
        let parts = vec![vec![1, 2, 3], vec![], vec![9; 100]];
        let enc = encode_gather(&parts);
        assert_eq!(decode_gather(&enc).unwrap(), parts);
        assert!(decode_gather(&enc[..enc.len() - 1]).is_err());
        assert!(decode_gather(&[0xff, 0xff, 0xff, 0xff]).is_err());
    }

    #[test]
    fn frame_buf_splits_a_stream() {
        let mut stream = Vec::new();
        for i in 0..1000u32 {
            stream.extend_from_slice(&4u32.to_le_bytes());
            stream.extend_from_slice(&i.to_le_bytes());
        }
        stream.extend_from_slice(&[9, 0]);
        let mut fb = FrameBuf::default();
        assert!(fb.fill(&mut &stream[..]).unwrap());
        for i in 0..1000u32 {
            assert_eq!(fb.next_frame().unwrap().unwrap(), i.to_le_bytes());
        }
        assert_eq!(fb.next_frame().unwrap(), None);
        let mut bad = FrameBuf::default();
        bad.fill(&mut &[0u8, 0, 0, 0][..]).unwrap();
        assert!(bad.next_frame().is_err());
    }

    #[test]
    fn a_flood_fills_at_most_one_largest_frame() {
        let flood = vec![0u8; 4 + MAX_FRAME + (1 << 20)];
        let mut fb = FrameBuf::default();
        assert!(!fb.fill(&mut &flood[..]).unwrap());
        assert!(fb.buf.len() < 4 + MAX_FRAME + 16 * 1024);
    }

    #[test]
    fn oversized_frames_are_refused() {
        let mut data: &[u8] = &[0xff, 0xff, 0xff, 0x7f];
        assert!(read_frame(&mut data, 1024).is_err());
    }
}
