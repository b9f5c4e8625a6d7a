//! The lease store on a Cosmos container: leases, markers (`.info`, `.lock`, `.claim`) and
//! instance heartbeats of one processor, every update conditional on the document's ETag.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use time::OffsetDateTime;

use crate::cosmos::{DocumentContainer, ErrorKind};
use crate::processor::leases::lease::{
    Beat, HeartbeatDoc, Lease, LeaseSnapshot, LeaseStore, LeaseStoreError, LockAttempt,
};
use crate::processor::leases::lease_ids::{IdKind, classify, prefixes_nest};
use crate::processor::leases::writer_clocks::{self, ClockStamp};

/// The part of a lease prefix shared by one processor's lease sets on every container of the
/// account (`{processorName}{accountHost}_`): the prefix without its database and container rids.
pub(crate) fn processor_family(prefix: &str) -> Option<&str> {
    let mut cut = prefix.rsplitn(3, '_');
    let (_, _, family) = (cut.next()?, cut.next()?, cut.next()?);
    Some(&prefix[..family.len() + 1])
}

/// The lease-id prefix of the .NET v3 SDK: `{processorName}{accountHost}_{databaseRid}_{containerRid}`.
pub fn lease_prefix(processor: &str, account_host: &str, database_rid: &str, container_rid: &str) -> String {
    format!("{processor}{account_host}_{database_rid}_{container_rid}")
}

/// The lease store on a Cosmos container partitioned on `/id` (or `/partitionKey` holding the id).
pub struct CosmosLeaseStore {
    container: DocumentContainer,
    prefix: String,
    pk_is_id: bool,
}

impl CosmosLeaseStore {
    /// A store for the leases with `prefix` in `container`. Fails when the container's partition
    /// key is neither `/id` nor `/partitionKey`.
    pub fn new(container: DocumentContainer, prefix: String) -> Result<Self, LeaseStoreError> {
        let pk_is_id = match container.partition_key_paths() {
            [p] if p == "/id" => true,
            [p] if p == "/partitionKey" => false,
            other => {
                return Err(LeaseStoreError::Misconfigured(format!(
                    "the lease container must be partitioned on /id (or /partitionKey), but its partition key is {}",
                    if other.is_empty() {
                        "missing".to_owned()
                    } else {
                        other.join(",")
                    }
                )));
            }
        };
        Ok(Self {
            container,
            prefix,
            pk_is_id,
        })
    }

    /// Deletes this processor's leases, heartbeats and markers but its claim (which its holder
    /// deletes last, at the version it holds: [`CosmosLeaseStore::delete_marker`]); documents
    /// that only start with the prefix are another processor's and stay. Returns how many.
    pub async fn delete_all_but_claim(&self) -> Result<usize, LeaseStoreError> {
        let ours = format!("{}.", self.prefix);
        let mut deleted = 0;
        for doc in self.container.list_by_id_prefix(&ours).await? {
            let Some(id) = doc.body.get("id").and_then(Value::as_str) else {
                continue;
            };
            if matches!(classify(&self.prefix, id), IdKind::Foreign | IdKind::Marker("claim")) {
                continue;
            }
            self.container.delete(id, id, None).await?;
            deleted += 1;
        }
        Ok(deleted)
    }

