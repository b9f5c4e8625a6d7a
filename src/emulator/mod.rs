//! The Cosmos SDK's in-memory emulator as a local Cosmos DB: in-process for tests, and served over
//! loopback HTTP/1.1 and cleartext HTTP/2 by `cfp emulator`.
//!
//! The account ([`AccountOptions`], `cfp emulator` options):
//!
//! - `--container db/coll[:/pk[:partitions]]` — a container created at start.
//! - `--throughput db/coll=RU` — that container's provisioned throughput (RU/s, at least 400 as
//!   on the service): every request of its documents spends a budget per second (change feed
//!   pages too: `request_budget`), low-priority requests are refused first, and a
//!   request past the budget gets 429/3200 with `x-ms-retry-after-ms`.
//! - `--throughput-bucket db/coll:B=P` — throughput bucket `B` (1–5) of a container given a
//!   throughput may spend `P` % of it: requests sent in it past that are answered 429/3212.
//! - `--region NAME` (repeatable; the first takes writes) — the account's regions, each served on
//!   a listener of its own (the ports after `--port`), as the account metadata's
//!   `readableLocations` / `writableLocations` name them; `--replication-delay-ms N` — how long
//!   a write takes to reach the other regions (each has every partition's writes in their
//!   order: see `lag.rs`).
//!
//! The control API, on every region's endpoint:
//!
//! - `GET  /_emulator/ranges?database=D&container=C` — the physical partitions (id, min, max).
//! - `POST /_emulator/split?database=D&container=C[&partition=ID][&lockMs=N]` — splits one
//!   physical partition at its midpoint (the first one when `partition` is not given) and answers
//!   with the partitions after the split.
//! - `POST /_emulator/merge?database=D&container=C&partitions=ID1,ID2[&lockMs=N]` — merges two
//!   adjacent physical partitions into one and answers with the partitions after the merge (its
//!   documents keep their LSNs and its writes go on above both parents', as on the service).
//! - `POST
//!   /_emulator/faults?rate=R&kinds=429,503,408,reset,429/3212,404/1002,403/3,403/1008[&latencyMs=N]`
//!   — fails a share `R` of the Cosmos requests as the service does (`404/1002` only reads, `403/3`
//!   only writes; and answers each after N/2 to 3N/2 ms); `POST /_emulator/outage?ms=N` fails every
//!   request for `N` ms; `DELETE /_emulator/faults` stops; `GET /_emulator/faults` reports what was
//!   injected.
//! - `POST /_emulator/hang?partition=ID[&container=C]` — change feed reads of that physical
//!   partition hang, unanswered, until `DELETE /_emulator/hang` (`GET` reports them).
//! - `POST /_emulator/key?value=K` — regenerates the account key as `K` (base64), as a key
//!   rotation does: requests signed with the old key get 401 from then on (needs `--key`).
//! - `POST /_emulator/containers?database=D&container=C[&partitionKey=/id][&partitions=N][&throughput=RU]` —
//!   creates a container (and its database) as the management plane does (`az cosmosdb sql
//!   container create`), also where the data plane refuses metadata writes; `throughput` as
//!   `--throughput`.
//! - `GET /_emulator/load` — per container (`database/container`): the requests answered, the
//!   429s its provisioned throughput answered (also those the client retried by itself) and
//!   the request units charged.
//! - `GET /_emulator/regions` — the regions: the write region, each region's endpoint, whether
//!   it is online and takes writes, and what it answered over HTTP: reads, and document writes
//!   by container, accepted and refused ([`RegionTopology`], [`Traffic`]).
//! - `POST /_emulator/failover?region=R[&windowMs=N]` — moves the write region to `R`, as a
//!   manual failover: `R` has every write the old one took, the old write region refuses writes
//!   (403/3) at once, and for `windowMs` the account still advertises both as writable, then
//!   only `R`.
//! - `POST /_emulator/region-offline?region=R` — takes `R` out of service: it leaves the account
//!   metadata and its endpoint resets every connection (if it took writes, the next region does);
//!   `DELETE` brings it back (writes stay where they are).
//!
//! A bad parameter is answered 400 with a message saying what is expected.
//!
//! The modules: `edge` (the one door to the SDK's emulator) with `change_feed` (its change feed
//! pages), `addressing` (resource paths as the service serves them), [`formats`] (the change feed
//! formats and their translations), `metadata` (metadata writes refused as the service refuses
//! them) and `auth`; `server` (the HTTP face) and `controls` (`/_emulator/*`); `faults`, `hangs`,
//! `throttles` and `request_budget` (what it fails, hangs, refuses and how it spends a container's
//! throughput); `partitions` (splits and merges) with `merged_partitions` (how the edge makes them)
//! and `lsn_map` (a merged partition's LSNs as the service numbers them); `regions`, `lag` and
//! `region_traffic` (the account's regions, their replication delay and what each answered);
//! `in_process` (clients in the same process, for tests).

