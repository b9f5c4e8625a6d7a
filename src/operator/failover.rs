//! Fast failover: the operator watches the worker pods, and when one is gone from the API (or has
//! `Failed`, or its worker container ended and waits to be started again) it frees every lease
//! that pod still owns and removes its heartbeat, so the surviving workers take them in their next
//! acquire cycle instead of after the lease expiration. (A container the kubelet started again
//! takes its leases back itself: `CFP_POD_UID`, [`crate::processor::leases::name_claim`].)
//!
//! The freeing is a conditional replace that clears `Owner` only while it names that pod, so a
//! lease whose owner pod still exists is never touched. A pod that terminates gracefully has
//! released its leases itself; freeing then finds nothing.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::events::{Event, EventType};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::operator::crd::ChangeFeedProcessor;
use crate::operator::reconcile::Context;
use crate::operator::scaling::estimates::ResourceKey;
use crate::operator::workload::{PROCESSOR_LABEL, WORKER_CONTAINER, worker_pod_selector};
use crate::processor::{evict_ended_process, evict_instance};
use time::OffsetDateTime;

/// A worker pod: namespace, pod name, processor resource name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct WorkerPod {
    namespace: String,
    pod: String,
    processor: String,
}

fn worker_pod(pod: &Pod) -> Option<WorkerPod> {
    Some(WorkerPod {
        namespace: pod.namespace()?,
        pod: pod.metadata.name.clone()?,
        processor: pod.labels().get(PROCESSOR_LABEL)?.clone(),
    })
}

fn failed(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")
}

/// How a worker pod's leases are freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gone {
    /// The pod is gone from the API: every lease of its name.
    Deleted,
    /// The pod has `Failed`: every lease of its name.
    Failed,
    /// Its worker container ended at this time and waits out the kubelet's back-off: the leases
    /// of that process only (one started since in the pod keeps its own).
    Ended(OffsetDateTime),
}

impl Gone {
    fn why(self) -> &'static str {
        match self {
            Gone::Deleted => "deleted",
            Gone::Failed => "Failed",
            Gone::Ended(_) => "left by its worker container, which ended and waits to start again",
        }
    }
}

/// The worker container's restarts, and when it ended when it is down now: it ended
/// (`lastState.terminated.finishedAt`) and waits out the kubelet's back-off (a container run
/// again at once takes its leases back itself). `None` before the kubelet reported it.
fn worker_restarts(pod: &Pod) -> Option<(i32, Option<OffsetDateTime>)> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    let worker = statuses.iter().find(|s| s.name == WORKER_CONTAINER)?;
    let backing_off = worker
        .state
        .as_ref()
        .and_then(|s| s.waiting.as_ref())
        .and_then(|w| w.reason.as_deref())
        == Some("CrashLoopBackOff");
    let ended = worker
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| t.finished_at.as_ref())
        .and_then(|t| OffsetDateTime::from_unix_timestamp(t.0.as_second()).ok());
    Some((worker.restart_count, ended.filter(|_| backing_off)))
}

/// When a pod's worker container ended, when it is down at a restart not handled yet
/// (`handled`: the restart count whose leases were freed last).
fn newly_down(handled: Option<i32>, now: Option<(i32, Option<OffsetDateTime>)>) -> Option<OffsetDateTime> {
    match now {
        Some((count, Some(ended))) if handled != Some(count) => Some(ended),
        _ => None,
    }
}

/// Watches the worker pods (in `namespace`, or all) until `stop`, freeing the leases of pods that are gone.
pub async fn watch_worker_pods(ctx: Arc<Context>, namespace: Option<String>, stop: CancellationToken) {
    let pods: Api<Pod> = match &namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let config = watcher::Config::default().labels(&worker_pod_selector());
    let mut events = watcher(pods, config).boxed();
    // The pods known to exist, and those being listed again after the watch restarted.
    let mut known: HashSet<WorkerPod> = HashSet::new();
    let mut relisted: Option<HashSet<WorkerPod>> = None;
    // Failed pods whose leases were freed already.
    let mut handled_failed: HashSet<WorkerPod> = HashSet::new();
    // Per pod, the worker container's restart whose leases were freed.
    let mut restarts: HashMap<WorkerPod, i32> = HashMap::new();
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return,
            event = events.next() => event,
        };
        let gone = match event {
            None => return,
            Some(Err(error)) => {
                tracing::debug!(%error, "worker pod watch error (retried)");
                continue;
            }
            Some(Ok(watcher::Event::Init)) => {
                relisted = Some(HashSet::new());
                Vec::new()
            }
            Some(Ok(watcher::Event::InitApply(pod) | watcher::Event::Apply(pod))) => {
                let Some(worker) = worker_pod(&pod) else { continue };
                match relisted.as_mut() {
                    Some(listing) => listing.insert(worker.clone()),
                    None => known.insert(worker.clone()),
                };
                let now = worker_restarts(&pod);
                if failed(&pod) && handled_failed.insert(worker.clone()) {
                    vec![(worker, Gone::Failed)]
                } else if let Some(ended) = newly_down(restarts.get(&worker).copied(), now) {
                    restarts.insert(worker.clone(), now.map_or(0, |(count, _)| count));
                    vec![(worker, Gone::Ended(ended))]
                } else {
                    Vec::new()
                }
            }
            Some(Ok(watcher::Event::InitDone)) => {
                let listing = relisted.take().unwrap_or_default();
                let vanished: Vec<(WorkerPod, Gone)> = known
                    .difference(&listing)
                    .cloned()
                    .map(|w| (w, Gone::Deleted))
                    .collect();
                restarts.retain(|w, _| listing.contains(w));
                handled_failed.retain(|w| listing.contains(w));
                known = listing;
                vanished
            }
            Some(Ok(watcher::Event::Delete(pod))) => {
                let Some(worker) = worker_pod(&pod) else { continue };
                known.remove(&worker);
                restarts.remove(&worker);
                if handled_failed.remove(&worker) {
                    Vec::new()
                } else {
                    vec![(worker, Gone::Deleted)]
                }
            }
        };
        for (worker, how) in gone {
            tokio::spawn(free_leases(ctx.clone(), worker, how));
        }
    }
}

