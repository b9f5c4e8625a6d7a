//! Operator metrics: reconciliations, their errors by reason and duration, and leadership.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{Encoder, Histogram, HistogramOpts, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};

/// The operator's metrics.
pub struct OperatorMetrics {
    registry: Registry,
    reconciles: IntCounterVec,
    errors: IntCounterVec,
    duration: Histogram,
    leader: IntGauge,
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
        Ok(Arc::new(Self {
            registry,
            reconciles,
            errors,
            duration,
            leader,
        }))
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
