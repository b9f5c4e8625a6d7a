//! An import keeps the processor's change feed mode: the export records it, and the leases an
//! import creates — across a split since the export, and into an empty lease set — are written in
//! it, so that an all-versions-and-deletes worker takes them (its bootstrap refuses leases of
//! another mode). In-process emulator.

use std::time::Duration;

use changefeed_operator::cosmos::{FeedMode, StartFrom};
use changefeed_operator::processor::admin::checkpoint_requests::{
    MoveOptions, Moved, Request, move_checkpoints, read_export,
};
use changefeed_operator::processor::admin::checkpoints::Export;
use changefeed_operator::processor::{CosmosLeaseStore, LeaseStore, ProcessorHandle, ProcessorOptions};

use crate::common::{self, DB, Env, ITEMS, PROCESSOR, eventually, ids};

/// The all-versions-and-deletes options of instance `a` of `processor`.
fn all_versions(env: &Env, processor: &str) -> ProcessorOptions {
    let mut options = env.options("a");
    options.processor_name = processor.into();
    options.mode = FeedMode::AllVersionsAndDeletes;
    options.start_from = StartFrom::Now;
    options
}

/// Starts instance `a` of `processor` in the all-versions-and-deletes mode: its handle, or why
/// it refused to start.
async fn start(env: &Env, processor: &str) -> Result<ProcessorHandle, String> {
    env.processor(all_versions(env, processor), env.recorder("a"))
        .await
        .start()
        .await
        .map_err(|e| e.to_string())
}

/// Until `docs` are delivered, at most 30 s.
async fn delivered(env: &Env, docs: std::ops::Range<usize>) -> bool {
    eventually(Duration::from_secs(30), || async {
        env.deliveries.missing(ids(docs.clone())).is_empty()
    })
    .await
}

fn delivered_of(env: &Env, docs: std::ops::Range<usize>) -> usize {
    ids(docs).iter().filter(|id| env.deliveries.count(id) > 0).count()
}

async fn import(env: &Env, store: &CosmosLeaseStore, export: &Export) -> Moved {
    let monitored = env.account.monitored(DB, ITEMS).await.unwrap();
    let options = MoveOptions {
        holder: "cfp-checkpoints-test".into(),
        take_leases: false,
        other_container: false,
        // What `cfp checkpoints import` passes: the lease set's mode, else the export's.
        mode: None,
        dry_run: false,
        expiration: Duration::from_secs(2),
        watch: Duration::from_millis(375),
        on_watch: None,
    };
    let request = Request::Import(Box::new(export.clone()));
    move_checkpoints(store, &monitored, &request, &options).await.unwrap()
}

fn modes(leases: &[changefeed_operator::processor::Lease]) -> Vec<Option<String>> {
    leases.iter().map(|l| l.mode.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_keeps_the_all_versions_and_deletes_mode_across_a_split_and_into_an_empty_lease_set() {
    let env = Env::new(2).await;
    let a = start(&env, PROCESSOR).await.expect("an all-versions worker starts");
    env.write(0..100).await;
    assert!(delivered(&env, 0..100).await);
    a.stop().await;
    let store = common::lease_store(&env.account, PROCESSOR).await.unwrap();
    let monitored = env.account.monitored(DB, ITEMS).await.unwrap();
    let export = read_export(&store, &monitored).await.unwrap();
    let recorded = serde_json::to_value(&export).unwrap()["mode"].clone();

    // 100 more writes and a split: three leases, all of the mode.
    env.write(100..200).await;
    env.emulator
        .split(DB, ITEMS, None, Duration::from_millis(200))
        .await
        .unwrap();
    env.write(200..300).await;
    let a = start(&env, PROCESSOR).await.expect("the worker starts again");
    assert!(delivered(&env, 100..300).await);
    let split = eventually(Duration::from_secs(20), || async { env.leases().await.len() == 3 }).await;
    a.stop().await;
    assert!(split, "the worker split its lease");

    // Back to the export: the split range is leased whole again.
    let moved = import(&env, &store, &export).await;
    let after_split = modes(&store.snapshot().await.unwrap().leases);
    env.deliveries.clear();
    let again = match start(&env, PROCESSOR).await {
        Ok(a) => {
            let redelivered = delivered(&env, 100..300).await;
            a.stop().await;
            Ok(redelivered)
        }
        Err(refused) => Err(refused),
    };
    let early = delivered_of(&env, 0..100);

    // The same export into the empty lease set of another processor name.
    let copy = common::lease_store(&env.account, "copy").await.unwrap();
    let copied = import(&env, &copy, &export).await;
    let copy_modes = modes(&copy.snapshot().await.unwrap().leases);
    env.deliveries.clear();
    let copy_start = start(&env, "copy").await;
    let copy_delivered = match &copy_start {
        Ok(_) => delivered(&env, 100..300).await,
        Err(_) => false,
    };
    let copy_early = delivered_of(&env, 0..100);
    println!(
        "all-versions-and-deletes export (mode recorded: {recorded}); import across a split ({}): lease modes {after_split:?}, worker (redelivered 100..300) {again:?}, {early} of 0..100; into an empty lease set ({}): modes {copy_modes:?}, worker {:?}, delivered 100..300 {copy_delivered}, {copy_early} of 0..100",
        moved.applied.clone().unwrap_or_default().describe(),
        copied.applied.clone().unwrap_or_default().describe(),
        copy_start.as_ref().map(|_| "started"),
    );
    if let Ok(copy) = copy_start {
        copy.stop().await;
    }
    assert_eq!(recorded, "all-versions-and-deletes");
    let full = Some("Full-Fidelity Feed".to_owned());
    assert!(after_split.iter().all(|m| *m == full), "{after_split:?}");
    assert!(copy_modes.iter().all(|m| *m == full), "{copy_modes:?}");
    assert!(
        again == Ok(true) && early == 0,
        "the worker takes the leases and redelivers what came after the export"
    );
    assert!(
        copy_delivered && copy_early == 0,
        "the copy delivers what came after the export"
    );
}
