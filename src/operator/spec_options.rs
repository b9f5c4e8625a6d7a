//! A ChangeFeedProcessor's spec as the processor options its workers run with: the one
//! conversion the operator checks a resource with (then the same `validate` the worker runs) and
//! estimates its leases with.

use crate::operator::crd::ChangeFeedProcessor;
use crate::operator::spec_values::{ConfigProblem, count, duration, invalid};
use crate::processor::{AdoptOptions, CheckpointPolicy, ProcessorOptions, RetryPolicy};

/// The instance name the options carry: each worker runs under its pod's name.
pub const POD_NAME: &str = "the-pod-s-name";

impl TryFrom<&ChangeFeedProcessor> for ProcessorOptions {
    type Error = ConfigProblem;

    /// The options of `cfp`'s workers (with [`POD_NAME`] for the instance), unchecked: run
    /// [`ProcessorOptions::validate`] on them.
    fn try_from(cfp: &ChangeFeedProcessor) -> Result<Self, ConfigProblem> {
        let spec = &cfp.spec;
        let mut options = ProcessorOptions::new(cfp.processor_name(), POD_NAME);
        options.start_from = spec
            .start_from
            .parse()
            .map_err(|e| invalid(format!("startFrom: {e}")))?;
        options.max_items = count("maxItems", spec.max_items)?;
        options.poll_interval = duration("pollInterval", &spec.poll_interval)?;
        options.stall_timeout = duration("stallTimeout", &spec.stall_timeout)?;
        let timings = &spec.lease_timings;
        options.acquire_interval = duration("leaseTimings.acquireInterval", &timings.acquire_interval)?;
        options.renew_interval = duration("leaseTimings.renewInterval", &timings.renew_interval)?;
        options.expiration = duration("leaseTimings.expiration", &timings.expiration)?;
        options.leases_per_partition = spec.leases.per_partition;
        options.balancing = spec.leases.balancing.balancing();
        options.max_in_flight_batches = spec.max_in_flight_batches;
        options.mode = spec.mode.mode();
        if let Some(checkpoint) = &spec.checkpoint {
            options.checkpoint = CheckpointPolicy {
                every_batches: count("checkpoint.everyBatches", checkpoint.every_batches)?,
                interval: match &checkpoint.interval {
                    Some(interval) => Some(duration("checkpoint.interval", interval)?),
                    None => None,
                },
            };
        }
        options.adopt = spec.leases.adopt_from.as_ref().map(|a| AdoptOptions {
            layout: a.layout.layout(),
            prefix: a.prefix.clone(),
            force: a.force,
        });
        if let Some(reads) = &spec.read_budget {
            options.read_budget = reads.budget().map_err(|m| invalid(m.to_owned()))?;
            options.read_throughput_bucket = reads.bucket().map_err(|m| invalid(m.to_owned()))?;
        }
        let retry = &spec.handler.retry;
        options.retry = RetryPolicy {
            max_attempts: count("handler.retry.maxAttempts", retry.max_attempts)?,
            initial_backoff: duration("handler.retry.initialBackoff", &retry.initial_backoff)?,
            max_backoff: duration("handler.retry.maxBackoff", &retry.max_backoff)?,
            on_exhausted: spec.handler.on_exhausted,
        };
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processor::OptionField;

    fn resource(spec: serde_json::Value) -> ChangeFeedProcessor {
        let mut full = serde_json::json!({
            "connection": {"endpoint": "https://acct.documents.azure.com:443/", "keySecretRef": {"name": "k"}},
            "monitored": {"database": "db", "container": "orders"},
        });
        if let (Some(full), Some(extra)) = (full.as_object_mut(), spec.as_object()) {
            full.extend(extra.clone());
        }
        let spec = serde_json::from_value(full).expect("a valid spec");
        ChangeFeedProcessor::new("orders", spec)
    }

    #[test]
    fn the_defaults_of_a_resource_are_the_worker_s_defaults() {
        let options = ProcessorOptions::try_from(&resource(serde_json::json!({}))).expect("converts");
        let worker = ProcessorOptions::new("orders", POD_NAME);
        assert_eq!(format!("{options:?}"), format!("{worker:?}"));
        assert!(options.validate().is_ok());
    }

    #[test]
    fn a_resource_is_checked_by_the_worker_s_rules_in_its_own_field_names() {
        let cases = [
            (
                serde_json::json!({"leaseTimings": {"renewInterval": "70s", "expiration": "1m"}}),
                "leaseTimings.renewInterval (70s) must be shorter than leaseTimings.expiration (60s)",
            ),
            (
                serde_json::json!({"mode": "AllVersionsAndDeletes"}),
                "mode AllVersionsAndDeletes starts only from now (or a checkpoint): set startFrom to now",
            ),
            (
                serde_json::json!({"handler": {"retry": {"initialBackoff": "1m"}}}),
                "handler.retry.initialBackoff (60s) must not be longer than handler.retry.maxBackoff (30s)",
            ),
        ];
        for (spec, said) in cases {
            let options = ProcessorOptions::try_from(&resource(spec)).expect("converts");
            let error = options.validate().expect_err("refused");
            assert_eq!(error.describe(OptionField::field), said);
        }
        let unparsable = ProcessorOptions::try_from(&resource(serde_json::json!({"pollInterval": "soon"})));
        assert!(unparsable.is_err_and(|p| p.message.starts_with("pollInterval \"soon\" is not a duration")));
    }

    #[test]
    fn a_read_budget_reaches_the_options_in_either_form_and_a_wrong_one_is_named() {
        use crate::processor::ReadBudget;
        let read = |budget: serde_json::Value| {
            ProcessorOptions::try_from(&resource(serde_json::json!({"readBudget": budget})))
                .map(|o| (o.read_budget, o.read_throughput_bucket))
                .map_err(|p| p.message)
        };
        assert_eq!(
            read(serde_json::json!({"requestUnits": 300})),
            Ok((Some(ReadBudget::RequestUnits(300)), None))
        );
        assert_eq!(
            read(serde_json::json!({"percentOfProvisioned": 25, "throughputBucket": 3})),
            Ok((Some(ReadBudget::PercentOfProvisioned(25)), Some(3)))
        );
        assert_eq!(read(serde_json::json!({"throughputBucket": 1})), Ok((None, Some(1))));
        for (budget, said) in [
            (
                serde_json::json!({"requestUnits": 1, "percentOfProvisioned": 5}),
                "not both",
            ),
            (
                serde_json::json!({"requestUnits": 0}),
                "requestUnits must be at least 1",
            ),
            (serde_json::json!({"percentOfProvisioned": 101}), "between 1 and 100"),
            (
                serde_json::json!({"throughputBucket": 6}),
                "throughputBucket must be between 1 and 5",
            ),
        ] {
            let error = read(budget.clone()).expect_err("refused");
            assert!(error.contains(said), "{budget}: {error}");
        }
    }
}
