//! Operator metrics: reconciliations, their errors by reason and duration, and leadership; and
//! per processor (labels `namespace`, `name`) its estimate, desired replicas and freed leases.
//!
//! A processor's series live only while its resource exists and this replica leads:
//! [`forget_deleted`] removes those of deleted resources (estimated or not: a misconfigured one
//! has only `cfp_processor_ready`) and, when the leadership term ends, all of them.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kube::runtime::reflector::{ObjectRef, Store};
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use tokio_util::sync::CancellationToken;

use crate::operator::crd::ChangeFeedProcessor;

/// The reasons `cfp_processor_estimate_errors_total` counts.
pub const ESTIMATE_ERROR_REASONS: [&str; 4] = ["connect", "lease_store", "change_feed", "timeout"];

/// The operator's metrics.
pub struct OperatorMetrics {
    registry: Registry,
    reconciles: IntCounterVec,
    errors: IntCounterVec,
    duration: Histogram,
    leader: IntGauge,
    processor: ProcessorSeries,
    /// The processors with series (namespace, name). Held while a processor's series are written
    /// or removed, so a removal never interleaves with a write that would bring a series back
    /// unknown.
    known: Mutex<BTreeSet<(String, String)>>,
}

/// Per-processor series, labelled `namespace` and `name`.
struct ProcessorSeries {
    estimated_lag: IntGaugeVec,
    leases: IntGaugeVec,
    leases_with_lag: IntGaugeVec,
    lease_owners: IntGaugeVec,
    leases_unowned: IntGaugeVec,
    leases_stalled: IntGaugeVec,
    oldest_pending: IntGaugeVec,
    desired_replicas: IntGaugeVec,
    ready: IntGaugeVec,
    paused: IntGaugeVec,
    estimate_failing: IntGaugeVec,
    estimate_errors: IntCounterVec,
    estimate_duration: HistogramVec,
    leases_freed: IntCounterVec,
}

/// One processor's estimate, as exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EstimateFigures {
    /// Remaining operations over all leases.
    pub estimated_lag: u64,
    /// Number of leases.
    pub leases: usize,
    /// Leases with lag.
    pub leases_with_lag: usize,
    /// Instances owning at least one lease.
    pub lease_owners: usize,
    /// Leases without an owner.
    pub leases_unowned: usize,
    /// Leases their worker reports stalled.
    pub leases_stalled: usize,
    /// How old the oldest pending change is, seconds, when the estimate read it for every
    /// lagging lease.
    pub oldest_pending_seconds: Option<u64>,
}

const PROCESSOR_LABELS: [&str; 2] = ["namespace", "name"];

