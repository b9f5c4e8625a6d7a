//! The operator's own key for the Secret digest on the worker pod template
//! ([`crate::operator::config::secrets_digest`]): random, made once per installation and kept in
//! a Secret in the operator's namespace. Whoever may read a Deployment (the `view` role) reads
//! the digest; keyed, it cannot be checked against guessed Secret values offline. Kept, it is the
//! same across restarts and among replicas: a new key would give every digest anew and roll
//! every processor's workers once.
//!
//! Every replica reads the Secret at start; the first to find none creates it (immutable, so
//! that nobody changes it by accident); a replica whose create meets one created meanwhile
//! reads that one. Deleting the Secret makes a new key at the next start (the workers roll once).

use std::collections::BTreeMap;

use hmac::{Hmac, Mac};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use sha2::Sha256;

/// The Secret's default name (`--digest-key-secret`).
pub const DEFAULT_SECRET: &str = "changefeed-operator-digest-key";
/// The Secret's data key holding the key.
pub const KEY_FIELD: &str = "key";
/// The key's length: HMAC-SHA256's block size, the longest key it uses as it is.
pub const KEY_BYTES: usize = 64;

/// The installation's digest key. Its `Debug` shows no byte of it.
#[derive(Clone, PartialEq, Eq)]
pub struct DigestKey([u8; KEY_BYTES]);

impl std::fmt::Debug for DigestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DigestKey(..)")
    }
}

impl DigestKey {
    /// A key of these bytes (tests, and the Secret's data).
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> Self {
        Self(bytes)
    }

    /// A new random key from the operating system.
    pub fn random() -> Result<Self, DigestKeyError> {
        let mut bytes = [0; KEY_BYTES];
        getrandom::fill(&mut bytes).map_err(|e| DigestKeyError::Random(e.to_string()))?;
        Ok(Self(bytes))
    }

    /// An HMAC-SHA256 keyed with it.
    pub fn mac(&self) -> Hmac<Sha256> {
        Hmac::<Sha256>::new(&self.0.into())
    }
}

/// Why the digest key could not be had.
#[derive(Debug, thiserror::Error)]
pub enum DigestKeyError {
    /// Reading or creating the Secret failed.
    #[error(
        "reading or creating Secret {namespace}/{name}, the key of the workers' Secret digest (RBAC: get and create on that Secret in the operator's namespace): {source}"
    )]
    Kube {
        /// The Secret's namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The failure.
        source: kube::Error,
    },
    /// The Secret exists but holds no key.
    #[error(
        "Secret {namespace}/{name} holds no digest key of {KEY_BYTES} bytes under `{KEY_FIELD}`: delete it (the operator makes a new key, and every processor's workers roll once) or name another with --digest-key-secret"
    )]
    Unusable {
        /// The Secret's namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// The operating system gave no random bytes.
    #[error("no random bytes from the operating system for the digest key: {0}")]
    Random(String),
}

/// The key `secret` holds (`None`: it holds none of the right length).
pub fn key_of(secret: &Secret) -> Option<DigestKey> {
    let bytes = secret.data.as_ref()?.get(KEY_FIELD)?;
    let bytes: [u8; KEY_BYTES] = bytes.0.as_slice().try_into().ok()?;
    Some(DigestKey(bytes))
}

/// The Secret `name` holding `key`, as the operator creates it.
pub fn secret_holding(name: &str, key: &DigestKey) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_owned(),
                "changefeed-operator".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        immutable: Some(true),
        type_: Some("Opaque".to_owned()),
        data: Some(BTreeMap::from([(KEY_FIELD.to_owned(), ByteString(key.0.to_vec()))])),
        ..Secret::default()
    }
}

/// The key in Secret `name` of `secrets` (the operator's namespace, `namespace`), created with
/// a new random key when there is none.
pub async fn load_or_create(secrets: &Api<Secret>, namespace: &str, name: &str) -> Result<DigestKey, DigestKeyError> {
    let kube_error = |source| DigestKeyError::Kube {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        source,
    };
    let unusable = || DigestKeyError::Unusable {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    };
    if let Some(secret) = secrets.get_opt(name).await.map_err(kube_error)? {
        return key_of(&secret).ok_or_else(unusable);
    }
    let key = DigestKey::random()?;
    match secrets
        .create(&PostParams::default(), &secret_holding(name, &key))
        .await
    {
        Ok(_) => {
            tracing::info!(namespace, name, "created the digest key of the workers' Secret digest");
            Ok(key)
        }
        // Another replica created it meanwhile: its key is the installation's.
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let secret = secrets.get(name).await.map_err(kube_error)?;
            key_of(&secret).ok_or_else(unusable)
        }
        Err(error) => Err(kube_error(error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_holds_a_key_only_of_the_right_length_and_the_created_one_reads_back() {
        let key = DigestKey::from_bytes([7; KEY_BYTES]);
        let created = secret_holding("k", &key);
        assert_eq!(key_of(&created), Some(key.clone()));
        assert_eq!(created.immutable, Some(true));
        let with = |field: &str, bytes: Vec<u8>| Secret {
            data: Some(BTreeMap::from([(field.to_owned(), ByteString(bytes))])),
            ..Secret::default()
        };
        // (what the Secret holds, a key read)
        let cases = [
            ("64 bytes under key", with(KEY_FIELD, vec![1; 64]), true),
            ("32 bytes", with(KEY_FIELD, vec![1; 32]), false),
            ("65 bytes", with(KEY_FIELD, vec![1; 65]), false),
            ("another field", with("other", vec![1; 64]), false),
            ("no data", Secret::default(), false),
        ];
        for (name, secret, read) in cases {
            assert_eq!(key_of(&secret).is_some(), read, "{name}");
        }
        assert_eq!(format!("{key:?}"), "DigestKey(..)");
    }

    #[test]
    fn random_keys_differ() {
        let (a, b) = (DigestKey::random().unwrap(), DigestKey::random().unwrap());
        assert_ne!(a, b);
    }
}