mod addressing;
mod auth;
mod change_feed;
mod controls;
mod edge;
mod faults;
pub mod formats;
mod hangs;
mod in_process;
mod lag;
mod lsn_map;
mod merged_partitions;
mod metadata;
mod partitions;
mod region_traffic;
mod regions;
mod request_budget;
mod server;
mod throttles;

pub use auth::RequiredAuth;
pub use faults::{Fault, FaultInjector};
pub use region_traffic::{Traffic, WriteCounts};
pub use regions::{AccountOptions, RegionTopology, RegionView};
pub use throttles::ContainerLoad;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use azure_core::http::{Method, Request, Url};
use azure_data_cosmos_driver::in_memory_emulator::{ContainerConfig, InMemoryEmulatorHttpClient};
use bytes::Bytes;
use http_body_util::Full;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

use crate::cosmos::{CosmosAccount, CosmosError, EpkRange, ErrorKind};
pub use regions::{BucketSpec, ThroughputSpec};

/// Why the account key could not be rotated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyRotationError {
    /// Account keys are base64.
    #[error("the key must be base64")]
    NotBase64,
    /// The emulator was started without a key to check.
    #[error("this emulator checks no key: start it with --key to rotate keys")]
    NoKeyChecked,
}

/// Errors of the emulator host.
#[derive(Debug, thiserror::Error)]
pub enum EmulatorError {
    /// A container spec like `db/coll:/pk:8` could not be parsed.
    #[error("invalid container spec {spec:?}: {reason}")]
    InvalidSpec {
        /// The spec as given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The database or container does not exist.
    #[error("container {0} does not exist")]
    NoSuchContainer(String),
    /// The partition does not exist or cannot be split.
    #[error("cannot split: {0}")]
    Split(String),
    /// The partitions could not be merged.
    #[error("cannot merge: {0}")]
    Merge(String),
    /// A control request or an option names something that does not fit (answered with 400).
    #[error("{0}")]
    BadRequest(String),
    /// The listening socket could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The Entra ID token file could not be read.
    #[error("cannot read the Entra ID token file {path}: {source}")]
    TokenFile {
        /// The file.
        path: std::path::PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A request to the emulator failed.
    #[error(transparent)]
    Cosmos(#[from] CosmosError),
}

/// A container to create at emulator start: `database/container:/partitionKeyPath:partitions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSpec {
    /// Database id.
    pub database: String,
    /// Container id.
    pub container: String,
    /// Partition key path, for example `/pk`.
    pub partition_key: String,
    /// Number of physical partitions.
    pub partitions: u32,
}

impl std::str::FromStr for ContainerSpec {
    type Err = EmulatorError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &str| EmulatorError::InvalidSpec {
            spec: spec.to_owned(),
            reason: reason.to_owned(),
        };
        let mut parts = spec.splitn(3, ':');
        let names = parts.next().unwrap_or_default();
        let (database, container) = names
            .split_once('/')
            .filter(|(d, c)| !d.is_empty() && !c.is_empty() && !c.contains('/'))
            .ok_or_else(|| bad("expected database/container"))?;
        let partition_key = parts.next().unwrap_or("/id").to_owned();
        if !partition_key.starts_with('/') || partition_key.len() < 2 {
            return Err(bad("the partition key path must look like /pk"));
        }
        let partitions = match parts.next() {
            None => 4,
            Some(n) => n
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=1024).contains(n))
                .ok_or_else(|| bad("the partition count must be a whole number from 1 to 1024"))?,
        };
        Ok(Self {
            database: database.to_owned(),
            container: container.to_owned(),
            partition_key,
            partitions,
        })
    }
}

/// One physical partition of an emulated container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhysicalPartition {
    /// The partition key range id.
    pub id: String,
    /// Its EPK range.
    #[serde(flatten)]
    pub range: EpkRange,
}

/// The largest request body the emulator accepts (the service limits a document to 2 MiB).
pub const MAX_REQUEST_BODY: usize = 4 * 1024 * 1024;

