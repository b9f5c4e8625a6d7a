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
    /// How often leases are listed and balanced.
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
        }
    }

    /// The delay before retry number `attempt` (0-based): exponential with ±20 % jitter.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let base = self
            .min_backoff
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.max_backoff);
        let jitter = 0.8 + fastrand::f64() * 0.4;
        base.mul_f64(jitter)
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
    fn validation_rejects_renew_slower_than_expiry() {
        let mut options = ProcessorOptions::new("p", "i");
        assert!(options.validate().is_ok());
        options.renew_interval = Duration::from_secs(90);
        assert!(options.validate().unwrap_err().contains("renew interval"));
    }
}
