//! The account's shape: its regions, each served on a loopback listener of its own (the SDK tells
//! regions apart by the scheme, host and port of their endpoint, and names each region's endpoint
//! in the account metadata's `readableLocations` / `writableLocations`), the replication delay
//! between them, provisioned throughput per container, and the region controls (`GET
//! /_emulator/regions`, `POST /_emulator/failover`, `POST|DELETE /_emulator/region-offline`).

use std::net::SocketAddr;
use std::time::Duration;

use azure_core::http::Url;
use azure_data_cosmos_driver::in_memory_emulator::{ReplicationConfig, VirtualAccountConfig, VirtualRegion};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::{ContainerSpec, Emulator, EmulatorError};
use crate::cosmos::CosmosError;

/// The region of an account started without `--region`.
pub const DEFAULT_REGION: &str = "East US";

/// The smallest provisioned throughput the service (and the SDK emulator) accepts, in RU/s.
pub const MIN_THROUGHPUT: u64 = 400;

/// One region of the account and the endpoint it is served at.
#[derive(Debug, Clone)]
pub struct RegionEndpoint {
    /// The region's name, as the account metadata gives it (`East US`).
    pub name: String,
    /// Its gateway URL.
    pub gateway: Url,
}

/// The regions `(name, gateway)`, checked: names non-empty and distinct, URLs valid and distinct.
pub fn endpoints(regions: &[(&str, &str)]) -> Result<Vec<RegionEndpoint>, EmulatorError> {
    let mut out: Vec<RegionEndpoint> = Vec::with_capacity(regions.len());
    for (name, gateway) in regions {
        let name = name.trim();
        if name.is_empty() {
            return Err(EmulatorError::BadRequest(
                "a region needs a name, such as \"West US\"".into(),
            ));
        }
        if out.iter().any(|r| r.name.eq_ignore_ascii_case(name)) {
            return Err(EmulatorError::BadRequest(format!("region {name:?} is given twice")));
        }
        let gateway = Url::parse(gateway).map_err(|e| EmulatorError::InvalidSpec {
            spec: (*gateway).to_owned(),
            reason: e.to_string(),
        })?;
        if out.iter().any(|r| r.gateway == gateway) {
            return Err(EmulatorError::BadRequest(format!(
                "regions need endpoints of their own: {gateway} is given twice"
            )));
        }
        out.push(RegionEndpoint {
            name: name.to_owned(),
            gateway,
        });
    }
    Ok(out)
}

/// The SDK emulator's account: these regions (the first writes), every write replicated to the
/// others at once (the edge shows each region the others' writes only after the replication
/// delay, in order: `lag.rs`), and the throughput of containers that have one enforced.
pub fn account_config(endpoints: &[RegionEndpoint]) -> Result<VirtualAccountConfig, EmulatorError> {
    let regions = endpoints
        .iter()
        .map(|r| VirtualRegion::new(&r.name, r.gateway.clone()))
        .collect();
    Ok(VirtualAccountConfig::new(regions)
        .map_err(CosmosError::from)?
        .with_throttling_enabled(true)
        .with_replication_config(ReplicationConfig::immediate()))
}

/// Provisioned throughput for a container created at start: `database/container=RU` (RU/s, at
/// least 400 as on the service).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThroughputSpec {
    /// Database id.
    pub database: String,
    /// Container id.
    pub container: String,
    /// Request units per second.
    pub ru_per_second: u64,
}

impl std::str::FromStr for ThroughputSpec {
    type Err = EmulatorError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &str| EmulatorError::BadRequest(format!("invalid throughput {spec:?}: {reason}"));
        let (names, ru) = spec
            .split_once('=')
            .ok_or_else(|| bad("expected database/container=RU"))?;
        let (database, container) = names
            .split_once('/')
            .filter(|(d, c)| !d.is_empty() && !c.is_empty() && !c.contains('/'))
            .ok_or_else(|| bad("expected database/container=RU"))?;
        let ru_per_second = parse_throughput(ru).map_err(|reason| bad(&reason))?;
        Ok(Self {
            database: database.to_owned(),
            container: container.to_owned(),
            ru_per_second,
        })
    }
}

/// A throughput bucket of a container created at start: `database/container:bucket=percent`
/// (bucket 1–5; the percentage of the container's throughput its requests may spend).
#[derive(Debug, Clone, PartialEq)]
pub struct BucketSpec {
    /// Database id.
    pub database: String,
    /// Container id.
    pub container: String,
    /// The bucket (1–5).
    pub bucket: u32,
    /// The percentage of the container's throughput it may spend (1–100).
    pub percent: f64,
}

