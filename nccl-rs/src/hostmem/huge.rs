//! Host buffer registration: moving a caller's heap buffer onto
//! transparent huge pages, where the kernel allows it.
//!
//! A co-located peer reads a heap buffer with `process_vm_readv`, which
//! pins every page it reads: on 4 KiB pages that can cost as much again as
//! the copy, on 2 MiB pages almost nothing (`copy_floor` against
//! `copy_floor --thp` shows both on a host).
//! Kernels configured `madvise` (`/sys/kernel/mm/transparent_hugepage/
//! enabled`) give huge pages only to memory that asks, so registering a
//! buffer (`ncclCommRegister`, [`prefer_huge_pages`]) asks for its whole
//! 2 MiB pages: `MADV_HUGEPAGE` (later faults and `khugepaged`), then
//! `MADV_COLLAPSE` (Linux 6.1 and later: now, copying each page once). The
//! contents never change; the kernel may refuse either step (THP `never`,
//! an older kernel, no free huge page), which leaves the buffer as it was.

#![allow(unsafe_code)]

/// x86-64's and aarch64's (4 KiB base pages) PMD size.
pub const HUGE_PAGE: usize = 2 << 20;

/// What [`prefer_huge_pages`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HugePages {
    /// The buffer holds no whole 2 MiB page, or lies in shared memory
    /// (`ncclMemAlloc`, [`super::ShmBuffer`]: peers map it instead).
    NotApplicable,
    /// The kernel refused the advice (the errno).
    Refused(i32),
    /// Advised, but not collapsed now (the errno of `MADV_COLLAPSE`):
    /// pages faulted from now on, and `khugepaged` later, may be huge.
    Advised(i32),
    /// This many bytes (whole 2 MiB pages inside the buffer) are huge pages
    /// now.
    Collapsed(usize),
}

/// The whole 2 MiB pages inside `[ptr, ptr + len)`, as (start, length).
fn whole_huge_pages(ptr: usize, len: usize) -> Option<(usize, usize)> {
    let start = ptr.checked_add(HUGE_PAGE - 1)? & !(HUGE_PAGE - 1);
    let end = ptr.checked_add(len)? & !(HUGE_PAGE - 1);
    (end > start).then(|| (start, end - start))
}

/// Asks the kernel to back the whole 2 MiB pages of the `len` bytes at
/// `ptr` with transparent huge pages (see the module docs). Never reads or
/// writes the memory, and leaves its contents as they are; a range that is
/// not mapped, or not anonymous private memory, is refused by the kernel.
pub fn prefer_huge_pages(ptr: *const u8, len: usize) -> HugePages {
    if len == 0 || super::locate(ptr, len).is_some() {
        return HugePages::NotApplicable;
    }
    let Some((start, bytes)) = whole_huge_pages(ptr as usize, len) else {
        return HugePages::NotApplicable;
    };
    let advise = |advice: libc::c_int| {
        // SAFETY: madvise with these two advices only changes how the
        // kernel backs the range (huge pages instead of small ones, the
        // data copied by the kernel); it creates and removes no mapping,
        // never changes what a program reads there, and checks the range
        // itself (ENOMEM where nothing is mapped).
        match unsafe { libc::madvise(start as *mut libc::c_void, bytes, advice) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL)),
        }
    };
    if let Err(e) = advise(libc::MADV_HUGEPAGE) {
        return HugePages::Refused(e);
    }
    // Recorded either way: a range not yet faulted in cannot be collapsed
    // (`EINVAL`), and faults after the advice take huge pages.
    huge_ranges().record(start, bytes);
    match advise(MADV_COLLAPSE) {
        Ok(()) => HugePages::Collapsed(bytes),
        Err(e) => HugePages::Advised(e),
    }
}

/// Forgets a registration of the `len` bytes at `ptr` ([`prefer_huge_pages`]
/// advised or collapsed them), as `ncclCommDeregister` does: once every registration of
/// that range is forgotten, calls on it are staged again where that pays
/// (as `registered_huge` tells the staging code).
pub fn forget_huge_pages(ptr: *const u8, len: usize) {
    if let Some((start, bytes)) = whole_huge_pages(ptr as usize, len) {
        huge_ranges().forget(start, bytes);
    }
}

