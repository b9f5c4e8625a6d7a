//! Test harness: an in-process SDK emulator with a monitored and a lease container, processor
//! instances with short lease timings, a handler that records deliveries, and bounded waits.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use changefeed_operator::bench::CountingStore;
use changefeed_operator::cosmos::{CosmosAccount, DocumentContainer, ErrorKind, StartFrom};
use changefeed_operator::emulator::Emulator;
use changefeed_operator::processor::{
    Batch, ChangeHandler, HandlerError, Lease, LeaseStore, Processor, ProcessorHandle, ProcessorOptions,
};
use changefeed_operator::worker::{WorkerSettings, build_processor};
use serde_json::json;

pub mod gate;
pub mod processes;
pub mod writer;
pub use processes::DiesWithTest;

pub const DB: &str = "db";
pub const ITEMS: &str = "items";
pub const LEASES: &str = "leases";
pub const PROCESSOR: &str = "proc";

/// Every delivery: document id → instances it was delivered to, in order.
#[derive(Clone, Default)]
pub struct Deliveries {
    inner: Arc<Mutex<HashMap<String, Vec<String>>>>,
}

impl Deliveries {
    pub fn record(&self, instance: &str, ids: impl IntoIterator<Item = String>) {
        let mut map = self.inner.lock().unwrap();
        for id in ids {
            map.entry(id).or_default().push(instance.to_owned());
        }
    }

    pub fn distinct(&self) -> usize {
        self.inner.lock().unwrap().len()
    }

    pub fn total(&self) -> usize {
        self.inner.lock().unwrap().values().map(Vec::len).sum()
    }

    /// Ids delivered more than once.
    pub fn duplicates(&self) -> Vec<String> {
        let map = self.inner.lock().unwrap();
        let mut dups: Vec<String> = map
            .iter()
            .filter(|(_, v)| v.len() > 1)
            .map(|(k, _)| k.clone())
            .collect();
        dups.sort();
        dups
    }

    /// Of `expected`, the ids never delivered.
    pub fn missing(&self, expected: impl IntoIterator<Item = String>) -> Vec<String> {
        let map = self.inner.lock().unwrap();
        expected.into_iter().filter(|id| !map.contains_key(id)).collect()
    }

    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.inner.lock().unwrap().keys().cloned().collect();
        ids.sort();
        ids
    }

    pub fn clear(&self) {
        self.inner.lock().unwrap().clear();
    }

    /// How often `id` was delivered.
    pub fn count(&self, id: &str) -> usize {
        self.inner.lock().unwrap().get(id).map_or(0, Vec::len)
    }

    /// How many deliveries went to `instance`.
    pub fn delivered_by(&self, instance: &str) -> usize {
        let map = self.inner.lock().unwrap();
        map.values().flatten().filter(|i| *i == instance).count()
    }
}

/// Records each document id with the instance it was delivered to.
pub struct RecordingHandler {
    pub instance: String,
    pub deliveries: Deliveries,
}

#[async_trait]
impl ChangeHandler for RecordingHandler {
    async fn handle(&self, batch: Batch<'_>) -> Result<(), HandlerError> {
        self.deliveries.record(
            &self.instance,
            batch
                .documents
                .iter()
                .filter_map(|d| d["id"].as_str().map(str::to_owned)),
        );
        Ok(())
    }
}

/// An emulator with `db/items` (partition key `/pk`) and the account that reaches it.
pub struct Env {
    pub emulator: Emulator,
    pub account: CosmosAccount,
    pub items: DocumentContainer,
    pub deliveries: Deliveries,
}

impl Env {
    pub async fn new(partitions: u32) -> Self {
        let (emulator, _) = Emulator::in_process_with(DB, ITEMS, partitions).await.unwrap();
        Self::on(emulator).await
    }

    /// The environment of `emulator`, which has `db/items` already.
    pub async fn on(emulator: Emulator) -> Self {
        let account = emulator.account().await.unwrap();
        let items = account.documents(DB, ITEMS).await.unwrap();
        Self {
            emulator,
            account,
            items,
            deliveries: Deliveries::default(),
        }
    }

