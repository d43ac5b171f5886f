//! Runs a zero-copy plan ([`crate::schedule::zero_copy`]) on buffers of
//! every rank mapped into this process. Reductions go piece by piece
//! through a small buffer that stays in the L1 cache: every operand is
//! read once from its rank's memory and every result written once to each
//! destination, with no transport buffer in between.

use super::{buffers::AlignedBuf, copy_region, Region};
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
    let stream = b.own_output_len >= reduce::stream_output_min();
    tmp.ensure(piece * es);
    // The current reduction's operand and destination ranges (one
    // allocation per call, not per piece).
    let (mut ins, mut outs) = (Vec::new(), Vec::new());
    for step in steps {
        match step {
            ZcStep::Copy { src, dst, count } => {
                let (s, d) = (b.range(*src, *count)?, b.range(*dst, *count)?);
                // SAFETY: both ranges are checked parts of regions valid per
                // the contract, which also keeps everyone else out of them.
                unsafe { copy_region(s, d, stream) };
            }
            ZcStep::Swap { a, b: other, count } => {
                let (x, y) = (b.range(*a, *count)?, b.range(*other, *count)?);
                let (xs, ys) = (x.ptr as usize, y.ptr as usize);
                if xs < ys + y.len && ys < xs + x.len {
                    return Err(format!("swap of overlapping ranges {a:?} and {other:?}"));
                }
                let bytes = piece * es;
                let mut off = 0;
                while off < x.len {
                    let len = bytes.min(x.len - off);
                    let (xp, yp) = (x.ptr.wrapping_add(off), y.ptr.wrapping_add(off));
                    // SAFETY: `x` and `y` are checked, disjoint ranges of
                    // outputs that only this rank touches during the call
                    // (contract), `off + len` inside both; `tmp` holds at
                    // least `piece * es` bytes and is ours alone.
                    unsafe {
                        reduce::copy_mem(xp, tmp.as_mut_ptr(), len);
                        reduce::copy_mem(yp, xp, len);
                        reduce::copy_mem(tmp.as_mut_ptr(), yp, len);
                    }
                    off += len;
                }
            }
            ZcStep::Reduce { srcs, dsts, count } => {
                // Bounds once per step; the pieces below stay inside.
                ins.clear();
                for s in srcs {
                    ins.push(b.range(*s, *count)?);
                }
                outs.clear();
                for d in dsts {
                    outs.push(b.range(*d, *count)?);
                }
                let Some((first, rest)) = ins.split_first() else {
                    return Err("a reduction without operands".into());
                };
                let mut start = 0;
                while start < *count {
                    let c = piece.min(count - start);
                    let (off, bytes) = (start * es, c * es);
                    // SAFETY: `r` is a checked range of `count` elements and
                    // `off + bytes` stays inside it; nobody writes the
                    // operands during the call (contract).
                    let part = |r: &Region| unsafe {
                        std::slice::from_raw_parts(r.ptr.wrapping_add(off).cast_const(), bytes)
                    };
                    // SAFETY: `tmp` holds at least `piece * es` bytes (ensured
                    // above) and is ours alone.
                    let acc = unsafe { std::slice::from_raw_parts_mut(tmp.as_mut_ptr(), bytes) };
                    match rest.split_first() {
                        None => acc.copy_from_slice(part(first)),
                        Some((second, more)) => {
                            reduce::reduce_copy(b.dtype, op, acc, part(first), part(second));
                            for x in more {
                                reduce::reduce_inplace(b.dtype, op, acc, part(x));
                            }
                        }
                    }
                    if op == RedOp::Avg {
                        reduce::divide(b.dtype, acc, nranks);
                    }
                    for d in &outs {
                        // SAFETY: a checked range of an output that only this
                        // rank writes during the call, `off + bytes` inside it;
                        // its operands were read into `acc` above (in place,
                        // they were the same bytes).
                        unsafe { reduce::copy_mem(acc.as_ptr(), d.ptr.wrapping_add(off), bytes) };
                    }
                    start += c;
                }
            }
        }
    }
    Ok(())
}
