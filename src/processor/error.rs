//! The processor's typed errors: [`ProcessorError`] (starting or running a processor) and
//! [`LeaseError`] (one failed step of the lease work, reported as a
//! [`crate::processor::LeaseEvent::Error`], logged at most once a minute per kind, and never
//! classified by its text).

use crate::cosmos::{CosmosError, ErrorKind};
use crate::processor::handlers::change_handler::HandlerError;
use crate::processor::leases::lease::LeaseStoreError;
use crate::processor::leases::name_claim::NameError;
use crate::processor::leases::owned::UpdateError;
use crate::processor::policy::validation::OptionsError;

/// Errors that stop a processor from starting or running.
#[derive(Debug, thiserror::Error)]
pub enum ProcessorError {
    /// The configuration cannot work.
    #[error("{0}")]
    Config(String),
    /// The options cannot work together.
    #[error(transparent)]
    Options(#[from] OptionsError),
    /// The lease store failed.
    #[error("lease store: {0}")]
    Store(#[from] LeaseStoreError),
    /// A Cosmos request failed.
    #[error(transparent)]
    Cosmos(#[from] CosmosError),
    /// Another process runs under this instance name (or the name's heartbeat could not be
    /// written).
    #[error(transparent)]
    Name(#[from] NameError),
}

impl ProcessorError {
    /// Whether trying again later can succeed (throttling, 503, timeouts).
    pub fn is_transient(&self) -> bool {
        match self {
            ProcessorError::Config(_) | ProcessorError::Options(_) => false,
            ProcessorError::Store(error) => error.is_transient(),
            ProcessorError::Cosmos(error) => error.kind.is_retryable(),
            ProcessorError::Name(NameError::Taken { .. }) => false,
            ProcessorError::Name(NameError::Store(error)) => error.is_transient(),
        }
    }
}

/// A step of the lease work that failed; processing goes on (retrying where that can help).
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Writing this instance's heartbeat failed.
    #[error("heartbeat failed: {0}")]
    Heartbeat(LeaseStoreError),
    /// Listing the lease container failed.
    #[error("listing leases failed: {0}")]
    Listing(LeaseStoreError),
    /// Writing this instance as a lease's owner failed.
    #[error("acquiring failed: {0}")]
    Acquire(LeaseStoreError),
    /// Renewing an owned lease failed.
    #[error("renew failed: {0}")]
    Renew(LeaseStoreError),
    /// Checkpointing a handled batch failed (retried).
    #[error("checkpoint failed: {0}")]
    Checkpoint(LeaseStoreError),
    /// Putting back a lease document deleted while it was processed failed.
    #[error("recreating the deleted lease failed: {0}")]
    Recreate(LeaseStoreError),
    /// Creating the leases of ranges nobody covers failed (after the lease container came back).
    #[error("creating the missing leases failed: {0}")]
    CreateMissing(Box<ProcessorError>),
    /// Opening a lease's change feed failed.
    #[error("opening the change feed: {0}")]
    OpenFeed(CosmosError),
    /// Reading a lease's change feed failed with an error that retrying does not fix.
    #[error("reading the change feed: {0}")]
    ReadFeed(CosmosError),
    /// A lease of the partition-key-range layout, which is adopted at bootstrap, not processed.
    #[error(
        "a partition-key-range lease (.NET v2 / v3 version 0) is not processed itself: its checkpoint is adopted into an EPK lease at bootstrap"
    )]
    PartitionKeyRangeLease,
    /// Creating a child lease of a split failed.
    #[error("creating a child lease failed: {child}: {error}")]
    ChildLease {
        /// The child's lease token.
        child: String,
        /// Why.
        error: LeaseStoreError,
    },
    /// Deleting a split's parent lease failed.
    #[error("deleting the split parent lease: {0}")]
    DeleteSplitParent(UpdateError),
    /// The handler failed a batch (retried as the retry policy says).
    #[error("handler failed: batch {batch_id} (attempt {attempt}, {documents} documents): {error}")]
    Handler {
        /// The batch's id.
        batch_id: String,
        /// Which attempt failed (the first is 1).
        attempt: u32,
        /// How many documents the attempt had.
        documents: usize,
        /// What the handler said.
        error: HandlerError,
    },
    /// Dead-lettering was asked for without a dead-letter container.
    #[error("no dead-letter container is configured")]
    NoDeadLetterStore,
    /// Storing a dead letter failed (retried; the batch is not checkpointed before).
    #[error("writing a dead letter failed (the batch is not checkpointed): {0}")]
    DeadLetter(CosmosError),
}

/// The Cosmos error under a lease store error, if a Cosmos request failed.
fn store(error: &LeaseStoreError) -> Option<&CosmosError> {
    match error {
        LeaseStoreError::Cosmos(error) => Some(error),
        _ => None,
    }
}

impl LeaseError {
    /// The kind of failure, one fixed value per variant: the metric label
    /// (`cfp_lease_errors_total{reason}`) and the key of the error log (one entry per lease and
    /// kind, however many batches and attempts fail).
    pub fn reason(&self) -> &'static str {
        match self {
            LeaseError::Heartbeat(_) => "heartbeat",
            LeaseError::Listing(_) => "listing",
            LeaseError::Acquire(_) => "acquire",
            LeaseError::Renew(_) => "renew",
            LeaseError::Checkpoint(_) => "checkpoint",
            LeaseError::Recreate(_) => "recreate",
            LeaseError::CreateMissing(_) => "create_missing",
            LeaseError::OpenFeed(_) => "open_feed",
            LeaseError::ReadFeed(_) => "read_feed",
            LeaseError::PartitionKeyRangeLease => "partition_key_range_lease",
            LeaseError::ChildLease { .. } => "child_lease",
            LeaseError::DeleteSplitParent(_) => "delete_split_parent",
            LeaseError::Handler { .. } => "handler",
            LeaseError::NoDeadLetterStore => "no_dead_letter_store",
            LeaseError::DeadLetter(_) => "dead_letter",
        }
    }

