//! Worker metrics in the Prometheus text format, and the `/metrics`, `/healthz`, `/readyz`
//! endpoints. Every metric is prefixed `cfp_` and labelled with `processor`.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{
    CounterVec, Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::processor::{LeaseEstimate, LeaseEvent, ProcessorMonitor, ProcessorObserver};

/// The worker's metrics.
pub struct WorkerMetrics {
    registry: Registry,
    processor: String,
    documents: IntCounterVec,
    batches: IntCounterVec,
    handler_errors: IntCounterVec,
    handler_duration: HistogramVec,
    leases_owned: IntGaugeVec,
    leases_acquired: IntCounterVec,
    leases_closed: IntCounterVec,
    checkpoint_duration: HistogramVec,
    read_duration: HistogramVec,
    request_charge: CounterVec,
    lease_request_charge: CounterVec,
    read_errors: IntCounterVec,
    read_retries: IntCounterVec,
    estimated_lag: IntGaugeVec,
    oldest_pending: IntGaugeVec,
    lease_stuck: IntGaugeVec,
    lease_stalled: IntGaugeVec,
    stalls: IntCounterVec,
    dead_lettered: IntCounterVec,
    lease_errors: IntCounterVec,
    lease_writes_throttled: IntCounterVec,
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> Result<IntCounterVec, prometheus::Error> {
    let metric = IntCounterVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

fn request_units(registry: &Registry, name: &str, help: &str) -> Result<CounterVec, prometheus::Error> {
    let metric = CounterVec::new(Opts::new(name, help), &["processor"])?;
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: Vec<f64>,
) -> Result<HistogramVec, prometheus::Error> {
    let metric = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), &["processor"])?;
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> Result<IntGaugeVec, prometheus::Error> {
    let metric = IntGaugeVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

const LATENCY_BUCKETS: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

impl WorkerMetrics {
    /// Registers the metrics of processor `processor` in a new registry.
    // This function is longer than the limit because it is the catalogue of the worker's metrics,
    // one registration (name, help, labels) each: split, the catalogue would be scattered.
    pub fn new(processor: &str) -> Result<Arc<Self>, prometheus::Error> {
        let registry = Registry::new();
        let p = &["processor"];
        let request_charge = request_units(
            &registry,
            "cfp_feed_request_charge_total",
            "Request units charged for change feed reads.",
        )?;
        let lease_request_charge = request_units(
            &registry,
            "cfp_lease_request_charge_total",
            "Request units charged for lease-container requests (renewals, checkpoints, listings, acquisitions).",
        )?;
        let metrics = Self {
            documents: counter(
                &registry,
                "cfp_documents_processed_total",
                "Documents handled successfully.",
                p,
            )?,
            batches: counter(
                &registry,
                "cfp_batches_processed_total",
                "Batches handled successfully.",
                p,
            )?,
            handler_errors: counter(
                &registry,
                "cfp_handler_errors_total",
                "Batches the handler failed (each is retried).",
                p,
            )?,
            handler_duration: histogram(
                &registry,
                "cfp_handler_duration_seconds",
                "Time the handler took per batch.",
                LATENCY_BUCKETS.to_vec(),
            )?,
            leases_owned: gauge(&registry, "cfp_leases_owned", "Leases this instance processes now.", p)?,
            leases_acquired: counter(
                &registry,
                "cfp_leases_acquired_total",
                "Leases acquired; `stolen` says whether from a live owner.",
                &["processor", "stolen"],
            )?,
            leases_closed: counter(
                &registry,
                "cfp_leases_closed_total",
                "Leases this instance stopped processing, by reason: shutdown (released), split, lease_lost, lease_gone, error, panic (released).",
                &["processor", "reason"],
            )?,
            checkpoint_duration: histogram(
                &registry,
                "cfp_checkpoint_duration_seconds",
                "Time a checkpoint write took.",
                LATENCY_BUCKETS.to_vec(),
            )?,
            read_duration: histogram(
                &registry,
                "cfp_feed_read_duration_seconds",
                "Time a change feed page read took (including empty polls).",
                LATENCY_BUCKETS.to_vec(),
            )?,
            request_charge,
            lease_request_charge,
            read_errors: counter(
                &registry,
                "cfp_feed_read_errors_total",
                "Change feed reads that failed, by kind (transient ones are retried with backoff).",
                &["processor", "kind"],
            )?,
            read_retries: counter(
                &registry,
                "cfp_feed_read_retries_total",
                "Attempts the Cosmos SDK repeated within change feed reads that then succeeded (throttling, 503, timeouts).",
                &["processor"],
            )?,
            estimated_lag: gauge(
                &registry,
                "cfp_estimated_lag",
                "Estimated remaining operations per owned lease.",
                &["processor", "lease"],
            )?,
            oldest_pending: gauge(
                &registry,
                "cfp_lease_oldest_pending_seconds",
                "Per owned lease, how old the oldest change not handled yet is (from its _ts, read with the lag; 0 when nothing is pending).",
                &["processor", "lease"],
            )?,
            lease_stuck: gauge(
                &registry,
                "cfp_lease_stuck",
                "1 while a lease halts on a batch its handler keeps failing (on-exhausted halt).",
                &["processor", "lease"],
            )?,
            lease_stalled: gauge(
                &registry,
                "cfp_lease_stalled",
                "1 while a lease is stalled: it has not advanced for the stall timeout though it may have lag (its reader was restarted; released if it stays stalled).",
                &["processor", "lease"],
            )?,
            stalls: counter(
                &registry,
                "cfp_lease_stalls_total",
                "Stalled leases, by what was done: restarted (the reader, from the checkpoint) or released (for another instance).",
                &["processor", "action"],
            )?,
            dead_lettered: counter(
                &registry,
                "cfp_documents_dead_lettered_total",
                "Documents the handler kept failing, moved to the dead-letter container.",
                p,
            )?,
            lease_errors: counter(
                &registry,
                "cfp_lease_errors_total",
                "Failed steps of the lease work (each retried), by reason: heartbeat, listing, acquire, renew, checkpoint, recreate, create_missing, open_feed, read_feed, partition_key_range_lease, child_lease, delete_split_parent, handler, no_dead_letter_store, dead_letter; and problems found in the lease container (invalid_document, overlapping_range: skipped).",
                &["processor", "reason"],
            )?,
            lease_writes_throttled: counter(
                &registry,
                "cfp_lease_writes_throttled_total",
                "Lease writes (checkpoints, lease moves, heartbeats) the lease container refused for its provisioned throughput (429); each waits and is sent again, heartbeats first.",
                p,
            )?,
            registry,
            processor: processor.to_owned(),
        };
        for reason in [
            "shutdown",
            "split",
            "lease_lost",
            "lease_gone",
            "error",
            "panic",
            "stalled",
        ] {
            metrics.leases_closed.with_label_values(&[processor, reason]);
        }
        for action in ["restarted", "released"] {
            metrics.stalls.with_label_values(&[processor, action]);
        }
        for stolen in ["true", "false"] {
            metrics.leases_acquired.with_label_values(&[processor, stolen]);
        }
        metrics.documents.with_label_values(&[processor]);
        metrics.batches.with_label_values(&[processor]);
        metrics.handler_errors.with_label_values(&[processor]);
        metrics.dead_lettered.with_label_values(&[processor]);
        metrics.leases_owned.with_label_values(&[processor]);
        metrics.request_charge.with_label_values(&[processor]);
        metrics.lease_request_charge.with_label_values(&[processor]);
        Ok(Arc::new(metrics))
    }

    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buffer);
        String::from_utf8(buffer).unwrap_or_default()
    }

