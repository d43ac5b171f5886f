//! [`RequestQueue`]: the FIFO of posted requests a transport comm keeps.
//!
//! Transports complete requests in posting order on the wire, but a caller
//! may test (and so report) them in any order. The queue hands out
//! increasing request ids, finds a live request by id, and keeps reported
//! requests at the front until every older one has been reported too; then
//! it pops them and says how many went, so the comm can move its own
//! counters of front entries (bytes written, requests done, ...) down.
//!
//! The storage is a `VecDeque` allocated once with room for the capacity,
//! so nothing allocates per message.

use crate::Request;
use std::collections::VecDeque;
use std::ops::{Index, IndexMut, RangeBounds};

struct Slot<T> {
    id: u64,
    reported: bool,
    op: T,
}

/// A bounded FIFO of posted requests with increasing ids (the first is 1).
///
/// Indices count from the front (the oldest request still queued); they
/// shift down when [`report`](RequestQueue::report) pops entries, and only
/// then.
pub struct RequestQueue<T> {
    q: VecDeque<Slot<T>>,
    next_id: u64,
    cap: usize,
}

impl<T> RequestQueue<T> {
    /// An empty queue holding at most `cap` requests.
    pub fn with_capacity(cap: usize) -> Self {
        RequestQueue {
            q: VecDeque::with_capacity(cap),
            next_id: 1,
            cap,
        }
    }

    /// Whether the queue holds `cap` requests (posting must wait).
    pub fn is_full(&self) -> bool {
        self.q.len() >= self.cap
    }

    /// Number of queued requests (reported ones not yet popped included).
    pub fn len(&self) -> usize {
        self.q.len()
    }

    /// Whether no request is queued.
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// The id the next [`push`](RequestQueue::push) will assign.
    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    /// Queues `op` at the back under the next id and returns its request.
    /// Does not check [`is_full`](RequestQueue::is_full).
    pub fn push(&mut self, op: T) -> Request {
        let id = self.next_id;
        self.next_id += 1;
        self.q.push_back(Slot {
            id,
            reported: false,
            op,
        });
        Request(id)
    }

    /// The index of the queued request `id`, reported or not.
    pub fn position(&self, id: u64) -> Option<usize> {
        self.q.binary_search_by_key(&id, |s| s.id).ok()
    }

    /// The index of `req` if it is queued and not yet reported; `None` if it
    /// was never posted here or was already reported complete.
    pub fn live(&self, req: Request) -> Option<usize> {
        self.position(req.0).filter(|&i| !self.q[i].reported)
    }

    /// The id of the request at `idx`.
    ///
    /// # Panics
    /// If `idx >= len()`.
    pub fn id_at(&self, idx: usize) -> u64 {
        self.q[idx].id
    }

    /// Marks the request at `idx` reported, then pops the reported requests
    /// at the front. Returns how many were popped (0 if an older request is
    /// still unreported); indices of the remaining requests drop by that.
    ///
    /// # Panics
    /// If `idx >= len()`.
    pub fn report(&mut self, idx: usize) -> usize {
        self.q[idx].reported = true;
        let mut n = 0;
        while self.q.front().is_some_and(|s| s.reported) {
            self.q.pop_front();
            n += 1;
        }
        n
    }

    /// The request at `idx`, if any.
    pub fn get(&self, idx: usize) -> Option<&T> {
        self.q.get(idx).map(|s| &s.op)
    }

    /// The request at `idx`, mutably, if any.
    pub fn get_mut(&mut self, idx: usize) -> Option<&mut T> {
        self.q.get_mut(idx).map(|s| &mut s.op)
    }

    /// The oldest queued request.
    pub fn front(&self) -> Option<&T> {
        self.get(0)
    }

    /// The newest queued request.
    pub fn back(&self) -> Option<&T> {
        self.q.back().map(|s| &s.op)
    }

    /// The queued requests, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        self.q.iter().map(|s| &s.op)
    }

    /// The requests in `range` (indices), oldest first.
    ///
    /// # Panics
    /// If the range is out of bounds.
    pub fn range<R: RangeBounds<usize>>(&self, range: R) -> impl Iterator<Item = &T> + '_ {
        self.q.range(range).map(|s| &s.op)
    }
}

