//! [`TcpRecvComm`]: the receiving half of a connection.

use super::ahead::ReadAhead;
use super::{empty_iov, unknown_request, Fault};
use crate::lanes::{Chunk, Dir, Lanes};
use crate::stripe::Striper;
use crate::sys;
use crate::wire::{self, Header, HDR, UNIT};
use nccl_net::profile::{RequestEvents, SOCKET_RECV};
use nccl_net::{MemHandle, NetProfile, NetResult, RecvComm, Request, RequestQueue};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// How often socket 0 is put back in delayed-ACK mode (the kernel leaves it
/// after a delayed ACK's timer, at least 40 ms, fires on an idle socket).
const DELAY_ACKS_EVERY: Duration = Duration::from_millis(10);

struct RecvOp {
    data: *mut u8,
    cap: usize,
    tag: u32,
    /// Message length, once its header has been read.
    len: Option<usize>,
    /// Where the socket-0 payload goes (set with `len`).
    data0: *mut u8,
    len0: usize,
    /// Padding before and after it (see [`wire::pads`]).
    head: usize,
    tail: usize,
    /// Bytes of the socket-0 unit after the header received so far.
    got0: usize,
    /// Pieces on other sockets not yet received.
    pieces_left: usize,
    /// Sequence number of the message on the connection (set with `len`).
    seq: u64,
    /// Spliced: to be acknowledged once in (see [`crate::lanes`]).
    ack: bool,
    /// Its profiler events, if it was posted with a profile.
    prof: Option<Box<RequestEvents>>,
}

impl RecvOp {
    /// Bytes of the socket-0 unit after the header.
    fn rest0(&self) -> usize {
        self.head + self.len0 + self.tail
    }

    fn done(&self) -> bool {
        self.len.is_some() && self.got0 == self.rest0() && self.pieces_left == 0
    }
}

/// The receiving half of a TCP connection.
pub(crate) struct TcpRecvComm {
    fd: OwnedFd,
    /// Its link counters, for observers (see [`crate::probe`]).
    probe: std::sync::Arc<crate::probe::TcpProbe>,
    peer: String,
    q: RequestQueue<RecvOp>,
    /// Number of requests at the front of `q` whose socket-0 part is in.
    head0: usize,
    fault: Option<Fault>,
    /// Socket-0 bytes read before their message was laid out.
    ahead: ReadAhead,
    /// Where incoming pad bytes land (and are dropped).
    sink: [u8; UNIT],
    striper: Striper,
    lanes: Lanes,
    /// When socket 0 was last put in delayed-ACK mode.
    acks_delayed_at: Option<Instant>,
    /// Headers taken so far (the next message's sequence number).
    taken: u64,
    /// Spliced messages whose acknowledgement is not yet queued.
    to_ack: usize,
    /// Acknowledgements queued for socket 0, and their bytes written.
    acks_out: Vec<u8>,
    acks_sent: usize,
    /// Socket `j`'s descriptor at index `j` (for profiler events).
    fds: Vec<RawFd>,
    /// The profile of the next request posted.
    next_prof: Option<NetProfile>,
}

// SAFETY: as for TcpSendComm: the raw pointers are only handed to the
// kernel, and the `irecv` contract keeps them valid until completion.
unsafe impl Send for TcpRecvComm {}

impl TcpRecvComm {
    /// A comm over `socks` (socket 0 first); sockets 1.. are serviced by
    /// `nthreads` helper threads if `nthreads >= 2`.
    pub(crate) fn new(
        mut socks: Vec<OwnedFd>,
        peer: String,
        max_requests: usize,
        nthreads: usize,
    ) -> io::Result<Self> {
        let ndata = crate::stripe::data_sockets(socks.len());
        let probe = std::sync::Arc::new(crate::probe::TcpProbe::new(&socks));
        let fds = socks.iter().map(AsRawFd::as_raw_fd).collect();
        let others = socks.split_off(1);
        let fd = socks.pop().ok_or(io::ErrorKind::InvalidInput)?;
        Ok(TcpRecvComm {
            fd,
            probe,
            peer,
            q: RequestQueue::with_capacity(max_requests),
            head0: 0,
            fault: None,
            ahead: ReadAhead::new(),
            sink: [0; UNIT],
            striper: Striper::new(ndata),
            lanes: Lanes::new(Dir::Recv, others, nthreads)?,
            acks_delayed_at: None,
            taken: 0,
            to_ack: 0,
            acks_out: Vec::new(),
            acks_sent: 0,
            fds,
            next_prof: None,
        })
    }

