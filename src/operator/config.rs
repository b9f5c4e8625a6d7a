//! Whether a `ChangeFeedProcessor` can work as configured, given the Secrets it references. Pure.

use k8s_openapi::api::core::v1::Secret;

use std::collections::BTreeMap;

use crate::cosmos::AuthMethod;
use crate::operator::crd::{ChangeFeedProcessor, SecretKeyRef};
use crate::operator::digest_key::DigestKey;
use crate::operator::spec_values::ConfigProblem;
use crate::operator::spec_values::duration;
use crate::processor::{OptionField, ProcessorOptions};

/// The Secret keys a resource references, with the field that names each: the account keys, then
/// the HTTP handler's header values.
fn secret_references(cfp: &ChangeFeedProcessor) -> Vec<(String, &SecretKeyRef)> {
    let mut references = Vec::new();
    if let Some(key) = &cfp.spec.connection.key_secret_ref {
        references.push(("connection.keySecretRef".to_owned(), key));
    }
    if let Some(key) = cfp
        .spec
        .leases
        .connection
        .as_ref()
        .and_then(|c| c.key_secret_ref.as_ref())
    {
        references.push(("leases.connection.keySecretRef".to_owned(), key));
    }
    if let Some(http) = &cfp.spec.handler.http {
        for header in &http.headers {
            if let Some(source) = &header.value_from {
                let field = format!("handler.http.headers[{}].valueFrom.secretKeyRef", header.name);
                references.push((field, &source.secret_key_ref));
            }
        }
    }
    references
}

/// A digest of the Secret values the workers read (account keys, handler headers), stamped on
/// the pod template so that rotating a key rolls the workers onto it; `None` without any. Never
/// the values themselves, and keyed with the installation's `key` (HMAC-SHA256, the first 8
/// bytes in hex): whoever reads the pod template cannot check guessed values against it.
pub fn secrets_digest(cfp: &ChangeFeedProcessor, found: &BTreeMap<String, Secret>, key: &DigestKey) -> Option<String> {
    use hmac::Mac;
    let references = secret_references(cfp);
    if references.is_empty() {
        return None;
    }
    let mut hasher = key.mac();
    for (field, reference) in references {
        let value = found
            .get(&reference.name)
            .and_then(|s| s.data.as_ref())
            .and_then(|d| d.get(&reference.key));
        hasher.update(field.as_bytes());
        hasher.update(&[0]);
        hasher.update(value.map(|v| v.0.as_slice()).unwrap_or_default());
        hasher.update(&[0]);
    }
    let digest = hasher.finalize().into_bytes();
    Some(digest.iter().take(8).map(|b| format!("{b:02x}")).collect())
}

/// The Secret names a resource references (account keys, handler headers).
pub fn referenced_secrets(cfp: &ChangeFeedProcessor) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for (_, reference) in secret_references(cfp) {
        if !names.contains(&reference.name) {
            names.push(reference.name.clone());
        }
    }
    names
}

