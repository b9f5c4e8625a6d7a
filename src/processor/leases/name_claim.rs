//! One process per instance name. Ownership of a lease is written as a name, so two processes
//! started with one name (a copied command line, two hosts with the same host name, a container
//! restarted while the old one still runs) would both take every lease of that name. The
//! heartbeat carries the process's incarnation (random, new at every start) and is written only
//! over the version this process wrote last:
//!
//! - a process that finds its name's heartbeat written by another incarnation watches it for one
//!   lease expiration: if it changes, another process is alive under the name and this one
//!   refuses to start ([`NameError::Taken`]); if it stays still (a crashed predecessor), it takes
//!   the heartbeat over;
//! - unless that incarnation ran in this very pod (the heartbeat names the pod's UID): the
//!   kubelet starts a container again only once it ended, so the predecessor is gone and the
//!   heartbeat is taken over at once (its leases, still the name's, are then acquired at once
//!   under new epochs); two processes of one name in one pod are not told apart;
//! - a process whose heartbeat was overwritten by another incarnation stops processing
//!   ([`NameError::Taken`] from [`NameClaim::beat`]).

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::processor::leases::lease::{Beat, LeaseStore, LeaseStoreError};

/// Why this process cannot run under its instance name.
#[derive(Debug, thiserror::Error)]
pub enum NameError {
    /// Another live process writes the heartbeat of this name.
    #[error(
        "another process is running as instance {instance:?} (its heartbeat keeps changing): give every worker a name of its own (--instance / CFP_INSTANCE; the default is the host name)"
    )]
    Taken {
        /// The instance name.
        instance: String,
    },
    /// The lease store failed.
    #[error(transparent)]
    Store(#[from] LeaseStoreError),
}

/// This process's hold on its instance name: its incarnation and the version of the heartbeat
/// it wrote last.
#[derive(Debug)]
pub struct NameClaim {
    instance: String,
    incarnation: String,
    pod: Option<String>,
    etag: Mutex<Option<String>>,
    /// Set once the process stops ([`NameClaim::leave`]): its heartbeats say so from then on.
    leaving: std::sync::atomic::AtomicBool,
}

