//! Plain copies that stay off the short-distance `rep movsb` cliff.
//!
//! glibc's `memcpy` copies with `rep movsb` between about 4 KiB and 1 MiB
//! on CPUs with fast string moves. On AMD Zen (seen on an EPYC of family
//! 25) `rep movsb` runs about 15 times slower when the destination lies 1
//! to 15 bytes after the source modulo 4096, and about 1.5 times slower up
//! to 31 (`copy_floor -d 4` against `-d 0` shows whether a CPU has it).
//!
//! Which distance a copy gets depends on where the caller's buffers and the
//! ring positions fall: an all-gather of 1025 `f32`s copies its own block
//! at distance 4. Such copies here go through a loop of unaligned 32-byte
//! vector loads and stores instead (AVX2), which runs at `memcpy`'s speed at
//! every distance; every other copy stays with `memcpy`.
//! (The kernel's copies, for sockets and `process_vm_readv`, have the same
//! cliff; the TCP transport lays its stream out to avoid it.)

#![allow(unsafe_code)]

/// Copies of fewer bytes than this are left to `memcpy` (short `rep movsb`
/// copies take another path in the CPU, and the check would cost more than
/// it saves).
const CLIFF_MIN: usize = 1024;

/// Whether a copy from `src` to `dst` lands on the slow distances: the
/// destination 1 to 63 bytes after the source modulo 4096 (up to 31 is
/// slow; up to 63 keeps a margin).
pub(crate) fn on_cliff(src: *const u8, dst: *const u8) -> bool {
    let d = (dst as usize).wrapping_sub(src as usize) % 4096;
    (1..64).contains(&d)
}

/// Copies `len` bytes from `src` to `dst`, as `ptr::copy_nonoverlapping`
/// but never at `rep movsb`'s slow distances.
///
/// # Safety
/// As [`std::ptr::copy_nonoverlapping`]: `src` valid for reads and `dst`
/// for writes of `len` bytes, and the two ranges do not overlap.
#[inline]
pub(crate) unsafe fn copy_mem(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if len >= CLIFF_MIN && on_cliff(src, dst) && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the caller's contract, and AVX2 is present (checked).
        return unsafe { copy_avx2(src, dst, len) };
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

/// Whether `len` bytes from `a` and `len` bytes from `b` do not overlap.
#[inline]
pub(crate) fn disjoint(a: *const u8, b: *const u8, len: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    a.saturating_add(len) <= b || b.saturating_add(len) <= a
}

/// Copies `len` bytes from `src` to `dst`, as `ptr::copy` (the ranges may
/// overlap) but, where they do not, never at `rep movsb`'s slow distances.
///
/// # Safety
/// As [`std::ptr::copy`]: `src` valid for reads and `dst` for writes of
/// `len` bytes.
#[inline]
pub(crate) unsafe fn move_mem(src: *const u8, dst: *mut u8, len: usize) {
    if disjoint(src, dst, len) {
        // SAFETY: the caller's contract, and the ranges are disjoint.
        unsafe { copy_mem(src, dst, len) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy(src, dst, len) }
    }
}

/// The vector loop: 128 bytes a round, the tail by `memcpy` (under 128
/// bytes, where `rep movsb` has no cliff).
///
/// # Safety
/// As [`copy_mem`], and the CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn copy_avx2(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_storeu_si256};
    let (s, d) = (src.cast::<__m256i>(), dst.cast::<__m256i>());
    let rounds = len / 128;
    for i in 0..rounds {
        // SAFETY: the four 32-byte lanes of round `i` lie within the first
        // `rounds * 128 <= len` bytes of both ranges (caller's contract);
        // unaligned loads and stores need no alignment.
        unsafe {
            let a = _mm256_loadu_si256(s.add(4 * i));
            let b = _mm256_loadu_si256(s.add(4 * i + 1));
            let c = _mm256_loadu_si256(s.add(4 * i + 2));
            let e = _mm256_loadu_si256(s.add(4 * i + 3));
            _mm256_storeu_si256(d.add(4 * i), a);
            _mm256_storeu_si256(d.add(4 * i + 1), b);
            _mm256_storeu_si256(d.add(4 * i + 2), c);
            _mm256_storeu_si256(d.add(4 * i + 3), e);
        }
    }
    let done = rounds * 128;
    // SAFETY: the rest of both ranges (caller's contract).
    unsafe { std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), len - done) };
}

