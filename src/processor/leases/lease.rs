//! Lease documents (the .NET v3 layout) and the lease store: the lease container of one processor,
//! where every update is a conditional replace on the document's ETag.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;

use crate::cosmos::{CosmosError, EpkRange, StartFrom};
use crate::processor::leases::writer_clocks::ClockStamp;

/// The `Mode` the .NET SDK writes for latest-version leases.
pub const INCREMENTAL_MODE: &str = "Incremental Feed";

/// The `FeedRange` field of an EPK lease: `{"Range":{"min":"...","max":"..."}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseFeedRange {
    /// The EPK range.
    #[serde(rename = "Range")]
    pub range: EpkRange,
}

/// One lease document: ownership and progress of one feed range.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lease {
    /// Document id: `{prefix}..{lease token}`.
    pub id: String,
    /// Lease schema version: 0 for a lease over one whole physical partition, named by its
    /// partition key range id (as the .NET bootstrap writes them), 1 for EPK-range leases.
    #[serde(default)]
    pub version: u32,
    /// `"{min}-{max}"` of the range.
    #[serde(rename = "LeaseToken")]
    pub lease_token: String,
    /// The EPK range this lease covers.
    #[serde(rename = "FeedRange", default, skip_serializing_if = "Option::is_none")]
    pub feed_range: Option<LeaseFeedRange>,
    /// The instance that owns the lease, or none.
    #[serde(rename = "Owner", default)]
    pub owner: Option<String>,
    /// The owner's epoch: a value written by every acquisition, unique to one process's ownership
    /// of this lease (an addition of ours, ignored by other readers). Writes by an owner hold
    /// only while it is theirs: a task whose epoch is gone never writes again, whatever the
    /// `Owner` name says (two processes with one name, a lease that came back to the name).
    #[serde(rename = "ownerEpoch", default, skip_serializing_if = "Option::is_none")]
    pub owner_epoch: Option<String>,
    /// The raw server continuation of the range after the last checkpoint.
    #[serde(rename = "ContinuationToken", default)]
    pub continuation: Option<String>,
    /// Free-form properties (copied to child leases on a split).
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Change feed mode.
    #[serde(rename = "Mode", default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Client time of the last update.
    #[serde(default, with = "ticks_rfc3339")]
    pub timestamp: Option<OffsetDateTime>,
    /// Client time of the last checkpoint (an addition of ours; the .NET SDK ignores it).
    #[serde(
        rename = "checkpointTime",
        default,
        skip_serializing_if = "Option::is_none",
        with = "ticks_rfc3339"
    )]
    pub checkpoint_time: Option<OffsetDateTime>,
    /// Partition key value, for lease containers partitioned on `/partitionKey`.
    #[serde(rename = "partitionKey", default, skip_serializing_if = "Option::is_none")]
    pub partition_key: Option<String>,
    /// When the writer of this version stamped it, by its own process's clock (an addition of
    /// ours: lets other instances date the write without comparing wall clocks).
    #[serde(rename = "writerClock", default, skip_serializing_if = "Option::is_none")]
    pub writer_clock: Option<ClockStamp>,
    /// Server time of the last update, in seconds since the epoch (read only).
    #[serde(rename = "_ts", default, skip_serializing)]
    pub server_ts: Option<i64>,
    /// The ETag of the version this copy was read or written as (read only).
    #[serde(rename = "_etag", default, skip_serializing)]
    pub etag: String,
}

/// Lease property: the instance that asked the live owner to hand the lease over (balancing
/// without redelivery: the owner finishes and checkpoints its batch, then writes the requester as
/// owner).
pub const HANDOFF_TO_PROPERTY: &str = "handoffTo";
/// Lease property: when the handoff was asked for (RFC 3339, the requester's clock).
pub const HANDOFF_REQUESTED_PROPERTY: &str = "handoffRequestedAt";
/// Lease property: the owner accepted the request and drains its batches in flight (RFC 3339,
/// the owner's clock, written anew while it drains): the requester waits while it changes.
pub const HANDOFF_ACKNOWLEDGED_PROPERTY: &str = "handoffAcknowledgedAt";

