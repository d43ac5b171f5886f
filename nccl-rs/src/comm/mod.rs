//! The [`Communicator`]: init, identity, and the one path every operation
//! takes into the engine. The typed collectives are in `collectives.rs`,
//! grouped send/recv in `group.rs`.

mod collectives;
mod connect;
mod core;
mod group;
mod nonblocking;
mod placement;
pub mod raw;
mod split;
mod staging;
mod zero_copy;

pub use crate::engine::AbortHandle;
pub use group::P2pGroup;
pub use nonblocking::AsyncOp;

use crate::bootstrap::{Bootstrap, UniqueId};

use crate::config::Config;
use crate::datatype::{DataType, RedOp};
use crate::engine::{AbortHandle as Abort, CallBufs, Engine};
use crate::error::{BootstrapError, Error, Result};
use crate::launch::LaunchEnv;
use crate::plan::{Coll, Planner};
use crate::plan::{Placement, PlacementMode, Topology};
use crate::topo::Fabric;
use crate::transport::shm::{ShmNet, ShmOptions};
use crate::transport::Net;
use core::Core;
use nonblocking::AsyncQueue;
use std::sync::{Arc, Mutex, MutexGuard};
use tracing::info;

/// Tag of grouped send/recv messages; collectives use their sequence number
/// (below `P2P_TAG`).
const P2P_TAG: u32 = 0x8000_0000;

/// A group of ranks that run collectives together.
pub struct Communicator {
    rank: usize,
    nranks: usize,
    core: Arc<Mutex<Core>>,
    queue: AsyncQueue,
    abort: Abort,
    transport: String,
    net: Arc<dyn Net>,
    config: Config,
    fabric: Arc<Fabric>,
    /// Telemetry in the process's live set and Prometheus file; last, so
    /// that its final write follows the async operations' end.
    telemetry: crate::observe::prom::Registration,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .field("transport", &self.transport)
            .finish()
    }
}

/// TCP transport options from the configuration.
pub(crate) fn tcp_options(config: &Config) -> transport_tcp::TcpOptions {
    transport_tcp::TcpOptions {
        ifname: config.socket_ifname.clone(),
        family: config.socket_family,
        socket_buf_bytes: config.socket_buf_bytes,
        // As NCCL, at most MAX_SOCKS (64) sockets in all.
        nsocks: (config.nsocks_perthread * config.socket_nthreads).min(transport_tcp::MAX_SOCKS),
        nthreads: config.socket_nthreads,
        nsocks_by_link: config.nsocks_by_link,
        splice_min_bytes: config.socket_splice_min_bytes,
        splice_max_bytes: config.socket_splice_max_bytes,
        cross_nic: config.cross_nic,
    }
}

/// Slots of each shared-memory ring when `local_ranks` ranks share the
/// host: a rank's `local_ranks - 1` incoming rings share its
/// `NCCL_BUFFSIZE` (`steps` slots), at least 2 slots each, so the rings of
/// many local ranks stay in cache. Smaller rings cost nothing per step (the
/// chunk size stays the same), while rings that overflow the cache slow
/// all-to-all and all-gather most.
fn shm_ring_slots(steps: usize, local_ranks: usize) -> usize {
    if steps <= 2 {
        return steps;
    }
    (steps / local_ranks.saturating_sub(1).max(1)).max(2)
}

#[cfg(test)]
#[test]
fn shm_rings_share_a_ranks_buffer() {
    let slots = |n| shm_ring_slots(8, n);
    assert_eq!(
        [slots(2), slots(3), slots(4), slots(5), slots(9)],
        [8, 4, 2, 2, 2]
    );
    assert_eq!(shm_ring_slots(2, 8), 2);
    assert_eq!(shm_ring_slots(1, 3), 1);
}

impl Communicator {
    /// Joins the job described by `id` as `rank` of `nranks`, over the
    /// network transport chosen by [`choose_net`] (verbs if a device is
    /// usable, else TCP). Blocks until every rank joined and all connections
    /// are up, or `NCCL_RS_BOOTSTRAP_TIMEOUT` passes.
    pub fn init(
        id: &UniqueId,
        nranks: usize,
        rank: usize,
        config: &Config,
    ) -> Result<Communicator> {
        check_rank(nranks, rank)?;
        let net = choose_net(config, rank)?;
        Communicator::init_with_net(id, nranks, rank, config, net)
    }