#[cfg(test)]
mod tests {
    use super::{copy_mem, disjoint, move_mem, on_cliff, CLIFF_MIN};

    #[test]
    fn cliff_distances() {
        let base = 0x10_0000usize as *const u8;
        for d in [1usize, 4, 12, 16, 31, 63] {
            assert!(on_cliff(base, base.wrapping_add(d)), "{d}");
            assert!(
                on_cliff(base, base.wrapping_add(4096 * 7 + d)),
                "{d} pages on"
            );
        }
        for d in [0usize, 64, 100, 2048, 4032, 4095, 4096] {
            assert!(!on_cliff(base, base.wrapping_add(d)), "{d}");
        }
        // The destination before the source: 4096 - 4 = 4092, off the cliff.
        assert!(!on_cliff(base.wrapping_add(4), base));
    }

    /// Every byte arrives, at cliff and other distances, around the sizes
    /// where the paths change; nothing outside the destination is touched.
    #[test]
    fn copies_exactly_on_and_off_the_cliff() {
        let src: Vec<u8> = (0..40_000u32).map(|i| (i * 13 + 7) as u8).collect();
        for d in [0usize, 4, 16, 63, 64, 1000] {
            for len in [
                0,
                1,
                127,
                128,
                CLIFF_MIN - 1,
                CLIFF_MIN,
                4095,
                4096 + 77,
                32_768,
            ] {
                let mut dst = vec![0xA5u8; 40_000 + 5000];
                // Place the destination `d` bytes after the source modulo 4096.
                let want = (src.as_ptr() as usize + d) % 4096;
                let at = (want + 4096 - dst.as_ptr() as usize % 4096) % 4096;
                // SAFETY: `src` has at least `len` bytes; `dst[at..at + len]`
                // is inside `dst` (at < 4096, len <= 32768); distinct vectors.
                unsafe { copy_mem(src.as_ptr(), dst.as_mut_ptr().add(at), len) };
                assert_eq!(&dst[at..at + len], &src[..len], "d {d} len {len}");
                assert!(
                    dst[..at].iter().all(|&b| b == 0xA5),
                    "before, d {d} len {len}"
                );
                assert!(
                    dst[at + len..].iter().all(|&b| b == 0xA5),
                    "after, d {d} len {len}"
                );
                let dist = (dst[at..].as_ptr() as usize).wrapping_sub(src.as_ptr() as usize) % 4096;
                assert_eq!(dist, d, "the test placed the copy where it meant to");
            }
        }
    }

    /// Overlapping moves keep `memmove`'s result, at cliff distances too
    /// (a forward vector loop would smear the first 128 bytes there).
    #[test]
    fn overlapping_moves_are_exact() {
        for d in [4usize, 16, 100] {
            let orig: Vec<u8> = (0..20_000u32).map(|i| (i * 31 + 1) as u8).collect();
            let mut buf = orig.clone();
            let len = 8192;
            // SAFETY: both ranges lie inside `buf` (len + d < 20000).
            unsafe { move_mem(buf.as_ptr(), buf.as_mut_ptr().add(d), len) };
            assert_eq!(&buf[d..d + len], &orig[..len], "forward by {d}");
            let mut buf = orig.clone();
            // SAFETY: as above.
            unsafe { move_mem(buf.as_ptr().add(d), buf.as_mut_ptr(), len) };
            assert_eq!(&buf[..len], &orig[d..d + len], "backward by {d}");
        }
    }

    /// Adjacent ranges are disjoint, one shared byte is not, and ranges
    /// near the top of the address space saturate rather than wrap.
    #[test]
    fn disjoint_ranges() {
        let at = |x: usize| x as *const u8;
        assert!(disjoint(at(1000), at(1100), 100));
        assert!(disjoint(at(1100), at(1000), 100));
        assert!(!disjoint(at(1000), at(1099), 100));
        assert!(!disjoint(at(1099), at(1000), 100));
        assert!(!disjoint(at(1000), at(1000), 1));
        assert!(disjoint(at(1000), at(1000), 0));
        let top = usize::MAX - 10;
        assert!(!disjoint(at(top), at(top - 5), 100), "wrapped");
        assert!(disjoint(at(top), at(0), 5));
    }
}