    /// Brings the lease-container charge counter up to `total`, the store's charge so far.
    pub fn set_lease_request_charge(&self, total: f64) {
        let counter = self.lease_request_charge.with_label_values(&[&self.processor]);
        let added = total - counter.get();
        if added > 0.0 {
            counter.inc_by(added);
        }
    }

    /// Replaces the per-lease lag and freshness gauges with `estimates`.
    pub fn set_lag(&self, estimates: &[LeaseEstimate]) {
        self.estimated_lag.reset();
        self.oldest_pending.reset();
        for estimate in estimates.iter().filter(|e| e.error.is_none()) {
            let labels = [self.processor.as_str(), estimate.lease_token.as_str()];
            let lag = i64::try_from(estimate.lag).unwrap_or(i64::MAX);
            self.estimated_lag.with_label_values(&labels).set(lag);
            if let Some(age) = estimate.oldest_pending_seconds {
                self.oldest_pending
                    .with_label_values(&labels)
                    .set(i64::try_from(age).unwrap_or(i64::MAX));
            }
        }
    }
}

impl ProcessorObserver for WorkerMetrics {
    fn feed_read(&self, _lease: &str, elapsed: Duration, request_charge: f64) {
        self.read_duration
            .with_label_values(&[&self.processor])
            .observe(elapsed.as_secs_f64());
        self.request_charge
            .with_label_values(&[&self.processor])
            .inc_by(request_charge.max(0.0));
    }

    fn handler_done(&self, _lease: &str, elapsed: Duration, ok: bool, documents: usize) {
        let p = [self.processor.as_str()];
        self.handler_duration
            .with_label_values(&p)
            .observe(elapsed.as_secs_f64());
        if ok {
            self.batches.with_label_values(&p).inc();
            self.documents.with_label_values(&p).inc_by(documents as u64);
        } else {
            self.handler_errors.with_label_values(&p).inc();
        }
    }

    fn lease_error(&self, reason: &str) {
        self.lease_errors
            .with_label_values(&[self.processor.as_str(), reason])
            .inc();
    }

    fn lease_writes_throttled(&self, count: u64) {
        self.lease_writes_throttled
            .with_label_values(&[self.processor.as_str()])
            .inc_by(count);
    }

    fn feed_read_retried(&self, _lease: &str, retries: u32) {
        self.read_retries
            .with_label_values(&[self.processor.as_str()])
            .inc_by(u64::from(retries));
    }

