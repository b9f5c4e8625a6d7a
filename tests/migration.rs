//! Switching from the .NET or Java change feed processor without reprocessing: their lease
//! documents — written as those processors write them, with checkpoints read from the emulator —
//! are adopted, and only the changes after the checkpoints are delivered. Also: a range split
//! since the checkpoint, a still-running foreign processor, and KEDA's scaler algorithm over our
//! own lease documents.

use std::time::Duration;

use base64::Engine;
use changefeed_operator::cosmos::{AccountAuth, CosmosAccount, EpkRange, StartFrom};
use changefeed_operator::processor::{AdoptOptions, ForeignLayout, ProcessorHandle};
use serde_json::{Value, json};

use crate::common::{self, DB, Env, ITEMS, LEASES, ids, upsert_doc};

/// Every partition's current position: (partition key range id, range, raw continuation).
async fn positions(env: &Env) -> Vec<(String, EpkRange, String)> {
    let partitions = env.emulator.partitions(DB, ITEMS).await.unwrap();
    positions_of(&env.account, partitions).await
}

/// The current position of each of `partitions`.
async fn positions_of(
    account: &CosmosAccount,
    partitions: Vec<changefeed_operator::emulator::PhysicalPartition>,
) -> Vec<(String, EpkRange, String)> {
    let monitored = account.monitored(DB, ITEMS).await.unwrap();
    let mut out = Vec::new();
    for partition in partitions {
        let mut reader = monitored
            .reader(&partition.range, None, StartFrom::Now, 1)
            .await
            .unwrap();
        let page = reader.next_page(Duration::from_secs(10)).await.unwrap();
        out.push((
            partition.id,
            partition.range,
            page.continuations[0].continuation.clone(),
        ));
    }
    out
}

/// The foreign lease documents of `layout` at `positions`, as that processor writes them.
fn foreign_leases(
    layout: &str,
    prefix: &str,
    positions: &[(String, EpkRange, String)],
    owner: Option<&str>,
    renewed: time::OffsetDateTime,
) -> Vec<Value> {
    let timestamp = renewed.format(&time::format_description::well_known::Rfc3339).unwrap();
    positions
        .iter()
        .map(|(id, range, continuation)| {
            let token = range.lease_token();
            match layout {
                // .NET v3, version 1 (EPK).
                "dotnet-epk" => json!({
                    "id": format!("{prefix}eastus.emulator.local_db_items..{token}"), "version": 1,
                    "LeaseToken": token, "FeedRange": {"Range": {"min": range.min, "max": range.max}},
                    "Owner": owner, "ContinuationToken": continuation, "properties": {},
                    "timestamp": timestamp, "Mode": "Incremental Feed"}),
                // .NET v3 version 0 / v2: partition key range ids, database and container rids.
                "dotnet-pk" => json!({
                    "id": format!("{prefix}eastus.emulator.local_AAAAAQ==_AAAAAYAAAAE=..{id}"),
                    "LeaseToken": id, "Owner": owner, "ContinuationToken": continuation,
                    "properties": {}, "timestamp": timestamp}),
                // Java v4 pkversion: names instead of rids.
                "java-pk" => json!({
                    "id": format!("{prefix}eastus.emulator.local_db_items..{id}"), "LeaseToken": id,
                    "Owner": owner.unwrap_or(""), "ContinuationToken": continuation,
                    "timestamp": timestamp, "properties": {}}),
                // Java v4 epkversion: a base64 change feed state.
                _ => {
                    let state = json!({"V": 1, "Rid": "AAAAAYAAAAE=", "Mode": "INCREMENTAL",
                        "StartFrom": {"Type": "NOW"},
                        "Continuation": {"V": 1, "Rid": "AAAAAYAAAAE=",
                            "Continuation": [{"token": continuation, "range": {"min": range.min, "max": range.max}}],
                            "Range": {"min": range.min, "max": range.max}}});
                    json!({
                        "id": format!("{prefix}eastus.emulator.local_AAAAAQ==_AAAAAYAAAAE=..{token}"),
                        "version": 1, "LeaseToken": token,
                        "feedRange": {"Range": {"min": range.min, "max": range.max,
                                                "isMinInclusive": true, "isMaxInclusive": false}},
                        "Owner": owner.unwrap_or(""),
                        "ContinuationToken": base64::engine::general_purpose::STANDARD.encode(state.to_string()),
                        "timestamp": timestamp, "properties": {}})
                }
            }
        })
        .collect()
}

