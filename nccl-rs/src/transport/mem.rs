//! A deterministic in-memory transport for tests: ranks are threads (or
//! engines driven by one thread) of one process. `isend` copies the message
//! into the link's queue and completes at once; `irecv` completes when a
//! message is queued. Nothing here waits, so a test that drives engines by
//! hand is fully deterministic. Requests live in a [`RequestQueue`], so ids
//! and the error for a request never posted (or already reported) are those
//! of the real transports. [`MemNet::with_eager`] adds the eager
//! (tiny-message) path, so that the engine's use of it is tested at many
//! ranks too.

use super::{
    Connector, Listener, MemHandle, Net, NetError, NetResult, Properties, PtrSupport, RecvComm,
    Request, SendComm,
};
use nccl_net::RequestQueue;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Starting room of a comm's request queue. The in-memory transport never
/// refuses a request (`max_requests` is unbounded), so the queue grows past it.
const INITIAL_REQUESTS: usize = 16;

fn unknown_request(req: Request) -> NetError {
    NetError::Other(format!(
        "Mem: unknown request {} (never posted on this comm, or already reported complete)",
        req.0
    ))
}

#[derive(Default)]
struct Link {
    connected: bool,
    closed: bool,
    queue: VecDeque<(u32, Vec<u8>)>,
}

type Shared = Arc<Mutex<Link>>;

fn registry() -> &'static Mutex<HashMap<u64, Shared>> {
    static REG: OnceLock<Mutex<HashMap<u64, Shared>>> = OnceLock::new();
    REG.get_or_init(Default::default)
}

fn lock(l: &Shared) -> std::sync::MutexGuard<'_, Link> {
    l.lock().unwrap_or_else(|p| p.into_inner())
}

/// The in-memory transport.
#[derive(Debug, Default, Clone, Copy)]
pub struct MemNet {
    eager_max: usize,
}

impl MemNet {
    /// Without an eager path.
    pub const fn new() -> MemNet {
        MemNet { eager_max: 0 }
    }

    /// With an eager path for messages of up to `eager_max` bytes.
    pub const fn with_eager(eager_max: usize) -> MemNet {
        MemNet { eager_max }
    }
}

impl Net for MemNet {
    fn properties(&self) -> Properties {
        Properties {
            name: "Mem".into(),
            speed_mbps: 0,
            latency_us: 0.0,
            ptr_support: PtrSupport {
                host: true,
                ..Default::default()
            },
            needs_registration: false,
            max_message_bytes: usize::MAX,
            max_requests: usize::MAX,
        }
    }

    fn listen(&self) -> NetResult<Box<dyn Listener>> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let link: Shared = Default::default();
        registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, link.clone());
        Ok(Box::new(MemListener {
            handle: id.to_le_bytes(),
            link: Some(link),
            id,
            eager_max: self.eager_max,
        }))
    }

    fn connect(&self, handle: &[u8]) -> NetResult<Box<dyn Connector>> {
        let id = u64::from_le_bytes(
            handle
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| NetError::BadHandle("short".into()))?,
        );
        Ok(Box::new(MemConnector {
            id,
            eager_max: self.eager_max,
        }))
    }
}

struct MemListener {
    handle: [u8; 8],
    link: Option<Shared>,
    id: u64,
    eager_max: usize,
}

impl Listener for MemListener {
    fn handle(&self) -> &[u8] {
        &self.handle
    }

    fn accept(&mut self) -> NetResult<Option<Box<dyn RecvComm>>> {
        let Some(link) = &self.link else {
            return Err(NetError::Other("already accepted".into()));
        };
        if !lock(link).connected {
            return Ok(None);
        }
        registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
        let link = self.link.take().expect("checked above");
        Ok(Some(Box::new(MemRecv {
            link,
            posted: RequestQueue::with_capacity(INITIAL_REQUESTS),
            matched: 0,
            eager_max: self.eager_max,
        })))
    }
}

struct MemConnector {
    id: u64,
    eager_max: usize,
}