/// Lease property: where a lease without a continuation starts, when not where the processor's
/// options say (`beginning`: the leases of a container created again, all of it new).
pub const START_FROM_PROPERTY: &str = "startFrom";

/// Lease property: the lease's handler keeps failing (since when, and its error); set while the
/// lease halts on a batch, removed when it goes on.
pub const HANDLER_FAILING_PROPERTY: &str = "handlerFailing";

/// Lease property: the lease stalled (which instance, since when, what its reader was doing);
/// set when a stall is detected, removed by the next checkpoint or when the lease goes on.
pub const STALLED_PROPERTY: &str = "stalled";

impl Lease {
    /// Where reading starts while the lease has no continuation: its own `startFrom` property
    /// (`beginning` or an RFC 3339 time, as a rewind writes it), else `default` (the processor's
    /// start position).
    pub fn start_from(&self, default: StartFrom) -> StartFrom {
        match self.properties.get(START_FROM_PROPERTY).map(|s| s.parse::<StartFrom>()) {
            Some(Ok(start @ (StartFrom::Beginning | StartFrom::Time(_)))) => start,
            _ => default,
        }
    }

    /// Makes the lease read its range from the beginning until it has a continuation.
    pub fn start_from_beginning(mut self) -> Self {
        self.properties.insert(START_FROM_PROPERTY.into(), "beginning".into());
        self
    }

