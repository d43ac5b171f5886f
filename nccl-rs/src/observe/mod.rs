//! What a running job exposes about itself.

pub(crate) mod clock;
pub mod progress;
pub mod prom;
pub mod telemetry;
