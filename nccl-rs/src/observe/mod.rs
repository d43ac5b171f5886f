//! What a running job exposes about itself.

pub mod progress;
pub mod prom;
pub mod telemetry;
