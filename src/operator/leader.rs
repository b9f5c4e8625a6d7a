//! Leader election through a `coordination.k8s.io/v1` Lease, so that of several operator
//! replicas exactly one reconciles. Updates use the Lease's resourceVersion (optimistic
//! concurrency): two candidates can never both win.
//!
//! As client-go does, expiry is never judged by comparing another machine's `renewTime` with this
//! machine's clock: a candidate notes when it last saw the Lease record change (on its own
//! monotonic clock) and takes over only after `lease_duration` without a change. The leader counts
//! as leading only while its last successful renewal (monotonic) is younger than `renew_deadline`,
//! which is shorter than `lease_duration`: a leader that was frozen or cut off stops reconciling
//! before anyone else may start.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

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
    /// A leader stops reconciling when it could not renew for this long (shorter than
    /// `lease_duration`).
    pub renew_deadline: Duration,
    /// How often the leader renews and candidates retry.
    pub renew_interval: Duration,
}

/// Why election timings do not work together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ElectionError {
    /// The renew interval is zero or not shorter than the renew deadline.
    #[error("the leader renew interval ({interval:?}) must be shorter than the renew deadline ({deadline:?})")]
    RenewInterval {
        /// The renew interval.
        interval: Duration,
        /// The renew deadline.
        deadline: Duration,
    },
    /// The renew deadline is not shorter than the lease duration.
    #[error("the leader renew deadline ({deadline:?}) must be shorter than the lease duration ({lease:?})")]
    RenewDeadline {
        /// The renew deadline.
        deadline: Duration,
        /// The lease duration.
        lease: Duration,
    },
}

impl Election {
    /// Checks `renew_interval < renew_deadline < lease_duration`.
    pub fn validate(&self) -> Result<(), ElectionError> {
        if self.renew_interval.is_zero() || self.renew_interval >= self.renew_deadline {
            return Err(ElectionError::RenewInterval {
                interval: self.renew_interval,
                deadline: self.renew_deadline,
            });
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(ElectionError::RenewDeadline {
                deadline: self.renew_deadline,
                lease: self.lease_duration,
            });
        }
        Ok(())
    }
}

/// The Lease record as last seen, and when (this machine's monotonic clock).
struct Observed {
    record: String,
    at: Instant,
}

/// Runs an election on `api`.
pub struct LeaderElector {
    api: Api<Lease>,
    election: Election,
    observed: Mutex<Option<Observed>>,
    renewed: Mutex<Option<Instant>>,
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

impl LeaderElector {
    /// An elector for the Lease `election.name` in `api`'s namespace.
    pub fn new(api: Api<Lease>, election: Election) -> Self {
        Self {
            api,
            election,
            observed: Mutex::new(None),
            renewed: Mutex::new(None),
        }
    }

    /// Whether this replica leads now: its last renewal is younger than the renew deadline.
    pub fn is_leading(&self) -> bool {
        self.renewed()
            .is_some_and(|at| at.elapsed() < self.election.renew_deadline)
    }

    /// When this replica last renewed, while it leads. A lock poisoned by a panic elsewhere is
    /// used as it is: the value is written whole.
    fn renewed(&self) -> Option<Instant> {
        *self.renewed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_renewed(&self, at: Option<Instant>) {
        *self.renewed.lock().unwrap_or_else(PoisonError::into_inner) = at;
    }

    /// Notes the record; returns how long it has been unchanged (monotonic).
    fn observe(&self, record: String) -> Duration {
        let mut observed = self.observed.lock().unwrap_or_else(PoisonError::into_inner);
        match observed.as_ref() {
            Some(seen) if seen.record == record => seen.at.elapsed(),
            _ => {
                *observed = Some(Observed {
                    record,
                    at: Instant::now(),
                });
                Duration::ZERO
            }
        }
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

    /// One attempt: create the Lease, or take it over when it is free, unrenewed for the lease
    /// duration (as observed here), or already ours.
    pub async fn try_acquire(&self) -> Result<bool, kube::Error> {
        let me = &self.election.identity;
        let seconds = i32::try_from(self.election.lease_duration.as_secs())
            .unwrap_or(i32::MAX)
            .max(1);
        // The lease counts from before the request: the API server may apply it any time after.
        let attempt = Instant::now();
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
                Ok(_) => {
                    self.set_renewed(Some(attempt));
                    Ok(true)
                }
                Err(kube::Error::Api(status)) if status.is_already_exists() || status.is_conflict() => Ok(false),
                Err(error) => Err(error),
            };
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let record = format!(
            "{holder:?}|{:?}|{:?}",
            spec.renew_time.as_ref().map(|t| t.0),
            spec.lease_transitions
        );
        let unchanged_for = self.observe(record);
        let their_duration =
            Duration::from_secs(u64::try_from(spec.lease_duration_seconds.unwrap_or(seconds)).unwrap_or(0));
        if holder.as_deref() != Some(me.as_str()) && holder.is_some() && unchanged_for < their_duration {
            self.set_renewed(None);
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
            Ok(_) => {
                self.set_renewed(Some(attempt));
                Ok(true)
            }
            Err(kube::Error::Api(status)) if status.is_conflict() => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Renews while leading; cancels `lost` as soon as no renewal succeeded within the renew
    /// deadline or another replica holds the lease. Returns when `stop` or `lost` is cancelled.
    pub async fn hold(&self, stop: &CancellationToken, lost: &CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = lost.cancelled() => return,
                _ = tokio::time::sleep(self.election.renew_interval) => {}
            }
            if !self.is_leading() {
                tracing::warn!("no leader lease renewal within the renew deadline; stopped leading");
                lost.cancel();
                return;
            }
            // A renewal may not outlast the deadline.
            let remaining = self
                .renewed()
                .map(|at| self.election.renew_deadline.saturating_sub(at.elapsed()))
                .unwrap_or_default();
            match tokio::time::timeout(remaining, self.try_acquire()).await {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => {
                    tracing::warn!("another operator replica took the leader lease");
                    lost.cancel();
                    return;
                }
                Ok(Err(error)) => tracing::warn!(%error, "renewing the leader lease failed"),
                Err(_) => tracing::warn!("renewing the leader lease timed out"),
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
        self.set_renewed(None);
        if let Err(error) = self
            .api
            .replace(&self.election.name, &PostParams::default(), &lease)
            .await
        {
            tracing::warn!(%error, "releasing the leader lease failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_must_nest() {
        let election = |interval, deadline, duration| Election {
            name: "l".into(),
            identity: "me".into(),
            lease_duration: Duration::from_secs(duration),
            renew_deadline: Duration::from_secs(deadline),
            renew_interval: Duration::from_secs(interval),
        };
        assert!(election(2, 10, 15).validate().is_ok());
        assert!(
            election(10, 10, 15)
                .validate()
                .unwrap_err()
                .to_string()
                .contains("renew interval")
        );
        assert!(
            election(2, 15, 15)
                .validate()
                .unwrap_err()
                .to_string()
                .contains("renew deadline")
        );
    }
}
