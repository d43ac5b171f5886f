//! A copy with non-temporal stores, for large copies into memory this core
//! will not read again soon (another rank's output, or an output larger
//! than the caches): the stores skip the read-for-ownership of every
//! destination line, a third of the memory traffic of a plain copy.

#![allow(unsafe_code)]

/// A rank whose output has at least [`stream_output_min`] bytes copies with
/// streaming stores (the output will not stay in the caches anyway): half
/// the last-level cache the kernel reports, within these bounds (the upper
/// one where it reports none). Why half: streaming only pays once the output
/// no longer stays in the cache. Below that size it lost 5-25%, and above
/// it zero-copy collectives ran 1.2-1.9x faster.
pub(crate) const STREAM_OUTPUT_MIN: usize = 32 << 20;
/// ... and at least this (the smallest half-cache that counts).
pub(crate) const STREAM_OUTPUT_FLOOR: usize = 4 << 20;

/// The output size from which copies stream (see [`STREAM_OUTPUT_MIN`]).
pub(crate) fn stream_output_min() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        transport_tcp::last_level_cache_bytes().map_or(STREAM_OUTPUT_MIN, |c| {
            (c / 2).clamp(STREAM_OUTPUT_FLOOR, STREAM_OUTPUT_MIN)
        })
    })
}

/// ... for copies of at least this many bytes.
pub(crate) const STREAM_COPY_MIN: usize = 64 << 10;
/// A transport copying a message in pieces (as they arrive) streams pieces
/// of at least this many bytes: below it, the plain copy of the unaligned
/// head and tail would be most of the piece.
pub(crate) const STREAM_PIECE_MIN: usize = 1 << 10;

/// Copies `src` into `dst` (same length) with streaming stores where the
/// CPU has them (SSE2, every x86-64), else `copy_from_slice`.
pub(crate) fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_streaming: lengths differ");
    #[cfg(target_arch = "x86_64")]
    {
        // Align the destination to 64 bytes with a plain copy of the head.
        let head = dst.as_ptr().align_offset(64).min(dst.len());
        dst[..head].copy_from_slice(&src[..head]);
        let body = (dst.len() - head) & !63;
        let (d, s) = (&mut dst[head..head + body], &src[head..head + body]);
        // SAFETY: SSE2 is part of x86-64; `d` starts 64-byte aligned (and so
        // 16-byte aligned for `_mm_stream_si128`); both ranges have `body`
        // bytes, a multiple of 64; unaligned loads need no alignment.
        unsafe {
            use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
            let (dp, sp) = (
                d.as_mut_ptr().cast::<__m128i>(),
                s.as_ptr().cast::<__m128i>(),
            );
            for i in (0..body / 16).step_by(4) {
                let a = _mm_loadu_si128(sp.add(i));
                let b = _mm_loadu_si128(sp.add(i + 1));
                let c = _mm_loadu_si128(sp.add(i + 2));
                let e = _mm_loadu_si128(sp.add(i + 3));
                _mm_stream_si128(dp.add(i), a);
                _mm_stream_si128(dp.add(i + 1), b);
                _mm_stream_si128(dp.add(i + 2), c);
                _mm_stream_si128(dp.add(i + 3), e);
            }
            // Streaming stores are weakly ordered: fence them before anyone
            // is told the data is there.
            _mm_sfence();
        }
        let done = head + body;
        dst[done..].copy_from_slice(&src[done..]);
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

#[cfg(test)]
mod tests {
    use super::{copy_streaming, stream_output_min};
    use super::{STREAM_OUTPUT_FLOOR, STREAM_OUTPUT_MIN};

    #[test]
    fn the_threshold_is_half_the_cache_within_bounds() {
        let m = stream_output_min();
        assert!(
            (STREAM_OUTPUT_FLOOR..=STREAM_OUTPUT_MIN).contains(&m),
            "{m}"
        );
    }

    #[test]
    fn copies_every_byte_at_every_alignment_and_length() {
        let src: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();
        for off in [0, 1, 15, 63, 64, 65] {
            for len in [0, 1, 63, 64, 127, 128, 1000, 4000] {
                let mut dst = vec![0xAAu8; 4200];
                copy_streaming(&mut dst[off..off + len], &src[..len]);
                assert_eq!(&dst[off..off + len], &src[..len], "off {off} len {len}");
                assert!(dst[..off].iter().all(|&b| b == 0xAA));
                assert!(dst[off + len..].iter().all(|&b| b == 0xAA));
            }
        }
    }
}
