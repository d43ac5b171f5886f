//! Unit tests of the receiving comm against hand-built socket-0 streams.
use super::*;
use std::io::Write;
use std::time::{Duration, Instant};

/// A receive comm over one loopback socket, and the sending end (blocking).
fn one_socket_comm(max_requests: usize) -> (std::net::TcpStream, TcpRecvComm) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tx = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (rx, _) = l.accept().unwrap();
    rx.set_nonblocking(true).unwrap();
    let comm = TcpRecvComm::new(vec![OwnedFd::from(rx)], "test".into(), max_requests, 1).unwrap();
    (tx, comm)
}

/// Socket 0 of a receive comm leaves the kernel's quick-ACK mode once a
/// message is in.
#[test]
fn socket_zero_delays_its_acks() {
    let (mut tx, mut comm) = one_socket_comm(4);
    assert!(sys::quickack(&comm.fd).unwrap(), "the kernel's default");
    // One 8-byte message as a v3 sender writes it: header, pads, payload
    // at its source's offset in its cache line (0 here), pads.
    let payload = [0x5au8; 8];
    let unit = inline_message(9, &payload, 0);
    assert_eq!(unit.len() % UNIT, 0);
    tx.write_all(&unit).unwrap();
    let mut buf = [0u8; 8];
    // SAFETY: `buf` outlives the request, which completes below.
    let req = unsafe { comm.irecv(buf.as_mut_ptr(), buf.len(), 9, None) }
        .unwrap()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while comm.test(req).unwrap().is_none() {
        assert!(Instant::now() < deadline, "message never completed");
    }
    assert_eq!(buf, payload);
    assert!(!sys::quickack(&comm.fd).unwrap(), "delayed ACKs");
}

/// Socket 0's units of an inline message of `payload` sent from offset
/// `align` in a cache line.
fn inline_message(tag: u32, payload: &[u8], align: u8) -> Vec<u8> {
    let h = Header {
        tag,
        len: payload.len() as u64,
        align,
        spliced: false,
    };
    let (head, tail) = wire::pads(HDR, payload.len(), align);
    let mut unit = h.encode().to_vec();
    unit.resize(HDR + head, 0);
    unit.extend_from_slice(payload);
    unit.resize(unit.len() + tail, 0);
    unit
}

/// Messages smaller and larger than the read-ahead buffer, several in
/// one read or one split over many, come out whole, in order and bit
/// for bit, and nothing is written past a posted length.
#[test]
fn read_ahead_keeps_messages_apart() {
    use super::super::ahead::AHEAD;
    let sizes = [
        8,
        0,
        1,
        47,
        48,
        1000,
        4000,
        AHEAD,
        8,
        5000,
        70_000,
        64,
        9000,
        3,
        AHEAD - 80,
        8,
    ];
    let (mut tx, mut comm) = one_socket_comm(64);
    let mut stream = Vec::new();
    let mut want = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let payload: Vec<u8> = (0..n).map(|j| (j * 7 + i * 13 + 1) as u8).collect();
        stream.extend(inline_message(
            100 + i as u32,
            &payload,
            (i * 11 % UNIT) as u8,
        ));
        want.push(payload);
    }
    const GUARD: u8 = 0xee;
    let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![GUARD; n + 64]).collect();
    let reqs: Vec<Request> = bufs
        .iter_mut()
        .enumerate()
        // SAFETY: the buffers outlive the requests, all completed below;
        // each is posted for all but its last 64 bytes.
        .map(|(i, b)| unsafe { comm.irecv(b.as_mut_ptr(), b.len() - 64, 100 + i as u32, None) })
        .map(|r| r.unwrap().unwrap())
        .collect();
    // Pieces of irregular sizes, sometimes several messages at once,
    // sometimes a header split in two; the receiver polls in between.
    let writer = std::thread::spawn(move || {
        let mut off = 0;
        let mut k = 0usize;
        while off < stream.len() {
            let n = [5, 64, 3000, 11, 17_000, 200, 1, 9000][k % 8].min(stream.len() - off);
            tx.write_all(&stream[off..off + n]).unwrap();
            off += n;
            k += 1;
            std::thread::sleep(Duration::from_micros(300));
        }
        tx
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    for (i, &req) in reqs.iter().enumerate() {
        while comm.test(req).unwrap().is_none() {
            assert!(Instant::now() < deadline, "message {i} never completed");
        }
    }
    let _tx = writer.join().unwrap();
    for (i, (b, w)) in bufs.iter().zip(&want).enumerate() {
        assert_eq!(&b[..w.len()], &w[..], "message {i} of {} bytes", w.len());
        assert!(
            b[w.len()..].iter().all(|&x| x == GUARD),
            "message {i}: written past"
        );
    }
}
