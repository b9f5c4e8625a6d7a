//! The processor's decisions as pure functions, table and property tested: balancing
//! ([`balancer`] by count, [`work_balancer`] by work on [`work_plan`]'s plan, with [`range_overlaps`] for split parents and overlaps), the acquire-cycle plan
//! ([`cycle_plan`] from [`cycle_inputs`], with [`acquisitions`] for its writes and their retry after a 412), the listing schedule ([`listing_schedule`]), periodic work spread out again
//! ([`in_step`]), the stall state machine ([`stall`]), the checkpoint policy
//! ([`checkpoint_policy`]), the one check of the options ([`validation`]) and the start's retries
//! ([`start_retry`]). No I/O; uses lease models and options only.

pub mod acquisitions;
pub mod balancer;
pub mod checkpoint_policy;
pub mod cycle_inputs;
pub mod cycle_plan;
pub mod in_step;
pub mod listing_schedule;
pub mod range_overlaps;
pub mod stall;
pub mod start_retry;
pub mod validation;
pub mod work_balancer;
pub mod work_plan;
