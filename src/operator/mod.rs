//! The Kubernetes operator: the `ChangeFeedProcessor` resource, its reconciler, leader election.
//!
//! [`boundary`] (the trust boundary: the accounts the admin allows), [`claims`] (which resource
//! holds a lease set), [`crd`] (types), [`spec_options`] (the spec as the workers' processor
//! options), [`spec_values`] (field values read as what they mean), [`workload`] (pure rendering
//! of the Deployment and Service), [`network_policy`] (pure: the workers' NetworkPolicy),
//! [`config`] (pure configuration check, the Secret digest), [`digest_key`] (the installation's
//! key of that digest, kept in a Secret), [`status`] (pure conditions), [`scaling`] (everything
//! that decides replicas), [`rewind_steps`] (pure: the rewind annotations' steps), [`failover`]
//! (freeing the leases of gone worker pods), [`reconcile`] (observe → plan → apply → publish,
//! with a pure plan and report), [`leader`], [`healthz`] (`/healthz`), [`metrics`], [`run`] (the
//! `cfp operator` loop).

pub mod boundary;
pub mod claims;
pub mod config;
pub mod crd;
pub mod digest_key;
pub mod failover;
pub mod healthz;
pub mod leader;
pub mod metrics;
pub mod network_policy;
pub mod reconcile;
pub mod rewind_steps;
pub mod run;
pub mod scaling;
pub mod spec_options;
pub mod spec_values;
pub mod status;
pub mod workload;

pub use crd::{ChangeFeedProcessor, ChangeFeedProcessorSpec, ChangeFeedProcessorStatus, crd_markdown, crd_yaml};