impl std::str::FromStr for BucketSpec {
    type Err = EmulatorError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let bad = || {
            EmulatorError::BadRequest(format!(
                "invalid throughput bucket {spec:?}: expected database/container:bucket=percent, a bucket from 1 to 5 and a percentage from 1 to 100"
            ))
        };
        let (names, percent) = spec.split_once('=').ok_or_else(bad)?;
        let (names, bucket) = names.rsplit_once(':').ok_or_else(bad)?;
        let (database, container) = names
            .split_once('/')
            .filter(|(d, c)| !d.is_empty() && !c.is_empty() && !c.contains('/'))
            .ok_or_else(bad)?;
        let bucket: u32 = bucket
            .trim()
            .parse()
            .ok()
            .filter(|b| (1..=5).contains(b))
            .ok_or_else(bad)?;
        let percent: f64 = percent
            .trim()
            .trim_end_matches('%')
            .parse()
            .ok()
            .filter(|p: &f64| (1.0..=100.0).contains(p))
            .ok_or_else(bad)?;
        Ok(Self {
            database: database.to_owned(),
            container: container.to_owned(),
            bucket,
            percent,
        })
    }
}

/// A provisioned throughput in RU/s: a whole number of at least 400.
pub fn parse_throughput(value: &str) -> Result<u64, String> {
    value
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|ru| *ru >= MIN_THROUGHPUT)
        .ok_or_else(|| format!("throughput must be a whole number of RU/s, at least {MIN_THROUGHPUT} (got {value:?})"))
}

/// What `cfp emulator` serves: where, which regions, which containers.
#[derive(Debug, Clone)]
pub struct AccountOptions {
    /// Where the first region listens; region `i` listens on the port after it `i` times (or
    /// on any free port when this port is 0).
    pub addr: SocketAddr,
    /// The URL clients are told to use for the (only) region, when not the bound address.
    pub advertise: Option<String>,
    /// The region names, the first the write region (none: one region, `East US`).
    pub regions: Vec<String>,
    /// How long a write takes to reach the other regions.
    pub replication_delay: Duration,
    /// Containers to create at start.
    pub containers: Vec<ContainerSpec>,
    /// Provisioned throughput of some of those containers.
    pub throughput: Vec<ThroughputSpec>,
    /// Throughput buckets of some of those (given a throughput).
    pub buckets: Vec<BucketSpec>,
}

impl AccountOptions {
    /// One region at `addr`, no containers.
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            advertise: None,
            regions: Vec::new(),
            replication_delay: Duration::ZERO,
            containers: Vec::new(),
            throughput: Vec::new(),
            buckets: Vec::new(),
        }
    }

    /// The throughput given for a container, after checking each names one of the containers.
    fn throughput_of(&self, spec: &ContainerSpec) -> Option<u64> {
        self.throughput
            .iter()
            .find(|t| t.database == spec.database && t.container == spec.container)
            .map(|t| t.ru_per_second)
    }
}

/// Binds one listener per region, builds the account whose regions are served at the bound
/// addresses, and creates the containers. The listeners come in the order of the regions.
pub async fn bind_account(options: &AccountOptions) -> Result<(Emulator, Vec<TcpListener>), EmulatorError> {
    let names: Vec<&str> = if options.regions.is_empty() {
        vec![DEFAULT_REGION]
    } else {
        options.regions.iter().map(String::as_str).collect()
    };
    if options.advertise.is_some() && names.len() > 1 {
        return Err(EmulatorError::BadRequest(
            "--advertise-url names one endpoint: it cannot be given with several --region (each region is served on a port of its own)".into(),
        ));
    }
    if let Some(orphan) = options.throughput.iter().find(|t| {
        !options
            .containers
            .iter()
            .any(|c| c.database == t.database && c.container == t.container)
    }) {
        return Err(EmulatorError::BadRequest(format!(
            "--throughput {}/{}={}: no --container creates {}/{}",
            orphan.database, orphan.container, orphan.ru_per_second, orphan.database, orphan.container
        )));
    }
    if let Some(orphan) = options.buckets.iter().find(|b| {
        !options
            .throughput
            .iter()
            .any(|t| t.database == b.database && t.container == b.container)
    }) {
        return Err(EmulatorError::BadRequest(format!(
            "--throughput-bucket {}/{}:{}: {}/{} has no --throughput to take a share of",
            orphan.database, orphan.container, orphan.bucket, orphan.database, orphan.container
        )));
    }
    let (listeners, gateways) = bind_listeners(options, &names).await?;
    let pairs: Vec<(&str, &str)> = names.iter().copied().zip(gateways.iter().map(String::as_str)).collect();
    let emulator = Emulator::with_regions(&pairs, options.replication_delay)?;
    emulator.vary_resource_ids().await?;
    for spec in &options.containers {
        emulator
            .create_container_with_throughput(spec, options.throughput_of(spec))
            .await?;
    }
    for bucket in &options.buckets {
        emulator.set_throughput_bucket(&bucket.database, &bucket.container, bucket.bucket, bucket.percent);
    }
    Ok((emulator, listeners))
}

