//! RAS: a thread per process that watches the job, and a query port, as
//! NCCL's (2.24+). The processes of a job exchange their RAS addresses
//! through the bootstrap at each communicator's init, then send each other
//! a heartbeat carrying every local rank's progress
//! ([`crate::observe::progress`]). The first process on a host to bind
//! `NCCL_RAS_ADDR` (default `localhost:28028`) answers queries there, in
//! NCCL's text protocol (`STATUS`, `VERBOSE STATUS`, `SET FORMAT json`),
//! from the heartbeats it holds: a stopped process cannot answer, so it is
//! named from its silence and from the ranks that wait on it. `ncclras` is
//! the client. See `docs/ras.md`.

pub mod client;
pub mod report;
mod service;
pub mod wire;

use crate::bootstrap::{Bootstrap, UniqueId};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::observe::progress::Progress;
use std::sync::Arc;
use std::time::Duration;

/// NCCL's RAS client protocol version.
pub const CLIENT_PROTOCOL: u32 = 2;
/// NCCL's default client port.
pub const DEFAULT_PORT: u16 = 28028;

/// Timing of the RAS network, scaled by `NCCL_RAS_TIMEOUT_FACTOR`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Between two heartbeats to a peer.
    pub heartbeat: Duration,
    /// A peer silent this long is unresponsive.
    pub unresponsive: Duration,
    /// A peer silent this long is dead (NCCL's peer-dead timeout).
    pub dead: Duration,
    /// A rank waiting this long on one peer and step is stalled.
    pub stall: Duration,
    /// How long a query waits for the peer processes' telemetry.
    pub telemetry: Duration,
}

impl Timing {
    /// The timing for `factor`. Heartbeats carry the progress that queries
    /// report, so they are more frequent than NCCL's keep-alives (1 s): a
    /// stopped rank is named within about `unresponsive` of its stop.
    pub fn new(factor: u32) -> Timing {
        let f = factor.max(1);
        Timing {
            heartbeat: Duration::from_millis(100) * f,
            unresponsive: Duration::from_millis(1000) * f,
            dead: Duration::from_secs(60) * f,
            stall: Duration::from_millis(200) * f,
            telemetry: Duration::from_millis(500) * f,
        }
    }
}

/// A 64-bit identity of the communicator of `id`, the same on all ranks.
pub(crate) fn comm_id(id: &UniqueId) -> u64 {
    // FNV-1a over the id's bytes (its address and secret).
    id.to_bytes().iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// At a communicator's init, on every rank (one bootstrap all-gather): the
/// rank's progress record, listed for this process's RAS thread, which is
/// started on first use (`NCCL_RAS_ENABLE`) and told the other processes'
/// RAS addresses.
pub(crate) fn join(
    boot: &mut Bootstrap,
    id: &UniqueId,
    rank: usize,
    nranks: usize,
    config: &Config,
) -> Result<Arc<Progress>> {
    let progress = Progress::registered(comm_id(id), rank, nranks);
    let svc = match (config.ras_enable, boot.local_ip()) {
        (true, Some(ip)) => service::start(ip, config),
        _ => None,
    };
    let mine = svc
        .as_ref()
        .map(|s| s.addr().to_string())
        .unwrap_or_default();
    let all = boot
        .all_gather(mine.as_bytes())
        .map_err(|source| Error::Bootstrap { rank, source })?;
    if let Some(svc) = svc {
        let addrs = all
            .iter()
            .filter_map(|b| std::str::from_utf8(b).ok()?.parse().ok())
            .collect::<Vec<_>>();
        svc.add_peers(&addrs);
    }
    Ok(progress)
}