    /// Queues the acknowledgement of every spliced message that is in and
    /// writes what socket 0 takes: the sender's pages are then free.
    fn acknowledge(&mut self) -> Result<(), Fault> {
        if self.to_ack > 0 {
            for i in 0..self.q.len() {
                let op = &mut self.q[i];
                if op.ack && op.done() {
                    op.ack = false;
                    self.to_ack -= 1;
                    self.acks_out.extend_from_slice(&op.seq.to_le_bytes());
                }
            }
        }
        while self.acks_sent < self.acks_out.len() {
            match sys::send(&self.fd, &self.acks_out[self.acks_sent..]) {
                Ok(n) => self.acks_sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(Fault::from_io("send", &e)),
            }
        }
        self.acks_out.clear();
        self.acks_sent = 0;
        Ok(())
    }

    fn progress(&mut self) {
        if self.fault.is_none() {
            if let Err(f) = self.progress0() {
                self.fail(f);
            }
        }
        if self.fault.is_none() {
            let q = &mut self.q;
            let r = self.lanes.progress(|id| {
                if let Some(i) = q.position(id) {
                    q[i].pieces_left -= 1;
                }
            });
            if let Err(f) = r {
                self.fail(f);
            }
        }
        if self.fault.is_none() {
            if let Err(f) = self.acknowledge() {
                self.fail(f);
            }
        }
    }

    fn fail(&mut self, f: Fault) {
        if let Fault::Io { .. } | Fault::Closed = f {
            tracing::warn!(peer = %self.peer, fault = ?f, "NET/Socket: receive failed");
        }
        self.fault = Some(f);
    }

    /// Keeps socket 0 in delayed-ACK mode. Data only ever comes in on it,
    /// so no ACK rides on data of ours: in quick-ACK mode, the kernel's
    /// default for such a socket, every small message costs a pure ACK
    /// segment through the sender's stack and ours; delayed, one per two
    /// messages does (and one per two full segments for large ones, as
    /// before; `nstat` counts the segments).
    fn delay_acks(&mut self) {
        let now = Instant::now();
        if self
            .acks_delayed_at
            .is_some_and(|t| now.duration_since(t) < DELAY_ACKS_EVERY)
        {
            return;
        }
        self.acks_delayed_at = Some(now);
        if let Err(e) = sys::set_quickack(&self.fd, false) {
            tracing::debug!(peer = %self.peer, "NET/Socket: TCP_QUICKACK: {e}");
        }
    }

    /// Checks header `hdr` against `q[head0]` and lays the message out.
    fn take_header(&mut self, hdr: &[u8; HDR]) -> Result<(), Fault> {
        self.delay_acks();
        let h = Header::decode(hdr).map_err(Fault::Protocol)?;
        let id = self.q.id_at(self.head0);
        let op = &mut self.q[self.head0];
        if h.tag != op.tag {
            return Err(Fault::Tag {
                expected: op.tag,
                got: h.tag,
            });
        }
        let len = match usize::try_from(h.len) {
            Ok(len) if len <= op.cap => len,
            _ => {
                return Err(Fault::Truncated {
                    posted: op.cap,
                    got: usize::try_from(h.len).unwrap_or(usize::MAX),
                })
            }
        };
        let data = op.data;
        let mut pieces_left = 0;
        let lanes = &mut self.lanes;
        let fds = &self.fds;
        let prof = &mut op.prof;
        let striped = self.striper.layout(len, |p| {
            // Stays inside the caller's buffer: p.off < len <= cap.
            let ptr = data.wrapping_add(p.off);
            pieces_left += 1;
            if let Some(pr) = prof.as_mut() {
                pr.socket(fds[p.sock], SOCKET_RECV, p.len);
            }
            lanes.push(p.sock, Chunk::new(id, ptr, p.len, h.piece_pads(p.len)));
        });
        // Inline: the whole payload after the header; striped: nothing.
        let (data0, len0) = if striped { (data, 0) } else { (data, len) };
        if let (Some(pr), false) = (op.prof.as_mut(), striped) {
            pr.socket(self.fds[0], SOCKET_RECV, len0);
        }
        (op.head, op.tail) = wire::pads(HDR, len0, h.align);
        op.len = Some(len);
        op.data0 = data0;
        op.len0 = len0;
        op.pieces_left = pieces_left;
        op.seq = self.taken;
        op.ack = h.spliced;
        self.taken += 1;
        self.to_ack += usize::from(h.spliced);
        Ok(())
    }

