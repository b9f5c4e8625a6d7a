//! What an estimate of the remaining work says: per lease ([`LeaseEstimate`]: its lag, how old
//! its oldest pending change is, what its owner reported handling) and for the whole processor
//! ([`ProcessorEstimate`]: the totals); a lease's estimate from what its owner told
//! ([`lease_estimate`]). The estimator ([`crate::processor::report::estimator`]) reads the rest.

use serde::Serialize;
use time::OffsetDateTime;

use crate::cosmos::EpkRange;
use crate::processor::leases::capacity_report::{HANDLED_RATE_PROPERTY, handled_as_of, read_units_per_document};
use crate::processor::leases::lag_report::checkpointed_ts;
use crate::processor::leases::lease::{HANDLER_FAILING_PROPERTY, Lease, STALLED_PROPERTY};
use crate::processor::leases::work_report::{WorkTimings, rate_as_of, reported_rate};
use crate::processor::leases::worker_capacity::reported_worker_capacity;
use crate::processor::options::defaults;
use crate::processor::report::keda_reading::KedaReading;

/// The estimate of one lease.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseEstimate {
    /// The lease token.
    pub lease_token: String,
    /// The lease's EPK range.
    pub feed_range: EpkRange,
    /// The owner, if any.
    pub owner: Option<String>,
    /// Remaining operations.
    pub lag: u64,
    /// Seconds since the last checkpoint, when known.
    pub checkpoint_age: Option<u64>,
    /// Whether the lease has a checkpoint; otherwise `lag` counts from the processor's start position.
    pub started: bool,
    /// Set while the lease halts on a batch its handler keeps failing: since when, and the error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handler_failing: Option<String>,
    /// Set while the lease is stalled (no progress though it may have lag): which instance, since
    /// when, and what its reader was doing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stalled: Option<String>,
    /// Why this lease could not be estimated (its `lag` is then 0 and not counted as known).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// How old the oldest change not handled yet is, in seconds (from its `_ts`, read with the
    /// lag; for a lag told by its owner, at most the age of the newest change its checkpoint
    /// covers); 0 when nothing is pending, unknown when a told lag came without that `_ts`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oldest_pending_seconds: Option<u64>,
    /// Documents a second its owner handled of it, as it last reported, faded by how long the
    /// lease was not written since ([`crate::processor::leases::capacity_report`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handled_per_second: Option<f64>,
    /// Request units a document cost its owner to read, as it last reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_units_per_document: Option<f64>,
    /// Operations a second written into the lease's partition, as its owner last reported
    /// ([`crate::processor::leases::work_report`]), faded by how long the lease was not written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition_writes_per_second: Option<f64>,
    /// Documents a second its owner handles while it has work, over all its leases, as it last
    /// reported ([`crate::processor::leases::worker_capacity`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_handled_per_second: Option<f64>,
    /// Change-feed requests this estimate took (0: taken from the owner's report).
    #[serde(skip)]
    pub reads: u32,
}

/// The estimate of a whole processor.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessorEstimate {
    /// The processor name.
    pub processor: String,
    /// Number of leases.
    pub lease_count: usize,
    /// Leases with lag > 0.
    pub leases_with_lag: usize,
    /// Sum of the lags of the leases that could be estimated.
    pub total_lag: u64,
    /// Leases that could not be estimated (see their `error`).
    pub leases_failed: usize,
    /// The age of the oldest change not handled yet over all leases, seconds; unknown when one
    /// lease's is (it could not be read, or its owner told its lag without a `_ts`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oldest_pending_seconds: Option<u64>,
    /// Documents a second the owners handled, over all leases, as they reported (0 without a
    /// report).
    pub handled_per_second: f64,
    /// Request units a document costs to read, on average over the owners' reports.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_units_per_document: Option<f64>,
    /// Documents a second one worker handles while it has work: the owners' reports, averaged
    /// over the owners; `None` without a report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_handled_per_second: Option<f64>,
    /// Operations a second written into the container, as the owners measured their partitions'
    /// (each partition once: [`ProcessorEstimate::with_arrivals`]); `None` without a report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub writes_per_second: Option<f64>,
    /// Per lease, ordered by range.
    pub leases: Vec<LeaseEstimate>,
    /// What KEDA's `azure-cosmosdb` scaler would read of these leases, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keda: Option<KedaReading>,
}