    fn feed_read_failed(&self, _lease: &str, kind: &str) {
        self.read_errors
            .with_label_values(&[self.processor.as_str(), kind])
            .inc();
    }

    fn lease_stuck(&self, lease: &str, stuck: bool) {
        self.lease_stuck
            .with_label_values(&[self.processor.as_str(), lease])
            .set(i64::from(stuck));
    }

    fn lease_stalled(&self, lease: &str, stalled: bool) {
        let processor = self.processor.as_str();
        self.lease_stalled
            .with_label_values(&[processor, lease])
            .set(i64::from(stalled));
        if stalled {
            self.stalls.with_label_values(&[processor, "restarted"]).inc();
        }
    }

    fn stalled_lease_released(&self, lease: &str) {
        let processor = self.processor.as_str();
        self.lease_stalled.with_label_values(&[processor, lease]).set(0);
        self.stalls.with_label_values(&[processor, "released"]).inc();
    }

    fn dead_lettered(&self, _lease: &str, documents: usize) {
        self.dead_lettered
            .with_label_values(&[self.processor.as_str()])
            .inc_by(documents as u64);
    }

    fn checkpointed(&self, _lease: &str, elapsed: Duration) {
        self.checkpoint_duration
            .with_label_values(&[&self.processor])
            .observe(elapsed.as_secs_f64());
    }

    fn leases_owned(&self, count: usize) {
        self.leases_owned
            .with_label_values(&[&self.processor])
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    fn lease_event(&self, event: &LeaseEvent) {
        match event {
            LeaseEvent::Acquired { previous_owner, .. } => {
                let stolen = if previous_owner.is_some() { "true" } else { "false" };
                self.leases_acquired
                    .with_label_values(&[self.processor.as_str(), stolen])
                    .inc();
            }
            LeaseEvent::Closed { reason, .. } => {
                self.leases_closed
                    .with_label_values(&[self.processor.as_str(), reason.as_str()])
                    .inc();
            }
            LeaseEvent::Error { reason, .. } => self.lease_error(reason),
            _ => {}
        }
    }
}

/// Serves `/metrics`, `/healthz` (the lease coordinator runs) and `/readyz` (bootstrapped, the
/// lease loop running, every lease's change feed readable and the handler answering) until
/// `shutdown`.
pub async fn serve(
    listener: TcpListener,
    shutdown: CancellationToken,
    metrics: Arc<WorkerMetrics>,
    monitor: ProcessorMonitor,
) {
    crate::http_server::serve(listener, shutdown, move |req| {
        let metrics = metrics.clone();
        let monitor = monitor.clone();
        async move {
            match req.uri().path() {
                "/metrics" => {
                    metrics.set_lease_request_charge(monitor.lease_request_charge());
                    crate::http_server::response(200, "text/plain; version=0.0.4", metrics.render())
                }
                "/healthz" if monitor.is_alive() => crate::http_server::response(200, "text/plain", "ok\n"),
                "/healthz" => crate::http_server::response(503, "text/plain", "the lease coordinator stopped\n"),
                "/readyz" if !monitor.is_ready() => crate::http_server::response(503, "text/plain", "not ready\n"),
                "/readyz" if monitor.read_problem().is_some() => crate::http_server::response(
                    503,
                    "text/plain",
                    format!("not ready: {}\n", monitor.read_problem().unwrap_or_default()),
                ),
                "/readyz" if !monitor.handler_ready().await => {
                    crate::http_server::response(503, "text/plain", "not ready: the handler does not answer\n")
                }
                "/readyz" => crate::http_server::response(200, "text/plain", "ready\n"),
                _ => crate::http_server::response(404, "text/plain", "not found\n"),
            }
        }
    })
    .await;
}

/// Estimates this instance's own leases every `interval` into the lag gauges.
pub async fn estimate_periodically(
    metrics: Arc<WorkerMetrics>,
    monitor: ProcessorMonitor,
    interval: Duration,
    shutdown: CancellationToken,
) {
    loop {
        match monitor.estimate_owned().await {
            Ok(estimates) => metrics.set_lag(&estimates),
            Err(error) => tracing::debug!(%error, "estimating owned leases failed"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_failed_step_of_the_lease_work_is_counted_by_its_reason() {
        let metrics = WorkerMetrics::new("orders").unwrap();
        for reason in ["heartbeat", "renew", "checkpoint", "checkpoint"] {
            metrics.lease_event(&LeaseEvent::Error {
                lease: None,
                reason,
                message: format!("{reason} failed"),
            });
        }
        metrics.lease_error("invalid_document");
        let text = metrics.render();
        for line in [
            "cfp_lease_errors_total{processor=\"orders\",reason=\"heartbeat\"} 1",
            "cfp_lease_errors_total{processor=\"orders\",reason=\"renew\"} 1",
            "cfp_lease_errors_total{processor=\"orders\",reason=\"checkpoint\"} 2",
            "cfp_lease_errors_total{processor=\"orders\",reason=\"invalid_document\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
    }
}