/// Checks the resource and the Secrets it references (`lookup` by name).
pub fn check(cfp: &ChangeFeedProcessor, lookup: impl Fn(&str) -> Option<Secret>) -> Result<(), ConfigProblem> {
    let namespace = cfp.metadata.namespace.clone().unwrap_or_default();
    check_auth(cfp)?;
    for (field, reference) in secret_references(cfp) {
        let Some(secret) = lookup(&reference.name) else {
            return Err(ConfigProblem {
                reason: "SecretNotFound",
                message: format!(
                    "Secret {:?} ({field}) does not exist in namespace {namespace:?}; create it with a value under {:?}",
                    reference.name, reference.key
                ),
            });
        };
        let present = secret
            .data
            .as_ref()
            .is_some_and(|d| d.get(&reference.key).is_some_and(|v| !v.0.is_empty()))
            || secret
                .string_data
                .as_ref()
                .is_some_and(|d| d.get(&reference.key).is_some_and(|v| !v.is_empty()));
        if !present {
            return Err(ConfigProblem {
                reason: "SecretKeyMissing",
                message: format!(
                    "Secret {:?} has no non-empty key {:?} ({field}.key); add the value under that key",
                    reference.name, reference.key
                ),
            });
        }
    }
    let invalid = |message: String| ConfigProblem {
        reason: "InvalidConfiguration",
        message,
    };
    // The workers' options, checked by the rules the worker itself runs.
    let options = ProcessorOptions::try_from(cfp)?;
    options
        .validate()
        .map_err(|e| invalid(e.describe(OptionField::field)))?;
    duration("leases.cleanupTimeout", &cfp.spec.leases.cleanup_timeout)?;
    let handler = &cfp.spec.handler;
    if let Some(http) = &handler.http {
        duration("handler.http.timeout", &http.timeout)?;
    }
    if options.dead_letters() && cfp.spec.dead_letter.is_none() {
        return Err(invalid(
            "handler.onExhausted DeadLetter needs deadLetter.container".into(),
        ));
    }
    if let Some(scaling) = &cfp.spec.autoscaling {
        if scaling.min_replicas > scaling.max_replicas {
            return Err(invalid(format!(
                "autoscaling.minReplicas ({}) is greater than autoscaling.maxReplicas ({})",
                scaling.min_replicas, scaling.max_replicas
            )));
        }
        if let Some(window) = &scaling.scale_down_stabilization {
            duration("autoscaling.scaleDownStabilization", window)?;
        }
        if duration("autoscaling.estimateInterval", &scaling.estimate_interval)?.is_zero() {
            return Err(invalid("autoscaling.estimateInterval must be longer than zero".into()));
        }
        if scaling.enabled && scaling.estimation == crate::operator::crd::Estimation::Disabled {
            return Err(invalid(
                "autoscaling.enabled needs an estimate: set autoscaling.estimation to WorkerReports or ChangeFeed, or turn autoscaling off (KEDA or an HPA on /scale)".into(),
            ));
        }
    }
    Ok(())
}

