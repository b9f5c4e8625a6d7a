//! `cfp operator`: leader election, the controller, and the operator's HTTP endpoints.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::http_server;
use crate::operator::boundary::accounts::AllowListFile;
use crate::operator::config::referenced_secrets;
use crate::operator::crd::ChangeFeedProcessor;
use crate::operator::digest_key::{DigestKey, DigestKeyError, load_or_create};
use crate::operator::failover::watch_worker_pods;
use crate::operator::healthz::Liveness;
use crate::operator::leader::{Election, LeaderElector};
use crate::operator::metrics::{FORGET_DELETED_PERIOD, OperatorMetrics, forget_deleted};
use crate::operator::reconcile::memory::Memories;
use crate::operator::reconcile::{self, Context, error_policy, reconcile, semantic_hash};
use crate::operator::scaling::estimates::{Accounts, Estimators};

/// How the operator runs.
#[derive(Debug, Clone)]
pub struct OperatorSettings {
    /// Watch only these namespaces (all namespaces when empty).
    pub namespaces: Vec<String>,
    /// The default worker image.
    pub worker_image: String,
    /// Leader election, when enabled: the Lease's namespace and settings.
    pub election: Option<(String, Election)>,
    /// Port of /metrics and /healthz.
    pub metrics_port: Option<u16>,
    /// `None`: Secrets' metadata is watched (a changed Secret reconciles the resources that name
    /// it). `Some(interval)`: Secrets are never listed or watched; each resource is reconciled
    /// at least this often, reading the Secrets it names with get.
    pub secrets_recheck: Option<Duration>,
    /// This cluster's identity in lease-set claims (`None`: the UID of `kube-system`).
    pub cluster_identity: Option<String>,
    /// The Secret holding the key of the pod template's Secret digest: (namespace, name).
    pub digest_key_secret: (String, String),
    /// The file of the accounts the operator may reach per namespace (`None`: none with its own
    /// identity, none over plain http).
    pub allowed_accounts: Option<std::path::PathBuf>,
}

/// Why the operator stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// No usable kubeconfig or in-cluster configuration.
    #[error("cannot reach the Kubernetes API: {0}")]
    Client(#[from] kube::Error),
    /// The metrics registry or endpoint failed.
    #[error("metrics: {0}")]
    Metrics(String),
    /// The settings do not work together.
    #[error("{0}")]
    Config(String),
    /// The leader election timings do not work together.
    #[error(transparent)]
    Election(#[from] crate::operator::leader::ElectionError),
    /// The key of the Secret digest could not be read or created.
    #[error(transparent)]
    DigestKey(#[from] DigestKeyError),
    /// The ChangeFeedProcessor CRD is not installed.
    #[error(
        "the ChangeFeedProcessor CRD (changefeedprocessors.changefeed.io) is not installed; install it with `kubectl apply -f crds/` (or `cfp crd | kubectl apply -f -`)"
    )]
    CrdMissing,
}

/// Runs until `shutdown`.
pub async fn run(settings: OperatorSettings, shutdown: CancellationToken) -> Result<(), OperatorError> {
    if let Some((_, election)) = &settings.election {
        election.validate()?;
    }
    let client = Client::try_default().await?;
    let digest_key = prepare(&client, &settings).await?;
    let cluster = cluster_identity(&client, &settings).await?;
    let metrics = OperatorMetrics::new().map_err(|e| OperatorError::Metrics(e.to_string()))?;
    // /healthz fails when the main loop below ends or stops running.
    let liveness = Arc::new(Liveness::default());
    // One Cosmos client per account, kept across leadership terms.
    let accounts = Accounts::default();
    let allowed_accounts = Arc::new(AllowListFile::new(settings.allowed_accounts.clone()));
    if let Err(error) = allowed_accounts.current() {
        tracing::error!(%error, "the allowed accounts cannot be read; resources that need them are refused until they can");
    }
    let mut background = Vec::new();
    if let Some(port) = settings.metrics_port {
        background.push(serve_endpoints(port, &metrics, &liveness, &shutdown).await?);
    }
    let elector = settings.election.as_ref().map(|(namespace, election)| {
        Arc::new(LeaderElector::new(
            Api::<Lease>::namespaced(client.clone(), namespace),
            election.clone(),
        ))
    });
    // Reconciliations act only while this replica holds a lease renewed within the deadline.
    let leading: Arc<dyn Fn() -> bool + Send + Sync> = match &elector {
        Some(elector) => {
            let elector = elector.clone();
            Arc::new(move || elector.is_leading())
        }
        None => Arc::new(|| true),
    };
    let main_loop = async {
        loop {
            let shared = Shared {
                client: client.clone(),
                accounts: accounts.clone(),
                metrics: metrics.clone(),
                leading: leading.clone(),
                cluster: cluster.clone(),
                digest_key: digest_key.clone(),
                allowed_accounts: allowed_accounts.clone(),
            };
            if !lead_one_term(&settings, shared, &elector, &shutdown).await {
                break;
            }
        }
    };
    tokio::select! {
        _ = main_loop => {}
        _ = liveness.beat_forever() => {}
    }
    liveness.end();
    for task in background {
        let _ = task.await;
    }
    Ok(())
}

