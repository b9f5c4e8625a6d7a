//! One estimate's outcome as the reconciler and the metrics see it: the figures or why they
//! could not be had. Pure data, shared by the estimate loop ([`super::estimates`]) and the
//! judgement of what is news ([`super::news`]).

use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::processor::ProcessorEstimate;
use crate::worker::WorkerError;

/// One estimate's outcome.
#[derive(Debug, Clone)]
pub struct EstimateReport {
    /// Counts estimates of this resource (1, 2, ...): a newer report has a higher number.
    pub seq: u64,
    /// When it finished (monotonic, for the scaling policy).
    pub at: Instant,
    /// When it finished (wall clock, for the status).
    pub time: Time,
    /// The estimate, or why it failed.
    pub outcome: Result<ProcessorEstimate, EstimateFailure>,
}

/// Why an estimate failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct EstimateFailure {
    /// A metric label: one of `metrics::ESTIMATE_ERROR_REASONS`.
    pub reason: &'static str,
    /// What went wrong, in words.
    pub message: String,
    /// For a problem that waiting does not fix (a container missing or that may not be
    /// created, a credential refused): the condition reason, such as `LeaseContainerMissing`.
    pub setup: Option<&'static str>,
}

impl EstimateFailure {
    pub(crate) fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
            setup: None,
        }
    }

    /// The failure to open a processor's containers.
    pub(crate) fn opening(error: &WorkerError) -> Self {
        Self {
            setup: error.is_setup_problem().then(|| error.reason()),
            ..Self::new("lease_store", error.to_string())
        }
    }
}
