//! The in-place restart figure: an instance killed (it writes nothing more) and started again
//! under its name in its pod (the same pod UID), as the kubelet restarts a container after an
//! OOMKill: seconds until what is written after the restart is delivered, beside what the
//! reference processors wait for a crashed owner's leases (a lease expiration and an acquire).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::figures::PATIENCE;
use super::world::{Received, World, wait_until};
use super::{BenchError, BenchSettings, Check, Figure};

/// Documents written after the restart (8 leases: each gets some).
const WRITTEN: usize = 64;

/// The in-place restart figure.
pub async fn in_place_restart(settings: &BenchSettings) -> Result<Vec<Figure>, BenchError> {
    let world = World::new(8).await?;
    let received = Arc::new(Received {
        record_ids: true,
        ..Received::default()
    });
    let mut options = World::options("restart", "a", settings.timing_scale);
    options.pod_uid = Some("uid-of-pod-a".into());
    options.poll_interval = Duration::from_millis(100);
    let first = world.start(options.clone(), received.clone()).await?;
    wait_until(PATIENCE, || async {
        world.owners("restart").await.is_ok_and(|c| c.get("a") == Some(&8))
    })
    .await
    .ok_or("the instance did not take every lease")?;
    first.abort();
    let restarted = Instant::now();
    let again = world.start(options.clone(), received.clone()).await?;
    for n in 0..WRITTEN {
        world.write_one(n, None).await?;
    }
    let delivered = wait_until(PATIENCE, || async {
        received
            .ids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
            >= WRITTEN
    })
    .await;
    let seconds = restarted.elapsed().as_secs_f64();
    again.stop().await;
    delivered.ok_or("what was written after the restart was not delivered")?;
    let reference = options.expiration.as_secs_f64() + options.acquire_interval.as_secs_f64();
    Ok(vec![
        Figure::ratio(
            "in-place restart (killed, started again in its pod): seconds until its leases run again",
            seconds,
            "lease expiration + one acquire (reference)",
            reference,
            "≤ 0.1 × the reference (5 s of 60 s)",
        )
        .against(Check::RatioAtMost(0.1)),
    ])
}
