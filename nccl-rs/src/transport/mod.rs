//! The transport seam (re-exported from [`nccl_net`]) and the transports that
//! live in the core: the in-memory test transport.
//!
//! The engine sees only these traits. TCP lives in `transport-tcp`.

pub mod mem;
pub mod shm;

pub use nccl_net::{
    Connector, CopyHint, Listener, MemHandle, Net, NetError, NetResult, Properties, PtrSupport,
    RecvComm, RecvHint, Request, SendComm, MAX_HANDLE_BYTES,
};