/// One listener per region: the first at `options.addr`, the next on the ports after it (any
/// free port when that is 0); with the gateway URL each region is advertised at.
async fn bind_listeners(
    options: &AccountOptions,
    names: &[&str],
) -> Result<(Vec<TcpListener>, Vec<String>), EmulatorError> {
    let mut listeners = Vec::with_capacity(names.len());
    let mut gateways = Vec::with_capacity(names.len());
    for (index, name) in names.iter().enumerate() {
        let mut addr = options.addr;
        if addr.port() != 0 {
            let port = u16::try_from(index)
                .ok()
                .and_then(|i| addr.port().checked_add(i))
                .ok_or_else(|| EmulatorError::BadRequest(format!("no port left for region {name}")))?;
            addr.set_port(port);
        }
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| EmulatorError::Bind { addr, source })?;
        let local = listener
            .local_addr()
            .map_err(|source| EmulatorError::Bind { addr, source })?;
        gateways.push(match (&options.advertise, index) {
            (Some(url), 0) => url.clone(),
            _ => format!("http://{local}/"),
        });
        listeners.push(listener);
    }
    Ok((listeners, gateways))
}

/// The account's regions as the control API reports them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RegionTopology {
    /// The region that takes writes.
    pub write_region: String,
    /// During a failover: the region writes are moving away from (still advertised as writable).
    pub failing_over_from: Option<String>,
    /// How long a write takes to reach the other regions.
    pub replication_delay_ms: u64,
    /// Every region, in the order given at start.
    pub regions: Vec<RegionView>,
}

/// One region in a [`RegionTopology`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RegionView {
    /// Its name.
    pub name: String,
    /// Its endpoint.
    pub endpoint: String,
    /// Whether it is in service (an offline region's endpoint resets every connection).
    pub online: bool,
    /// Whether it takes writes now.
    pub writable: bool,
    /// What it answered over HTTP so far: reads, and document writes by container.
    #[serde(flatten)]
    pub traffic: super::Traffic,
}

impl Emulator {
    /// The account's regions: which writes, which are offline, where each is served.
    pub fn topology(&self) -> RegionTopology {
        let store = self.client.store();
        let config = store.config();
        let snapshot = config.topology_snapshot();
        RegionTopology {
            write_region: snapshot.write_region.clone(),
            failing_over_from: snapshot.failing_over_from.clone(),
            replication_delay_ms: u64::try_from(self.replication_delay.as_millis()).unwrap_or(u64::MAX),
            regions: self
                .regions
                .iter()
                .map(|r| RegionView {
                    name: r.name.clone(),
                    endpoint: r.gateway.to_string(),
                    online: !snapshot.offline.contains(&r.name),
                    writable: config.is_write_region(&r.name),
                    traffic: self.traffic.of(&r.name),
                })
                .collect(),
        }
    }

    /// Moves the write region to `region`, as a manual failover does: the new write region has
    /// every write the old one took (a manual failover waits for that), writes to the old one
    /// are refused (403/3) at once while the account still advertises both as writable; after
    /// `window` (or at once) it advertises only the new one.
    pub fn fail_over(&self, region: &str, window: Duration) -> Result<RegionTopology, EmulatorError> {
        let store = self.client.store();
        store.begin_failover(region).map_err(region_error)?;
        self.lag.settle();
        if window.is_zero() {
            store.complete_failover();
        } else {
            tokio::spawn(async move {
                tokio::time::sleep(window).await;
                store.complete_failover();
            });
        }
        tracing::info!(region, "write region failed over");
        Ok(self.topology())
    }

