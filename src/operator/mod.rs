//! The Kubernetes operator: the `ChangeFeedProcessor` resource, its reconciler, leader election.
//!
//! [`crd`] (types), [`spec_options`] (the spec as the workers' processor options), [`workload`]
//! (pure rendering of the Deployment and Service), [`network_policy`] (pure: the workers' NetworkPolicy), [`config`] (pure configuration check), [`status`] (pure conditions), [`autoscale`] (pure scaling policy) and
//! [`behavior`] (its rate policies), [`external`] (pure: an HPA or KEDA on `/scale`), [`pause`]
//! (pure: the pause annotations), [`rewind`] (pure: the rewind annotations' steps), [`estimation`] (remaining-work estimates per resource) and
//! [`reported`] (pure: which leases the workers' lag reports tell), [`news`] (pure: which estimates
//! are worth a reconciliation),
//! [`failover`] (freeing the leases of gone worker pods), [`reconcile`] (observe → plan → apply →
//! report, with a pure plan and report), [`leader`], [`liveness`]
//! (`/healthz`), [`metrics`], [`run`] (the `cfp operator` loop).

pub mod autoscale;
pub mod behavior;
pub mod config;
pub mod crd;
pub mod estimation;
pub mod external;
pub mod failover;
pub mod leader;
pub mod liveness;
pub mod metrics;
pub mod network_policy;
pub mod news;
pub mod pause;
pub mod reconcile;
pub mod reported;
pub mod rewind;
pub mod run;
pub mod spec_options;
pub mod status;
pub mod workload;

pub use crd::{ChangeFeedProcessor, ChangeFeedProcessorSpec, ChangeFeedProcessorStatus, crd_markdown, crd_yaml};
