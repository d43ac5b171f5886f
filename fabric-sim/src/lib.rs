//! A flow-level simulator of leaf-spine and rail-optimized fabrics, driven
//! by nccl-rs's own schedules: the planner picks the algorithm and builds
//! every rank's schedule exactly as a communicator would, and the
//! simulator moves its messages over a model of the network.
//!
//! - [`net`]: switches, links (capacity, latency), hosts' NICs, ECMP paths;
//! - [`maxmin`]: max-min fair rates (progressive filling);
//! - [`gen`]: fabrics (two- and three-tier leaf-spine, rail-optimized, fat
//!   tree, Slurm `topology.conf`);
//! - [`sim`]: schedules to levels of flows, the call's time, busbw and
//!   bottleneck links;
//! - [`svg`] draws the plots.
#![forbid(unsafe_code)]

pub mod gen;
pub mod maxmin;
pub mod net;
pub mod sim;
pub mod svg;
