//! Processor options with the reference SDK defaults.

use std::time::Duration;

use crate::cosmos::StartFrom;

/// How the processor runs. Defaults are the .NET/Java reference defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessorOptions {
    /// The deployment-unit name; lease ids are prefixed with it.
    pub processor_name: String,
    /// This instance's name (unique within the processor).
    pub instance: String,
    /// The UID of the Kubernetes pod this instance runs in (`CFP_POD_UID`, from the downward
    /// API): a heartbeat of this name that another incarnation wrote in the same pod is a
    /// predecessor that has ended (the kubelet restarts a container only once it ended), so its
    /// name and leases are taken over at once. `None`: one lease expiration is waited out.
    pub pod_uid: Option<String>,
    /// Where a lease with no continuation starts.
    pub start_from: StartFrom,
    /// Maximum documents per page.
    pub max_items: u32,
    /// Wait after a read that returned nothing.
    pub poll_interval: Duration,
    /// How often leases are listed and balanced (backed off up to the renew interval while this
    /// instance is alone with every lease and nothing changes:
    /// [`crate::processor::policy::listing_schedule`]).
    pub acquire_interval: Duration,
    /// How often this instance's heartbeat is written (it keeps every owned lease alive), and
    /// how often each lease is renewed while an instance that judges leases one by one is live.
    pub renew_interval: Duration,
    /// A lease not renewed for this long is free to take.
    pub expiration: Duration,
    /// A change feed read taking longer is abandoned and retried.
    pub read_timeout: Duration,
    /// A lease whose handled position has not advanced for this long while it may have lag is
    /// stalled: its reader is restarted once, then the lease released
    /// ([`crate::processor::policy::stall`]). Zero turns detection off.
    pub stall_timeout: Duration,
    /// First delay before retrying a failed batch or request; doubles up to `max_backoff`.
    pub min_backoff: Duration,
    /// Longest delay between retries.
    pub max_backoff: Duration,
    /// Retries of a batch the handler fails, and what happens when they are exhausted.
    pub retry: RetryPolicy,
    /// How often handled batches are checkpointed (default: after every batch).
    pub checkpoint: crate::processor::CheckpointPolicy,
    /// Checkpoints of another processor (.NET, Java) to start from when this processor has no
    /// leases yet.
    pub adopt: Option<crate::processor::AdoptOptions>,
    /// How leases are balanced among instances (default: fair share in one cycle).
    pub balancing: crate::processor::policy::balancer::Balancing,
    /// Which changes are read: the latest version (default), or all versions and deletes.
    pub mode: crate::cosmos::FeedMode,
    /// Batches of one lease with the handler at once (default 1). With more, a slow batch does
    /// not stall its lease: later ones are read and handled meanwhile (no order across them),
    /// and the checkpoint only moves past batches that all finished.
    pub max_in_flight_batches: u32,
    /// Leases per physical partition created at bootstrap (each an equal EPK sub-range), so that
    /// up to this many times the partitions' count of instances share the work. Fixed for a lease
    /// set once created.
    pub leases_per_partition: u32,
    /// How this instance keeps its leases alive: by its heartbeat (default), or each lease on its
    /// own as versions before instance liveness did ([`crate::processor::leases::heartbeat`]).
    pub liveness: crate::processor::LeaseLiveness,
    /// The request units a second the whole fleet's change feed reads may spend
    /// ([`crate::processor::budgets::reads`]); `None`: reads are not paced (they still go at low
    /// priority).
    pub read_budget: Option<ReadBudget>,
    /// The throughput bucket (1–5) change feed reads are sent in (`x-ms-cosmos-throughput-bucket`):
    /// the account's buckets cap what it may spend; `None`: none.
    pub read_throughput_bucket: Option<u8>,
}

/// The most throughput buckets an account has (they are numbered from 1).
pub const MAX_THROUGHPUT_BUCKET: u8 = 5;

/// A read budget for the whole fleet: request units a second, or a percentage of the monitored
/// container's provisioned throughput (its own offer; an autoscale offer's maximum). Written
/// `300` or `25%`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadBudget {
    /// Request units a second.
    RequestUnits(u32),
    /// A percentage (1–100) of the monitored container's provisioned throughput.
    PercentOfProvisioned(u8),
}