    /// The pending handoff request: the requester and when it asked.
    pub fn handoff_request(&self) -> Option<(&str, OffsetDateTime)> {
        let to = self.properties.get(HANDOFF_TO_PROPERTY)?;
        let at = self.properties.get(HANDOFF_REQUESTED_PROPERTY)?;
        let at = OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).ok()?;
        Some((to.as_str(), at))
    }

    /// Records that `to` asks for the lease, at `at`.
    pub fn request_handoff(&mut self, to: &str, at: OffsetDateTime) {
        let at = at
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        self.properties.insert(HANDOFF_TO_PROPERTY.into(), to.to_owned());
        self.properties.insert(HANDOFF_REQUESTED_PROPERTY.into(), at);
    }

    /// Removes a handoff request (and its acknowledgement).
    pub fn clear_handoff(&mut self) {
        self.properties.remove(HANDOFF_TO_PROPERTY);
        self.properties.remove(HANDOFF_REQUESTED_PROPERTY);
        self.properties.remove(HANDOFF_ACKNOWLEDGED_PROPERTY);
    }

    /// When the owner last acknowledged the pending handoff request, as it wrote it.
    pub fn handoff_acknowledged(&self) -> Option<&str> {
        self.properties.get(HANDOFF_ACKNOWLEDGED_PROPERTY).map(String::as_str)
    }

    /// Acknowledges the pending handoff request at `at`: the owner drains, then hands over.
    /// (Written on the lease as it is now: an owner's copy of an idle lease may predate the
    /// request, and the write's If-Match then applies it to the current document.)
    pub fn acknowledge_handoff(&mut self, at: OffsetDateTime) {
        let at = at
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        self.properties.insert(HANDOFF_ACKNOWLEDGED_PROPERTY.into(), at);
    }

    /// A new, unowned lease over `range`.
    pub fn new(prefix: &str, range: &EpkRange, continuation: Option<String>) -> Self {
        let token = range.lease_token();
        Self {
            id: format!("{prefix}..{token}"),
            version: 1,
            lease_token: token,
            feed_range: Some(LeaseFeedRange { range: range.clone() }),
            owner: None,
            owner_epoch: None,
            continuation,
            properties: BTreeMap::new(),
            mode: Some(INCREMENTAL_MODE.to_owned()),
            timestamp: None,
            checkpoint_time: None,
            partition_key: None,
            writer_clock: None,
            server_ts: None,
            etag: String::new(),
        }
    }

    /// A new, unowned lease over one whole physical partition, as the .NET processor's bootstrap
    /// writes it (version 0): named by the partition key range id `pk_range_id` (what KEDA's
    /// scaler, the Functions trigger and the Java processor's partition-key-range leases read),
    /// with the partition's EPK range as its `FeedRange`.
    pub fn for_partition(prefix: &str, pk_range_id: &str, range: &EpkRange, continuation: Option<String>) -> Self {
        Self {
            id: format!("{prefix}..{pk_range_id}"),
            version: 0,
            lease_token: pk_range_id.to_owned(),
            ..Self::new(prefix, range, continuation)
        }
    }

    /// Whether this is a version-0 lease (named by a partition key range id).
    pub fn names_a_partition(&self) -> bool {
        self.version == 0
    }

    /// The same lease (owner, continuation, properties, mode) under another form: version 0
    /// named by `pk_range_id`, or (with `None`) an EPK lease named by its range — a new
    /// document id, unwritten.
    pub fn reshaped(&self, pk_range_id: Option<&str>) -> Option<Self> {
        let range = self.range()?;
        let prefix = self.id.strip_suffix(&format!("..{}", self.lease_token))?;
        let mut shaped = match pk_range_id {
            Some(id) => Self::for_partition(prefix, id, range, None),
            None => Self::new(prefix, range, None),
        };
        shaped.owner.clone_from(&self.owner);
        shaped.owner_epoch.clone_from(&self.owner_epoch);
        shaped.continuation.clone_from(&self.continuation);
        shaped.properties.clone_from(&self.properties);
        shaped.mode.clone_from(&self.mode);
        shaped.timestamp = self.timestamp;
        shaped.checkpoint_time = self.checkpoint_time;
        Some(shaped)
    }

    /// Makes `owner` the lease's owner, in the ownership `epoch` (a new one for every acquisition).
    pub fn take_for(&mut self, owner: &str, epoch: String) {
        self.owner = Some(owner.to_owned());
        self.owner_epoch = Some(epoch);
    }

    /// Whether the lease is `owner`'s in ownership `epoch` (a lease written before epochs, or by
    /// a version that writes none, matches an ownership that has none).
    pub fn is_held_by(&self, owner: &str, epoch: Option<&str>) -> bool {
        self.owner.as_deref() == Some(owner) && self.owner_epoch.as_deref() == epoch
    }

    /// The EPK range of the lease (`None` for version-0 leases, which name a partition key range
    /// id instead).
    pub fn range(&self) -> Option<&EpkRange> {
        self.feed_range.as_ref().map(|f| &f.range)
    }

    /// Whether the lease is free to take: no owner, or not renewed within `expiration`.
    pub fn is_expired(&self, now: OffsetDateTime, expiration: std::time::Duration) -> bool {
        self.renewed_at().is_none_or(|last| last + expiration < now)
    }

    /// When the owner last renewed the lease (its timestamp, else the server's `_ts`); `None`
    /// for a lease without an owner or without either time (free to take).
    pub fn renewed_at(&self) -> Option<OffsetDateTime> {
        if self.owner.as_deref().is_none_or(str::is_empty) {
            return None;
        }
        self.timestamp.or_else(|| {
            self.server_ts
                .and_then(|ts| OffsetDateTime::from_unix_timestamp(ts).ok())
        })
    }
}

/// Errors of lease store operations.
#[derive(Debug, thiserror::Error)]
pub enum LeaseStoreError {
    /// The lease was changed by someone else since it was read (412).
    #[error("lease {0} was changed by another writer")]
    Changed(String),
    /// The lease no longer exists (404).
    #[error("lease {0} no longer exists")]
    Gone(String),
    /// The lease container is not usable as configured.
    #[error("{0}")]
    Misconfigured(String),
    /// A Cosmos request failed.
    #[error(transparent)]
    Cosmos(#[from] CosmosError),
    /// The lease container's budget held a write that could wait back for its whole patience:
    /// it was not sent (an acquisition is left for the next acquire cycle).
    #[error("the lease container's budget held the write back; it was not sent")]
    HeldBack,
    /// A lease document could not be parsed.
    #[error("lease document {id} is not a valid lease: {reason}")]
    Invalid {
        /// The document id.
        id: String,
        /// What is wrong.
        reason: String,
    },
}

impl LeaseStoreError {
    /// Whether retrying later can succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, LeaseStoreError::HeldBack) || matches!(self, LeaseStoreError::Cosmos(e) if e.kind.is_retryable())
    }