/// Serves /metrics, /healthz and /readyz on `port` until `shutdown`.
async fn serve_endpoints(
    port: u16,
    metrics: &Arc<OperatorMetrics>,
    liveness: &Arc<Liveness>,
    shutdown: &CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, OperatorError> {
    let listener = TcpListener::bind(("0.0.0.0", port))
        .await
        .map_err(|e| OperatorError::Metrics(e.to_string()))?;
    let address = listener
        .local_addr()
        .map_err(|e| OperatorError::Metrics(e.to_string()))?;
    tracing::info!(%address, "serving /metrics and /healthz");
    let (metrics, liveness) = (metrics.clone(), liveness.clone());
    Ok(tokio::spawn(http_server::serve(
        listener,
        shutdown.clone(),
        move |req| {
            let metrics = metrics.clone();
            let health = liveness.check();
            async move {
                match (req.uri().path(), health) {
                    ("/metrics", _) => http_server::response(200, "text/plain; version=0.0.4", metrics.render()),
                    ("/healthz" | "/readyz", Ok(())) => http_server::response(200, "text/plain", "ok\n"),
                    ("/healthz" | "/readyz", Err(why)) => http_server::response(503, "text/plain", format!("{why}\n")),
                    _ => http_server::response(404, "text/plain", "not found\n"),
                }
            }
        },
    )))
}

/// What the operator needs before it reconciles: the CRD installed, and the installation's
/// digest key (read, or made, once per process: every leadership term and replica digests alike).
async fn prepare(client: &Client, settings: &OperatorSettings) -> Result<DigestKey, OperatorError> {
    let probe: Api<ChangeFeedProcessor> = match settings.namespaces.first() {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    match probe.list(&kube::api::ListParams::default().limit(1)).await {
        Err(kube::Error::Api(status)) if status.code == 404 => return Err(OperatorError::CrdMissing),
        Err(error) => return Err(OperatorError::Client(error)),
        Ok(_) => {}
    }
    let (key_namespace, key_name) = &settings.digest_key_secret;
    let key_secrets: Api<Secret> = Api::namespaced(client.clone(), key_namespace);
    Ok(load_or_create(&key_secrets, key_namespace, key_name).await?)
}

/// One leadership term: wait to lead (with election), reconcile until the term ends. `false`
/// when the operator is shutting down.
async fn lead_one_term(
    settings: &OperatorSettings,
    shared: Shared,
    elector: &Option<Arc<LeaderElector>>,
    shutdown: &CancellationToken,
) -> bool {
    let metrics = &shared.metrics;
    if let Some(elector) = elector {
        tracing::info!("waiting to become the leader");
        if !elector.acquire(shutdown).await {
            return false;
        }
    }
    tracing::info!("leading: reconciling");
    metrics.set_leader(true);
    let lost = CancellationToken::new();
    let holder = elector.as_ref().map(|elector| {
        let (stop, lost) = (shutdown.clone(), lost.clone());
        async move { elector.hold(&stop, &lost).await }
    });
    // One controller per watched namespace (or one for all), sharing clients and metrics.
    let scopes: Vec<Option<String>> = if settings.namespaces.is_empty() {
        vec![None]
    } else {
        settings.namespaces.iter().cloned().map(Some).collect()
    };
    let controller = futures::future::join_all(
        scopes
            .into_iter()
            .map(|scope| run_controller(shared.clone(), settings, scope, shutdown.clone(), lost.clone())),
    );
    match holder {
        Some(holder) => {
            tokio::join!(controller, async {
                holder.await;
                lost.cancel();
            });
        }
        None => {
            controller.await;
        }
    }
    metrics.set_leader(false);
    if shutdown.is_cancelled() {
        if let Some(elector) = elector {
            elector.release().await;
        }
        return false;
    }
    tracing::warn!("lost the leadership; stopped reconciling");
    true
}

/// What the controllers of a leadership term share.
#[derive(Clone)]
struct Shared {
    client: Client,
    accounts: Accounts,
    metrics: Arc<OperatorMetrics>,
    leading: Arc<dyn Fn() -> bool + Send + Sync>,
    cluster: String,
    digest_key: DigestKey,
    allowed_accounts: Arc<AllowListFile>,
}

/// This cluster's identity in lease-set claims: `--cluster-identity`, else the UID of its
/// `kube-system` namespace, else (an operator that may not read it, rendered without Helm's
/// lookup) the UID of this installation's digest-key Secret — a UUID no other cluster has, so
/// claims never take two clusters for one.
async fn cluster_identity(client: &Client, settings: &OperatorSettings) -> Result<String, OperatorError> {
    if let Some(identity) = &settings.cluster_identity {
        return Ok(identity.clone());
    }
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let error = match namespaces.get("kube-system").await.map(|n| n.metadata.uid) {
        Ok(Some(uid)) => return Ok(uid),
        Ok(None) => "the kube-system namespace has no UID".to_owned(),
        Err(error) => error.to_string(),
    };
    let (key_namespace, key_name) = &settings.digest_key_secret;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), key_namespace);
    match secrets.get_metadata(key_name).await.map(|s| s.metadata.uid) {
        Ok(Some(uid)) => {
            tracing::info!(%error, "the kube-system namespace cannot be read: this installation's digest-key Secret names the cluster in lease-set claims");
            Ok(format!("installation-{uid}"))
        }
        _ => Err(OperatorError::Config(format!(
            "this cluster's identity in lease-set claims cannot be read ({error}): grant get on namespaces/kube-system or set --cluster-identity"
        ))),
    }
}

