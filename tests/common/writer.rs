//! A writer that creates and replaces documents while a test's workers run, and what of it was
//! not delivered.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use changefeed_operator::cosmos::DocumentContainer;

/// Creates and replaces documents (`{"id", "pk", "v"}`) until stopped, retrying what the account
/// refuses; returns the latest version written per id and how many attempts were refused.
pub async fn write_continuously(
    items: DocumentContainer,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> (BTreeMap<String, u64>, usize) {
    let mut written: BTreeMap<String, u64> = BTreeMap::new();
    let mut refused = 0;
    let mut rng = fastrand::Rng::with_seed(7);
    let mut next = 0usize;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        // Two creates for every replace of an earlier document.
        let (id, version) = if next < 20 || rng.u8(0..3) > 0 {
            next += 1;
            (format!("doc-{next}"), 1)
        } else {
            let id = format!("doc-{}", rng.usize(1..=next));
            let version = written[&id] + 1;
            (id, version)
        };
        let pk = format!("pk-of-{id}");
        let doc = serde_json::json!({"id": id, "pk": pk, "v": version});
        for attempt in 0.. {
            match items.upsert(&pk, &doc).await {
                Ok(_) => break,
                Err(e) if attempt >= 200 => panic!("writing {id}: {e}"),
                Err(_) => {
                    refused += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        written.insert(id, version);
        tokio::time::sleep(Duration::from_millis(8)).await;
    }
    (written, refused)
}

/// The latest versions in `written` (id → version) that are not among the `delivered` ones.
pub fn undelivered(written: &BTreeMap<String, u64>, delivered: &BTreeSet<(String, u64)>) -> Vec<(String, u64)> {
    written
        .iter()
        .filter(|(id, v)| !delivered.contains(&((*id).clone(), **v)))
        .map(|(id, v)| (id.clone(), *v))
        .collect()
}