    /// As [`Communicator::init`], over the given transport.
    pub fn init_with_net(
        id: &UniqueId,
        nranks: usize,
        rank: usize,
        config: &Config,
        net: Arc<dyn Net>,
    ) -> Result<Communicator> {
        check_rank(nranks, rank)?;
        crate::logging::set_process_rank(rank);
        let mut boot = Bootstrap::connect(id, rank, nranks, config.bootstrap_timeout)
            .map_err(|source| Error::Bootstrap { rank, source })?;
        let fabric = Arc::new(connect::exchange_topology(&mut boot, rank, config, &*net)?);
        let local: Vec<bool> = (0..nranks).map(|p| fabric.same_host(rank, p)).collect();
        let sharing_cpu = connect::sharing_cpu(&mut boot, rank, &local)?;
        tracing::debug!(rank, sharing_cpu, "ranks bound to this rank's CPU");
        let local_ranks = local.iter().filter(|&&l| l).count();
        let cpus = crate::transport::shm::online_cpus();
        // Every rank on this host, more of them than CPUs: smaller staging
        // (see `OVERSUBSCRIBED_BUFFSIZE`). The same on every rank.
        let slot_bytes =
            config.slot_bytes_for(!config.shm_disable && local_ranks == nranks && nranks > cpus);
        let shm = if config.shm_disable
            || nranks == 1
            || !local.iter().enumerate().any(|(p, l)| *l && p != rank)
        {
            None
        } else {
            let slots = shm_ring_slots(config.steps, local_ranks);
            let opts = ShmOptions {
                buffsize: slot_bytes * slots,
                slots,
                cma: config.shm_use_cma,
                cma_min_bytes: config.shm_cma_min_bytes,
                ..ShmOptions::default()
            };
            match ShmNet::new(opts) {
                Ok(s) => Some(Arc::new(s) as Arc<dyn Net>),
                Err(e) => {
                    tracing::warn!(
                        rank,
                        "shared memory unavailable ({e}); using {} for local peers",
                        net.properties().name
                    );
                    None
                }
            }
        };
        let pick = |p: usize| match &shm {
            Some(s) if local[p] => s.clone(),
            _ => net.clone(),
        };
        let (send, recv) =
            connect::connect_mesh(&pick, &mut boot, rank, nranks, config.bootstrap_timeout)?;
        let remote = (0..nranks).any(|p| p != rank && !(local[p] && shm.is_some()));
        let oversubscribed = local_ranks > cpus;
        let mine = Topology {
            nranks,
            rank,
            single_copy: !remote && config.shm_use_cma,
            oversubscribed,
            sockets: false,
            single_copy_max: config.shm_cma_max_bytes,
            stream_from: config
                .shm_stream_bytes
                .unwrap_or_else(crate::reduce::stream_output_min),
            chunk_bytes: slot_bytes,
            sharing_cpu,
            // Without a measurement, ranks on their own CPUs of one host
            // share its last-level cache (one socket); ranks sharing CPUs
            // have no placement to follow.
            placement: match (config.placement, oversubscribed) {
                (PlacementMode::Fixed(p), _) => p,
                (PlacementMode::Adaptive, false) => Placement::Near,
                (PlacementMode::Adaptive, true) => Placement::Unknown,
            },
        };
        // Also the barrier after connecting: every rank contributes.
        let topo = connect::agree_topology(&mut boot, rank, mine)?;
        let props = match (&shm, remote) {
            (Some(shm), false) => shm.properties(),
            _ => net.properties(),
        };
        let mut engine = Engine::new(
            rank,
            nranks,
            send,
            recv,
            slot_bytes,
            config.steps,
            config.timeout,
        );
        engine.oversubscribed = oversubscribed;
        let comm_id = crate::observe::telemetry::comm_id(&id.to_bytes());
        engine.telemetry = Arc::new(crate::observe::telemetry::Telemetry::new(
            comm_id, rank, nranks,
        ));
        engine.telemetry.set_links(engine.link_probes());
        if shm.is_some() && config.shm_use_cma && local_ranks > cpus && rank == 0 {
            info!(
                local_ranks,
                cpus, "SHM: more local ranks than CPUs; single copy for all-to-all and one-hop all-gather only"
            );
        }
        let abort = engine.abort.clone();
        let mut planner =
            Planner::new(&props.name, config.algo.as_deref(), config.proto.as_deref())
                .map_err(|e| Error::InvalidArgument(format!("rank {rank}: {e}")))?;
        if config.ring_by_topology {
            // Every rank built the same fabric from the same records.
            if let Some(ring) = crate::schedule::RingOrder::new(fabric.ring_order()) {
                planner = planner.with_ring(ring);
            }
        }
        {
            let net_model = crate::plan::Model::for_transport(&net.properties().name);
            let intra = match &shm {
                Some(s) => crate::plan::Model::for_transport(&s.properties().name),
                None => net_model,
            };
            if let Some(hosts) = crate::plan::HostLayout::of(&fabric, intra, net_model) {
                planner = planner.with_hosts(hosts);
            }
            if fabric.nhosts() > 1 {
                planner = planner.across_hosts(nranks);
            }
        }
        let topo = Topology {
            sockets: props.name == "Socket",
            ..topo
        };
        let mut core = Core::new(
            rank,
            nranks,
            engine,
            boot,
            planner,
            topo,
            config.placement.source(),
        );
        core.progress = crate::ras::join(&mut core.boot, id, rank, nranks, config)?;
        core.profiler = crate::profiler::CommProfiler::init(
            config.profiler_plugin.as_deref(),
            crate::profiler::comm_hash(&id.to_bytes()),
            fabric.nhosts(),
            (nranks, rank),
            (0..nranks)
                .map(|p| p != rank && !(local[p] && shm.is_some()))
                .collect(),
        );
        if config.local_register && !remote && shm.is_some() {
            core.zero_copy = Some(zero_copy::ZeroCopy::new(config.zero_copy_min_bytes));
        }
        // Registered once init can no longer fail.
        let telemetry = crate::observe::prom::Registration::new(
            core.engine.telemetry.clone(),
            config.prom_file.as_deref(),
            config.prom_interval,
        );
        let core = Arc::new(Mutex::new(core));
        if rank == 0 {
            info!(nranks, transport = %props.name, "communicator ready");
        }
        Ok(Communicator {
            rank,
            nranks,
            queue: AsyncQueue::new(core.clone()),
            core,
            abort,
            transport: props.name,
            net,
            config: config.clone(),
            fabric,
            telemetry,
        })
    }

