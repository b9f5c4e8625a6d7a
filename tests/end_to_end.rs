//! The whole product on a real single-node cluster (`tests/cluster`): `helm install`, the operator
//! as a pod, a `ChangeFeedProcessor` whose worker pods (the `cfp` image, restricted security
//! context enforced by the kubelet, probes) deliver every document over HTTP to a receiver on the
//! host, autoscaling from the estimator's lag, failover when a pod is killed, a graceful rolling
//! restart, a worker killed in place resuming at once (expiration 60 s), a rolling restart of workers whose handler is a native sidecar in the pod (no batch
//! delivered twice), and a crash-looping worker reported in the status. One cluster, steps in order
//! (the crash loop's minute of back-off runs beside the sidecar step).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use changefeed_operator::cosmos::{AccountAuth, CosmosAccount};
use changefeed_operator::operator::{ChangeFeedProcessor, ChangeFeedProcessorStatus};
use changefeed_operator::processor::LeaseStore;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease as KubeLease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use crate::cluster::{self, CFP_IMAGE, Cluster, HANDLER_IMAGE, HOST_IP};
use crate::common::{self, CFP, lease_store, terminate, upsert_doc};

/// An account endpoint on the node where nothing listens: a worker pointed at it cannot start.
fn unreachable_account() -> String {
    format!("http://{HOST_IP}:1/")
}

/// The SDK client of this test reaches the emulator at the bridge address over plain HTTP, which
/// the SDK allows only for the host named by `AZURE_COSMOS_EMULATOR_HOST` (and loopback). The
/// variable is set before `main`, while the test binary has a single thread: set by this test, it
/// would race the other tests' threads reading the environment. It adds the bridge address to the
/// emulator hosts of this process and of the processes the tests start, and changes nothing else.
#[used]
#[unsafe(link_section = ".init_array")]
static EMULATOR_HOST: extern "C" fn() = {
    extern "C" fn set() {
        // SAFETY: before `main`, no other thread exists to read the environment.
        unsafe { std::env::set_var("AZURE_COSMOS_EMULATOR_HOST", HOST_IP) };
    }
    set
};

const NS: &str = "shop";
const PARTITIONS: usize = 8;
/// The monitored container of the processor whose handler is a sidecar (step 4d).
const RELAY: &str = "relay";
const RELAY_PARTITIONS: usize = 4;

/// What the HTTP handler delivered: every document id in arrival order.
#[derive(Default)]
struct Received {
    ids: Vec<String>,
}

impl Received {
    fn distinct_with_prefix(&self, prefix: &str) -> usize {
        self.ids
            .iter()
            .filter(|id| id.starts_with(prefix))
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    }

    fn duplicates_with_prefix(&self, prefix: &str) -> usize {
        self.ids.iter().filter(|id| id.starts_with(prefix)).count() - self.distinct_with_prefix(prefix)
    }
}

/// The user's service: an HTTP endpoint on the host's bridge address that the worker pods POST
/// batches to (the handler's JSON format).
async fn receiver(delay_ms: Arc<std::sync::atomic::AtomicU64>) -> (SocketAddr, Arc<Mutex<Received>>) {
    let listener = tokio::net::TcpListener::bind((HOST_IP, 0))
        .await
        .expect("bind receiver");
    let address = listener.local_addr().unwrap();
    let received = Arc::new(Mutex::new(Received::default()));
    let sink = received.clone();
    common::receive_batches_slowed(listener, delay_ms, move |_, batch| {
        let ids = batch["documents"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d["id"].as_str().map(str::to_owned));
        sink.lock().unwrap().ids.extend(ids);
    });
    (address, received)
}

