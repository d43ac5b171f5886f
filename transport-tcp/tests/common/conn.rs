//! Establishing one connection of a [`TcpNet`] over loopback, under a
//! deadline.
#![allow(dead_code)] // each test crate uses part of it

use nccl_net::{Net, RecvComm, SendComm};
use std::time::{Duration, Instant};
use transport_tcp::TcpNet;

/// `rx` listens, `tx` connects; polls both until established, failing the
/// test after `deadline`.
pub(crate) fn pair(
    tx: &TcpNet,
    rx: &TcpNet,
    deadline: Duration,
) -> (Box<dyn SendComm>, Box<dyn RecvComm>) {
    let mut listener = rx.listen().unwrap();
    let mut connector = tx.connect(listener.handle()).unwrap();
    let (mut s, mut r) = (None, None);
    let start = Instant::now();
    while s.is_none() || r.is_none() {
        assert!(start.elapsed() < deadline, "timed out: handshake");
        if s.is_none() {
            s = connector.poll_connect().unwrap();
        }
        if r.is_none() {
            r = listener.accept().unwrap();
        }
    }
    (s.unwrap(), r.unwrap())
}
