//! The one check of a processor's options. Its errors are typed and name the options they are
//! about ([`OptionField`]), so that each surface says them in its own words: the worker's flags
//! (`--lease-renew-interval`) and the ChangeFeedProcessor's fields (`leaseTimings.renewInterval`).

use std::time::Duration;

use crate::cosmos::{FeedMode, StartFrom};
use crate::processor::leases::lease_ids::check_name;
use crate::processor::options::defaults::text;
use crate::processor::options::{
    MAX_IN_FLIGHT_BATCHES, MAX_LEASES_PER_PARTITION, MAX_THROUGHPUT_BUCKET, OnExhausted, ProcessorOptions, ReadBudget,
};

/// What a processor or instance name may be (it becomes part of lease ids).
const NAME_GRAMMAR: &str = "must be 1 to 128 ASCII letters, digits, '-' and '_', with single dots between them: it becomes part of lease ids, which must not reach into another processor's";

/// An option a check is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionField {
    /// The processor's name.
    ProcessorName,
    /// This instance's name.
    Instance,
    /// Maximum documents per page.
    MaxItems,
    /// How often leases are listed.
    AcquireInterval,
    /// How often leases are renewed.
    RenewInterval,
    /// When an unrenewed lease expires.
    Expiration,
    /// Batches of one lease with the handler at once.
    MaxInFlightBatches,
    /// Leases per physical partition.
    LeasesPerPartition,
    /// Attempts of a failing batch.
    MaxAttempts,
    /// Wait before the first retry of a batch.
    InitialBackoff,
    /// Longest wait between attempts.
    MaxBackoff,
    /// Where leases without a checkpoint start.
    StartFrom,
    /// Which changes are read.
    Mode,
    /// Another processor's checkpoints to adopt.
    Adopt,
    /// What happens after the last attempt.
    OnExhausted,
    /// Wait after an empty read.
    PollInterval,
    /// When a lease that does not advance is stalled.
    StallTimeout,
    /// The fleet's read budget.
    ReadBudget,
    /// The throughput bucket of change feed reads.
    ReadThroughputBucket,
}

impl OptionField {
    /// The option in words.
    pub fn words(self) -> &'static str {
        self.names().0
    }

    /// The worker's flag.
    pub fn flag(self) -> &'static str {
        self.names().1
    }

    /// The ChangeFeedProcessor's field (`spec.` left out).
    pub fn field(self) -> &'static str {
        self.names().2
    }

    fn names(self) -> (&'static str, &'static str, &'static str) {
        match self {
            OptionField::ProcessorName => (
                "processor name",
                "--processor",
                "processorName (default: metadata.name)",
            ),
            OptionField::Instance => ("instance name", "--instance", "metadata.name"),
            OptionField::MaxItems => ("max items", "--max-items", "maxItems"),
            OptionField::AcquireInterval => (
                "lease acquire interval",
                "--lease-acquire-interval",
                "leaseTimings.acquireInterval",
            ),
            OptionField::RenewInterval => (
                "lease renew interval",
                "--lease-renew-interval",
                "leaseTimings.renewInterval",
            ),
            OptionField::Expiration => ("lease expiration", "--lease-expiration", "leaseTimings.expiration"),
            OptionField::MaxInFlightBatches => {
                ("max in-flight batches", "--max-in-flight-batches", "maxInFlightBatches")
            }
            OptionField::LeasesPerPartition => {
                ("leases per partition", "--leases-per-partition", "leases.perPartition")
            }
            OptionField::MaxAttempts => ("max attempts", "--max-attempts", "handler.retry.maxAttempts"),
            OptionField::InitialBackoff => ("initial backoff", "--initial-backoff", "handler.retry.initialBackoff"),
            OptionField::MaxBackoff => ("max backoff", "--max-backoff", "handler.retry.maxBackoff"),
            OptionField::StartFrom => ("start position", "--start-from", "startFrom"),
            OptionField::Mode => ("change feed mode", "--mode", "mode"),
            OptionField::Adopt => ("adoption", "--adopt", "leases.adoptFrom"),
            OptionField::OnExhausted => ("on-exhausted policy", "--on-exhausted", "handler.onExhausted"),
            OptionField::PollInterval => ("poll interval", "--poll-interval", "pollInterval"),
            OptionField::StallTimeout => ("stall timeout", "--stall-timeout", "stallTimeout"),
            OptionField::ReadBudget => ("read budget", "--read-budget", "readBudget"),
            OptionField::ReadThroughputBucket => (
                "read throughput bucket",
                "--read-throughput-bucket",
                "readBudget.throughputBucket",
            ),
        }
    }
}