/// Writes the foreign documents (and the `.info` marker those processors keep) into the lease
/// container.
async fn write_foreign(env: &Env, prefix: &str, docs: &[Value]) {
    env.ensure_leases().await;
    write_foreign_to(&env.account, prefix, docs).await;
}

/// Writes the foreign documents into `account`'s lease container (which must exist).
async fn write_foreign_to(account: &CosmosAccount, prefix: &str, docs: &[Value]) {
    let container = account.documents(DB, LEASES).await.unwrap();
    for doc in docs {
        let id = doc["id"].as_str().unwrap();
        container.upsert(id, doc).await.unwrap();
    }
    let info = format!("{prefix}eastus.emulator.local_db_items.info");
    container.upsert(&info, &json!({"id": info})).await.unwrap();
}

/// Starts our processor adopting `layout` leases with `prefix` ("now" as the start position, so
/// that only the adopted checkpoints can deliver older changes).
async fn adopt(env: &Env, layout: ForeignLayout, prefix: &str, force: bool) -> Result<ProcessorHandle, String> {
    let mut options = env.options("ours");
    options.start_from = StartFrom::Now;
    options.adopt = Some(AdoptOptions {
        layout,
        prefix: prefix.into(),
        force,
    });
    env.processor(options, env.recorder("ours"))
        .await
        .start()
        .await
        .map_err(|e| e.to_string())
}

/// The ETags of the lease documents under `prefix`.
async fn etags(account: &CosmosAccount, prefix: &str) -> Vec<String> {
    let container = account.documents(DB, LEASES).await.unwrap();
    let docs = container.list_by_id_prefix(prefix).await.unwrap();
    docs.into_iter().map(|d| d.etag).collect()
}

/// How many delivered documents are not among `expected`.
fn delivered_outside(env: &Env, expected: std::ops::Range<usize>) -> usize {
    let expected = ids(expected);
    env.deliveries.ids().iter().filter(|id| !expected.contains(id)).count()
}

