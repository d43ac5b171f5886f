//! The data path: [`TcpSendComm`] and [`TcpRecvComm`].
//!
//! # Wire format
//! After the greeting, socket 0 carries for each message a 16-byte header —
//! tag, payload length, the sender's payload alignment (see [`crate::wire`])
//! — followed by the payload if the message is small (or the connection has
//! one socket); a large message's payload travels in pieces on the other
//! sockets (see [`crate::stripe`]). Every message on socket 0 and every
//! piece is padded to whole 64-byte units, the payload placed in its unit as
//! it lies in its cache line, so that the kernel's copies run at full speed
//! (see [`crate::wire`]).
//!
//! # Progress
//! Both comms keep a FIFO of posted requests in a `VecDeque` that is reused
//! (no allocation per message once it has grown). The socket-0 parts
//! (header, inline payload) complete in posting order; a striped
//! message is complete once its pieces on the other sockets ("lanes", see
//! [`crate::lanes`]) are too, so a message can complete before an older one.
//! Requests stay in the queue (flagged when reported) until every older
//! request has been reported, then are popped. Every `test` first makes as
//! much progress as the sockets allow without blocking, then answers.
//!
//! Sends gather the socket-0 units of several queued messages into one
//! `sendmsg`. Receives read socket 0 into a 4 KiB read-ahead buffer when
//! they need a header (see [`ahead`]), check tag and size, lay the message
//! out, copy what of its unit came with the header, and read the rest and
//! the pieces straight into the posted buffer (no copy); each socket-0
//! payload read also offers the read-ahead buffer for what follows, so a
//! small message costs one `recv` and a stream of them fewer.
//!
//! A spliced message (see [`crate::lanes`]) also waits for its receiver's
//! acknowledgement: the receiver writes the message's sequence number on
//! socket 0, the one direction of the connection nothing else uses, once
//! the whole message is in; the sender reads acknowledgements while any
//! is due, so a receiver that closes fails the send.
//!
//! # Profiler events
//! A request posted after [`nccl_net::SendComm::profile`] (or the receive
//! side's) reports a NetPlugin event per socket its payload travels on
//! (NCCL's socket descriptor: fd, direction, payload bytes): socket 0 for
//! an inline message, one per piece for a striped one, so that the lengths
//! add up to the message. They start when the message is laid out (a send
//! at `isend`, a receive when its header is read) and stop when `test`
//! reports the request complete.
//!
//! After a connection error, a tag mismatch or a truncation the stream can
//! no longer be trusted: the comm remembers the fault and reports it from
//! every later call that would need the connection.

mod ahead;
mod recv;
mod send;

pub(crate) use recv::TcpRecvComm;
pub(crate) use send::{SpliceSizes, TcpSendComm};

use crate::sys;
use nccl_net::{NetError, Request};
use std::io;

/// A remembered failure; rebuilt into a [`NetError`] on every report.
#[derive(Clone, Debug)]
pub(crate) enum Fault {
    Closed,
    Io { call: &'static str, errno: i32 },
    Tag { expected: u32, got: u32 },
    Truncated { posted: usize, got: usize },
    Protocol(String),
}

impl Fault {
    pub(crate) fn from_io(call: &'static str, e: &io::Error) -> Fault {
        if sys::is_disconnect(e) {
            Fault::Closed
        } else {
            Fault::Io {
                call,
                errno: e.raw_os_error().unwrap_or(libc::EIO),
            }
        }
    }

    pub(crate) fn to_error(&self, peer: &str) -> NetError {
        match *self {
            Fault::Closed => NetError::Closed(peer.to_owned()),
            Fault::Io { call, errno } => NetError::io(call, io::Error::from_raw_os_error(errno)),
            Fault::Tag { expected, got } => NetError::TagMismatch { expected, got },
            Fault::Truncated { posted, got } => NetError::Truncated { posted, got },
            Fault::Protocol(ref what) => NetError::Protocol(format!("{what} from {peer}")),
        }
    }
}

pub(crate) fn unknown_request(req: Request) -> NetError {
    NetError::Other(format!(
        "unknown request {} (never posted on this comm, or already reported complete)",
        req.0
    ))
}

pub(crate) fn empty_iov() -> libc::iovec {
    libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }
}