    /// The Cosmos error underneath, if a Cosmos request failed.
    pub fn cosmos(&self) -> Option<&CosmosError> {
        match self {
            LeaseError::Heartbeat(e)
            | LeaseError::Listing(e)
            | LeaseError::Acquire(e)
            | LeaseError::Renew(e)
            | LeaseError::Checkpoint(e)
            | LeaseError::Recreate(e)
            | LeaseError::ChildLease { error: e, .. } => store(e),
            LeaseError::CreateMissing(e) => match e.as_ref() {
                ProcessorError::Store(e) | ProcessorError::Name(NameError::Store(e)) => store(e),
                ProcessorError::Cosmos(e) => Some(e),
                ProcessorError::Config(_) | ProcessorError::Options(_) | ProcessorError::Name(_) => None,
            },
            LeaseError::OpenFeed(e) | LeaseError::ReadFeed(e) | LeaseError::DeadLetter(e) => Some(e),
            LeaseError::DeleteSplitParent(UpdateError::Store(e)) => store(e),
            LeaseError::DeleteSplitParent(_)
            | LeaseError::PartitionKeyRangeLease
            | LeaseError::Handler { .. }
            | LeaseError::NoDeadLetterStore => None,
        }
    }

    /// Whether the account refused the credential (401): every request fails alike, so it is
    /// logged once for all leases and kinds.
    pub fn is_refused_credential(&self) -> bool {
        self.cosmos().is_some_and(|e| e.kind == ErrorKind::Unauthorized)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cosmos(kind: ErrorKind) -> CosmosError {
        CosmosError::local(kind, "refused")
    }

    #[test]
    fn the_kind_is_the_text_before_the_details() {
        let errors = [
            LeaseError::Heartbeat(LeaseStoreError::Gone("x".into())),
            LeaseError::Renew(LeaseStoreError::Cosmos(cosmos(ErrorKind::Transient))),
            LeaseError::Checkpoint(LeaseStoreError::Changed("x".into())),
            LeaseError::OpenFeed(cosmos(ErrorKind::Transient)),
            LeaseError::Handler {
                batch_id: "b".into(),
                attempt: 3,
                documents: 7,
                error: HandlerError::new("boom: with a colon"),
            },
            LeaseError::ChildLease {
                child: "t".into(),
                error: LeaseStoreError::Gone("x".into()),
            },
        ];
        let reasons: std::collections::BTreeSet<&str> = errors.iter().map(LeaseError::reason).collect();
        assert_eq!(reasons.len(), errors.len(), "one reason per kind");
        for reason in reasons {
            assert!(
                reason.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{reason}: a metric label"
            );
        }
    }

    #[test]
    fn only_a_401_from_the_account_is_a_refused_credential() {
        let refused = LeaseError::Renew(LeaseStoreError::Cosmos(cosmos(ErrorKind::Unauthorized)));
        assert!(refused.is_refused_credential());
        assert!(LeaseError::ReadFeed(cosmos(ErrorKind::Unauthorized)).is_refused_credential());
        assert!(!LeaseError::ReadFeed(cosmos(ErrorKind::Transient)).is_refused_credential());
        // A handler (an HTTP receiver) answering 401 is the handler's failure, not the account's.
        let handler = LeaseError::Handler {
            batch_id: "b".into(),
            attempt: 1,
            documents: 1,
            error: HandlerError::new("receiver answered (status 401)"),
        };
        assert!(!handler.is_refused_credential());
    }
}
