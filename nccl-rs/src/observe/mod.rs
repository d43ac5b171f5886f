pub mod prom;
pub mod telemetry;
