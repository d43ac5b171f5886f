//! What a running job exposes about itself.

pub mod progress;
