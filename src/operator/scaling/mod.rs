//! Everything that decides a processor's replicas: the remaining-work [`estimates`] (their
//! outcome as [`estimate_report`], which are [`news`] to the reconciler, what the
//! [`worker_reports`] tell), the scaling [`policy`] (by the lag count, or by [`freshness`] from
//! the [`arrivals`], counted in a [`worker_count`]; read from the spec by [`spec_policy`]) and
//! its rate [`behavior`], an [`external`] autoscaler on `/scale`, and [`pause`]. Pure except
//! `estimates`; uses `crd`, `spec_options` and the processor's estimator.

pub mod arrivals;
pub mod behavior;
pub mod estimate_report;
pub mod estimates;
pub mod external;
pub mod freshness;
pub mod news;
pub mod pause;
pub mod policy;
pub mod spec_policy;
pub mod worker_count;
pub mod worker_reports;
