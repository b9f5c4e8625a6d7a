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

/// How the monitored container is named in lease prefixes: the account endpoint's host name and
/// the database's and container's resource ids.
#[derive(Clone)]
struct Names {
    host: String,
    database_rid: String,
    container_rid: String,
}

impl Names {
    async fn of(account: &CosmosAccount) -> Self {
        let monitored = account.monitored(DB, ITEMS).await.unwrap();
        Self {
            host: account.host().to_owned(),
            database_rid: monitored.database_rid().to_owned(),
            container_rid: monitored.rid().to_owned(),
        }
    }

    /// The lease-id prefix the .NET processors (v2 and v3) and Java's epkversion build for
    /// `processor`: `{processor}{host}_{database rid}_{container rid}`.
    fn with_rids(&self, processor: &str) -> String {
        format!("{processor}{}_{}_{}", self.host, self.database_rid, self.container_rid)
    }

    /// The one Java's pkversion builds: names instead of resource ids.
    fn with_names(&self, processor: &str) -> String {
        format!("{processor}{}_{DB}_{ITEMS}", self.host)
    }
}

/// The foreign lease documents of `layout` at `positions`, as that processor writes them for the
/// monitored container named `names`.
fn foreign_leases(
    layout: &str,
    (prefix, names): (&str, &Names),
    positions: &[(String, EpkRange, String)],
    owner: Option<&str>,
    renewed: time::OffsetDateTime,
) -> Vec<Value> {
    let timestamp = renewed.format(&time::format_description::well_known::Rfc3339).unwrap();
    let (rids, by_name) = (names.with_rids(prefix), names.with_names(prefix));
    positions
        .iter()
        .map(|(id, range, continuation)| {
            let token = range.lease_token();
            match layout {
                // .NET v3, version 1 (EPK).
                "dotnet-epk" => json!({
                    "id": format!("{rids}..{token}"), "version": 1,
                    "LeaseToken": token, "FeedRange": {"Range": {"min": range.min, "max": range.max}},
                    "Owner": owner, "ContinuationToken": continuation, "properties": {},
                    "timestamp": timestamp, "Mode": "Incremental Feed"}),
                // .NET v3 version 0: partition key range ids.
                "dotnet-pk" => json!({
                    "id": format!("{rids}..{id}"),
                    "LeaseToken": id, "Owner": owner, "ContinuationToken": continuation,
                    "properties": {}, "timestamp": timestamp}),
                // The .NET v2 library (its DocumentServiceLease): `PartitionId`, no `LeaseToken`,
                // times with 7 fractional digits.
                "dotnet-v2" => json!({
                    "id": format!("{rids}..{id}"),
                    "PartitionId": id, "Owner": owner, "ContinuationToken": continuation,
                    "properties": {}, "timestamp": renewed.replace_nanosecond(123_456_700).unwrap()
                        .format(&time::format_description::well_known::Rfc3339).unwrap()}),
                // Java v4 pkversion: names instead of rids.
                "java-pk" => json!({
                    "id": format!("{by_name}..{id}"), "LeaseToken": id,
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
                        "id": format!("{rids}..{token}"),
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
async fn write_foreign(env: &Env, docs: &[Value]) {
    env.ensure_leases().await;
    write_foreign_to(&env.account, docs).await;
}

/// Writes the foreign documents, and the `.info` marker beside them, into `account`'s lease
/// container (which must exist).
async fn write_foreign_to(account: &CosmosAccount, docs: &[Value]) {
    let container = account.documents(DB, LEASES).await.unwrap();
    for doc in docs {
        let id = doc["id"].as_str().unwrap();
        container.upsert(id, doc).await.unwrap();
        if let Some((prefix, _)) = id.split_once("..") {
            let info = format!("{prefix}.info");
            container.upsert(&info, &json!({"id": info})).await.unwrap();
        }
    }
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

/// Writes documents 0..100, then the foreign `layout` leases under `prefix` checkpointed there
/// (owned by `owner`, renewed ten minutes ago).
async fn foreign_checkpoints_after_100(env: &Env, layout: &str, prefix: &str, owner: Option<&str>) {
    env.write(0..100).await;
    let at = positions(env).await;
    let old = time::OffsetDateTime::now_utc() - time::Duration::minutes(10);
    let names = Names::of(&env.account).await;
    write_foreign(env, &foreign_leases(layout, (prefix, &names), &at, owner, old)).await;
}

/// Documents 0..100 before the foreign checkpoint, 100..150 after it; adopted: exactly 100..150.
async fn adopt_layout(layout_name: &str, layout: ForeignLayout) -> (usize, usize, usize, usize) {
    let env = Env::new(2).await;
    let prefix = format!("{layout_name}-orders");
    foreign_checkpoints_after_100(&env, layout_name, &prefix, Some("old-host")).await;
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
        ("dotnet-v2", ForeignLayout::Dotnet),
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
    let prefix = "java-split";
    foreign_checkpoints_after_100(&env, "java-pk", prefix, None).await;
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
    let names = Names::of(&env.account).await;
    write_foreign(
        &env,
        &foreign_leases("dotnet-epk", (prefix, &names), &at, Some("dotnet-host-1"), now),
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
        let names = Names::of(&account).await;
        write_foreign_to(&account, &foreign_leases(layout, (layout, &names), &at, None, old)).await;
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
    // A .NET v2 library (or v3 version-0) processor of the same name wrote partition-key-range
    // leases with exactly our lease-id prefix: no flag needed.
    for layout in ["dotnet-v2", "dotnet-pk"] {
        let env = Env::new(2).await;
        env.write(0..200).await;
        let at = positions(&env).await;
        let old = time::OffsetDateTime::now_utc() - time::Duration::minutes(10);
        let names = Names::of(&env.account).await;
        let ours = names.with_rids(common::PROCESSOR);
        let docs = foreign_leases(layout, (common::PROCESSOR, &names), &at, Some("v2-host"), old);
        env.ensure_leases().await;
        write_foreign_to(&env.account, &docs).await;
        env.write(200..250).await;
        let mut options = env.options("ours");
        options.start_from = StartFrom::Now;
        let handle = env.start(options).await;
        let complete = env.delivered_within(50, Duration::from_secs(20)).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let lost = env.deliveries.missing(ids(200..250)).len();
        let early = delivered_outside(&env, 200..250);
        let still_there = etags(&env.account, &format!("{ours}..")).await.len();
        println!(
            "{layout} leases under our own prefix: 50 written after their checkpoints, delivered {}, lost {lost}, from before {early}, redelivered {}; documents under the prefix now {still_there} (2 old + 2 ours)",
            50 - lost,
            env.deliveries.duplicates().len()
        );
        handle.stop().await;
        assert!(complete && lost == 0 && early == 0, "{layout}");
        assert_eq!(still_there, 4, "{layout}");
    }
}

/// Adoption takes exactly the named processor's leases for the monitored container (issue 54):
/// not those of a processor whose name starts with the same letters (`orders-audit`), nor those
/// `orders` keeps for another container — both checkpointed before anything was written here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_takes_exactly_the_named_processors_leases_for_this_container() {
    let env = Env::new(2).await;
    let start = positions(&env).await;
    env.write(0..100).await;
    let at = positions(&env).await;
    let old = time::OffsetDateTime::now_utc() - time::Duration::minutes(10);
    let names = Names::of(&env.account).await;
    let elsewhere = Names {
        container_rid: "AAAAAZAAAAI=".to_owned(),
        ..names.clone()
    };
    let mut docs = foreign_leases("dotnet-v2", ("orders", &names), &at, None, old);
    docs.extend(foreign_leases("dotnet-v2", ("orders-audit", &names), &start, None, old));
    docs.extend(foreign_leases("dotnet-v2", ("orders", &elsewhere), &start, None, old));
    write_foreign(&env, &docs).await;
    env.write(100..150).await;
    let refused = adopt(&env, ForeignLayout::Dotnet, "order", false).await.err();
    let handle = adopt(&env, ForeignLayout::Dotnet, "orders", false).await.unwrap();
    let complete = env.delivered_within(50, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let early = delivered_outside(&env, 100..150);
    let ours = env.leases().await.len();
    handle.stop().await;
    println!(
        "adopting `orders` beside `orders-audit` and another container's `orders`: delivered from before its checkpoints {early}, our leases {ours}; `order`: {refused:?}"
    );
    assert!(complete, "missing {:?}", env.deliveries.missing(ids(100..150)));
    assert_eq!((early, ours), (0, 2));
    assert!(refused.is_some_and(|e| e.contains("no dotnet leases") && e.contains("orders")));
}

/// A document under this processor's own lease prefix that cannot be read as a lease stops the
/// start with one error naming it (issue 54): never a start from the start position over its
/// range, which would skip what came after its checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_lease_under_our_prefix_stops_the_start_and_names_it() {
    let env = Env::new(1).await;
    let names = Names::of(&env.account).await;
    let id = format!("{}..0", names.with_rids(common::PROCESSOR));
    // A lease token under neither name, and a checkpoint that is no string.
    let broken = json!({"id": id, "PartitionKeyRangeId": "0", "Owner": null, "ContinuationToken": 42});
    write_foreign(&env, &[broken]).await;
    let started = env
        .processor(env.options("ours"), env.recorder("ours"))
        .await
        .start()
        .await;
    let error = started.as_ref().err().map(ToString::to_string);
    println!("start beside an unreadable lease: {error:?}");
    if let Ok(handle) = started {
        handle.stop().await;
    }
    assert!(error.is_some_and(|e| e.contains(&id) && e.contains("fix or delete it")));
}

/// A .NET v3 processor of the same name still running (its version-0 leases carry `FeedRange`,
/// as v3 adds on acquisition: our very layout) is refused like a live foreign processor (issue
/// 54): its leases would be taken for ours. Once they expire, ours goes on from their checkpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_dotnet_v3_processor_of_the_same_name_is_refused_until_its_leases_expire() {
    let env = Env::new(2).await;
    env.write(0..100).await;
    let at = positions(&env).await;
    let names = Names::of(&env.account).await;
    let with_range = |renewed| {
        let mut docs = foreign_leases(
            "dotnet-pk",
            (common::PROCESSOR, &names),
            &at,
            Some("dotnet-host-1"),
            renewed,
        );
        for (doc, (_, range, _)) in docs.iter_mut().zip(&at) {
            doc["FeedRange"] = json!({"Range": {"min": range.min, "max": range.max}});
            doc["Mode"] = json!("Incremental Feed");
        }
        docs
    };
    write_foreign(&env, &with_range(time::OffsetDateTime::now_utc())).await;
    let mut options = env.options("ours");
    options.start_from = StartFrom::Now;
    let refused = env
        .processor(options.clone(), env.recorder("ours"))
        .await
        .start()
        .await
        .err();
    // Stopped: its leases were last renewed ten minutes ago.
    write_foreign(
        &env,
        &with_range(time::OffsetDateTime::now_utc() - time::Duration::minutes(10)),
    )
    .await;
    env.write(100..150).await;
    let handle = env.start(options).await;
    let complete = env.delivered_within(50, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let early = delivered_outside(&env, 100..150);
    handle.stop().await;
    let refused = refused.map(|e| e.to_string());
    println!(
        "a running .NET v3 processor of our name: {refused:?}; once stopped: 50 delivered {complete}, from before {early}"
    );
    assert!(refused.is_some_and(|e| e.contains("dotnet-host-1") && e.contains("stop it first")));
    assert!(complete && early == 0);
}

/// What a start adopting `prefix`'s .NET checkpoints left when it was killed partway: our first
/// lease, not the second, and no `.info` (documents 0..100 before the checkpoints, 100..150
/// after); the foreign lease documents deleted too when `foreign_gone` (the lease container
/// created again since, our leases written back into it).
async fn adoption_killed_partway(env: &Env, prefix: &str, foreign_gone: bool) {
    foreign_checkpoints_after_100(env, "dotnet-epk", prefix, Some("old-host")).await;
    env.write(100..150).await;
    let mut options = env.options("ours");
    options.start_from = StartFrom::Now;
    options.adopt = Some(AdoptOptions {
        layout: ForeignLayout::Dotnet,
        prefix: prefix.into(),
        force: false,
    });
    let monitored = env.account.monitored(DB, ITEMS).await.unwrap();
    let store = env.store().await;
    changefeed_operator::processor::leases::bootstrap::bootstrap(store.as_ref(), &monitored, &options)
        .await
        .unwrap();
    let leases = env.account.documents(DB, LEASES).await.unwrap();
    let second = env.leases().await.remove(1);
    leases.delete(&second.id, &second.id, None).await.unwrap();
    let info = format!("{}.info", store.prefix());
    let mut gone = vec![info];
    if foreign_gone {
        gone.extend(
            leases
                .list_by_id_prefix(prefix)
                .await
                .unwrap()
                .into_iter()
                .filter_map(|d| d.body["id"].as_str().map(str::to_owned)),
        );
    }
    for id in gone {
        leases.delete(&id, &id, None).await.unwrap();
    }
}

/// An adoption killed partway is taken up again at the foreign checkpoints — not from its own
/// start position, which ("now") would skip what was written after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adoption_killed_partway_is_taken_up_again_at_the_foreign_checkpoints() {
    let env = Env::new(2).await;
    let prefix = "dotnet-epk-orders";
    adoption_killed_partway(&env, prefix, false).await;
    let handle = adopt(&env, ForeignLayout::Dotnet, prefix, false).await.unwrap();
    let complete = env.delivered_within(50, Duration::from_secs(10)).await;
    let lost = env.deliveries.missing(ids(100..150)).len();
    println!(
        "an adoption killed after one of two leases, taken up again: 50 written after the checkpoints, delivered {}, lost {lost}; leases now {}",
        env.deliveries.distinct(),
        env.leases().await.len()
    );
    handle.stop().await;
    assert!(complete, "lost {lost} of the 50 written after the foreign checkpoints");
}

/// Leases of ours without a mark beside a foreign lease set that is gone (the lease container
/// created again, the leases written back into it) do not stop a start that still names the
/// adoption: the leases there stand, and the rest of the feed gets leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_of_ours_beside_a_foreign_set_that_is_gone_do_not_stop_the_start() {
    let env = Env::new(2).await;
    adoption_killed_partway(&env, "dotnet-epk-orders", true).await;
    let started = adopt(&env, ForeignLayout::Dotnet, "dotnet-epk-orders", false).await;
    let refused = started.as_ref().err().cloned();
    let leases = env.leases().await.len();
    println!("ours without a mark, the foreign set gone: start refused {refused:?}; leases {leases}");
    if let Ok(handle) = started {
        handle.stop().await;
    }
    assert_eq!(refused, None, "the start stopped on the adoption");
    assert_eq!(leases, 2, "the rest of the feed has its lease");
}