impl Connector for MemConnector {
    fn poll_connect(&mut self) -> NetResult<Option<Box<dyn SendComm>>> {
        let reg = registry().lock().unwrap_or_else(|p| p.into_inner());
        let link = reg
            .get(&self.id)
            .cloned()
            .ok_or_else(|| NetError::BadHandle(format!("no listener {}", self.id)))?;
        lock(&link).connected = true;
        Ok(Some(Box::new(MemSend {
            link,
            sent: RequestQueue::with_capacity(INITIAL_REQUESTS),
            eager_max: self.eager_max,
        })))
    }
}

struct MemSend {
    link: Shared,
    /// Sends not yet reported by `test` (all complete: `isend` copies).
    sent: RequestQueue<()>,
    eager_max: usize,
}

impl MemSend {
    /// Copies the message into the link's queue.
    ///
    /// # Safety
    /// `data..data+len` must be readable for the call.
    unsafe fn enqueue(&mut self, data: *const u8, len: usize, tag: u32) {
        let bytes = if len == 0 {
            Vec::new()
        } else {
            // SAFETY: the caller guarantees `data..data+len` is readable for
            // the call; we copy it now.
            unsafe { std::slice::from_raw_parts(data, len) }.to_vec()
        };
        lock(&self.link).queue.push_back((tag, bytes));
    }
}

impl Drop for MemSend {
    fn drop(&mut self) {
        lock(&self.link).closed = true;
    }
}

impl SendComm for MemSend {
    fn reg_mr(&mut self, _ptr: *const u8, _len: usize) -> NetResult<MemHandle> {
        Ok(MemHandle(0))
    }

    fn dereg_mr(&mut self, _mr: MemHandle) -> NetResult<()> {
        Ok(())
    }

    unsafe fn isend(
        &mut self,
        data: *const u8,
        len: usize,
        tag: u32,
        _mr: Option<MemHandle>,
    ) -> NetResult<Option<Request>> {
        // SAFETY: the caller guarantees `data..data+len` is readable until
        // the request completes, which is now.
        unsafe { self.enqueue(data, len, tag) };
        Ok(Some(self.sent.push(())))
    }

    fn test(&mut self, req: Request) -> NetResult<bool> {
        let idx = self.sent.live(req).ok_or_else(|| unknown_request(req))?;
        self.sent.report(idx);
        Ok(true)
    }

    fn eager_max(&self) -> usize {
        self.eager_max
    }

    unsafe fn send_eager(&mut self, data: *const u8, len: usize, tag: u32) -> NetResult<bool> {
        if len > self.eager_max {
            return Err(NetError::Other(format!("eager send of {len} bytes")));
        }
        // SAFETY: the caller guarantees `data..data+len` is readable for
        // the call. No request: an eager send is complete on return.
        unsafe { self.enqueue(data, len, tag) };
        Ok(true)
    }
}

struct Posted {
    data: *mut u8,
    len: usize,
    tag: u32,
    /// Bytes received, once a message matched this receive.
    got: Option<usize>,
}

// SAFETY: the raw pointer is only dereferenced by the thread owning the comm,
// under the `irecv` contract that keeps the buffer valid until completion.
unsafe impl Send for Posted {}

struct MemRecv {
    link: Shared,
    posted: RequestQueue<Posted>,
    /// How many receives at the front of `posted` hold a message: messages
    /// match receives in posting order.
    matched: usize,
    eager_max: usize,
}

impl MemRecv {
    fn progress(&mut self) -> NetResult<()> {
        let mut link = lock(&self.link);
        while let Some(p) = self.posted.get_mut(self.matched) {
            let Some((tag, msg)) = link.queue.pop_front() else {
                if link.closed {
                    return Err(NetError::Closed("in-memory peer".into()));
                }
                return Ok(());
            };
            if tag != p.tag {
                return Err(NetError::TagMismatch {
                    expected: p.tag,
                    got: tag,
                });
            }
            if msg.len() > p.len {
                return Err(NetError::Truncated {
                    posted: p.len,
                    got: msg.len(),
                });
            }
            if !msg.is_empty() {
                // SAFETY: `irecv`'s contract keeps `p.data..p.data+p.len` valid
                // and unaliased until completion; `msg.len() <= p.len`.
                unsafe { std::ptr::copy_nonoverlapping(msg.as_ptr(), p.data, msg.len()) };
            }
            p.got = Some(msg.len());
            self.matched += 1;
        }
        Ok(())
    }

