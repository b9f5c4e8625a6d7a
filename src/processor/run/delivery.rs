//! Handing one batch to the handler: retries with exponential backoff (or the handler's
//! `Retry-After`), then, after `max_attempts`, what the retry policy says:
//! - `Halt`: keep retrying at the longest backoff; the lease is reported stuck (metric, a warning
//!   per attempt, and a `handlerFailing` lease property the operator turns into a condition);
//!   nothing is ever checkpointed past the batch.
//! - `DeadLetter`: bisect the batch to find the documents that fail on their own (halves are
//!   tried once, a single document gets every attempt), store each in the dead-letter container,
//!   deliver the rest in order, and let the lease checkpoint and go on. When a dead-letter write
//!   fails it is retried; the batch is never checkpointed before its poison is stored.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use time::OffsetDateTime;
use tracing::Instrument;

use crate::cosmos::{Change, EpkRange};
use crate::processor::error::LeaseError;
use crate::processor::handlers::change_handler::{Batch, HandlerError};
use crate::processor::handlers::dead_letters::DeadLetter;
use crate::processor::handlers::manual::{CheckpointHandle, Handler};
use crate::processor::leases::lease::HANDLER_FAILING_PROPERTY;
use crate::processor::leases::owned::{OwnedLease, UpdateError};
use crate::processor::options::OnExhausted;
use crate::processor::run::shared::Shared;

/// A stable id for the batch read from `position` of lease `lease` (FNV-1a, hex).
pub fn batch_id(lease: &str, position: Option<&str>) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in lease.bytes().chain([0]).chain(position.unwrap_or("").bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// A handler's `Retry-After` kept within `policy`'s backoff range: `0` (or a date in the past)
/// waits the initial backoff — never a retry at once, also while halted — and a longer wait than
/// the longest backoff waits that (a day would park the lease until a stall restart).
pub fn clamp_retry_after(asked: Duration, policy: &crate::processor::options::RetryPolicy) -> Duration {
    asked.clamp(policy.initial_backoff, policy.max_backoff.max(policy.initial_backoff))
}

/// One batch on its way to the handler.
pub(crate) struct Delivery<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) owned: &'a Arc<OwnedLease>,
    pub(crate) range: &'a EpkRange,
    pub(crate) batch_id: String,
    /// Where the lease is after this batch (for a manual checkpoint); `None` when the batch
    /// ends in a split (its children will deliver it again).
    pub(crate) checkpoint_to: Option<String>,
    /// What happened to each document (all-versions-and-deletes mode; else empty).
    pub(crate) changes: &'a [Change],
}

/// Sleeps unless the lease is stopped first; `false` when stopped.
async fn pause(owned: &OwnedLease, delay: Duration) -> bool {
    tokio::select! {
        _ = owned.cancelled().cancelled() => false,
        _ = tokio::time::sleep(delay) => true,
    }
}

