//! The request units the processor spends, one pacing design for two budgets: this instance's
//! part of a budget the fleet shares ([`share`]: a level refilled at the part's rate, spent at
//! what the container charged), the lease container's budget every lease write passes
//! ([`writes`]: heartbeats and renewals first, checkpoints paced by 429s on top of the share),
//! and the monitored container's read budget every change feed read passes ([`reads`]: pages
//! sized and idle polls spaced to stay within it). Uses `cosmos`, the lease store's trait and the
//! processor's options only.

pub mod reads;
pub(crate) mod share;
pub(crate) mod writes;