/// `cfp_processor_estimate_duration_seconds`, registered in `registry`.
fn estimate_duration(registry: &Registry) -> Result<HistogramVec, prometheus::Error> {
    let histogram = HistogramVec::new(
        HistogramOpts::new(
            "cfp_processor_estimate_duration_seconds",
            "Time one estimate of a processor's remaining work took.",
        )
        .buckets(vec![0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
        &PROCESSOR_LABELS,
    )?;
    registry.register(Box::new(histogram.clone()))?;
    Ok(histogram)
}

fn gauge(registry: &Registry, name: &str, help: &str) -> Result<IntGaugeVec, prometheus::Error> {
    let gauge = IntGaugeVec::new(Opts::new(name, help), &PROCESSOR_LABELS)?;
    registry.register(Box::new(gauge.clone()))?;
    Ok(gauge)
}

fn counter(registry: &Registry, name: &str, help: &str, extra: &[&str]) -> Result<IntCounterVec, prometheus::Error> {
    let labels: Vec<&str> = PROCESSOR_LABELS.iter().chain(extra).copied().collect();
    let counter = IntCounterVec::new(Opts::new(name, help), &labels)?;
    registry.register(Box::new(counter.clone()))?;
    Ok(counter)
}

impl ProcessorSeries {
    /// Removes every series of processor `namespace`/`name`.
    fn remove(&self, namespace: &str, name: &str) {
        let labels = [namespace, name];
        for gauge in [
            &self.estimated_lag,
            &self.leases,
            &self.leases_with_lag,
            &self.lease_owners,
            &self.leases_unowned,
            &self.leases_stalled,
            &self.oldest_pending,
            &self.desired_replicas,
            &self.ready,
            &self.paused,
            &self.estimate_failing,
        ] {
            let _ = gauge.remove_label_values(&labels);
        }
        let _ = self.estimate_duration.remove_label_values(&labels);
        let _ = self.leases_freed.remove_label_values(&labels);
        for reason in ESTIMATE_ERROR_REASONS {
            let _ = self.estimate_errors.remove_label_values(&[namespace, name, reason]);
        }
    }

    fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let estimate_duration = estimate_duration(registry)?;
        Ok(Self {
            estimated_lag: gauge(
                registry,
                "cfp_processor_estimated_lag",
                "Estimated remaining operations over all leases of the processor.",
            )?,
            leases: gauge(
                registry,
                "cfp_processor_leases",
                "Lease documents (feed ranges) of the processor.",
            )?,
            leases_with_lag: gauge(
                registry,
                "cfp_processor_leases_with_lag",
                "Leases of the processor with remaining work.",
            )?,
            lease_owners: gauge(
                registry,
                "cfp_processor_lease_owners",
                "Instances owning at least one lease of the processor.",
            )?,
            leases_unowned: gauge(
                registry,
                "cfp_processor_leases_unowned",
                "Leases of the processor without an owner (nobody processes them).",
            )?,
            leases_stalled: gauge(
                registry,
                "cfp_processor_leases_stalled",
                "Leases their worker reports stalled: not advancing for the stall timeout though they may have lag.",
            )?,
            oldest_pending: gauge(
                registry,
                "cfp_processor_oldest_pending_seconds",
                "How old the oldest change the processor has not handled yet is (its _ts: read, or at most the age of the newest change a reporting owner's checkpoint covers); absent while unknown (see cfp_lease_oldest_pending_seconds on the workers).",
            )?,
            desired_replicas: gauge(
                registry,
                "cfp_processor_desired_replicas",
                "Worker pods the operator asks for (spec.replicas or the autoscaler's decision).",
            )?,
            ready: gauge(
                registry,
                "cfp_processor_ready",
                "1 while the processor's Ready condition is True.",
            )?,
            paused: gauge(
                registry,
                "cfp_processor_paused",
                "1 while the processor's workload is paused by its changefeed.io/paused(-replicas) annotation.",
            )?,
            estimate_failing: gauge(
                registry,
                "cfp_processor_estimate_failing",
                "1 while the latest estimate of the processor's remaining work failed.",
            )?,
            estimate_errors: counter(
                registry,
                "cfp_processor_estimate_errors_total",
                "Failed estimates of the processor's remaining work, by reason.",
                &["reason"],
            )?,
            estimate_duration,
            leases_freed: counter(
                registry,
                "cfp_processor_leases_freed_total",
                "Leases the operator freed because their owner's pod was gone (fast failover).",
                &[],
            )?,
        })
    }
}

impl OperatorMetrics {
    /// Registers the metrics in a new registry.
    pub fn new() -> Result<Arc<Self>, prometheus::Error> {
        let registry = Registry::new();
        let reconciles = IntCounterVec::new(
            Opts::new(
                "cfp_operator_reconciles_total",
                "Reconciliations, by result (ok or error).",
            ),
            &["result"],
        )?;
        let errors = IntCounterVec::new(
            Opts::new(
                "cfp_operator_reconcile_errors_total",
                "Failed reconciliations, by reason.",
            ),
            &["reason"],
        )?;
        let duration = Histogram::with_opts(
            HistogramOpts::new("cfp_operator_reconcile_duration_seconds", "Time a reconciliation took.")
                .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
        )?;
        let leader = IntGauge::new("cfp_operator_leader", "1 while this operator replica is the leader.")?;
        registry.register(Box::new(reconciles.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(leader.clone()))?;
        for result in ["ok", "error"] {
            reconciles.with_label_values(&[result]);
        }
        let processor = ProcessorSeries::new(&registry)?;
        Ok(Arc::new(Self {
            registry,
            reconciles,
            errors,
            duration,
            leader,
            processor,
            known: Mutex::new(BTreeSet::new()),
        }))
    }

    /// Writes series of processor `namespace`/`name`, remembering that it has series.
    fn write(&self, namespace: &str, name: &str, write: impl FnOnce(&ProcessorSeries)) {
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        known.insert((namespace.to_owned(), name.to_owned()));
        write(&self.processor);
    }

    /// Records a successful estimate of processor `namespace`/`name`.
    pub fn estimated(&self, namespace: &str, name: &str, figures: EstimateFigures, took: Duration) {
        let labels = [namespace, name];
        self.write(namespace, name, |series| {
            let set = |gauge: &IntGaugeVec, value: u64| {
                gauge
                    .with_label_values(&labels)
                    .set(i64::try_from(value).unwrap_or(i64::MAX));
            };
            set(&series.estimated_lag, figures.estimated_lag);
            set(&series.leases, figures.leases as u64);
            set(&series.leases_with_lag, figures.leases_with_lag as u64);
            set(&series.lease_owners, figures.lease_owners as u64);
            set(&series.leases_unowned, figures.leases_unowned as u64);
            set(&series.leases_stalled, figures.leases_stalled as u64);
            match figures.oldest_pending_seconds {
                Some(age) => set(&series.oldest_pending, age),
                None => {
                    let _ = series.oldest_pending.remove_label_values(&labels);
                }
            }
            set(&series.estimate_failing, 0);
            series
                .estimate_duration
                .with_label_values(&labels)
                .observe(took.as_secs_f64());
            for reason in ESTIMATE_ERROR_REASONS {
                series.estimate_errors.with_label_values(&[namespace, name, reason]);
            }
        });
    }

    /// Records a failed estimate (`reason` is one of [`ESTIMATE_ERROR_REASONS`]).
    pub fn estimate_failed(&self, namespace: &str, name: &str, reason: &str, took: Duration) {
        self.write(namespace, name, |series| {
            series
                .estimate_errors
                .with_label_values(&[namespace, name, reason])
                .inc();
            series.estimate_failing.with_label_values(&[namespace, name]).set(1);
            series
                .estimate_duration
                .with_label_values(&[namespace, name])
                .observe(took.as_secs_f64());
        });
    }

    /// Records the replicas the operator asks for.
    pub fn desired_replicas(&self, namespace: &str, name: &str, replicas: i32) {
        self.write(namespace, name, |series| {
            series
                .desired_replicas
                .with_label_values(&[namespace, name])
                .set(i64::from(replicas));
        });
    }

    /// Records whether the processor is Ready.
    pub fn ready(&self, namespace: &str, name: &str, ready: bool) {
        self.write(namespace, name, |series| {
            series.ready.with_label_values(&[namespace, name]).set(i64::from(ready));
        });
    }

    /// Records whether the processor's workload is paused.
    pub fn paused(&self, namespace: &str, name: &str, paused: bool) {
        self.write(namespace, name, |series| {
            series
                .paused
                .with_label_values(&[namespace, name])
                .set(i64::from(paused));
        });
    }

    /// Counts leases freed by fast failover.
    pub fn leases_freed(&self, namespace: &str, name: &str, count: usize) {
        self.write(namespace, name, |series| {
            series
                .leases_freed
                .with_label_values(&[namespace, name])
                .inc_by(count as u64);
        });
    }

    /// Removes every series of a processor (deleted, or no longer led by this replica).
    pub fn forget(&self, namespace: &str, name: &str) {
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        self.processor.remove(namespace, name);
        known.remove(&(namespace.to_owned(), name.to_owned()));
    }

    /// Removes every series of the processors in `scope` (a namespace; `None`: all) for which
    /// `exists(namespace, name)` is false: resources deleted whatever their state (a
    /// misconfigured one is never estimated, yet has `cfp_processor_ready`).
    pub fn forget_missing(&self, scope: Option<&str>, exists: impl Fn(&str, &str) -> bool) {
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        known.retain(|(namespace, name)| {
            let gone = scope.is_none_or(|scope| scope == namespace) && !exists(namespace, name);
            if gone {
                self.processor.remove(namespace, name);
            }
            !gone
        });
    }

    /// Records one reconciliation.
    pub fn observe(&self, elapsed: Duration, error: Option<&str>) {
        self.duration.observe(elapsed.as_secs_f64());
        match error {
            None => self.reconciles.with_label_values(&["ok"]).inc(),
            Some(reason) => {
                self.reconciles.with_label_values(&["error"]).inc();
                self.errors.with_label_values(&[reason]).inc();
            }
        }
    }

    /// Records whether this replica leads.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buffer);
        String::from_utf8(buffer).unwrap_or_default()
    }
}

/// How often [`forget_deleted`] looks for deleted resources.
pub const FORGET_DELETED_PERIOD: Duration = Duration::from_secs(5);

/// For one controller (of namespace `scope`, or of all): every `period` until `stop`, removes the
/// series of processors `resources` no longer holds — deleted resources, estimated or not (the
/// controller does not reconcile a resource that is gone without a finalizer, so nothing else
/// notices) — and once stopped (the leadership term ended), every series of `scope`: a replica
/// that does not lead exports no processor series.
pub async fn forget_deleted(
    metrics: Arc<OperatorMetrics>,
    resources: Store<ChangeFeedProcessor>,
    scope: Option<String>,
    period: Duration,
    stop: CancellationToken,
) {
    let exists = |namespace: &str, name: &str| resources.get(&ObjectRef::new(name).within(namespace)).is_some();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(period) => metrics.forget_missing(scope.as_deref(), exists),
        }
    }
    metrics.forget_missing(scope.as_deref(), |_, _| false);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processor_series_appear_and_disappear() {
        let metrics = OperatorMetrics::new().unwrap();
        let figures = EstimateFigures {
            estimated_lag: 3000,
            leases: 8,
            leases_with_lag: 8,
            lease_owners: 0,
            leases_unowned: 8,
            leases_stalled: 0,
            oldest_pending_seconds: None,
        };
        metrics.estimated("ns", "orders", figures, Duration::from_millis(20));
        metrics.desired_replicas("ns", "orders", 6);
        metrics.leases_freed("ns", "orders", 2);
        metrics.estimate_failed("ns", "orders", "timeout", Duration::from_secs(1));
        metrics.estimated("ns", "other", figures, Duration::from_millis(20));
        let text = metrics.render();
        for line in [
            "cfp_processor_estimated_lag{name=\"orders\",namespace=\"ns\"} 3000",
            "cfp_processor_leases{name=\"orders\",namespace=\"ns\"} 8",
            "cfp_processor_desired_replicas{name=\"orders\",namespace=\"ns\"} 6",
            "cfp_processor_leases_freed_total{name=\"orders\",namespace=\"ns\"} 2",
            "cfp_processor_estimate_errors_total{name=\"orders\",namespace=\"ns\",reason=\"timeout\"} 1",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
        metrics.forget("ns", "orders");
        let text = metrics.render();
        assert!(!text.contains("name=\"orders\""), "{text}");
        assert!(text.contains("name=\"other\""));
    }

    #[test]
    fn the_latest_estimate_says_whether_estimates_fail() {
        let metrics = OperatorMetrics::new().unwrap();
        let figures = EstimateFigures {
            estimated_lag: 0,
            leases: 1,
            leases_with_lag: 0,
            lease_owners: 1,
            leases_unowned: 0,
            leases_stalled: 0,
            oldest_pending_seconds: None,
        };
        let failing = "cfp_processor_estimate_failing{name=\"orders\",namespace=\"ns\"}";
        metrics.estimate_failed("ns", "orders", "connect", Duration::from_secs(1));
        assert!(metrics.render().contains(&format!("{failing} 1")));
        metrics.estimated("ns", "orders", figures, Duration::from_millis(20));
        assert!(metrics.render().contains(&format!("{failing} 0")));
        metrics.forget("ns", "orders");
        assert!(!metrics.render().contains(failing));
    }

    #[test]
    fn series_of_processors_that_are_gone_are_removed_estimated_or_not() {
        let metrics = OperatorMetrics::new().unwrap();
        let figures = EstimateFigures {
            estimated_lag: 10,
            leases: 2,
            leases_with_lag: 1,
            lease_owners: 1,
            leases_unowned: 1,
            leases_stalled: 0,
            oldest_pending_seconds: None,
        };
        // Misconfigured (never estimated): only Ready and the replicas it had.
        metrics.ready("ns", "broken", false);
        metrics.desired_replicas("ns", "broken", 1);
        metrics.leases_freed("ns", "broken", 1);
        metrics.estimated("ns", "orders", figures, Duration::from_millis(20));
        metrics.ready("ns", "orders", true);
        metrics.ready("elsewhere", "broken", false);
        let exists = |namespace: &str, name: &str| (namespace, name) == ("ns", "orders");
        // A controller of namespace `ns` judges only its own namespace.
        metrics.forget_missing(Some("ns"), exists);
        let text = metrics.render();
        assert!(!text.contains("name=\"broken\",namespace=\"ns\""), "{text}");
        assert!(
            text.contains("cfp_processor_ready{name=\"orders\",namespace=\"ns\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("cfp_processor_ready{name=\"broken\",namespace=\"elsewhere\"} 0"),
            "{text}"
        );
        // A leadership term that ends forgets everything of its scope.
        metrics.forget_missing(None, |_, _| false);
        assert!(!metrics.render().contains("cfp_processor_"), "{}", metrics.render());
    }

    #[tokio::test]
    async fn deleted_resources_lose_their_series_and_a_stopped_term_loses_all() {
        use kube::runtime::{reflector, watcher};
        let metrics = OperatorMetrics::new().unwrap();
        let mut writer = reflector::store::Writer::<ChangeFeedProcessor>::default();
        let cfp: ChangeFeedProcessor = serde_json::from_value(serde_json::json!({
            "apiVersion": "changefeed.io/v1alpha1",
            "kind": "ChangeFeedProcessor",
            "metadata": {"name": "orders", "namespace": "ns"},
            "spec": {
                "connection": {"endpoint": "https://acct.documents.azure.com/", "keySecretRef": {"name": "cosmos"}},
                "monitored": {"database": "db", "container": "items"}
            }
        }))
        .unwrap();
        writer.apply_watcher_event(&watcher::Event::Apply(cfp));
        metrics.ready("ns", "orders", true);
        metrics.ready("ns", "deleted", false);
        let stop = CancellationToken::new();
        let sweeper = tokio::spawn(forget_deleted(
            metrics.clone(),
            writer.as_reader(),
            None,
            Duration::from_millis(10),
            stop.clone(),
        ));
        tokio::time::timeout(Duration::from_secs(5), async {
            while metrics.render().contains("name=\"deleted\"") {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the deleted resource's series removed");
        assert!(
            metrics
                .render()
                .contains("cfp_processor_ready{name=\"orders\",namespace=\"ns\"} 1")
        );
        stop.cancel();
        sweeper.await.unwrap();
        assert!(!metrics.render().contains("cfp_processor_"), "{}", metrics.render());
    }
}