/// Each connection has the credential its auth mode needs; workload identity runs the pods as a
/// service account (the one its federated identity trusts).
fn check_auth(cfp: &ChangeFeedProcessor) -> Result<(), ConfigProblem> {
    let connections = [
        ("connection", Some(&cfp.spec.connection)),
        ("leases.connection", cfp.spec.leases.connection.as_ref()),
    ];
    for (field, connection) in connections {
        let Some(connection) = connection else { continue };
        let message = match (connection.auth, &connection.key_secret_ref) {
            (AuthMethod::Key, None) => format!("{field}.keySecretRef is needed with auth Key"),
            (AuthMethod::WorkloadIdentity | AuthMethod::ManagedIdentity, Some(_)) => {
                format!("{field}.keySecretRef must be left out with auth WorkloadIdentity")
            }
            (AuthMethod::ManagedIdentity, None) => {
                format!("{field}.auth ManagedIdentity is not offered to pods: use WorkloadIdentity")
            }
            (AuthMethod::WorkloadIdentity, None) if cfp.spec.worker.service_account_name.is_none() => format!(
                "{field}.auth WorkloadIdentity needs worker.serviceAccountName: the service account whose federated identity may use the account"
            ),
            _ => continue,
        };
        return Err(ConfigProblem {
            reason: "InvalidConfiguration",
            message,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::crd::ChangeFeedProcessorSpec;
    use k8s_openapi::ByteString;
    use std::collections::BTreeMap;

    fn resource(extra: serde_json::Value) -> ChangeFeedProcessor {
        let mut spec = serde_json::json!({
            "connection": {"endpoint": "https://a.documents.azure.com/", "keySecretRef": {"name": "cosmos"}},
            "monitored": {"database": "db", "container": "c"},
        });
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        let spec: ChangeFeedProcessorSpec = serde_json::from_value(spec).unwrap();
        let mut cfp = ChangeFeedProcessor::new("p", spec);
        cfp.metadata.namespace = Some("ns".into());
        cfp
    }

    fn secret(key: &str, value: &str) -> Secret {
        Secret {
            data: Some(BTreeMap::from([(
                key.to_owned(),
                ByteString(value.as_bytes().to_vec()),
            )])),
            ..Default::default()
        }
    }

    #[test]
    fn the_secrets_digest_follows_the_referenced_values_and_the_key_and_never_shows_them() {
        let with = |value: &str| BTreeMap::from([("cosmos".to_owned(), secret("key", value))]);
        let cfp = resource(serde_json::json!({}));
        let key = DigestKey::from_bytes([1; 64]);
        let digest = |cfp: &ChangeFeedProcessor, found: &BTreeMap<String, Secret>| secrets_digest(cfp, found, &key);
        let first = digest(&cfp, &with("key-one")).unwrap();
        let identity = resource(serde_json::json!({
            "connection": {"endpoint": "https://a.documents.azure.com/", "auth": "WorkloadIdentity"}}));
        let other_key = DigestKey::from_bytes([2; 64]);
        let cases: Vec<(&str, Option<String>, bool)> = vec![
            ("same value", digest(&cfp, &with("key-one")), true),
            ("rotated key", digest(&cfp, &with("key-two")), false),
            ("missing Secret", digest(&cfp, &BTreeMap::new()), false),
            ("no Secret referenced", digest(&identity, &with("key-one")), false),
            (
                "another installation",
                secrets_digest(&cfp, &with("key-one"), &other_key),
                false,
            ),
        ];
        for (name, digest, same) in cases {
            assert_eq!(digest.as_deref() == Some(first.as_str()), same, "{name}: {digest:?}");
        }
        assert_eq!(first.len(), 16);
        assert!(!first.contains("key-one"));
        // Not the plain hash of what it covers: that one can be checked against guessed values.
        let plain = {
            use sha2::Digest;
            let hash = sha2::Sha256::digest(b"connection.keySecretRef\0key-one\0");
            hash.iter().take(8).map(|b| format!("{b:02x}")).collect::<String>()
        };
        assert_ne!(first, plain);
        assert_eq!(digest(&identity, &BTreeMap::new()), None);
    }

    #[test]
    fn table() {
        let cases: Vec<(&str, serde_json::Value, Option<Secret>, Option<&str>)> = vec![
            ("valid", serde_json::json!({}), Some(secret("key", "k")), None),
            ("missing secret", serde_json::json!({}), None, Some("SecretNotFound")),
            (
                "missing key",
                serde_json::json!({}),
                Some(secret("other", "k")),
                Some("SecretKeyMissing"),
            ),
            (
                "empty key",
                serde_json::json!({}),
                Some(secret("key", "")),
                Some("SecretKeyMissing"),
            ),
            (
                "bad start",
                serde_json::json!({"startFrom": "yesterday"}),
                Some(secret("key", "k")),
                Some("InvalidConfiguration"),
            ),
            (
                "time start",
                serde_json::json!({"startFrom": "2026-01-31T12:00:00Z"}),
                Some(secret("key", "k")),
                None,
            ),
            (
                "renew slower than expiry",
                serde_json::json!({"leaseTimings": {"acquireInterval": "1s", "renewInterval": "90s", "expiration": "60s"}}),
                Some(secret("key", "k")),
                Some("InvalidConfiguration"),
            ),
            (
                "missing header secret",
                serde_json::json!({"handler": {"type": "Http", "http": {"url": "http://localhost:8080/",
                    "headers": [{"name": "Authorization", "valueFrom": {"secretKeyRef": {"name": "handler", "key": "token"}}}]}}}),
                Some(secret("key", "k")),
                Some("SecretKeyMissing"),
            ),
            (
                "backoff upside down",
                serde_json::json!({"handler": {"retry": {"initialBackoff": "1m", "maxBackoff": "1s"}}}),
                Some(secret("key", "k")),
                Some("InvalidConfiguration"),
            ),
            (
                "dead letter without a container",
                serde_json::json!({"handler": {"onExhausted": "DeadLetter"}}),
                Some(secret("key", "k")),
                Some("InvalidConfiguration"),
            ),
            (
                "zero estimate interval",
                serde_json::json!({"autoscaling": {"estimateInterval": "0s"}}),
                Some(secret("key", "k")),
                Some("InvalidConfiguration"),
            ),
            (
                "autoscaling without an estimate",
                serde_json::json!({"autoscaling": {"enabled": true, "estimation": "Disabled"}}),
                Some(secret("key", "k")),
                Some("InvalidConfiguration"),
            ),
            (
                "no estimate for KEDA",
                serde_json::json!({"autoscaling": {"estimation": "Disabled"}}),
                Some(secret("key", "k")),
                None,
            ),
            (
                "workload identity needs no Secret",
                serde_json::json!({"connection": {"endpoint": "https://a.documents.azure.com:443/", "auth": "WorkloadIdentity"},
                    "worker": {"serviceAccountName": "orders-identity"}}),
                None,
                None,
            ),
            (
                "workload identity without a service account",
                serde_json::json!({"connection": {"endpoint": "https://a.documents.azure.com:443/", "auth": "WorkloadIdentity"}}),
                None,
                Some("InvalidConfiguration"),
            ),
            (
                "key auth without a key",
                serde_json::json!({"connection": {"endpoint": "https://a.documents.azure.com:443/"}}),
                None,
                Some("InvalidConfiguration"),
            ),
            (
                "lease account: workload identity with a key",
                serde_json::json!({"leases": {"connection": {"endpoint": "https://l.documents.azure.com:443/", "auth": "WorkloadIdentity",
                    "keySecretRef": {"name": "l"}}}, "worker": {"serviceAccountName": "orders-identity"}}),
                Some(secret("key", "k")),
                Some("InvalidConfiguration"),
            ),
            (
                "min over max",
                serde_json::json!({"autoscaling": {"enabled": true, "minReplicas": 5, "maxReplicas": 2}}),
                Some(secret("key", "k")),
                Some("InvalidConfiguration"),
            ),
        ];
        for (name, spec, secret, want) in cases {
            let got = check(&resource(spec), |_| secret.clone());
            assert_eq!(got.err().map(|p| p.reason), want, "{name}");
        }
    }

    #[test]
    fn header_secrets_are_referenced() {
        let cfp = resource(
            serde_json::json!({"handler": {"type": "Http", "http": {"url": "http://localhost:8080/",
            "headers": [{"name": "Authorization", "valueFrom": {"secretKeyRef": {"name": "handler", "key": "token"}}},
                        {"name": "X-Tenant", "value": "t1"}]}}}),
        );
        assert_eq!(
            referenced_secrets(&cfp),
            vec!["cosmos".to_owned(), "handler".to_owned()]
        );
        let both = |name: &str| match name {
            "cosmos" => Some(secret("key", "k")),
            _ => Some(secret("token", "t")),
        };
        assert_eq!(check(&cfp, both), Ok(()));
        let problem = check(&cfp, |name| (name == "cosmos").then(|| secret("key", "k"))).unwrap_err();
        assert_eq!(problem.reason, "SecretNotFound");
        assert!(
            problem.message.contains("handler.http.headers[Authorization]"),
            "{}",
            problem.message
        );
    }

    #[test]
    fn messages_name_the_secret_and_key() {
        let problem = check(&resource(serde_json::json!({})), |_| None).unwrap_err();
        assert!(
            problem.message.contains("\"cosmos\"") && problem.message.contains("\"key\""),
            "{}",
            problem.message
        );
    }

    proptest::proptest! {
        /// Every duration the CRD's rule accepts (`^([0-9]+(ms|s|m|h))+$`, such as `1m30s`) is one
        /// the operator reads, with the value its parts add up to: the API server never admits a
        /// duration the operator then reports as invalid.
        #[test]
        fn every_duration_the_crd_accepts_is_read_as_written(
            parts in proptest::collection::vec((0u64..100_000, 0usize..4), 1..4),
        ) {
            let units = [("ms", 1u64), ("s", 1_000), ("m", 60_000), ("h", 3_600_000)];
            let text: String = parts.iter().map(|(n, u)| format!("{n}{}", units[*u].0)).collect();
            let millis: u64 = parts.iter().map(|(n, u)| n * units[*u].1).sum();
            let parsed = humantime::parse_duration(&text);
            proptest::prop_assert!(parsed.is_ok(), "{text:?}: {parsed:?}");
            proptest::prop_assert_eq!(parsed.unwrap_or_default(), std::time::Duration::from_millis(millis), "{}", text);
        }
    }
}
