//! Runs a zero-copy plan ([`crate::schedule::zero_copy`]) on buffers of
//! every rank mapped into this process. Reductions go piece by piece
//! through a small buffer that stays in the L1 cache: every operand is
//! read once from its rank's memory and every result written once to each
//! destination, with no transport buffer in between.

use super::{buffers::AlignedBuf, Region};
use crate::datatype::{DataType, RedOp};
use crate::reduce;
use crate::schedule::{ZcAt, ZcBuf, ZcStep};

/// Bytes reduced per piece (fits L1 next to the operands' lines).
const PIECE: usize = 16 << 10;
/// Every rank's (input, output) regions, mapped into this process.
pub(crate) struct RankBufs<'a> {
    pub(crate) bufs: &'a [(Region, Region)],
    pub(crate) dtype: DataType,
    /// Bytes of this rank's output.
    pub(crate) own_output_len: usize,
}

impl RankBufs<'_> {
    /// The `count` elements at `at`, bounds-checked.
    fn range(&self, at: ZcAt, count: usize) -> Result<Region, String> {
        let es = self.dtype.size();
        let (q, r) = match at.buf {
            ZcBuf::In(q) => (q, self.bufs.get(q).map(|b| b.0)),
            ZcBuf::Out(q) => (q, self.bufs.get(q).map(|b| b.1)),
        };
        let r = r.ok_or_else(|| format!("no buffers of rank {q}"))?;
        let (start, len) = (at.off * es, count * es);
        if start.checked_add(len).is_none_or(|end| end > r.len) {
            return Err(format!(
                "{:?}+{count} exceeds rank {q}'s buffer of {} bytes",
                at.buf, r.len
            ));
        }
        Ok(Region::new(r.ptr.wrapping_add(start), len))
    }
}

/// Runs `steps` with reduction `op` over `nranks` ranks.
///
/// # Safety
/// Every region in `b` must be valid for the whole call (inputs for reads,
/// outputs for reads and writes), and the callers on all ranks must hold
/// each other out of the memory the plans give to one rank (the entry and
/// exit barriers of `comm::zero_copy`): then no byte this rank writes is
/// accessed by anyone else meanwhile, and no byte it reads is written.
pub(crate) unsafe fn run(
    steps: &[ZcStep],
    b: &RankBufs<'_>,
    op: RedOp,
    nranks: usize,
    tmp: &mut AlignedBuf,
) -> Result<(), String> {
    let es = b.dtype.size();
    let piece = (PIECE / es).max(1);
    let stream = b.own_output_len >= reduce::STREAM_OUTPUT_MIN;
    tmp.ensure(piece * es);
    for step in steps {
        match step {
            ZcStep::Copy { src, dst, count } => {
                let (s, d) = (b.range(*src, *count)?, b.range(*dst, *count)?);
                let apart = s.ptr as usize + s.len <= d.ptr as usize
                    || d.ptr as usize + d.len <= s.ptr as usize;
                if stream && s.len >= reduce::STREAM_COPY_MIN && apart {
                    // SAFETY: two checked, disjoint ranges of regions valid
                    // per the contract; nobody else touches them meanwhile.
                    let (src, dst) = unsafe {
                        (
                            std::slice::from_raw_parts(s.ptr.cast_const(), s.len),
                            std::slice::from_raw_parts_mut(d.ptr, d.len),
                        )
                    };
                    reduce::copy_streaming(dst, src);
                } else if s.ptr != d.ptr && s.len > 0 {
                    // SAFETY: both ranges are checked parts of regions valid
                    // per the contract; `copy` tolerates overlap.
                    unsafe { std::ptr::copy(s.ptr, d.ptr, s.len) };
                }
            }
            ZcStep::Reduce { srcs, dsts, count } => {
                let mut start = 0;
                while start < *count {
                    let c = piece.min(count - start);
                    let bytes = c * es;
                    let at = |a: &ZcAt| ZcAt {
                        buf: a.buf,
                        off: a.off + start,
                    };
                    let mut ins = Vec::with_capacity(srcs.len());
                    for s in srcs {
                        let r = b.range(at(s), c)?;
                        // SAFETY: a checked, readable range that nobody
                        // writes during the call (contract).
                        ins.push(unsafe { std::slice::from_raw_parts(r.ptr.cast_const(), bytes) });
                    }
                    // SAFETY: `tmp` holds at least `piece * es` bytes (ensured
                    // above) and is ours alone.
                    let acc = unsafe { std::slice::from_raw_parts_mut(tmp.as_mut_ptr(), bytes) };
                    match ins.as_slice() {
                        [] => return Err("a reduction without operands".into()),
                        [a] => acc.copy_from_slice(a),
                        [a, rest @ ..] => {
                            reduce::reduce_copy(b.dtype, op, acc, a, rest[0]);
                            for x in &rest[1..] {
                                reduce::reduce_inplace(b.dtype, op, acc, x);
                            }
                        }
                    }
                    if op == RedOp::Avg {
                        reduce::divide(b.dtype, acc, nranks);
                    }
                    drop(ins);
                    for d in dsts {
                        let r = b.range(at(d), c)?;
                        // SAFETY: a checked range of an output that only this
                        // rank writes during the call; its operands were read
                        // into `acc` above (in place, they were the same bytes).
                        unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), r.ptr, bytes) };
                    }
                    start += c;
                }
            }
        }
    }
    Ok(())
}
