//! [`TcpSendComm`]: the sending half of a connection.

use super::{empty_iov, unknown_request, Fault};
use crate::lanes::{Chunk, Dir, Lanes};
use crate::stripe::Striper;
use crate::sys;
use crate::wire::{self, Header, ACK, HDR, ZEROS};
use nccl_net::profile::{RequestEvents, SOCKET_SEND};
use nccl_net::{
    CopyHint, MemHandle, NetError, NetProfile, NetResult, Request, RequestQueue, SendComm,
};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// Most iovecs handed to one `sendmsg`.
const MAX_IOV: usize = 32;
/// Stop gathering more messages into one `sendmsg` beyond this many bytes.
const GATHER_BYTES: usize = 256 << 10;

struct SendOp {
    hdr: [u8; HDR],
    /// The payload bytes that follow the header on socket 0.
    data0: *const u8,
    len0: usize,
    /// Padding before and after them (see [`wire::pads`]).
    head: usize,
    tail: usize,
    /// Bytes of the socket-0 unit written so far.
    off: usize,
    /// Pieces on other sockets not yet written.
    pieces_left: usize,
    /// Sequence number of the message on the connection.
    seq: u64,
    /// Spliced, and the receiver's acknowledgement is not in yet.
    await_ack: bool,
    /// Its profiler events, if it was posted with a profile.
    prof: Option<Box<RequestEvents>>,
}

impl SendOp {
    fn total0(&self) -> usize {
        HDR + self.head + self.len0 + self.tail
    }

    /// The socket-0 unit: header, head pad, payload, tail pad.
    fn segments(&self) -> [(*mut u8, usize); 4] {
        let pad = ZEROS.as_ptr().cast_mut();
        [
            (self.hdr.as_ptr().cast_mut(), HDR),
            (pad, self.head),
            (self.data0.cast_mut(), self.len0),
            (pad, self.tail),
        ]
    }

    fn done(&self) -> bool {
        self.off == self.total0() && self.pieces_left == 0 && !self.await_ack
    }
}

/// The sizes of striped messages that are spliced (see [`crate::lanes`]):
/// `min..=max` bytes; `min` 0: none.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SpliceSizes {
    pub(crate) min: usize,
    pub(crate) max: usize,
}

impl SpliceSizes {
    /// Whether a message of `len` bytes is of these sizes.
    pub(crate) fn takes(self, len: usize) -> bool {
        self.min != 0 && (self.min..=self.max).contains(&len)
    }
}

/// The sending half of a TCP connection.
pub(crate) struct TcpSendComm {
    fd: OwnedFd,
    /// Its link counters, for observers (see [`crate::probe`]).
    probe: std::sync::Arc<crate::probe::TcpProbe>,
    peer: String,
    q: RequestQueue<SendOp>,
    /// Number of requests at the front of `q` whose socket-0 part is written.
    head0: usize,
    fault: Option<Fault>,
    striper: Striper,
    lanes: Lanes,
    /// Striped messages of these sizes are spliced (see [`crate::lanes`]).
    splice: SpliceSizes,
    /// The caller's thread also receives during the current call (see
    /// [`CopyHint::receives`]): then nothing is spliced.
    receives: bool,
    /// Whether the lanes can splice; `None` until a message first could.
    can_splice: Option<bool>,
    /// Messages posted so far (the next one's sequence number).
    posted: u64,
    /// Spliced messages awaiting their acknowledgement.
    awaiting: usize,
    /// The acknowledgement being read, and its bytes in so far.
    ack: [u8; ACK],
    ack_got: usize,
    /// Socket `j`'s descriptor at index `j` (for profiler events).
    fds: Vec<RawFd>,
    /// The profile of the next request posted.
    next_prof: Option<NetProfile>,
}

// SAFETY: the raw pointers in the queue are only handed to the kernel; the
// `isend` contract keeps their memory valid until the request completes or
// the comm is dropped, whichever thread the comm moves to.
unsafe impl Send for TcpSendComm {}

