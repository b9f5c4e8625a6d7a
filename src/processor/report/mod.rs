//! What the processor tells: telemetry (the observer, lease events), the error log, and the
//! remaining-work estimator. Uses `leases`, `policy` and `cosmos`.

pub mod error_log;
pub mod estimator;
pub mod events;
pub mod observer;
pub(crate) mod telemetry;
