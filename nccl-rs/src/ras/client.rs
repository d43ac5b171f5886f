//! The client side of the query port (what `ncclras` does): NCCL's text
//! protocol, a deadline on every step.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Connects to the RAS query port at `addr` (`host:port`), asks for the
/// status (`verbose`: with every rank; `json`: the JSON form) and returns
/// the answer. Fails with a message when nothing answers in `timeout`.
pub fn query(addr: &str, verbose: bool, json: bool, timeout: Duration) -> Result<String, String> {
    let deadline = Instant::now() + timeout;
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let targets: Vec<_> = addr
        .to_socket_addrs()
        .map_err(|e| format!("resolving {addr}: {e}"))?
        .collect();
    let mut last = format!("{addr} resolves to nothing");
    let mut stream = None;
    for a in targets {
        match TcpStream::connect_timeout(&a, left()) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = format!("connecting to {a}: {e}"),
        }
    }
    let stream = stream.ok_or_else(|| {
        format!(
            "{last}\nno RAS service answers at {addr}: is a job running on this host with \
             NCCL_RAS_ENABLE=1, and does the address match its NCCL_RAS_ADDR?"
        )
    })?;
    let io = |what: &str, e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            format!("{what}: no answer from {addr} within {timeout:?}")
        }
        _ => format!("{what}: {e}"),
    };
    let mut w = stream.try_clone().map_err(|e| io("socket", e))?;
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    let mut ask = |cmd: &str, r: &mut BufReader<TcpStream>| -> Result<String, String> {
        r.get_ref()
            .set_read_timeout(Some(left()))
            .map_err(|e| io("socket", e))?;
        w.set_write_timeout(Some(left()))
            .map_err(|e| io("socket", e))?;
        w.write_all(format!("{cmd}\n").as_bytes())
            .map_err(|e| io(cmd, e))?;
        line.clear();
        r.read_line(&mut line).map_err(|e| io(cmd, e))?;
        Ok(line.trim_end().to_string())
    };
    let hello = ask(
        &format!("CLIENT PROTOCOL {}", super::CLIENT_PROTOCOL),
        &mut r,
    )?;
    if !hello.to_ascii_uppercase().starts_with("SERVER PROTOCOL ") {
        return Err(format!("unexpected answer from {addr}: {hello:?}"));
    }
    if json {
        let ok = ask("SET FORMAT json", &mut r)?;
        if !ok.eq_ignore_ascii_case("OK") {
            return Err(format!("{addr} refused JSON: {ok:?}"));
        }
    }
    let cmd = if verbose { "VERBOSE STATUS" } else { "STATUS" };
    r.get_ref()
        .set_read_timeout(Some(left()))
        .map_err(|e| io("socket", e))?;
    let mut w = r.get_ref().try_clone().map_err(|e| io("socket", e))?;
    w.write_all(format!("{cmd}\n").as_bytes())
        .map_err(|e| io(cmd, e))?;
    let mut out = String::new();
    r.take(64 << 20)
        .read_to_string(&mut out)
        .map_err(|e| io(cmd, e))?;
    Ok(out)
}
