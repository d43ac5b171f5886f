//! The registration cache: memory registrations shared by reference count,
//! keyed by page-aligned address range.
//!
//! Two kinds of users take references on an entry:
//! * **pins**, from explicit `reg_mr` calls (each returns a handle; the
//!   matching `dereg_mr` drops the pin);
//! * **in-flight requests** on unregistered buffers too large for the
//!   bounce buffers: [`RegCache::acquire`] reuses any entry whose range
//!   covers the buffer (so a buffer inside a `reg_mr`ed region costs
//!   nothing), or registers the buffer's pages; the request releases its
//!   reference when it completes.
//!
//! An entry is deregistered when both counts reach zero. Implicit
//! registrations are therefore *not* kept after their last request: the
//! transport cannot see `free`/`munmap`, and a registration kept over freed
//! and re-mapped memory would keep pointing at the old physical pages
//! (silent data corruption). Callers that reuse large buffers (nccl-rs's
//! staging buffers) register them once with `reg_mr` and get zero copies
//! without per-message registration.
//!
//! The logic is generic over the registration type `M` so it is tested
//! without hardware.

/// Page size used to align ranges.
pub const PAGE: usize = 4096;

/// Identifies a cache entry (the `MemHandle` value of a `reg_mr`).
pub type EntryId = u64;

struct Entry<M> {
    id: EntryId,
    start: usize,
    end: usize,
    pins: u32,
    refs: u32,
    mr: M,
}

/// A reference-counted set of registrations.
pub struct RegCache<M> {
    entries: Vec<Entry<M>>,
    next_id: EntryId,
}

impl<M> Default for RegCache<M> {
    fn default() -> Self {
        RegCache {
            entries: Vec::new(),
            next_id: 1,
        }
    }
}

/// The page-aligned range covering `addr..addr+len` (at least one page).
pub fn page_range(addr: usize, len: usize) -> (usize, usize) {
    let start = addr & !(PAGE - 1);
    let end = addr.saturating_add(len.max(1)).saturating_add(PAGE - 1) & !(PAGE - 1);
    (start, end)
}

impl<M> RegCache<M> {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    fn covering(&self, addr: usize, len: usize) -> Option<usize> {
        let end = addr.saturating_add(len);
        self.entries
            .iter()
            .position(|e| e.start <= addr && end <= e.end)
    }

    fn insert(&mut self, start: usize, end: usize, pins: u32, refs: u32, mr: M) -> EntryId {
        let id = self.next_id;
        self.next_id += 1;
        self.entries.push(Entry {
            id,
            start,
            end,
            pins,
            refs,
            mr,
        });
        id
    }

    /// Explicit registration (`reg_mr`): pins a covering entry, or
    /// registers the page range with `register(start, len)`.
    pub fn pin<E>(
        &mut self,
        addr: usize,
        len: usize,
        register: impl FnOnce(usize, usize) -> Result<M, E>,
    ) -> Result<EntryId, E> {
        if let Some(i) = self.covering(addr, len) {
            self.entries[i].pins += 1;
            return Ok(self.entries[i].id);
        }
        let (start, end) = page_range(addr, len);
        let mr = register(start, end - start)?;
        Ok(self.insert(start, end, 1, 0, mr))
    }

    /// Drops one pin (`dereg_mr`). Returns the registration to release if
    /// the entry is now unused, `Err(())` for an unknown or unpinned id.
    #[allow(clippy::result_unit_err)]
    pub fn unpin(&mut self, id: EntryId) -> Result<Option<M>, ()> {
        let i = self.entries.iter().position(|e| e.id == id).ok_or(())?;
        let e = &mut self.entries[i];
        if e.pins == 0 {
            return Err(());
        }
        e.pins -= 1;
        Ok(self.remove_if_unused(i))
    }

    /// A reference for one request on `addr..addr+len`: a covering entry,
    /// or a new registration of its pages.
    pub fn acquire<E>(
        &mut self,
        addr: usize,
        len: usize,
        register: impl FnOnce(usize, usize) -> Result<M, E>,
    ) -> Result<EntryId, E> {
        if let Some(i) = self.covering(addr, len) {
            self.entries[i].refs += 1;
            return Ok(self.entries[i].id);
        }
        let (start, end) = page_range(addr, len);
        let mr = register(start, end - start)?;
        Ok(self.insert(start, end, 0, 1, mr))
    }

    /// A reference on the pinned entry `id`, checking that it covers
    /// `addr..addr+len` (a request naming its registration).
    pub fn acquire_id(&mut self, id: EntryId, addr: usize, len: usize) -> Option<EntryId> {
        let e = self.entries.iter_mut().find(|e| e.id == id)?;
        if e.start <= addr && addr.saturating_add(len) <= e.end && e.pins > 0 {
            e.refs += 1;
            Some(id)
        } else {
            None
        }
    }

