//! Staging a call's input in shared memory before it runs: the input of
//! an all-to-all that overlaps its output, and (where the single-copy
//! policy says so) a heap input that co-located readers would otherwise
//! read with `process_vm_readv`. The copies into staging take plain or
//! streaming stores as `engine::store_chooser` picks, one chooser per
//! reader where a block has one reader.

use super::core::Core;
use crate::engine::{copy_region, CallBufs, Region};
use crate::plan::Coll;

/// The byte ranges of an all-to-all's input of `len` bytes that
/// [`Core::stage_input`] copies into staging, each with the rank that will
/// read it where it is one block (`per_block`): every block but `rank`'s
/// when `in_place` (the schedule that runs sends from staging and leaves
/// the own block alone), one by one if `per_block` else as the two ranges
/// around it; otherwise the whole input.
fn staged_ranges(
    nranks: usize,
    rank: usize,
    len: usize,
    in_place: bool,
    per_block: bool,
) -> impl Iterator<Item = (usize, usize, Option<usize>)> {
    let block = len / nranks.max(1);
    let one_by_one = in_place && per_block;
    let blocks = (0..nranks)
        .filter(move |&b| one_by_one && b != rank)
        .map(move |b| (b * block, (b + 1) * block, Some(b)));
    let parts = match (in_place, one_by_one) {
        (true, true) => [(0, 0), (0, 0)],
        (true, false) => [(0, rank * block), ((rank + 1) * block, len)],
        (false, _) => [(0, len), (0, 0)],
    };
    let parts = parts
        .into_iter()
        .filter(|(start, end)| start != end)
        .map(|(start, end)| (start, end, None));
    blocks.chain(parts)
}

impl Core {
    /// An all-to-all whose input overlaps its output sends every block
    /// before it can receive into it, so its schedule reads a copy of the
    /// input: in this communicator's staging buffer, which stays allocated
    /// (as the engine's scratch does), because a fresh copy per call pays
    /// the first touch of every page (2 ranks, 64 MiB in place: 50 ms with
    /// a new `Vec` per call, against 15 ms out of place). Exactly in place,
    /// the rank's own block is already where it belongs: only the other
    /// blocks are copied, and the schedule `all_to_all_in_place` (`true`
    /// returned: run it) leaves the own block alone.
    ///
    /// An out-of-place all-to-all whose blocks go single copy from a heap
    /// buffer is staged the same way where
    /// [`SingleCopyPolicy::stages_all_to_all`](crate::engine::SingleCopyPolicy::stages_all_to_all)
    /// says so: the staging buffer is
    /// shared memory, which the readers map and copy from with `memcpy`, where
    /// they would read the heap buffer with `process_vm_readv`. The own
    /// block is copied to the output here, and the in-place schedule runs
    /// (its messages are those of the out-of-place one).
    ///
    /// Blocks of [`TIMED_MIN_BYTES`](crate::engine::TIMED_MIN_BYTES) or
    /// more that the size rule copies with plain stores are copied one by
    /// one, each with the stores its reader's chooser picks: a plain copy
    /// runs fast or about ten times slower depending on the CPU the reader
    /// of that block ran on (see `engine::store_chooser`).
    pub(super) fn stage_input(&mut self, coll: Coll, mut bufs: CallBufs) -> (CallBufs, bool) {
        if let Coll::AllGather { .. } = coll {
            return (self.stage_all_gather_input(bufs), false);
        }
        let Coll::AllToAll { .. } = coll else {
            return (bufs, false);
        };
        let (input, output) = (bufs.input, bufs.output);
        let (i, o) = (input.ptr as usize, output.ptr as usize);
        if input.len == 0 {
            return (bufs, false);
        }
        let disjoint = !input.overlaps(output);
        if disjoint && !self.stages_all_to_all(input, output) {
            return (bufs, false);
        }
        let copy = Region::new(self.staging.ensure(input.len), input.len);
        let in_place =
            disjoint || (i == o && input.len == output.len && input.len % self.nranks == 0);
        let stream = self.engine.single_copy.stage_streams(input.len);
        let block = input.len / self.nranks;
        let per_block = in_place && !stream && block >= crate::engine::TIMED_MIN_BYTES;
        for (start, end, reader) in
            staged_ranges(self.nranks, self.rank, input.len, in_place, per_block)
        {
            // `wrapping_add` keeps these free of unsafe; `start <= end <=
            // input.len` by construction.
            let part = |r: Region| Region::new(r.ptr.wrapping_add(start), end - start);
            // SAFETY: `input` is readable for the call (the `CallBufs`
            // invariant) and `copy` is this communicator's own buffer of at
            // least `input.len` bytes, which nothing else uses meanwhile;
            // both parts lie within them.
            unsafe {
                self.staging
                    .copy_in(reader, part(input), part(copy), stream)
            };
        }
        if disjoint {
            let own = |r: Region| Region::new(r.ptr.wrapping_add(self.rank * block), block);
            // SAFETY: the own block lies within `input` (readable) and
            // `output` (writable for the call), which do not overlap.
            unsafe { copy_region(own(input), own(output), stream) };
        }
        bufs.input = Region::read_only(copy.ptr, copy.len);
        (bufs, in_place)
    }

