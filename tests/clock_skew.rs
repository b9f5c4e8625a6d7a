//! Two `cfp worker` processes whose wall clocks differ by more than the lease expiration (one runs
//! under Debian's libfaketime, its monotonic clock untouched, as on a node whose time sync broke):
//! neither takes the other's live leases (no lease moves, nothing delivered twice without a
//! crash), and a `kill -9` failover to the instance whose clock is behind takes one expiration,
//! not the expiration plus the skew.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use changefeed_operator::cosmos::{AccountAuth, CosmosAccount};
use changefeed_operator::processor::LeaseStore;

use crate::common::DiesWithTest;
use crate::common::{CFP, cfp_write, lease_store, start_emulator, terminate};

/// The lease expiration of these workers; the skew is larger.
const EXPIRATION: Duration = Duration::from_secs(3);
const LEASES: usize = 8;

/// What the workers reported: documents delivered (by id, how often) and leases taken from a
/// live owner ("lease acquired" with a previous owner), by worker.
#[derive(Default)]
struct Seen {
    deliveries: HashMap<String, usize>,
    moves: HashMap<String, usize>,
}

/// Starts `cfp worker` `name`, its wall clock skewed by `skew` when given (libfaketime), recording into `seen`.
fn worker(endpoint: &str, name: &str, skew: Option<&str>, seen: &Arc<Mutex<Seen>>) -> Child {
    let mut command = Command::new(CFP);
    if let Some(skew) = skew {
        command.with_skewed_clock(skew);
    }
    command
        .args([
            "worker",
            "--endpoint",
            endpoint,
            "--database",
            "db",
            "--container",
            "items",
        ])
        .args(["--instance", name, "--handler", "stdout", "--poll-interval", "100ms"])
        .args(["--lease-acquire-interval", "500ms", "--lease-renew-interval", "500ms"])
        .args(["--lease-expiration", &format!("{}s", EXPIRATION.as_secs())])
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .dies_with_test();
    let mut child = command
        .spawn()
        .expect("spawn cfp worker (faketime is Debian's package faketime)");
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let documents = seen.clone();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout.expect("stdout")).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let doc: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if let (Some(id), Ok(mut seen)) = (doc["id"].as_str(), documents.lock()) {
                *seen.deliveries.entry(id.to_owned()).or_default() += 1;
            }
        }
    });
    let (logs, name) = (seen.clone(), name.to_owned());
    tokio::spawn(async move {
        let mut lines = BufReader::new(stderr.expect("stderr")).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("lease acquired")
                && line.contains("previous_owner=Some")
                && let Ok(mut seen) = logs.lock()
            {
                *seen.moves.entry(name.clone()).or_default() += 1;
            }
        }
    });
    child
}

/// Who owns how many leases now (expired ones included).
async fn owners(endpoint: &str) -> HashMap<String, usize> {
    let mut owners = HashMap::new();
    let Ok(account) = CosmosAccount::connect(endpoint, &AccountAuth::emulator_key()).await else {
        return owners;
    };
    let Some(store) = lease_store(&account, "changefeed").await else {
        return owners;
    };
    if let Ok(snapshot) = store.snapshot().await {
        for lease in snapshot.leases {
            *owners.entry(lease.owner.unwrap_or_default()).or_default() += 1;
        }
    }
    owners
}