/// Polls `get` every 250 ms until it returns `Some`, at most `timeout`; panics naming `what`.
async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut get: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = get().await {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn kubectl(cluster: &Cluster, args: &[&str], stdin: Option<&str>) -> String {
    let (ok, out, err) = cluster.plane.kubectl_run(args, stdin);
    assert!(ok, "kubectl {}: {err}", args.join(" "));
    out
}

fn resource(name: &str, endpoint: &str, handler: &str, extra: &str) -> String {
    format!(
        r#"apiVersion: changefeed.io/v1alpha1
kind: ChangeFeedProcessor
metadata: {{name: {name}, namespace: {NS}}}
spec:
  connection:
    endpoint: {endpoint}
    keySecretRef: {{name: cosmos}}
  monitored: {{database: db, container: items}}
  pollInterval: 200ms
  leaseTimings: {{acquireInterval: 1s, renewInterval: 1s, expiration: 5s}}
  handler:
    type: Http
    http: {{url: "{handler}"}}
  worker:
    env: [{{name: COSMOS_DISABLE_IMDS, value: "true"}}]
{extra}"#
    )
}

/// Worker pods of `name` that are Running and Ready (not terminating).
async fn ready_pods(pods: &Api<Pod>, name: &str) -> Vec<String> {
    let selector = format!("changefeed.io/processor={name}");
    let list = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    list.into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .filter_map(|p| p.metadata.name)
        .collect()
}

/// The Ready worker pods of `name` and how many leases they hold together.
async fn ready_holding(pods: &Api<Pod>, store: &impl LeaseStore, name: &str) -> (Vec<String>, usize) {
    let ready = ready_pods(pods, name).await;
    let held = owners(store)
        .await
        .iter()
        .filter(|(o, _)| ready.contains(o))
        .map(|(_, n)| n)
        .sum::<usize>();
    (ready, held)
}

/// Leases per owner ("" for none).
async fn owners(store: &impl LeaseStore) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    if let Ok(snapshot) = store.snapshot().await {
        for lease in snapshot.leases {
            *counts.entry(lease.owner.unwrap_or_default()).or_default() += 1;
        }
    }
    counts
}

async fn status(cfps: &Api<ChangeFeedProcessor>, name: &str) -> Option<ChangeFeedProcessorStatus> {
    cfps.get(name).await.ok()?.status
}

async fn spec_replicas(deployments: &Api<Deployment>, name: &str) -> Option<i32> {
    deployments.get_opt(name).await.ok()??.spec?.replicas
}

/// One POST a handler sidecar recorded (`tools/k8s/handler.c`): one file per POST, its body on
/// one line, named `<pod>-<handler start>-<n>.json`, and an empty `….answered` once the handler
/// answered 200.
struct Post {
    /// The file's name (which pod, which connection).
    file: String,
    /// When the handler recorded it.
    at: std::time::SystemTime,
    /// When the handler answered 200, if it did.
    answered: Option<std::time::SystemTime>,
    lease: String,
    batch: String,
    ids: Vec<String>,
}

/// Every POST the handler sidecars recorded, in the order they were recorded.
struct Recorded {
    posts: Vec<Post>,
}

impl Recorded {
    fn read(dir: &Path) -> Recorded {
        let mut posts: Vec<Post> = std::fs::read_dir(dir)
            .expect("the records directory")
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .map(|file| {
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                let body: serde_json::Value =
                    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{}: {e}: {text}", file.display()));
                Post {
                    file: file.file_name().unwrap_or_default().to_string_lossy().into_owned(),
                    at: std::fs::metadata(&file)
                        .and_then(|m| m.modified())
                        .unwrap_or(std::time::UNIX_EPOCH),
                    answered: std::fs::metadata(file.with_extension("answered"))
                        .and_then(|m| m.modified())
                        .ok(),
                    lease: body["lease"].as_str().unwrap_or_default().to_owned(),
                    batch: body["batch"].as_str().unwrap_or_default().to_owned(),
                    ids: body["documents"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|d| d["id"].as_str().map(str::to_owned))
                        .collect(),
                }
            })
            .collect();
        posts.sort_by_key(|p| p.at);
        Recorded { posts }
    }

    /// How often each document of `expected` arrived.
    fn counts<'a>(&'a self, expected: &std::collections::BTreeSet<String>) -> BTreeMap<&'a str, usize> {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for post in &self.posts {
            for id in post.ids.iter().filter(|id| expected.contains(*id)) {
                *counts.entry(id).or_default() += 1;
            }
        }
        counts
    }

    /// Of `expected`: how many arrived, and how many arrived more than once.
    fn delivered_and_duplicated(&self, expected: &std::collections::BTreeSet<String>) -> (usize, usize) {
        let counts = self.counts(expected);
        (counts.len(), counts.values().filter(|n| **n > 1).count())
    }

    /// The POSTs pod `pod` had received and not answered when it was told to stop (`stop`), and
    /// how many of them it answered after that.
    fn in_flight_at(&self, pod: &str, stop: std::time::SystemTime) -> (usize, usize) {
        let prefix = format!("{pod}-");
        let in_flight: Vec<&Post> = self
            .posts
            .iter()
            .filter(|p| p.file.starts_with(&prefix) && p.at <= stop && p.answered.is_none_or(|a| a > stop))
            .collect();
        (
            in_flight.len(),
            in_flight.iter().filter(|p| p.answered.is_some()).count(),
        )
    }

    /// The POSTs that carried a document of `expected` arriving more than once, one line each.
    fn redeliveries(&self, expected: &std::collections::BTreeSet<String>) -> Vec<String> {
        let counts = self.counts(expected);
        self.posts
            .iter()
            .filter_map(|post| {
                let twice = post.ids.iter().filter(|id| counts.get(id.as_str()) > Some(&1)).count();
                let at = post.at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                (twice > 0).then(|| {
                    format!(
                        "{:.3} {} lease {} batch {}: {twice} of {} documents arrive more than once ({}..{})",
                        at.as_secs_f64(),
                        post.file,
                        post.lease,
                        post.batch,
                        post.ids.len(),
                        post.ids.first().map_or("", String::as_str),
                        post.ids.last().map_or("", String::as_str),
                    )
                })
            })
            .collect()
    }
}

