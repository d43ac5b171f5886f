//! A rank's side of the bootstrap connection: join, out-of-band all-gather
//! and barrier, and after init the health channel (failures of other ranks,
//! mismatch inquiries). See `msg.rs` for the frames.

use super::msg::{self, frame, parse_seq, seq_frame};
use super::wire::{decode_gather, read_frame, write_frame, FrameBuf, Hello};
use super::{io, UniqueId};
use crate::error::BootstrapError;
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// What the root told this rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// Another rank failed or died; the text names it.
    RemoteFailure(String),
    /// The root resolved a collective mismatch; the text names the calls.
    Mismatch(String),
}

/// One rank's connection to the root.
pub(crate) struct Bootstrap {
    stream: TcpStream,
    timeout: Duration,
    inbuf: FrameBuf,
    /// A failure the root reported, kept so later checks report it too.
    event: Option<Event>,
    root: std::net::SocketAddr,
}

impl Bootstrap {
    /// Connects to the root (retrying while it is not up yet) and joins as
    /// `rank` of `nranks`.
    pub(crate) fn connect(
        id: &UniqueId,
        rank: usize,
        nranks: usize,
        timeout: Duration,
    ) -> Result<Bootstrap, BootstrapError> {
        let deadline = Instant::now() + timeout;
        let what = format!("joining the root at {} as rank {rank} of {nranks}", id.addr);
        super::root::announce_size(id.addr, nranks);
        // Retry until the deadline: the root may not be up yet, or may have
        // shed this connection under a flood of strangers.
        let stream = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(BootstrapError::Timeout {
                    what,
                    after: timeout,
                });
            }
            match Self::hello(id, rank, nranks, left) {
                Ok(s) => break s,
                Err(e @ BootstrapError::Rejected(_)) => {
                    super::root::wait_ended(id.addr, left);
                    return Err(e);
                }
                Err(e) => {
                    tracing::debug!("bootstrap: {what}: {e}; retrying");
                    std::thread::sleep(Duration::from_millis(20).min(left));
                }
            }
        };
        stream.set_nonblocking(true).map_err(|e| io(what, e))?;
        super::root::count_local_client(id.addr, 1);
        Ok(Bootstrap {
            stream,
            timeout,
            inbuf: FrameBuf::default(),
            event: None,
            root: id.addr,
        })
    }

    /// One attempt: connect, send the hello, read the root's answer.
    fn hello(
        id: &UniqueId,
        rank: usize,
        nranks: usize,
        left: Duration,
    ) -> Result<TcpStream, BootstrapError> {
        let what = || format!("joining the root at {}", id.addr);
        let mut stream = TcpStream::connect_timeout(&id.addr, left.min(Duration::from_secs(5)))
            .map_err(|e| io(what(), e))?;
        let _ = stream.set_nodelay(true);
        let hello = Hello {
            secret: id.secret,
            rank: rank as u32,
            nranks: nranks as u32,
        };
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .map_err(|e| io(what(), e))?;
        write_frame(&mut stream, &hello.encode()).map_err(|e| io(what(), e))?;
        let reply = read_frame(&mut stream, 4096).map_err(|e| timeout_or_io(e, &what(), left))?;
        if reply != b"OK" {
            return Err(BootstrapError::Rejected(
                String::from_utf8_lossy(&reply).into_owned(),
            ));
        }
        Ok(stream)
    }

    fn send(&mut self, payload: &[u8]) -> Result<(), BootstrapError> {
        let what = "writing to the bootstrap root";
        self.stream
            .set_nonblocking(false)
            .map_err(|e| io(what.into(), e))?;
        let _ = self.stream.set_write_timeout(Some(self.timeout));
        let res = write_frame(&mut self.stream, payload).map_err(|e| io(what.into(), e));
        let _ = self.stream.set_nonblocking(true);
        res
    }

    /// Reads frames without blocking; handles inquiries with `describe` and
    /// returns the next GATHER reply if one arrived. Failures are kept in
    /// `self.event`.
    fn pump(
        &mut self,
        describe: &dyn Fn(u64) -> String,
    ) -> Result<Option<Vec<u8>>, BootstrapError> {
        let eof = self
            .inbuf
            .fill(&mut self.stream)
            .map_err(|e| io("reading from the bootstrap root".into(), e))?;
        while let Some(f) = self.inbuf.next_frame().map_err(BootstrapError::Protocol)? {
            let (kind, body) = (f[0], &f[1..]);
            match kind {
                msg::GATHER => return Ok(Some(body.to_vec())),
                msg::ABORT if self.event.is_none() => {
                    let text =
                        String::from_utf8_lossy(body.get(1..).unwrap_or_default()).into_owned();
                    self.event = Some(match body.first() {
                        Some(&msg::ABORT_MISMATCH) => Event::Mismatch(text),
                        _ => Event::RemoteFailure(text),
                    });
                }
                msg::OPINFO_REQ => {
                    if let Some((seq, _)) = parse_seq(body) {
                        let d = describe(seq);
                        let _ = self.send(&seq_frame(msg::OPINFO, seq, &d));
                    }
                }
                _ => {}
            }
        }
        if eof && self.event.is_none() {
            self.event = Some(Event::RemoteFailure(
                "the bootstrap root (in rank 0's process) closed the connection: rank 0 died or left".into(),
            ));
        }
        Ok(None)
    }

    /// The local address of the connection to the root: an interface of
    /// the bootstrap network.
    pub(crate) fn local_ip(&self) -> Option<std::net::IpAddr> {
        self.stream.local_addr().ok().map(|a| a.ip())
    }

    /// Out-of-band all-gather: every rank's bytes, in rank order.
    pub(crate) fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        self.send(&frame(msg::GATHER, mine))?;
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(reply) = self.pump(&|_| "bootstrap (init)".into())? {
                return decode_gather(&reply).map_err(BootstrapError::Protocol);
            }
            if let Some(e) = &self.event {
                return Err(BootstrapError::Protocol(format!("{e:?}")));
            }
            if Instant::now() > deadline {
                return Err(BootstrapError::Timeout {
                    what: "bootstrap all-gather".into(),
                    after: self.timeout,
                });
            }
            self.wait_readable(Duration::from_millis(50));
        }
    }

    /// Out-of-band barrier.
    pub(crate) fn barrier(&mut self) -> Result<(), BootstrapError> {
        self.all_gather(&[]).map(|_| ())
    }

    /// Checks for news from the root without blocking, answering inquiries
    /// with `describe(seq)`. Returns the failure the root reported, if any.
    pub(crate) fn check(&mut self, describe: &dyn Fn(u64) -> String) -> Option<Event> {
        if self.event.is_none() {
            let _ = self.pump(describe);
        }
        self.event.clone()
    }

    /// Waits up to `wait` for the root's verdict (answering inquiries).
    pub(crate) fn await_event(
        &mut self,
        wait: Duration,
        describe: &dyn Fn(u64) -> String,
    ) -> Option<Event> {
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            if let Some(e) = self.check(describe) {
                return Some(e);
            }
            self.wait_readable(Duration::from_millis(20));
        }
        None
    }

    /// Tells the root this rank failed, so every other rank learns of it.
    pub(crate) fn report_failure(&mut self, why: &str) {
        let _ = self.send(&frame(msg::ABORT, why.as_bytes()));
    }

    /// Tells the root that operation `seq` met data of another operation.
    pub(crate) fn report_mismatch(&mut self, seq: u64, mine: &str) {
        let _ = self.send(&seq_frame(msg::MISMATCH, seq, mine));
    }

    fn wait_readable(&self, timeout: Duration) {
        use std::os::fd::AsRawFd;
        let mut fd = libc::pollfd {
            fd: self.stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd on the stack for the duration of the call.
        unsafe { libc::poll(&mut fd, 1, timeout.as_millis() as libc::c_int) };
    }
}

impl Drop for Bootstrap {
    fn drop(&mut self) {
        let _ = self.send(&[msg::BYE]);
        super::root::count_local_client(self.root, -1);
        super::root::wait_finished(self.root, self.timeout);
    }
}

fn timeout_or_io(e: std::io::Error, what: &str, after: Duration) -> BootstrapError {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => BootstrapError::Timeout {
            what: what.into(),
            after,
        },
        std::io::ErrorKind::UnexpectedEof => BootstrapError::Protocol(format!(
            "{what}: the root closed the connection (a rank left or was refused)"
        )),
        _ => io(what.into(), e),
    }
}
