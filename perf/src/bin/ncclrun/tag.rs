//! `--tag-output`: every line a rank writes goes to ncclrun's stdout or
//! stderr prefixed, as Open MPI's `mpirun --tag-output` does, with
//! `[1,RANK]<stdout>:` or `[1,RANK]<stderr>:`. One thread per pipe reads
//! whole lines and writes each with one `write_all` under the stream's
//! lock, so lines of different ranks never mix mid-line.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::Child;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The longest piece of a line written at once: a longer line is cut into
/// several tagged lines, so that a rank writing no newline cannot make
/// ncclrun buffer without bound.
const MAX_LINE: u64 = 64 << 10;

/// The `[1,RANK]<stdout>:` prefix.
pub(crate) fn prefix(rank: usize, stderr: bool) -> String {
    format!("[1,{rank}]<{}>:", if stderr { "stderr" } else { "stdout" })
}

/// Reads `src` line by line and hands `emit` each line with `prefix` in
/// front; a last line without a newline gets one.
fn tag_lines(src: impl Read, prefix: &[u8], mut emit: impl FnMut(&[u8])) {
    let mut src = BufReader::new(src);
    let mut line = Vec::new();
    loop {
        line.clear();
        line.extend_from_slice(prefix);
        match (&mut src).take(MAX_LINE).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        emit(&line);
    }
}

/// Copies `src` to ncclrun's stdout (or stderr), each line tagged and
/// written at once under the stream's lock.
fn pump(src: impl Read, prefix: &[u8], to_stderr: bool) {
    // A closed stdout (ncclrun | head) must not stop the draining: the
    // rank would block on a full pipe.
    tag_lines(src, prefix, |line| {
        if to_stderr {
            let _ = std::io::stderr().lock().write_all(line);
        } else {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(line).and_then(|()| out.flush());
        }
    });
}

/// The reader threads of every tagged rank.
pub(crate) struct Tagger {
    done_tx: mpsc::Sender<(usize, bool)>,
    done: mpsc::Receiver<(usize, bool)>,
    /// (rank, stderr) of each pipe still being read.
    open: Vec<(usize, bool)>,
}

impl Tagger {
    pub(crate) fn new() -> Tagger {
        let (done_tx, done) = mpsc::channel();
        Tagger {
            done_tx,
            done,
            open: Vec::new(),
        }
    }

    /// Starts reading `child`'s piped stdout and stderr as rank `rank`'s.
    pub(crate) fn attach(&mut self, rank: usize, child: &mut Child) {
        let out = child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>);
        let err = child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>);
        for (pipe, to_stderr) in [(out, false), (err, true)] {
            let Some(pipe) = pipe else { continue };
            let tx = self.done_tx.clone();
            let p = prefix(rank, to_stderr);
            let spawned = std::thread::Builder::new()
                .name(format!("tag-{rank}"))
                .spawn(move || {
                    pump(pipe, p.as_bytes(), to_stderr);
                    let _ = tx.send((rank, to_stderr));
                });
            match spawned {
                Ok(_) => self.open.push((rank, to_stderr)),
                Err(e) => eprintln!("ncclrun: cannot read rank {rank}'s output: {e}"),
            }
        }
    }

    /// Waits at most `limit` (after every rank was reaped) for the readers
    /// to reach the end of their pipes. A pipe stays open past its rank
    /// while a process the rank left behind holds it: ncclrun then says so
    /// and goes on (the thread ends with ncclrun).
    pub(crate) fn drain(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !self.open.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.done.recv_timeout(left) {
                Ok(p) => self.open.retain(|o| *o != p),
                Err(_) => break,
            }
        }
        if !self.open.is_empty() {
            let mut ranks: Vec<usize> = self.open.iter().map(|(r, _)| *r).collect();
            ranks.sort_unstable();
            ranks.dedup();
            let list: Vec<String> = ranks.iter().map(usize::to_string).collect();
            eprintln!(
                "ncclrun: output of rank(s) {} still open {limit:?} after they ended \
                 (a process they left behind?); not waiting for it",
                list.join(", ")
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        assert_eq!(prefix(0, false), "[1,0]<stdout>:");
        assert_eq!(prefix(12, true), "[1,12]<stderr>:");
    }

    fn tagged(input: &[u8]) -> Vec<Vec<u8>> {
        let mut lines = Vec::new();
        tag_lines(input, b"[1,3]<stdout>:", |l| lines.push(l.to_vec()));
        lines
    }

    #[test]
    fn lines() {
        assert_eq!(
            tagged(b"a\n\nb c\nlast"),
            [
                &b"[1,3]<stdout>:a\n"[..],
                b"[1,3]<stdout>:\n",
                b"[1,3]<stdout>:b c\n",
                b"[1,3]<stdout>:last\n"
            ]
        );
        assert!(tagged(b"").is_empty());
        // Bytes as they are, not text.
        assert_eq!(tagged(b"\xff\r\n"), [&b"[1,3]<stdout>:\xff\r\n"[..]]);
        // A line longer than MAX_LINE comes out in tagged pieces.
        let long = vec![b'x'; MAX_LINE as usize * 2 + 5];
        let got = tagged(&long);
        assert_eq!(got.len(), 3);
        let pieces: usize = got.iter().map(|l| l.len() - 15).sum();
        assert_eq!(pieces, long.len());
    }
}
