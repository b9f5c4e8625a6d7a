//! The change feed processor against the SDK's in-memory emulator: balancing, failover,
//! graceful handoff, splits, lost leases and restarts.
//! A module per topic.

use std::sync::Arc;
use std::time::Duration;

use changefeed_operator::processor::{Batch, ChangeHandler, HandlerError};

use crate::common::{self, Env};

mod balancing;
mod capacity;
mod checkpoints;
mod failover;
mod handlers;
mod merges;
mod splits;
mod stopping;
mod store_faults;

/// Writes `docs` one by one and, 200 ms in, runs `change` (a split or a merge of the emulator's
/// partitions) while they are written; what `change` answered, once every write landed.
async fn while_writing<T>(env: &Env, docs: std::ops::Range<usize>, change: impl Future<Output = T>) -> T {
    let writes = tokio::spawn({
        let items = env.items.clone();
        async move {
            for n in docs {
                common::upsert_doc(&items, n).await;
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let changed = change.await;
    writes.await.unwrap();
    changed
}

/// A [`common::RecordingHandler`] that takes its time per batch (a batch in flight most of the
/// time, as a real handler's would be).
struct SlowHandler(Duration, common::RecordingHandler);

impl SlowHandler {
    /// Records for instance `name` of `env`, taking `took` per batch.
    fn of(env: &Env, name: &str, took: Duration) -> Arc<Self> {
        Arc::new(Self(
            took,
            common::RecordingHandler {
                instance: name.into(),
                deliveries: env.deliveries.clone(),
            },
        ))
    }
}

#[async_trait::async_trait]
impl ChangeHandler for SlowHandler {
    async fn handle(&self, batch: Batch<'_>) -> Result<(), HandlerError> {
        tokio::time::sleep(self.0).await;
        self.1.handle(batch).await
    }
}