async fn run_controller(
    shared: Shared,
    settings: &OperatorSettings,
    namespace: Option<String>,
    shutdown: CancellationToken,
    lost: CancellationToken,
) {
    let apis = Apis::new(&shared.client, namespace.as_deref());
    let owned = watcher::Config::default().labels("app.kubernetes.io/managed-by=changefeed-operator");
    // The resources, reconciled when something other than their status changed (the operator
    // writes the status itself: its own writes are no reason to reconcile again).
    let (store, writer) = reflector::store();
    // The caches hold no managedFields (server-side apply's bookkeeping, a large share of each
    // object the operator never reads): memory for hundreds of resources.
    let resources = watcher(apis.cfps, watcher::Config::default())
        .default_backoff()
        .modify(|cfp| cfp.managed_fields_mut().clear())
        .reflect(writer)
        .touched_objects()
        .predicate_filter(semantic_hash, Default::default());
    let controller = Controller::for_stream(resources, store.clone());
    // The worker Deployments, read from this watch's cache instead of the API server.
    let (deployment_cache, deployment_writer) = reflector::store();
    let deployments = watcher(apis.deployments, owned.clone())
        .default_backoff()
        .modify(|deployment| deployment.managed_fields_mut().clear())
        .reflect(deployment_writer)
        .touched_objects();
    // Estimates ask for a reconciliation of their resource when they finish.
    let (trigger, estimated) = futures::channel::mpsc::unbounded();
    let context = context(shared, settings, trigger, store.clone(), deployment_cache);
    let pods_stop = CancellationToken::new();
    let pod_watch = tokio::spawn(watch_worker_pods(context.clone(), namespace.clone(), pods_stop.clone()));
    let sweeps = Sweeps::start(&context, &store, &namespace);
    let controller = controller
        .reconcile_on(estimated)
        .owns_stream(deployments)
        .owns(apis.services, owned);
    // A Secret created or fixed later brings the processors that reference it forward. Only
    // Secret metadata is watched: the operator never holds Secret data it does not read. Without
    // the watch (`--watch-secrets=false`) the reconciliations' requeue notices them.
    let controller = match settings.secrets_recheck {
        None => controller.watches(apis.secrets, watcher::Config::default(), referencing(store)),
        Some(_) => controller,
    };
    controller
        .graceful_shutdown_on(async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = lost.cancelled() => {}
            }
        })
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => tracing::debug!(processor = %object.name, "reconciled"),
                Err(error) => tracing::debug!(%error, "reconcile error"),
            }
        })
        .await;
    pods_stop.cancel();
    let _ = pod_watch.await;
    sweeps.stop().await;
    // Give in-flight API calls of the stopped controller a moment before another leader starts.
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// The APIs the controller watches, in one namespace or all.
struct Apis {
    cfps: Api<ChangeFeedProcessor>,
    deployments: Api<Deployment>,
    services: Api<Service>,
    secrets: Api<PartialObjectMeta<Secret>>,
}