    /// Short timings: acquire every 500 ms, renew every 300 ms, expire after 2 s, poll every 50 ms.
    pub fn options(&self, instance: &str) -> ProcessorOptions {
        let mut options = ProcessorOptions::new(PROCESSOR, instance);
        options.acquire_interval = Duration::from_millis(500);
        options.renew_interval = Duration::from_millis(300);
        options.expiration = Duration::from_secs(2);
        options.poll_interval = Duration::from_millis(50);
        options.min_backoff = Duration::from_millis(50);
        options.max_backoff = Duration::from_millis(500);
        options.read_timeout = Duration::from_secs(10);
        options.start_from = StartFrom::Beginning;
        options
    }

    pub fn settings(&self, options: ProcessorOptions) -> WorkerSettings {
        WorkerSettings {
            database: DB.into(),
            container: ITEMS.into(),
            lease_database: DB.into(),
            lease_container: LEASES.into(),
            create_leases: true,
            options,
        }
    }

    pub async fn processor(&self, options: ProcessorOptions, handler: Arc<dyn ChangeHandler>) -> Processor {
        build_processor(&self.account, &self.account, &self.settings(options), handler)
            .await
            .unwrap()
    }

    /// A processor of `options` whose lease store is a [`CountingStore`] over the lease
    /// container, as `shape` makes it (slow listings, late answers); the store to cut off or read.
    pub async fn counted_processor(
        &self,
        options: ProcessorOptions,
        handler: Arc<dyn ChangeHandler>,
        shape: impl FnOnce(CountingStore) -> CountingStore,
    ) -> (Arc<CountingStore>, Processor) {
        let settings = self.settings(options.clone());
        let (monitored, leases) = changefeed_operator::worker::open(&self.account, &self.account, &settings)
            .await
            .unwrap();
        let store = Arc::new(shape(CountingStore::new(Arc::new(leases))));
        (store.clone(), Processor::new(monitored, store, handler, options))
    }

    /// Creates the lease container (before anything of the processor exists, or again after it
    /// was deleted). A transient answer is tried again for up to 10 s: the SDK may still resolve
    /// the name to the deleted container's topology (503/20305) for a moment after it is gone.
    pub async fn ensure_leases(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.account.ensure_container(DB, LEASES, "/id").await {
                Ok(()) => return,
                Err(error) if error.kind == ErrorKind::Transient && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(error) => panic!("create the lease container: {error:?}"),
            }
        }
    }

    /// Whether `count` distinct documents were delivered within `timeout`.
    pub async fn delivered_within(&self, count: usize, timeout: Duration) -> bool {
        eventually(timeout, || async { self.deliveries.distinct() >= count }).await
    }

    /// A handler recording into `self.deliveries` as instance `name`.
    pub fn recorder(&self, name: &str) -> Arc<RecordingHandler> {
        Arc::new(RecordingHandler {
            instance: name.into(),
            deliveries: self.deliveries.clone(),
        })
    }

    /// Starts `name` alone and waits (at most 10 s) until it owns all `leases`.
    pub async fn start_owning_all(&self, name: &str, leases: usize) -> ProcessorHandle {
        self.start_owning_all_with(self.options(name), leases).await
    }

    /// Like [`Env::start_owning_all`], with these options.
    pub async fn start_owning_all_with(&self, options: ProcessorOptions, leases: usize) -> ProcessorHandle {
        let name = options.instance.clone();
        let name = name.as_str();
        let handle = self.start(options).await;
        let owns_all = eventually(Duration::from_secs(10), || async {
            self.owners().await.get(name) == Some(&leases)
        })
        .await;
        assert!(
            owns_all,
            "{name} did not take all {leases} leases: {:?}",
            self.owners().await
        );
        handle
    }

    /// Starts an instance recording into `self.deliveries`.
    pub async fn start(&self, options: ProcessorOptions) -> ProcessorHandle {
        let handler = Arc::new(RecordingHandler {
            instance: options.instance.clone(),
            deliveries: self.deliveries.clone(),
        });
        self.processor(options, handler).await.start().await.unwrap()
    }

    /// Upserts `doc-<n>` for each n, spread over 97 logical partitions.
    pub async fn write(&self, range: std::ops::Range<usize>) {
        use futures::StreamExt;
        futures::stream::iter(range)
            .for_each_concurrent(32, |n| upsert_doc(&self.items, n))
            .await;
    }

    /// A direct view of the lease container (same prefix as the instances).
    pub async fn store(&self) -> Arc<dyn LeaseStore> {
        Arc::new(lease_store(&self.account, PROCESSOR).await.expect("lease store"))
    }

    pub async fn leases(&self) -> Vec<Lease> {
        self.store().await.snapshot().await.unwrap().leases
    }

    /// Lease count per owner in the store (unowned under "").
    pub async fn owners(&self) -> BTreeMap<String, usize> {
        owner_counts(self.leases().await)
    }
}