impl ReadBudget {
    /// The request units a second it allows, the monitored container being provisioned with
    /// `provisioned` (`None`: not known, or none of its own); `None`: no budget can be set.
    pub fn units(self, provisioned: Option<u64>) -> Option<f64> {
        match self {
            ReadBudget::RequestUnits(units) => Some(f64::from(units)),
            ReadBudget::PercentOfProvisioned(percent) => {
                provisioned.map(|units| units as f64 * f64::from(percent) / 100.0)
            }
        }
    }

    /// Whether its value works: at least 1 request unit, a percentage from 1 to 100.
    pub fn is_valid(self) -> bool {
        match self {
            ReadBudget::RequestUnits(units) => units >= 1,
            ReadBudget::PercentOfProvisioned(percent) => (1..=100).contains(&percent),
        }
    }
}

impl std::fmt::Display for ReadBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadBudget::RequestUnits(units) => write!(f, "{units}"),
            ReadBudget::PercentOfProvisioned(percent) => write!(f, "{percent}%"),
        }
    }
}

impl std::str::FromStr for ReadBudget {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let budget = match s.strip_suffix('%') {
            Some(percent) => percent.trim().parse().ok().map(ReadBudget::PercentOfProvisioned),
            None => s.parse().ok().map(ReadBudget::RequestUnits),
        };
        budget.filter(|b| b.is_valid()).ok_or_else(|| {
            format!("{s:?} is not a read budget: request units a second (300) or a percentage of the monitored container's provisioned throughput from 1% to 100% (25%)")
        })
    }
}

/// The defaults of a processor's options, in one place: [`ProcessorOptions::new`], the worker's
/// flags and the ChangeFeedProcessor's fields all take them from here (the reference SDKs'
/// defaults where they have one).
pub mod defaults {
    use std::time::Duration;

    /// Maximum documents per page.
    pub const MAX_ITEMS: u32 = 100;
    /// Wait after a read that returned nothing.
    pub const POLL_INTERVAL: Duration = Duration::from_secs(5);
    /// How often leases are listed and balanced.
    pub const ACQUIRE_INTERVAL: Duration = Duration::from_secs(13);
    /// How often owned leases are renewed.
    pub const RENEW_INTERVAL: Duration = Duration::from_secs(17);
    /// A lease not renewed for this long is free to take.
    pub const EXPIRATION: Duration = Duration::from_secs(60);
    /// A change feed read taking longer is abandoned and retried.
    pub const READ_TIMEOUT: Duration = Duration::from_secs(65);
    /// A lease that has not advanced for this long while it may have lag is stalled.
    pub const STALL_TIMEOUT: Duration = Duration::from_secs(300);
    /// First delay before retrying a failed request.
    pub const MIN_BACKOFF: Duration = Duration::from_millis(500);
    /// Attempts of a failing batch before the retry policy's `on_exhausted` applies.
    pub const MAX_ATTEMPTS: u32 = 5;
    /// Wait before the first retry of a failing batch.
    pub const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
    /// Longest wait between attempts (of a batch, or of a request).
    pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
    /// Batches of one lease with the handler at once.
    pub const MAX_IN_FLIGHT_BATCHES: u32 = 1;
    /// Leases per physical partition created at bootstrap.
    pub const LEASES_PER_PARTITION: u32 = 1;
    /// Handled batches per checkpoint.
    pub const CHECKPOINT_EVERY_BATCHES: u32 = 1;
    /// An HTTP handler request taking longer fails (and is retried).
    pub const HANDLER_TIMEOUT: Duration = Duration::from_secs(60);

    /// How a duration is written in flags and resources: whole seconds (`13s`), else milliseconds
    /// (`500ms`).
    pub fn text(duration: Duration) -> String {
        if duration.subsec_nanos() == 0 {
            format!("{}s", duration.as_secs())
        } else {
            format!("{}ms", duration.as_millis())
        }
    }
}

/// The most batches of one lease with the handler at once.
pub const MAX_IN_FLIGHT_BATCHES: u32 = 64;

