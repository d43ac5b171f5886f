//! A deterministic in-memory transport for tests: ranks are threads (or
//! engines driven by one thread) of one process. `isend` copies the message
//! into the link's queue and completes at once; `irecv` completes when a
//! message is queued. Nothing here waits, so a test that drives engines by
//! hand is fully deterministic. [`MemNet::with_eager`] adds the eager
//! (tiny-message) path, so that the engine's use of it is tested at many
//! ranks too.

use super::{
    Connector, Listener, MemHandle, Net, NetError, NetResult, Properties, PtrSupport, RecvComm,
    Request, SendComm,
};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

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
            posted: VecDeque::new(),
            done: HashMap::new(),
            next: 0,
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
            eager_max: self.eager_max,
        })))
    }
}

struct MemSend {
    link: Shared,
    eager_max: usize,
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
        let bytes = if len == 0 {
            Vec::new()
        } else {
            // SAFETY: the caller guarantees `data..data+len` is readable for
            // the duration of the request; we copy it now.
            unsafe { std::slice::from_raw_parts(data, len) }.to_vec()
        };
        lock(&self.link).queue.push_back((tag, bytes));
        Ok(Some(Request(0)))
    }

    fn test(&mut self, _req: Request) -> NetResult<bool> {
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
        // the call.
        unsafe { self.isend(data, len, tag, None) }.map(|r| r.is_some())
    }
}

struct Posted {
    id: u64,
    data: *mut u8,
    len: usize,
    tag: u32,
}

// SAFETY: the raw pointer is only dereferenced by the thread owning the comm,
// under the `irecv` contract that keeps the buffer valid until completion.
unsafe impl Send for Posted {}

struct MemRecv {
    link: Shared,
    posted: VecDeque<Posted>,
    done: HashMap<u64, usize>,
    next: u64,
    eager_max: usize,
}

impl MemRecv {
    fn progress(&mut self) -> NetResult<()> {
        let mut link = lock(&self.link);
        while let Some(p) = self.posted.front() {
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
            self.done.insert(p.id, msg.len());
            self.posted.pop_front();
        }
        Ok(())
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
        let id = self.next;
        self.next += 1;
        self.posted.push_back(Posted { id, data, len, tag });
        Ok(Some(Request(id)))
    }

    fn test(&mut self, req: Request) -> NetResult<Option<usize>> {
        if let Some(n) = self.done.remove(&req.0) {
            return Ok(Some(n));
        }
        self.progress()?;
        Ok(self.done.remove(&req.0))
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
        if len > self.eager_max || !self.posted.is_empty() || !self.done.is_empty() {
            return Err(NetError::Other(format!(
                "eager receive of {len} bytes with {} receives posted",
                self.posted.len() + self.done.len()
            )));
        }
        // SAFETY: the caller guarantees `data..data+len` is writable for
        // the call; the request is completed (or failed) right here.
        let req = unsafe { self.irecv(data, len, tag, None) }?.expect("always room");
        match self.test(req) {
            Ok(Some(n)) => Ok(Some(n)),
            other => {
                // Not arrived (or failed): nothing stays posted.
                self.posted.clear();
                other
            }
        }
    }
}
