//! The root after every rank joined: serves all-gathers, forwards failures,
//! and resolves collective mismatches into one message naming the ranks and
//! their calls. One thread, `poll(2)` over the ranks' sockets.
//!
//! A rank whose connection closes without a BYE died (or was killed): every
//! other rank gets an ABORT naming it within one poll interval. The monitor
//! ends when every rank has left.

use super::msg::{self, frame, parse_seq, seq_frame};
use super::wire::{encode_gather, FrameBuf};
use std::collections::BTreeMap;
use std::io::Write;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// How long the monitor waits for ranks to describe a mismatched operation.
const OPINFO_WAIT: Duration = Duration::from_secs(3);

struct Rank {
    stream: TcpStream,
    addr: String,
    inbuf: FrameBuf,
    gone: bool,
    said_bye: bool,
}

/// A mismatch being resolved.
struct Inquiry {
    seq: u64,
    started: Instant,
    answers: BTreeMap<usize, String>,
}

pub(crate) fn serve(
    streams: Vec<TcpStream>,
    done: &super::root::Done,
    late: super::root::Late<'_>,
) {
    info!(nranks = streams.len(), "bootstrap root: all ranks joined");
    let mut ranks: Vec<Rank> = streams
        .into_iter()
        .map(|stream| {
            let addr = stream
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "?".into());
            let _ = stream.set_nonblocking(true);
            Rank {
                stream,
                addr,
                inbuf: FrameBuf::default(),
                gone: false,
                said_bye: false,
            }
        })
        .collect();
    let mut gather: Vec<Option<Vec<u8>>> = vec![None; ranks.len()];
    // The listener stays open until every rank has spoken (init's first
    // all-gather): a late claim of an admitted rank in that time aborts.
    let mut late = Some(late);
    let mut spoke = vec![false; ranks.len()];
    let mut aborted = false;
    let mut inquiry: Option<Inquiry> = None;
    while ranks.iter().any(|r| !r.gone) {
        super::root::set_remaining(
            done,
            ranks.iter().filter(|r| !r.gone && !r.said_bye).count(),
        );
        wait_readable(&ranks, Duration::from_millis(100));
        for r in 0..ranks.len() {
            for f in read_frames(&mut ranks[r]) {
                spoke[r] = true;
                let (kind, body) = (f[0], &f[1..]);
                match kind {
                    msg::GATHER => gather[r] = Some(body.to_vec()),
                    msg::BYE => ranks[r].said_bye = true,
                    msg::ABORT if !aborted => {
                        aborted = true;
                        let text = format!(
                            "rank {r} ({}) failed: {}",
                            ranks[r].addr,
                            String::from_utf8_lossy(body)
                        );
                        broadcast_abort(done, &mut ranks, msg::ABORT_REMOTE, &text, Some(r));
                    }
                    msg::MISMATCH if inquiry.is_none() && !aborted => {
                        if let Some((seq, desc)) = parse_seq(body) {
                            let mut answers = BTreeMap::new();
                            answers.insert(r, desc);
                            inquiry = Some(Inquiry {
                                seq,
                                started: Instant::now(),
                                answers,
                            });
                            for (p, rank) in ranks.iter_mut().enumerate() {
                                if p != r && !rank.gone {
                                    send(rank, &seq_frame(msg::OPINFO_REQ, seq, ""));
                                }
                            }
                        }
                    }
                    msg::MISMATCH | msg::OPINFO => {
                        if let (Some(q), Some((seq, desc))) = (inquiry.as_mut(), parse_seq(body)) {
                            if seq == q.seq {
                                q.answers.insert(r, desc);
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        if let Some(l) = late.as_mut() {
            if let Some(text) = l.poll() {
                if !aborted {
                    aborted = true;
                    broadcast_abort(done, &mut ranks, msg::ABORT_REMOTE, &text, None);
                }
            }
            if aborted || spoke.iter().all(|&s| s) {
                late = None;
            }
        }
        // Ranks that vanished without a BYE died.
        for r in 0..ranks.len() {
            if ranks[r].gone && !ranks[r].said_bye && !aborted {
                aborted = true;
                let text = format!(
                    "rank {r} ({}) closed its bootstrap connection without leaving: the process died or was killed",
                    ranks[r].addr
                );
                broadcast_abort(done, &mut ranks, msg::ABORT_REMOTE, &text, None);
            }
        }
        if let Some(q) = &inquiry {
            let alive = ranks.iter().filter(|r| !r.gone).count();
            if q.answers.len() >= alive || q.started.elapsed() > OPINFO_WAIT {
                let text = describe_mismatch(q, ranks.len());
                aborted = true;
                broadcast_abort(done, &mut ranks, msg::ABORT_MISMATCH, &text, None);
                inquiry = None;
            }
        }
        let waiting: Vec<usize> = (0..ranks.len())
            .filter(|&r| !ranks[r].gone && gather[r].is_none())
            .collect();
        if waiting.is_empty() && gather.iter().any(Option::is_some) {
            let parts: Vec<Vec<u8>> = gather
                .iter_mut()
                .map(|g| g.take().unwrap_or_default())
                .collect();
            let reply = frame(msg::GATHER, &encode_gather(&parts));
            for rank in ranks.iter_mut().filter(|r| !r.gone) {
                send(rank, &reply);
            }
        }
    }
    debug!("bootstrap root: every rank left");
}

/// Groups the answers by description: "rank 3 called X as operation #57
/// where rank 0 called Y".
fn describe_mismatch(q: &Inquiry, n: usize) -> String {
    let mut groups: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (r, d) in &q.answers {
        groups.entry(d.as_str()).or_default().push(*r);
    }
    let mut groups: Vec<(&str, Vec<usize>)> = groups.into_iter().collect();
    groups.sort_by_key(|(_, rs)| std::cmp::Reverse(rs.len()));
    let names = |rs: &[usize]| match rs {
        [one] => format!("rank {one}"),
        many => format!("ranks {many:?}"),
    };
    let silent: Vec<usize> = (0..n).filter(|r| !q.answers.contains_key(r)).collect();
    let mut text = match groups.as_slice() {
        [(d0, r0), (d1, r1), ..] => {
            format!("mismatched collectives: {} called {d1} as operation #{} where {} called {d0}", names(r1), q.seq, names(r0))
        }
        [(d0, r0)] => format!(
            "mismatched collectives at operation #{}: {} called {d0} but met data of another operation",
            q.seq,
            names(r0)
        ),
        [] => format!("mismatched collectives at operation #{}", q.seq),
    };
    for (d, rs) in groups.iter().skip(2) {
        text.push_str(&format!("; {} called {d}", names(rs)));
    }
    if !silent.is_empty() {
        text.push_str(&format!("; {} did not answer", names(&silent)));
    }
    text
}

fn broadcast_abort(
    done: &super::root::Done,
    ranks: &mut [Rank],
    kind: u8,
    text: &str,
    skip: Option<usize>,
) {
    // INFO: each rank reports the failure itself; this line would repeat it.
    info!("bootstrap root: aborting the job: {text}");
    let mut body = vec![kind];
    body.extend_from_slice(text.as_bytes());
    let f = frame(msg::ABORT, &body);
    for (r, rank) in ranks.iter_mut().enumerate() {
        if Some(r) != skip && !rank.gone {
            send(rank, &f);
        }
    }
    // Every live rank has been told; exiting need wait for none of them.
    super::root::set_aborted(done);
}

fn send(rank: &mut Rank, payload: &[u8]) {
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(payload);
    // Blocking write with the write timeout set at join: frames are small
    // and ranks read them promptly.
    let _ = rank.stream.set_nonblocking(false);
    if rank.stream.write_all(&buf).is_err() {
        rank.gone = true;
    }
    let _ = rank.stream.set_nonblocking(true);
}

/// Reads what is available; returns complete frames.
fn read_frames(rank: &mut Rank) -> Vec<Vec<u8>> {
    if rank.gone {
        return Vec::new();
    }
    let eof = rank.inbuf.fill(&mut rank.stream).unwrap_or(true);
    let mut frames = Vec::new();
    loop {
        match rank.inbuf.next_frame() {
            Ok(Some(f)) => frames.push(f),
            Ok(None) => break,
            Err(why) => {
                warn!(addr = %rank.addr, "bootstrap root: {why} from a rank; dropping it");
                rank.gone = true;
                break;
            }
        }
    }
    rank.gone |= eof;
    frames
}

fn wait_readable(ranks: &[Rank], timeout: Duration) {
    let mut fds: Vec<libc::pollfd> = ranks
        .iter()
        .filter(|r| !r.gone)
        .map(|r| libc::pollfd {
            fd: r.stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `fds` is a valid, initialised array of `fds.len()` pollfd
    // structs that outlives the call; the descriptors belong to live streams.
    unsafe {
        libc::poll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            timeout.as_millis() as libc::c_int,
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mismatch_message_names_ranks_and_calls() {
        let mut answers = BTreeMap::new();
        answers.insert(0, "broadcast(count=8, float, root=0)".to_string());
        answers.insert(1, "broadcast(count=8, float, root=0)".to_string());
        answers.insert(3, "all_reduce(count=1024, float, sum)".to_string());
        let q = Inquiry {
            seq: 57,
            started: Instant::now(),
            answers,
        };
        let text = describe_mismatch(&q, 4);
        assert!(
            text.contains("rank 3 called all_reduce(count=1024, float, sum) as operation #57"),
            "{text}"
        );
        assert!(text.contains("ranks [0, 1] called broadcast"), "{text}");
        assert!(text.contains("rank 2 did not answer"), "{text}");
    }
}
