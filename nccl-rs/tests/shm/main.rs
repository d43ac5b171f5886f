//! The shared-memory transport (`nccl_rs::transport::shm`) through its
//! public API: the eager path, lending received bytes, two processes, and
//! throughput benchmarks (ignored). The tests that need the transport's
//! internals are unit tests in `src/transport/shm/tests/`.
//!
//! The helpers shared with the unit tests are in `nccl_rs::testing::shm`
//! and `nccl_rs::testing::peer`.

use nccl_rs::transport::shm::{ShmNet, ShmOptions};

mod bench;
mod eager;
mod lend;
mod process;

fn net() -> ShmNet {
    ShmNet::new(ShmOptions::default()).unwrap()
}
