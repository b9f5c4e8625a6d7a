//! Autoscaling from the operator's remaining-work estimate, and fast failover from the worker pod
//! watch, against a real kube-apiserver + etcd, `cfp operator`, `cfp emulator` and `kubectl`. No
//! kubelet runs: where workers must process, the Deployment's pod template runs as local
//! `cfp worker` processes, and Pod objects stand for their pods.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use changefeed_operator::cosmos::{AccountAuth, CosmosAccount, continuation_lsn};
use changefeed_operator::operator::ChangeFeedProcessor;
use changefeed_operator::operator::crd::ChangeFeedProcessorStatus;
use changefeed_operator::processor::LeaseStore;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use tokio::process::Child;

use crate::common::{self, CFP, cfp_write, lease_store, start_emulator_on, terminate};
use crate::control_plane::ControlPlane;
use crate::operator_support::{
    self, LocalWorker, Operator, apply, free_port, metrics_body, namespace, plane, replicas, resource, secret_yaml,
    wait, wait_up_to,
};

/// Lease timings for local workers: fast balancing, quick expiry.
const FAST_WORKERS: &str = "  pollInterval: 100ms\n  leaseTimings:\n    acquireInterval: 500ms\n    renewInterval: 500ms\n    expiration: 3s\n";

fn autoscaling(min: i32, max: i32, target: u64, window: &str, interval: &str) -> String {
    format!(
        "  autoscaling:\n    enabled: true\n    minReplicas: {min}\n    maxReplicas: {max}\n    targetLagPerReplica: {target}\n    scaleDownStabilization: {window}\n    estimateInterval: {interval}\n"
    )
}

/// A namespace with `cfp emulator` (db/items over `partitions` partitions and `backlog` documents
/// written), `cfp operator`, the Secret, and resource `orders` with `extra` spec lines.
struct Setup {
    plane: &'static ControlPlane,
    ns: String,
    client: kube::Client,
    operator: Operator,
    emulator: Child,
    endpoint: String,
    cfps: Api<ChangeFeedProcessor>,
    deployments: Api<Deployment>,
}

async fn setup(name: &str, port: u16, partitions: u32, backlog: u64, extra: &str) -> Setup {
    let plane = plane().await;
    let ns = namespace(plane, name);
    let client = plane.client().await;
    let (emulator, endpoint) = start_emulator_on(port, &format!("db/items:/pk:{partitions}")).await;
    if backlog > 0 {
        cfp_write(&endpoint, 0, backlog).await;
    }
    let operator = Operator::start(plane, &ns, "op");
    assert!(apply(plane, &ns, &secret_yaml()).0);
    let (ok, _, err) = apply(plane, &ns, &resource("orders", &endpoint, extra));
    assert!(ok, "{err}");
    Setup {
        plane,
        cfps: Api::namespaced(client.clone(), &ns),
        deployments: Api::namespaced(client.clone(), &ns),
        ns,
        client,
        operator,
        emulator,
        endpoint,
    }
}

impl Setup {
    async fn status(&self) -> Option<ChangeFeedProcessorStatus> {
        self.cfps.get("orders").await.ok()?.status
    }

    async fn replicas(&self) -> Option<i32> {
        replicas(&self.deployments.get_opt("orders").await.ok()??)
    }

    async fn wait_replicas(&self, want: i32, timeout: Duration) -> Instant {
        wait_up_to(&format!("{want} replicas"), timeout, || async {
            (self.replicas().await == Some(want)).then(Instant::now)
        })
        .await
    }

    async fn scaling(&self) -> Option<Condition> {
        scaling(&self.status().await?)
    }

    /// The value of a processor series of the operator's /metrics for this resource.
    async fn operator_metric(&self, metric: &str) -> Option<f64> {
        let body = metrics_body(self.operator.metrics).await?;
        processor_series(&body, metric, &self.ns, "orders")
    }

    /// The Events of the resource with `reason`.
    async fn events(&self, reason: &str) -> Vec<k8s_openapi::api::events::v1::Event> {
        let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(self.client.clone(), &self.ns);
        events
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("orders")
            })
            .collect()
    }

    async fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn stop(mut self) {
        terminate(&mut self.operator.child).await;
        terminate(&mut self.emulator).await;
    }
}