    /// Joins the job a launcher described in the environment (torchrun,
    /// Open MPI, PMI, Slurm; see [`LaunchEnv`]). The root address comes from
    /// `NCCL_COMM_ID` or `MASTER_ADDR`/`MASTER_PORT`; rank 0 starts the root
    /// there.
    pub fn init_from_env(config: &Config) -> Result<Communicator> {
        let env = LaunchEnv::detect().ok_or_else(|| {
            Error::invalid("no launcher environment found (RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, PMI_*, SLURM_*)")
        })?;
        let root = env.root.clone().ok_or_else(|| {
            Error::invalid(format!(
                "{} gave rank and size but no root: set NCCL_COMM_ID or MASTER_ADDR/MASTER_PORT",
                env.source
            ))
        })?;
        let bad = |source: BootstrapError| Error::Bootstrap {
            rank: env.rank,
            source,
        };
        let id = UniqueId::from_rendezvous(&root, config).map_err(bad)?;
        if env.rank == 0 {
            id.start_root_for_job(config, env.size).map_err(bad)?;
        }
        Communicator::init(&id, env.size, env.rank, config)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.nranks
    }

    /// The name of the data transport (`"Socket"`, `"Mem"`).
    pub fn transport_name(&self) -> &str {
        &self.transport
    }

    /// The hosts, rails and switches of this communicator's ranks.
    pub fn fabric(&self) -> &Fabric {
        &self.fabric
    }

    /// The network transport's capabilities (the transport used between
    /// hosts; shared memory between local ranks is not it): e.g. whether it
    /// can register device memory (`ptr_support`).
    pub fn net_properties(&self) -> nccl_net::Properties {
        self.net.properties()
    }

    /// A handle that aborts this communicator's operations from any thread
    /// (`ncclCommAbort`). After an abort the communicator only drops.
    pub fn abort_handle(&self) -> AbortHandle {
        self.abort.clone()
    }

    /// This rank's telemetry of this communicator since its creation or
    /// the last [`Communicator::reset_stats`]: bytes, messages, waits and
    /// errors per peer, latencies per collective kind (see
    /// [`crate::observe::telemetry`]). Cheap: no lock the operations take.
    pub fn stats(&self) -> crate::observe::telemetry::CommStats {
        self.telemetry.telemetry().stats()
    }