/// Lease count per owner among `leases` (unowned under "").
pub fn owner_counts(leases: impl IntoIterator<Item = Lease>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for lease in leases {
        *counts.entry(lease.owner.unwrap_or_default()).or_default() += 1;
    }
    counts
}

/// Upserts `doc-<n>` (partition key `pk-<n % 97>`), retrying what a client retries: throttling,
/// timeouts and a partition in its split window (410/1007).
pub async fn upsert_doc(items: &DocumentContainer, n: usize) {
    let pk = format!("pk-{}", n % 97);
    let doc = json!({"id": format!("doc-{n}"), "pk": pk, "n": n});
    for attempt in 0.. {
        match items.upsert(&pk, &doc).await {
            Ok(_) => return,
            Err(e) if attempt < 100 && (e.kind.is_retryable() || e.kind == ErrorKind::RangeGone) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("writing doc-{n}: {e}"),
        }
    }
}

pub fn ids(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|n| format!("doc-{n}")).collect()
}

/// Polls `check` every 50 ms until it holds or `timeout` passes; returns whether it held.
pub async fn eventually<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether every owner in `counts` (besides unowned) holds `share` or `share + 1` and none is unowned.
pub fn fair(counts: &BTreeMap<String, usize>, instances: usize, leases: usize) -> bool {
    let floor = leases / instances;
    counts.get("").is_none()
        && counts.len() == instances
        && counts
            .values()
            .all(|c| *c == floor || *c == floor + usize::from(!leases.is_multiple_of(instances)))
}

/// The `cfp` binary under test.
pub const CFP: &str = env!("CARGO_BIN_EXE_cfp");

/// Starts `cfp emulator --port 0 --container <spec>` and returns it with the endpoint it printed.
pub async fn start_emulator(container: &str) -> (tokio::process::Child, String) {
    start_emulator_on(0, container).await
}

/// Starts `cfp emulator --port <port> --container <spec>` (0: any free port) and returns it with
/// the endpoint it printed.
pub async fn start_emulator_on(port: u16, container: &str) -> (tokio::process::Child, String) {
    start_emulator_with(&["--port", &port.to_string(), "--container", container]).await
}

/// Starts `cfp emulator <args>` and returns it with the endpoint it printed.
pub async fn start_emulator_with(args: &[&str]) -> (tokio::process::Child, String) {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let mut child = tokio::process::Command::new(CFP)
        .arg("emulator")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .dies_with_test()
        .spawn()
        .expect("spawn cfp emulator");
    let stdout = child.stdout.take().expect("emulator stdout");
    let mut lines = BufReader::new(stdout).lines();
    let endpoint = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(endpoint) = line.trim().strip_prefix("endpoint:") {
                return endpoint.trim().to_owned();
            }
        }
        panic!("the emulator exited without printing its endpoint");
    })
    .await
    .expect("emulator endpoint within 20 s");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    allow_emulator(&endpoint);
    (child, endpoint)
}