/// Documents 0..100 before the foreign checkpoint, 100..150 after it; adopted: exactly 100..150.
async fn adopt_layout(layout_name: &str, layout: ForeignLayout) -> (usize, usize, usize, usize) {
    let env = Env::new(2).await;
    env.write(0..100).await;
    let at = positions(&env).await;
    let prefix = format!("{layout_name}-orders");
    let old = time::OffsetDateTime::now_utc() - time::Duration::minutes(10);
    write_foreign(
        &env,
        &prefix,
        &foreign_leases(layout_name, &prefix, &at, Some("old-host"), old),
    )
    .await;
    let foreign_before = etags(&env.account, &prefix).await;
    env.write(100..150).await;
    let handle = adopt(&env, layout, &prefix, false).await.unwrap();
    let complete = env.delivered_within(50, Duration::from_secs(20)).await;
    // Anything from before the checkpoint would arrive too: give it time to show.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let lost = env.deliveries.missing(ids(100..150)).len();
    let early = delivered_outside(&env, 100..150);
    let redelivered = env.deliveries.duplicates().len();
    let untouched = foreign_before == etags(&env.account, &prefix).await;
    handle.stop().await;
    assert!(complete, "{layout_name}: not all 50 delivered");
    assert!(untouched, "{layout_name}: the foreign lease documents were changed");
    (50 - lost, lost, early, redelivered)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_of_each_foreign_layout_are_adopted_at_their_checkpoints() {
    let mut lines = Vec::new();
    for (name, layout) in [
        ("dotnet-epk", ForeignLayout::Dotnet),
        ("dotnet-pk", ForeignLayout::Dotnet),
        ("java-pk", ForeignLayout::JavaPk),
        ("java-epk", ForeignLayout::JavaEpk),
    ] {
        let (delivered, lost, early, redelivered) = adopt_layout(name, layout).await;
        lines.push(format!(
            "{name}: 50 written after the checkpoint, delivered {delivered}, lost {lost}, from before the checkpoint {early}, redelivered {redelivered}"
        ));
        assert_eq!((lost, early, redelivered), (0, 0, 0), "{name}");
    }
    println!(
        "adopted layouts (100 documents before each checkpoint):\n  {}",
        lines.join("\n  ")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_that_split_since_the_java_checkpoint_is_adopted_through_its_children() {
    let env = Env::new(2).await;
    env.write(0..100).await;
    let at = positions(&env).await;
    let prefix = "java-split";
    let old = time::OffsetDateTime::now_utc() - time::Duration::minutes(10);
    write_foreign(&env, prefix, &foreign_leases("java-pk", prefix, &at, None, old)).await;
    env.write(100..150).await;
    // Range "0" splits after the Java processor's last checkpoint.
    let partitions = env
        .emulator
        .split(DB, ITEMS, Some("0"), Duration::from_millis(100))
        .await
        .unwrap();
    env.write(150..200).await;
    let handle = adopt(&env, ForeignLayout::JavaPk, prefix, false).await.unwrap();
    let complete = env.delivered_within(100, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let lost = env.deliveries.missing(ids(100..200));
    let early = delivered_outside(&env, 100..200);
    let leases = env.leases().await.len();
    println!(
        "java-pk lease of a range split since its checkpoint ({} partitions now): 100 written after the checkpoint, delivered {}, lost {}, from before {early}, redelivered {}, our leases {leases}",
        partitions.len(),
        100 - lost.len(),
        lost.len(),
        env.deliveries.duplicates().len()
    );
    handle.stop().await;
    assert!(complete && lost.is_empty(), "lost {lost:?}");
    assert_eq!(early, 0);
    assert_eq!(leases, 3, "one lease per current range");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_processor_that_still_runs_is_refused_unless_forced() {
    let env = Env::new(2).await;
    let at = positions(&env).await;
    let prefix = "dotnet-live";
    let now = time::OffsetDateTime::now_utc();
    write_foreign(
        &env,
        prefix,
        &foreign_leases("dotnet-epk", prefix, &at, Some("dotnet-host-1"), now),
    )
    .await;
    let refused = adopt(&env, ForeignLayout::Dotnet, prefix, false).await.err();
    let forced = adopt(&env, ForeignLayout::Dotnet, prefix, true).await;
    let ours = env.leases().await.len();
    println!(
        "live .NET owner: {refused:?}; with force: started {}, our leases {ours}",
        forced.is_ok()
    );
    assert!(
        refused.is_some_and(|e| e.contains("still runs") && e.contains("dotnet-host-1") && e.contains("--adopt-force")),
    );
    assert!(forced.is_ok());
    assert_eq!(ours, 2);
    forced.unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kedas_scaler_algorithm_sees_exactly_the_ranges_with_lag_in_our_leases() {
    // KEDA's azure-cosmosdb scaler: list the processor's leases by id prefix; for each, read its
    // range's change feed from its ContinuationToken with maxItemCount 1; a range is active when
    // that returns a change. Done here from the raw lease documents, as a third party would.
    let env = Env::new(4).await;
    let handle = env.start_owning_all("a", 4).await;
    env.write(0..200).await;
    assert!(env.delivered_within(200, Duration::from_secs(20)).await);
    handle.stop().await;
    // New changes in exactly the ranges that hold these partition keys.
    let monitored = env.account.monitored(DB, ITEMS).await.unwrap();
    let ranges = monitored.feed_ranges(false).await.unwrap();
    let mut expected = std::collections::BTreeSet::new();
    for n in [1usize, 2] {
        upsert_doc(&env.items, 1000 + n).await;
        let epk = monitored.epk_of(&format!("pk-{}", (1000 + n) % 97)).await.unwrap();
        expected.extend(ranges.iter().filter(|r| r.contains_epk(&epk)).cloned());
    }
    let prefix = changefeed_operator::processor::lease_prefix(
        common::PROCESSOR,
        env.account.host(),
        monitored.database_rid(),
        monitored.rid(),
    );
    let documents = env
        .account
        .documents(DB, LEASES)
        .await
        .unwrap()
        .list_by_id_prefix(&format!("{prefix}.."))
        .await
        .unwrap();
    let mut active = std::collections::BTreeSet::new();
    for doc in &documents {
        let body = &doc.body;
        let range = EpkRange::new(
            body["FeedRange"]["Range"]["min"].as_str().unwrap(),
            body["FeedRange"]["Range"]["max"].as_str().unwrap(),
        );
        let continuation = body["ContinuationToken"].as_str();
        let mut reader = monitored
            .reader(&range, continuation, StartFrom::Beginning, 1)
            .await
            .unwrap();
        if !reader
            .next_page(Duration::from_secs(10))
            .await
            .unwrap()
            .documents
            .is_empty()
        {
            active.insert(range);
        }
    }
    println!(
        "KEDA's algorithm over {} lease documents: active ranges {active:?}, ranges with lag {expected:?}",
        documents.len()
    );
    assert_eq!(documents.len(), 4);
    assert_eq!(active, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cfp_estimate_reads_the_lag_of_each_foreign_layout_before_the_switch() {
    let (mut emulator, endpoint) = common::start_emulator("db/items:/pk:2").await;
    let account = CosmosAccount::connect(&endpoint, &AccountAuth::emulator_key())
        .await
        .unwrap();
    account.ensure_container(DB, LEASES, "/id").await.unwrap();
    let ranges = reqwest::get(format!("{endpoint}_emulator/ranges?database={DB}&container={ITEMS}"))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let ranges: Value = serde_json::from_slice(&ranges).unwrap();
    let partitions = serde_json::from_value(ranges["partitions"].clone()).unwrap();
    let at = positions_of(&account, partitions).await;
    let old = time::OffsetDateTime::now_utc() - time::Duration::minutes(10);
    for layout in ["dotnet-epk", "java-pk", "java-epk"] {
        write_foreign_to(&account, layout, &foreign_leases(layout, layout, &at, None, old)).await;
    }
    common::cfp_write(&endpoint, 0, 30).await;
    let mut lags = Vec::new();
    for (layout, flag) in [
        ("dotnet-epk", "dotnet"),
        ("java-pk", "java-pk"),
        ("java-epk", "java-epk"),
    ] {
        let output = common::cfp_estimate(&endpoint, &["--adopt", flag, "--adopt-prefix", layout, "-o", "json"]).await;
        let estimate: Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
        lags.push((
            layout,
            output.status.code(),
            estimate["totalLag"].clone(),
            estimate["leaseCount"].clone(),
        ));
    }
    println!("cfp estimate of foreign leases, 30 documents after their checkpoints: {lags:?}");
    common::terminate(&mut emulator).await;
    for (layout, code, lag, leases) in lags {
        assert_eq!(code, Some(0), "{layout}");
        assert_eq!(lag, json!(30), "{layout}");
        assert_eq!(leases, json!(2), "{layout}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dotnet_v2_lease_set_under_our_own_prefix_is_adopted_in_place() {
    // A .NET v2 (or v3 version-0) processor of the same name wrote partition-key-range leases
    // with exactly our lease-id prefix: no flag needed.
    let env = Env::new(2).await;
    env.write(0..100).await;
    let at = positions(&env).await;
    let monitored = env.account.monitored(DB, ITEMS).await.unwrap();
    let ours = changefeed_operator::processor::lease_prefix(
        common::PROCESSOR,
        env.account.host(),
        monitored.database_rid(),
        monitored.rid(),
    );
    let old = time::OffsetDateTime::now_utc() - time::Duration::minutes(10);
    let docs: Vec<Value> = foreign_leases("dotnet-pk", "", &at, Some("v2-host"), old)
        .into_iter()
        .zip(&at)
        .map(|(mut doc, (id, _, _))| {
            doc["id"] = json!(format!("{ours}..{id}"));
            doc
        })
        .collect();
    env.ensure_leases().await;
    write_foreign_to(&env.account, &ours, &docs).await;
    env.write(100..150).await;
    let mut options = env.options("ours");
    options.start_from = StartFrom::Now;
    let handle = env.start(options).await;
    let complete = env.delivered_within(50, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let lost = env.deliveries.missing(ids(100..150)).len();
    let early = delivered_outside(&env, 100..150);
    let still_there = etags(&env.account, &format!("{ours}..")).await.len();
    println!(
        ".NET v2 leases under our own prefix: 50 written after their checkpoints, delivered {}, lost {lost}, from before {early}, redelivered {}; documents under the prefix now {still_there} (2 old + 2 ours)",
        50 - lost,
        env.deliveries.duplicates().len()
    );
    handle.stop().await;
    assert!(complete && lost == 0 && early == 0);
    assert_eq!(still_there, 4);
}