impl NameClaim {
    /// The claim of `incarnation` on `instance`, in the pod of UID `pod` when known, not
    /// written yet.
    pub fn new(instance: &str, incarnation: &str, pod: Option<String>) -> Self {
        Self {
            instance: instance.to_owned(),
            incarnation: incarnation.to_owned(),
            pod: pod.filter(|p| !p.is_empty()),
            etag: Mutex::new(None),
            leaving: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Records that this process stops: its heartbeats from now on say it is leaving, so that
    /// the other instances count it out of the fair shares and take the leases it releases.
    pub fn leave(&self) {
        self.leaving.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn etag(&self) -> Option<String> {
        self.etag
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set_etag(&self, etag: Option<String>) {
        *self.etag.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = etag;
    }

    fn beat_of<'a>(&'a self, keeps_leases: bool, if_match: Option<&'a str>) -> Beat<'a> {
        Beat {
            instance: &self.instance,
            incarnation: &self.incarnation,
            keeps_leases,
            leaving: self.leaving.load(std::sync::atomic::Ordering::SeqCst),
            if_match,
            pod: self.pod.as_deref(),
        }
    }

    /// Writes the first heartbeat of this process. When the name's heartbeat exists, it is
    /// watched (read every `poll`) for `expiration`: a change means another live process and
    /// [`NameError::Taken`]; a heartbeat that stays still is taken over.
    pub async fn claim(
        &self,
        store: &dyn LeaseStore,
        keeps_leases: bool,
        expiration: Duration,
        poll: Duration,
    ) -> Result<(), NameError> {
        loop {
            match store.heartbeat(&self.beat_of(keeps_leases, None)).await {
                Ok(etag) => {
                    self.set_etag(Some(etag));
                    return Ok(());
                }
                Err(LeaseStoreError::Changed(_)) => {}
                Err(error) => return Err(error.into()),
            }
            let Some(found) = store.read_heartbeat(&self.instance).await? else {
                continue;
            };
            if self.pod.is_some() && found.pod == self.pod && found.incarnation.as_deref() != Some(&self.incarnation) {
                tracing::info!(instance = %self.instance, "the heartbeat of this instance name was written in this pod by a process that has ended: taking it over");
                match store.heartbeat(&self.beat_of(keeps_leases, Some(&found.etag))).await {
                    Ok(etag) => {
                        self.set_etag(Some(etag));
                        return Ok(());
                    }
                    Err(LeaseStoreError::Changed(_) | LeaseStoreError::Gone(_)) => continue,
                    Err(error) => return Err(error.into()),
                }
            }
            tracing::info!(instance = %self.instance, "the heartbeat of this instance name exists: waiting to see whether another process writes it");
            if let Some(etag) = self.outwait(store, keeps_leases, found.etag, expiration, poll).await? {
                self.set_etag(Some(etag));
                return Ok(());
            }
        }
    }

    /// Watches the heartbeat at version `seen` for `expiration`; takes it over when it stayed
    /// still (`Some`), `None` when it was removed meanwhile (create it again).
    async fn outwait(
        &self,
        store: &dyn LeaseStore,
        keeps_leases: bool,
        seen: String,
        expiration: Duration,
        poll: Duration,
    ) -> Result<Option<String>, NameError> {
        let started = Instant::now();
        let taken = || NameError::Taken {
            instance: self.instance.clone(),
        };
        loop {
            tokio::time::sleep(poll.min(expiration)).await;
            match store.read_heartbeat(&self.instance).await? {
                None => return Ok(None),
                Some(now) if now.etag != seen => return Err(taken()),
                Some(_) if started.elapsed() < expiration => {}
                Some(_) => {
                    return match store.heartbeat(&self.beat_of(keeps_leases, Some(&seen))).await {
                        Ok(etag) => Ok(Some(etag)),
                        Err(LeaseStoreError::Changed(_)) => Err(taken()),
                        Err(LeaseStoreError::Gone(_)) => Ok(None),
                        Err(error) => Err(error.into()),
                    };
                }
            }
        }
    }

    /// Writes the heartbeat again over this process's last version. Written by another
    /// incarnation since: [`NameError::Taken`]. Removed since (an operator freed the instance's
    /// leases): created again.
    pub async fn beat(&self, store: &dyn LeaseStore, keeps_leases: bool) -> Result<(), NameError> {
        let last = self.etag();
        let written = store.heartbeat(&self.beat_of(keeps_leases, last.as_deref())).await;
        let written = match written {
            Err(LeaseStoreError::Gone(_)) => store.heartbeat(&self.beat_of(keeps_leases, None)).await,
            other => other,
        };
        match written {
            Ok(etag) => {
                self.set_etag(Some(etag));
                Ok(())
            }
            Err(LeaseStoreError::Changed(_)) => match store.read_heartbeat(&self.instance).await? {
                Some(found) if found.incarnation.as_deref() == Some(self.incarnation.as_str()) => {
                    // Our own write landed though its answer was lost: go on from it.
                    self.set_etag(Some(found.etag));
                    Ok(())
                }
                Some(_) => Err(NameError::Taken {
                    instance: self.instance.clone(),
                }),
                // Removed between the two requests: the next beat creates it.
                None => {
                    self.set_etag(None);
                    Ok(())
                }
            },
            Err(error) => Err(error.into()),
        }
    }

    /// Removes the heartbeat if it is still the version this process wrote.
    pub async fn remove(&self, store: &dyn LeaseStore) -> Result<(), LeaseStoreError> {
        let Some(etag) = self.etag() else { return Ok(()) };
        store.remove_heartbeat(&self.instance, Some(&etag)).await
    }
}
