//! The data sockets 1..=n of a connection ("lanes") and who services
//! them: the caller's thread inside `test` (inline lanes), or helper
//! threads (see [`crate::helper`]). Socket 0 always belongs to the comm
//! itself because it carries the headers.
//!
//! Every lane is a FIFO of chunks: both sides queue a message's pieces in
//! message order (see [`crate::stripe`]), so the n-th chunk written on a
//! lane is the n-th chunk read from it. Chunk payloads go straight between
//! the caller's buffer and the socket.
//!
//! # Spliced sends
//! A chunk marked spliced is not copied into the socket: its pages are
//! mapped into a pipe (`vmsplice`) and moved from there to the socket
//! (`splice`), so the socket's buffers hold references to the caller's
//! pages. Over loopback those references travel to the receiving socket,
//! and the receiver's `recvmsg` is the only copy of the bytes (two without:
//! the sender's into socket buffers, the receiver's out of them); to
//! another host the NIC reads the pages. The caller's buffer must then stay
//! untouched until the receiver has read the data, not just until the
//! socket took it: the comm completes such a message only on the
//! receiver's acknowledgement (see [`crate::comm`]). A lane's pipe is only
//! ever filled from one chunk, and drained before the next one starts.

use crate::comm::Fault;
use crate::helper::{Helper, LaneShared};
use crate::sys::{self, Pipe};
use crate::wire::{self, UNIT, ZEROS};
use std::collections::VecDeque;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Direction of a comm's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dir {
    /// Writing to the sockets.
    Send,
    /// Reading from the sockets.
    Recv,
}

/// A piece of a message bound to one lane, with the padding of its unit
/// (see [`crate::wire`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Chunk {
    /// Request id of the message.
    pub(crate) op: u64,
    /// Start of the piece in the caller's buffer.
    pub(crate) ptr: *mut u8,
    /// Length of the piece.
    pub(crate) len: usize,
    /// Pad bytes before and after it.
    head: usize,
    tail: usize,
    /// Bytes of the unit moved so far.
    pub(crate) off: usize,
    /// Sent through the lane's pipe (see the module docs); no pads.
    spliced: bool,
}

// SAFETY: a chunk only names caller memory that the isend/irecv contract
// keeps valid (and, for receives, unaliased) until the request completes or
// the comm is dropped; comms join their helper threads before they drop.
unsafe impl Send for Chunk {}

impl Chunk {
    /// A piece of `len` bytes at `ptr` of request `op`, padded by
    /// `(head, tail)`.
    pub(crate) fn new(op: u64, ptr: *mut u8, len: usize, (head, tail): (usize, usize)) -> Chunk {
        Chunk {
            op,
            ptr,
            len,
            head,
            tail,
            off: 0,
            spliced: false,
        }
    }

    /// A piece of a spliced message (see the module docs; it has no pads).
    pub(crate) fn spliced(op: u64, ptr: *mut u8, len: usize) -> Chunk {
        Chunk {
            spliced: true,
            ..Chunk::new(op, ptr, len, (0, 0))
        }
    }

    /// Whether the whole unit has moved.
    pub(crate) fn done(&self) -> bool {
        self.off == self.head + self.len + self.tail
    }
}