/// `worker::open` of `settings` on `account`, again after a transient answer (the SDK's
/// container-topology read may fail under the suite's load: 503/20305), for at most 5 s.
pub async fn open_containers(
    account: &CosmosAccount,
    settings: &changefeed_operator::worker::WorkerSettings,
) -> (
    changefeed_operator::cosmos::MonitoredContainer,
    changefeed_operator::processor::CosmosLeaseStore,
) {
    use changefeed_operator::worker::WorkerError;
    for attempt in 0.. {
        match changefeed_operator::worker::open(account, account, settings).await {
            Ok(opened) => return opened,
            Err(WorkerError::Cosmos { source, .. }) if source.kind == ErrorKind::Transient && attempt < 50 => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(error) => panic!("opening the containers: {error}"),
        }
    }
    unreachable!("the loop returns or panics")
}

/// The allowed-accounts file of every `cfp operator` the tests start: each emulator a test
/// starts is listed in it (plain http, every namespace), as a cluster admin lists a development
/// emulator; anything else a resource names is not.
pub fn allowed_accounts_file() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("cfp-tests-{}-allowed-accounts.yaml", std::process::id()))
}

/// Adds `endpoint` to [`allowed_accounts_file`] (rewritten whole, then renamed into place, so
/// that an operator never reads half of it).
pub fn allow_emulator(endpoint: &str) {
    static LISTED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut listed = LISTED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    listed.push(endpoint.to_owned());
    let yaml: String = listed
        .iter()
        .map(|e| format!("- endpoint: {e}\n  namespaces: ['*']\n"))
        .collect();
    let file = allowed_accounts_file();
    let written = file.with_extension("yaml.new");
    std::fs::write(&written, yaml).expect("write the allowed accounts");
    std::fs::rename(&written, &file).expect("move the allowed accounts into place");
}

/// Starts `cfp emulator` with two regions, East US (which takes writes) and West US, which has
/// each write `delay_ms` later, and the `--container` specs `containers`; returns it with East
/// US's endpoint.
pub async fn start_two_regions(containers: &[&str], delay_ms: u64) -> (tokio::process::Child, String) {
    let delay = delay_ms.to_string();
    let mut args = vec!["--port", "0", "--region", "East US", "--region", "West US"];
    args.extend(["--replication-delay-ms", &delay]);
    for container in containers {
        args.extend(["--container", container]);
    }
    start_emulator_with(&args).await
}

/// Asks the `cfp emulator` at `endpoint` for a control action (`GET faults`, `POST outage?ms=N`,
/// ...); asserts it succeeded and returns its JSON answer.
pub async fn emulator_control(endpoint: &str, method: reqwest::Method, action: &str) -> serde_json::Value {
    let answer = reqwest::Client::new()
        .request(method, format!("{endpoint}_emulator/{action}"))
        .send()
        .await
        .expect("the emulator's control API answers");
    assert!(answer.status().is_success(), "{action}: {}", answer.status());
    serde_json::from_slice(&answer.bytes().await.expect("body")).expect("JSON")
}

/// Creates `database/container` (partition key `/id`) on the `cfp emulator` at `endpoint` through
/// its management plane, as `az cosmosdb sql container create` does where the data plane may not.
pub async fn create_container_as_admin(endpoint: &str, database: &str, container: &str) {
    let action = format!("containers?database={database}&container={container}&partitionKey=/id");
    emulator_control(endpoint, reqwest::Method::POST, &action).await;
}

/// Runs `cfp <args>` with `env` and `RUST_LOG=<log>` to its end (at most 60 s): (exit code,
/// stdout, stderr).
pub async fn cfp_output<S: AsRef<std::ffi::OsStr>>(
    args: &[S],
    env: &[(&str, String)],
    log: &str,
) -> (Option<i32>, String, String) {
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(CFP)
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("RUST_LOG", log)
            .output(),
    )
    .await
    .expect("cfp exits by itself")
    .expect("run cfp");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `cfp worker` of `db/items` at `endpoint` (logs at warn level), for more flags and spawning.