/// Options that cannot work together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    /// A name is empty.
    #[error("the {} must not be empty", .0.words())]
    Empty(OptionField),
    /// A name that could reach into another processor's lease ids.
    #[error("the {} {NAME_GRAMMAR}", .0.words())]
    NotAName(OptionField),
    /// A count is zero.
    #[error("{} must be at least 1", .0.words())]
    NotPositive(OptionField),
    /// A count is outside what works.
    #[error("{} must be between 1 and {max}", field.words())]
    OutOfRange {
        /// The option.
        field: OptionField,
        /// The largest value that works.
        max: u32,
    },
    /// An interval is zero.
    #[error("the {} must be longer than zero", .0.words())]
    Zero(OptionField),
    /// One duration must be shorter than another.
    #[error("the {} ({}) must be shorter than the {} ({})", shorter.0.words(), text(shorter.1), longer.0.words(), text(longer.1))]
    NotShorter {
        /// The option that must be shorter, with its value.
        shorter: (OptionField, Duration),
        /// The option it must be shorter than, with its value.
        longer: (OptionField, Duration),
    },
    /// One duration must not be longer than another.
    #[error("the {} ({}) must not be longer than the {} ({})", shorter.0.words(), text(shorter.1), longer.0.words(), text(longer.1))]
    Longer {
        /// The option that is too long, with its value.
        shorter: (OptionField, Duration),
        /// The option it must not be longer than, with its value.
        longer: (OptionField, Duration),
    },
    /// The all-versions-and-deletes mode reads only from now (or a checkpoint).
    #[error("the all-versions-and-deletes mode starts only from now (or a checkpoint): use --start-from now")]
    ModeNeedsStartFromNow,
    /// Adoption works in the latest-version mode only.
    #[error("adopting another processor's leases works in the latest-version mode")]
    AdoptNeedsLatestVersion,
}

impl OptionsError {
    /// The message with each option named as `name` says (a flag, a resource field).
    pub fn describe(&self, name: impl Fn(OptionField) -> &'static str) -> String {
        match self {
            OptionsError::Empty(field) => format!("{} must not be empty", name(*field)),
            OptionsError::NotAName(field) => format!("{} {NAME_GRAMMAR}", name(*field)),
            OptionsError::NotPositive(field) => format!("{} must be at least 1", name(*field)),
            OptionsError::OutOfRange { field, max } => format!("{} must be between 1 and {max}", name(*field)),
            OptionsError::Zero(field) => format!("{} must be longer than zero", name(*field)),
            OptionsError::NotShorter { shorter, longer } => format!(
                "{} ({}) must be shorter than {} ({})",
                name(shorter.0),
                text(shorter.1),
                name(longer.0),
                text(longer.1)
            ),
            OptionsError::Longer { shorter, longer } => format!(
                "{} ({}) must not be longer than {} ({})",
                name(shorter.0),
                text(shorter.1),
                name(longer.0),
                text(longer.1)
            ),
            OptionsError::ModeNeedsStartFromNow => {
                // The value as the one who reads it writes it: a flag's value or the resource's.
                let mode = if name(OptionField::Mode) == OptionField::Mode.flag() {
                    "all-versions-and-deletes"
                } else {
                    "AllVersionsAndDeletes"
                };
                format!(
                    "{} {mode} starts only from now (or a checkpoint): set {} to now",
                    name(OptionField::Mode),
                    name(OptionField::StartFrom)
                )
            }
            OptionsError::AdoptNeedsLatestVersion => format!(
                "{} works in the latest-version {} only",
                name(OptionField::Adopt),
                name(OptionField::Mode)
            ),
        }
    }
}

impl ProcessorOptions {
    /// Checks that the options work together.
    pub fn validate(&self) -> Result<(), OptionsError> {
        use OptionField as F;
        let nonempty = [(F::ProcessorName, &self.processor_name), (F::Instance, &self.instance)];
        if let Some((field, _)) = nonempty.iter().find(|(_, value)| value.is_empty()) {
            return Err(OptionsError::Empty(*field));
        }
        for (field, name) in nonempty {
            check_name(name).map_err(|_| OptionsError::NotAName(field))?;
        }
        let counts = [
            (F::MaxItems, self.max_items, None),
            (
                F::MaxInFlightBatches,
                self.max_in_flight_batches,
                Some(MAX_IN_FLIGHT_BATCHES),
            ),
            (
                F::LeasesPerPartition,
                self.leases_per_partition,
                Some(MAX_LEASES_PER_PARTITION),
            ),
            (F::MaxAttempts, self.retry.max_attempts, None),
            (
                F::ReadThroughputBucket,
                self.read_throughput_bucket.map_or(1, u32::from),
                Some(u32::from(MAX_THROUGHPUT_BUCKET)),
            ),
        ];
        for (field, value, max) in counts {
            match max {
                Some(max) if !(1..=max).contains(&value) => return Err(OptionsError::OutOfRange { field, max }),
                None if value == 0 => return Err(OptionsError::NotPositive(field)),
                _ => {}
            }
        }
        match self.read_budget {
            Some(ReadBudget::RequestUnits(0)) => return Err(OptionsError::NotPositive(F::ReadBudget)),
            Some(ReadBudget::PercentOfProvisioned(percent)) if !(1..=100).contains(&percent) => {
                return Err(OptionsError::OutOfRange {
                    field: F::ReadBudget,
                    max: 100,
                });
            }
            _ => {}
        }
        let intervals = [
            (F::AcquireInterval, self.acquire_interval),
            (F::RenewInterval, self.renew_interval),
        ];
        if let Some((field, _)) = intervals.iter().find(|(_, value)| value.is_zero()) {
            return Err(OptionsError::Zero(*field));
        }
        if self.renew_interval >= self.expiration {
            return Err(OptionsError::NotShorter {
                shorter: (F::RenewInterval, self.renew_interval),
                longer: (F::Expiration, self.expiration),
            });
        }
        // An idle lease shows it has no lag once a poll: a stall timeout must leave it time to.
        if !self.stall_timeout.is_zero() && self.poll_interval >= self.stall_timeout {
            return Err(OptionsError::NotShorter {
                shorter: (F::PollInterval, self.poll_interval),
                longer: (F::StallTimeout, self.stall_timeout),
            });
        }
        if self.retry.initial_backoff > self.retry.max_backoff {
            return Err(OptionsError::Longer {
                shorter: (F::InitialBackoff, self.retry.initial_backoff),
                longer: (F::MaxBackoff, self.retry.max_backoff),
            });
        }
        if self.mode == FeedMode::AllVersionsAndDeletes && self.start_from != StartFrom::Now {
            return Err(OptionsError::ModeNeedsStartFromNow);
        }
        if self.adopt.is_some() && self.mode != FeedMode::LatestVersion {
            return Err(OptionsError::AdoptNeedsLatestVersion);
        }
        Ok(())
    }

