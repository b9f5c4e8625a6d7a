//! What an acquire cycle's plan ([`crate::processor::policy::cycle_plan`]) is decided from
//! besides the listing: the options it depends on and what this instance knows of itself.

use std::collections::HashSet;
use std::time::Duration;

use crate::processor::leases::sightings::Sightings;
use crate::processor::leases::work_report::WorkTimings;
use crate::processor::options::ProcessorOptions;
use crate::processor::policy::balancer::Balancing;

/// The options the plan depends on.
#[derive(Debug, Clone, Copy)]
pub struct CycleOptions {
    /// How long a lease lives without a renewal.
    pub expiration: Duration,
    /// How often owners renew.
    pub renew_interval: Duration,
    /// The regular wait between acquire cycles.
    pub acquire_interval: Duration,
    /// The balancing strategy.
    pub balancing: Balancing,
}

impl From<&ProcessorOptions> for CycleOptions {
    fn from(options: &ProcessorOptions) -> Self {
        Self {
            expiration: options.expiration,
            renew_interval: options.renew_interval,
            acquire_interval: options.acquire_interval,
            balancing: options.balancing,
        }
    }
}

impl From<CycleOptions> for WorkTimings {
    fn from(options: CycleOptions) -> Self {
        WorkTimings::new(options.acquire_interval, options.expiration)
    }
}

/// What this instance knows of itself when a listing comes in.
#[derive(Debug, Clone)]
pub struct Observations {
    /// As of when the listing is judged, on this instance's monotonic clock: when it was sent
    /// ([`Sightings::observe_listing`]).
    pub at: tokio::time::Instant,
    /// What this instance has seen change, and when (the listing already recorded).
    pub sightings: Sightings,
    /// The ids of the leases processed here now.
    pub owned: HashSet<String>,
    /// Whether a handoff this instance asked for is still awaited.
    pub awaiting_handoff: bool,
    /// The lease ids the previous listing showed, sorted.
    pub listed_ids: Vec<String>,
    /// The wait before this listing (the acquire interval, longer while listings were quiet).
    pub listing_interval: Duration,
    /// Leases this instance released as stalled within the last lease expiration: left for the
    /// other instances to try ([`crate::processor::policy::stall`]).
    pub left_stalled: HashSet<String>,
    /// Whether the previous plan of this instance, made long enough ago for new reports to land
    /// (and not so long ago that it is stale), would have moved leases here by work
    /// ([`crate::processor::policy::cycle_plan::CyclePlan::moves_planned`]): moves are made only
    /// when two listings in a row call for them.
    pub moves_called: bool,
}
