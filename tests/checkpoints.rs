//! Checkpoints read, saved and moved (`cfp checkpoints export|import|rewind`): a rewind to the
//! beginning redelivers everything, to now skips the backlog, an import redelivers exactly what
//! came after the export (also across a split since), a running processor is refused unless
//! forced, and a dry run writes nothing. In-process emulator for the processor runs, `cfp
//! emulator` and the `cfp` binary for the command line itself.

use std::time::Duration;

use changefeed_operator::bench::CountingStore;
use changefeed_operator::cosmos::{MonitoredContainer, StartFrom};
use changefeed_operator::processor::admin::checkpoint_apply::MoveError;
use changefeed_operator::processor::admin::checkpoint_requests::{
    MoveOptions, Moved, Request, move_checkpoints, read_export,
};
use changefeed_operator::processor::admin::checkpoints::{Export, PlanError, Selection};
use changefeed_operator::processor::{CosmosLeaseStore, LeaseStore, ProcessorHandle};

use crate::common::DiesWithTest;
use crate::common::{self, DB, Env, ITEMS, PROCESSOR, eventually, ids};

async fn open(env: &Env) -> (MonitoredContainer, CosmosLeaseStore) {
    let monitored = env.account.monitored(DB, ITEMS).await.unwrap();
    let store = common::lease_store(&env.account, PROCESSOR).await.unwrap();
    (monitored, store)
}

/// `force`: take the leases of running instances (`--force`), never another container's export.
fn options(force: bool, dry_run: bool) -> MoveOptions {
    MoveOptions {
        holder: "cfp-checkpoints-test".into(),
        take_leases: force,
        other_container: false,
        mode: None,
        dry_run,
        expiration: Duration::from_secs(2),
        // The test instances' renew interval (300 ms) and a quarter.
        watch: Duration::from_millis(375),
        on_watch: None,
    }
}

fn rewind(to: StartFrom) -> Request {
    Request::Rewind {
        to,
        selection: Selection::default(),
    }
}

async fn carry_out(env: &Env, request: &Request, force: bool) -> Result<Moved, MoveError> {
    let (monitored, store) = open(env).await;
    move_checkpoints(&store, &monitored, request, &options(force, false)).await
}

/// Starts instance `a`, waits until it delivered every document of `docs` and stops it gracefully
/// (its leases released, its heartbeat removed).
async fn process(env: &Env, docs: std::ops::Range<usize>) {
    let a = env.start(env.options("a")).await;
    let delivered = eventually(Duration::from_secs(30), || async {
        env.deliveries.missing(ids(docs.clone())).is_empty()
    })
    .await;
    assert!(delivered, "missing {:?}", env.deliveries.missing(ids(docs)));
    a.stop().await;
}

/// A fresh processor over `partitions` partitions with `docs` written and processed.
async fn processed(partitions: u32, docs: std::ops::Range<usize>) -> Env {
    let env = Env::new(partitions).await;
    let a = env.start(env.options("a")).await;
    env.write(docs.clone()).await;
    assert!(env.delivered_within(docs.len(), Duration::from_secs(30)).await);
    a.stop().await;
    env
}