/// An in-memory Cosmos DB account.
#[derive(Clone)]
pub struct Emulator {
    client: Arc<InMemoryEmulatorHttpClient>,
    /// The door every client's request goes through: the service's change feed formats.
    edge: Arc<edge::Edge>,
    gateway: Url,
    /// Which requests over HTTP are authorized (the key can be regenerated while serving).
    auth: Arc<std::sync::RwLock<RequiredAuth>>,
    /// Faults injected into Cosmos requests.
    faults: Arc<FaultInjector>,
    /// Partitions whose change feed reads hang.
    hangs: Arc<hangs::Hangs>,
    /// Names of the databases and containers by resource id, for requests addressed by id.
    ids: Arc<addressing::ResourceIds>,
    /// Refuse database and container writes signed with a key, as an account with
    /// `disableKeyBasedMetadataWriteAccess` does (Entra ID tokens are always refused them).
    deny_key_metadata_writes: Arc<std::sync::atomic::AtomicBool>,
    /// The account's regions in the order given, each with the endpoint it is served at.
    regions: Arc<Vec<regions::RegionEndpoint>>,
    /// How long a write takes to reach the other regions.
    replication_delay: Duration,
    /// What each region answered over HTTP.
    traffic: Arc<region_traffic::RegionTraffic>,
    /// What each region has of the others' writes (the replication delay).
    lag: Arc<lag::Lag>,
}

impl Emulator {
    /// A new, empty account whose one region is reachable at `gateway`
    /// (for example `http://127.0.0.1:8081/`).
    pub fn new(gateway: &str) -> Result<Self, EmulatorError> {
        Self::with_regions(&[(regions::DEFAULT_REGION, gateway)], Duration::ZERO)
    }

    /// A new, empty account with `regions` (name, gateway URL), the first its write region;
    /// writes reach the other regions after `replication_delay`. Containers given a provisioned
    /// throughput answer 429 past it.
    pub fn with_regions(regions: &[(&str, &str)], replication_delay: Duration) -> Result<Self, EmulatorError> {
        let endpoints = regions::endpoints(regions)?;
        let gateway = endpoints
            .first()
            .map(|r| r.gateway.clone())
            .ok_or_else(|| EmulatorError::BadRequest("an account needs at least one region".into()))?;
        let client = Arc::new(
            InMemoryEmulatorHttpClient::try_new(regions::account_config(&endpoints)?).map_err(CosmosError::from)?,
        );
        let lag = Arc::new(lag::Lag::new(replication_delay));
        Ok(Self {
            edge: Arc::new(edge::Edge::new(client.clone(), lag.clone())),
            lag,
            client,
            gateway,
            regions: Arc::new(endpoints),
            replication_delay,
            traffic: Arc::default(),
            auth: Arc::new(std::sync::RwLock::new(RequiredAuth::Any)),
            faults: Arc::new(FaultInjector::default()),
            hangs: Arc::default(),
            ids: Arc::default(),
            deny_key_metadata_writes: Arc::default(),
        })
    }

    /// An in-process account with one container (partition key `/pk`, `partitions` physical
    /// partitions), and a client of it.
    pub async fn in_process_with(
        database: &str,
        container: &str,
        partitions: u32,
    ) -> Result<(Self, CosmosAccount), EmulatorError> {
        let emulator = Self::in_process();
        let spec = ContainerSpec {
            database: database.into(),
            container: container.into(),
            partition_key: "/pk".into(),
            partitions,
        };
        emulator.create_container(&spec).await?;
        let account = emulator.account().await?;
        Ok((emulator, account))
    }

    /// A new account for in-process use only (no HTTP server).
    pub fn in_process() -> Self {
        // The URL is fixed and valid; `new` can only fail on a bad URL.
        Self::new("https://eastus.emulator.local/").unwrap_or_else(|_| unreachable!("valid URL"))
    }

    /// Disables key auth, as on an account with `disableLocalAuth`: requests over HTTP must carry
    /// the Entra ID bearer token `token` (Cosmos DB's `type=aad` authorization); others get 401.
    /// In-process clients are not checked.
    pub fn require_entra_token(self, token: &str) -> Self {
        self.set_auth(RequiredAuth::EntraToken(Arc::from(token.trim())));
        self
    }

    /// Requires requests over HTTP to be signed with the account key `key`, as the service does
    /// (401 otherwise). In-process clients are not checked.
    pub fn require_key(self, key: &str) -> Self {
        self.set_auth(RequiredAuth::Key(Arc::new(azure_core::credentials::Secret::new(
            key.to_owned(),
        ))));
        self
    }