    /// Makes [`Communicator::stats`] count from now on (the Prometheus
    /// file's counters keep counting up).
    pub fn reset_stats(&self) {
        self.telemetry.telemetry().reset();
    }

    /// The first error this communicator hit, if any (`ncclCommGetAsyncError`).
    pub fn failure(&self) -> Option<String> {
        self.lock_core().failed.clone()
    }

    /// Locks the shared core (never poisoned in practice: the core does not
    /// panic; if it did, the state is still consistent enough to report).
    fn lock_core(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for queued async operations (issue order), then locks the core.
    /// Waits until every rank has finished all its operations (an
    /// out-of-band barrier through the bootstrap, under
    /// `NCCL_RS_BOOTSTRAP_TIMEOUT`), as `ncclCommFinalize`: call it before
    /// dropping the communicator, so that no rank tears its connections down
    /// while a peer still waits for the acknowledgement of its last transfer
    /// (seen over a lossy RDMA link: the receiver had the data and left, the
    /// lost ACK could no longer be retransmitted).
    pub fn finalize(&mut self) -> Result<()> {
        let rank = self.rank;
        let mut core = self.idle_core()?;
        core.boot
            .barrier()
            .map_err(|source| Error::Bootstrap { rank, source })
    }

    fn idle_core(&mut self) -> Result<MutexGuard<'_, Core>> {
        self.queue.drain();
        let core = self.lock_core();
        core.check_usable()?;
        Ok(core)
    }

    fn check_root(&self, what: &str, root: usize) -> Result<()> {
        if root >= self.nranks {
            return Err(Error::invalid(format!(
                "{what}: root {root} is not a rank of {} ranks",
                self.nranks
            )));
        }
        Ok(())
    }

    /// Plans and runs one collective on raw buffers, after the async
    /// operations issued before it.
    fn collective(&mut self, coll: Coll, dtype: DataType, op: RedOp, bufs: CallBufs) -> Result<()> {
        self.idle_core()?.collective(coll, dtype, op, bufs)
    }
}

/// The network transport: `NCCL_NET=IB` requires verbs, `NCCL_NET=Socket` or
/// `NCCL_IB_DISABLE=1` selects TCP, and otherwise verbs is tried (libibverbs
/// loaded at run time) and TCP used, with an INFO line, if it is absent.
pub fn choose_net(config: &Config, rank: usize) -> Result<Arc<dyn Net>> {
    let want = config.net.as_deref().map(str::to_ascii_lowercase);
    let tcp = || -> Result<Arc<dyn Net>> {
        let net =
            transport_tcp::TcpNet::new(tcp_options(config)).map_err(|source| Error::Transport {
                rank,
                peer: rank,
                op: "choosing a network interface".into(),
                source,
            })?;
        Ok(Arc::new(net))
    };
    match want.as_deref() {
        None | Some("ib") | Some("socket") => {}
        Some(other) => {
            return Err(Error::InvalidArgument(format!(
                "NCCL_NET={other:?}: expected IB or Socket"
            )));
        }
    }
    if config.ib_disable || want.as_deref() == Some("socket") {
        if want.as_deref() == Some("ib") {
            return Err(Error::InvalidArgument(
                "NCCL_NET=IB contradicts NCCL_IB_DISABLE=1".into(),
            ));
        }
        return tcp();
    }
    let mut opts = config.ib.clone();
    if opts.oob_ip.is_none() {
        opts.oob_ip = crate::bootstrap::local_ip(config).ok();
    }
    match transport_verbs::VerbsNet::new(opts) {
        Ok(net) => Ok(Arc::new(net)),
        Err(e) if want.as_deref() == Some("ib") => Err(Error::InvalidArgument(format!(
            "rank {rank}: NCCL_NET=IB but verbs is unusable: {e}"
        ))),
        Err(e) => {
            info!(rank, "{e}; falling back to NET/Socket");
            tcp()
        }
    }
}

fn check_rank(nranks: usize, rank: usize) -> Result<()> {
    if nranks == 0 || rank >= nranks {
        return Err(Error::invalid(format!(
            "rank {rank} of {nranks} ranks: need 0 <= rank < nranks"
        )));
    }
    Ok(())
}