fn scaling(status: &ChangeFeedProcessorStatus) -> Option<Condition> {
    status.conditions.iter().find(|c| c.type_ == "Scaling").cloned()
}

/// The sum over the series of `metric` for processor `ns`/`name` (one series, or one per reason).
fn processor_series(body: &str, metric: &str, ns: &str, name: &str) -> Option<f64> {
    let (ns, name) = (format!("namespace=\"{ns}\""), format!("name=\"{name}\""));
    let values: Vec<f64> = body
        .lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")) && l.contains(&ns) && l.contains(&name))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// `cfp estimate -o json` of processor `orders`.
async fn cfp_estimate(endpoint: &str) -> serde_json::Value {
    let output = tokio::process::Command::new(CFP)
        .args([
            "estimate",
            "--endpoint",
            endpoint,
            "--database",
            "db",
            "--container",
            "items",
        ])
        .args(["--processor", "orders", "-o", "json"])
        .output()
        .await
        .expect("run cfp estimate");
    assert!(
        output.status.success(),
        "cfp estimate: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("cfp estimate JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_processor_over_a_backlog_starts_all_the_workers_it_needs_at_once() {
    let setup = setup("backlog", 0, 8, 3000, &autoscaling(1, 10, 500, "300s", "1s")).await;
    setup.wait_replicas(6, Duration::from_secs(30)).await;
    let status = wait("the estimate in the status", || async {
        setup
            .status()
            .await
            .filter(|s| s.estimated_lag.is_some() && s.desired_replicas == Some(6))
    })
    .await;
    let cli = cfp_estimate(&setup.endpoint).await;
    assert_eq!(status.estimated_lag, cli["totalLag"].as_i64());
    assert_eq!(status.estimated_lag, Some(3000));
    assert_eq!(status.leases, Some(8));
    assert_eq!(status.leases, cli["leaseCount"].as_i64().map(|n| n as i32));
    assert_eq!(status.leases_with_lag, Some(8));
    assert!(status.last_estimate_time.is_some() && status.last_scale_time.is_some());
    let condition = scaling(&status).expect("Scaling condition");
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("True", "ScalingActive")
    );

    let (ok, table, _) = setup.plane.kubectl_run(&["get", "cfp", "-n", &setup.ns], None);
    assert!(ok);
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "REPLICAS", "READY", "LEASES", "LAG", "STATUS", "AGE"]);
    let row: Vec<&str> = table.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    assert_eq!(&row[..5], ["orders", "6", "0", "8", "3000"], "{table}");

    let scaled = wait("a ScaledUp Event", || async { setup.events("ScaledUp").await.pop() }).await;
    let note = scaled.note.unwrap_or_default();
    assert_eq!(note, "0 → 6: estimated lag 3000 > 500 per replica");
    let lag = wait("operator metrics", || async {
        setup.operator_metric("cfp_processor_estimated_lag").await
    })
    .await;
    let desired = setup.operator_metric("cfp_processor_desired_replicas").await;
    let leases = setup.operator_metric("cfp_processor_leases").await;
    assert_eq!((lag, desired, leases), (3000.0, Some(6.0), Some(8.0)));
    println!(
        "backlog 3000 on 8 partitions, target 500: replicas 6, status lag {:?} = cfp estimate totalLag {}, leases 8, Event ScaledUp {note:?}, /metrics lag {lag} desired {desired:?}\n{table}",
        status.estimated_lag, cli["totalLag"]
    );
    setup
        .cfps
        .delete("orders", &DeleteParams::default())
        .await
        .expect("delete the resource");
    wait("the deleted resource's series gone", || async {
        let body = metrics_body(setup.operator.metrics).await?;
        (!body.contains("cfp_processor_estimated_lag{")).then_some(())
    })
    .await;
    setup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_are_capped_at_the_lease_count() {
    let setup = setup("cap", 0, 8, 10_000, &autoscaling(1, 50, 1, "300s", "1s")).await;
    setup.wait_replicas(8, Duration::from_secs(30)).await;
    let condition = wait("Scaling=False/ScalingLimited", || async {
        setup.scaling().await.filter(|c| c.reason == "ScalingLimited")
    })
    .await;
    assert_eq!(condition.status, "False");
    assert!(condition.message.contains("lease count (8"), "{}", condition.message);
    let status = setup.status().await.expect("status");
    println!(
        "target 1, backlog {:?}, max 50: replicas {:?}; Scaling=False/ScalingLimited: {}",
        status.estimated_lag,
        setup.replicas().await,
        condition.message
    );
    assert_eq!(status.estimated_lag, Some(10_000));
    setup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drained_workers_scale_down_only_after_the_stabilization_window() {
    const WINDOW: Duration = Duration::from_secs(6);
    let extra = format!("{}{FAST_WORKERS}", autoscaling(1, 10, 500, "6s", "1s"));
    let setup = setup("drain", 0, 4, 2000, &extra).await;
    setup.wait_replicas(4, Duration::from_secs(30)).await;
    let deployment = setup.deployments.get("orders").await.expect("deployment");
    let secrets = setup.secrets().await;
    let mut workers = Vec::new();
    for pod in ["orders-5c7d9-drain1", "orders-5c7d9-drain2"] {
        workers.push(LocalWorker::start(&deployment, &secrets, pod, &[]).await);
    }
    // (seconds, lag, replicas) at every change, until the minimum is reached.
    let started = Instant::now();
    let mut timeline: Timeline = Vec::new();
    let deadline = started + Duration::from_secs(60);
    while Instant::now() < deadline {
        let lag = setup.status().await.and_then(|s| s.estimated_lag);
        let replicas = setup.replicas().await;
        if timeline.last().is_none_or(|(_, l, r)| (*l, *r) != (lag, replicas)) {
            timeline.push((started.elapsed().as_secs_f64(), lag, replicas));
        }
        if replicas == Some(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let delivered: HashSet<String> = workers.iter().flat_map(LocalWorker::ids).collect();
    println!(
        "drain with 2 local workers, window 6 s, interval 1 s: (s, lag, replicas) {timeline:?}; {} of 2000 delivered",
        delivered.len()
    );
    for worker in &mut workers {
        terminate(&mut worker.child).await;
    }
    assert!(timeline.iter().any(|(_, lag, _)| *lag == Some(0)), "lag reached 0");
    assert_eq!(setup.replicas().await, Some(1), "down to minReplicas");
    let downs = scale_downs_after_asked_more(&timeline, 500, 4);
    assert!(!downs.is_empty(), "replicas went down: {timeline:?}");
    for (to, after) in downs {
        // The status is polled every 200 ms and written once per 1 s estimate.
        assert!(
            after >= WINDOW.as_secs_f64() - 2.0,
            "scaled down to {to} {after:.1} s after an estimate last asked for more (window {WINDOW:?}): {timeline:?}"
        );
    }
    assert_eq!(delivered.len(), 2000);
    let events = setup.events("ScaledDown").await;
    assert!(!events.is_empty(), "a ScaledDown Event");
    setup.stop().await;
}

/// What a test saw, at every change: (seconds since the start, estimated lag, replicas).
type Timeline = Vec<(f64, Option<i64>, Option<i32>)>;

/// For every scale-down in `timeline`: the replicas it went to and how long before it the
/// status last showed a lag asking for more (`ceil(lag / target)` capped at `leases`), counted
/// from when that lag was replaced.
fn scale_downs_after_asked_more(timeline: &Timeline, target: i64, leases: i64) -> Vec<(i32, f64)> {
    let asks = |lag: i64| (lag + target - 1).div_euclid(target).clamp(1, leases);
    let mut downs = Vec::new();
    for (i, pair) in timeline.windows(2).enumerate() {
        let (Some(before), (at, _, Some(to))) = (pair[0].2, pair[1]) else {
            continue;
        };
        if to >= before {
            continue;
        }
        // The entry after the last one asking for more than `to` is when that ask was last seen.
        let last_ask = timeline[..=i + 1]
            .iter()
            .rposition(|(_, lag, _)| lag.is_some_and(|lag| asks(lag) > i64::from(to)));
        let since = match last_ask {
            None => 0.0,
            Some(k) if k > i => at,
            Some(k) => timeline[k + 1].0,
        };
        downs.push((to, at - since));
    }
    downs
}

#[test]
fn a_scale_down_is_timed_from_the_last_estimate_asking_for_more() {
    let timeline: Timeline = vec![
        (0.0, Some(2000), Some(4)),
        (1.1, Some(800), Some(4)),
        (2.0, Some(0), Some(4)),
        (6.2, Some(0), Some(2)),
        (7.0, Some(0), Some(1)),
    ];
    let downs = scale_downs_after_asked_more(&timeline, 500, 4);
    let rounded: Vec<(i32, i64)> = downs.iter().map(|(to, s)| (*to, (s * 10.0).round() as i64)).collect();
    // To 2: 2000 (asking 4) was replaced at 1.1 s; to 1: 800 (asking 2) was replaced at 2.0 s.
    assert_eq!(rounded, [(2, 51), (1, 50)]);
    let early: Timeline = vec![(0.0, Some(2000), Some(4)), (0.5, Some(1500), Some(3))];
    assert_eq!(scale_downs_after_asked_more(&early, 500, 4), [(3, 0.0)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scales_to_zero_when_idle_and_wakes_on_new_changes() {
    let extra = format!("{}{FAST_WORKERS}", autoscaling(0, 4, 100, "3s", "1s"));
    let setup = setup("zero", 0, 4, 200, &extra).await;
    setup.wait_replicas(2, Duration::from_secs(30)).await;
    let deployment = setup.deployments.get("orders").await.expect("deployment");
    let mut worker = LocalWorker::start(&deployment, &setup.secrets().await, "orders-5c7d9-zero1", &[]).await;
    let started = Instant::now();
    let zero_after = setup.wait_replicas(0, Duration::from_secs(40)).await - started;
    // At 0 replicas a kubelet stops the pod.
    terminate(&mut worker.child).await;
    // The status is written right after the Deployment, in the same reconciliation.
    wait("Ready=True/ScaledToZero", || async {
        let status = setup.status().await?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Ready" && c.reason == "ScaledToZero" && c.status == "True")
    })
    .await;
    assert_eq!(worker.ids().len(), 200);
    cfp_write(&setup.endpoint, 1000, 100).await;
    let written = Instant::now();
    let woke = wait("a replica after new writes", || async {
        setup
            .replicas()
            .await
            .filter(|r| *r >= 1)
            .map(|r| (r, written.elapsed()))
    })
    .await;
    println!(
        "scale to zero: 0 replicas {:.1?} after the worker started (window 3 s); 100 new documents → {} replica(s) {:.2?} after the write (estimate interval 1 s)",
        zero_after, woke.0, woke.1
    );
    assert!(
        woke.1 <= Duration::from_secs(3),
        "woke after {:?}: more than two estimate intervals",
        woke.1
    );
    setup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_estimate_never_scales_down_and_recovers_by_itself() {
    let port = free_port();
    let setup = setup("failing", port, 4, 3000, &autoscaling(1, 10, 1000, "300s", "1s")).await;
    setup.wait_replicas(3, Duration::from_secs(30)).await;
    let mut setup = setup;
    setup.emulator.start_kill().expect("kill the emulator");
    let _ = setup.emulator.wait().await;
    let failed = wait("Scaling=False/EstimateFailed", || async {
        setup.scaling().await.filter(|c| c.reason == "EstimateFailed")
    })
    .await;
    assert_eq!(failed.status, "False");
    // Several intervals without an estimate: the replicas stay.
    let mut seen = BTreeMap::new();
    for _ in 0..25 {
        *seen.entry(setup.replicas().await).or_insert(0) += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(seen.keys().collect::<Vec<_>>(), [&Some(3)], "replicas held: {seen:?}");
    let warning = wait("a Warning EstimateFailed Event", || async {
        setup.events("EstimateFailed").await.pop()
    })
    .await;
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    let errors = setup.operator_metric("cfp_processor_estimate_errors_total").await;
    let failed_at = k8s_openapi::jiff::Timestamp::now();
    // The account comes back (empty: the in-memory emulator keeps nothing across restarts).
    let (emulator, _) = start_emulator_on(port, "db/items:/pk:4").await;
    setup.emulator = emulator;
    let resumed = wait_up_to("estimates resume", Duration::from_secs(30), || async {
        let status = setup.status().await?;
        let fresh = status.last_estimate_time.as_ref().is_some_and(|t| t.0 > failed_at);
        let condition = scaling(&status)?;
        (fresh && condition.reason == "ScalingActive").then_some((status, condition))
    })
    .await;
    println!(
        "estimator failure: Scaling=False/EstimateFailed ({}), replicas {seen:?} while failing, Warning Event {:?}; after the account came back: Scaling {} lag {:?}, replicas {:?}",
        failed.message,
        warning.note,
        resumed.1.reason,
        resumed.0.estimated_lag,
        setup.replicas().await
    );
    assert!(errors.is_some_and(|e| e >= 1.0), "estimate errors counted: {errors:?}");
    assert_eq!(setup.replicas().await, Some(3), "still held within the window");
    setup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_worker_pod_frees_its_leases_at_once() {
    let extra = "  replicas: 3\n  pollInterval: 100ms\n  leaseTimings:\n    acquireInterval: 1s\n    renewInterval: 2s\n    expiration: 60s\n";
    let setup = setup("failover", 0, 8, 0, extra).await;
    let deployment = wait("deployment", || async {
        setup.deployments.get_opt("orders").await.ok().flatten()
    })
    .await;
    let labels = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .expect("pod template labels");
    let pods: Api<Pod> = Api::namespaced(setup.client.clone(), &setup.ns);
    let names = ["orders-6b8f4-a1", "orders-6b8f4-b2", "orders-6b8f4-c3"];
    let secrets = setup.secrets().await;
    let mut workers = Vec::new();
    for name in names {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(labels.clone()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "worker".into(),
                    image: Some("cfp:test".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        pods.create(&PostParams::default(), &pod).await.expect("create pod");
        workers.push(LocalWorker::start(&deployment, &secrets, name, &[]).await);
    }
    let account = CosmosAccount::connect(&setup.endpoint, &AccountAuth::emulator_key())
        .await
        .expect("account");
    let store = wait("the lease store", || async { lease_store(&account, "orders").await }).await;
    let owners = || async {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for lease in store.snapshot().await.ok()?.leases {
            *counts.entry(lease.owner.unwrap_or_default()).or_default() += 1;
        }
        Some(counts)
    };
    // Told apart from balancing: a bootstrap lock left behind holds every worker in its
    // bootstrap until the lock looks abandoned (a lease expiration).
    wait(
        "the leases are bootstrapped (no bootstrap lock left behind)",
        || async { store.snapshot().await.ok().filter(|s| s.initialized).map(|_| ()) },
    )
    .await;
    cfp_write(&setup.endpoint, 0, 1000).await;
    // Balanced, and each worker processes what the store says it owns (a handed-over lease is
    // the new owner's in the store a moment before that worker takes it up).
    let balanced = wait("3 workers share the 8 leases and process them", || async {
        let counts = owners()
            .await
            .filter(|c| c.len() == 3 && !c.contains_key("") && c.values().all(|n| (2..=3).contains(n)))?;
        for worker in &workers {
            let owned = worker.metric("cfp_leases_owned").await? as usize;
            if counts.get(&worker.pod) != Some(&owned) {
                return None;
            }
        }
        Some(counts)
    })
    .await;
    let victim = &workers[0];
    let held = balanced[&victim.pod];
    victim.signal("-STOP").await;
    pods.delete(&victim.pod, &DeleteParams::default())
        .await
        .expect("delete pod");
    let deleted = Instant::now();
    let taken = wait_up_to("the survivors own every lease", Duration::from_secs(20), || async {
        owners().await.filter(|c| {
            c.keys().all(|o| o == &workers[1].pod || o == &workers[2].pod) && c.values().sum::<usize>() == 8
        })
    })
    .await;
    let failover = deleted.elapsed();
    cfp_write(&setup.endpoint, 1000, 1000).await;
    wait_up_to(
        "survivors deliver the new documents",
        Duration::from_secs(30),
        || async {
            let ids: HashSet<String> = workers[1..].iter().flat_map(LocalWorker::ids).collect();
            (1000..2000).all(|n| ids.contains(&format!("doc-{n}"))).then_some(())
        },
    )
    .await;
    let checkpoints = |leases: Vec<changefeed_operator::processor::Lease>| {
        leases
            .into_iter()
            .map(|l| (l.id, l.continuation.as_deref().and_then(continuation_lsn)))
            .collect::<BTreeMap<_, _>>()
    };
    let before = checkpoints(store.snapshot().await.expect("snapshot").leases);
    victim.signal("-CONT").await;
    let lost_metric = "cfp_leases_closed_total{processor=\"orders\",reason=\"lease_lost\"}";
    let closed = wait_up_to(
        "the resumed worker stops its lost leases",
        Duration::from_secs(20),
        || async { victim.metric(lost_metric).await.filter(|n| *n as usize >= held) },
    )
    .await;
    // A few acquire cycles later no checkpoint went backwards.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = checkpoints(store.snapshot().await.expect("snapshot").leases);
    for (id, lsn) in &before {
        assert!(
            after.get(id).copied().flatten() >= *lsn,
            "checkpoint of {id} went back: {lsn:?} → {:?}",
            after.get(id)
        );
    }
    let delivered: HashSet<String> = workers.iter().flat_map(LocalWorker::ids).collect();
    let lost = (0..2000).filter(|n| !delivered.contains(&format!("doc-{n}"))).count();
    let freed_event = wait("a LeasesFreed Event", || async {
        setup.events("LeasesFreed").await.pop()
    })
    .await;
    let freed_metric = setup.operator_metric("cfp_processor_leases_freed_total").await;
    println!(
        "fast failover: pod {} (frozen, {held} leases) deleted → the survivors owned all 8 leases {failover:.2?} later (lease expiration 60 s): {taken:?}; after SIGCONT it closed {closed} lost leases and no checkpoint went back; written 2000, delivered {} distinct, lost {lost}; Event {:?}; cfp_processor_leases_freed_total {freed_metric:?}",
        victim.pod,
        delivered.len(),
        freed_event.note
    );
    assert!(failover < Duration::from_secs(5), "failover took {failover:?}");
    assert_eq!(lost, 0);
    assert_eq!(freed_metric, Some(held as f64));

    // A worker container that ended (kill -9) and waits to be started again: its pod stays,
    // only its container status says so (as the kubelet reports it during its back-off).
    let down = &workers[1];
    down.signal("-KILL").await;
    let ended = Instant::now();
    // When the kubelet saw it end, in the whole seconds a Time carries (after the kill).
    let finished = k8s_openapi::jiff::Timestamp::from_second(k8s_openapi::jiff::Timestamp::now().as_second() + 1)
        .expect("a time")
        .to_string();
    let container_status = serde_json::json!({"status": {"phase": "Running", "containerStatuses": [{
        "name": "worker", "image": "cfp:test", "imageID": "", "ready": false, "restartCount": 1,
        "lastState": {"terminated": {"exitCode": 137, "reason": "Error", "finishedAt": finished}},
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
    }]}});
    pods.patch_status(&down.pod, &PatchParams::default(), &Patch::Merge(&container_status))
        .await
        .expect("patch the pod's status");
    // The live workers (the resumed one of the deleted pod runs on) own every lease.
    let survived = wait_up_to("the live workers own every lease", Duration::from_secs(20), || async {
        owners()
            .await
            .filter(|c| c.keys().all(|o| o != &down.pod && !o.is_empty()) && c.values().sum::<usize>() == 8)
    })
    .await;
    let restart_failover = ended.elapsed();
    println!(
        "worker container ended in pod {} (restartCount 1, waiting): the live workers owned all 8 leases {restart_failover:.2?} later (lease expiration 60 s): {survived:?}",
        down.pod
    );
    assert!(restart_failover < Duration::from_secs(5), "took {restart_failover:?}");
    for worker in &mut workers {
        terminate(&mut worker.child).await;
    }
    setup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_autoscaler_on_the_scale_subresource_wins() {
    // Half-partition leases: what KEDA's scaler cannot read (tests/keda.rs shows it with its code).
    let spec = format!(
        "{}  leases:\n    perPartition: 2\n",
        autoscaling(1, 10, 500, "300s", "1s")
    );
    let setup = setup("external", 0, 8, 3000, &spec).await;
    setup.wait_replicas(6, Duration::from_secs(30)).await;
    // Labelled as KEDA labels the HPA it makes for a ScaledObject.
    let hpa = "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata:\n  name: orders-keda\n  labels:\n    scaledobject.keda.sh/name: orders\nspec:\n  scaleTargetRef:\n    apiVersion: changefeed.io/v1alpha1\n    kind: ChangeFeedProcessor\n    name: orders\n  minReplicas: 1\n  maxReplicas: 4\n  metrics:\n  - type: External\n    external:\n      metric:\n        name: cfp_processor_estimated_lag\n      target:\n        type: AverageValue\n        averageValue: \"1000\"\n";
    let (ok, _, err) = apply(setup.plane, &setup.ns, hpa);
    assert!(ok, "{err}");
    // Until the HPA has decided, spec.replicas (1, never set) is stale: the 6 workers keep running.
    let undecided = wait("Scaling=False/ExternalAutoscaler, not decided yet", || async {
        setup
            .scaling()
            .await
            .filter(|c| c.reason == "ExternalAutoscaler" && c.message.contains("has not decided yet"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(setup.replicas().await, Some(6), "dropped to the stale spec.replicas");
    // What the HPA controller does: record its decision in its status, and scale through /scale.
    let (ok, _, err) = setup.plane.kubectl_run(
        &[
            "patch",
            "hpa",
            "orders-keda",
            "-n",
            &setup.ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"observedGeneration":1,"currentReplicas":6,"desiredReplicas":2,"lastScaleTime":"2026-01-01T00:00:00Z"}}"#,
        ],
        None,
    );
    assert!(ok, "{err}");
    let (ok, _, err) = setup
        .plane
        .kubectl_run(&["scale", "cfp/orders", "-n", &setup.ns, "--replicas=2"], None);
    assert!(ok, "{err}");
    setup.wait_replicas(2, Duration::from_secs(30)).await;
    let condition = wait("Scaling=False/ExternalAutoscaler", || async {
        setup.scaling().await.filter(|c| c.reason == "ExternalAutoscaler")
    })
    .await;
    assert!(condition.message.contains("orders-keda"), "{}", condition.message);
    let keda = wait("KedaReadsLeases=False/LeasesNotPartitions", || async {
        let status = setup.status().await?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "KedaReadsLeases" && c.status == "False" && c.reason == "LeasesNotPartitions")
    })
    .await;
    assert!(keda.message.contains("16 of the leases"), "{}", keda.message);
    let warned = wait("a LeasesNotPartitions Event", || async {
        setup.events("LeasesNotPartitions").await.pop()
    })
    .await;
    // Several estimates later the operator has not fought the HPA.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(setup.replicas().await, Some(2));
    let (ok, _, err) = setup
        .plane
        .kubectl_run(&["delete", "hpa", "orders-keda", "-n", &setup.ns], None);
    assert!(ok, "{err}");
    setup.wait_replicas(6, Duration::from_secs(30)).await;
    let gone = wait("no KedaReadsLeases condition without the HPA", || async {
        let status = setup.status().await?;
        (!status.conditions.iter().any(|c| c.type_ == "KedaReadsLeases")).then_some(())
    })
    .await;
    println!(
        "external autoscaler: a new HPA that has not decided keeps the 6 running ({}); once it decided the Deployment follows /scale (2), Scaling=False/ExternalAutoscaler: {}; KedaReadsLeases=False: {}; Event: {:?}; without it the built-in autoscaler returns to 6 and the KEDA condition is gone ({gone:?})",
        undecided.message, condition.message, keda.message, warned.note
    );
    setup.stop().await;
}

/// The `Ready` condition of `orders`, when its reason is `reason`.
async fn ready_with(setup: &Setup, reason: &str) -> Option<Condition> {
    let status = setup.status().await?;
    status
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready" && c.reason == reason)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_to_zero_cannot_get_stuck_and_the_pause_annotations_hold_the_workload() {
    let extra = format!(
        "{}    activationLag: 20\n    fallbackReplicas: 1\n    fallbackAfterFailures: 2\n",
        autoscaling(0, 4, 10, "2s", "1s")
    );
    let setup = setup("zero-stuck", 0, 2, 0, &extra).await;
    setup.wait_replicas(0, Duration::from_secs(30)).await;
    wait("Ready=True/ScaledToZero", || ready_with(&setup, "ScaledToZero")).await;
    let healthz = common::http_get(setup.operator.metrics, "/healthz").await.0;
    assert_eq!(healthz, 200, "the operator's controller loop is alive");

    // Estimates fail at zero: Ready says so at once, and after 2 failures the fallback runs.
    common::emulator_control(&setup.endpoint, reqwest::Method::POST, "outage?ms=600000").await;
    let stuck = wait("Ready=False/EstimateFailed", || ready_with(&setup, "EstimateFailed")).await;
    setup.wait_replicas(1, Duration::from_secs(60)).await;
    // The Deployment is applied before the status: wait for the condition of that decision.
    let fallback = wait("Scaling names the fallback", || async {
        let message = setup.scaling().await?.message;
        message.contains("fallback of 1 replica").then_some(message)
    })
    .await;
    common::emulator_control(&setup.endpoint, reqwest::Method::DELETE, "faults").await;
    setup.wait_replicas(0, Duration::from_secs(60)).await;
    wait("Ready=True/ScaledToZero again", || ready_with(&setup, "ScaledToZero")).await;
    let ready_events = setup.events("EstimateFailed").await.len();

    // A lag at the activation threshold wakes nobody; above it the workers start.
    cfp_write(&setup.endpoint, 0, 15).await;
    wait("the activation threshold in the Scaling message", || async {
        setup
            .scaling()
            .await
            .filter(|c| c.message.contains("activationLag (20)"))
    })
    .await;
    assert_eq!(
        setup.replicas().await,
        Some(0),
        "15 changes are below the activation lag"
    );
    cfp_write(&setup.endpoint, 100, 10).await;
    setup.wait_replicas(2, Duration::from_secs(30)).await;

    // Paused at 0 replicas: held there although the lag asks for 2 (3 capped at the 2 leases).
    let annotate = |value: &str| {
        let (ok, _, err) = setup.plane.kubectl_run(
            &["annotate", "--overwrite", "cfp", "orders", "-n", &setup.ns, value],
            None,
        );
        assert!(ok, "{value}: {err}");
    };
    annotate("changefeed.io/paused-replicas=0");
    setup.wait_replicas(0, Duration::from_secs(30)).await;
    let paused = wait("Scaling=False/Paused", || async {
        setup.scaling().await.filter(|c| c.reason == "Paused")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(setup.replicas().await, Some(0), "held while paused");
    annotate("changefeed.io/paused-replicas-");
    setup.wait_replicas(2, Duration::from_secs(30)).await;

    // Paused as it is: a spec change is not applied until the annotation goes.
    annotate("changefeed.io/paused=true");
    wait("Scaling=False/Paused again", || async {
        setup.scaling().await.filter(|c| c.reason == "Paused")
    })
    .await;
    let changed = resource("orders", &setup.endpoint, &format!("{extra}  pollInterval: 1500ms\n"));
    assert!(apply(setup.plane, &setup.ns, &changed).0);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let poll = |deployment: Option<Deployment>| {
        deployment
            .map(|d| operator_support::worker_env(&d))
            .and_then(|env| env.get("CFP_POLL_INTERVAL").and_then(|v| v.value.clone()))
    };
    let while_paused = poll(setup.deployments.get_opt("orders").await.ok().flatten());
    annotate("changefeed.io/paused-");
    let resumed = wait("the spec change applied after the pause", || async {
        poll(setup.deployments.get_opt("orders").await.ok().flatten()).filter(|p| p == "1500ms")
    })
    .await;
    // Repeated Events of the same note are one Event with a series count.
    let occurrences = |events: Vec<k8s_openapi::api::events::v1::Event>| -> i32 {
        events.iter().map(|e| e.series.as_ref().map_or(1, |s| s.count)).sum()
    };
    // Published after the workload is applied: waited for, not read once.
    let (paused_events, resumed_events) = wait("two Paused and two Resumed Events", || async {
        let paused = occurrences(setup.events("Paused").await);
        let resumed = occurrences(setup.events("Resumed").await);
        (paused >= 2 && resumed >= 2).then_some((paused, resumed))
    })
    .await;
    println!(
        "scale to zero: failing estimates at 0 → Ready=False/EstimateFailed ({}); fallback → 1 replica ({fallback}); estimates back → 0; EstimateFailed Events {ready_events}; 15 changes under activationLag 20 stay at 0, 25 → 2 (the lease count); paused-replicas=0 → 0 ({}); paused=true kept pollInterval {while_paused:?} until removed, then {resumed}; Paused/Resumed Events {paused_events}/{resumed_events}",
        stuck.message, paused.message
    );
    assert!(fallback.contains("fallback of 1 replica"), "{fallback}");
    assert!(ready_events >= 1);
    assert_eq!(while_paused.as_deref(), Some("5s"), "a paused workload is not changed");
    assert!(
        paused_events >= 2 && resumed_events >= 2,
        "{paused_events}/{resumed_events}"
    );
    setup.stop().await;
}
