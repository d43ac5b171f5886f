//! Staging a call's input in the communicator's shared staging buffer
//! before it runs, as its plan says (`plan::Staging`): readers on this host
//! map the staging buffer and copy with `memcpy`, where they would read a
//! heap buffer with `process_vm_readv`; an all-to-all whose input overlaps
//! its output sends from the copy. The buffer stays allocated from call to
//! call: a fresh one per call would pay the first touch of every page.

use super::core::Core;
use crate::engine::{copy_region, CallBufs, Region};
use crate::plan::{Staging, Stores};

/// The byte ranges of an all-to-all's input of `len` bytes that
/// [`Core::stage`] copies into staging: every block but `rank`'s when
/// `others` (the schedule that runs sends from staging and leaves the own
/// block alone), as the two ranges around it; otherwise the whole input.
fn staged_ranges(
    nranks: usize,
    rank: usize,
    len: usize,
    others: bool,
) -> impl Iterator<Item = (usize, usize)> {
    let block = len / nranks.max(1);
    let parts = match others {
        true => [(0, rank * block), ((rank + 1) * block, len)],
        false => [(0, len), (0, 0)],
    };
    parts.into_iter().filter(|(start, end)| start != end)
}

impl Core {
    /// Copies the input into staging as `staging` says and returns the
    /// buffers the call runs on (its input then the staged copy).
    /// Blocks whose reader's bit is set in `plain_for` go with plain
    /// stores, one by one.
    #[inline]
    pub(super) fn stage(&mut self, staging: Staging, plain_for: u64, bufs: CallBufs) -> CallBufs {
        match staging {
            Staging::None => bufs,
            _ => self.stage_copies(staging, plain_for, bufs),
        }
    }

    /// [`Core::stage`]'s copies: out of line, off the path of the calls
    /// that stage nothing.
    #[inline(never)]
    fn stage_copies(&mut self, staging: Staging, plain_for: u64, mut bufs: CallBufs) -> CallBufs {
        let (others, own_to_output, stores) = match staging {
            Staging::None => return bufs,
            Staging::Input(s) => (false, false, s),
            Staging::OtherBlocks(s) => (true, false, s),
            Staging::OtherBlocksOwnToOutput(s) => (true, true, s),
        };
        let (input, output) = (bufs.input, bufs.output);
        let stream = stores == Stores::Streaming;
        let copy = Region::new(self.staging.ensure(input.len), input.len);
        let block = input.len / self.nranks.max(1);
        // Block by block where some readers take theirs with plain stores.
        let (n, rank) = (self.nranks, self.rank);
        let per_block = others && plain_for != 0;
        let blocks = (0..n)
            .filter(move |&b| per_block && b != rank)
            .map(move |b| (b * block, (b + 1) * block));
        let parts = staged_ranges(n, rank, input.len, others).filter(move |_| !per_block);
        for (start, end) in blocks.chain(parts) {
            let reader = start / block.max(1);
            let plain = per_block && reader < 64 && plain_for & (1 << reader) != 0;
            let stream = stream && !plain;
            // `wrapping_add` keeps these free of unsafe; `start <= end <=
            // input.len` by construction.
            let part = |r: Region| Region::new(r.ptr.wrapping_add(start), end - start);
            // SAFETY: `input` is readable for the call (the `CallBufs`
            // invariant) and `copy` is this communicator's own buffer of at
            // least `input.len` bytes, which nothing else uses meanwhile;
            // both parts lie within them.
            unsafe { copy_region(part(input), part(copy), stream) };
        }
        if own_to_output {
            let own = |r: Region| Region::new(r.ptr.wrapping_add(self.rank * block), block);
            // SAFETY: the plan stages this way only an input that does not
            // overlap the output, of the output's length; the own block lies
            // within `input` (readable) and `output` (writable for the call).
            unsafe { copy_region(own(input), own(output), stream) };
        }
        bufs.input = Region::read_only(copy.ptr, copy.len);
        bufs
    }
}

#[cfg(test)]
mod tests {
    use super::staged_ranges;

    const B: usize = 1 << 16;

    fn ranges(nranks: usize, rank: usize, others: bool) -> Vec<(usize, usize)> {
        staged_ranges(nranks, rank, nranks * B, others).collect()
    }

    #[test]
    fn other_blocks_are_every_block_but_the_own_one() {
        assert_eq!(ranges(4, 1, true), [(0, B), (2 * B, 4 * B)]);
        assert_eq!(ranges(4, 0, true), [(B, 4 * B)]);
        assert_eq!(ranges(4, 3, true), [(0, 3 * B)]);
        assert_eq!(ranges(1, 0, true), []);
        for nranks in 1..6 {
            for rank in 0..nranks {
                let mut covered = vec![0u8; nranks];
                for (start, end) in ranges(nranks, rank, true) {
                    assert_eq!((start % B, end % B), (0, 0));
                    for c in covered.iter_mut().take(end / B).skip(start / B) {
                        *c += 1;
                    }
                }
                let want: Vec<u8> = (0..nranks).map(|b| u8::from(b != rank)).collect();
                assert_eq!(covered, want, "{nranks} ranks, rank {rank}");
            }
        }
    }

    #[test]
    fn otherwise_the_whole_input() {
        assert_eq!(ranges(4, 2, false), [(0, 4 * B)]);
    }
}