impl ProcessorEstimate {
    /// Totals over per-lease estimates.
    pub fn new(processor: impl Into<String>, mut leases: Vec<LeaseEstimate>) -> Self {
        leases.sort_by(|a, b| a.feed_range.cmp(&b.feed_range));
        Self {
            processor: processor.into(),
            lease_count: leases.len(),
            leases_with_lag: leases.iter().filter(|l| l.lag > 0).count(),
            total_lag: leases.iter().map(|l| l.lag).sum(),
            leases_failed: leases.iter().filter(|l| l.error.is_some()).count(),
            oldest_pending_seconds: leases
                .iter()
                .map(|l| l.oldest_pending_seconds)
                .collect::<Option<Vec<u64>>>()
                .map(|ages| ages.into_iter().max().unwrap_or(0)),
            handled_per_second: leases.iter().filter_map(|l| l.handled_per_second).sum(),
            read_units_per_document: mean(leases.iter().filter_map(|l| l.read_units_per_document)),
            worker_handled_per_second: per_owner_mean(&leases),
            writes_per_second: None,
            leases,
            keda: None,
        }
    }

    /// The same estimate with the writes a second into `partitions` (the container's physical
    /// partitions now): each partition's leases report its rate, so the median of their reports
    /// counts once per partition (the highest of several noisy measures of one rate reads high).
    pub fn with_arrivals(self, partitions: &[EpkRange]) -> Self {
        let mut total = None;
        for partition in partitions {
            let rates: Vec<f64> = self
                .leases
                .iter()
                .filter(|lease| lease.feed_range.overlaps(partition))
                .filter_map(|lease| lease.partition_writes_per_second)
                .collect();
            if let Some(rate) = median(rates) {
                total = Some(total.unwrap_or(0.0) + rate);
            }
        }
        Self {
            writes_per_second: total,
            ..self
        }
    }

    /// The same estimate with what KEDA's scaler would read of its leases.
    pub fn with_keda(self, keda: KedaReading) -> Self {
        Self {
            keda: Some(keda),
            ..self
        }
    }
}

/// The mean of `values`; `None` without any.
fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, count) = values.fold((0.0, 0u32), |(sum, count), v| (sum + v, count + 1));
    (count > 0).then(|| sum / f64::from(count))
}

/// The median of `values` (the mean of the middle two of an even count); `None` without any.
fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    match values.len() {
        0 => None,
        n if n % 2 == 1 => values.get(middle).copied(),
        _ => Some((values.get(middle - 1)? + values.get(middle)?) / 2.0),
    }
}

/// The mean over the owners of what each reports it handles a second while it has work (an
/// owner's leases carry the figure as of their last writes: averaged first).
fn per_owner_mean(leases: &[LeaseEstimate]) -> Option<f64> {
    let mut owners: std::collections::BTreeMap<&str, Vec<f64>> = std::collections::BTreeMap::new();
    for lease in leases {
        if let (Some(owner), Some(rate)) = (lease.owner.as_deref(), lease.worker_handled_per_second) {
            owners.entry(owner).or_default().push(rate);
        }
    }
    mean(owners.values().filter_map(|rates| mean(rates.iter().copied())))
}

/// The estimate of `lease` with `lag` (told, not read: no requests), its checkpoint age at `now`.
pub fn lease_estimate(lease: &Lease, lag: u64, now: OffsetDateTime) -> LeaseEstimate {
    let started = lease.continuation.as_deref().is_some_and(|c| !c.is_empty());
    // A lease without a checkpoint (never started, or rewound) has no checkpoint to be old.
    let checkpoint_age = lease
        .checkpoint_time
        .filter(|_| started)
        .map(|t| u64::try_from((now - t).whole_seconds().max(0)).unwrap_or_default());
    LeaseEstimate {
        lease_token: lease.lease_token.clone(),
        feed_range: lease.range().cloned().unwrap_or_else(EpkRange::full),
        owner: lease.owner.clone().filter(|o| !o.is_empty()),
        lag,
        checkpoint_age,
        started,
        handler_failing: lease.properties.get(HANDLER_FAILING_PROPERTY).cloned(),
        stalled: lease.properties.get(STALLED_PROPERTY).cloned(),
        error: None,
        // Told: nothing pending is exact; a pending change is no older than the newest change the
        // checkpoint covers (an upper bound).
        oldest_pending_seconds: if lag == 0 {
            Some(0)
        } else {
            checkpointed_ts(lease).map(|ts| u64::try_from(now.unix_timestamp() - ts).unwrap_or(0))
        },
        handled_per_second: lease
            .properties
            .contains_key(HANDLED_RATE_PROPERTY)
            .then(|| handled_as_of(lease, now.unix_timestamp())),
        read_units_per_document: read_units_per_document(lease),
        worker_handled_per_second: reported_worker_capacity(lease),
        partition_writes_per_second: reported_rate(lease).map(|_| {
            let timings = WorkTimings::new(defaults::ACQUIRE_INTERVAL, defaults::EXPIRATION);
            rate_as_of(lease, Some(now.unix_timestamp()), timings)
        }),
        reads: 0,
    }
}