/// The most leases a physical partition can be divided into.
pub const MAX_LEASES_PER_PARTITION: u32 = 64;

/// What happens to a batch the handler still fails after its attempts (`--on-exhausted halt |
/// dead-letter`, `handler.onExhausted: Halt | DeadLetter`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
pub enum OnExhausted {
    /// Keep retrying at the longest backoff and report the lease as stuck; nothing is ever skipped.
    #[default]
    Halt,
    /// Move the failing documents (found by bisecting the batch) to the dead-letter container,
    /// deliver the rest, then checkpoint and go on.
    DeadLetter,
}

/// Retries of a batch the handler fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts before `on_exhausted` applies (at least 1).
    pub max_attempts: u32,
    /// Delay before the first retry; doubles up to `max_backoff` (with ±20 % jitter).
    pub initial_backoff: Duration,
    /// Longest delay between attempts.
    pub max_backoff: Duration,
    /// What happens after `max_attempts` failures.
    pub on_exhausted: OnExhausted,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: defaults::MAX_ATTEMPTS,
            initial_backoff: defaults::INITIAL_BACKOFF,
            max_backoff: defaults::MAX_BACKOFF,
            on_exhausted: OnExhausted::Halt,
        }
    }
}

impl RetryPolicy {
    /// The delay after failed attempt number `attempt` (1-based).
    pub fn backoff(&self, attempt: u32) -> Duration {
        exponential_backoff(self.initial_backoff, self.max_backoff, attempt.saturating_sub(1))
    }
}

/// `initial` doubled `step` times, capped at `max`, with ±20 % jitter.
fn exponential_backoff(initial: Duration, max: Duration, step: u32) -> Duration {
    let base = initial.saturating_mul(1u32 << step.min(16)).min(max);
    base.mul_f64(0.8 + fastrand::f64() * 0.4)
}

impl ProcessorOptions {
    /// Options with the reference defaults for `processor_name` / `instance`.
    pub fn new(processor_name: impl Into<String>, instance: impl Into<String>) -> Self {
        Self {
            processor_name: processor_name.into(),
            instance: instance.into(),
            pod_uid: None,
            start_from: StartFrom::Beginning,
            max_items: defaults::MAX_ITEMS,
            poll_interval: defaults::POLL_INTERVAL,
            acquire_interval: defaults::ACQUIRE_INTERVAL,
            renew_interval: defaults::RENEW_INTERVAL,
            expiration: defaults::EXPIRATION,
            read_timeout: defaults::READ_TIMEOUT,
            stall_timeout: defaults::STALL_TIMEOUT,
            min_backoff: defaults::MIN_BACKOFF,
            max_backoff: defaults::MAX_BACKOFF,
            retry: RetryPolicy::default(),
            checkpoint: crate::processor::CheckpointPolicy::default(),
            leases_per_partition: defaults::LEASES_PER_PARTITION,
            liveness: crate::processor::LeaseLiveness::default(),
            max_in_flight_batches: defaults::MAX_IN_FLIGHT_BATCHES,
            mode: crate::cosmos::FeedMode::LatestVersion,
            adopt: None,
            balancing: crate::processor::policy::balancer::Balancing::Fair,
            read_budget: None,
            read_throughput_bucket: None,
        }
    }

    /// The delay before retry number `attempt` (0-based): exponential with ±20 % jitter.
    pub fn backoff(&self, attempt: u32) -> Duration {
        exponential_backoff(self.min_backoff, self.max_backoff, attempt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let options = ProcessorOptions::new("p", "i");
        assert!(options.backoff(0) <= Duration::from_millis(600));
        assert!(options.backoff(3) >= Duration::from_millis(3200));
        assert!(options.backoff(40) <= Duration::from_secs(36));
    }

    #[test]
    fn handler_retries_back_off_from_the_first_failure() {
        let retry = RetryPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            ..RetryPolicy::default()
        };
        let around =
            |d: Duration, ms: u64| d >= Duration::from_millis(ms * 8 / 10) && d <= Duration::from_millis(ms * 12 / 10);
        assert!(around(retry.backoff(1), 100));
        assert!(around(retry.backoff(3), 400));
        assert!(around(retry.backoff(30), 1000));
    }
}