    /// With more local ranks than CPUs, an out-of-place all-gather whose
    /// block goes single copy from a heap buffer, one hop, to every other
    /// rank sends it from a copy in the shared staging buffer, as a small
    /// all-to-all does (see [`Core::stage_input`]): each reader
    /// then copies it with `memcpy` from a mapping instead of
    /// `process_vm_readv`, and the one extra copy is the sender's. 4 ranks
    /// on 2 cores, five paired rounds (`scripts/paired.sh`), heap buffers:
    /// 256 KiB 89.9 -> 52.7 us, 1 MiB 278 -> 142 us, 4 MiB 1.56 -> 1.06 ms,
    /// 16 MiB 8.44 -> 6.71 ms, 64 MiB 33.2 -> 29.1 ms. Not between two
    /// ranks on their own CPUs, where it lost (1 MiB 65 -> 85 us, 16 MiB
    /// 3.25 -> 3.98 ms), also against the ring from `ring_from` on, where
    /// a staged all-to-all gains (six paired rounds, whole blocks staged
    /// with plain / streaming stores: 16 MiB x0.86 / x0.85, 64 MiB x0.79 /
    /// x0.96).
    fn stage_all_gather_input(&mut self, mut bufs: CallBufs) -> CallBufs {
        let (input, output) = (bufs.input, bufs.output);
        let policy = self.engine.single_copy;
        let staged = policy.oversubscribed
            && input.len > 0
            && !input.overlaps(output)
            && policy.whole_block_all_gather(output.len)
            && crate::hostmem::locate(input.ptr, input.len).is_none()
            && !crate::hostmem::registered_huge(input.ptr, input.len);
        if staged {
            let copy = Region::new(self.staging.ensure(input.len), input.len);
            // SAFETY: `input` is readable for the call (the `CallBufs`
            // invariant) and `copy` is this communicator's own buffer of at
            // least `input.len` bytes, which nothing else uses meanwhile.
            unsafe { self.staging.copy_in(None, input, copy, false) };
            bufs.input = Region::read_only(copy.ptr, copy.len);
        }
        bufs
    }

    /// Whether an out-of-place all-to-all from `input` to `output` is staged
    /// in shared memory (see [`Core::stage_input`]): where the policy stages
    /// one of that size, from a heap buffer that is not registered onto huge
    /// pages (see [`crate::hostmem::registered_huge`]).
    fn stages_all_to_all(&self, input: Region, output: Region) -> bool {
        self.engine.single_copy.stages_all_to_all(input.len)
            && input.len == output.len
            && input.len % self.nranks == 0
            && crate::hostmem::locate(input.ptr, input.len).is_none()
            && !crate::hostmem::registered_huge(input.ptr, input.len)
    }
}

#[cfg(test)]
mod tests {
    use super::staged_ranges;

    const B: usize = 1 << 16;

    fn ranges(
        nranks: usize,
        rank: usize,
        in_place: bool,
        per_block: bool,
    ) -> Vec<(usize, usize, Option<usize>)> {
        staged_ranges(nranks, rank, nranks * B, in_place, per_block).collect()
    }

    #[test]
    fn in_place_stages_every_block_but_the_own_one() {
        assert_eq!(
            ranges(4, 1, true, true),
            [
                (0, B, Some(0)),
                (2 * B, 3 * B, Some(2)),
                (3 * B, 4 * B, Some(3))
            ]
        );
        assert_eq!(
            ranges(4, 1, true, false),
            [(0, B, None), (2 * B, 4 * B, None)]
        );
        assert_eq!(ranges(4, 0, true, false), [(B, 4 * B, None)]);
        assert_eq!(ranges(4, 3, true, false), [(0, 3 * B, None)]);
        assert_eq!(ranges(1, 0, true, true), []);
        for nranks in 1..6 {
            for rank in 0..nranks {
                for per_block in [false, true] {
                    let mut covered = vec![0u8; nranks];
                    for (start, end, reader) in ranges(nranks, rank, true, per_block) {
                        assert_eq!(start % B, 0);
                        assert_eq!(end % B, 0);
                        for (b, c) in covered.iter_mut().enumerate().take(end / B).skip(start / B) {
                            *c += 1;
                            if per_block {
                                assert_eq!(reader, Some(b));
                            }
                        }
                    }
                    let want: Vec<u8> = (0..nranks).map(|b| u8::from(b != rank)).collect();
                    assert_eq!(
                        covered, want,
                        "{nranks} ranks, rank {rank}, per block {per_block}"
                    );
                }
            }
        }
    }

    #[test]
    fn otherwise_the_whole_input() {
        assert_eq!(ranges(4, 2, false, false), [(0, 4 * B, None)]);
        assert_eq!(ranges(4, 2, false, true), [(0, 4 * B, None)]);
    }
}