impl Delivery<'_> {
    /// Reports a failed step of this batch's lease.
    fn report(&self, error: LeaseError) {
        self.shared.telemetry.error(Some(self.owned.token()), error);
    }

    /// Whether each batch's own checkpoint confirms the lease: checkpointed by the processor after
    /// every batch, one batch at a time (the defaults). A deposed owner then hands over at most
    /// the one batch after which its checkpoint fails, and needs no read before each batch —
    /// unless nothing kept the lease alive for half the expiration (the process was frozen, the
    /// store unreachable): others may have taken it as expired, so it is confirmed first.
    fn checkpoint_confirms(&self) -> bool {
        let options = &self.shared.options;
        !self.shared.handler.is_manual()
            && options.checkpoint.every_batches <= 1
            && options.checkpoint.interval.is_none()
            && options.max_in_flight_batches <= 1
    }

    /// Whether the lease is still this instance's (see [`OwnedLease::ensure_owned`]): `false`
    /// when it was lost or the lease stopped first; while the lease store cannot tell, waits.
    async fn still_owned(&self) -> bool {
        let expiration = self.shared.options.expiration;
        if self.checkpoint_confirms() && !self.owned.is_lost() && self.owned.kept_alive_within(expiration / 2) {
            return true;
        }
        let mut failures = 0;
        loop {
            match self.owned.ensure_owned(expiration).await {
                Ok(()) => return true,
                Err(UpdateError::Store(error)) => {
                    tracing::debug!(%error, "cannot confirm the lease before delivering; retrying");
                    if !pause(self.owned, self.shared.options.backoff(failures)).await {
                        return false;
                    }
                    failures += 1;
                }
                Err(lost) => {
                    tracing::info!(reason = %lost, "the lease is no longer this instance's; not delivering");
                    return false;
                }
            }
        }
    }

    /// The wait before the next attempt after `error`: the handler's `Retry-After` kept within the
    /// retry policy's backoff range (said when it was not), else `backoff`.
    fn wait_after(&self, error: &HandlerError, backoff: Duration) -> Duration {
        let Some(asked) = error.retry_after else {
            return backoff;
        };
        let wait = clamp_retry_after(asked, &self.shared.options.retry);
        if wait != asked {
            tracing::info!(
                asked = ?asked,
                waiting = ?wait,
                "the handler's Retry-After is outside the backoff range; waiting the nearest bound"
            );
        }
        wait
    }

    /// Hands `documents` (from index `offset` of the batch) to the handler once, after making
    /// sure the lease is still this instance's; `None` (nothing delivered) when it is not.
    async fn attempt(
        &self,
        batch_id: &str,
        attempt: u32,
        offset: usize,
        documents: &[Value],
    ) -> Option<Result<(), HandlerError>> {
        if !self.still_owned().await {
            return None;
        }
        // After an abort (a simulated crash) nothing more reaches the handler.
        self.shared.gate.pass().await;
        let batch = Batch {
            processor: &self.shared.options.processor_name,
            lease_token: self.owned.token(),
            feed_range: self.range,
            batch_id,
            attempt,
            documents,
            changes: self.changes.get(offset..offset + documents.len()).unwrap_or_default(),
        };
        let started = std::time::Instant::now();
        // A child of the batch's span; an HTTP handler passes it on as `traceparent`.
        // Integers as i64: OpenTelemetry has no unsigned attributes (u64 arrives as a string).
        let span = tracing::info_span!(
            "deliver",
            attempt = i64::from(attempt),
            documents = documents.len() as i64
        );
        let result = match &self.shared.handler {
            Handler::Automatic(handler) => handler.handle(batch).instrument(span).await,
            Handler::Manual(handler) => {
                let handle = CheckpointHandle::new(self.owned.clone(), self.checkpoint_to.clone());
                handler.handle(batch, handle).instrument(span).await
            }
        };
        self.shared.telemetry.observer().handler_done(
            self.owned.token(),
            started.elapsed(),
            result.is_ok(),
            documents.len(),
        );
        if let Err(error) = &result {
            self.owned.note_handler_failure();
            self.report(LeaseError::Handler {
                batch_id: batch_id.to_owned(),
                attempt,
                documents: documents.len(),
                error: error.clone(),
            });
        }
        Some(result)
    }

    /// Delivers the batch. `true` when it may be checkpointed (handled, or its poison
    /// dead-lettered), `false` when the lease was stopped first.
    pub(crate) async fn run(&self, documents: &[Value]) -> bool {
        let policy = self.shared.options.retry;
        let mut first_failure = None;
        let mut stuck = false;
        for attempt in 1.. {
            let Some(outcome) = self.attempt(&self.batch_id, attempt, 0, documents).await else {
                return false;
            };
            let error = match outcome {
                Ok(()) => {
                    if stuck {
                        self.set_stuck(None).await;
                    }
                    return true;
                }
                Err(error) => error,
            };
            let first = *first_failure.get_or_insert_with(OffsetDateTime::now_utc);
            let delay = if attempt < policy.max_attempts {
                policy.backoff(attempt)
            } else {
                match policy.on_exhausted {
                    OnExhausted::DeadLetter => return self.isolate(documents, error, attempt, first).await,
                    OnExhausted::Halt => {
                        if !stuck {
                            stuck = true;
                            self.set_stuck(Some(&error)).await;
                        }
                        policy.max_backoff
                    }
                }
            };
            if !pause(self.owned, self.wait_after(&error, delay)).await {
                return false;
            }
        }
        false
    }

    /// Finds the failing documents of a batch that failed `attempts` times as a whole.
    async fn isolate(&self, documents: &[Value], error: HandlerError, attempts: u32, first: OffsetDateTime) -> bool {
        if let [single] = documents {
            return self.dead_letter((0, single), &error, attempts, first).await;
        }
        let policy = self.shared.options.retry;
        let mut parts: VecDeque<(usize, &[Value])> = halves(0, documents).into();
        while let Some((offset, part)) = parts.pop_front() {
            let id = format!("{}.{offset}+{}", self.batch_id, part.len());
            if part.len() > 1 {
                let Some(outcome) = self.attempt(&id, 1, offset, part).await else {
                    return false;
                };
                if outcome.is_err() {
                    for half in halves(offset, part).into_iter().rev() {
                        parts.push_front(half);
                    }
                }
                continue;
            }
            let mut attempt = 1;
            loop {
                let Some(outcome) = self.attempt(&id, attempt, offset, part).await else {
                    return false;
                };
                match outcome {
                    Ok(()) => break,
                    Err(error) if attempt >= policy.max_attempts => {
                        if !self.dead_letter((offset, &part[0]), &error, attempt, first).await {
                            return false;
                        }
                        break;
                    }
                    Err(error) => {
                        if !pause(self.owned, self.wait_after(&error, policy.backoff(attempt))).await {
                            return false;
                        }
                        attempt += 1;
                    }
                }
            }
        }
        true
    }

    /// Stores one dead letter — the batch's document at `index`, with its change — retrying until
    /// it is stored; `false` when the lease was stopped first.
    async fn dead_letter(
        &self,
        (index, document): (usize, &Value),
        error: &HandlerError,
        attempts: u32,
        first: OffsetDateTime,
    ) -> bool {
        let Some(store) = self.shared.dead_letters.get() else {
            // Options validation requires a store for DeadLetter; never drop a document without one.
            self.report(LeaseError::NoDeadLetterStore);
            return false;
        };
        let letter = DeadLetter::new(
            document.clone(),
            &self.shared.options.processor_name,
            self.owned.token(),
            error.message.clone(),
            attempts,
            first,
        )
        .with_change(self.changes.get(index).cloned());
        let mut failures = 0;
        loop {
            match store.put(&letter).await {
                Ok(()) => {
                    let document_id = letter.document.get("id").and_then(Value::as_str).unwrap_or_default();
                    tracing::warn!(
                        document = document_id,
                        dead_letter = %letter.id,
                        attempts,
                        error = %error,
                        "document dead-lettered"
                    );
                    self.shared.telemetry.observer().dead_lettered(self.owned.token(), 1);
                    return true;
                }
                Err(store_error) => {
                    self.report(LeaseError::DeadLetter(store_error));
                    if !pause(self.owned, self.shared.options.retry.backoff(failures + 1)).await {
                        return false;
                    }
                    failures += 1;
                }
            }
        }
    }

    /// Reports the lease stuck (with the handler's error) or recovered: metric and lease property.
    async fn set_stuck(&self, error: Option<&HandlerError>) {
        let token = self.owned.token();
        self.shared.telemetry.observer().lease_stuck(token, error.is_some());
        let note = error.map(|e| {
            let since = OffsetDateTime::now_utc()
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default();
            format!("since {since}: {}", e.message)
        });
        match &note {
            Some(note) => {
                tracing::warn!("handler keeps failing; the lease halts ({note})")
            }
            None => {
                tracing::info!("handler recovered; the lease goes on")
            }
        }
        let update = self
            .owned
            .update(|lease| match &note {
                Some(note) => {
                    lease.properties.insert(HANDLER_FAILING_PROPERTY.into(), note.clone());
                }
                None => {
                    lease.properties.remove(HANDLER_FAILING_PROPERTY);
                }
            })
            .await;
        if let Err(error) = update {
            tracing::debug!(lease = token, %error, "recording the handler state in the lease failed");
        }
    }
}

