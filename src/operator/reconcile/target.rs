//! What the operator reads for a resource (estimates, lease cleanup): the accounts with the
//! credentials from the referenced Secrets, the containers and the processor options. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;

use kube::ResourceExt;

use crate::cosmos::{AccountAuth, AuthMethod};
use crate::operator::boundary::accounts::{AllowListFile, NotAllowed, SignIn};
use crate::operator::crd::{ChangeFeedProcessor, Connection};
use crate::operator::scaling::estimates::{AccountRef, EstimateTarget, OPERATOR_INSTANCE};
use crate::operator::spec_values::ConfigProblem;

/// Why the operator's own credential for a connection is not at hand.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    /// `auth: Key` without a `keySecretRef`.
    #[error("connection.keySecretRef is needed with auth Key")]
    NoSecretRef,
    /// The referenced Secret, or its key, is missing.
    #[error("Secret {name:?} key {key:?} is needed")]
    SecretKeyMissing {
        /// The Secret's name.
        name: String,
        /// The key in it.
        key: String,
    },
}

/// Why the operator cannot tell what to read for a resource.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// A credential is not at hand.
    #[error(transparent)]
    Credential(#[from] CredentialError),
    /// The cluster admin has not allowed the operator to reach an account for this namespace.
    #[error(transparent)]
    NotAllowed(#[from] NotAllowed),
    /// The spec does not make valid processor options.
    #[error("{}", .0.message)]
    Options(ConfigProblem),
}

/// What the operator estimates for `cfp`, with the keys from its Secrets: only where `allowed`
/// lets it reach both accounts for the resource's namespace (every Cosmos request the operator
/// makes for a resource goes through this).
pub fn estimate_target(
    cfp: &ChangeFeedProcessor,
    found: &BTreeMap<String, Secret>,
    allowed: &AllowListFile,
) -> Result<EstimateTarget, TargetError> {
    reachable(cfp, allowed)?;
    let spec = &cfp.spec;
    // The estimate reads where the workers read: both accounts in the resource's regions.
    let account = AccountRef {
        endpoint: spec.connection.endpoint.clone(),
        auth: account_auth(found, &spec.connection)?,
        preferred_regions: spec.preferred_regions.clone(),
    };
    let lease_account = match &spec.leases.connection {
        Some(connection) => Some(AccountRef {
            endpoint: connection.endpoint.clone(),
            auth: account_auth(found, connection)?,
            preferred_regions: spec.preferred_regions.clone(),
        }),
        None => None,
    };
    let mut options = crate::processor::ProcessorOptions::try_from(cfp).map_err(TargetError::Options)?;
    options.instance = OPERATOR_INSTANCE.to_owned();
    Ok(EstimateTarget {
        account,
        lease_account,
        database: spec.monitored.database.clone(),
        container: spec.monitored.container.clone(),
        lease_database: spec.lease_database(),
        lease_container: spec.lease_container(),
        options,
        create_leases: spec.create_leases(),
        interval: crate::operator::scaling::spec_policy::estimate_interval(cfp),
        estimation: cfp.spec.autoscaling().estimation,
        autoscaled: cfp.spec.autoscaling.as_ref().is_some_and(|a| a.enabled),
    })
}

/// Whether the operator may reach `cfp`'s accounts as it would sign in there.
pub fn reachable(cfp: &ChangeFeedProcessor, allowed: &AllowListFile) -> Result<(), NotAllowed> {
    let namespace = cfp.namespace().unwrap_or_default();
    let connections = [Some(&cfp.spec.connection), cfp.spec.leases.connection.as_ref()];
    for connection in connections.into_iter().flatten() {
        let sign_in = match connection.auth {
            AuthMethod::Key => SignIn::TenantKey,
            AuthMethod::WorkloadIdentity | AuthMethod::ManagedIdentity => SignIn::OwnIdentity,
        };
        allowed.allows(&connection.endpoint, &namespace, sign_in)?;
    }
    Ok(())
}

/// How the operator itself authenticates to a connection's account: the key from the Secret, or
/// its own workload identity.
pub fn account_auth(found: &BTreeMap<String, Secret>, connection: &Connection) -> Result<AccountAuth, CredentialError> {
    let reference = match (connection.auth, &connection.key_secret_ref) {
        (AuthMethod::WorkloadIdentity, _) => return Ok(AccountAuth::WorkloadIdentity),
        (AuthMethod::ManagedIdentity, _) => return Ok(AccountAuth::ManagedIdentity),
        (AuthMethod::Key, Some(reference)) => reference,
        (AuthMethod::Key, None) => return Err(CredentialError::NoSecretRef),
    };
    found
        .get(&reference.name)
        .and_then(|s| s.data.as_ref())
        .and_then(|d| d.get(&reference.key))
        .map(|v| AccountAuth::Key(String::from_utf8_lossy(&v.0).into_owned()))
        .ok_or_else(|| CredentialError::SecretKeyMissing {
            name: reference.name.clone(),
            key: reference.key.clone(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::crd::ChangeFeedProcessorSpec;
    use k8s_openapi::ByteString;

    /// The account of these tests allowed for every namespace, in a file of its own (the tests
    /// run at once).
    struct Allowed {
        _dir: tempfile::TempDir,
        file: AllowListFile,
    }

    fn allowed() -> Allowed {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("allowed.yaml");
        std::fs::write(
            &path,
            "- endpoint: https://a.documents.azure.com/\n  namespaces: ['*']\n",
        )
        .unwrap();
        Allowed {
            _dir: dir,
            file: AllowListFile::new(Some(path)),
        }
    }

    #[test]
    fn the_operator_reaches_an_account_with_its_identity_only_where_allowed() {
        let identity =
            resource(serde_json::json!({"endpoint": "https://b.documents.azure.com/", "auth": "WorkloadIdentity"}));
        let refused = estimate_target(&identity, &BTreeMap::new(), &allowed().file);
        assert!(matches!(refused, Err(TargetError::NotAllowed(_))), "{refused:?}");
        let mut leases_elsewhere =
            resource(serde_json::json!({"endpoint": "https://a.documents.azure.com/", "auth": "WorkloadIdentity"}));
        leases_elsewhere.spec.leases.connection = identity.spec.connection.clone().into();
        assert!(
            reachable(&leases_elsewhere, &allowed().file).is_err(),
            "the lease account is checked too"
        );
        let plain = resource(
            serde_json::json!({"endpoint": "http://a.documents.azure.com/", "keySecretRef": {"name": "cosmos"}}),
        );
        assert!(
            reachable(&plain, &allowed().file).is_err(),
            "a key over plain http that is not listed"
        );
    }

    fn resource(connection: serde_json::Value) -> ChangeFeedProcessor {
        let spec = serde_json::json!({
            "connection": connection,
            "monitored": {"database": "db", "container": "c"},
        });
        let spec: ChangeFeedProcessorSpec = serde_json::from_value(spec).unwrap();
        ChangeFeedProcessor::new("p", spec)
    }

    fn with_key(value: &str) -> BTreeMap<String, Secret> {
        let secret = Secret {
            data: Some(BTreeMap::from([(
                "key".to_owned(),
                ByteString(value.as_bytes().to_vec()),
            )])),
            ..Default::default()
        };
        BTreeMap::from([("cosmos".to_owned(), secret)])
    }

    type Case<'a> = (
        &'a ChangeFeedProcessor,
        BTreeMap<String, Secret>,
        Result<AccountAuth, CredentialError>,
    );

    #[test]
    fn the_credential_comes_from_the_secret_or_the_identity() {
        let endpoint = "https://a.documents.azure.com/";
        let keyed = resource(serde_json::json!({"endpoint": endpoint, "keySecretRef": {"name": "cosmos"}}));
        let unreferenced = resource(serde_json::json!({"endpoint": endpoint, "auth": "Key"}));
        let identity = resource(serde_json::json!({"endpoint": endpoint, "auth": "WorkloadIdentity"}));
        let cases: [Case<'_>; 4] = [
            (&keyed, with_key("k1"), Ok(AccountAuth::Key("k1".into()))),
            (
                &keyed,
                BTreeMap::new(),
                Err(CredentialError::SecretKeyMissing {
                    name: "cosmos".into(),
                    key: "key".into(),
                }),
            ),
            (&unreferenced, BTreeMap::new(), Err(CredentialError::NoSecretRef)),
            (&identity, BTreeMap::new(), Ok(AccountAuth::WorkloadIdentity)),
        ];
        for (cfp, found, expected) in cases {
            assert_eq!(account_auth(&found, &cfp.spec.connection), expected);
        }
        let missing = estimate_target(&keyed, &BTreeMap::new(), &allowed().file)
            .err()
            .map(|e| e.to_string());
        assert_eq!(missing.as_deref(), Some("Secret \"cosmos\" key \"key\" is needed"));
        assert!(estimate_target(&keyed, &with_key("k1"), &allowed().file).is_ok());
    }

    #[test]
    fn the_estimate_reads_both_accounts_in_the_resource_s_regions() {
        let endpoint = "https://a.documents.azure.com/";
        let mut cfp = resource(serde_json::json!({"endpoint": endpoint, "auth": "WorkloadIdentity"}));
        let default = estimate_target(&cfp, &BTreeMap::new(), &allowed().file).unwrap();
        assert!(default.account.preferred_regions.is_empty(), "the account's own order");
        cfp.spec.preferred_regions = vec!["West Europe".into(), "North Europe".into()];
        cfp.spec.leases.connection = Some(cfp.spec.connection.clone());
        let target = estimate_target(&cfp, &BTreeMap::new(), &allowed().file).unwrap();
        let lease_account = target.lease_account.expect("a lease account");
        assert_eq!(target.account.preferred_regions, ["West Europe", "North Europe"]);
        assert_eq!(lease_account.preferred_regions, ["West Europe", "North Europe"]);
        assert_ne!(
            target.account, default.account,
            "another client: the accounts are keyed by regions too"
        );
    }
}