    /// Whether the lease container refused the request for its provisioned throughput (429), or
    /// this instance's share of it held the request back ([`LeaseStoreError::HeldBack`]).
    pub fn is_throttled(&self) -> bool {
        matches!(self, LeaseStoreError::HeldBack) || matches!(self, LeaseStoreError::Cosmos(e) if e.is_throttled())
    }

    /// How long the lease container asked to wait before the request is sent again.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            LeaseStoreError::Cosmos(e) => e.retry_after(),
            _ => None,
        }
    }

    /// Whether the lease container itself does not exist (a request on it answered 404).
    pub fn is_container_missing(&self) -> bool {
        matches!(self, LeaseStoreError::Cosmos(e) if e.kind == crate::cosmos::ErrorKind::NotFound)
    }
}

/// Everything of one processor in the lease container, read in one query.
#[derive(Debug, Clone, Default)]
pub struct LeaseSnapshot {
    /// The leases, one per feed range.
    pub leases: Vec<Lease>,
    /// Instances that announced themselves (see [`LeaseStore::heartbeat`]) with their last beat.
    pub instances: Vec<(String, OffsetDateTime)>,
    /// When each instance's heartbeat was stamped, by its process's own clock (heartbeats of
    /// versions that write no stamp are not named).
    pub heartbeat_clocks: HashMap<String, ClockStamp>,
    /// The instances among them whose heartbeat keeps their leases alive (it carries the
    /// liveness marker, see [`crate::processor::leases::heartbeat`]).
    pub keepers: Vec<String>,
    /// The instances among them whose heartbeat says they are stopping ([`Beat::leaving`]).
    pub leaving: Vec<String>,
    /// Whether the `.info` marker exists (bootstrap completed).
    pub initialized: bool,
    /// How many leases per physical partition the bootstrap created (from `.info`; `None` when
    /// it does not say, as for lease sets the .NET and Java processors write: one).
    pub leases_per_partition: Option<u32>,
    /// Partition-key-range leases (.NET v2, .NET v3 version 0) under the prefix: their
    /// checkpoints are adopted at bootstrap, they are not processed themselves.
    pub pk_range_leases: Vec<Lease>,
    /// Documents under the lease prefix that are not valid leases (id, what is wrong): skipped.
    pub invalid: Vec<(String, String)>,
    /// Other markers under the prefix (the bootstrap lock, the operator's claim): counted only.
    pub markers: usize,
    /// The newest server time (`_ts`, seconds) among the documents listed: the listing's "now"
    /// on the service's clock (heartbeats are written every renew interval), the same for every
    /// instance that reads it.
    pub newest_server_ts: Option<i64>,
}

