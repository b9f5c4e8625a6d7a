//! The processor's decisions as pure functions, table and property tested: balancing, the
//! acquire-cycle plan, the listing schedule, the stall state machine, the checkpoint policy and
//! the one check of the options, the start's retries. No I/O; uses lease models and options only.

pub mod balancer;
pub mod checkpoint_policy;
pub mod cycle_plan;
pub mod in_step;
pub mod listing_schedule;
pub mod range_overlaps;
pub mod stall;
pub mod start_retry;
pub mod validation;