    /// Drops a request's reference; returns the registration to release if
    /// the entry is now unused.
    pub fn release(&mut self, id: EntryId) -> Option<M> {
        let i = self.entries.iter().position(|e| e.id == id)?;
        let e = &mut self.entries[i];
        debug_assert!(e.refs > 0, "release without acquire");
        e.refs = e.refs.saturating_sub(1);
        self.remove_if_unused(i)
    }

    fn remove_if_unused(&mut self, i: usize) -> Option<M> {
        let e = &self.entries[i];
        (e.pins == 0 && e.refs == 0).then(|| self.entries.swap_remove(i).mr)
    }

    /// The registration of entry `id`.
    pub fn get(&self, id: EntryId) -> Option<&M> {
        self.entries.iter().find(|e| e.id == id).map(|e| &e.mr)
    }

    /// Number of live registrations.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// A fake registration remembering its range.
    #[derive(Debug, PartialEq, Eq)]
    struct FakeMr(usize, usize);

    struct Fake {
        calls: RefCell<Vec<(usize, usize)>>,
    }

    impl Fake {
        fn new() -> Self {
            Fake {
                calls: RefCell::new(Vec::new()),
            }
        }
        fn reg(&self) -> impl FnOnce(usize, usize) -> Result<FakeMr, String> + '_ {
            move |s, l| {
                self.calls.borrow_mut().push((s, l));
                Ok(FakeMr(s, l))
            }
        }
    }

    #[test]
    fn page_alignment() {
        assert_eq!(page_range(0x1000, 0x1000), (0x1000, 0x2000));
        assert_eq!(page_range(0x1001, 1), (0x1000, 0x2000));
        assert_eq!(page_range(0x1fff, 2), (0x1000, 0x3000));
        assert_eq!(page_range(0x1000, 0), (0x1000, 0x2000));
    }

    #[test]
    fn requests_share_and_release_implicit_registrations() {
        let f = Fake::new();
        let mut c: RegCache<FakeMr> = RegCache::new();
        let a = c.acquire(0x10_010, 0x3000, f.reg()).unwrap();
        assert_eq!(*f.calls.borrow(), vec![(0x10_000, 0x4000)]);
        // Inside the same pages: shared, no new registration.
        let b = c.acquire(0x10_100, 0x100, f.reg()).unwrap();
        assert_eq!(a, b);
        assert_eq!(f.calls.borrow().len(), 1);
        assert_eq!(c.release(a), None, "still referenced");
        assert_eq!(
            c.release(b),
            Some(FakeMr(0x10_000, 0x4000)),
            "last reference deregisters"
        );
        assert!(c.is_empty());
        // Not kept: the next request registers again.
        c.acquire(0x10_010, 0x3000, f.reg()).unwrap();
        assert_eq!(f.calls.borrow().len(), 2);
    }

    #[test]
    fn pinned_regions_serve_requests_until_unpinned() {
        let f = Fake::new();
        let mut c: RegCache<FakeMr> = RegCache::new();
        let h = c.pin(0x100_000, 1 << 20, f.reg()).unwrap();
        // A sub-buffer of the pinned region is served without registering.
        let r = c.acquire(0x100_000 + 4096 * 3 + 5, 8192, f.reg()).unwrap();
        assert_eq!(r, h);
        assert_eq!(f.calls.borrow().len(), 1);
        assert_eq!(c.acquire_id(h, 0x100_000, 1 << 20), Some(h));
        assert_eq!(
            c.acquire_id(h, 0x100_000, (1 << 20) + 1),
            None,
            "range not covered"
        );
        assert_eq!(c.acquire_id(999, 0, 1), None);
        // Unpinned while two requests are in flight: stays until they end.
        assert_eq!(c.unpin(h), Ok(None));
        assert_eq!(c.unpin(h), Err(()), "double dereg");
        assert_eq!(c.release(r), None);
        assert!(c.release(h).is_some());
        assert!(c.is_empty());
    }

    #[test]
    fn double_pin_needs_double_unpin_and_overlap_registers_anew() {
        let f = Fake::new();
        let mut c: RegCache<FakeMr> = RegCache::new();
        let a = c.pin(0x4000, 0x4000, f.reg()).unwrap();
        let b = c.pin(0x5000, 0x1000, f.reg()).unwrap();
        assert_eq!(a, b);
        // Overlapping but not covered: a second registration.
        let o = c.acquire(0x7000, 0x2000, f.reg()).unwrap();
        assert_ne!(o, a);
        assert_eq!(c.len(), 2);
        assert_eq!(c.get(o), Some(&FakeMr(0x7000, 0x2000)));
        assert_eq!(c.unpin(a), Ok(None));
        assert!(c.unpin(a).unwrap().is_some());
        assert!(c.release(o).is_some());
        assert!(c.is_empty());
    }

    #[test]
    fn registration_errors_leave_no_entry() {
        let mut c: RegCache<FakeMr> = RegCache::new();
        let e = c.acquire(0x1000, 10, |_, _| Err::<FakeMr, _>("EFAULT"));
        assert_eq!(e, Err("EFAULT"));
        assert!(c.is_empty());
    }
}
