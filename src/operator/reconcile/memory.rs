//! What the operator remembers of each resource between its reconciliations (one leadership
//! term): the autoscaler's recommendations and last scale, what was applied last, failed
//! reconciliations in a row, and the lease-set standing as last read. One map, forgotten in one
//! place — when the resource is finalized, and by a sweep that finds it gone (a resource deleted
//! without a finalizer is never reconciled again) — so churn does not grow the operator.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use kube::runtime::reflector::{ObjectRef, Store};
use tokio_util::sync::CancellationToken;

use super::claim::RememberedStanding;
use super::pace::Applied;
use super::plan::ScaleState;
use crate::operator::crd::ChangeFeedProcessor;
use crate::operator::scaling::estimates::ResourceKey;

/// What the operator remembers of one resource.
#[derive(Default)]
pub struct ResourceMemory {
    /// The autoscaler's memory (recent recommendations, last decision).
    pub scaling: ScaleState,
    /// What was applied last (the workload is applied only when it changed).
    pub applied: Option<Applied>,
    /// Failed reconciliations in a row (the retries back off).
    pub failures: u32,
    /// The lease-set standing as last read.
    pub standing: Option<RememberedStanding>,
}

/// The memories of every resource of one leadership term.
#[derive(Default)]
pub struct Memories {
    resources: Mutex<HashMap<ResourceKey, ResourceMemory>>,
}

impl Memories {
    /// Runs `f` on the memory of `key` (a new one when there is none). A lock poisoned by a
    /// panic elsewhere is used as it is: each field is a value a reconciliation writes whole.
    pub fn with<T>(&self, key: &ResourceKey, f: impl FnOnce(&mut ResourceMemory) -> T) -> T {
        let mut resources = self.resources.lock().unwrap_or_else(PoisonError::into_inner);
        f(resources.entry(key.clone()).or_default())
    }

    /// Forgets `key`.
    pub fn forget(&self, key: &ResourceKey) {
        self.resources
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
    }

    /// Forgets every resource `exists` says is gone; returns how many.
    pub fn forget_missing(&self, exists: impl Fn(&ResourceKey) -> bool) -> usize {
        let mut resources = self.resources.lock().unwrap_or_else(PoisonError::into_inner);
        let before = resources.len();
        resources.retain(|key, _| exists(key));
        before - resources.len()
    }

    /// How many resources are remembered.
    pub fn len(&self) -> usize {
        self.resources.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Every `period` until `stop`, forgets the resources `resources` (the controller's cache) no
/// longer holds.
pub async fn forget_deleted(
    context: std::sync::Arc<super::Context>,
    resources: Store<ChangeFeedProcessor>,
    period: Duration,
    stop: CancellationToken,
) {
    let exists = |key: &ResourceKey| {
        resources
            .get(&ObjectRef::new(&key.name).within(&key.namespace))
            .is_some()
    };
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(period) => {
                let forgotten = context.memory.forget_missing(exists);
                if forgotten > 0 {
                    tracing::debug!(forgotten, "forgot deleted resources");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thousand_resources_created_and_deleted_leave_nothing_behind() {
        let memories = Memories::default();
        let keys: Vec<ResourceKey> = (0..1000).map(|i| ResourceKey::new("ns", format!("p{i}"))).collect();
        for key in &keys {
            memories.with(key, |m| {
                m.failures = 3;
                m.applied = Some(Applied {
                    digest: "d".into(),
                    generation: Some(1),
                });
            });
        }
        assert_eq!(memories.len(), 1000);
        memories.forget(&keys[0]);
        let forgotten = memories.forget_missing(|key| key.name == "p1");
        assert_eq!((forgotten, memories.len()), (998, 1));
        assert_eq!(
            memories.with(&keys[1], |m| m.failures),
            3,
            "the one that exists is kept"
        );
    }

    #[test]
    fn a_poisoned_lock_is_used_as_it_is() {
        let memories = std::sync::Arc::new(Memories::default());
        let key = ResourceKey::new("ns", "p");
        let poisoner = memories.clone();
        let key2 = key.clone();
        let _ = std::thread::spawn(move || poisoner.with(&key2, |_| panic!("a reconciliation panicked"))).join();
        assert_eq!(memories.with(&key, |m| m.failures), 0);
        memories.forget(&key);
        assert!(memories.is_empty());
    }
}