/// Whether the whole 2 MiB pages of the `len` bytes at `ptr` (at least one)
/// lie in a range that registration advised or collapsed onto huge pages
/// and that is still registered: a co-located reader's `process_vm_readv` then costs
/// about what a `memcpy` does, so copying such a buffer into shared memory
/// first (the staged single-copy sends) only adds a copy, which measured
/// 10-15% slower. A range freed and reused
/// unregistered, or split back into small pages by the kernel, only costs
/// speed: the data path is the same either way (and so does a range that
/// was advised while partly faulted in on small pages, and not collapsed).
pub(crate) fn registered_huge(ptr: *const u8, len: usize) -> bool {
    match whole_huge_pages(ptr as usize, len) {
        Some((start, bytes)) => huge_ranges().covers(start, bytes),
        None => false,
    }
}

/// Ranges [`prefer_huge_pages`] advised or collapsed, with how many registrations
/// hold each; the newest [`HugeRanges::MAX`] only (an application that
/// registers without deregistering does not grow it without bound).
#[derive(Default)]
struct HugeRanges {
    /// (start, bytes, registrations), oldest first.
    ranges: Vec<(usize, usize, usize)>,
}

impl HugeRanges {
    const MAX: usize = 64;

    fn record(&mut self, start: usize, bytes: usize) {
        if let Some(r) = self
            .ranges
            .iter_mut()
            .find(|r| (r.0, r.1) == (start, bytes))
        {
            r.2 += 1;
            return;
        }
        if self.ranges.len() == Self::MAX {
            self.ranges.remove(0);
        }
        self.ranges.push((start, bytes, 1));
    }

    fn forget(&mut self, start: usize, bytes: usize) {
        if let Some(i) = self
            .ranges
            .iter()
            .position(|r| (r.0, r.1) == (start, bytes))
        {
            self.ranges[i].2 -= 1;
            if self.ranges[i].2 == 0 {
                self.ranges.remove(i);
            }
        }
    }

    fn covers(&self, start: usize, bytes: usize) -> bool {
        self.ranges
            .iter()
            .any(|&(s, b, _)| s <= start && start + bytes <= s + b)
    }
}

fn huge_ranges() -> std::sync::MutexGuard<'static, HugeRanges> {
    static RANGES: std::sync::Mutex<HugeRanges> =
        std::sync::Mutex::new(HugeRanges { ranges: Vec::new() });
    RANGES.lock().unwrap_or_else(|p| p.into_inner())
}

/// [`prefer_huge_pages`] for a buffer of elements (a `Vec`, a slice of a
/// larger allocation): what registering it with a communicator does for
/// host memory (`ncclCommRegister`). Worth it for buffers used again and
/// again: collapsing copies each 2 MiB page once, up front, and afterwards
/// co-located peers read the buffer without pinning 4 KiB pages (large
/// all-to-alls and broadcasts on heap buffers ran up to 2x faster). While
/// registered (until [`forget_huge_pages`]),
/// calls on the buffer are not staged through shared memory.
pub fn register_host_buffer<T: crate::datatype::Element>(buf: &[T]) -> HugePages {
    prefer_huge_pages(buf.as_ptr().cast(), std::mem::size_of_val(buf))
}