    /// Takes `region` out of service (`offline`), as the service's offline-region operation does
    /// — it leaves the account metadata, its endpoint stops answering, and if it was the write
    /// region the next region takes writes (with every write the old one took) — or brings it
    /// back (writes stay where they are).
    pub fn set_region_offline(&self, region: &str, offline: bool) -> Result<RegionTopology, EmulatorError> {
        let store = self.client.store();
        let took_writes = store.config().is_write_region(region);
        let changed = if offline {
            store.set_region_offline(region)
        } else {
            store.set_region_online(region)
        };
        changed.map_err(region_error)?;
        if offline && took_writes {
            self.lag.settle();
        }
        tracing::info!(region, offline, "region availability changed");
        Ok(self.topology())
    }

    /// Where the control API reads the store: the write region's endpoint.
    pub(super) fn store_url(&self) -> Url {
        let write = self.client.store().config().write_region_name();
        self.regions
            .iter()
            .find(|r| r.name == write)
            .map_or_else(|| self.gateway.clone(), |r| r.gateway.clone())
    }

    /// Whether the region served at `gateway` is offline (its requests go unanswered).
    pub(super) fn region_offline(&self, gateway: &Url) -> bool {
        self.client
            .store()
            .config()
            .region_for_url(gateway)
            .is_some_and(|r| r.status.is_unreachable())
    }

    /// The regions and their endpoints, in the order given.
    pub fn region_endpoints(&self) -> Vec<(String, String)> {
        self.regions
            .iter()
            .map(|r| (r.name.clone(), r.gateway.to_string()))
            .collect()
    }

    /// Serves every region on its listener (as [`bind_account`] returned them) until `shutdown`.
    pub async fn serve_regions(&self, listeners: Vec<TcpListener>, shutdown: CancellationToken) {
        let servers: Vec<_> = listeners
            .into_iter()
            .zip(self.regions.iter())
            .map(|(listener, region)| {
                let emulator = self.clone();
                let gateway = region.gateway.clone();
                let shutdown = shutdown.clone();
                tokio::spawn(async move { emulator.serve_at(listener, gateway, shutdown).await })
            })
            .collect();
        for server in servers {
            let _ = server.await;
        }
    }
}

/// A refusal of the SDK emulator's region operations (unknown, offline or last region): 400.
fn region_error(error: azure_data_cosmos_driver::error::CosmosError) -> EmulatorError {
    let message = error.to_string();
    // The driver's message starts with its status ("400: ..."), which the answer carries anyway.
    EmulatorError::BadRequest(message.strip_prefix("400: ").unwrap_or(&message).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throughput_bucket_is_read_from_its_flag_and_a_bad_one_is_named() {
        let bucket: BucketSpec = "db/items:2=25".parse().expect("a bucket");
        assert_eq!((bucket.database.as_str(), bucket.container.as_str()), ("db", "items"));
        assert_eq!((bucket.bucket, bucket.percent), (2, 25.0));
        assert_eq!(
            "db/items:5=100%".parse::<BucketSpec>().map(|b| b.percent).ok(),
            Some(100.0)
        );
        for bad in [
            "db/items=25",
            "db/items:6=25",
            "db/items:0=25",
            "db/items:1=0",
            "db/items:1=101",
            "items:1=5",
        ] {
            let error = bad.parse::<BucketSpec>().expect_err(bad).to_string();
            assert!(error.contains("database/container:bucket=percent"), "{bad}: {error}");
        }
    }

    #[test]
    fn parses_throughput_specs() {
        let spec: ThroughputSpec = "db/leases=400".parse().unwrap();
        assert_eq!(
            (spec.database.as_str(), spec.container.as_str(), spec.ru_per_second),
            ("db", "leases", 400)
        );
        for bad in [
            "db/leases",
            "db/leases=399",
            "db/leases=x",
            "leases=400",
            "db/=400",
            "a/b/c=400",
        ] {
            assert!(bad.parse::<ThroughputSpec>().is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn regions_need_distinct_names_and_endpoints() {
        assert!(endpoints(&[("East US", "http://127.0.0.1:1/"), ("West US", "http://127.0.0.1:2/")]).is_ok());
        assert!(endpoints(&[("East US", "http://127.0.0.1:1/"), ("east us", "http://127.0.0.1:2/")]).is_err());
        assert!(endpoints(&[("East US", "http://127.0.0.1:1/"), ("West US", "http://127.0.0.1:1/")]).is_err());
        assert!(endpoints(&[(" ", "http://127.0.0.1:1/")]).is_err());
    }
}
