//! Operator metrics: reconciliations, their errors by reason and duration, and leadership; and
//! per processor (labels `namespace`, `name`) its estimate, desired replicas and freed leases.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

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
}

/// Per-processor series, labelled `namespace` and `name`.
struct ProcessorSeries {
    estimated_lag: IntGaugeVec,
    leases: IntGaugeVec,
    leases_with_lag: IntGaugeVec,
    lease_owners: IntGaugeVec,
    leases_unowned: IntGaugeVec,
    desired_replicas: IntGaugeVec,
    ready: IntGaugeVec,
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
}

const PROCESSOR_LABELS: [&str; 2] = ["namespace", "name"];

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
    fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let estimate_duration = HistogramVec::new(
            HistogramOpts::new(
                "cfp_processor_estimate_duration_seconds",
                "Time one estimate of a processor's remaining work took.",
            )
            .buckets(vec![0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
            &PROCESSOR_LABELS,
        )?;
        registry.register(Box::new(estimate_duration.clone()))?;
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
        }))
    }

    /// Records a successful estimate of processor `namespace`/`name`.
    pub fn estimated(&self, namespace: &str, name: &str, figures: EstimateFigures, took: Duration) {
        let labels = [namespace, name];
        let series = &self.processor;
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
        series
            .estimate_duration
            .with_label_values(&labels)
            .observe(took.as_secs_f64());
        for reason in ESTIMATE_ERROR_REASONS {
            series.estimate_errors.with_label_values(&[namespace, name, reason]);
        }
    }

    /// Records a failed estimate (`reason` is one of [`ESTIMATE_ERROR_REASONS`]).
    pub fn estimate_failed(&self, namespace: &str, name: &str, reason: &str, took: Duration) {
        let series = &self.processor;
        series
            .estimate_errors
            .with_label_values(&[namespace, name, reason])
            .inc();
        series
            .estimate_duration
            .with_label_values(&[namespace, name])
            .observe(took.as_secs_f64());
    }

    /// Records the replicas the operator asks for.
    pub fn desired_replicas(&self, namespace: &str, name: &str, replicas: i32) {
        self.processor
            .desired_replicas
            .with_label_values(&[namespace, name])
            .set(i64::from(replicas));
    }

    /// Records whether the processor is Ready.
    pub fn ready(&self, namespace: &str, name: &str, ready: bool) {
        self.processor
            .ready
            .with_label_values(&[namespace, name])
            .set(i64::from(ready));
    }

    /// Counts leases freed by fast failover.
    pub fn leases_freed(&self, namespace: &str, name: &str, count: usize) {
        self.processor
            .leases_freed
            .with_label_values(&[namespace, name])
            .inc_by(count as u64);
    }

    /// Removes every series of a processor (deleted, or no longer led by this replica).
    pub fn forget(&self, namespace: &str, name: &str) {
        let labels = [namespace, name];
        let series = &self.processor;
        for gauge in [
            &series.estimated_lag,
            &series.leases,
            &series.leases_with_lag,
            &series.lease_owners,
            &series.leases_unowned,
            &series.desired_replicas,
            &series.ready,
        ] {
            let _ = gauge.remove_label_values(&labels);
        }
        let _ = series.estimate_duration.remove_label_values(&labels);
        let _ = series.leases_freed.remove_label_values(&labels);
        for reason in ESTIMATE_ERROR_REASONS {
            let _ = series.estimate_errors.remove_label_values(&[namespace, name, reason]);
        }
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
}