pub fn cfp_worker(endpoint: &str) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(CFP);
    command
        .args(["worker", "--endpoint", endpoint, "--database", DB, "--container", ITEMS])
        .env("RUST_LOG", "warn")
        .dies_with_test();
    command
}

/// Runs `cfp write` of `doc-<first>`.. against `db/items` at `endpoint`.
pub async fn cfp_write(endpoint: &str, first: u64, count: u64) {
    cfp_write_with(endpoint, first, count, &[], &[]).await;
}

/// Like [`cfp_write`], with more flags and environment variables (for example an identity).
pub async fn cfp_write_with(endpoint: &str, first: u64, count: u64, flags: &[&str], env: &[(&str, String)]) {
    let status = tokio::process::Command::new(CFP)
        .args(["write", "--endpoint", endpoint, "--database", DB, "--container", ITEMS])
        .args(["--first", &first.to_string(), "--count", &count.to_string()])
        .args(flags)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stderr(std::process::Stdio::null())
        .status()
        .await
        .expect("run cfp write");
    assert!(status.success(), "cfp write failed");
}

/// The lease store of processor `processor` for `db/items` in `db/leases` of `account`.
pub async fn lease_store(
    account: &CosmosAccount,
    processor: &str,
) -> Option<changefeed_operator::processor::CosmosLeaseStore> {
    lease_store_of(account, processor, ITEMS).await
}

/// The leases of processor `processor` for `db/items` in `db/leases` of `account`, listed now.
pub async fn leases_of(account: &CosmosAccount, processor: &str) -> Vec<Lease> {
    let store = lease_store(account, processor).await.expect("the lease store");
    store.snapshot().await.expect("a listing of the leases").leases
}

/// The lease store of processor `processor` for `db/<container>` in `db/leases` of `account`.
pub async fn lease_store_of(
    account: &CosmosAccount,
    processor: &str,
    container: &str,
) -> Option<changefeed_operator::processor::CosmosLeaseStore> {
    let monitored = account.monitored(DB, container).await.ok()?;
    let docs = account.documents(DB, LEASES).await.ok()?;
    let prefix = changefeed_operator::processor::lease_prefix(
        processor,
        account.host(),
        monitored.database_rid(),
        monitored.rid(),
    );
    changefeed_operator::processor::CosmosLeaseStore::new(docs, prefix).ok()
}

