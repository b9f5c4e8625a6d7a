//! `cfp emulator` serves the official Java SDK unchanged: each request shape the Java SDK sends
//! that the store alone does not serve has a test on the wire, and the Java v4 change feed
//! processor itself (bench/java-peer, built with Maven) drains a backlog through it — after which
//! `cfp worker --adopt java-epk` takes over the Java processor's real leases at their checkpoints.

use std::process::Stdio;
use std::time::Duration;

use changefeed_operator::cosmos::EMULATOR_KEY;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::common::DiesWithTest;
use crate::common::{self, DB, ITEMS, LEASES, start_emulator_with, terminate};

/// `cfp emulator` checking signatures with the well-known key, with `db/items` (8 partitions)
/// and `db/leases`.
async fn emulator() -> (tokio::process::Child, String) {
    start_emulator_with(&[
        "--port",
        "0",
        "--key",
        EMULATOR_KEY,
        "--container",
        "db/items:/pk:8",
        "--container",
        "db/leases:/id:1",
    ])
    .await
}

/// A request signed with the account key as the SDKs sign it: over `verb`, `resource_type` and
/// `link` (a name-based path, or a lower-cased resource id).
fn signed(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    resource_type: &str,
    link: &str,
) -> reqwest::RequestBuilder {
    let date = time::OffsetDateTime::now_utc()
        .format(time::macros::format_description!(
            "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
        ))
        .unwrap();
    let payload = format!(
        "{}\n{resource_type}\n{link}\n{}\n\n",
        method.as_str().to_ascii_lowercase(),
        date.to_ascii_lowercase()
    );
    let key = azure_core::credentials::Secret::new(EMULATOR_KEY.to_owned());
    let signature = azure_core::hmac::hmac_sha256(&payload, &key).unwrap();
    let authorization: String =
        url::form_urlencoded::byte_serialize(format!("type=master&ver=1.0&sig={signature}").as_bytes()).collect();
    client
        .request(method, url)
        .header("authorization", authorization)
        .header("x-ms-date", date)
        .header("x-ms-version", "2020-07-15")
}

/// A response body as JSON (`null` when it is not JSON).
async fn json_of(response: reqwest::Response) -> Value {
    serde_json::from_str(&response.text().await.unwrap_or_default()).unwrap_or_default()
}

