//! The link probe of a TCP connection: the kernel's retransmit count
//! (`TCP_INFO`'s `tcpi_total_retrans`) summed over the connection's
//! sockets, read at snapshot time from any thread.

use nccl_net::{LinkCounters, LinkProbe};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

/// The sockets of one comm, by descriptor number, while the comm lives.
#[derive(Debug)]
pub(crate) struct TcpProbe {
    /// `Some(fds)` while the comm holds them open; `None` once it closed
    /// them (the numbers may then name other files). The lock spans each
    /// sample, so a descriptor is never read after its comm let it go.
    fds: Mutex<Option<Vec<RawFd>>>,
    /// The last counts read, kept once the sockets are closed.
    last: Mutex<LinkCounters>,
}

impl TcpProbe {
    /// A probe of `socks` (all of a comm's sockets, control one included).
    pub(crate) fn new(socks: &[OwnedFd]) -> TcpProbe {
        TcpProbe {
            fds: Mutex::new(Some(socks.iter().map(AsRawFd::as_raw_fd).collect())),
            last: Mutex::new(LinkCounters::default()),
        }
    }

    /// Takes a last sample and forgets the descriptors; the comm calls it
    /// before its sockets close.
    pub(crate) fn close(&self) {
        let mut fds = self.fds.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = fds.as_ref() {
            *self.last.lock().unwrap_or_else(|p| p.into_inner()) = read(v);
        }
        *fds = None;
    }
}

/// Retransmitted segments of one socket (0 where the kernel does not say).
fn retransmits(fd: RawFd) -> u64 {
    // SAFETY: tcp_info is plain old data; all-zero is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` and `len` are live out-parameters of the sizes
    // declared; the kernel writes at most `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    // An older kernel may fill less of the struct than the field's end.
    let end = std::mem::offset_of!(libc::tcp_info, tcpi_total_retrans) + 4;
    if rc == 0 && len as usize >= end {
        u64::from(info.tcpi_total_retrans)
    } else {
        0
    }
}

fn read(fds: &[RawFd]) -> LinkCounters {
    LinkCounters {
        retransmits: fds.iter().map(|&fd| retransmits(fd)).sum(),
    }
}

impl LinkProbe for TcpProbe {
    fn sample(&self) -> LinkCounters {
        let fds = self.fds.lock().unwrap_or_else(|p| p.into_inner());
        match fds.as_ref() {
            Some(v) => {
                let now = read(v);
                *self.last.lock().unwrap_or_else(|p| p.into_inner()) = now;
                now
            }
            None => *self.last.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn a_loopback_connection_reads_zero_and_a_closed_probe_keeps_its_last() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let socks: Vec<OwnedFd> = vec![c.into(), s.into()];
        let p = TcpProbe::new(&socks);
        assert_eq!(p.sample(), LinkCounters { retransmits: 0 });
        p.close();
        drop(socks);
        assert_eq!(p.sample(), LinkCounters { retransmits: 0 });
    }

    #[test]
    fn a_descriptor_that_is_not_a_tcp_socket_counts_zero() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(retransmits(a.as_raw_fd()), 0);
        assert_eq!(retransmits(-1), 0);
    }
}