/// Sends SIGTERM and waits (bounded) for the process to exit.
pub async fn terminate(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id() {
        let _ = tokio::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
}

/// A plain HTTP/1.1 GET against a loopback address: (status, body); status 0 when nothing listens.
pub async fn http_get(address: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(address).await else {
        return (0, String::new());
    };
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.expect("read");
    let status = raw.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The whole body of a request a test server received (empty when it cannot be read).
pub async fn body_of(req: hyper::Request<hyper::body::Incoming>) -> bytes::Bytes {
    use http_body_util::BodyExt;
    req.into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default()
}

/// A batch receiver like a user's service: serves `listener`, hands each request's path and JSON
/// body (`null` when it is not JSON) to `on_batch`, and answers 200.
pub fn receive_batches(
    listener: tokio::net::TcpListener,
    on_batch: impl Fn(&str, serde_json::Value) + Send + Sync + 'static,
) {
    receive_batches_slowed(listener, Default::default(), on_batch);
}

/// Like [`receive_batches`], each answer held back by `delay_ms` (a user's service that takes
/// time; changeable while it runs).
pub fn receive_batches_slowed(
    listener: tokio::net::TcpListener,
    delay_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
    on_batch: impl Fn(&str, serde_json::Value) + Send + Sync + 'static,
) {
    let on_batch = std::sync::Arc::new(on_batch);
    tokio::spawn(changefeed_operator::http_server::serve(
        listener,
        tokio_util::sync::CancellationToken::new(),
        move |req: hyper::Request<hyper::body::Incoming>| {
            let (on_batch, delay_ms) = (on_batch.clone(), delay_ms.clone());
            async move {
                let path = req.uri().path().to_owned();
                let body = serde_json::from_slice(&body_of(req).await).unwrap_or_default();
                let delay = delay_ms.load(std::sync::atomic::Ordering::Relaxed);
                if delay > 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
                }
                on_batch(&path, body);
                changefeed_operator::http_server::json(200, &serde_json::json!({}))
            }
        },
    ));
}

/// `cfp worker` lease timings for multi-process tests: acquire and renew every second, expire
/// after three.
pub const FAST_LEASES: [&str; 6] = [
    "--lease-acquire-interval",
    "1s",
    "--lease-renew-interval",
    "1s",
    "--lease-expiration",
    "3s",
];

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

/// The flags that name `db/items` at `endpoint`.
fn items_at(endpoint: &str) -> [&str; 6] {
    ["--endpoint", endpoint, "--database", DB, "--container", ITEMS]
}

/// Runs `cfp checkpoints <command>` of `db/items` at `endpoint` with more `args` (the connection
/// flags of `cfp worker`): (exit code, stdout, stderr).
pub async fn cfp_checkpoints(endpoint: &str, command: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let mut all = vec!["checkpoints", command];
    all.extend(items_at(endpoint));
    all.extend(args);
    cfp_output(&all, &[], "warn").await
}

/// Runs `cfp estimate` of `db/items` at `endpoint` with more `flags`.
pub async fn cfp_estimate(endpoint: &str, flags: &[&str]) -> std::process::Output {
    tokio::process::Command::new(CFP)
        .arg("estimate")
        .args(items_at(endpoint))
        .args(flags)
        .output()
        .await
        .expect("run cfp estimate")
}

/// Builds the Java peer (bench/java-peer/build.sh) once per test binary (two Maven builds must not
/// share its target directory) and returns the jar.
pub fn java_peer_jar() -> String {
    static JAR: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();
    built_once(
        &JAR,
        "bench/java-peer/build.sh",
        "the Java peer (a JDK 17+ and Maven are needed",
    )
}

/// Runs the build script `script` (a path in the repository) once per test binary, keeping its
/// answer in `cell`, and returns the path it printed; panics with its errors, naming `what`.
pub fn built_once(cell: &'static std::sync::OnceLock<Result<String, String>>, script: &str, what: &str) -> String {
    let built = cell.get_or_init(|| {
        let output = std::process::Command::new("bash")
            .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(script))
            .output()
            .unwrap_or_else(|e| panic!("bash runs {script}: {e}"));
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    });
    match built {
        Ok(path) => path.clone(),
        Err(stderr) => panic!("building {what}, see .ci/run) failed: {stderr}"),
    }
}

/// Held by each test that loads the whole machine for minutes (the end-to-end cluster, the
/// benchmark, the soak) or times renewals to a quarter second (renewals::) while it runs, so that
/// no two of them overlap: together on 2 cores they starve each other (and the benchmark's
/// figures mean nothing). A test waiting here holds a test thread idle, so these are named to
/// sort far apart (tests run in the order of their names; three test threads on 2 cores,
/// `.cargo/config.toml`; one after the other they are the suite's longest path): the soak is
/// `overlapping_faults_soak`, reached well after the end-to-end test ends and done before
/// `renewals::`.
pub async fn heavy() -> tokio::sync::MutexGuard<'static, ()> {
    static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    HEAVY.lock().await
}

/// Waits (at most `timeout`) for the first lease event `pick` accepts; `None` when none came.
pub async fn next_event<T>(
    events: &mut tokio::sync::broadcast::Receiver<changefeed_operator::processor::LeaseEvent>,
    timeout: Duration,
    mut pick: impl FnMut(changefeed_operator::processor::LeaseEvent) -> Option<T>,
) -> Option<T> {
    tokio::time::timeout(timeout, async {
        loop {
            match events.recv().await {
                Ok(event) => {
                    if let Some(found) = pick(event) {
                        return Some(found);
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
    .await
    .ok()
    .flatten()
}