    /// Reports the receive at `idx` (complete, or withdrawn by `recv_eager`).
    fn report(&mut self, idx: usize) {
        let popped = self.posted.report(idx);
        self.matched = self.matched.saturating_sub(popped);
    }

    /// The size received by `req`, reporting it, if it is complete.
    fn take(&mut self, req: Request) -> NetResult<Option<usize>> {
        let idx = self.posted.live(req).ok_or_else(|| unknown_request(req))?;
        let got = self.posted[idx].got;
        if got.is_some() {
            self.report(idx);
        }
        Ok(got)
    }
}

impl RecvComm for MemRecv {
    fn reg_mr(&mut self, _ptr: *mut u8, _len: usize) -> NetResult<MemHandle> {
        Ok(MemHandle(0))
    }

    fn dereg_mr(&mut self, _mr: MemHandle) -> NetResult<()> {
        Ok(())
    }

    unsafe fn irecv(
        &mut self,
        data: *mut u8,
        len: usize,
        tag: u32,
        _mr: Option<MemHandle>,
    ) -> NetResult<Option<Request>> {
        Ok(Some(self.posted.push(Posted {
            data,
            len,
            tag,
            got: None,
        })))
    }

    fn test(&mut self, req: Request) -> NetResult<Option<usize>> {
        if let Some(n) = self.take(req)? {
            return Ok(Some(n));
        }
        self.progress()?;
        self.take(req)
    }

    fn eager_max(&self) -> usize {
        self.eager_max
    }