    /// Deletes the marker `{prefix}.{name}` at version `etag` ([`LeaseStoreError::Changed`] when
    /// it changed since; nothing when it is gone).
    pub async fn delete_marker(&self, name: &str, etag: &str) -> Result<(), LeaseStoreError> {
        let id = self.marker_id(name);
        match self.container.delete(&id, &id, Some(etag)).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind == ErrorKind::PreconditionFailed => Err(LeaseStoreError::Changed(id)),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether another claim in the lease container (`{prefix}.claim`) has a prefix that nests
    /// with this one (either extends the other): the two lease sets' listings would overlap.
    pub async fn claim_nests(&self) -> Result<bool, LeaseStoreError> {
        let claims = self.container.list_by_id_suffix(".claim").await?;
        Ok(claims.iter().any(|doc| {
            doc.body
                .get("id")
                .and_then(Value::as_str)
                .and_then(|id| id.strip_suffix(".claim"))
                .is_some_and(|prefix| prefixes_nest(prefix, &self.prefix))
        }))
    }

    /// How many documents of the lease container have ids starting with `prefix` (another
    /// processor's leases, say).
    pub async fn count_with_prefix(&self, prefix: &str) -> Result<usize, LeaseStoreError> {
        Ok(self.container.list_by_id_prefix(prefix).await?.len())
    }

    /// Creates `body` (a document with an `id`, another processor's lease) in the lease
    /// container; [`LeaseStoreError::Changed`] when its id exists.
    pub async fn create_document(&self, body: &Value) -> Result<(), LeaseStoreError> {
        let id = body.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
        let body = self.marker(id.clone(), body.clone());
        match self.container.create(&id, &body).await {
            Ok(_) => Ok(()),
            Err(e) if e.kind == ErrorKind::Conflict => Err(LeaseStoreError::Changed(id)),
            Err(e) => Err(e.into()),
        }
    }

    /// Reads the marker document `{prefix}.{name}`: its body and version.
    pub async fn read_marker(&self, name: &str) -> Result<Option<(Value, String)>, LeaseStoreError> {
        let id = self.marker_id(name);
        Ok(self.container.read(&id, &id).await?.map(|doc| (doc.body, doc.etag)))
    }

    /// Writes the marker document `{prefix}.{name}` with the fields of `body`: created when
    /// `etag` is `None` ([`LeaseStoreError::Changed`] when it exists), else replaced only at
    /// that version ([`LeaseStoreError::Changed`] / [`LeaseStoreError::Gone`]).
    pub async fn write_marker(&self, name: &str, body: Value, etag: Option<&str>) -> Result<(), LeaseStoreError> {
        let id = self.marker_id(name);
        let body = self.marker(id.clone(), body);
        let written = match etag {
            None => self.container.create(&id, &body).await,
            Some(etag) => self.container.replace(&id, &body, etag).await,
        };
        match written {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.kind, ErrorKind::Conflict | ErrorKind::PreconditionFailed) => {
                Err(LeaseStoreError::Changed(id))
            }
            Err(e) if e.kind == ErrorKind::NotFound && etag.is_some() => Err(LeaseStoreError::Gone(id)),
            Err(e) => Err(e.into()),
        }
    }

    /// Replaces `lease` (If-Match its ETag); `deferrable`: as a write that can wait.
    async fn replace_as(&self, lease: &Lease, deferrable: bool) -> Result<Lease, LeaseStoreError> {
        let body = self.body(lease)?;
        let written = if deferrable {
            self.container.replace_deferrable(&lease.id, &body, &lease.etag).await
        } else {
            self.container.replace(&lease.id, &body, &lease.etag).await
        };
        match written {
            Ok(doc) => {
                let mut replaced = lease.clone();
                replaced.etag = doc.etag;
                Ok(replaced)
            }
            Err(e) if e.kind == ErrorKind::PreconditionFailed => Err(LeaseStoreError::Changed(lease.id.clone())),
            Err(e) if e.kind == ErrorKind::NotFound => Err(LeaseStoreError::Gone(lease.id.clone())),
            Err(e) => Err(e.into()),
        }
    }

    fn marker_id(&self, name: &str) -> String {
        format!("{}.{name}", self.prefix)
    }

    fn heartbeat_id(&self, instance: &str) -> String {
        format!("{}.instance.{instance}", self.prefix)
    }

    fn body(&self, lease: &Lease) -> Result<Value, LeaseStoreError> {
        let mut lease = lease.clone();
        lease.writer_clock = Some(writer_clocks::stamp_now());
        if !self.pk_is_id {
            lease.partition_key = Some(lease.id.clone());
        }
        serde_json::to_value(&lease).map_err(|e| LeaseStoreError::Invalid {
            id: lease.id.clone(),
            reason: e.to_string(),
        })
    }

    fn marker(&self, id: String, extra: Value) -> Value {
        let mut body = serde_json::json!({ "id": id });
        if !self.pk_is_id {
            body["partitionKey"] = Value::String(id.clone());
        }
        if let (Some(map), Value::Object(extra)) = (body.as_object_mut(), extra) {
            map.extend(extra);
        }
        body
    }

