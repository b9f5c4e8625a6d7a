//! How a start is tried again after a transient failure (a failover under way, a throttled or
//! unavailable account): at growing intervals, for a bounded time, then the error is answered
//! (and under Kubernetes the container is restarted with its own back-off). A failed start
//! writes nothing that a second try cannot take over: bootstrap is idempotent and the name
//! claim recognises its own heartbeat. [`retry_delay`] is the decision; [`retrying`] applies it
//! (opening the containers, the bootstrap, the name claim).

use std::time::Duration;

/// How long a start keeps trying after transient failures.
pub const START_PATIENCE: Duration = Duration::from_secs(60);
/// The first wait, doubled after every failure up to [`LONGEST_WAIT`].
const FIRST_WAIT: Duration = Duration::from_millis(500);
/// The longest wait between two tries.
const LONGEST_WAIT: Duration = Duration::from_secs(8);

/// The wait before try `attempt + 1` (the first retry is attempt 0) when `elapsed` has passed
/// since the first try; `None` when that would go past [`START_PATIENCE`]: give up.
pub fn retry_delay(attempt: u32, elapsed: Duration) -> Option<Duration> {
    let delay = FIRST_WAIT.saturating_mul(1u32 << attempt.min(5)).min(LONGEST_WAIT);
    (elapsed + delay <= START_PATIENCE).then_some(delay)
}

/// Runs `attempt` until it succeeds, fails for good (`transient` says no) or [`retry_delay`]
/// gives up; each retry is logged with `what`.
pub async fn retrying<T, E: std::fmt::Display, F: Future<Output = Result<T, E>>>(
    what: &str,
    transient: impl Fn(&E) -> bool,
    mut attempt: impl FnMut() -> F,
) -> Result<T, E> {
    let began = tokio::time::Instant::now();
    let mut retries = 0;
    loop {
        let error = match attempt().await {
            Err(error) if transient(&error) => error,
            done => return done,
        };
        let Some(delay) = retry_delay(retries, began.elapsed()) else {
            return Err(error);
        };
        retries += 1;
        tracing::warn!(%error, attempt = retries, ?delay, "{what} failed; retrying");
        tokio::time::sleep(delay).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_grow_to_a_ceiling_and_stop_at_the_patience() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let table = [
            (0, s(0), Some(ms(500))),
            (1, s(1), Some(s(1))),
            (2, s(2), Some(s(2))),
            (3, s(4), Some(s(4))),
            (4, s(8), Some(s(8))),
            (30, s(20), Some(s(8))),
            (u32::MAX, s(52), Some(s(8))),
            (6, s(53), None),
            (0, START_PATIENCE, None),
        ];
        for (attempt, elapsed, want) in table {
            assert_eq!(
                retry_delay(attempt, elapsed),
                want,
                "attempt {attempt} after {elapsed:?}"
            );
        }
    }

    #[test]
    fn the_waits_of_a_whole_start_add_up_to_at_most_the_patience() {
        let (mut elapsed, mut attempt) = (Duration::ZERO, 0);
        while let Some(delay) = retry_delay(attempt, elapsed) {
            elapsed += delay;
            attempt += 1;
        }
        assert!(
            elapsed <= START_PATIENCE && elapsed > START_PATIENCE - LONGEST_WAIT,
            "{elapsed:?}"
        );
        assert!(attempt >= 8, "{attempt} tries");
    }
}