/// The lease container of one processor. Every update is conditional on the lease's ETag.
#[async_trait]
pub trait LeaseStore: Send + Sync {
    /// The lease-id prefix of this processor.
    fn prefix(&self) -> &str;
    /// Reads all leases, instance heartbeats and the init marker.
    async fn snapshot(&self) -> Result<LeaseSnapshot, LeaseStoreError>;
    /// Reads one lease; `None` when it does not exist.
    async fn read(&self, id: &str) -> Result<Option<Lease>, LeaseStoreError>;
    /// Creates a lease; `None` when a lease with that id exists already.
    async fn create(&self, lease: &Lease) -> Result<Option<Lease>, LeaseStoreError>;
    /// Replaces a lease if its ETag is still `lease.etag`; returns the new version.
    async fn replace(&self, lease: &Lease) -> Result<Lease, LeaseStoreError>;
    /// Like [`LeaseStore::replace`], for a write that can wait (a checkpoint): at low priority,
    /// and a throttled write (429) is answered at once for the caller to send again later
    /// ([`crate::processor::budgets::writes`]). Stores without a budget just replace.
    async fn replace_deferrable(&self, lease: &Lease) -> Result<Lease, LeaseStoreError> {
        self.replace(lease).await
    }
    /// Deletes a lease if its ETag is still `lease.etag`.
    async fn delete(&self, lease: &Lease) -> Result<(), LeaseStoreError>;
    /// Creates the bootstrap lock for `owner`, saying it is rewritten every `renewal` while it is
    /// held, or says which version of it another instance holds.
    async fn try_lock(&self, owner: &str, renewal: Duration) -> Result<LockAttempt, LeaseStoreError>;
    /// Rewrites the bootstrap lock `owner` holds at version `etag` (see
    /// [`LeaseStore::try_lock`]); its new version, or `None` once it is no longer that one
    /// (another instance broke it and took it).
    async fn renew_lock(&self, owner: &str, renewal: Duration, etag: &str) -> Result<Option<String>, LeaseStoreError>;
    /// Removes the bootstrap lock if it is still at version `etag` (its holder died).
    async fn break_lock(&self, etag: &str) -> Result<(), LeaseStoreError>;
    /// Removes the bootstrap lock if it is still the version `etag` this instance took: one
    /// another instance broke and took meanwhile is left to it.
    async fn unlock(&self, etag: &str) -> Result<(), LeaseStoreError>;
    /// Writes the `.info` marker: the store is initialized, for the container named `monitored`
    /// (`database/container`), with `leases_per_partition` leases per physical partition.
    async fn mark_initialized(&self, monitored: &str, leases_per_partition: u32) -> Result<(), LeaseStoreError>;
    /// The documents (of other processors) whose id starts with `prefix`, read only.
    async fn foreign_documents(&self, prefix: &str) -> Result<Vec<Value>, LeaseStoreError>;
    /// Whether this processor initialized leases for an earlier container of the same name
    /// (`database/container`), since deleted and created again.
    async fn earlier_incarnation(&self, monitored: &str) -> Result<bool, LeaseStoreError>;
    /// Records that `beat.instance` is alive now, so that others count it before it owns any
    /// lease (see [`Beat`]); returns the heartbeat's new ETag. A beat without `if_match` creates
    /// the heartbeat and answers [`LeaseStoreError::Changed`] when one exists; one with it
    /// replaces that version only ([`LeaseStoreError::Changed`] / [`LeaseStoreError::Gone`]).
    async fn heartbeat(&self, beat: &Beat<'_>) -> Result<String, LeaseStoreError>;
    /// Reads the heartbeat of `instance`; `None` when there is none.
    async fn read_heartbeat(&self, instance: &str) -> Result<Option<HeartbeatDoc>, LeaseStoreError>;
    /// Removes the heartbeat of `instance` (graceful shutdown: only the version `if_match`, the
    /// instance's own; a stale one of another instance: any). A heartbeat already gone or
    /// written by someone else since is left as it is.
    async fn remove_heartbeat(&self, instance: &str, if_match: Option<&str>) -> Result<(), LeaseStoreError>;
    /// The lease container's provisioned request units a second (an autoscale container's
    /// maximum); `None` when it has no throughput of its own (it shares its database's, the
    /// account is serverless) or the store is not billed in request units.
    async fn provisioned_throughput(&self) -> Result<Option<u64>, LeaseStoreError> {
        Ok(None)
    }
    /// Request units charged for this store's requests so far (0 when the store is not billed
    /// in request units).
    fn request_charge(&self) -> f64 {
        0.0
    }
}

/// One heartbeat write of an instance.
#[derive(Debug, Clone, Copy)]
pub struct Beat<'a> {
    /// The instance name.
    pub instance: &'a str,
    /// The process that runs under that name now (random, new at every start): another
    /// process's heartbeat under the same name is seen for what it is.
    pub incarnation: &'a str,
    /// Whether the heartbeat carries the liveness marker: it keeps the instance's leases alive
    /// (see [`crate::processor::leases::heartbeat`]).
    pub keeps_leases: bool,
    /// Whether the instance is stopping: it releases its leases and takes none, and the others
    /// count it out of the fair shares.
    pub leaving: bool,
    /// The version this process wrote last (`None`: create it).
    pub if_match: Option<&'a str>,
    /// The UID of the pod the process runs in, when known.
    pub pod: Option<&'a str>,
}