    async fn create_marker(&self, id: String, extra: Value) -> Result<Option<String>, LeaseStoreError> {
        let body = self.marker(id.clone(), extra);
        match self.container.create(&id, &body).await {
            Ok(doc) => Ok(Some(doc.etag)),
            Err(e) if e.kind == ErrorKind::Conflict => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

pub(crate) fn parse_lease(mut body: Value, etag: String) -> Result<Lease, LeaseStoreError> {
    let id = body.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
    crate::processor::leases::lease::read_v2_names(&mut body);
    let mut lease: Lease = serde_json::from_value(body).map_err(|e| LeaseStoreError::Invalid {
        id,
        reason: e.to_string(),
    })?;
    if lease.etag.is_empty() {
        lease.etag = etag;
    }
    Ok(lease)
}

/// The heartbeat field that says how the instance keeps its leases alive.
const LIVENESS_FIELD: &str = "liveness";
/// Its value for an instance whose heartbeat keeps all its leases alive.
const LIVENESS_INSTANCE: &str = "instance";
/// The heartbeat field that says the instance is stopping (`true`).
const LEAVING_FIELD: &str = "leaving";
/// The heartbeat field that names the process running under the instance name.
const INCARNATION_FIELD: &str = "incarnation";
/// The heartbeat field with the UID of the pod the instance runs in.
const POD_FIELD: &str = "podUid";
/// The heartbeat field that stamps it by its process's own clock ([`writer_clocks`]).
const WRITER_CLOCK_FIELD: &str = "writerClock";
/// The bootstrap lock's field naming the process that holds it ([`lock_process`]).
const LOCK_PROCESS_FIELD: &str = "process";
/// The bootstrap lock's field saying how often (milliseconds) its holder rewrites it.
const LOCK_RENEWAL_FIELD: &str = "renewedEveryMs";

/// The bootstrap lock of `owner`, rewritten every `renewal`: stamped now, by this process.
fn lock_body(owner: &str, renewal: Duration) -> Value {
    let stamp = now()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let renewal = u64::try_from(renewal.as_millis()).unwrap_or(u64::MAX);
    // `ttl` lets the service remove a dead holder's lock where the container expires documents.
    serde_json::json!({"Owner": owner, LOCK_PROCESS_FIELD: lock_process(), LOCK_RENEWAL_FIELD: renewal, "timestamp": stamp, "ttl": 30})
}

/// How often the holder of the bootstrap lock `body` says it rewrites it.
fn lock_renewal(body: &Value) -> Option<Duration> {
    body.get(LOCK_RENEWAL_FIELD)
        .and_then(Value::as_u64)
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
}

/// This process, as the bootstrap locks it takes name it: random, new at every start, so that
/// two processes of one instance name never take each other's lock for their own.
fn lock_process() -> &'static str {
    static PROCESS: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PROCESS.get_or_init(|| format!("{:016x}", fastrand::u64(..)))
}

/// Records the heartbeat document `body` of `instance` in `snapshot` (one without a readable
/// time is no heartbeat).
fn record_heartbeat(snapshot: &mut LeaseSnapshot, instance: &str, body: &Value) {
    let beat = body
        .get("timestamp")
        .and_then(Value::as_str)
        .and_then(|t| OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok());
    let Some(beat) = beat else { return };
    if body.get(LIVENESS_FIELD).and_then(Value::as_str) == Some(LIVENESS_INSTANCE) {
        snapshot.keepers.push(instance.to_owned());
    }
    if body.get(LEAVING_FIELD).and_then(Value::as_bool) == Some(true) {
        snapshot.leaving.push(instance.to_owned());
    }
    let stamp = body
        .get(WRITER_CLOCK_FIELD)
        .cloned()
        .map(serde_json::from_value::<ClockStamp>);
    if let Some(Ok(stamp)) = stamp {
        snapshot.heartbeat_clocks.insert(instance.to_owned(), stamp);
    }
    snapshot.instances.push((instance.to_owned(), beat));
}

fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

#[async_trait]
impl LeaseStore for CosmosLeaseStore {
    fn prefix(&self) -> &str {
        &self.prefix
    }

    fn request_charge(&self) -> f64 {
        self.container.request_charge()
    }

    async fn provisioned_throughput(&self) -> Result<Option<u64>, LeaseStoreError> {
        Ok(self.container.provisioned_throughput().await?)
    }

    async fn snapshot(&self) -> Result<LeaseSnapshot, LeaseStoreError> {
        let docs = self.container.list_by_id_prefix(&format!("{}.", self.prefix)).await?;
        let mut snapshot = LeaseSnapshot::default();
        for doc in docs {
            let ts = doc.body.get("_ts").and_then(Value::as_i64);
            snapshot.newest_server_ts = snapshot.newest_server_ts.max(ts);
            let id = doc
                .body
                .get("id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            match classify(&self.prefix, &id) {
                IdKind::Lease(token) => {
                    // One malformed document must not stop the whole processor: skip and report it.
                    match parse_lease(doc.body, doc.etag) {
                        Ok(lease) if lease.lease_token != token => {
                            let why = format!("its LeaseToken {:?} is not its id's {token:?}", lease.lease_token);
                            snapshot.invalid.push((id, why));
                        }
                        // A partition-key-range lease (.NET v2, v3 version 0) under our prefix: not
                        // processed as such; the bootstrap adopts its checkpoint.
                        Ok(lease) if lease.range().is_none() => snapshot.pk_range_leases.push(lease),
                        Ok(lease) => snapshot.leases.push(lease),
                        Err(LeaseStoreError::Invalid { reason, .. }) => snapshot.invalid.push((id, reason)),
                        Err(error) => snapshot.invalid.push((id, error.to_string())),
                    }
                }
                IdKind::Heartbeat(instance) => record_heartbeat(&mut snapshot, instance, &doc.body),
                IdKind::Marker("info") => {
                    snapshot.initialized = true;
                    snapshot.leases_per_partition = doc
                        .body
                        .get("leasesPerPartition")
                        .and_then(Value::as_u64)
                        .and_then(|k| u32::try_from(k).ok());
                }
                IdKind::Marker(_) => snapshot.markers += 1,
                IdKind::Foreign => {
                    let why = "not this processor's: its id only starts with the lease prefix".to_owned();
                    snapshot.invalid.push((id, why));
                }
            }
        }
        snapshot.leases.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(snapshot)
    }

    async fn read(&self, id: &str) -> Result<Option<Lease>, LeaseStoreError> {
        match self.container.read(id, id).await? {
            Some(doc) => Ok(Some(parse_lease(doc.body, doc.etag)?)),
            None => Ok(None),
        }
    }

    async fn create(&self, lease: &Lease) -> Result<Option<Lease>, LeaseStoreError> {
        let body = self.body(lease)?;
        match self.container.create(&lease.id, &body).await {
            Ok(doc) => {
                let mut created = lease.clone();
                created.etag = doc.etag;
                Ok(Some(created))
            }
            Err(e) if e.kind == ErrorKind::Conflict => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn replace(&self, lease: &Lease) -> Result<Lease, LeaseStoreError> {
        self.replace_as(lease, false).await
    }

    async fn replace_deferrable(&self, lease: &Lease) -> Result<Lease, LeaseStoreError> {
        self.replace_as(lease, true).await
    }

    async fn delete(&self, lease: &Lease) -> Result<(), LeaseStoreError> {
        match self.container.delete(&lease.id, &lease.id, Some(&lease.etag)).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind == ErrorKind::PreconditionFailed => Err(LeaseStoreError::Changed(lease.id.clone())),
            Err(e) => Err(e.into()),
        }
    }

    async fn try_lock(&self, owner: &str, renewal: Duration) -> Result<LockAttempt, LeaseStoreError> {
        let id = self.marker_id("lock");
        let body = lock_body(owner, renewal);
        if let Some(etag) = self.create_marker(id.clone(), body.clone()).await? {
            return Ok(LockAttempt::Taken { etag });
        }
        Ok(match self.container.read(&id, &id).await? {
            // This very process's, left by an attempt that did not finish (dropped on a
            // timeout; the bootstrap runs one attempt a prefix at a time): rewritten, so that
            // instances waiting for it to look abandoned start counting again.
            Some(doc)
                if doc.body.get(LOCK_PROCESS_FIELD).and_then(Value::as_str) == Some(lock_process())
                    && doc.body.get("Owner").and_then(Value::as_str) == Some(owner) =>
            {
                let body = self.marker(id.clone(), body);
                match self.container.replace(&id, &body, &doc.etag).await {
                    Ok(doc) => LockAttempt::Retaken { etag: doc.etag },
                    Err(e) if matches!(e.kind, ErrorKind::PreconditionFailed | ErrorKind::NotFound) => {
                        LockAttempt::Free
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Some(doc) => LockAttempt::Held {
                renewed_every: lock_renewal(&doc.body),
                etag: doc.etag,
            },
            // Removed meanwhile: free again.
            None => LockAttempt::Free,
        })
    }

    async fn break_lock(&self, etag: &str) -> Result<(), LeaseStoreError> {
        let id = self.marker_id("lock");
        match self.container.delete(&id, &id, Some(etag)).await {
            Err(e) if !matches!(e.kind, ErrorKind::PreconditionFailed | ErrorKind::NotFound) => Err(e.into()),
            _ => Ok(()),
        }
    }

    async fn renew_lock(&self, owner: &str, renewal: Duration, etag: &str) -> Result<Option<String>, LeaseStoreError> {
        let id = self.marker_id("lock");
        let body = self.marker(id.clone(), lock_body(owner, renewal));
        match self.container.replace(&id, &body, etag).await {
            Ok(doc) => Ok(Some(doc.etag)),
            Err(e) if matches!(e.kind, ErrorKind::PreconditionFailed | ErrorKind::NotFound) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn unlock(&self, etag: &str) -> Result<(), LeaseStoreError> {
        let id = self.marker_id("lock");
        match self.container.delete(&id, &id, Some(etag)).await {
            Err(e) if e.kind == ErrorKind::PreconditionFailed => {
                tracing::warn!(
                    "the bootstrap lock was taken over by another instance while this one bootstrapped: left to it"
                );
                Ok(())
            }
            Err(e) if e.kind == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
            Ok(()) => Ok(()),
        }
    }

    async fn mark_initialized(&self, monitored: &str, leases_per_partition: u32) -> Result<(), LeaseStoreError> {
        self.create_marker(
            self.marker_id("info"),
            serde_json::json!({ "monitored": monitored, "leasesPerPartition": leases_per_partition }),
        )
        .await?;
        Ok(())
    }

    async fn foreign_documents(&self, prefix: &str) -> Result<Vec<Value>, LeaseStoreError> {
        // Our EPK leases are not foreign; partition-key-range leases under our prefix (a .NET
        // v2 processor of the same name) are.
        let ours = format!("{}.", self.prefix);
        Ok(self
            .container
            .list_by_id_prefix(prefix)
            .await?
            .into_iter()
            .map(|doc| doc.body)
            .filter(|body| {
                let id = body.get("id").and_then(Value::as_str).unwrap_or_default();
                !(id.starts_with(&ours) && body.get("FeedRange").is_some())
            })
            .collect())
    }

    async fn earlier_incarnation(&self, monitored: &str) -> Result<bool, LeaseStoreError> {
        let Some(family) = processor_family(&self.prefix) else {
            return Ok(false);
        };
        let ours = self.marker_id("info");
        let markers = self.container.list_by_field("monitored", monitored).await?;
        Ok(markers.iter().any(|doc| {
            doc.body
                .get("id")
                .and_then(Value::as_str)
                .is_some_and(|id| id != ours && id.starts_with(family) && id.ends_with(".info"))
        }))
    }

    async fn heartbeat(&self, beat: &Beat<'_>) -> Result<String, LeaseStoreError> {
        let id = self.heartbeat_id(beat.instance);
        let stamp = now()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        let mut extra = serde_json::json!({
            "Owner": beat.instance, "timestamp": stamp, INCARNATION_FIELD: beat.incarnation,
        });
        if let Ok(stamp) = serde_json::to_value(writer_clocks::stamp_now()) {
            extra[WRITER_CLOCK_FIELD] = stamp;
        }
        if beat.keeps_leases {
            extra[LIVENESS_FIELD] = Value::String(LIVENESS_INSTANCE.into());
        }
        if beat.leaving {
            extra[LEAVING_FIELD] = Value::Bool(true);
        }
        if let Some(pod) = beat.pod {
            extra[POD_FIELD] = Value::String(pod.to_owned());
        }
        let body = self.marker(id.clone(), extra);
        let written = match beat.if_match {
            None => self.container.create(&id, &body).await,
            Some(etag) => self.container.replace(&id, &body, etag).await,
        };
        match written {
            Ok(doc) => Ok(doc.etag),
            Err(e) if matches!(e.kind, ErrorKind::Conflict | ErrorKind::PreconditionFailed) => {
                Err(LeaseStoreError::Changed(id))
            }
            Err(e) if e.kind == ErrorKind::NotFound && beat.if_match.is_some() => Err(LeaseStoreError::Gone(id)),
            Err(e) => Err(e.into()),
        }
    }

    async fn read_heartbeat(&self, instance: &str) -> Result<Option<HeartbeatDoc>, LeaseStoreError> {
        let id = self.heartbeat_id(instance);
        Ok(self.container.read(&id, &id).await?.map(|doc| HeartbeatDoc {
            incarnation: doc
                .body
                .get(INCARNATION_FIELD)
                .and_then(Value::as_str)
                .map(str::to_owned),
            pod: doc.body.get(POD_FIELD).and_then(Value::as_str).map(str::to_owned),
            written: doc
                .body
                .get("timestamp")
                .and_then(Value::as_str)
                .and_then(|t| OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()),
            etag: doc.etag,
        }))
    }

    async fn remove_heartbeat(&self, instance: &str, if_match: Option<&str>) -> Result<(), LeaseStoreError> {
        let id = self.heartbeat_id(instance);
        match self.container.delete(&id, &id, if_match).await {
            Err(e) if !matches!(e.kind, ErrorKind::PreconditionFailed | ErrorKind::NotFound) => Err(e.into()),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_processor_family_drops_the_rids() {
        let prefix = lease_prefix("orders", "acct.documents.azure.com", "KmhJAA==", "KmhJAOkGgKQ=");
        assert_eq!(processor_family(&prefix), Some("ordersacct.documents.azure.com_"));
        assert_eq!(processor_family("no-underscores"), None);
    }
}