/// `MADV_COLLAPSE` (Linux 6.1), the same number on every architecture.
const MADV_COLLAPSE: libc::c_int = 25;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_ranges_count_registrations_and_stay_bounded() {
        const H: usize = HUGE_PAGE;
        let mut c = HugeRanges::default();
        c.record(4 * H, 8 * H);
        c.record(4 * H, 8 * H);
        assert!(c.covers(4 * H, 8 * H));
        assert!(c.covers(6 * H, 2 * H), "a part of a registered range");
        assert!(!c.covers(3 * H, 2 * H), "starts before it");
        assert!(!c.covers(11 * H, 2 * H), "ends after it");
        c.forget(4 * H, 8 * H);
        assert!(c.covers(4 * H, 8 * H), "still registered once");
        c.forget(4 * H, 8 * H);
        assert!(!c.covers(4 * H, 8 * H));
        c.forget(4 * H, 8 * H); // no such registration: nothing happens
        for i in 0..HugeRanges::MAX + 3 {
            c.record(i * 2 * H, H);
        }
        assert_eq!(c.ranges.len(), HugeRanges::MAX);
        assert!(!c.covers(0, H), "the oldest went first");
        assert!(c.covers((HugeRanges::MAX + 2) * 2 * H, H));
    }

    #[test]
    fn only_whole_huge_pages() {
        const H: usize = HUGE_PAGE;
        assert_eq!(whole_huge_pages(0, H), Some((0, H)));
        assert_eq!(whole_huge_pages(1, H), None);
        assert_eq!(whole_huge_pages(H - 1, H + 1), Some((H, H)));
        assert_eq!(whole_huge_pages(3 * H + 5, 4 * H), Some((4 * H, 3 * H)));
        assert_eq!(whole_huge_pages(usize::MAX - H, 2 * H), None);
    }

    /// kB of `AnonHugePages` in the mapping of this process that holds
    /// `addr` (`/proc/self/smaps`).
    fn huge_kb_at(addr: usize) -> Option<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = first.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = (a..b).contains(&addr);
                    continue;
                }
            }
            if inside {
                if let Some(v) = line.strip_prefix("AnonHugePages:") {
                    return v.split_whitespace().next()?.parse().ok();
                }
            }
        }
        None
    }

    #[test]
    fn a_heap_buffer_moves_onto_huge_pages_and_keeps_its_bytes() {
        let len = 9 * HUGE_PAGE + 12345;
        let buf: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let outcome = prefer_huge_pages(buf.as_ptr(), len);
        assert!(
            buf.iter()
                .enumerate()
                .all(|(i, &b)| b == (i * 31 % 251) as u8),
            "contents changed ({outcome:?})"
        );
        match outcome {
            HugePages::Collapsed(bytes) => {
                assert!((8 * HUGE_PAGE..=9 * HUGE_PAGE).contains(&bytes), "{bytes}");
                let start = whole_huge_pages(buf.as_ptr() as usize, len).unwrap().0;
                let kb = huge_kb_at(start).expect("the buffer's mapping in smaps");
                assert!(
                    kb as usize * 1024 >= bytes,
                    "{kb} kB in huge pages, {bytes} collapsed"
                );
                assert!(registered_huge(buf.as_ptr(), len));
                assert!(registered_huge(buf[HUGE_PAGE..].as_ptr(), 4 * HUGE_PAGE));
                forget_huge_pages(buf.as_ptr(), len);
                assert!(!registered_huge(buf.as_ptr(), len), "forgotten");
            }
            // A kernel without THP, or before 6.1: nothing to check but the
            // bytes (say so, so that a run on such a host is visible).
            other => eprintln!("huge pages not collapsed here: {other:?}"),
        }
    }

    #[test]
    fn a_buffer_of_elements_registers_its_bytes() {
        let v = vec![7u32; 3 * HUGE_PAGE / 4 + 1];
        match register_host_buffer(&v) {
            HugePages::Collapsed(bytes) => assert!((HUGE_PAGE..=3 * HUGE_PAGE).contains(&bytes)),
            other => eprintln!("huge pages not collapsed here: {other:?}"),
        }
        assert!(v.iter().all(|&x| x == 7));
    }

    #[test]
    fn shared_and_tiny_buffers_are_left_alone() {
        let shared = crate::ShmBuffer::<u8>::zeroed(4 * HUGE_PAGE).unwrap();
        assert_eq!(
            prefer_huge_pages(shared.as_ptr(), 4 * HUGE_PAGE),
            HugePages::NotApplicable
        );
        let small = vec![1u8; 4096];
        assert_eq!(
            prefer_huge_pages(small.as_ptr(), small.len()),
            HugePages::NotApplicable
        );
        assert_eq!(
            prefer_huge_pages(small.as_ptr(), 0),
            HugePages::NotApplicable
        );
    }
}
