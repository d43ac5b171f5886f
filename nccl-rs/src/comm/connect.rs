//! Connection setup: ranks exchange host records (the topology), pick a transport per
//! peer (shared memory between ranks of one host, the network otherwise),
//! listen once per peer, pass the handles through the bootstrap all-gather,
//! then poll all connects and accepts together until the full mesh is up or
//! the deadline passes.

use crate::bootstrap::Bootstrap;
use crate::config::Config;
use crate::error::{BootstrapError, Error, Result};
use crate::plan::Topology;
use crate::topo::{Fabric, HostRecord, SwitchTree};
use crate::transport::{Connector, Listener, Net, RecvComm, SendComm, MAX_HANDLE_BYTES};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Mesh = (
    Vec<Option<Box<dyn SendComm>>>,
    Vec<Option<Box<dyn RecvComm>>>,
);

const SLOT: usize = 1 + MAX_HANDLE_BYTES;

/// Exchanges every rank's [`HostRecord`] and builds the same [`Fabric`]
/// on every rank, with the switch tree of `NCCL_RS_TOPO_FILE`. A rank whose
/// file does not load sends its error instead of its record, so that every
/// rank fails init with it rather than waiting for that rank. Rank 0 logs
/// the summary (and the hosts the file does not name) and writes
/// `NCCL_TOPO_DUMP_FILE`.
///
/// When `net` is the verbs transport, the record's NICs are its rails (the
/// RDMA ports `NCCL_IB_HCA` selects, in rail order) rather than the
/// interfaces `NCCL_SOCKET_IFNAME` selects.
pub(crate) fn exchange_topology(
    boot: &mut Bootstrap,
    rank: usize,
    config: &Config,
    net: &dyn Net,
) -> Result<Fabric> {
    let mut record = HostRecord::detect(
        config.host_id.as_deref(),
        config.socket_ifname.as_deref(),
        config.socket_family,
    );
    if net.properties().name == "IB" {
        match transport_verbs::rail_summaries(&config.ib) {
            Ok(rails) => record = record.with_verbs_rails(&rails),
            Err(e) => tracing::warn!(rank, "topology: keeping the interfaces as NICs: {e}"),
        }
    }
    let tree = config
        .topo_file
        .as_deref()
        .map(|p| SwitchTree::load(std::path::Path::new(p)))
        .transpose();
    let me = match &tree {
        Ok(_) => [&[0u8][..], &record.encode()].concat(),
        Err(e) => [&[1u8][..], e.as_bytes()].concat(),
    };
    let all = boot
        .all_gather(&me)
        .map_err(|source| Error::Bootstrap { rank, source })?;
    let tree =
        tree.map_err(|e| Error::InvalidArgument(format!("rank {rank}: NCCL_RS_TOPO_FILE: {e}")))?;
    let mut records = Vec::with_capacity(all.len());
    for (p, bytes) in all.iter().enumerate() {
        match bytes.split_first() {
            Some((0, rec)) => {
                records.push(HostRecord::decode(rec).map_err(|e| Error::Bootstrap {
                    rank,
                    source: BootstrapError::Protocol(format!("rank {p}: {e}")),
                })?)
            }
            Some((1, msg)) => {
                return Err(Error::InvalidArgument(format!(
                    "rank {rank}: rank {p} failed with NCCL_RS_TOPO_FILE: {}",
                    String::from_utf8_lossy(msg)
                )))
            }
            _ => {
                return Err(Error::Bootstrap {
                    rank,
                    source: BootstrapError::Protocol(format!("rank {p} sent no host record")),
                })
            }
        }
    }
    let fabric = Fabric::build(&records, tree.as_ref(), &config.topo_oversub);
    if rank == 0 {
        let unplaced = fabric.unplaced_hosts();
        if !unplaced.is_empty() {
            tracing::warn!(
                rank,
                "NCCL_RS_TOPO_FILE names no leaf switch for hosts {unplaced:?}: each is its own leaf"
            );
        }
        tracing::info!(rank, "{}", fabric.summary());
        if let Some(path) = &config.topo_dump_file {
            match crate::topo::write_dump(&fabric, std::path::Path::new(path)) {
                Ok(()) => tracing::info!(rank, "topology written to {path}"),
                Err(e) => tracing::warn!(rank, "NCCL_TOPO_DUMP_FILE={path}: {e}"),
            }
        }
    }
    Ok(fabric)
}

/// The ranks (bit `r` for rank `r`, ranks 0-63) on this host bound to the
/// same single CPU as this rank (`local[r]`: rank `r` shares this host).
pub(crate) fn sharing_cpu(boot: &mut Bootstrap, rank: usize, local: &[bool]) -> Result<u64> {
    let me = crate::transport::shm::bound_cpu().map_or(u32::MAX, |c| c);
    let all = boot
        .all_gather(&me.to_le_bytes())
        .map_err(|source| Error::Bootstrap { rank, source })?;
    let mut mask = 0u64;
    for (r, b) in all.iter().enumerate().take(64) {
        let theirs = b
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes);
        if r != rank && local.get(r) == Some(&true) && me != u32::MAX && theirs == Some(me) {
            mask |= 1 << r;
        }
    }
    Ok(mask)
}

