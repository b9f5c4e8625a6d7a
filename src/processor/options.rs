//! Processor options with the reference SDK defaults.

use std::time::Duration;

use crate::cosmos::StartFrom;

/// How the processor runs. Defaults are the .NET/Java reference defaults.
#[derive(Debug, Clone)]
pub struct ProcessorOptions {
    /// The deployment-unit name; lease ids are prefixed with it.
    pub processor_name: String,
    /// This instance's name (unique within the processor).
    pub instance: String,
    /// Where a lease with no continuation starts.
    pub start_from: StartFrom,
    /// Maximum documents per page.
    pub max_items: u32,
    /// Wait after a read that returned nothing.
    pub poll_interval: Duration,
    /// How often leases are listed and balanced (backed off up to `expiration` while this
    /// instance is alone with every lease and nothing changes: [`super::listing_schedule`]).
    pub acquire_interval: Duration,
    /// How often owned leases are renewed.
    pub renew_interval: Duration,
    /// A lease not renewed for this long is free to take.
    pub expiration: Duration,
    /// A change feed read taking longer is abandoned and retried.
    pub read_timeout: Duration,
    /// First delay before retrying a failed batch or request; doubles up to `max_backoff`.
    pub min_backoff: Duration,
    /// Longest delay between retries.
    pub max_backoff: Duration,
    /// Retries of a batch the handler fails, and what happens when they are exhausted.
    pub retry: RetryPolicy,
    /// How often handled batches are checkpointed (default: after every batch).
    pub checkpoint: super::CheckpointPolicy,
    /// Checkpoints of another processor (.NET, Java) to start from when this processor has no
    /// leases yet.
    pub adopt: Option<super::AdoptOptions>,
    /// How leases are balanced among instances (default: fair share in one cycle).
    pub balancing: super::balancer::Balancing,
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
}

/// The most batches of one lease with the handler at once.
pub const MAX_IN_FLIGHT_BATCHES: u32 = 64;

/// The most leases a physical partition can be divided into.
pub const MAX_LEASES_PER_PARTITION: u32 = 64;

/// What happens to a batch the handler still fails after [`RetryPolicy::max_attempts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnExhausted {
    /// Keep retrying at the longest backoff and report the lease as stuck; nothing is ever skipped.
    #[default]
    Halt,
    /// Find the failing documents by bisecting the batch, move each to the dead-letter container,
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
            max_attempts: 5,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
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
            start_from: StartFrom::Beginning,
            max_items: 100,
            poll_interval: Duration::from_secs(5),
            acquire_interval: Duration::from_secs(13),
            renew_interval: Duration::from_secs(17),
            expiration: Duration::from_secs(60),
            read_timeout: Duration::from_secs(65),
            min_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            retry: RetryPolicy::default(),
            checkpoint: super::CheckpointPolicy::default(),
            leases_per_partition: 1,
            max_in_flight_batches: 1,
            mode: crate::cosmos::FeedMode::LatestVersion,
            adopt: None,
            balancing: super::balancer::Balancing::Fair,
        }
    }

    /// The delay before retry number `attempt` (0-based): exponential with ±20 % jitter.
    pub fn backoff(&self, attempt: u32) -> Duration {
        exponential_backoff(self.min_backoff, self.max_backoff, attempt)
    }

    /// Checks the timings make sense together.
    pub fn validate(&self) -> Result<(), String> {
        if self.processor_name.is_empty() {
            return Err("the processor name must not be empty".into());
        }
        if self.instance.is_empty() {
            return Err("the instance name must not be empty".into());
        }
        if self.max_items == 0 {
            return Err("max items must be at least 1".into());
        }
        if self.renew_interval >= self.expiration {
            return Err(format!(
                "the lease renew interval ({:?}) must be shorter than the lease expiration ({:?})",
                self.renew_interval, self.expiration
            ));
        }
        if self.acquire_interval.is_zero() || self.renew_interval.is_zero() {
            return Err("lease intervals must be longer than zero".into());
        }
        if self.mode == crate::cosmos::FeedMode::AllVersionsAndDeletes && self.start_from != StartFrom::Now {
            return Err(
                "the all-versions-and-deletes mode starts only from now (or a checkpoint): use --start-from now".into(),
            );
        }
        if self.adopt.is_some() && self.mode != crate::cosmos::FeedMode::LatestVersion {
            return Err("adopting another processor's leases works in the latest-version mode".into());
        }
        if !(1..=MAX_IN_FLIGHT_BATCHES).contains(&self.max_in_flight_batches) {
            return Err(format!(
                "max in-flight batches must be between 1 and {MAX_IN_FLIGHT_BATCHES}"
            ));
        }
        if !(1..=MAX_LEASES_PER_PARTITION).contains(&self.leases_per_partition) {
            return Err(format!(
                "leases per partition must be between 1 and {MAX_LEASES_PER_PARTITION}"
            ));
        }
        if self.retry.max_attempts == 0 {
            return Err("max attempts must be at least 1".into());
        }
        if self.retry.initial_backoff > self.retry.max_backoff {
            return Err(format!(
                "the initial backoff ({:?}) must not be longer than the max backoff ({:?})",
                self.retry.initial_backoff, self.retry.max_backoff
            ));
        }
        Ok(())
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

    #[test]
    fn validation_rejects_renew_slower_than_expiry() {
        let mut options = ProcessorOptions::new("p", "i");
        assert!(options.validate().is_ok());
        options.renew_interval = Duration::from_secs(90);
        assert!(options.validate().unwrap_err().contains("renew interval"));
    }
}
