//! The data path: [`TcpSendComm`] and [`TcpRecvComm`].
//!
//! # Wire format
//! After the greeting, each message is a 12-byte header — tag (`u32`,
//! little-endian) then payload length (`u64`, little-endian) — followed by
//! the payload.
//!
//! # Progress
//! Both comms keep a FIFO of posted requests in a `VecDeque` that is reused
//! (no allocation per message once it has grown). Requests complete in
//! posting order, so the completed ones are always a prefix of the queue;
//! they stay there (flagged when reported) until every older request has
//! been reported, then are popped. Every `test` first makes as much progress
//! as the socket allows without blocking, then answers.
//!
//! Sends gather the headers and payloads of several queued messages into
//! one `sendmsg`. Receives read a header into a 12-byte staging buffer,
//! check tag and size, then read the payload straight into the posted
//! buffer; each payload read also offers the staging buffer for the next
//! header, so a stream of small messages costs one `recvmsg` each.
//!
//! After a connection error, a tag mismatch or a truncation the stream can
//! no longer be trusted: the comm remembers the fault and reports it from
//! every later call that would need the connection.

use crate::sys;
use nccl_net::{MemHandle, NetError, NetResult, RecvComm, Request, SendComm};
use std::collections::VecDeque;
use std::io;
use std::os::fd::OwnedFd;

/// Message header size: tag `u32` + length `u64`.
pub(crate) const HDR: usize = 12;
/// Most iovecs handed to one `sendmsg`.
const MAX_IOV: usize = 32;
/// Stop gathering more messages into one `sendmsg` beyond this many bytes.
const GATHER_BYTES: usize = 256 << 10;

/// A remembered failure; rebuilt into a [`NetError`] on every report.
#[derive(Clone, Debug)]
enum Fault {
    Closed,
    Io { call: &'static str, errno: i32 },
    Tag { expected: u32, got: u32 },
    Truncated { posted: usize, got: usize },
}

impl Fault {
    fn from_io(call: &'static str, e: &io::Error) -> Fault {
        if sys::is_disconnect(e) {
            Fault::Closed
        } else {
            Fault::Io {
                call,
                errno: e.raw_os_error().unwrap_or(libc::EIO),
            }
        }
    }

    fn to_error(&self, peer: &str) -> NetError {
        match *self {
            Fault::Closed => NetError::Closed(peer.to_owned()),
            Fault::Io { call, errno } => NetError::io(call, io::Error::from_raw_os_error(errno)),
            Fault::Tag { expected, got } => NetError::TagMismatch { expected, got },
            Fault::Truncated { posted, got } => NetError::Truncated { posted, got },
        }
    }
}

fn unknown_request(req: Request) -> NetError {
    NetError::Other(format!(
        "unknown request {} (never posted on this comm, or already reported complete)",
        req.0
    ))
}

fn empty_iov() -> libc::iovec {
    libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }
}

struct SendOp {
    id: u64,
    data: *const u8,
    len: usize,
    hdr: [u8; HDR],
    /// Bytes of header + payload written so far.
    off: usize,
    reported: bool,
}

impl SendOp {
    fn total(&self) -> usize {
        HDR + self.len
    }
}

/// The sending half of a TCP connection.
pub(crate) struct TcpSendComm {
    fd: OwnedFd,
    peer: String,
    q: VecDeque<SendOp>,
    /// Number of completed requests at the front of `q`.
    ndone: usize,
    next_id: u64,
    max_requests: usize,
    fault: Option<Fault>,
}

// SAFETY: the raw pointers in the queue are only handed to the kernel; the
// `isend` contract keeps their memory valid until the request completes or
// the comm is dropped, whichever thread the comm moves to.
unsafe impl Send for TcpSendComm {}

impl TcpSendComm {
    pub(crate) fn new(fd: OwnedFd, peer: String, max_requests: usize) -> Self {
        TcpSendComm {
            fd,
            peer,
            q: VecDeque::with_capacity(max_requests),
            ndone: 0,
            next_id: 1,
            max_requests,
            fault: None,
        }
    }