/// Waits (bounded) until `check` holds for the owners; how long it took.
async fn until(endpoint: &str, limit: Duration, check: impl Fn(&HashMap<String, usize>) -> bool) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if check(&owners(endpoint).await) {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_clock_is_behind_by_more_than_the_expiration_keeps_its_leases_and_fails_over_in_one_expiration()
{
    skewed_pair("-8s").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_clock_is_ahead_by_more_than_the_expiration_takes_no_live_lease() {
    skewed_pair("+8s").await;
}

/// Two workers, one with its wall clock `skew` off: steady work moves no lease and delivers
/// nothing twice; then the one whose clock is right is killed and the skewed one takes over.
async fn skewed_pair(skew: &str) {
    let (mut emulator, endpoint) = start_emulator(&format!("db/items:/pk:{LEASES}")).await;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut right = worker(&endpoint, "right", None, &seen);
    let mut skewed = worker(&endpoint, "skewed", Some(skew), &seen);
    let balanced = until(&endpoint, Duration::from_secs(30), |o| {
        o.get("right") == Some(&(LEASES / 2)) && o.get("skewed") == Some(&(LEASES / 2))
    })
    .await;
    // Balancing hands leases over for a moment after the counts first look even: wait until no
    // lease has moved for two seconds (bounded).
    let moved = || seen.lock().map(|s| s.moves.values().sum::<usize>()).unwrap_or_default();
    let mut moves_before = moved();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = moved();
        if now == moves_before {
            break;
        }
        moves_before = now;
    }
    // Steady work for several expirations: nothing may move, nothing may come twice.
    for round in 0..8u64 {
        cfp_write(&endpoint, round * 50, 50).await;
        tokio::time::sleep(Duration::from_millis(750)).await;
    }
    let delivered = tokio::time::timeout(Duration::from_secs(20), async {
        while seen.lock().map(|s| s.deliveries.len()).unwrap_or_default() < 400 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .is_ok();
    let (moves, duplicates) = {
        let seen = seen.lock().expect("not poisoned");
        let moves: usize = seen.moves.values().sum();
        (
            moves - moves_before,
            seen.deliveries.values().filter(|n| **n > 1).count(),
        )
    };
    // The instance whose clock is right crashes: the skewed one takes its leases once it has
    // seen them unrenewed for an expiration — not the expiration plus (or minus) the skew.
    right.start_kill().expect("kill -9");
    let _ = right.wait().await;
    let failover = until(&endpoint, Duration::from_secs(30), |o| o.get("skewed") == Some(&LEASES)).await;
    println!(
        "clocks {skew} apart, expiration {EXPIRATION:?}: balanced after {balanced:?}; under writes {moves} lease moves and {duplicates} documents delivered twice (all 400 delivered: {delivered}); kill -9 failover to the skewed instance took {failover:?}"
    );
    terminate(&mut skewed).await;
    terminate(&mut emulator).await;
    assert!(balanced.is_some(), "the two workers share the leases");
    assert!(delivered);
    assert_eq!(moves, 0, "no lease is taken from a live owner whatever the clocks say");
    assert_eq!(duplicates, 0, "nothing is delivered twice without a crash");
    let failover = failover.expect("the leases of the crashed instance are taken");
    assert!(
        failover <= EXPIRATION + Duration::from_secs(2),
        "failover {failover:?}: at most the expiration plus a listing and its margin"
    );
}

/// Writes the bootstrap lock of processor `proc` as an instance whose clock is `skew` off did.
async fn skewed_lock(env: &crate::common::Env, skew: time::Duration) -> String {
    skewed_marker(env, "lock", "holder", skew, serde_json::json!({})).await
}

/// Writes the processor's document `{prefix}.{name}` as instance `owner`, whose clock is `skew`
/// off, wrote it (its `timestamp`), with the fields of `extra`; returns its id.
async fn skewed_marker(
    env: &crate::common::Env,
    name: &str,
    owner: &str,
    skew: time::Duration,
    mut extra: serde_json::Value,
) -> String {
    let store = env.store().await;
    let id = format!("{}.{name}", store.prefix());
    let stamp = (time::OffsetDateTime::now_utc() + skew)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let leases = env
        .account
        .documents(crate::common::DB, crate::common::LEASES)
        .await
        .unwrap();
    extra["id"] = id.clone().into();
    extra["Owner"] = owner.into();
    extra["timestamp"] = stamp.into();
    leases.upsert(&id, &extra).await.unwrap();
    id
}

/// The bootstrap lock is judged by how long this instance saw it unchanged (a lease expiration),
/// never by the timestamp its holder's clock wrote: a dead holder's lock stamped an hour ahead is
/// removed (rather than holding every instance back for the hour), and a fresh lock stamped an
/// hour behind is not (two instances would bootstrap together).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bootstrap_lock_is_judged_by_how_long_it_stays_unchanged_not_by_its_holders_clock() {
    let hour = time::Duration::hours(1);
    // A holder whose clock is an hour ahead died while bootstrapping.
    let env = crate::common::Env::new(2).await;
    env.ensure_leases().await;
    skewed_lock(&env, hour).await;
    let started = Instant::now();
    // Starting waits for the bootstrap.
    let late = tokio::time::timeout(Duration::from_secs(15), env.start(env.options("late"))).await;
    let owns = late.is_ok()
        && crate::common::eventually(Duration::from_secs(15), || async {
            env.owners().await.get("late") == Some(&2)
        })
        .await;
    let took = started.elapsed();
    if let Ok(late) = late {
        late.abort();
    }

    // A live holder whose clock is an hour behind has just taken the lock.
    let env = crate::common::Env::new(2).await;
    env.ensure_leases().await;
    let id = skewed_lock(&env, -hour).await;
    let leases = env
        .account
        .documents(crate::common::DB, crate::common::LEASES)
        .await
        .unwrap();
    // Well within the expiration (2 s) of these options: the lock is not touched before. (Starting
    // waits for the bootstrap, so the lock is watched beside it.)
    let watch = async {
        let mut kept = true;
        let until = Instant::now() + Duration::from_millis(700);
        while Instant::now() < until {
            kept &= leases.read(&id, &id).await.unwrap().is_some();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        kept
    };
    let (other, kept) = tokio::join!(env.start(env.options("other")), watch);
    other.abort();
    println!(
        "bootstrap lock: a dead holder's lock stamped an hour ahead held the next instance back {took:.1?} (took all leases: {owns}); a fresh lock stamped an hour behind kept for 0.7 s: {kept}"
    );
    assert!(owns, "the dead holder's lock kept the instance from starting");
    assert!(kept, "a fresh lock was removed because its holder's clock is behind");
}

/// An instance joining a processor that another instance runs waits half to one acquire interval
/// before its first acquire (so that instances starting together count each other), whatever
/// the other's clock wrote into its heartbeat: an hour behind here, which by timestamps looks
/// like nobody runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_waits_for_a_running_instance_whose_clock_is_an_hour_behind() {
    let env = crate::common::Env::new(2).await;
    // Bootstrapped by an instance that has stopped since (its leases released).
    let first = env.start_owning_all("first", 2).await;
    first.stop().await;
    // Another instance runs, its clock an hour behind.
    let extra = serde_json::json!({"liveness": "instance"});
    skewed_marker(&env, "instance.other", "other", -time::Duration::hours(1), extra).await;
    let mut options = env.options("late");
    options.acquire_interval = Duration::from_secs(2);
    let processor = env.processor(options, env.recorder("late")).await;
    let mut events = processor.subscribe();
    let started = Instant::now();
    let late = processor.start().await.unwrap();
    let acquired = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match events.recv().await {
                Ok(changefeed_operator::processor::LeaseEvent::Acquired { .. }) => return started.elapsed(),
                Ok(_) => {}
                Err(error) => panic!("events ended: {error}"),
            }
        }
    })
    .await
    .expect("the newcomer acquired a lease");
    late.abort();
    println!(
        "a newcomer beside an instance whose clock is an hour behind: first acquire after {acquired:.2?} (acquire interval 2 s)"
    );
    assert!(
        acquired >= Duration::from_secs(1),
        "acquired after {acquired:?}: the running instance was taken for gone by its timestamp"
    );
}