/// An instance's heartbeat as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatDoc {
    /// The process that wrote it (`None`: a version that writes no incarnation).
    pub incarnation: Option<String>,
    /// The UID of the pod that process ran in (`None`: not known to it).
    pub pod: Option<String>,
    /// When that process wrote it, by its own clock.
    pub written: Option<time::OffsetDateTime>,
    /// Its version.
    pub etag: String,
}

/// What an attempt to take the bootstrap lock found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockAttempt {
    /// This instance holds the lock now.
    Taken {
        /// The lock document's version this instance wrote (given back only while it still is).
        etag: String,
    },
    /// This process's own lock, left by an attempt that did not finish or a rewrite whose
    /// answer was lost: rewritten, and held again.
    Retaken {
        /// The lock document's version this instance wrote.
        etag: String,
    },
    /// Another instance holds it, at this version.
    Held {
        /// The lock document's ETag (its holder's version).
        etag: String,
        /// How often its holder rewrites it, as the lock says (`None`: a holder that does not,
        /// an earlier version of ours).
        renewed_every: Option<Duration>,
    },
    /// It was removed as this instance looked: try again.
    Free,
}

/// Times as RFC 3339 with at most 7 fractional digits (100 ns ticks): the .NET SDK's parser
/// reads no more. Read with any number.
mod ticks_rfc3339 {
    use serde::{Deserializer, Serializer};
    use time::OffsetDateTime;