impl TcpSendComm {
    /// A comm over `socks` (socket 0 first); sockets 1.. are serviced by
    /// `nthreads` helper threads if `nthreads >= 2`. Striped messages of
    /// `splice` sizes are spliced.
    pub(crate) fn new(
        mut socks: Vec<OwnedFd>,
        peer: String,
        max_requests: usize,
        nthreads: usize,
        splice: SpliceSizes,
    ) -> io::Result<Self> {
        let ndata = crate::stripe::data_sockets(socks.len());
        let probe = std::sync::Arc::new(crate::probe::TcpProbe::new(&socks));
        let fds = socks.iter().map(AsRawFd::as_raw_fd).collect();
        let others = socks.split_off(1);
        let fd = socks.pop().ok_or(io::ErrorKind::InvalidInput)?;
        Ok(TcpSendComm {
            fd,
            probe,
            peer,
            q: RequestQueue::with_capacity(max_requests),
            head0: 0,
            fault: None,
            striper: Striper::new(ndata),
            lanes: Lanes::new(Dir::Send, others, nthreads)?,
            splice,
            receives: false,
            can_splice: None,
            posted: 0,
            awaiting: 0,
            ack: [0; ACK],
            ack_got: 0,
            fds,
            next_prof: None,
        })
    }

    /// Whether a message of `len` bytes goes spliced: of `splice` sizes,
    /// striped, and this thread receives nothing meanwhile. A spliced
    /// message leaves the only copy to the receiver; that pays when the
    /// sender would otherwise spend its core copying into the socket and
    /// nothing else (up to [`crate::default_splice_max_bytes`]), but not
    /// when each side also receives: the send copy goes, but the receive
    /// copy grows by more, since it now reads the sender's pages rather
    /// than socket buffers the sender has just written, and pinning the
    /// pages for `vmsplice` costs too. The same holds for a sender that
    /// only sends once its buffer outgrows the caches.
    fn splices(&mut self, len: usize) -> bool {
        if !self.splice.takes(len) || self.receives || !self.striper.stripes(len) {
            return false;
        }
        let lanes = &mut self.lanes;
        *self.can_splice.get_or_insert_with(|| lanes.enable_splice())
    }

    /// Reads the acknowledgements of spliced messages that socket 0 holds.
    fn read_acks(&mut self) -> Result<(), Fault> {
        while self.awaiting > 0 {
            match sys::recv(&self.fd, &mut self.ack[self.ack_got..]) {
                Ok(0) => return Err(Fault::Closed),
                Ok(n) => self.ack_got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(Fault::from_io("recv", &e)),
            }
            if self.ack_got < ACK {
                continue;
            }
            self.ack_got = 0;
            let seq = u64::from_le_bytes(self.ack);
            let q = &mut self.q;
            let i = (0..q.len())
                .find(|&i| q[i].seq == seq && q[i].await_ack)
                .ok_or_else(|| {
                    Fault::Protocol(format!(
                        "acknowledgement of message {seq}, which awaits none"
                    ))
                })?;
            q[i].await_ack = false;
            self.awaiting -= 1;
        }
        Ok(())
    }

    fn progress(&mut self) {
        if self.fault.is_none() {
            self.progress0();
        }
        if self.fault.is_none() {
            let q = &mut self.q;
            let r = self.lanes.progress(|id| {
                if let Some(i) = q.position(id) {
                    q[i].pieces_left -= 1;
                }
            });
            if let Err(f) = r {
                tracing::warn!(peer = %self.peer, fault = ?f, "NET/Socket: send failed");
                self.fault = Some(f);
            }
        }
        if self.fault.is_none() {
            if let Err(f) = self.read_acks() {
                tracing::warn!(peer = %self.peer, fault = ?f, "NET/Socket: send failed");
                self.fault = Some(f);
            }
        }
    }