    /// Reads as much of the socket-0 stream as the socket holds.
    fn progress0(&mut self) -> Result<(), Fault> {
        // The socket had less than a read asked for: nothing more to read.
        let mut drained = false;
        while self.head0 < self.q.len() {
            if self.q[self.head0].len.is_none() {
                let hdr = match self.ahead.header() {
                    Some(hdr) => hdr,
                    None if drained => return Ok(()),
                    None => {
                        let space = self.ahead.space();
                        let asked = space.len();
                        match sys::recv(&self.fd, space) {
                            Ok(0) => return Err(Fault::Closed),
                            Ok(n) => {
                                self.ahead.filled(n);
                                drained = n < asked;
                            }
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                            Err(e) => return Err(Fault::from_io("recv", &e)),
                        }
                        match self.ahead.header() {
                            Some(hdr) => hdr,
                            None => return Ok(()), // drained the socket
                        }
                    }
                };
                self.take_header(&hdr)?;
            }
            let sink = self.sink.as_mut_ptr();
            let op = &mut self.q[self.head0];
            let segs = [(sink, op.head), (op.data0, op.len0), (sink, op.tail)];
            let rest = op.rest0();
            let early = self.ahead.take(rest - op.got0);
            // SAFETY: the payload segment lies within the buffer the `irecv`
            // caller keeps valid for writes and unaliased until completion;
            // the pads land in our sink (a pad is shorter than it); `early`
            // is our read-ahead buffer; `got0 + early.len() <= rest`.
            unsafe { wire::scatter(&segs, op.got0, early) };
            op.got0 += early.len();
            if op.got0 == rest {
                // Socket-0 unit in.
                self.head0 += 1;
                continue;
            }
            if drained {
                return Ok(());
            }
            // Nothing is left unread ahead here: read the rest of the unit
            // and whatever follows it, up to a read-ahead buffer full.
            let want = rest - op.got0;
            let (ahead, ahead_len) = self.ahead.whole();
            let mut iov = [empty_iov(); 4];
            let mut n_iov = 0;
            wire::iov_from(&segs, op.got0, &mut iov, &mut n_iov);
            iov[n_iov] = libc::iovec {
                iov_base: ahead.cast(),
                iov_len: ahead_len,
            };
            n_iov += 1;
            // SAFETY: as for `scatter` above; the last iovec is our
            // read-ahead buffer, untouched during the call.
            match unsafe { sys::recv_iov(&self.fd, &iov[..n_iov]) } {
                Ok(0) => return Err(Fault::Closed),
                Ok(n) => {
                    let k = n.min(want);
                    op.got0 += k;
                    self.ahead.filled(n - k);
                    if op.got0 == rest {
                        self.head0 += 1;
                    }
                    drained = n < want + ahead_len;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(Fault::from_io("recvmsg", &e)),
            }
        }
        Ok(())
    }
}

impl Drop for TcpRecvComm {
    /// Writes acknowledgements still queued (best effort, non-blocking), so
    /// that a sender's last spliced message completes.
    fn drop(&mut self) {
        if self.fault.is_none() {
            let _ = self.acknowledge();
        }
        self.probe.close();
    }
}

impl RecvComm for TcpRecvComm {
    fn link_probe(&self) -> Option<nccl_net::SharedProbe> {
        Some(self.probe.clone())
    }

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
        if self.q.is_full() {
            return Ok(None);
        }
        let req = self.q.push(RecvOp {
            data,
            cap: len,
            tag,
            len: None,
            data0: data,
            len0: 0,
            head: 0,
            tail: 0,
            got0: 0,
            pieces_left: 0,
            seq: 0,
            ack: false,
            prof: self.next_prof.take().map(RequestEvents::new),
        });
        Ok(Some(req))
    }

    fn profile(&mut self, p: Option<NetProfile>) {
        self.next_prof = p;
    }

    fn test(&mut self, req: Request) -> NetResult<Option<usize>> {
        let idx = self.q.live(req).ok_or_else(|| unknown_request(req))?;
        // `progress` pops nothing, so `idx` stays valid.
        self.progress();
        let op = &mut self.q[idx];
        if op.done() {
            if let Some(pr) = op.prof.take() {
                pr.finish();
            }
            let size = op.len.unwrap_or(0);
            let popped = self.q.report(idx);
            self.head0 = self.head0.saturating_sub(popped);
            Ok(Some(size))
        } else if let Some(f) = &self.fault {
            Err(f.to_error(&self.peer))
        } else {
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests;