    /// Whether documents the handler keeps failing go to a dead-letter container.
    pub fn dead_letters(&self) -> bool {
        self.retry.on_exhausted == OnExhausted::DeadLetter
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> ProcessorOptions {
        ProcessorOptions::new("p", "i")
    }

    #[test]
    fn every_rule_refuses_what_cannot_work_and_says_it_for_each_surface() {
        type Change = fn(&mut ProcessorOptions);
        let cases: Vec<(Change, &str, &str)> = vec![
            (
                |o| o.renew_interval = Duration::from_secs(90),
                "the lease renew interval (90s) must be shorter than the lease expiration (60s)",
                "leaseTimings.renewInterval (90s) must be shorter than leaseTimings.expiration (60s)",
            ),
            (
                |o| o.acquire_interval = Duration::ZERO,
                "the lease acquire interval must be longer than zero",
                "leaseTimings.acquireInterval must be longer than zero",
            ),
            (
                |o| o.retry.initial_backoff = Duration::from_millis(40_500),
                "the initial backoff (40500ms) must not be longer than the max backoff (30s)",
                "handler.retry.initialBackoff (40500ms) must not be longer than handler.retry.maxBackoff (30s)",
            ),
            (
                |o| o.leases_per_partition = 65,
                "leases per partition must be between 1 and 64",
                "leases.perPartition must be between 1 and 64",
            ),
            (
                |o| o.max_items = 0,
                "max items must be at least 1",
                "maxItems must be at least 1",
            ),
            (
                |o| o.stall_timeout = Duration::from_secs(5),
                "the poll interval (5s) must be shorter than the stall timeout (5s)",
                "pollInterval (5s) must be shorter than stallTimeout (5s)",
            ),
            (
                |o| o.instance.clear(),
                "the instance name must not be empty",
                "metadata.name must not be empty",
            ),
            (
                |o| o.processor_name = "orders..x".into(),
                "the processor name must be 1 to 128 ASCII letters, digits, '-' and '_', with single dots between them: it becomes part of lease ids, which must not reach into another processor's",
                "processorName (default: metadata.name) must be 1 to 128 ASCII letters, digits, '-' and '_', with single dots between them: it becomes part of lease ids, which must not reach into another processor's",
            ),
            (
                |o| o.instance = "w/1".into(),
                "the instance name must be 1 to 128 ASCII letters, digits, '-' and '_', with single dots between them: it becomes part of lease ids, which must not reach into another processor's",
                "metadata.name must be 1 to 128 ASCII letters, digits, '-' and '_', with single dots between them: it becomes part of lease ids, which must not reach into another processor's",
            ),
            (
                |o| o.mode = FeedMode::AllVersionsAndDeletes,
                "the all-versions-and-deletes mode starts only from now (or a checkpoint): use --start-from now",
                "mode AllVersionsAndDeletes starts only from now (or a checkpoint): set startFrom to now",
            ),
        ];
        assert!(options().validate().is_ok());
        for (change, said, in_the_resource) in cases {
            let mut options = options();
            change(&mut options);
            let error = options.validate().unwrap_err();
            assert_eq!(error.to_string(), said);
            assert_eq!(error.describe(OptionField::field), in_the_resource);
        }
        // The worker's flags, with the flag's own value.
        let mut all_versions = options();
        all_versions.mode = FeedMode::AllVersionsAndDeletes;
        assert_eq!(
            all_versions.validate().unwrap_err().describe(OptionField::flag),
            "--mode all-versions-and-deletes starts only from now (or a checkpoint): set --start-from to now"
        );
    }
}