async fn start_again(env: &Env) -> ProcessorHandle {
    env.deliveries.clear();
    env.start(env.options("a")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewind_to_the_beginning_redelivers_everything() {
    let env = processed(4, 0..400).await;
    let moved = carry_out(&env, &rewind(StartFrom::Beginning), false).await.unwrap();
    let applied = moved.applied.unwrap();
    let a = start_again(&env).await;
    let all = env.delivered_within(400, Duration::from_secs(30)).await;
    let missing = env.deliveries.missing(ids(0..400));
    println!(
        "rewind to beginning: {} leases moved, 400 processed before, redelivered {} distinct, missing {}",
        applied.moved,
        env.deliveries.distinct(),
        missing.len()
    );
    assert!(all && missing.is_empty(), "missing {missing:?}");
    assert_eq!((applied.moved, applied.unreleased.len()), (4, 0));
    assert!(
        env.leases()
            .await
            .iter()
            .all(|l| l.owner.as_deref() != Some("cfp-checkpoints-test"))
    );
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewind_to_now_skips_the_backlog_and_delivers_what_follows() {
    let env = processed(4, 0..100).await;
    env.write(100..400).await;
    carry_out(&env, &rewind(StartFrom::Now), false).await.unwrap();
    env.write(400..450).await;
    let a = start_again(&env).await;
    let after = eventually(Duration::from_secs(30), || async {
        env.deliveries.missing(ids(400..450)).is_empty()
    })
    .await;
    // Every range got some of 400..450, and a range delivers in order: had any of its backlog
    // been read, it would have come before them.
    let backlog = delivered_of(&env, 100..400);
    println!(
        "rewind to now: backlog 300 written while stopped, delivered {backlog} of it; 50 written after the rewind, delivered {}",
        50 - env.deliveries.missing(ids(400..450)).len()
    );
    assert!(after, "missing {:?}", env.deliveries.missing(ids(400..450)));
    assert_eq!(backlog, 0);
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_redelivers_exactly_what_came_after_the_export_across_a_split() {
    let env = processed(2, 0..300).await;
    let (monitored, store) = open(&env).await;
    let export: Export = read_export(&store, &monitored).await.unwrap();
    let json = serde_json::to_string(&export).unwrap();
    env.write(300..400).await;
    let partitions = env
        .emulator
        .split(DB, ITEMS, None, Duration::from_millis(200))
        .await
        .unwrap();
    env.write(400..500).await;
    process(&env, 300..500).await;
    let after_split = env.leases().await.len();
    assert_eq!((partitions.len(), after_split), (3, 3), "the processor split its lease");
    let export: Export = serde_json::from_str(&json).unwrap();
    let moved = carry_out(&env, &Request::Import(Box::new(export.clone())), false)
        .await
        .unwrap();
    // The same export fills the empty lease set of another processor name.
    let copy = common::lease_store(&env.account, "copy").await.unwrap();
    let copied = move_checkpoints(
        &copy,
        &monitored,
        &Request::Import(Box::new(export.clone())),
        &options(false, false),
    )
    .await
    .unwrap();
    let copies = copy.snapshot().await.unwrap().leases;
    assert_eq!(copied.applied.map(|a| a.created), Some(2));
    assert_eq!(
        copies.iter().map(|l| l.continuation.clone()).collect::<Vec<_>>(),
        export.leases.iter().map(|l| l.continuation.clone()).collect::<Vec<_>>()
    );
    assert!(
        copies
            .iter()
            .all(|l| l.owner.is_none() && l.id.starts_with(copy.prefix()))
    );
    let a = start_again(&env).await;
    let all = eventually(Duration::from_secs(30), || async {
        env.deliveries.missing(ids(300..500)).is_empty() && env.leases().await.len() == 3
    })
    .await;
    let early = delivered_of(&env, 0..300);
    println!(
        "export → 200 more writes and a split (leases 2 → {after_split}) → import ({}): redelivered {} distinct of the 200 after the export, {early} of the 300 before it, leases now {}",
        moved.applied.clone().unwrap_or_default().describe(),
        env.deliveries.distinct() - early,
        env.leases().await.len()
    );
    assert!(all, "missing {:?}", env.deliveries.missing(ids(300..500)));
    assert_eq!(early, 0, "nothing from before the export");
    let applied = moved.applied.unwrap();
    assert_eq!((applied.moved, applied.created, applied.deleted), (1, 1, 2));
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_processor_is_refused_and_force_takes_its_leases() {
    let env = Env::new(2).await;
    let a = env.start_owning_all("a", 2).await;
    env.write(0..200).await;
    assert!(env.delivered_within(200, Duration::from_secs(30)).await);
    // After the last batch its checkpoint and the caught-up report still come: compared once the
    // owner has nothing left to write.
    let before = quiet_leases(&env).await;
    let refused = carry_out(&env, &rewind(StartFrom::Beginning), false).await;
    let Err(MoveError::Live(signs)) = refused else {
        panic!("not refused: {refused:?}")
    };
    let unchanged = env.leases().await;
    assert_eq!(
        before.iter().map(|l| &l.etag).collect::<Vec<_>>(),
        unchanged.iter().map(|l| &l.etag).collect::<Vec<_>>()
    );
    let message = MoveError::Live(signs.clone()).to_string();
    assert!(message.contains("instance a sent a heartbeat"), "{message}");
    env.deliveries.clear();
    let forced = carry_out(&env, &rewind(StartFrom::Beginning), true).await.unwrap();
    // The running instance loses its leases, takes them back free and reads them from the start.
    let again = env.delivered_within(200, Duration::from_secs(30)).await;
    println!(
        "refused while running: {} sign(s) ({message}); forced: {}, redelivered {} of 200",
        signs.len(),
        forced.applied.clone().unwrap_or_default().describe(),
        env.deliveries.distinct()
    );
    assert!(again, "missing {:?}", env.deliveries.missing(ids(0..200)));
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_changes_nothing_and_a_time_is_a_start_position() {
    let env = processed(2, 0..100).await;
    let (monitored, store) = open(&env).await;
    let before = env.leases().await;
    let at = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
    let dry = move_checkpoints(&store, &monitored, &rewind(StartFrom::Time(at)), &options(false, true))
        .await
        .unwrap();
    assert!(dry.applied.is_none());
    assert_eq!(dry.plan.moves.len(), 2);
    assert_eq!(env.leases().await, before, "a dry run writes nothing");
    carry_out(&env, &rewind(StartFrom::Time(at)), false).await.unwrap();
    let leases = env.leases().await;
    assert!(
        leases
            .iter()
            .all(|l| l.continuation.is_none() && l.start_from(StartFrom::Now) == StartFrom::Time(at)),
        "{leases:?}"
    );
    // The in-memory emulator ignores a start time (it reads from the beginning): all that can be
    // shown here is that nothing after the time is lost.
    let a = start_again(&env).await;
    let all = env.delivered_within(100, Duration::from_secs(30)).await;
    println!(
        "dry run: {} moves planned, 0 written; rewind to {at}: leases without continuation, start property set; delivered {} of 100 (the emulator ignores the time)",
        dry.plan.moves.len(),
        env.deliveries.distinct()
    );
    assert!(all);
    a.stop().await;
}

/// How many of `docs` were delivered (at least once).
/// The leases once their owners write nothing more for a second (bounded: 20 s).
async fn quiet_leases(env: &Env) -> Vec<changefeed_operator::processor::Lease> {
    let etags =
        |leases: &[changefeed_operator::processor::Lease]| leases.iter().map(|l| l.etag.clone()).collect::<Vec<_>>();
    let mut last = env.leases().await;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = env.leases().await;
        if etags(&now) == etags(&last) {
            return now;
        }
        last = now;
    }
    panic!("the leases kept changing: {last:?}")
}

fn delivered_of(env: &Env, docs: std::ops::Range<usize>) -> usize {
    ids(docs).iter().filter(|id| env.deliveries.count(id) > 0).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_starting_in_the_middle_of_a_rewind_reads_all_leases_moved_or_none() {
    let env = processed(4, 0..400).await;
    let (monitored, store) = open(&env).await;
    // Every request of the command takes 400 ms: the worker starts while it claims and moves.
    let slow = CountingStore::new(std::sync::Arc::new(store)).with_latency(Duration::from_millis(400));
    env.deliveries.clear();
    let rewind_to_beginning = rewind(StartFrom::Beginning);
    let not_forced = options(false, false);
    let done = std::sync::atomic::AtomicBool::new(false);
    let command = async {
        let result = move_checkpoints(&slow, &monitored, &rewind_to_beginning, &not_forced).await;
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        result
    };
    let worker = async {
        // The command claimed a lease (or, when it failed before, ended).
        let started = eventually(Duration::from_secs(10), || async {
            done.load(std::sync::atomic::Ordering::SeqCst)
                || env
                    .leases()
                    .await
                    .iter()
                    .any(|l| l.owner.as_deref() == Some("cfp-checkpoints-test"))
        })
        .await;
        assert!(started, "the command neither claimed a lease nor ended");
        let leases = env.leases().await;
        let moved_at_start = leases.iter().filter(|l| l.continuation.is_none()).count();
        (env.start(env.options("b")).await, moved_at_start)
    };
    let (result, (b, moved_at_start)) = tokio::join!(command, worker);
    // What follows in every range shows that range's position was read.
    env.write(400..450).await;
    let followed = eventually(Duration::from_secs(30), || async {
        env.deliveries.missing(ids(400..450)).is_empty()
    })
    .await;
    assert!(followed, "missing {:?}", env.deliveries.missing(ids(400..450)));
    let backlog = delivered_of(&env, 0..400);
    println!(
        "worker started mid-rewind (once a lease was claimed; {moved_at_start} of 4 moved then): command {}, redelivered {backlog} of the 400 before (all or nothing)",
        match &result {
            Ok(moved) => moved.applied.clone().unwrap_or_default().describe(),
            Err(error) => format!("failed and put back: {error}"),
        }
    );
    match result {
        Ok(_) => assert_eq!(backlog, 400, "every lease read from the beginning"),
        Err(_) => assert_eq!(backlog, 0, "no lease read from the beginning"),
    }
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_in_the_middle_puts_every_lease_back() {
    let env = processed(2, 0..100).await;
    let (_, store) = open(&env).await;
    let before = env.leases().await;
    let mut plan = changefeed_operator::processor::admin::checkpoints::plan_rewind(
        &before,
        StartFrom::Beginning,
        &Selection::default(),
        &Default::default(),
    )
    .unwrap();
    // The last step creates a lease that exists already: it fails after both leases moved.
    plan.creates.push(before[0].clone());
    let failed = changefeed_operator::processor::admin::checkpoint_apply::apply(
        &store,
        &plan,
        "cfp-checkpoints-test",
        Duration::from_secs(2),
    )
    .await;
    let after = env.leases().await;
    let positions = |leases: &[changefeed_operator::processor::Lease]| {
        leases
            .iter()
            .map(|l| {
                (
                    l.id.clone(),
                    l.continuation.clone(),
                    l.owner.clone(),
                    l.properties.clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    let snapshot = store.snapshot().await.unwrap();
    println!(
        "a failure after 2 moves: {}; leases as before: {}; command heartbeat left: {}",
        failed.as_ref().err().map(ToString::to_string).unwrap_or_default(),
        positions(&after) == positions(&before),
        snapshot.instances.len()
    );
    assert!(failed.is_err());
    assert_eq!(positions(&after), positions(&before));
    assert!(snapshot.instances.is_empty(), "the command's heartbeat is removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_container_too_slow_for_the_expiration_changes_nothing() {
    let env = processed(2, 0..50).await;
    let (monitored, store) = open(&env).await;
    let before = env.leases().await;
    // Claiming takes 1.2 s, more than half the expiration (2 s): no move may start.
    let slow = CountingStore::new(std::sync::Arc::new(store)).with_latency(Duration::from_millis(1200));
    let result = move_checkpoints(&slow, &monitored, &rewind(StartFrom::Beginning), &options(false, false)).await;
    let after = env.leases().await;
    let kept = after
        .iter()
        .zip(&before)
        .filter(|(a, b)| (&a.continuation, &a.owner) == (&b.continuation, &b.owner))
        .count();
    println!(
        "1.2 s per request, expiration 2 s: {}; leases kept as they were: {kept} of {}",
        result.as_ref().err().map(ToString::to_string).unwrap_or_default(),
        before.len()
    );
    assert!(
        matches!(result, Err(MoveError::TooSlow { leases: 2, .. })),
        "{result:?}"
    );
    assert_eq!(kept, before.len());
}

/// `cfp checkpoints <args>` for processor instances renewing every 300 ms (the command watches
/// the lease container that long and a quarter before it moves anything).
async fn cfp_checkpoints(endpoint: &str, args: &[&str]) -> (Option<i32>, String, String) {
    // An export watches for nothing: it has no lease timings to give.
    let watch: &[&str] = if args[0] == "export" {
        &[]
    } else {
        &["--lease-renew-interval", "300ms"]
    };
    let flags = [&args[1..], watch].concat();
    common::cfp_checkpoints(endpoint, args[0], &flags).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_worker_whose_clock_is_an_hour_behind_is_refused_too() {
    let (mut emulator, endpoint) = common::start_emulator("db/items:/pk:2").await;
    let mut worker = tokio::process::Command::new(common::CFP)
        .with_skewed_clock("-1h")
        .args(["worker", "--endpoint", &endpoint])
        .args(["--database", "db", "--container", "items", "--instance", "behind"])
        .args(["--lease-renew-interval", "300ms", "--lease-expiration", "2s"])
        .args(["--lease-acquire-interval", "500ms"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .dies_with_test()
        .spawn()
        .expect("spawn cfp worker under faketime (Debian's package faketime)");
    let owned = eventually(Duration::from_secs(30), || async {
        let (code, out, _) = cfp_checkpoints(&endpoint, &["export"]).await;
        code == Some(0)
            && serde_json::from_str::<Export>(&out)
                .is_ok_and(|e| e.leases.iter().filter(|l| l.owner.as_deref() == Some("behind")).count() == 2)
    })
    .await;
    assert!(owned, "the worker did not take both leases");
    // Idle: its leases are not written again; only its heartbeat beats, an hour in the past.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (code, _, refused) = cfp_checkpoints(&endpoint, &["rewind", "--to", "now", "--lease-expiration", "2s"]).await;
    println!("a worker an hour behind: {}", refused.trim());
    assert_eq!(code, Some(1), "not refused: {refused}");
    assert!(refused.contains("instance behind sent a heartbeat"), "{refused}");
    common::terminate(&mut worker).await;
    common::terminate(&mut emulator).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_exports_refuses_a_running_worker_and_rewinds() {
    let (mut emulator, endpoint) = common::start_emulator("db/items:/pk:2").await;
    let mut worker = common::cfp_worker(&endpoint)
        .args([
            "--lease-renew-interval",
            "300ms",
            "--lease-expiration",
            "2s",
            "--lease-acquire-interval",
            "500ms",
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    common::cfp_write(&endpoint, 0, 50).await;
    let exported = eventually(Duration::from_secs(30), || async {
        let (code, out, _) = cfp_checkpoints(&endpoint, &["export"]).await;
        code == Some(0)
            && serde_json::from_str::<Export>(&out)
                .is_ok_and(|e| e.leases.len() == 2 && e.leases.iter().all(|l| l.lsn.is_some()))
    })
    .await;
    assert!(exported, "no export with a checkpoint per lease");
    let (code, _, refused) = cfp_checkpoints(&endpoint, &["rewind", "--to", "beginning"]).await;
    assert_eq!(code, Some(1), "{refused}");
    assert!(
        refused.contains("the processor is running") && refused.contains("--force"),
        "{refused}"
    );
    common::terminate(&mut worker).await;
    let (code, dry, dry_err) = cfp_checkpoints(&endpoint, &["rewind", "--to", "beginning", "--dry-run"]).await;
    assert_eq!(code, Some(0), "{dry_err}");
    assert!(dry.contains("dry run: 2 lease(s) would move"), "{dry}");
    let (code, out, err) = cfp_checkpoints(&endpoint, &["rewind", "--to", "now", "--range", "-FF"]).await;
    assert_eq!(code, Some(0), "{err}");
    let (code, _, bad) = cfp_checkpoints(&endpoint, &["import", "/nonexistent/export.json"]).await;
    println!(
        "cfp checkpoints: refused while running: {}; dry run: {}; rewind: {}; bad file: {}",
        refused.trim(),
        dry.lines().last().unwrap_or_default(),
        out.lines().last().unwrap_or_default(),
        bad.trim()
    );
    assert!(out.contains("moved 2 lease(s)"), "{out}");
    assert_eq!(code, Some(1));
    assert!(bad.contains("cannot read /nonexistent/export.json"), "{bad}");
    common::terminate(&mut emulator).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_of_another_container_is_refused_at_once_even_with_the_same_resource_id() {
    let env = processed(2, 0..20).await;
    let (monitored, store) = open(&env).await;
    let mut export: Export = read_export(&store, &monitored).await.unwrap();
    // Taken of db/orders on an earlier emulator that handed out the same resource ids.
    export.container = format!("{DB}/orders");
    let watching = MoveOptions {
        watch: Duration::from_secs(60),
        ..options(false, true)
    };
    let started = std::time::Instant::now();
    let result = tokio::time::timeout(
        Duration::from_secs(10),
        move_checkpoints(
            &store,
            &monitored,
            &Request::Import(Box::new(export.clone())),
            &watching,
        ),
    )
    .await;
    println!(
        "an export of db/orders imported into {DB}/{ITEMS} (same resource id): {:?} after {:?}",
        result
            .as_ref()
            .map(|r| r.as_ref().map(|_| ()).map_err(ToString::to_string)),
        started.elapsed()
    );
    let refused = result.expect("refused before watching the lease container for 60 s");
    let error = refused.expect_err("another container's export is refused").to_string();
    assert!(
        error.contains("db/orders") && error.contains(&format!("{DB}/{ITEMS}")),
        "{error}"
    );
    // Taking the leases of running instances (--force) is no leave to apply it.
    let import = Request::Import(Box::new(export));
    let forced = move_checkpoints(&store, &monitored, &import, &options(true, true)).await;
    assert!(
        matches!(forced, Err(MoveError::Plan(PlanError::OtherContainer { .. }))),
        "{forced:?}"
    );
    // Only the switch named for it applies it.
    let other_container = MoveOptions {
        other_container: true,
        ..options(false, true)
    };
    let planned = move_checkpoints(&store, &monitored, &import, &other_container).await;
    println!(
        "with take_leases: {}; with other_container: {:?}",
        forced.map(|_| ()).unwrap_err(),
        planned.as_ref().map(|m| m.plan.lines())
    );
    assert!(planned.is_ok_and(|m| m.plan.moves.len() == 2));
}

/// The resource id of `db/items` on the `cfp emulator` at `endpoint`.
async fn items_rid(endpoint: &str) -> String {
    let answer = reqwest::Client::new()
        .get(format!("{endpoint}dbs/{DB}/colls/{ITEMS}"))
        .header("x-ms-version", "2020-07-15")
        .send()
        .await
        .expect("the emulator answers");
    let body = answer.bytes().await.expect("the emulator's answer");
    let container: serde_json::Value = serde_json::from_slice(&body).expect("a container as JSON");
    container["_rid"].as_str().expect("a resource id").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_emulator_run_gives_its_containers_resource_ids_of_their_own() {
    let spec = format!("{DB}/{ITEMS}:/pk:2");
    let (mut first, first_endpoint) = common::start_emulator(&spec).await;
    let (mut second, second_endpoint) = common::start_emulator(&spec).await;
    let rids = (items_rid(&first_endpoint).await, items_rid(&second_endpoint).await);
    println!("{DB}/{ITEMS} on two emulator runs: resource ids {rids:?}");
    // The database ids part (the first 4 bytes) varies by up to 65,535: equal by chance once in that many runs.
    assert_ne!(
        rids.0, rids.1,
        "an export of one run would apply to the other's container"
    );
    common::terminate(&mut first).await;
    common::terminate(&mut second).await;
}
