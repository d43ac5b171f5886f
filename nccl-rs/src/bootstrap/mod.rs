//! Bootstrap: the 128-byte [`UniqueId`], rendezvous through the root, and the
//! out-of-band all-gather and barrier used during init.
//!
//! The id carries the root's address and a 16-byte secret. Every rank
//! proves it knows the secret in its hello; the root drops connections that
//! do not. This is authentication against strays, mistakes and strangers on
//! the network (a second job on the same port, a port scanner, a crafted
//! hello), not encryption: anyone who can read an id, the environment of a
//! rank, or the traffic, can join.
//!
//! Where the secret comes from:
//! - `ncclGetUniqueId` / [`UniqueId::new`]: random, passed inside the id.
//! - `NCCL_COMM_ID` or `MASTER_ADDR`/`MASTER_PORT` (no id is passed around):
//!   `NCCL_RS_JOB_SECRET` (32 hex digits, the same on every rank; `ncclrun`
//!   makes one per job), else all zeros. With all zeros anyone who reaches
//!   the port can send a well-formed hello. The root still bounds every count
//!   by the job size rank 0 gave, refuses hellos for another size, and
//!   refuses the whole job, naming both addresses, when a rank is claimed
//!   twice, so a stranger can make the job fail clearly but cannot crash
//!   rank 0, join it, or make it hang.

mod admission;
mod admission_script;
mod client;
mod monitor;
mod msg;
mod root;
mod wire;

pub(crate) use client::{Bootstrap, Event};

use crate::config::Config;
use crate::error::BootstrapError;
use std::net::{IpAddr, SocketAddr, TcpListener, ToSocketAddrs};

/// Size of NCCL's `ncclUniqueId`.
pub const UNIQUE_ID_BYTES: usize = 128;
const ID_MAGIC: &[u8; 4] = b"NCRS";

/// The rendezvous token: created by rank 0, passed to every rank.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId {
    addr: SocketAddr,
    secret: [u8; 16],
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId({})", self.addr)
    }
}

