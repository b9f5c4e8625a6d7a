//! A resource's field values read as what they mean (durations, counts), and the problem a
//! value that cannot work is reported as. Pure; used by the configuration check, the spec's
//! processor options and the scaling policy.

use std::time::Duration;

/// A configuration that cannot work, with a reason (CamelCase, for conditions and Events) and a
/// message that says what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// Machine-readable reason.
    pub reason: &'static str,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// A field that does not hold what it must.
pub(crate) fn invalid(message: String) -> ConfigProblem {
    ConfigProblem {
        reason: "InvalidConfiguration",
        message,
    }
}

/// Parses the duration `value` of `field` (`500ms`, `13s`, `5m`).
pub fn duration(field: &str, value: &str) -> Result<Duration, ConfigProblem> {
    humantime::parse_duration(value).map_err(|e| invalid(format!("{field} {value:?} is not a duration: {e}")))
}

/// A count of `field` that must fit the processor's.
pub(crate) fn count(field: &str, value: i32) -> Result<u32, ConfigProblem> {
    u32::try_from(value).map_err(|_| invalid(format!("{field} must be at least 1 (is {value})")))
}