    /// Refuses database and container writes over HTTP (403), as an account with
    /// `disableKeyBasedMetadataWriteAccess` does for keys; Microsoft Entra ID tokens are always
    /// refused them, as by the service. `--container` and the control API still create.
    pub fn deny_metadata_writes(self) -> Self {
        self.deny_key_metadata_writes
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self
    }

    /// The 403 the service answers for a database or container write this account refuses.
    fn refuse_metadata_write(
        &self,
        method: &str,
        resolved: &addressing::ResolvedPath,
    ) -> Option<hyper::Response<Full<Bytes>>> {
        let write = metadata::metadata_write(method, &resolved.path)?;
        let auth = self.auth.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        if matches!(*auth, RequiredAuth::EntraToken(_)) {
            Some(metadata::refused_to_token(write, &resolved.path))
        } else if self.deny_key_metadata_writes.load(std::sync::atomic::Ordering::Relaxed) {
            Some(metadata::refused_to_key(method, write))
        } else {
            None
        }
    }

    fn set_auth(&self, auth: RequiredAuth) {
        *self.auth.write().unwrap_or_else(std::sync::PoisonError::into_inner) = auth;
    }

    /// Regenerates the account key as `key`: from now on only requests signed with it pass.
    /// Fails when the account does not check keys (started without one).
    pub fn regenerate_key(&self, key: &str) -> Result<(), KeyRotationError> {
        use base64::Engine as _;
        let mut auth = self.auth.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        match *auth {
            RequiredAuth::Key(_) if base64::engine::general_purpose::STANDARD.decode(key).is_ok() => {
                *auth = RequiredAuth::Key(Arc::new(azure_core::credentials::Secret::new(key.to_owned())));
                Ok(())
            }
            RequiredAuth::Key(_) => Err(KeyRotationError::NotBase64),
            _ => Err(KeyRotationError::NoKeyChecked),
        }
    }

    /// What `database/container` answered so far: requests, the 429s of its provisioned
    /// throughput, and the request units charged (counted at the edge, so also the 429s a client
    /// retried by itself; injected faults are not counted here).
    pub fn load(&self, database: &str, container: &str) -> ContainerLoad {
        self.edge
            .throttles()
            .report()
            .remove(&format!("{database}/{container}"))
            .unwrap_or_default()
    }

    /// The endpoint clients use.
    pub fn endpoint(&self) -> String {
        self.gateway.to_string()
    }

    /// A client for this account that talks to it in-process (no network), answered as
    /// `cfp emulator` answers its clients over HTTP.
    pub async fn account(&self) -> Result<CosmosAccount, CosmosError> {
        CosmosAccount::in_memory(in_process::runtime_builder(&self.edge), self.gateway.as_str()).await
    }

    /// Creates a database (if missing) and a container with `partitions` physical partitions.
    pub async fn create_container(&self, spec: &ContainerSpec) -> Result<(), EmulatorError> {
        self.create_container_with_throughput(spec, None).await
    }

    /// Like [`Self::create_container`], with a provisioned throughput in RU/s (at least 400, as
    /// on the service): every request of its documents spends request units from a budget per
    /// second (writes as the SDK emulator charges them, change feed pages by
    /// `request_budget::page_charge`), low-priority requests are refused first, and each
    /// physical partition's writes also get an equal share of it (the SDK emulator's own check);
    /// a request past it is answered 429/3200 with `x-ms-retry-after-ms`. An existing container
    /// is left as it is.
    pub async fn create_container_with_throughput(
        &self,
        spec: &ContainerSpec,
        throughput: Option<u64>,
    ) -> Result<(), EmulatorError> {
        let mut config = ContainerConfig::new().with_partition_count(spec.partitions);
        if let Some(ru) = throughput {
            config = config.with_throughput(ru);
        }
        let config = config.build().map_err(|e| EmulatorError::InvalidSpec {
            spec: format!("{}/{}", spec.database, spec.container),
            reason: e.to_string(),
        })?;
        let store = self.client.store();
        if !self.exists(&format!("dbs/{}", spec.database)).await? {
            store.create_database(&spec.database);
        }
        if self
            .exists(&format!("dbs/{}/colls/{}", spec.database, spec.container))
            .await?
        {
            return Ok(());
        }
        let pk = serde_json::from_value(serde_json::json!({
            "paths": [spec.partition_key], "kind": "Hash", "version": 2
        }))
        .map_err(CosmosError::from)?;
        store.create_container_with_config(&spec.database, &spec.container, pk, config);
        if let Some(ru) = throughput {
            let path = format!("dbs/{}/colls/{}", spec.database, spec.container);
            self.edge.budgets().provision(&path, ru);
        }
        Ok(())
    }