/// A processor over `db/relay` whose handler is the naive sidecar of [`HANDLER_IMAGE`], recording
/// into the host directory `records` and answering 1.5 s after it recorded a batch. The lease
/// expiration (15 s) exceeds that by far: an owner asked for a handoff (the rollout's new pods)
/// that has not handed over within a lease expiration loses the lease outright
/// (`docs/concepts/how-it-works.md`, "Handoff instead of theft"), which would redeliver the batch
/// in flight whatever the pod's shape.
fn relay_resource(endpoint: &str, records: &Path) -> String {
    format!(
        r#"apiVersion: changefeed.io/v1alpha1
kind: ChangeFeedProcessor
metadata: {{name: {RELAY}, namespace: {NS}}}
spec:
  connection:
    endpoint: {endpoint}
    keySecretRef: {{name: cosmos}}
  monitored: {{database: db, container: {RELAY}}}
  pollInterval: 200ms
  leaseTimings: {{acquireInterval: 1s, renewInterval: 5s, expiration: 15s}}
  handler:
    type: Http
    http: {{url: "http://localhost:8080/changes", timeout: 10s, readinessPath: /ready}}
  replicas: 2
  worker:
    env: [{{name: COSMOS_DISABLE_IMDS, value: "true"}}]
    volumes: [{{name: records, hostPath: {{path: "{records}", type: Directory}}}}]
    sidecars:
    - name: handler
      image: {HANDLER_IMAGE}
      imagePullPolicy: IfNotPresent
      env: [{{name: DELAY_MS, value: "1500"}}]
      ports: [{{containerPort: 8080}}]
      volumeMounts: [{{name: records, mountPath: /records}}]
"#,
        records = records.display()
    )
}

/// Kills (SIGKILL) the worker process of one Ready `orders` pod holding leases and waits until the
/// kubelet runs its container again: (the pod, when its container ran again, how long after the
/// kill that was).
async fn kill_a_worker_in_place(
    cluster: &Cluster,
    pods: &Api<Pod>,
    store: &impl LeaseStore,
) -> (String, Instant, Duration) {
    let ready = wait_for(
        "3 Ready workers holding every lease",
        Duration::from_secs(120),
        || async {
            let (ready, held) = ready_holding(pods, store, "orders").await;
            (ready.len() == 3 && held == PARTITIONS).then_some(ready)
        },
    )
    .await;
    let victim = ready[0].clone();
    let instance = format!("CFP_INSTANCE={victim}");
    let pid = cluster
        .container_pids("worker")
        .into_iter()
        .find(|pid| {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            environ.split(|b| *b == 0).any(|var| var == instance.as_bytes())
        })
        .expect("the victim's worker process");
    let killed = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -9 {pid}");
    wait_for(
        "the killed worker's container running again",
        Duration::from_secs(60),
        || async {
            let pod = pods.get_opt(&victim).await.ok()??;
            let worker = pod
                .status?
                .container_statuses?
                .into_iter()
                .find(|s| s.name == "worker")?;
            let running = worker.state.is_some_and(|s| s.running.is_some());
            (worker.restart_count >= 1 && running).then_some(())
        },
    )
    .await;
    (victim, Instant::now(), killed.elapsed())
}