/// Exchanges every rank's topology facts; `single_copy` stays set only if
/// it is set on every rank and all ranks' facts are equal (so that all
/// ranks cut all-to-all messages alike, and a broadcast root sends
/// single-copy only to receivers that split it). Everyone contributes
/// before anyone returns, so it is also a barrier.
pub(crate) fn agree_topology(
    boot: &mut Bootstrap,
    rank: usize,
    mine: Topology,
) -> Result<Topology> {
    let encode = |t: &Topology| {
        let mut b = vec![
            u8::from(t.single_copy),
            u8::from(t.oversubscribed),
            t.placement as u8,
        ];
        b.extend_from_slice(&(t.single_copy_max as u64).to_le_bytes());
        b.extend_from_slice(&(t.stream_from as u64).to_le_bytes());
        b
    };
    let me = encode(&mine);
    let all = boot
        .all_gather(&me)
        .map_err(|source| Error::Bootstrap { rank, source })?;
    let single_copy = mine.single_copy && all.iter().all(|b| *b == me);
    Ok(Topology {
        single_copy,
        ..mine
    })
}

/// Connects `rank` to every other rank, through `net(peer)`.
pub(crate) fn connect_mesh(
    net: &dyn Fn(usize) -> Arc<dyn Net>,
    boot: &mut Bootstrap,
    rank: usize,
    n: usize,
    timeout: Duration,
) -> Result<Mesh> {
    let transport = |peer: usize, op: &str| {
        let op = op.to_string();
        move |source| Error::Transport {
            rank,
            peer,
            op,
            source,
        }
    };
    let mut listeners: Vec<Option<Box<dyn Listener>>> = Vec::with_capacity(n);
    let mut table = vec![0u8; n * SLOT];
    for p in 0..n {
        if p == rank {
            listeners.push(None);
            continue;
        }
        let l = net(p).listen().map_err(transport(p, "listen"))?;
        let h = l.handle();
        if h.len() > MAX_HANDLE_BYTES {
            return Err(Error::Internal {
                rank,
                msg: format!("transport handle of {} bytes", h.len()),
            });
        }
        table[p * SLOT] = h.len() as u8;
        table[p * SLOT + 1..p * SLOT + 1 + h.len()].copy_from_slice(h);
        listeners.push(Some(l));
    }
    let all = boot
        .all_gather(&table)
        .map_err(|source| Error::Bootstrap { rank, source })?;
    let mut connectors: Vec<Option<Box<dyn Connector>>> = Vec::with_capacity(n);
    for (p, theirs) in all.iter().enumerate() {
        if p == rank {
            connectors.push(None);
            continue;
        }
        let entry = theirs
            .get(rank * SLOT..(rank + 1) * SLOT)
            .ok_or_else(|| Error::Internal {
                rank,
                msg: format!("rank {p} sent a handle table of {} bytes", theirs.len()),
            })?;
        let len = (entry[0] as usize).min(MAX_HANDLE_BYTES);
        connectors.push(Some(
            net(p)
                .connect(&entry[1..1 + len])
                .map_err(transport(p, "connect"))?,
        ));
    }
    let mut send: Vec<Option<Box<dyn SendComm>>> = (0..n).map(|_| None).collect();
    let mut recv: Vec<Option<Box<dyn RecvComm>>> = (0..n).map(|_| None).collect();
    let deadline = Instant::now() + timeout;
    loop {
        let mut missing = Vec::new();
        for p in (0..n).filter(|&p| p != rank) {
            if send[p].is_none() {
                let c = connectors[p].as_mut().expect("one connector per peer");
                send[p] = c.poll_connect().map_err(transport(p, "connect"))?;
            }
            if recv[p].is_none() {
                let l = listeners[p].as_mut().expect("one listener per peer");
                recv[p] = l.accept().map_err(transport(p, "accept"))?;
            }
            if send[p].is_none() || recv[p].is_none() {
                missing.push(p);
            }
        }
        if missing.is_empty() {
            // One INFO line per peer, as NCCL's connection lines: which
            // transport carries this pair (both directions use the same).
            for p in (0..n).filter(|&p| p != rank) {
                tracing::info!(rank, "Connected rank {rank} <-> {p} via {}", via(&*net(p)));
            }
            return Ok((send, recv));
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout {
                rank,
                op: "connection setup".into(),
                after: timeout,
                waiting_for: format!("connections with ranks {missing:?}"),
            });
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// How a connection line names a transport: `SHM`, or `NET/<name>` for a
/// network (`NET/Socket`, `NET/IB`), as NCCL's do.
fn via(net: &dyn Net) -> String {
    match net.properties().name.as_str() {
        "SHM" => "SHM".to_string(),
        other => format!("NET/{other}"),
    }
}
