//! Shared helpers of the nccl-rs test suite.