    unsafe fn recv_eager(
        &mut self,
        data: *mut u8,
        len: usize,
        tag: u32,
    ) -> NetResult<Option<usize>> {
        if len > self.eager_max || !self.posted.is_empty() {
            return Err(NetError::Other(format!(
                "eager receive of {len} bytes with {} receives posted",
                self.posted.len()
            )));
        }
        // SAFETY: the caller guarantees `data..data+len` is writable for
        // the call; the request is completed (or failed) right here.
        let req = unsafe { self.irecv(data, len, tag, None) }?.expect("always room");
        match self.test(req) {
            Ok(Some(n)) => Ok(Some(n)),
            other => {
                // Not arrived (or failed): nothing stays posted.
                if let Some(idx) = self.posted.live(req) {
                    self.report(idx);
                }
                other
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(eager_max: usize) -> (Box<dyn SendComm>, Box<dyn RecvComm>) {
        let net = MemNet::with_eager(eager_max);
        let mut l = net.listen().unwrap();
        let mut c = net.connect(l.handle()).unwrap();
        let s = c.poll_connect().unwrap().unwrap();
        let r = l.accept().unwrap().unwrap();
        (s, r)
    }

    fn is_unknown<T: std::fmt::Debug>(r: NetResult<T>) -> bool {
        matches!(r, Err(NetError::Other(m)) if m.contains("unknown request"))
    }

    #[test]
    fn requests_are_numbered_from_one_and_reported_once() {
        let (mut s, mut r) = pair(0);
        let msgs = [[1u8; 4], [2; 4], [3; 4]];
        let mut bufs = [[0u8; 4]; 3];
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        for (m, b) in msgs.iter().zip(bufs.iter_mut()) {
            // SAFETY: `m` outlives the request, tested below.
            sends.push(unsafe { s.isend(m.as_ptr(), 4, 7, None) }.unwrap().unwrap());
            // SAFETY: `b` outlives the request and is not touched until then.
            recvs.push(
                unsafe { r.irecv(b.as_mut_ptr(), 4, 7, None) }
                    .unwrap()
                    .unwrap(),
            );
        }
        assert_eq!(sends, [Request(1), Request(2), Request(3)]);
        assert_eq!(recvs, [Request(1), Request(2), Request(3)]);
        // Out of order: the last first.
        assert_eq!(r.test(recvs[2]).unwrap(), Some(4));
        assert_eq!(r.test(recvs[0]).unwrap(), Some(4));
        assert_eq!(r.test(recvs[1]).unwrap(), Some(4));
        for req in [sends[1], sends[0], sends[2]] {
            assert!(s.test(req).unwrap());
        }
        assert_eq!(bufs, msgs);
        for req in recvs.iter().copied().chain([Request(0), Request(9)]) {
            assert!(is_unknown(r.test(req)), "receive {req:?}");
        }
        for req in sends.iter().copied().chain([Request(0), Request(9)]) {
            assert!(is_unknown(s.test(req)), "send {req:?}");
        }
    }

    #[test]
    fn a_receive_completes_only_when_its_message_arrives() {
        let (mut s, mut r) = pair(0);
        let mut b = [0u8; 8];
        // SAFETY: `b` outlives the request.
        let req = unsafe { r.irecv(b.as_mut_ptr(), 8, 1, None) }
            .unwrap()
            .unwrap();
        assert_eq!(r.test(req).unwrap(), None);
        let m = *b"abc";
        // SAFETY: `m` outlives the call (the send copies).
        let sreq = unsafe { s.isend(m.as_ptr(), 3, 1, None) }.unwrap().unwrap();
        assert_eq!(r.test(req).unwrap(), Some(3));
        assert_eq!(&b[..3], b"abc");
        assert!(s.test(sreq).unwrap());
    }

    fn recv_eager(r: &mut Box<dyn RecvComm>, b: &mut [u8]) -> NetResult<Option<usize>> {
        // SAFETY: `b` is writable for the call.
        unsafe { r.recv_eager(b.as_mut_ptr(), b.len(), 5) }
    }

    #[test]
    fn eager_paths_leave_no_request_behind() {
        let (mut s, mut r) = pair(16);
        let mut b = [0u8; 16];
        assert_eq!(recv_eager(&mut r, &mut b).unwrap(), None);
        let m = [9u8; 5];
        // SAFETY: `m` is readable for the call.
        assert!(unsafe { s.send_eager(m.as_ptr(), 5, 5) }.unwrap());
        assert_eq!(recv_eager(&mut r, &mut b).unwrap(), Some(5));
        assert_eq!(b[..5], m);
        // Neither side holds a request: a posted receive gets the next id,
        // and an eager receive is allowed again once it is reported.
        // SAFETY: as above.
        assert!(unsafe { s.send_eager(m.as_ptr(), 5, 5) }.unwrap());
        // SAFETY: `b` outlives the request.
        let req = unsafe { r.irecv(b.as_mut_ptr(), 16, 5, None) }
            .unwrap()
            .unwrap();
        assert_eq!(req, Request(3));
        assert!(recv_eager(&mut r, &mut b).is_err());
        assert_eq!(r.test(req).unwrap(), Some(5));
        assert_eq!(recv_eager(&mut r, &mut b).unwrap(), None);
        // SAFETY: `m` outlives the request (the send copies).
        let sreq = unsafe { s.isend(m.as_ptr(), 5, 5, None) }.unwrap().unwrap();
        assert_eq!(sreq, Request(1));
    }

    #[test]
    fn mismatches_fail() {
        let (mut s, mut r) = pair(0);
        let m = [0u8; 8];
        let mut b = [0u8; 4];
        // SAFETY: `m` outlives the request (the send copies).
        unsafe { s.isend(m.as_ptr(), 4, 2, None) }.unwrap();
        // SAFETY: `b` outlives the request.
        let req = unsafe { r.irecv(b.as_mut_ptr(), 4, 1, None) }
            .unwrap()
            .unwrap();
        assert!(matches!(
            r.test(req),
            Err(NetError::TagMismatch {
                expected: 1,
                got: 2
            })
        ));
        let (mut s, mut r) = pair(0);
        // SAFETY: as above.
        unsafe { s.isend(m.as_ptr(), 8, 1, None) }.unwrap();
        // SAFETY: as above.
        let req = unsafe { r.irecv(b.as_mut_ptr(), 4, 1, None) }
            .unwrap()
            .unwrap();
        assert!(matches!(
            r.test(req),
            Err(NetError::Truncated { posted: 4, got: 8 })
        ));
    }
}