impl UniqueId {
    /// Creates an id and starts the bootstrap root in this process (call it
    /// on rank 0 only, as `ncclGetUniqueId`). The root listens on the
    /// interface chosen by `NCCL_SOCKET_IFNAME` / `NCCL_SOCKET_FAMILY`, or
    /// on `NCCL_COMM_ID` if set.
    pub fn new(config: &Config) -> Result<UniqueId, BootstrapError> {
        if let Some(comm_id) = &config.comm_id {
            let id = UniqueId::from_rendezvous(comm_id, config)?;
            id.start_root(config)?;
            return Ok(id);
        }
        let ip = local_ip(config)?;
        let listener =
            TcpListener::bind((ip, 0)).map_err(|e| io(format!("bind root on {ip}"), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| io("root address".into(), e))?;
        let mut secret = [0u8; 16];
        getrandom::getrandom(&mut secret)
            .map_err(|e| BootstrapError::BadId(format!("no randomness: {e}")))?;
        root::spawn(listener, secret, config.bootstrap_timeout, None)
            .map_err(|e| io("start root thread".into(), e))?;
        Ok(UniqueId { addr, secret })
    }

    /// An id for a root at a fixed `host:port` (no secret), as
    /// `NCCL_COMM_ID` or torchrun's `MASTER_ADDR`/`MASTER_PORT` give.
    pub fn from_addr_str(hostport: &str) -> Result<UniqueId, BootstrapError> {
        let addr = hostport
            .to_socket_addrs()
            .map_err(|e| BootstrapError::BadId(format!("{hostport:?}: {e}")))?
            .next()
            .ok_or_else(|| BootstrapError::BadId(format!("{hostport:?} resolves to nothing")))?;
        Ok(UniqueId {
            addr,
            secret: [0; 16],
        })
    }

    /// The id of a fixed rendezvous address (`NCCL_COMM_ID`,
    /// `MASTER_ADDR:MASTER_PORT`) with the job secret of `config`
    /// (`NCCL_RS_JOB_SECRET`; all zeros without it).
    pub fn from_rendezvous(hostport: &str, config: &Config) -> Result<UniqueId, BootstrapError> {
        let id = UniqueId::from_addr_str(hostport)?;
        Ok(UniqueId {
            secret: config.job_secret.unwrap_or([0; 16]),
            ..id
        })
    }

    /// Binds this id's address and starts the root there (rank 0 of a job
    /// started with a fixed root address). The job size is taken from the
    /// first rank of this process that joins; prefer
    /// [`UniqueId::start_root_for_job`] where the size is known.
    pub fn start_root(&self, config: &Config) -> Result<(), BootstrapError> {
        self.bind_root(config, None)
    }

    /// As [`UniqueId::start_root`] for a job of `nranks`: the root refuses
    /// every hello that claims another size from the start.
    pub fn start_root_for_job(&self, config: &Config, nranks: usize) -> Result<(), BootstrapError> {
        self.bind_root(config, Some(nranks))
    }

    fn bind_root(&self, config: &Config, nranks: Option<usize>) -> Result<(), BootstrapError> {
        let listener = TcpListener::bind(self.addr)
            .map_err(|e| io(format!("bind root on {}", self.addr), e))?;
        root::spawn(listener, self.secret, config.bootstrap_timeout, nranks)
            .map_err(|e| io("start root thread".into(), e))
    }

    /// The root's address.
    pub fn root_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The 128 bytes of NCCL's `ncclUniqueId`.
    pub fn to_bytes(&self) -> [u8; UNIQUE_ID_BYTES] {
        let mut b = [0u8; UNIQUE_ID_BYTES];
        b[..4].copy_from_slice(ID_MAGIC);
        b[4] = 1;
        b[6..8].copy_from_slice(&self.addr.port().to_be_bytes());
        match self.addr.ip() {
            IpAddr::V4(ip) => {
                b[5] = 4;
                b[8..12].copy_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                b[5] = 6;
                b[8..24].copy_from_slice(&ip.octets());
            }
        }
        b[24..40].copy_from_slice(&self.secret);
        b
    }

    /// Parses the bytes of [`UniqueId::to_bytes`].
    pub fn from_bytes(b: &[u8]) -> Result<UniqueId, BootstrapError> {
        let bad = |why: &str| BootstrapError::BadId(why.to_string());
        if b.len() != UNIQUE_ID_BYTES {
            return Err(bad(&format!(
                "{} bytes, expected {UNIQUE_ID_BYTES}",
                b.len()
            )));
        }
        if &b[..4] != ID_MAGIC || b[4] != 1 {
            return Err(bad("not an nccl-rs unique id (bad magic or version)"));
        }
        let port = u16::from_be_bytes([b[6], b[7]]);
        let ip = match b[5] {
            4 => IpAddr::from(<[u8; 4]>::try_from(&b[8..12]).expect("4 bytes")),
            6 => IpAddr::from(<[u8; 16]>::try_from(&b[8..24]).expect("16 bytes")),
            f => return Err(bad(&format!("unknown address family {f}"))),
        };
        Ok(UniqueId {
            addr: SocketAddr::new(ip, port),
            secret: b[24..40].try_into().expect("16 bytes"),
        })
    }

    /// Hex text of the bytes, for passing an id through the environment.
    pub fn to_hex(&self) -> String {
        self.to_bytes()[..40]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Parses [`UniqueId::to_hex`].
    pub fn from_hex(s: &str) -> Result<UniqueId, BootstrapError> {
        let bytes: Option<Vec<u8>> = (0..s.len() / 2)
            .map(|i| u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok())
            .collect();
        let mut b = bytes
            .filter(|b| b.len() == 40 && s.len() == 80)
            .ok_or_else(|| BootstrapError::BadId("bad hex id".into()))?;
        b.resize(UNIQUE_ID_BYTES, 0);
        UniqueId::from_bytes(&b)
    }
}

/// Fuzzing: drives the root's admission with a script of events.
pub(crate) fn fuzz_admission(data: &[u8]) {
    admission_script::run(data);
}

/// Fuzzing: decodes a hello.
pub(crate) fn fuzz_hello(data: &[u8]) -> Result<(), String> {
    wire::Hello::decode(data).map(|_| ())
}

/// Fuzzing: splits `data` into frames and decodes each like the peers do.
pub(crate) fn fuzz_frames(data: &[u8]) {
    let mut buf = wire::FrameBuf::default();
    let mut input = data;
    let _ = buf.fill(&mut input);
    while let Ok(Some(f)) = buf.next_frame() {
        let body = &f[1..];
        let _ = wire::decode_gather(body);
        let _ = msg::parse_seq(body);
    }
}

pub(crate) fn io(what: String, source: std::io::Error) -> BootstrapError {
    BootstrapError::Io { what, source }
}

/// The local address chosen by the interface rules.
pub(crate) fn local_ip(config: &Config) -> Result<IpAddr, BootstrapError> {
    transport_tcp::TcpNet::new(crate::comm::tcp_options(config))
        .map(|n| n.local_ip())
        .map_err(|e| BootstrapError::BadId(format!("no usable network interface: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_id_round_trips() {
        let id = UniqueId {
            addr: "10.1.2.3:4567".parse().unwrap(),
            secret: [9; 16],
        };
        assert_eq!(UniqueId::from_bytes(&id.to_bytes()).unwrap(), id);
        assert_eq!(UniqueId::from_hex(&id.to_hex()).unwrap(), id);
        let v6 = UniqueId {
            addr: "[fd00::1]:80".parse().unwrap(),
            secret: [1; 16],
        };
        assert_eq!(UniqueId::from_bytes(&v6.to_bytes()).unwrap(), v6);
        assert!(UniqueId::from_bytes(&[0u8; 128]).is_err());
        assert!(UniqueId::from_bytes(&[0u8; 12]).is_err());
        assert!(UniqueId::from_hex("zz").is_err());
    }
}
