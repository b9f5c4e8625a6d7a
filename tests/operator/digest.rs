//! The pod template's Secret digest is keyed by the installation: not the plain hash of the
//! values (whoever may read a Deployment — the `view` role — could check guesses against that
//! offline), the same across operator restarts and replicas (a new digest rolls the workers),
//! and new when a value changes.

use hmac::{Hmac, Mac};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use sha2::{Digest, Sha256};

use crate::common::terminate;
use crate::operator_support::{FAKE_ENDPOINT, Operator, Scene, apply_ok, resource, secret_yaml, wait};

/// The Secret the operator keeps its digest key in (its default name).
const KEY_SECRET: &str = "changefeed-operator-digest-key";

fn digest_of(deployment: &Deployment) -> Option<String> {
    let template = deployment.spec.as_ref()?.template.metadata.as_ref()?;
    template
        .annotations
        .as_ref()?
        .get("changefeed.io/secrets-digest")
        .cloned()
}

/// What the digest is made of: each referencing field and its value, each ended by a zero byte.
fn message(value: &[u8]) -> Vec<u8> {
    [b"connection.keySecretRef\0".as_slice(), value, b"\0"].concat()
}

fn hex8(bytes: &[u8]) -> String {
    bytes.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_secrets_digest_is_keyed_by_the_installation_and_stays_across_restarts() {
    let Scene { plane, ns, client } = Scene::new("digest-key").await;
    apply_ok(plane, &ns, &secret_yaml());
    // Two replicas starting at once: neither finds a key; one creates it, the other reads it.
    let mut first = Operator::start(plane, &ns, "op-a");
    let mut second = Operator::start(plane, &ns, "op-b");
    apply_ok(plane, &ns, &resource("orders", FAKE_ENDPOINT, ""));
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let (digest, generation) = wait("the worker Deployment with a Secret digest", || async {
        let deployment = deployments.get_opt("orders").await.ok()??;
        Some((digest_of(&deployment)?, deployment.metadata.generation?))
    })
    .await;
    let value = changefeed_operator::cosmos::EMULATOR_KEY.as_bytes();
    let plain = hex8(&Sha256::digest(message(value)));
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let holder = secrets.get(KEY_SECRET).await.expect("the operator's digest key Secret");
    let key = holder
        .data
        .as_ref()
        .and_then(|d| d.get("key"))
        .expect("a key")
        .0
        .clone();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("any key length");
    mac.update(&message(value));
    let keyed = hex8(&mac.finalize().into_bytes());
    assert_eq!(holder.immutable, Some(true), "nobody changes the key by accident");
    assert_eq!(key.len(), 64);
    assert_ne!(
        digest, plain,
        "the plain hash of the values can be checked against guesses"
    );
    assert_eq!(digest, keyed, "HMAC-SHA256 with the installation's key");

    // Both replicas stopped, a third started: the same key, the Deployment left as it was.
    terminate(&mut first.child).await;
    terminate(&mut second.child).await;
    let mut third = Operator::start(plane, &ns, "op-c");
    wait("the new replica leading and reconciling", || async {
        let (reconciled, leader) = third.scrape().await?;
        (reconciled > 0 && leader == 1).then_some(())
    })
    .await;
    let after = deployments.get("orders").await.unwrap();
    let restarted = (digest_of(&after), after.metadata.generation);

    // A rotated value: a new digest.
    apply_ok(
        plane,
        &ns,
        &secret_yaml().replace(changefeed_operator::cosmos::EMULATOR_KEY, "cm90YXRlZC1rZXk="),
    );
    let rotated = wait("the rotated key's digest", || async {
        digest_of(&deployments.get_opt("orders").await.ok()??).filter(|d| *d != digest)
    })
    .await;
    println!(
        "Secret digest: {digest} (the plain SHA-256 would be {plain}); after a restart of both replicas {restarted:?} (generation {generation} before); rotated key {rotated}"
    );
    assert_eq!(restarted, (Some(digest.clone()), Some(generation)));
    terminate(&mut third.child).await;
}