impl<T> Index<usize> for RequestQueue<T> {
    type Output = T;

    fn index(&self, idx: usize) -> &T {
        &self.q[idx].op
    }
}

impl<T> IndexMut<usize> for RequestQueue<T> {
    fn index_mut(&mut self, idx: usize) -> &mut T {
        &mut self.q[idx].op
    }
}

impl<T> std::fmt::Debug for RequestQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestQueue")
            .field("len", &self.q.len())
            .field("cap", &self.cap)
            .field("next_id", &self.next_id)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_increase_from_one() {
        let mut q = RequestQueue::with_capacity(4);
        assert!(q.is_empty());
        assert_eq!(q.next_id(), 1);
        assert_eq!(q.push('a'), Request(1));
        assert_eq!(q.next_id(), 2);
        assert_eq!(q.push('b'), Request(2));
        assert_eq!(q.len(), 2);
        assert!(!q.is_empty());
        assert_eq!(q.id_at(0), 1);
        assert_eq!(q.id_at(1), 2);
        // Ids keep increasing across pops.
        assert_eq!(q.report(0), 1);
        assert_eq!(q.push('c'), Request(3));
        assert_eq!(q.id_at(1), 3);
    }

    #[test]
    fn capacity() {
        let mut q = RequestQueue::with_capacity(2);
        assert!(!q.is_full());
        q.push(0);
        assert!(!q.is_full());
        q.push(1);
        assert!(q.is_full());
        assert_eq!(q.report(0), 1);
        assert!(!q.is_full());

        let z: RequestQueue<()> = RequestQueue::with_capacity(0);
        assert!(z.is_full());
    }

    #[test]
    fn live_rejects_unknown_and_reported() {
        let mut q = RequestQueue::with_capacity(4);
        let a = q.push("a");
        let b = q.push("b");
        let c = q.push("c");
        assert_eq!(q.live(Request(0)), None);
        assert_eq!(q.live(Request(4)), None);
        assert_eq!(q.live(a), Some(0));
        assert_eq!(q.live(b), Some(1));
        assert_eq!(q.live(c), Some(2));

        // Reporting out of order: b stays queued but is no longer live.
        assert_eq!(q.report(1), 0);
        assert_eq!(q.len(), 3);
        assert_eq!(q.live(b), None);
        assert_eq!(q.position(b.0), Some(1));

        // Reporting a pops a and b.
        assert_eq!(q.report(0), 2);
        assert_eq!(q.len(), 1);
        assert_eq!(q.live(a), None);
        assert_eq!(q.position(a.0), None);
        assert_eq!(q.position(b.0), None);
        assert_eq!(q.live(c), Some(0));
        assert_eq!(q.report(0), 1);
        assert!(q.is_empty());
        assert_eq!(q.live(c), None);
    }

    #[test]
    fn access() {
        let mut q = RequestQueue::with_capacity(8);
        assert_eq!(q.front(), None);
        assert_eq!(q.back(), None);
        assert_eq!(q.get(0), None);
        for i in 0..5 {
            q.push(i * 10);
        }
        assert_eq!(q[0], 0);
        assert_eq!(q[4], 40);
        q[2] += 1;
        *q.get_mut(3).unwrap() += 2;
        assert_eq!(q.get(2), Some(&21));
        assert_eq!(q.get(5), None);
        assert_eq!(q.get_mut(5), None);
        assert_eq!(q.front(), Some(&0));
        assert_eq!(q.back(), Some(&40));
        assert_eq!(q.iter().copied().collect::<Vec<_>>(), [0, 10, 21, 32, 40]);
        assert_eq!(q.range(3..).copied().collect::<Vec<_>>(), [32, 40]);
        assert_eq!(q.range(1..3).copied().collect::<Vec<_>>(), [10, 21]);
        assert_eq!(q.report(0), 1);
        assert_eq!(q[0], 10);
        assert_eq!(q.front(), Some(&10));
    }

    #[test]
    #[should_panic]
    fn report_out_of_range_panics() {
        let mut q: RequestQueue<u8> = RequestQueue::with_capacity(1);
        q.report(0);
    }
}
