//! What the processor tells: telemetry (`telemetry`, the [`observer`] hooks, lease [`events`]),
//! the error log ([`error_log`]), the remaining-work [`estimator`] and what its [`estimate`] says,
//! and what KEDA's scaler would
//! read of the leases ([`keda_reading`]). Uses `leases`, `policy`
//! and `cosmos`. (Health is `run::health`, the lag report `leases::lag_report`, what a reader does
//! about a stall `run::stall_report`.)

pub mod error_log;
pub mod estimate;
pub mod estimator;
pub mod events;
pub mod keda_reading;
pub mod observer;
pub(crate) mod telemetry;