    /// Writes as much of the socket-0 stream as the socket takes.
    fn progress0(&mut self) {
        while self.head0 < self.q.len() {
            let mut iov = [empty_iov(); MAX_IOV];
            let mut n_iov = 0;
            let mut want = 0usize;
            for op in self.q.range(self.head0..) {
                if n_iov + 4 > MAX_IOV || want >= GATHER_BYTES {
                    break;
                }
                want += wire::iov_from(&op.segments(), op.off, &mut iov, &mut n_iov);
            }
            // SAFETY: each iovec points into a header owned by the queue
            // (not touched until the call returns), into the static pad
            // bytes, or into a payload the `isend` caller keeps valid for
            // reads until completion; sendmsg only reads through them.
            match unsafe { sys::send_iov(&self.fd, &iov[..n_iov]) } {
                Ok(mut n) => {
                    let short = n < want;
                    while n > 0 && self.head0 < self.q.len() {
                        let op = &mut self.q[self.head0];
                        let k = (op.total0() - op.off).min(n);
                        op.off += k;
                        n -= k;
                        if op.off == op.total0() {
                            self.head0 += 1;
                        }
                    }
                    if short {
                        break; // the socket buffer is full
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::warn!(peer = %self.peer, error = %e, "NET/Socket: send failed");
                    self.fault = Some(Fault::from_io("sendmsg", &e));
                    break;
                }
            }
        }
    }
}

impl Drop for TcpSendComm {
    /// The probe forgets the sockets before they close.
    fn drop(&mut self) {
        self.probe.close();
    }
}

impl SendComm for TcpSendComm {
    fn link_probe(&self) -> Option<nccl_net::SharedProbe> {
        Some(self.probe.clone())
    }

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
        if self.q.is_full() {
            return Ok(None);
        }
        if len > crate::MAX_MESSAGE_BYTES {
            return Err(NetError::Other(format!(
                "send of {len} bytes exceeds the {} byte limit",
                crate::MAX_MESSAGE_BYTES
            )));
        }
        let mut header = Header::new(tag, len, data);
        header.spliced = self.splices(len);
        let id = self.q.next_id();
        let mut pieces_left = 0;
        let lanes = &mut self.lanes;
        let mut prof = self.next_prof.take().map(RequestEvents::new);
        let fds = &self.fds;
        let striped = self.striper.layout(len, |p| {
            // Stays inside the caller's buffer: p.off < len.
            let ptr = data.wrapping_add(p.off).cast_mut();
            pieces_left += 1;
            if let Some(pr) = prof.as_mut() {
                pr.socket(fds[p.sock], SOCKET_SEND, p.len);
            }
            lanes.push(
                p.sock,
                if header.spliced {
                    Chunk::spliced(id, ptr, p.len)
                } else {
                    // Piece offsets are multiples of 4 KiB: each piece sits
                    // in its cache line as the message does.
                    Chunk::new(id, ptr, p.len, header.piece_pads(p.len))
                },
            );
        });
        // Inline: the whole payload after the header; striped: nothing.
        let (data0, len0) = if striped { (data, 0) } else { (data, len) };
        if let (Some(pr), false) = (prof.as_mut(), striped) {
            pr.socket(self.fds[0], SOCKET_SEND, len0);
        }
        let (head, tail) = wire::pads(HDR, len0, header.align);
        let op = SendOp {
            hdr: header.encode(),
            data0,
            len0,
            head,
            tail,
            off: 0,
            pieces_left,
            seq: self.posted,
            await_ack: header.spliced,
            prof,
        };
        self.posted += 1;
        self.awaiting += usize::from(header.spliced);
        let req = self.q.push(op);
        debug_assert_eq!(req, Request(id));
        self.progress();
        Ok(Some(req))
    }

    fn hint_copy(&mut self, hint: CopyHint) {
        self.receives = hint.receives;
    }

    fn profile(&mut self, p: Option<NetProfile>) {
        self.next_prof = p;
    }

    fn test(&mut self, req: Request) -> NetResult<bool> {
        let idx = self.q.live(req).ok_or_else(|| unknown_request(req))?;
        // `progress` pops nothing, so `idx` stays valid.
        self.progress();
        if self.q[idx].done() {
            if let Some(pr) = self.q[idx].prof.take() {
                pr.finish();
            }
            let popped = self.q.report(idx);
            self.head0 = self.head0.saturating_sub(popped);
            Ok(true)
        } else if let Some(f) = &self.fault {
            Err(f.to_error(&self.peer))
        } else {
            Ok(false)
        }
    }
}