/// The resource ids of `db` and `db/items`.
async fn rids(client: &reqwest::Client, endpoint: &str) -> (String, String) {
    let container = json_of(
        signed(
            client,
            reqwest::Method::GET,
            &format!("{endpoint}dbs/{DB}/colls/{ITEMS}"),
            "colls",
            &format!("dbs/{DB}/colls/{ITEMS}"),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    let rid = container["_rid"].as_str().unwrap().to_owned();
    let self_link = container["_self"].as_str().unwrap();
    let db_rid = self_link.split('/').nth(1).unwrap().to_owned();
    (db_rid, rid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_addressed_by_resource_id_are_served_and_signed_as_the_service_signs_them() {
    let (mut emulator, endpoint) = emulator().await;
    let client = reqwest::Client::new();
    let (db_rid, rid) = rids(&client, &endpoint).await;
    let ranges_url = format!("{endpoint}dbs/{db_rid}/colls/{rid}/pkranges");
    // The Java SDK signs a path addressed by id over the lower-cased id of the resource.
    let ranges = signed(
        &client,
        reqwest::Method::GET,
        &ranges_url,
        "pkranges",
        &rid.to_ascii_lowercase(),
    )
    .send()
    .await
    .unwrap();
    let ranges_status = ranges.status();
    let body = json_of(ranges).await;
    let count = body["PartitionKeyRanges"].as_array().map_or(0, Vec::len);
    // A signature over the name-based link does not cover the id-addressed path.
    let wrong = signed(
        &client,
        reqwest::Method::GET,
        &ranges_url,
        "pkranges",
        &format!("dbs/{DB}/colls/{ITEMS}"),
    )
    .send()
    .await
    .unwrap();
    // Documents are written and read through ids too.
    let created = signed(
        &client,
        reqwest::Method::POST,
        &format!("{endpoint}dbs/{db_rid}/colls/{rid}/docs"),
        "docs",
        &rid.to_ascii_lowercase(),
    )
    .header("x-ms-documentdb-partitionkey", r#"["p1"]"#)
    .header("content-type", "application/json")
    .body(json!({"id": "by-rid", "pk": "p1"}).to_string())
    .send()
    .await
    .unwrap();
    let created_status = created.status();
    let read = signed(
        &client,
        reqwest::Method::GET,
        &format!("{endpoint}dbs/{DB}/colls/{ITEMS}/docs/by-rid"),
        "docs",
        &format!("dbs/{DB}/colls/{ITEMS}/docs/by-rid"),
    )
    .header("x-ms-documentdb-partitionkey", r#"["p1"]"#)
    .send()
    .await
    .unwrap();
    println!(
        "by id: pkranges {ranges_status} ({count} ranges), wrong signature {}, create {created_status}, read back by name {}",
        wrong.status(),
        read.status()
    );
    assert_eq!(ranges_status, 200, "{body}");
    assert_eq!(count, 8);
    assert_eq!(wrong.status(), 401);
    assert_eq!(created_status, 201);
    assert_eq!(read.status(), 200);
    terminate(&mut emulator).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_continuation_on_a_first_query_page_is_no_continuation_and_responses_name_their_owner() {
    let (mut emulator, endpoint) = emulator().await;
    common::cfp_write(&endpoint, 0, 5).await;
    let client = reqwest::Client::new();
    let link = format!("dbs/{DB}/colls/{ITEMS}");
    // The Java SDK sends `x-ms-continuation:` (empty) with a query's first page.
    let query = signed(
        &client,
        reqwest::Method::POST,
        &format!("{endpoint}{link}/docs"),
        "docs",
        &link,
    )
    .header("x-ms-continuation", "")
    .header("x-ms-documentdb-isquery", "true")
    .header("x-ms-documentdb-query-enablecrosspartition", "true")
    .header("content-type", "application/query+json")
    .body(json!({"query": "SELECT * FROM c", "parameters": []}).to_string())
    .send()
    .await
    .unwrap();
    let status = query.status();
    let owner = query
        .headers()
        .get("x-ms-alt-content-path")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = json_of(query).await;
    // Reading the container names its database as the owner.
    let container = signed(
        &client,
        reqwest::Method::GET,
        &format!("{endpoint}{link}"),
        "colls",
        &link,
    )
    .send()
    .await
    .unwrap();
    let container_owner = container
        .headers()
        .get("x-ms-alt-content-path")
        .map(|v| v.to_str().unwrap().to_owned());
    // The account advertises the plain-HTTP gateway it is served on, so that clients can reach
    // every endpoint it names.
    let account = json_of(
        signed(&client, reqwest::Method::GET, &endpoint, "", "")
            .send()
            .await
            .unwrap(),
    )
    .await;
    println!(
        "empty continuation: {status} with {} documents; owner of a document query {owner:?}, of the container {container_owner:?}; writable locations {}",
        body["Documents"].as_array().map_or(0, Vec::len),
        account["writableLocations"]
    );
    assert_eq!(status, 200);
    assert!(body["Documents"].as_array().is_some_and(|d| !d.is_empty()));
    assert_eq!(owner.as_deref(), Some("dbs/db/colls/items"));
    assert_eq!(container_owner.as_deref(), Some("dbs/db"));
    for list in ["writableLocations", "readableLocations"] {
        assert_eq!(
            account[list][0]["databaseAccountEndpoint"].as_str(),
            Some(endpoint.as_str())
        );
    }
    terminate(&mut emulator).await;
}

/// A running Java v4 change feed processor instance.
struct JavaProcessor {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl JavaProcessor {
    async fn start(jar: &str, endpoint: &str, prefix: &str, expect: usize) -> Self {
        Self::start_with_layout(jar, endpoint, prefix, "epk", expect).await
    }

    /// Like [`JavaProcessor::start`], with `layout` `pk` (`handleChanges`: partition-key-range
    /// leases) or `epk` (`handleLatestVersionChanges`).
    async fn start_with_layout(jar: &str, endpoint: &str, prefix: &str, layout: &str, expect: usize) -> Self {
        let mut child = tokio::process::Command::new("java")
            .arg("-DCOSMOS.HTTP_CONNECTION_WITHOUT_TLS_ALLOWED=true")
            .arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
            .args(["-jar", jar, "--endpoint", endpoint, "--key", EMULATOR_KEY])
            .args(["--database", DB, "--feed", ITEMS, "--leases", LEASES])
            .args([
                "--prefix",
                prefix,
                "--host",
                "java-host-1",
                "--expect",
                &expect.to_string(),
            ])
            .args(["--max-items", "100", "--poll-ms", "200", "--layout", layout])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .dies_with_test()
            .spawn()
            .expect("java (a JDK 17+) must be installed");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Self { child, lines }
    }

    /// Waits (bounded) for the event `name`; its JSON.
    async fn event(&mut self, name: &str, timeout: Duration) -> Value {
        tokio::time::timeout(timeout, async {
            while let Ok(Some(line)) = self.lines.next_line().await {
                if let Ok(event) = serde_json::from_str::<Value>(&line)
                    && event["event"] == name
                {
                    return event;
                }
            }
            panic!("the Java processor exited before {name}");
        })
        .await
        .unwrap_or_else(|_| panic!("no {name} from the Java processor within {timeout:?}"))
    }

    async fn stop(mut self) -> Value {
        let mut stdin = self.child.stdin.take().unwrap();
        stdin.write_all(b"stop\n").await.unwrap();
        drop(stdin);
        let stopped = self.event("stopped", Duration::from_secs(60)).await;
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
        stopped
    }
}

/// The lag `cfp estimate --adopt java-epk` reads in the Java processor's leases.
async fn java_lag(endpoint: &str) -> Option<u64> {
    let output = common::cfp_estimate(
        endpoint,
        &[
            "--key",
            EMULATOR_KEY,
            "--adopt",
            "java-epk",
            "--adopt-prefix",
            "java",
            "-o",
            "json",
        ],
    )
    .await;
    let estimate: Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
    estimate["totalLag"].as_u64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_java_change_feed_processor_runs_on_cfp_emulator_and_cfp_worker_adopts_its_leases() {
    let jar = common::java_peer_jar();
    let (mut emulator, endpoint) = emulator().await;
    common::cfp_write(&endpoint, 0, 200).await;
    let mut java = JavaProcessor::start(&jar, &endpoint, "java", 200).await;
    let drained = java.event("drained", Duration::from_secs(120)).await;
    // The Java processor checkpoints after its handler returns: stop it once `cfp estimate`
    // reads no lag in its leases (else the last batches are redelivered, at least once).
    let caught_up = common::eventually(Duration::from_secs(30), || async {
        java_lag(&endpoint).await == Some(0)
    })
    .await;
    let stopped = java.stop().await;
    // The Java processor's own leases, as it wrote them.
    let account = changefeed_operator::cosmos::CosmosAccount::connect(
        &endpoint,
        &changefeed_operator::cosmos::AccountAuth::emulator_key(),
    )
    .await
    .unwrap();
    let leases = account.documents(DB, LEASES).await.unwrap();
    let java_leases: Vec<Value> = leases
        .list_by_id_prefix("java")
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.body)
        .filter(|d| d.get("LeaseToken").is_some())
        .collect();
    let owners: Vec<&str> = java_leases.iter().filter_map(|d| d["Owner"].as_str()).collect();

    // Changes after the Java checkpoints, then our worker adopting them: exactly those arrive.
    common::cfp_write(&endpoint, 200, 50).await;
    let lag = java_lag(&endpoint).await;
    let mut worker = common::cfp_worker(&endpoint)
        .args([
            "--key",
            EMULATOR_KEY,
            "--processor",
            "cfp",
            "--instance",
            "w0",
            "--start-from",
            "now",
        ])
        .args([
            "--adopt",
            "java-epk",
            "--adopt-prefix",
            "java",
            "--poll-interval",
            "200ms",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(worker.stdout.take().unwrap()).lines();
    let mut ids = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(change) = serde_json::from_str::<Value>(&line)
                && let Some(id) = change["document"]["id"].as_str().or(change["id"].as_str())
            {
                ids.push(id.to_owned());
                if ids.len() >= 50 {
                    break;
                }
            }
        }
    })
    .await;
    // Anything more would show up within a few polls.
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(change) = serde_json::from_str::<Value>(&line)
                && let Some(id) = change["document"]["id"].as_str().or(change["id"].as_str())
            {
                ids.push(id.to_owned());
            }
        }
    })
    .await;
    terminate(&mut worker).await;
    let before_checkpoint = ids
        .iter()
        .filter(|id| id.trim_start_matches("doc-").parse::<u64>().is_ok_and(|n| n < 200))
        .count();
    let mut distinct = ids.clone();
    distinct.sort();
    distinct.dedup();
    println!(
        "Java v4 processor on cfp emulator: drained {drained}, checkpoints caught up {caught_up}, stopped {stopped}, {} leases (owners after stop {owners:?}); 50 written, cfp estimate --adopt java-epk lag {lag:?}; cfp worker --adopt java-epk then delivered {} ({} distinct, {before_checkpoint} from before the Java checkpoints)",
        java_leases.len(),
        ids.len(),
        distinct.len()
    );
    assert_eq!(drained["docs"].as_u64(), Some(200));
    assert!(caught_up, "the Java checkpoints reached the end of the backlog");
    assert_eq!(java_leases.len(), 8, "one EPK lease per physical partition");
    assert!(
        owners.iter().all(|o| o.is_empty()),
        "the Java processor released its leases"
    );
    assert_eq!(lag, Some(50));
    assert_eq!(distinct.len(), 50);
    assert_eq!(ids.len(), 50, "nothing delivered twice");
    assert_eq!(before_checkpoint, 0, "nothing from before the Java checkpoints");
    terminate(&mut emulator).await;
}

/// Leaving without lock-in: our workers handle 300 documents and stop; `cfp checkpoints leave --to
/// java-pk` writes their checkpoints as the Java v4 processor's partition-key-range leases
/// (`handleChanges`), `--to java-epk` as its EPK leases with their change feed state
/// (`handleLatestVersionChanges`, issue 54); the Java processor then delivers exactly the 50
/// documents written after our last checkpoints — nothing from before, nothing missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaving_for_the_java_processor_reads_nothing_again_and_skips_nothing() {
    let jar = common::java_peer_jar();
    for (to, layout, prefix) in [("java-pk", "pk", "p"), ("java-epk", "epk", "q")] {
        let (out, drained, stopped) = leave_for_java(&jar, to, layout, prefix).await;
        println!(
            "leaving for the Java processor ({to}): {}; Java drained {drained}, stopped {stopped}",
            out.trim()
        );
        assert!(out.contains("wrote 8 lease(s)"), "{to}: {out}");
        assert_eq!(drained["docs"].as_u64(), Some(50), "{to}");
        assert_eq!(
            stopped["docs"].as_u64(),
            Some(50),
            "{to}: the Java processor read documents our workers had handled"
        );
    }
}

/// Our worker handles 300 documents and stops, 50 more are written, `cfp checkpoints leave --to
/// <to>` writes the checkpoints for the Java processor (lease prefix `prefix`), which then runs
/// with `layout`: the leave's output, and the Java processor's `drained` and `stopped` events.
async fn leave_for_java(jar: &str, to: &str, layout: &str, prefix: &str) -> (String, Value, Value) {
    let (mut emulator, endpoint) = emulator().await;
    let mut worker = common::cfp_worker(&endpoint)
        .args(["--key", EMULATOR_KEY, "--processor", "orders", "--instance", "w0"])
        .args(["--start-from", "beginning", "--poll-interval", "200ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(worker.stdout.take().unwrap()).lines();
    common::cfp_write(&endpoint, 0, 300).await;
    let mut ours = std::collections::BTreeSet::new();
    let _ = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(change) = serde_json::from_str::<Value>(&line)
                && let Some(id) = change["id"].as_str()
            {
                ours.insert(id.to_owned());
                if ours.len() >= 300 {
                    break;
                }
            }
        }
    })
    .await;
    assert_eq!(ours.len(), 300, "our worker handled the first 300");
    // A graceful stop: the last checkpoints are written and the leases released.
    terminate(&mut worker).await;
    common::cfp_write(&endpoint, 300, 50).await;
    let args = [
        "--key",
        EMULATOR_KEY,
        "--processor",
        "orders",
        "--to",
        to,
        "--to-prefix",
        prefix,
    ];
    let (status, out, err) = common::cfp_checkpoints(&endpoint, "leave", &args).await;
    assert_eq!(status, Some(0), "cfp checkpoints leave --to {to}: {err}");
    let mut java = JavaProcessor::start_with_layout(jar, &endpoint, prefix, layout, 50).await;
    let drained = java.event("drained", Duration::from_secs(120)).await;
    // Anything from before our checkpoints would come within a few polls more.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stopped = java.stop().await;
    terminate(&mut emulator).await;
    (out, drained, stopped)
}

/// `cfp emulator` pages a query that asks for no page size as the service does — 100 items a
/// page, then a continuation (issue 54) — so that clients which read one page only (KEDA's
/// scaler reads the first page of its lease query) meet here what they meet on the service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_without_a_page_size_is_answered_100_items_a_page_as_the_service_does() {
    let (mut emulator, endpoint) = emulator().await;
    common::cfp_write(&endpoint, 0, 250).await;
    let client = reqwest::Client::new();
    let link = format!("dbs/{DB}/colls/{ITEMS}");
    let page = |continuation: Option<String>, size: Option<&'static str>| {
        let mut request = signed(
            &client,
            reqwest::Method::POST,
            &format!("{endpoint}{link}/docs"),
            "docs",
            &link,
        )
        .header("x-ms-documentdb-isquery", "true")
        .header("x-ms-documentdb-query-enablecrosspartition", "true")
        .header("content-type", "application/query+json")
        .body(json!({"query": "SELECT * FROM c", "parameters": []}).to_string());
        if let Some(continuation) = continuation {
            request = request.header("x-ms-continuation", continuation);
        }
        if let Some(size) = size {
            request = request.header("x-ms-max-item-count", size);
        }
        request.send()
    };
    let (mut sizes, mut ids, mut continuation) = (Vec::new(), std::collections::BTreeSet::new(), None);
    loop {
        let answer = page(continuation.take(), None).await.unwrap();
        continuation = answer
            .headers()
            .get("x-ms-continuation")
            .and_then(|v| v.to_str().ok())
            .filter(|c| !c.is_empty())
            .map(str::to_owned);
        let body = json_of(answer).await;
        let documents = body["Documents"].as_array().cloned().unwrap_or_default();
        sizes.push(documents.len());
        ids.extend(documents.iter().filter_map(|d| d["id"].as_str().map(str::to_owned)));
        if continuation.is_none() || sizes.len() > 10 {
            break;
        }
    }
    let asked = json_of(page(None, Some("1000")).await.unwrap()).await;
    let whole = asked["Documents"].as_array().map_or(0, Vec::len);
    println!(
        "250 documents queried without a page size: pages {sizes:?}, {} distinct; with x-ms-max-item-count 1000: {whole} in one page",
        ids.len()
    );
    terminate(&mut emulator).await;
    assert_eq!(sizes, [100, 100, 50]);
    assert_eq!((ids.len(), whole), (250, 250));
}