/// The two halves of `part` (which starts at `offset` of the batch).
fn halves(offset: usize, part: &[Value]) -> Vec<(usize, &[Value])> {
    let middle = part.len() / 2;
    vec![(offset, &part[..middle]), (offset + middle, &part[middle..])]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_kept_within_the_backoff_range() {
        let policy = crate::processor::options::RetryPolicy {
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            ..Default::default()
        };
        let cases = [(0, 1), (1, 1), (7, 7), (30, 30), (86_400, 30)];
        for (asked, waited) in cases {
            assert_eq!(
                clamp_retry_after(Duration::from_secs(asked), &policy),
                Duration::from_secs(waited),
                "Retry-After {asked}"
            );
        }
    }

    #[test]
    fn every_failed_attempt_is_one_kind_of_error() {
        let kinds: std::collections::BTreeSet<String> = (0..50u32)
            .map(|n| {
                let error = LeaseError::Handler {
                    batch_id: batch_id("-FF", Some(&format!("\"{n}\""))),
                    attempt: n % 5 + 1,
                    documents: 10,
                    error: HandlerError::new(format!("HTTP 500 number {n}")),
                };
                error.reason().to_owned()
            })
            .collect();
        assert_eq!(kinds.into_iter().collect::<Vec<_>>(), ["handler"]);
    }

    #[test]
    fn batch_ids_are_stable_and_distinct() {
        assert_eq!(batch_id("-FF", Some("\"12\"")), batch_id("-FF", Some("\"12\"")));
        assert_ne!(batch_id("-FF", Some("\"12\"")), batch_id("-FF", Some("\"13\"")));
        assert_ne!(batch_id("-FF", None), batch_id("-80", None));
        assert_eq!(batch_id("-FF", None).len(), 16);
    }

    #[test]
    fn halves_cover_the_part_in_order() {
        let docs: Vec<Value> = (0..5).map(|n| serde_json::json!(n)).collect();
        let parts = halves(10, &docs);
        assert_eq!(parts[0].0, 10);
        assert_eq!(parts[0].1.len(), 2);
        assert_eq!(parts[1].0, 12);
        assert_eq!(parts[1].1.len(), 3);
    }
}