/// A uid and whether the root filesystem is mounted read-only, for a host PID.
fn process_identity(pid: u32) -> (String, bool) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_default()
        .to_owned();
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
    let read_only = mounts
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .any(|f| f.get(4) == Some(&"/") && f.get(5).is_some_and(|o| o.split(',').any(|o| o == "ro")));
    (uid, read_only)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_product_runs_end_to_end_on_a_real_single_node_cluster() {
    if let Some(reason) = cluster::unavailable() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run the end-to-end cluster: {reason}"
        );
        eprintln!("SKIPPED the end-to-end cluster test: {reason}");
        return;
    }
    let _heavy = common::heavy().await;
    // Started on this (the test's) thread: the processes die with it.
    let mut cluster = Cluster::start(Path::new(CFP)).unwrap_or_else(|e| panic!("cluster: {e}"));
    let client = cluster.plane.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let cfps: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), NS);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);

    // The accounts (`cfp emulator` on the node's address, and a port nothing listens on) the
    // operator is allowed to reach over plain http for the test's namespace, as a cluster admin
    // lists a development emulator.
    let (mut emulator, endpoint) = common::start_emulator_with(&[
        "--host",
        HOST_IP,
        "--port",
        "0",
        "--container",
        &format!("db/items:/pk:{PARTITIONS}"),
        "--container",
        &format!("db/{RELAY}:/pk:{RELAY_PARTITIONS}"),
    ])
    .await;

    // 1. helm install: the operator runs as pods, one leads, `kubectl get cfp` works.
    let started = Instant::now();
    let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/changefeed-operator");
    let (repository, tag) = CFP_IMAGE.rsplit_once(':').unwrap();
    let helm = std::process::Command::new(cluster.plane.bin.join("helm"))
        .env("KUBECONFIG", &cluster.plane.kubeconfig)
        .args([
            "install",
            "cfp",
            chart,
            "--namespace",
            "cfp-system",
            "--create-namespace",
            "--wait",
            "--timeout",
            "180s",
        ])
        .args([
            "--set",
            &format!("image.repository={repository},image.tag={tag},image.pullPolicy=IfNotPresent"),
        ])
        .args([
            "--set",
            "leaderElection.leaseDuration=6s,leaderElection.renewDeadline=4s,leaderElection.renewInterval=1s",
        ])
        .args([
            "--set-string",
            &format!("extraEnv[0].name=AZURE_COSMOS_EMULATOR_HOST,extraEnv[0].value={HOST_IP}"),
        ])
        .args([
            "--set-string",
            "extraEnv[1].name=COSMOS_DISABLE_IMDS,extraEnv[1].value=true",
        ])
        .args([
            "--set-string",
            &format!(
                "allowedAccounts[0].endpoint={endpoint},allowedAccounts[0].namespaces[0]={NS},allowedAccounts[1].endpoint={},allowedAccounts[1].namespaces[0]={NS}",
                unreachable_account()
            ),
        ])
        .output()
        .expect("run helm");
    assert!(
        helm.status.success(),
        "helm install: {}\n{}",
        String::from_utf8_lossy(&helm.stderr),
        cluster.log_tail("kubelet", 20)
    );
    let leases: Api<KubeLease> = Api::namespaced(client.clone(), "cfp-system");
    let leader = wait_for("an operator pod leads", Duration::from_secs(60), || async {
        let lease = leases.get_opt("cfp-changefeed-operator").await.ok()??;
        lease.spec?.holder_identity.filter(|h| !h.is_empty())
    })
    .await;
    kubectl(&cluster, &["create", "namespace", NS], None);
    kubectl(&cluster, &["get", "cfp", "-A"], None);
    println!(
        "1. helm install → operator pods Running, leader {leader}, in {:.1?}",
        started.elapsed()
    );

    // 2. A processor over 8 partitions with a backlog: worker pods take every lease, evenly, and
    //    deliver every document to the receiver.
    let account = CosmosAccount::connect(&endpoint, &AccountAuth::emulator_key())
        .await
        .expect("account");
    let items = account.documents("db", "items").await.expect("items");
    let write = |range: std::ops::Range<usize>| {
        let items = items.clone();
        async move {
            futures::future::join_all(range.map(|n| {
                let items = items.clone();
                async move { upsert_doc(&items, n).await }
            }))
            .await;
        }
    };
    write(0..2000).await;
    // The user's service answers at once but for the autoscaling step, where it takes 20 ms a
    // batch, so that one worker cannot keep up with the step's writes: lag to scale on.
    let slowness = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (receiver_address, received) = receiver(slowness.clone()).await;
    let handler = format!("http://{receiver_address}/changes");
    kubectl(
        &cluster,
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: cosmos, namespace: {NS}}}\nstringData: {{key: \"{}\"}}\n---\n{}",
            changefeed_operator::cosmos::EMULATOR_KEY,
            resource("orders", &endpoint, &handler, "  replicas: 4\n")
        )),
    );
    let started = Instant::now();
    let running = wait_for("4 worker pods Ready", Duration::from_secs(120), || async {
        let ready = ready_pods(&pods, "orders").await;
        (ready.len() == 4).then_some(ready)
    })
    .await;
    let pods_ready = started.elapsed();
    wait_for("2000 documents delivered", Duration::from_secs(120), || async {
        (received.lock().unwrap().distinct_with_prefix("doc-") >= 2000).then_some(())
    })
    .await;
    let delivered = started.elapsed();
    let store = wait_for("the lease store", Duration::from_secs(30), || {
        lease_store(&account, "orders")
    })
    .await;
    let spread = wait_for("8 leases, 2 per pod", Duration::from_secs(60), || async {
        let owners = owners(&store).await;
        let live = owners.iter().filter(|(o, _)| running.contains(o)).count();
        (live == 4 && owners.values().all(|n| *n == 2)).then_some(owners)
    })
    .await;
    let pids = cluster.container_pids("worker");
    let identities: Vec<(String, bool)> = pids.iter().map(|pid| process_identity(*pid)).collect();
    assert!(!identities.is_empty(), "worker processes found through containerd");
    assert!(
        identities.iter().all(|(uid, ro)| uid == "65532" && *ro),
        "the kubelet enforced non-root and a read-only root filesystem: {identities:?}"
    );
    let (distinct, duplicates) = {
        let r = received.lock().unwrap();
        (r.distinct_with_prefix("doc-"), r.duplicates_with_prefix("doc-"))
    };
    println!(
        "2. 4 worker pods Ready in {pods_ready:.1?} (uid/read-only root of {} worker processes: {identities:?}); {distinct}/2000 documents delivered in {delivered:.1?} ({duplicates} duplicates); leases per pod {spread:?}",
        pids.len()
    );

    // 3. Autoscaling: lag → more pods → drained → back down after the stabilization window.
    // Batches of 10 (not 100) taking 200 ms each, so that one worker's drain (25 batches on each
    // of its 8 leases, side by side: 5 s) outlasts several estimates (every 1 s) and the lag is
    // seen whatever the write's pace.
    kubectl(
        &cluster,
        &["apply", "-f", "-"],
        Some(&resource(
            "orders",
            &endpoint,
            &handler,
            "  maxItems: 10\n  autoscaling: {enabled: true, minReplicas: 1, maxReplicas: 8, targetLagPerReplica: 250, scaleDownStabilization: 15s, estimateInterval: 1s}\n",
        )),
    );
    wait_for("scaled in to 1 with no lag", Duration::from_secs(60), || async {
        (spec_replicas(&deployments, "orders").await == Some(1)).then_some(())
    })
    .await;
    wait_for("one Ready worker", Duration::from_secs(60), || async {
        (ready_pods(&pods, "orders").await.len() == 1).then_some(())
    })
    .await;
    slowness.store(200, std::sync::atomic::Ordering::Relaxed);
    let started = Instant::now();
    write(2000..4000).await;
    let mut timeline: Vec<(f64, Option<i64>, Option<i32>, usize)> = Vec::new();
    let mut peak = (0, 0);
    let deadline = started + Duration::from_secs(150);
    loop {
        let lag = status(&cfps, "orders").await.and_then(|s| s.estimated_lag);
        let replicas = spec_replicas(&deployments, "orders").await;
        let ready = ready_pods(&pods, "orders").await.len();
        peak = (peak.0.max(replicas.unwrap_or(0)), peak.1.max(ready));
        let sample = (started.elapsed().as_secs_f64(), lag, replicas, ready);
        if timeline
            .last()
            .is_none_or(|last| (last.1, last.2, last.3) != (lag, replicas, ready))
        {
            timeline.push(sample);
        }
        let delivered = received.lock().unwrap().distinct_with_prefix("doc-");
        if peak.0 > 1 && replicas == Some(1) && ready == 1 && delivered >= 4000 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "autoscaling timeline did not complete: {timeline:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    slowness.store(0, std::sync::atomic::Ordering::Relaxed);
    let timeline_text: Vec<String> = timeline
        .iter()
        .map(|(t, lag, replicas, ready)| {
            format!(
                "{t:.1}s lag {} replicas {} ready {ready}",
                lag.map_or("-".into(), |l| l.to_string()),
                replicas.unwrap_or(-1)
            )
        })
        .collect();
    println!(
        "3. autoscaling (2000 new documents, target 250/replica, window 15s): peak {} replicas / {} Ready pods; timeline: {}",
        peak.0,
        peak.1,
        timeline_text.join(" → ")
    );
    assert!(peak.0 > 1 && peak.1 > 1, "the lag scaled the workers out: {timeline:?}");

    // 4a. A worker pod killed outright: its leases move within seconds, nothing is lost.
    kubectl(
        &cluster,
        &["apply", "-f", "-"],
        Some(&resource("orders", &endpoint, &handler, "  replicas: 3\n")),
    );
    let three = wait_for(
        "3 Ready workers holding every lease",
        Duration::from_secs(120),
        || async {
            let (ready, held) = ready_holding(&pods, &store, "orders").await;
            (ready.len() == 3 && held == PARTITIONS).then_some(ready)
        },
    )
    .await;
    let victim = three[0].clone();
    let killed = Instant::now();
    kubectl(
        &cluster,
        &["delete", "pod", &victim, "-n", NS, "--grace-period=0", "--force"],
        None,
    );
    let moved = wait_for(
        "the killed pod's leases taken by live pods",
        Duration::from_secs(60),
        || async {
            let owners = owners(&store).await;
            let ready = ready_pods(&pods, "orders").await;
            let held = owners
                .iter()
                .filter(|(o, _)| ready.contains(o) && **o != victim)
                .map(|(_, n)| n)
                .sum::<usize>();
            (held == PARTITIONS).then(|| killed.elapsed())
        },
    )
    .await;
    write(4000..4500).await;
    wait_for(
        "documents written after the kill delivered",
        Duration::from_secs(60),
        || async { (received.lock().unwrap().distinct_with_prefix("doc-") >= 4500).then_some(()) },
    )
    .await;
    println!(
        "4a. pod {victim} force-deleted: its leases owned by live pods after {moved:.1?}; 4500/4500 delivered (0 lost)"
    );

    // 4b. A rolling restart under continuous writes: graceful handoff, no duplicates.
    wait_for("3 Ready workers again", Duration::from_secs(120), || async {
        (ready_pods(&pods, "orders").await.len() == 3).then_some(())
    })
    .await;
    let writing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let writer = tokio::spawn({
        let (items, writing) = (items.clone(), writing.clone());
        async move {
            let mut n = 0usize;
            while writing.load(std::sync::atomic::Ordering::Relaxed) {
                let id = 100_000 + n;
                upsert_doc(&items, id).await;
                n += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            n
        }
    });
    let before: Vec<String> = ready_pods(&pods, "orders").await;
    let restarted = Instant::now();
    kubectl(&cluster, &["rollout", "restart", "deployment/orders", "-n", NS], None);
    kubectl(
        &cluster,
        &["rollout", "status", "deployment/orders", "-n", NS, "--timeout=180s"],
        None,
    );
    wait_for(
        "3 new Ready workers holding every lease",
        Duration::from_secs(120),
        || async {
            let (ready, held) = ready_holding(&pods, &store, "orders").await;
            (ready.len() == 3 && ready.iter().all(|p| !before.contains(p)) && held == PARTITIONS).then_some(())
        },
    )
    .await;
    let rollout = restarted.elapsed();
    writing.store(false, std::sync::atomic::Ordering::Relaxed);
    let written = writer.await.unwrap();
    let expected: Vec<String> = (0..written).map(|n| format!("doc-{}", 100_000 + n)).collect();
    wait_for(
        "every document written during the restart delivered",
        Duration::from_secs(60),
        || async {
            let r = received.lock().unwrap();
            let seen: std::collections::BTreeSet<&String> = r.ids.iter().collect();
            expected.iter().all(|id| seen.contains(id)).then_some(())
        },
    )
    .await;
    let duplicates = {
        let r = received.lock().unwrap();
        let mut counts: BTreeMap<&String, usize> = BTreeMap::new();
        for id in r.ids.iter().filter(|id| expected.contains(id)) {
            *counts.entry(id).or_default() += 1;
        }
        counts.values().filter(|n| **n > 1).count()
    };
    println!(
        "4b. rollout restart of 3 workers in {rollout:.1?} under continuous writes: {written}/{written} delivered, {duplicates} duplicates"
    );
    assert_eq!(duplicates, 0, "a graceful handoff redelivers nothing");

    // 4c. A worker killed in place (`kill -9` of its process, the SIGKILL an OOMKill sends): the
    //     kubelet starts its container again in the same pod. With the default lease expiration
    //     of 60 s the restarted worker takes its leases back at once (its heartbeat names the
    //     pod's UID), so what is written after the restart is delivered within seconds.
    let sixty = resource("orders", &endpoint, &handler, "  replicas: 3\n").replace("expiration: 5s", "expiration: 60s");
    kubectl(&cluster, &["apply", "-f", "-"], Some(&sixty));
    kubectl(
        &cluster,
        &["rollout", "status", "deployment/orders", "-n", NS, "--timeout=180s"],
        None,
    );
    let (victim, restarted, in_place) = kill_a_worker_in_place(&cluster, &pods, &store).await;
    write(5000..5200).await;
    let expected: Vec<String> = (5000..5200).map(|n| format!("doc-{n}")).collect();
    wait_for(
        "what was written after the in-place restart delivered",
        Duration::from_secs(120),
        || async {
            let r = received.lock().unwrap();
            let seen: std::collections::BTreeSet<&String> = r.ids.iter().collect();
            expected.iter().all(|id| seen.contains(id)).then_some(())
        },
    )
    .await;
    let resumed = restarted.elapsed();
    println!(
        "4c. worker of pod {victim} killed in place (expiration 60 s): its container ran again {in_place:.1?} after the kill; 200 documents written then were all delivered {resumed:.1?} after the restart"
    );
    assert!(
        resumed < Duration::from_secs(5),
        "the restarted worker waited {resumed:?}"
    );

    // 5. A worker that exits at every start (its config file does not exist) crash-loops, and
    //    the status says so; a resource whose account nothing answers at starts no worker at all
    //    (the operator cannot read its lease-set claim), and the status says that. Started here
    //    and checked after 4d, which runs meanwhile (the kubelet's back-off takes a while).
    let exits_at_start = resource("broken", &endpoint, &handler, "  replicas: 1\n").replace(
        "env: [{name: COSMOS_DISABLE_IMDS, value: \"true\"}]",
        "env: [{name: COSMOS_DISABLE_IMDS, value: \"true\"}, {name: CFP_CONFIG, value: /nonexistent/cfp.yaml}]",
    );
    let unreachable = resource("unreachable", &unreachable_account(), &handler, "  replicas: 1\n");
    kubectl(
        &cluster,
        &["apply", "-f", "-"],
        Some(&format!("{exits_at_start}\n---\n{unreachable}")),
    );
    let crash_loop = tokio::spawn({
        let (cfps, started) = (cfps.clone(), Instant::now());
        async move {
            let ready_false = |name: &'static str, reason: &'static str| {
                let cfps = cfps.clone();
                async move {
                    wait_for(
                        &format!("{name}: Ready=False {reason}"),
                        Duration::from_secs(300),
                        || async {
                            let status = status(&cfps, name).await?;
                            let ready = status.conditions.iter().find(|c| c.type_ == "Ready")?.clone();
                            (ready.status == "False" && ready.reason == reason).then_some(ready)
                        },
                    )
                    .await
                }
            };
            let unknown = ready_false("unreachable", "LeaseSetUnknown").await;
            let crash = ready_false("broken", "CrashLoopBackOff").await;
            (crash, unknown, started.elapsed())
        }
    });

    // 4d. A rolling restart of workers whose handler is a sidecar in the pod, under continuous
    //     writes: the handler is a naive service (records each batch at once, answers 1.5 s later,
    //     exits at once on SIGTERM), so batches are in flight whenever a pod stops. As a native
    //     sidecar it stops only after the worker has finished its batches: nothing is delivered
    //     twice (an ordinary container gets SIGTERM with the worker, and its batches in flight
    //     are delivered again).
    let step = Instant::now();
    let records = cluster.dir.join("handler-records");
    std::fs::create_dir_all(&records).expect("records directory");
    std::os::unix::fs::chown(&records, Some(65532), Some(65532)).expect("records directory owned by the pods' uid");
    kubectl(
        &cluster,
        &["apply", "-f", "-"],
        Some(&relay_resource(&endpoint, &records)),
    );
    let relay_store = wait_for("the relay's lease store", Duration::from_secs(60), || {
        common::lease_store_of(&account, RELAY, RELAY)
    })
    .await;
    let first = wait_for(
        "2 Ready relay workers holding every lease",
        Duration::from_secs(120),
        || async {
            let (ready, held) = ready_holding(&pods, &relay_store, RELAY).await;
            (ready.len() == 2 && held == RELAY_PARTITIONS).then_some(ready)
        },
    )
    .await;
    let relay_items = account.documents("db", RELAY).await.expect("relay container");
    let writing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let writer = tokio::spawn({
        let (items, writing) = (relay_items.clone(), writing.clone());
        async move {
            let mut n = 0usize;
            while writing.load(std::sync::atomic::Ordering::Relaxed) {
                upsert_doc(&items, 300_000 + n).await;
                n += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            n
        }
    });
    wait_for(
        "the sidecars handling batches before the restart",
        Duration::from_secs(60),
        || async { (Recorded::read(&records).posts.len() >= 2 * RELAY_PARTITIONS).then_some(()) },
    )
    .await;
    // When each old pod is told to stop: first seen with a deletion timestamp (polled; the
    // kubelet signals its containers right after).
    let stopping = tokio::spawn({
        let (pods, first) = (pods.clone(), first.clone());
        async move {
            let mut stops: BTreeMap<String, std::time::SystemTime> = BTreeMap::new();
            while stops.len() < first.len() {
                let listed = pods
                    .list(&ListParams::default().labels(&format!("changefeed.io/processor={RELAY}")))
                    .await;
                let now = std::time::SystemTime::now();
                if let Ok(listed) = listed {
                    for pod in &first {
                        // Gone between two polls: told to stop by then at the latest.
                        let stopped = listed
                            .items
                            .iter()
                            .find(|p| p.metadata.name.as_ref() == Some(pod))
                            .is_none_or(|p| p.metadata.deletion_timestamp.is_some());
                        if stopped {
                            stops.entry(pod.clone()).or_insert(now);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            stops
        }
    });
    let restarted = Instant::now();
    kubectl(
        &cluster,
        &["rollout", "restart", &format!("deployment/{RELAY}"), "-n", NS],
        None,
    );
    kubectl(
        &cluster,
        &[
            "rollout",
            "status",
            &format!("deployment/{RELAY}"),
            "-n",
            NS,
            "--timeout=180s",
        ],
        None,
    );
    wait_for(
        "2 new Ready relay workers holding every lease",
        Duration::from_secs(120),
        || async {
            let (ready, held) = ready_holding(&pods, &relay_store, RELAY).await;
            (ready.len() == 2 && ready.iter().all(|p| !first.contains(p)) && held == RELAY_PARTITIONS).then_some(())
        },
    )
    .await;
    let rollout = restarted.elapsed();
    writing.store(false, std::sync::atomic::Ordering::Relaxed);
    let written = writer.await.unwrap();
    let stops = stopping.await.unwrap();
    let expected: std::collections::BTreeSet<String> = (0..written).map(|n| format!("doc-{}", 300_000 + n)).collect();
    wait_for(
        "every document written during the sidecar restart delivered",
        Duration::from_secs(90),
        || async {
            let (delivered, _) = Recorded::read(&records).delivered_and_duplicated(&expected);
            (delivered == expected.len()).then_some(())
        },
    )
    .await;
    let recorded = Recorded::read(&records);
    let (delivered, duplicates) = recorded.delivered_and_duplicated(&expected);
    let (in_flight, answered) = stops
        .iter()
        .map(|(pod, stop)| recorded.in_flight_at(pod, *stop))
        .fold((0, 0), |sum, (n, a)| (sum.0 + n, sum.1 + a));
    let mut batches: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for post in &recorded.posts {
        *batches.entry((&post.lease, &post.batch)).or_default() += 1;
    }
    let batches_again = batches.values().filter(|n| **n > 1).count();
    let sidecar_kind = match kubectl(
        &cluster,
        &[
            "get",
            "deployment",
            RELAY,
            "-n",
            NS,
            "-o",
            "jsonpath={.spec.template.spec.initContainers[*].name}",
        ],
        None,
    )
    .as_str()
    {
        "handler" => "a native sidecar",
        _ => "an ordinary container",
    };
    println!(
        "4d. rollout restart of 2 workers with the handler as {sidecar_kind} (answers 1.5 s after recording) in {rollout:.1?} under continuous writes: {delivered}/{written} delivered in {} POSTs; {in_flight} batches were with the handler when their pod was told to stop, {answered} of them answered; {duplicates} documents delivered twice, {batches_again} batches recorded more than once (step {:.1?}){}",
        recorded.posts.len(),
        step.elapsed(),
        recorded
            .redeliveries(&expected)
            .iter()
            .map(|line| format!("\n    {line}"))
            .collect::<String>()
    );
    assert_eq!(delivered, written, "every document reached the sidecar");
    assert!(
        in_flight > 0,
        "batches were with the handler when the old pods stopped (else this step proves nothing)"
    );
    assert_eq!(
        duplicates, 0,
        "the sidecar stopped only after the worker's in-flight batches were answered"
    );

    // 5. (its check; started before 4d)
    let (ready, unknown, crash_loop_after) = crash_loop
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    let unreachable_workers = deployments
        .get_opt("unreachable")
        .await
        .ok()
        .flatten()
        .and_then(|d| d.spec?.replicas);
    println!(
        "5. a worker that exits at start → after {crash_loop_after:.1?}: Ready=False/{}: {}; an account nothing answers at → Ready=False/{}: {}, workers {unreachable_workers:?}",
        ready.reason, ready.message, unknown.reason, unknown.message
    );
    assert_eq!(
        unreachable_workers,
        Some(0),
        "no worker starts while the claim cannot be read"
    );

    terminate(&mut emulator).await;
    cluster.stop();
}
