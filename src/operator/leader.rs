//! Leader election through a `coordination.k8s.io/v1` Lease, so that of several operator
//! replicas exactly one reconciles. Updates use the Lease's resourceVersion (optimistic
//! concurrency): two candidates can never both win.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio_util::sync::CancellationToken;

/// Settings of the election.
#[derive(Debug, Clone)]
pub struct Election {
    /// The Lease's name.
    pub name: String,
    /// This replica's identity.
    pub identity: String,
    /// A leader that has not renewed for this long is replaced.
    pub lease_duration: Duration,
    /// How often the leader renews.
    pub renew_interval: Duration,
}

/// Runs an election on `api`.
pub struct LeaderElector {
    api: Api<Lease>,
    election: Election,
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

impl LeaderElector {
    /// An elector for the Lease `election.name` in `api`'s namespace.
    pub fn new(api: Api<Lease>, election: Election) -> Self {
        Self { api, election }
    }

    /// Waits until this replica leads; `false` when `shutdown` came first.
    pub async fn acquire(&self, shutdown: &CancellationToken) -> bool {
        loop {
            match self.try_acquire().await {
                Ok(true) => return true,
                Ok(false) => {}
                Err(error) => tracing::warn!(%error, "leader election failed; retrying"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = tokio::time::sleep(self.election.renew_interval) => {}
            }
        }
    }

    /// One attempt: create the Lease, or take it over when it is free, expired or already ours.
    pub async fn try_acquire(&self) -> Result<bool, kube::Error> {
        let me = &self.election.identity;
        let seconds = i32::try_from(self.election.lease_duration.as_secs())
            .unwrap_or(i32::MAX)
            .max(1);
        let Some(mut lease) = self.api.get_opt(&self.election.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.election.name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(now()),
                    renew_time: Some(now()),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(status)) if status.is_already_exists() || status.is_conflict() => Ok(false),
                Err(error) => Err(error),
            };
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let renewed = spec.renew_time.as_ref().map(|t| t.0);
        let duration = spec.lease_duration_seconds.unwrap_or(seconds);
        let expired = renewed.is_none_or(|t| {
            t.checked_add(jiff_seconds(duration))
                .map(|deadline| deadline < Timestamp::now())
                .unwrap_or(true)
        });
        if holder.as_deref() != Some(me.as_str()) && holder.is_some() && !expired {
            return Ok(false);
        }
        if holder.as_deref() != Some(me.as_str()) {
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            spec.acquire_time = Some(now());
        }
        spec.holder_identity = Some(me.clone());
        spec.lease_duration_seconds = Some(seconds);
        spec.renew_time = Some(now());
        match self
            .api
            .replace(&self.election.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.is_conflict() => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Renews while leading; cancels `lost` when the lease cannot be renewed within its duration
    /// or another replica holds it. Returns when `stop` or `lost` is cancelled.
    pub async fn hold(&self, stop: &CancellationToken, lost: &CancellationToken) {
        let mut last_renewal = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = lost.cancelled() => return,
                _ = tokio::time::sleep(self.election.renew_interval) => {}
            }
            match self.try_acquire().await {
                Ok(true) => last_renewal = tokio::time::Instant::now(),
                Ok(false) => {
                    tracing::warn!("another operator replica took the leader lease");
                    lost.cancel();
                    return;
                }
                Err(error) => {
                    tracing::warn!(%error, "renewing the leader lease failed");
                    if last_renewal.elapsed() >= self.election.lease_duration {
                        lost.cancel();
                        return;
                    }
                }
            }
        }
    }

    /// Gives the lease up (graceful shutdown) so another replica takes over at once.
    pub async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.election.name).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(self.election.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        if let Err(error) = self
            .api
            .replace(&self.election.name, &PostParams::default(), &lease)
            .await
        {
            tracing::warn!(%error, "releasing the leader lease failed");
        }
    }
}

fn jiff_seconds(seconds: i32) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::from_secs(i64::from(seconds))
}