    /// Changes `database/container`'s provisioned throughput to `ru` RU/s, as the management
    /// plane's throughput update does (`az cosmosdb sql container throughput update`): its budget
    /// of request units a second is the new one from the next request on. The SDK emulator's own
    /// per-partition check of writes and the offer it answers keep the value the container was
    /// created with (it does not apply a changed offer).
    pub fn set_throughput(&self, database: &str, container: &str, ru: u64) {
        self.edge
            .budgets()
            .provision(&format!("dbs/{database}/colls/{container}"), ru);
    }

    /// Lets throughput bucket `bucket` (1–5) of `database/container` spend at most `percent` of
    /// its provisioned throughput, as the account's throughput bucket configuration does: a
    /// request sent with `x-ms-cosmos-throughput-bucket: <bucket>` past that share is answered
    /// 429/3212 whatever the container has left.
    pub fn set_throughput_bucket(&self, database: &str, container: &str, bucket: u32, percent: f64) {
        self.edge
            .budgets()
            .configure_bucket(&format!("dbs/{database}/colls/{container}"), bucket, percent);
    }

    /// Makes the resource ids of this account's databases and containers differ from every other
    /// run's (as the service's do; the store counts them from 1 on every start), so that what is
    /// bound to a resource id — a lease prefix, an export — never applies to another run's
    /// container: the store's database counter is advanced by a random amount (up to 65,535)
    /// with a throwaway database, written over and over and deleted.
    async fn vary_resource_ids(&self) -> Result<(), EmulatorError> {
        const THROWAWAY: &str = "cfp-emulator-resource-id-offset";
        let store = self.client.store();
        for _ in 0..=fastrand::u16(..) {
            store.create_database(THROWAWAY);
        }
        let mut url = self.store_url();
        url.set_path(&format!("dbs/{THROWAWAY}"));
        let mut request = Request::new(url, Method::Delete);
        request.insert_header("x-ms-version", "2020-07-15");
        self.client.execute_request(&request).await.map_err(CosmosError::from)?;
        Ok(())
    }

    /// Sends a GET for a resource path straight to the store: status and body.
    async fn get(&self, path: &str) -> Result<(u16, Bytes), EmulatorError> {
        let mut url = self.store_url();
        url.set_path(path);
        let mut request = Request::new(url, Method::Get);
        request.insert_header("x-ms-version", "2020-07-15");
        let response = self.client.execute_request(&request).await.map_err(CosmosError::from)?;
        let status = u16::from(response.status());
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| CosmosError::local(ErrorKind::Other, format!("reading {path}: {e}")))?;
        Ok((status, body))
    }

    async fn exists(&self, path: &str) -> Result<bool, EmulatorError> {
        Ok(self.get(path).await?.0 == 200)
    }
}

/// Binds `addr`, builds an emulator whose gateway is the bound address, and creates `containers`.
pub async fn bind(addr: SocketAddr, containers: &[ContainerSpec]) -> Result<(Emulator, TcpListener), EmulatorError> {
    bind_advertised(addr, None, containers).await
}

/// Like [`bind`], with `advertise` (when given) as the gateway clients are told to use.
pub async fn bind_advertised(
    addr: SocketAddr,
    advertise: Option<&str>,
    containers: &[ContainerSpec],
) -> Result<(Emulator, TcpListener), EmulatorError> {
    let mut options = AccountOptions::new(addr);
    options.advertise = advertise.map(str::to_owned);
    options.containers = containers.to_vec();
    let (emulator, mut listeners) = regions::bind_account(&options).await?;
    let listener = listeners
        .pop()
        .ok_or_else(|| EmulatorError::BadRequest("an account needs at least one region".into()))?;
    Ok((emulator, listener))
}

pub use regions::bind_account;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_container_specs() {
        let spec: ContainerSpec = "db/coll:/pk:8".parse().unwrap();
        assert_eq!(
            spec,
            ContainerSpec {
                database: "db".into(),
                container: "coll".into(),
                partition_key: "/pk".into(),
                partitions: 8
            }
        );
        let short: ContainerSpec = "db/leases".parse().unwrap();
        assert_eq!((short.partition_key.as_str(), short.partitions), ("/id", 4));
        for bad in ["db", "/coll", "db/coll:pk", "db/coll:/pk:0", "db/coll:/pk:x", "a/b/c"] {
            assert!(bad.parse::<ContainerSpec>().is_err(), "{bad} should be rejected");
        }
    }
}