    /// Writes as much of the queue as the socket takes.
    fn progress(&mut self) {
        if self.fault.is_some() {
            return;
        }
        while self.ndone < self.q.len() {
            let mut iov = [empty_iov(); MAX_IOV];
            let mut n_iov = 0;
            let mut want = 0usize;
            for op in self.q.range(self.ndone..) {
                if n_iov + 2 > MAX_IOV || want >= GATHER_BYTES {
                    break;
                }
                if op.off < HDR {
                    iov[n_iov] = libc::iovec {
                        iov_base: op.hdr[op.off..].as_ptr() as *mut libc::c_void,
                        iov_len: HDR - op.off,
                    };
                    n_iov += 1;
                    want += HDR - op.off;
                }
                let done = op.off.saturating_sub(HDR);
                if op.len > done {
                    iov[n_iov] = libc::iovec {
                        // Stays inside the caller's buffer: done < len.
                        iov_base: op.data.wrapping_add(done) as *mut libc::c_void,
                        iov_len: op.len - done,
                    };
                    n_iov += 1;
                    want += op.len - done;
                }
            }
            // SAFETY: each iovec points either into a header owned by the
            // queue (not touched until the call returns) or into a payload
            // the `isend` caller keeps valid for reads until completion.
            match unsafe { sys::send_iov(&self.fd, &iov[..n_iov]) } {
                Ok(mut n) => {
                    let short = n < want;
                    while n > 0 && self.ndone < self.q.len() {
                        let op = &mut self.q[self.ndone];
                        let k = (op.total() - op.off).min(n);
                        op.off += k;
                        n -= k;
                        if op.off == op.total() {
                            self.ndone += 1;
                        }
                    }
                    if short {
                        break; // the socket buffer is full
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    let f = Fault::from_io("sendmsg", &e);
                    tracing::warn!(peer = %self.peer, error = %e, "NET/Socket: send failed");
                    self.fault = Some(f);
                    break;
                }
            }
        }
    }

    fn pop_reported(&mut self) {
        while self.q.front().is_some_and(|op| op.reported) {
            self.q.pop_front();
            self.ndone -= 1;
        }
    }
}

impl SendComm for TcpSendComm {
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
        if let Some(f) = &self.fault {
            return Err(f.to_error(&self.peer));
        }
        if self.q.len() >= self.max_requests {
            return Ok(None);
        }
        if len > crate::MAX_MESSAGE_BYTES {
            return Err(NetError::Other(format!(
                "send of {len} bytes exceeds the {} byte limit",
                crate::MAX_MESSAGE_BYTES
            )));
        }
        let mut hdr = [0u8; HDR];
        hdr[0..4].copy_from_slice(&tag.to_le_bytes());
        hdr[4..12].copy_from_slice(&(len as u64).to_le_bytes());
        let id = self.next_id;
        self.next_id += 1;
        self.q.push_back(SendOp {
            id,
            data,
            len,
            hdr,
            off: 0,
            reported: false,
        });
        self.progress();
        Ok(Some(Request(id)))
    }

    fn test(&mut self, req: Request) -> NetResult<bool> {
        let idx = match self.q.binary_search_by_key(&req.0, |op| op.id) {
            Ok(i) if !self.q[i].reported => i,
            _ => return Err(unknown_request(req)),
        };
        self.progress();
        if idx < self.ndone {
            self.q[idx].reported = true;
            self.pop_reported();
            Ok(true)
        } else if let Some(f) = &self.fault {
            Err(f.to_error(&self.peer))
        } else {
            Ok(false)
        }
    }
}

struct RecvOp {
    id: u64,
    data: *mut u8,
    cap: usize,
    tag: u32,
    /// Message length, once its header has been read.
    len: Option<usize>,
    /// Payload bytes received so far.
    got: usize,
    reported: bool,
}

/// The receiving half of a TCP connection.
pub(crate) struct TcpRecvComm {
    fd: OwnedFd,
    peer: String,
    q: VecDeque<RecvOp>,
    /// Number of completed requests at the front of `q`.
    ndone: usize,
    next_id: u64,
    max_requests: usize,
    fault: Option<Fault>,
    /// Header bytes of the next message read so far.
    stage: [u8; HDR],
    staged: usize,
}

// SAFETY: as for TcpSendComm: the raw pointers are only handed to the
// kernel, and the `irecv` contract keeps them valid until completion.
unsafe impl Send for TcpRecvComm {}