    pub fn serialize<S: Serializer>(value: &Option<OffsetDateTime>, serializer: S) -> Result<S::Ok, S::Error> {
        let ticks = value.map(|t| t.replace_nanosecond(t.nanosecond() / 100 * 100).unwrap_or(t));
        time::serde::rfc3339::option::serialize(&ticks, serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<OffsetDateTime>, D::Error> {
        time::serde::rfc3339::option::deserialize(deserializer)
    }
}

/// Reads a lease document of the .NET v2 library as the .NET v3 SDK does: v2 names the lease
/// token `PartitionId` and writes no `LeaseToken`.
pub fn read_v2_names(body: &mut Value) {
    if let Some(fields) = body.as_object_mut()
        && !fields.contains_key("LeaseToken")
        && let Some(partition) = fields.get("PartitionId").cloned()
    {
        fields.insert("LeaseToken".to_owned(), partition);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn reads_the_dotnet_v2_librarys_leases_and_writes_at_most_seven_fractional_digits() {
        // As the v2 library writes them: `PartitionId`, no `LeaseToken`; 7 digits, or null when new.
        for (timestamp, nanos) in [
            (serde_json::json!("2019-03-14T19:22:33.1234567Z"), Some(123_456_700)),
            (serde_json::json!(null), None),
        ] {
            let mut doc = serde_json::json!({"id": "p..0", "_etag": "\"e\"", "PartitionId": "0", "Owner": null,
                "ContinuationToken": "\"12\"", "properties": {}, "timestamp": timestamp, "_ts": 1552591353});
            read_v2_names(&mut doc);
            let lease: Lease = serde_json::from_value(doc).unwrap();
            assert_eq!((lease.lease_token.as_str(), lease.range()), ("0", None));
            assert_eq!(lease.continuation.as_deref(), Some("\"12\""));
            assert_eq!(lease.timestamp.map(|t| t.nanosecond()), nanos);
        }
        let mut lease = Lease::new("p", &EpkRange::full(), None);
        lease.timestamp = Some(time::macros::datetime!(2026-11-29 08:00:00.123456789 UTC));
        let written = serde_json::to_value(&lease).unwrap();
        assert_eq!(written["timestamp"], "2026-11-29T08:00:00.1234567Z");
    }

    #[test]
    fn serializes_with_the_dotnet_field_names() {
        let mut lease = Lease::new("proc", &EpkRange::new("", "3F"), Some("\"12\"".into()));
        lease.owner = Some("pod-a".into());
        lease.timestamp = Some(time::macros::datetime!(2026-01-02 03:04:05 UTC));
        let json = serde_json::to_value(&lease).unwrap();
        assert_eq!(json["id"], "proc..-3F");
        assert_eq!(json["LeaseToken"], "-3F");
        assert_eq!(
            json["FeedRange"],
            serde_json::json!({"Range": {"min": "", "max": "3F"}})
        );
        assert_eq!(json["Owner"], "pod-a");
        assert_eq!(json["ContinuationToken"], "\"12\"");
        assert_eq!(json["Mode"], "Incremental Feed");
        assert_eq!(json["version"], 1);
        assert_eq!(json["timestamp"], "2026-01-02T03:04:05Z");
        assert!(json.get("_etag").is_none(), "system fields are never written");
    }

    #[test]
    fn a_whole_partition_lease_is_written_as_the_dotnet_bootstrap_writes_it() {
        let mut lease = Lease::for_partition("proc", "3", &EpkRange::new("3F", "7F"), Some("\"12\"".into()));
        lease.take_for("pod-a", "abc.1".into());
        let json = serde_json::to_value(&lease).unwrap();
        assert_eq!(json["id"], "proc..3");
        assert_eq!(json["version"], 0);
        assert_eq!(json["LeaseToken"], "3");
        assert_eq!(
            json["FeedRange"],
            serde_json::json!({"Range": {"min": "3F", "max": "7F"}})
        );
        assert_eq!(json["ContinuationToken"], "\"12\"");
        assert_eq!(json["ownerEpoch"], "abc.1", "the epoch is an additional field");
        let back = serde_json::from_value::<Lease>(json).unwrap();
        assert!(back.names_a_partition());
        assert!(back.is_held_by("pod-a", Some("abc.1")));
        assert!(
            !back.is_held_by("pod-a", Some("abc.2")),
            "another ownership of the same name"
        );
    }

    #[test]
    fn a_lease_reshaped_keeps_its_state_under_the_new_name() {
        let mut old = Lease::new("proc", &EpkRange::new("", "3F"), Some("\"7\"".into()));
        old.take_for("pod-a", "e.1".into());
        old.properties.insert("k".into(), "v".into());
        let v0 = old.reshaped(Some("0")).unwrap();
        assert_eq!(
            (v0.id.as_str(), v0.version, v0.lease_token.as_str()),
            ("proc..0", 0, "0")
        );
        assert_eq!(v0.continuation, old.continuation);
        assert_eq!(v0.properties, old.properties);
        assert!(v0.is_held_by("pod-a", Some("e.1")));
        let back = v0.reshaped(None).unwrap();
        assert_eq!((back.id.as_str(), back.version), ("proc..-3F", 1));
    }

    #[test]
    fn reads_a_dotnet_lease() {
        let doc = serde_json::json!({
            "id": "procacct.documents.azure.com_db==_coll==..-FF", "_etag": "\"0000\"", "version": 1,
            "LeaseToken": "-FF", "FeedRange": {"Range": {"min": "", "max": "FF"}}, "Owner": null,
            "ContinuationToken": "\"1526353662\"", "properties": {}, "Mode": "Incremental Feed",
            "timestamp": "2024-05-01T10:00:00.1234567Z", "_ts": 1714557600
        });
        let lease = serde_json::from_value::<Lease>(doc).unwrap();
        assert_eq!(lease.range(), Some(&EpkRange::full()));
        assert_eq!(lease.etag, "\"0000\"");
        assert_eq!(lease.continuation.as_deref(), Some("\"1526353662\""));
        assert!(lease.owner.is_none());
    }

    #[test]
    fn expiry_follows_owner_and_timestamp() {
        let now = time::macros::datetime!(2026-01-01 00:01:00 UTC);
        let mut lease = Lease::new("p", &EpkRange::full(), None);
        assert!(lease.is_expired(now, Duration::from_secs(60)), "unowned is free");
        lease.owner = Some("a".into());
        lease.timestamp = Some(time::macros::datetime!(2026-01-01 00:00:30 UTC));
        assert!(!lease.is_expired(now, Duration::from_secs(60)));
        assert!(lease.is_expired(now, Duration::from_secs(10)));
        lease.timestamp = None;
        lease.server_ts = Some(now.unix_timestamp() - 5);
        assert!(!lease.is_expired(now, Duration::from_secs(60)), "falls back to _ts");
    }
}
