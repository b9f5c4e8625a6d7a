//! What an owner writes as a checkpoint: the position after a handled batch, with the lag
//! report of its page, paced as a write that can wait.

use time::OffsetDateTime;

use super::{OwnedLease, UpdateError};
use crate::processor::leases::lag_report::record_report;
use crate::processor::leases::lease::{Lease, STALLED_PROPERTY};
use crate::processor::leases::work_report::CheckpointReport;

impl OwnedLease {
    /// Records the continuation after a handled batch (without a lag report).
    pub async fn checkpoint(&self, continuation: &str) -> Result<Lease, UpdateError> {
        self.checkpoint_reporting(continuation, CheckpointReport::default())
            .await
    }

    /// Records the continuation after a handled batch with the lag report of its page
    /// ([`lag_report`](crate::processor::leases::lag_report)).
    pub async fn checkpoint_reporting(
        &self,
        continuation: &str,
        report: CheckpointReport,
    ) -> Result<Lease, UpdateError> {
        self.write_position(continuation, report, Progress::Made).await
    }

    /// Records a position handled before the reader stopped (written before it is opened
    /// again or the lease is given up): like [`OwnedLease::checkpoint_reporting`], except that
    /// a stall recorded on the lease stays — a reader restarted after a stall writes what the
    /// empty pages before the stalled batch moved, which is no sign that the stall is over.
    pub async fn checkpoint_pending(&self, continuation: &str, report: CheckpointReport) -> Result<Lease, UpdateError> {
        self.write_position(continuation, report, Progress::Unknown).await
    }

    /// Writes `continuation` and its `report` as a checkpoint.
    async fn write_position(
        &self,
        continuation: &str,
        report: CheckpointReport,
        progress: Progress,
    ) -> Result<Lease, UpdateError> {
        let written = self
            .update_deferrable(|lease| {
                record_checkpoint(lease, continuation, progress);
                record_report(lease, report.lag);
                true
            })
            .await?;
        Ok(self.written_or_current(written).await)
    }

    /// Records `continuation` only while `forward(lease's continuation)` says it moves the lease
    /// forward, judged under the lease's lock: concurrent checkpoints never write an older
    /// position last. `Ok(false)` when nothing was written.
    pub async fn checkpoint_forward(
        &self,
        continuation: &str,
        forward: impl Fn(Option<&str>) -> bool,
    ) -> Result<bool, UpdateError> {
        let written = self
            .update_deferrable(|lease| {
                let ahead = forward(lease.continuation.as_deref());
                if ahead {
                    record_checkpoint(lease, continuation, Progress::Made);
                    record_report(lease, None);
                }
                ahead
            })
            .await?;
        Ok(written.is_some())
    }
}

/// What a checkpoint says of the lease's progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    /// A batch was handled (or the lease caught up): a stall recorded on the lease is over.
    Made,
    /// A position handled before the reader stopped: a stall recorded stays.
    Unknown,
}

/// Writes `continuation` into `lease` as its checkpoint, stamped now.
fn record_checkpoint(lease: &mut Lease, continuation: &str, progress: Progress) {
    lease.continuation = Some(continuation.to_owned());
    lease.checkpoint_time = Some(OffsetDateTime::now_utc());
    if progress == Progress::Made {
        lease.properties.remove(STALLED_PROPERTY);
    }
}