impl TcpRecvComm {
    pub(crate) fn new(fd: OwnedFd, peer: String, max_requests: usize) -> Self {
        TcpRecvComm {
            fd,
            peer,
            q: VecDeque::with_capacity(max_requests),
            ndone: 0,
            next_id: 1,
            max_requests,
            fault: None,
            stage: [0; HDR],
            staged: 0,
        }
    }

    /// Reads as much as the socket holds into the posted receives.
    fn progress(&mut self) {
        let TcpRecvComm {
            fd,
            peer,
            q,
            ndone,
            fault,
            stage,
            staged,
            ..
        } = self;
        if fault.is_some() {
            return;
        }
        let mut fail = |f: Fault| {
            if let Fault::Io { .. } | Fault::Closed = f {
                tracing::warn!(peer = %peer, fault = ?f, "NET/Socket: receive failed");
            }
            *fault = Some(f);
        };
        while *ndone < q.len() {
            let op = &mut q[*ndone];
            let len = match op.len {
                Some(len) => len,
                None if *staged == HDR => {
                    *staged = 0;
                    let tag = u32::from_le_bytes([stage[0], stage[1], stage[2], stage[3]]);
                    let mut l = [0u8; 8];
                    l.copy_from_slice(&stage[4..12]);
                    let len = u64::from_le_bytes(l);
                    if tag != op.tag {
                        fail(Fault::Tag {
                            expected: op.tag,
                            got: tag,
                        });
                        return;
                    }
                    match usize::try_from(len) {
                        Ok(len) if len <= op.cap => {
                            op.len = Some(len);
                            len
                        }
                        _ => {
                            fail(Fault::Truncated {
                                posted: op.cap,
                                got: usize::try_from(len).unwrap_or(usize::MAX),
                            });
                            return;
                        }
                    }
                }
                None => {
                    match sys::recv(fd, &mut stage[*staged..]) {
                        Ok(0) => return fail(Fault::Closed),
                        Ok(n) => {
                            *staged += n;
                            if *staged < HDR {
                                return; // drained the socket
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                        Err(e) => return fail(Fault::from_io("recv", &e)),
                    }
                    continue;
                }
            };
            if op.got == len {
                // Whole payload in (a 0-byte message completes on its header).
                *ndone += 1;
                continue;
            }
            let want = len - op.got;
            let iov = [
                libc::iovec {
                    // Stays inside the caller's buffer: got < len <= cap.
                    iov_base: op.data.wrapping_add(op.got).cast(),
                    iov_len: want,
                },
                // Read ahead the next header (nothing is staged here).
                libc::iovec {
                    iov_base: stage.as_mut_ptr().cast(),
                    iov_len: HDR,
                },
            ];
            // SAFETY: the first iovec lies within the buffer the `irecv`
            // caller keeps valid for writes and unaliased until completion;
            // the second is our own staging buffer, untouched during the call.
            match unsafe { sys::recv_iov(fd, &iov) } {
                Ok(0) => return fail(Fault::Closed),
                Ok(n) => {
                    let k = n.min(want);
                    op.got += k;
                    *staged = n - k;
                    if op.got == len {
                        *ndone += 1;
                    }
                    if n < want + HDR {
                        return; // drained the socket
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => return fail(Fault::from_io("recvmsg", &e)),
            }
        }
    }

    fn pop_reported(&mut self) {
        while self.q.front().is_some_and(|op| op.reported) {
            self.q.pop_front();
            self.ndone -= 1;
        }
    }
}

impl RecvComm for TcpRecvComm {
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
        if let Some(f) = &self.fault {
            return Err(f.to_error(&self.peer));
        }
        if self.q.len() >= self.max_requests {
            return Ok(None);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.q.push_back(RecvOp {
            id,
            data,
            cap: len,
            tag,
            len: None,
            got: 0,
            reported: false,
        });
        Ok(Some(Request(id)))
    }

    fn test(&mut self, req: Request) -> NetResult<Option<usize>> {
        let idx = match self.q.binary_search_by_key(&req.0, |op| op.id) {
            Ok(i) if !self.q[i].reported => i,
            _ => return Err(unknown_request(req)),
        };
        self.progress();
        if idx < self.ndone {
            let op = &mut self.q[idx];
            op.reported = true;
            let size = op.got;
            self.pop_reported();
            Ok(Some(size))
        } else if let Some(f) = &self.fault {
            Err(f.to_error(&self.peer))
        } else {
            Ok(None)
        }
    }
}