impl Apis {
    fn new(client: &Client, namespace: Option<&str>) -> Self {
        match namespace {
            Some(ns) => Apis {
                cfps: Api::namespaced(client.clone(), ns),
                deployments: Api::namespaced(client.clone(), ns),
                services: Api::namespaced(client.clone(), ns),
                secrets: Api::namespaced(client.clone(), ns),
            },
            None => Apis {
                cfps: Api::all(client.clone()),
                deployments: Api::all(client.clone()),
                services: Api::all(client.clone()),
                secrets: Api::all(client.clone()),
            },
        }
    }
}

/// What the reconciliations of one leadership term share.
fn context(
    shared: Shared,
    settings: &OperatorSettings,
    trigger: UnboundedSender<ObjectRef<ChangeFeedProcessor>>,
    store: Store<ChangeFeedProcessor>,
    deployments: Store<Deployment>,
) -> Arc<Context> {
    let reporter = Reporter {
        controller: "changefeed-operator".into(),
        instance: settings.election.as_ref().map(|(_, e)| e.identity.clone()),
    };
    Arc::new(Context {
        client: shared.client.clone(),
        recorder: Recorder::new(shared.client, reporter),
        worker_image: settings.worker_image.clone(),
        metrics: shared.metrics.clone(),
        estimators: Estimators::new(shared.accounts, shared.metrics, trigger, store),
        leading: shared.leading,
        memory: Memories::default(),
        deployments,
        secrets_recheck: settings.secrets_recheck,
        cluster: shared.cluster,
        digest_key: shared.digest_key,
        allowed_accounts: shared.allowed_accounts,
    })
}

/// The sweeps of deleted resources of one controller. A resource deleted without a finalizer is
/// never reconciled again: its series (a misconfigured one's cfp_processor_ready too) and what the
/// reconciler remembered of it are removed here; once stopped, every series of the controller.
struct Sweeps {
    stop: CancellationToken,
    series: tokio::task::JoinHandle<()>,
    memory: tokio::task::JoinHandle<()>,
}

impl Sweeps {
    fn start(context: &Arc<Context>, store: &Store<ChangeFeedProcessor>, namespace: &Option<String>) -> Self {
        let stop = CancellationToken::new();
        let series = tokio::spawn(forget_deleted(
            context.metrics.clone(),
            store.clone(),
            namespace.clone(),
            FORGET_DELETED_PERIOD,
            stop.clone(),
        ));
        let memory = tokio::spawn(reconcile::memory::forget_deleted(
            context.clone(),
            store.clone(),
            FORGET_DELETED_PERIOD,
            stop.clone(),
        ));
        Self { stop, series, memory }
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = self.series.await;
        let _ = self.memory.await;
    }
}

/// The processors in a Secret's namespace that reference it.
fn referencing(
    store: Store<ChangeFeedProcessor>,
) -> impl Fn(PartialObjectMeta<Secret>) -> Vec<ObjectRef<ChangeFeedProcessor>> + Send + Sync + 'static {
    move |secret: PartialObjectMeta<Secret>| {
        let name = secret.name_any();
        let namespace = secret.namespace();
        store
            .state()
            .into_iter()
            .filter(|cfp| cfp.namespace() == namespace && referenced_secrets(cfp).contains(&name))
            .map(|cfp| ObjectRef::from_obj(&*cfp))
            .collect()
    }
}
