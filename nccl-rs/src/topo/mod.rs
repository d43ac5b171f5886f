//! Topology: which ranks share a host, each host's NICs (rails), and where
//! hosts sit in the switch tree of Slurm's `topology.conf`.
//!
//! At init every rank detects its [`HostRecord`] ([`host`]), the ranks
//! all-gather them over the bootstrap, and each builds the same
//! [`Fabric`] ([`fabric`]) from them and the tree of `NCCL_RS_TOPO_FILE`
//! ([`slurm`]); `NCCL_TOPO_DUMP_FILE` receives it as XML ([`dump`]).

pub mod dump;
pub mod fabric;
pub mod host;
pub mod slurm;

pub use dump::to_xml;
pub use fabric::{Fabric, Host, Leaf, PathSwitch};
pub use host::{DecodeError, HostRecord, Nic};
pub use slurm::{expand_hostlist, Switch, SwitchTree, TopoFileError};

/// Writes `fabric` as XML to `path` (`NCCL_TOPO_DUMP_FILE`).
pub fn write_dump(fabric: &Fabric, path: &std::path::Path) -> std::io::Result<()> {
    std::fs::write(path, to_xml(fabric))
}

#[cfg(test)]
mod tests;
