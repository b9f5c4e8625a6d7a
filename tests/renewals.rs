//! Renewals never wait behind other work: 500 leases on one instance, against `cfp emulator` on
//! loopback answering every request slowly and failing a tenth of them (429, 503) while documents
//! keep the leases checkpointing. With each lease renewed on its own (what every instance does
//! beside an older version, in a fleet mid-upgrade), every lease stays written (renewed or
//! checkpointed) at least once per renew interval plus the slowest request; with instance
//! liveness (the default) the heartbeat, the one write that keeps all 500 alive, keeps that
//! interval. The figures are printed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use changefeed_operator::bench::CountingStore;
use changefeed_operator::cosmos::{AccountAuth, CosmosAccount, StartFrom};
use changefeed_operator::processor::{Batch, ChangeHandler, HandlerError, LeaseLiveness, Processor, ProcessorOptions};
use changefeed_operator::worker::WorkerSettings;

use crate::common::{self, DB, ITEMS, LEASES, PROCESSOR};

const LEASES_WANTED: usize = 500;
const RENEW: Duration = Duration::from_secs(2);

/// Counts the documents it is given.
#[derive(Default)]
struct Count(AtomicUsize);

#[async_trait]
impl ChangeHandler for Count {
    async fn handle(&self, batch: Batch<'_>) -> Result<(), HandlerError> {
        self.0.fetch_add(batch.documents.len(), Ordering::SeqCst);
        Ok(())
    }
}

/// What one run measured.
struct Measured {
    /// The longest time a lease went without a successful write, and the slowest lease write.
    lease_gap: Duration,
    slowest_write: Duration,
    /// The longest time between two successful heartbeats, and the slowest heartbeat.
    beat_gap: Duration,
    slowest_beat: Duration,
}

/// Scheduling slack for 500 tasks on two cores.
const SLACK: Duration = Duration::from_millis(250);

/// Both ways of keeping leases alive, one after the other in one test: each holds
/// `common::heavy()`, and as two tests the second would hold a test thread idle while the first
/// runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lease_and_the_heartbeat_that_keeps_500_alive_keep_their_interval_under_throttling_and_a_slow_store() {
    let m = measure(LeaseLiveness::EachLease).await;
    assert!(
        m.lease_gap < RENEW + m.slowest_write + SLACK,
        "each lease renewed on its own: a lease went {:?} without a write (renew interval {RENEW:?}, slowest write {:?})",
        m.lease_gap,
        m.slowest_write
    );
    let m = measure(LeaseLiveness::Instance).await;
    assert!(
        m.beat_gap < RENEW + m.slowest_beat + SLACK,
        "instance liveness: the heartbeat went {:?} unwritten (renew interval {RENEW:?}, slowest heartbeat {:?})",
        m.beat_gap,
        m.slowest_beat
    );
}

/// Runs one instance over 500 leases, keeping them alive as `liveness` says, under faults.
async fn measure(liveness: LeaseLiveness) -> Measured {
    let _heavy = common::heavy().await;
    let (_emulator, endpoint) = common::start_emulator("db/items:/pk:10").await;
    let account = CosmosAccount::connect(&endpoint, &AccountAuth::emulator_key())
        .await
        .unwrap();
    let mut options = ProcessorOptions::new(PROCESSOR, "many");
    options.leases_per_partition = 50;
    options.renew_interval = RENEW;
    options.acquire_interval = RENEW;
    options.expiration = Duration::from_secs(30);
    options.poll_interval = Duration::from_secs(5);
    options.start_from = StartFrom::Beginning;
    options.liveness = liveness;
    let settings = WorkerSettings {
        database: DB.into(),
        container: ITEMS.into(),
        lease_database: DB.into(),
        lease_container: LEASES.into(),
        create_leases: true,
        options: options.clone(),
    };
    let (monitored, store) = common::open_containers(&account, &settings).await;
    let counting = Arc::new(CountingStore::new(Arc::new(store)));
    let writes = counting.writes.clone();
    let beats = counting.beats.clone();
    let handled = Arc::new(Count::default());
    let handle = Processor::new(monitored, counting, handled.clone(), options)
        .start()
        .await
        .unwrap();
    let all = common::eventually(Duration::from_secs(90), || async { writes.leases() >= LEASES_WANTED }).await;
    assert!(all, "the instance took {} of {LEASES_WANTED} leases", writes.leases());

    // Documents keep leases checkpointing while the store is slow and failing.
    let items = account.documents(DB, ITEMS).await.unwrap();
    let writing = tokio::spawn(async move {
        for n in 0.. {
            common::upsert_doc(&items, n).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let faults = "faults?rate=0.1&kinds=429,503&latencyMs=40";
    common::emulator_control(&endpoint, reqwest::Method::POST, faults).await;
    // One interval for the schedule to settle under the faults, then three measured.
    tokio::time::sleep(RENEW).await;
    writes.restart();
    beats.restart();
    tokio::time::sleep(RENEW * 3).await;
    let gap = writes.longest_gap();
    let slowest = writes.slowest();
    let (beat_gap, slowest_beat) = (beats.longest_gap(), beats.slowest());
    let injected = common::emulator_control(&endpoint, reqwest::Method::GET, "faults").await;
    writing.abort();
    handle.abort();
    println!(
        "renewals ({liveness:?}): {} leases on one instance, renew interval {RENEW:?}, 10 % of requests failing and each answered in 20-60 ms: longest time a lease went unwritten {gap:?}, slowest write {slowest:?}; longest between heartbeats {beat_gap:?}, slowest heartbeat {slowest_beat:?}; injected {}; {} documents handled",
        writes.leases(),
        injected["injected"],
        handled.0.load(Ordering::SeqCst)
    );
    Measured {
        lease_gap: gap,
        slowest_write: slowest,
        beat_gap,
        slowest_beat,
    }
}