/// Moves as much of `c` as the socket allows, a spliced chunk through
/// `pipe` where there is one (copied otherwise). Returns whether any byte
/// moved; `c.done()` once the chunk is.
pub(crate) fn chunk_io(
    dir: Dir,
    fd: &OwnedFd,
    c: &mut Chunk,
    pipe: Option<&mut Pipe>,
) -> Result<bool, Fault> {
    if let (Dir::Send, true, Some(p)) = (dir, c.spliced, pipe) {
        let moved = sys::without_sigpipe(|| splice_chunk(fd, c, p))?;
        if c.done() || c.spliced {
            return Ok(moved);
        }
        // The pages could not be spliced: copy the rest.
        return Ok(chunk_io(dir, fd, c, None)? || moved);
    }
    let mut moved = false;
    // Incoming pad bytes land here and are dropped; outgoing ones are zeros.
    let mut sink = [0u8; UNIT];
    let pad = match dir {
        Dir::Send => ZEROS.as_ptr().cast_mut(),
        Dir::Recv => sink.as_mut_ptr(),
    };
    while !c.done() {
        let segs = [(pad, c.head), (c.ptr, c.len), (pad, c.tail)];
        let mut iov = [crate::comm::empty_iov(); 3];
        let mut n = 0;
        wire::iov_from(&segs, c.off, &mut iov, &mut n);
        let r = match dir {
            // SAFETY: the iovecs lie in the piece, which the isend contract
            // keeps readable until completion (see `Chunk`), or in the
            // static pad bytes; sendmsg only reads them.
            Dir::Send => unsafe { sys::send_iov(fd, &iov[..n]) },
            // SAFETY: as above; irecv keeps the piece writable and
            // unaliased, and `sink` is ours for the call.
            Dir::Recv => unsafe { sys::recv_iov(fd, &iov[..n]) },
        };
        match r {
            Ok(0) if dir == Dir::Recv => return Err(Fault::Closed),
            Ok(n) => {
                c.off += n;
                moved = true;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => {
                let call = if dir == Dir::Send {
                    "sendmsg"
                } else {
                    "recvmsg"
                };
                return Err(Fault::from_io(call, &e));
            }
        }
    }
    Ok(moved)
}

/// Moves as much of spliced chunk `c` (no pads) to the socket as it takes,
/// through `p`. Clears `c.spliced` if its memory cannot be spliced (device
/// memory, say); the pipe is empty then, and the rest is to be copied.
fn splice_chunk(fd: &OwnedFd, c: &mut Chunk, p: &mut Pipe) -> Result<bool, Fault> {
    let mut moved = false;
    while !c.done() {
        if p.held == 0 {
            let want = (c.len - c.off).min(p.cap);
            // SAFETY: the range lies in the piece, which the isend contract
            // keeps readable until completion; the comm completes a spliced
            // message only once the receiver has read it, so the caller
            // does not write the pages while the kernel may still read them.
            match unsafe { sys::vmsplice(p, c.ptr.wrapping_add(c.off), want) } {
                Ok(0) => break,
                Ok(n) => p.held = n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::debug!(error = %e, "NET/Socket: vmsplice failed; copying instead");
                    c.spliced = false;
                    break;
                }
            }
        }
        match sys::splice_to_socket(p, fd, p.held) {
            Ok(0) => break,
            Ok(n) => {
                p.held -= n;
                c.off += n;
                moved = true;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(Fault::from_io("splice", &e)),
        }
    }
    Ok(moved)
}

/// Bytes a lane's pipe is asked to hold (the default `pipe-max-size`).
const PIPE_BYTES: usize = 1 << 20;

enum Lane {
    /// Serviced by the caller's thread; `pipe` once spliced sends are on.
    Inline {
        fd: OwnedFd,
        q: VecDeque<Chunk>,
        pipe: Option<Pipe>,
    },
    /// Serviced by helper thread `helper`; `ops` are the request ids of
    /// the chunks handed over and not yet seen complete, `seen` how many
    /// completions were taken from `shared.done`.
    Helped {
        shared: Arc<LaneShared>,
        helper: usize,
        ops: VecDeque<u64>,
        seen: u64,
    },
}

/// The lanes of one comm.
pub(crate) struct Lanes {
    dir: Dir,
    /// Lane of socket `j` at index `j - 1`.
    lanes: Vec<Lane>,
    helpers: Vec<Helper>,
    /// Chunks queued on all lanes and not yet seen complete.
    busy: usize,
}

impl Lanes {
    /// Takes sockets 1..n (`fds`). With `nthreads >= 2` they are spread
    /// over up to `nthreads` helper threads (socket `j` to helper
    /// `(j - 1) % nthreads`); otherwise the caller's thread services them.
    pub(crate) fn new(dir: Dir, fds: Vec<OwnedFd>, nthreads: usize) -> io::Result<Lanes> {
        let mut l = Lanes {
            dir,
            lanes: Vec::with_capacity(fds.len()),
            helpers: Vec::new(),
            busy: 0,
        };
        if nthreads < 2 || fds.is_empty() {
            l.lanes = fds
                .into_iter()
                .map(|fd| Lane::Inline {
                    fd,
                    q: VecDeque::new(),
                    pipe: None,
                })
                .collect();
            return Ok(l);
        }
        let nhelpers = nthreads.min(fds.len());
        let mut owned: Vec<Vec<(OwnedFd, Arc<LaneShared>)>> =
            (0..nhelpers).map(|_| Vec::new()).collect();
        for (k, fd) in fds.into_iter().enumerate() {
            let shared = Arc::new(LaneShared::default());
            let helper = k % nhelpers;
            owned[helper].push((fd, Arc::clone(&shared)));
            l.lanes.push(Lane::Helped {
                shared,
                helper,
                ops: VecDeque::new(),
                seen: 0,
            });
        }
        for lanes in owned {
            l.helpers.push(Helper::spawn(dir, lanes)?);
        }
        Ok(l)
    }

    /// Gives every lane a pipe for spliced sends; `false` (and spliced
    /// chunks are copied) where helper threads service the lanes or a pipe
    /// cannot be made (out of descriptors, say).
    pub(crate) fn enable_splice(&mut self) -> bool {
        for lane in &mut self.lanes {
            match lane {
                Lane::Inline { pipe: Some(_), .. } => {}
                Lane::Inline { pipe, .. } => match sys::pipe(PIPE_BYTES) {
                    Ok(p) => *pipe = Some(p),
                    Err(e) => {
                        tracing::debug!(error = %e, "NET/Socket: no pipe for spliced sends");
                        return false;
                    }
                },
                Lane::Helped { .. } => return false,
            }
        }
        !self.lanes.is_empty()
    }

    /// Queues `c` on socket `sock` (1..n).
    pub(crate) fn push(&mut self, sock: usize, c: Chunk) {
        self.busy += 1;
        match &mut self.lanes[sock - 1] {
            Lane::Inline { q, .. } => q.push_back(c),
            Lane::Helped {
                shared,
                helper,
                ops,
                ..
            } => {
                ops.push_back(c.op);
                if shared.push(c) {
                    self.helpers[*helper].wake();
                }
            }
        }
    }

    /// Moves what the sockets allow (inline lanes) and collects finished
    /// chunks (all lanes), calling `done` with the request id of each.
    pub(crate) fn progress(&mut self, mut done: impl FnMut(u64)) -> Result<(), Fault> {
        if self.busy == 0 {
            return Ok(());
        }
        let dir = self.dir;
        loop {
            let mut moved = false;
            for lane in &mut self.lanes {
                match lane {
                    Lane::Inline { fd, q, pipe } => {
                        while let Some(c) = q.front_mut() {
                            moved |= chunk_io(dir, fd, c, pipe.as_mut())?;
                            if !c.done() {
                                break;
                            }
                            done(c.op);
                            q.pop_front();
                            self.busy -= 1;
                        }
                    }
                    Lane::Helped {
                        shared, ops, seen, ..
                    } => {
                        let d = shared.done.load(Ordering::Acquire);
                        while *seen < d {
                            *seen += 1;
                            if let Some(op) = ops.pop_front() {
                                done(op);
                                self.busy -= 1;
                            }
                        }
                    }
                }
            }
            if !moved || self.busy == 0 {
                break;
            }
        }
        if let Some(f) = self.helpers.iter().find_map(Helper::fault) {
            return Err(f);
        }
        Ok(())
    }
}
