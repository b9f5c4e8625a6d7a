//! What a worker reports it handles: with every lease write, the documents a second it handles
//! while it has work (`workerHandledPerSecond`), which the operator's freshness policy takes as
//! what one worker does.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use changefeed_operator::processor::leases::worker_capacity::reported_worker_capacity;
use changefeed_operator::processor::{Batch, ChangeHandler, HandlerError};

use crate::common::{Env, eventually};

/// Documents a second written after the backlog.
const TRICKLE: f64 = 5.0;

/// A handler taking its batches one at a time, 10 ms a document: 100 documents a second.
#[derive(Default)]
struct Paced {
    turn: tokio::sync::Mutex<()>,
    handled: AtomicUsize,
    /// When the first batch and the 800th document were handled.
    first: std::sync::OnceLock<std::time::Instant>,
    drained: std::sync::OnceLock<std::time::Instant>,
}

#[async_trait]
impl ChangeHandler for Paced {
    async fn handle(&self, batch: Batch<'_>) -> Result<(), HandlerError> {
        let _turn = self.turn.lock().await;
        self.first.get_or_init(std::time::Instant::now);
        tokio::time::sleep(Duration::from_millis(10) * batch.documents.len() as u32).await;
        if self.handled.fetch_add(batch.documents.len(), Ordering::SeqCst) + batch.documents.len() >= 800 {
            self.drained.get_or_init(std::time::Instant::now);
        }
        Ok(())
    }
}

/// The reports on the leases now, one per lease that carries one.
async fn reported(env: &Env) -> Vec<f64> {
    env.leases().await.iter().filter_map(reported_worker_capacity).collect()
}

/// Draining a backlog, a worker whose handler does 100 documents a second reports about that;
/// fed a trickle afterwards, it still reports how fast it goes when it has work — not the
/// trickle, which is what a handled rate would show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_reports_what_it_handles_while_it_has_work_not_what_arrives() {
    let env = Env::new(4).await;
    env.write(0..800).await;
    let handler = Arc::new(Paced::default());
    // Pages of up to 100 documents: a batch can take the handler longer than the rates' time
    // constant (1 s at these timings), and the figure is read right after one, at its lease's
    // write.
    let worker = env
        .processor(env.options("a"), handler.clone())
        .await
        .start()
        .await
        .expect("start");
    let drained = eventually(Duration::from_secs(30), || async {
        handler.handled.load(Ordering::SeqCst) >= 800 && reported(&env).await.len() == 4
    })
    .await;
    assert!(
        drained,
        "{} handled, reports {:?}",
        handler.handled.load(Ordering::SeqCst),
        reported(&env).await
    );
    let busy = reported(&env).await;
    let took = match (handler.first.get(), handler.drained.get()) {
        (Some(first), Some(drained)) => drained.duration_since(*first).as_secs_f64(),
        _ => f64::NAN,
    };
    println!(
        "800 handled in {took:.1} s from the first batch: {:.0} a second",
        800.0 / took
    );
    // A trickle: 5 a second for 5 s, each handled in 10 ms.
    for n in 0..25 {
        crate::common::upsert_doc(&env.items, 10_000 + n).await;
        tokio::time::sleep(Duration::from_secs_f64(1.0 / TRICKLE)).await;
    }
    let trickled = reported(&env).await;
    println!("workerHandledPerSecond: draining {busy:.1?}; on a trickle {trickled:.1?}");
    for rate in &busy {
        assert!(
            (60.0..=110.0).contains(rate),
            "{rate} a second reported of a 100/s worker draining a backlog"
        );
    }
    // On a trickle each document's stretch of work also holds the read that returned it and
    // the one that found the lease caught up, slower on a loaded machine: what matters is that
    // it is not the trickle, which a handled rate would report.
    for rate in &trickled {
        assert!(
            (4.0 * TRICKLE..=110.0).contains(rate),
            "{rate} a second reported of a 100/s worker on a trickle of {TRICKLE}/s"
        );
    }
    worker.stop().await;
}