async fn free_leases(ctx: Arc<Context>, worker: WorkerPod, how: Gone) {
    let why = how.why();
    let WorkerPod {
        namespace,
        pod,
        processor,
    } = &worker;
    if !(ctx.leading)() {
        return;
    }
    let key = ResourceKey::new(namespace.clone(), processor.clone());
    let store = match ctx.estimators.lease_store(&key).await {
        Ok(store) => store,
        Err(error) => {
            tracing::warn!(namespace, processor, pod, %error, "cannot free the leases of a gone worker pod; they free themselves on expiry");
            return;
        }
    };
    let evicted = match how {
        Gone::Ended(ended) => evict_ended_process(store.as_ref(), pod, ended).await,
        Gone::Deleted | Gone::Failed => evict_instance(store.as_ref(), pod).await,
    };
    let freed = match evicted {
        Ok(freed) => freed,
        Err(error) => {
            tracing::warn!(namespace, processor, pod, %error, "freeing the leases of a gone worker pod failed; they free themselves on expiry");
            return;
        }
    };
    if freed.is_empty() {
        tracing::debug!(namespace, processor, pod, "gone worker pod owned no leases");
        return;
    }
    tracing::info!(
        namespace,
        processor,
        pod,
        leases = freed.len(),
        why,
        "freed the leases of a gone worker pod"
    );
    ctx.metrics.leases_freed(namespace, processor, freed.len());
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(ctx.client.clone(), namespace);
    if let Ok(cfp) = cfps.get(processor).await {
        let event = Event {
            type_: EventType::Normal,
            reason: "LeasesFreed".into(),
            note: Some(crate::operator::status::bounded(
                format!(
                    "worker pod {pod} was {why}: freed its {} lease(s) for the other workers ({})",
                    freed.len(),
                    freed.join(", ")
                ),
                crate::operator::status::MAX_EVENT_NOTE,
            )),
            action: "Failover".into(),
            secondary: None,
        };
        if let Err(error) = ctx.recorder.publish(&event, &cfp.object_ref(&())).await {
            tracing::warn!(%error, "publishing an event failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod whose worker container restarted `count` times, ended last time (at 10 s past the
    /// epoch) or not, and is in `state` now (`running`, or `waiting` for a reason).
    fn pod(count: i32, ended: bool, state: &str) -> Pod {
        let now = match state.split_once(':') {
            Some((_, reason)) => serde_json::json!({"waiting": {"reason": reason}}),
            None => serde_json::json!({state: {}}),
        };
        let last =
            ended.then(|| serde_json::json!({"terminated": {"exitCode": 137, "finishedAt": "1970-01-01T00:00:10Z"}}));
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "orders-1"},
            "status": {"containerStatuses": [{
                "name": WORKER_CONTAINER, "image": "cfp", "imageID": "", "ready": state == "running",
                "restartCount": count, "lastState": last, "state": now,
            }]},
        }))
        .expect("a pod")
    }

    #[test]
    fn a_worker_container_that_ended_and_is_not_running_again_is_down_once() {
        let at = OffsetDateTime::from_unix_timestamp(10).ok();
        #[rustfmt::skip]
        let cases = [
            ("ended, backing off", None, pod(1, true, "waiting:CrashLoopBackOff"), at),
            ("ended again", Some(1), pod(2, true, "waiting:CrashLoopBackOff"), at),
            ("ended, being started again at once: it takes its leases back", None, pod(1, true, "waiting:ContainerCreating"), None),
            ("ended and running again", None, pod(1, true, "running"), None),
            ("the same restart seen again", Some(1), pod(1, true, "waiting:CrashLoopBackOff"), None),
            ("running, never restarted", None, pod(0, false, "running"), None),
        ];
        for (name, seen, pod, down) in cases {
            assert_eq!(newly_down(seen, worker_restarts(&pod)), down, "{name}");
        }
        assert_eq!(worker_restarts(&Pod::default()), None, "no status yet");
    }
}
