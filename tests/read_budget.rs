//! The read budget (issue 55 §1): a fleet draining a backlog reads within the request units a
//! second it was given, whatever the backlog, so that the application keeps its throughput. The
//! emulator charges a change feed page by what it returns (`1 + KB`), from the container's
//! provisioned throughput (4,000 RU/s here: the budget, not the container, must be what holds
//! the fleet back). Three in-process instances with `read_budget = 400` drain 6,000 documents of
//! about 2 KB (~12,000 RU of pages: half a minute at the budget, three seconds at the
//! container's throughput); over ten seconds once the leases are shared, the change feed reads
//! spent 320–440 RU/s, the backlog was not drained (so the budget, not the backlog, held them
//! back), and no read was refused (none reached the container's limit). The same fleet without a
//! budget, its reads in a throughput bucket of 10 % of the container, reads at about the bucket's
//! 400 RU/s (the emulator refuses the rest 429/3212 as the service does; pages under way when a
//! window's share runs out overshoot it). The figures are printed.

use std::time::{Duration, Instant};

use changefeed_operator::cosmos::DocumentContainer;
use changefeed_operator::emulator::{ContainerSpec, Emulator};
use changefeed_operator::processor::{ProcessorHandle, ReadBudget};
use futures::StreamExt;
use serde_json::json;

use crate::common::{DB, Env, ITEMS, eventually};

/// The fleet's read budget (RU/s).
const BUDGET: u32 = 400;
/// Documents in the backlog.
const BACKLOG: usize = 6_000;
/// How long the reads are measured once the leases are shared.
const WINDOW: Duration = Duration::from_secs(10);

/// Writes the backlog: `BACKLOG` documents of about 2 KB (the SDK retries its writes' 429s).
async fn write_backlog(items: &DocumentContainer) {
    let payload = "x".repeat(2_000);
    futures::stream::iter(0..BACKLOG)
        .for_each_concurrent(32, |n| {
            let body = json!({"id": format!("doc-{n}"), "pk": format!("pk-{}", n % 97), "payload": payload});
            async move {
                for attempt in 0.. {
                    match items.upsert(body["pk"].as_str().unwrap_or_default(), &body).await {
                        Ok(_) => return,
                        Err(e) if attempt < 100 && e.kind.is_retryable() => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        Err(e) => panic!("write doc-{n}: {e}"),
                    }
                }
            }
        })
        .await;
}

/// Change feed request units the monitored container charged so far (what is not writes), and
/// its requests refused.
fn read_load(emulator: &Emulator) -> (f64, u64) {
    let load = emulator.load(DB, ITEMS);
    (load.request_units - load.write_units, load.throttled)
}

/// What the fleet read over [`WINDOW`] once the leases were shared.
struct Drained {
    /// Read request units a second.
    rate: f64,
    /// Documents delivered by the end of the window, in all.
    delivered: usize,
    /// The monitored container's answers by the end.
    load: changefeed_operator::emulator::ContainerLoad,
}

/// Three instances with `options` as `shape` makes them drain the backlog from a container of
/// 4,000 RU/s (`emulator` shapes the account first): what they read once the 12 leases are
/// shared.
async fn drain(
    configure: impl FnOnce(&Emulator),
    shape: impl Fn(&mut changefeed_operator::processor::ProcessorOptions),
) -> Drained {
    let emulator = Emulator::in_process();
    let spec = ContainerSpec {
        database: DB.into(),
        container: ITEMS.into(),
        partition_key: "/pk".into(),
        partitions: 4,
    };
    emulator
        .create_container_with_throughput(&spec, Some(4_000))
        .await
        .expect("create the monitored container");
    configure(&emulator);
    let env = Env::on(emulator).await;
    write_backlog(&env.items).await;
    let mut handles: Vec<ProcessorHandle> = Vec::new();
    for name in ["a", "b", "c"] {
        let mut options = env.options(name);
        options.leases_per_partition = 3;
        options.acquire_interval = Duration::from_secs(1);
        shape(&mut options);
        let processor = env.processor(options, env.recorder(name)).await;
        handles.push(processor.start().await.expect("start"));
    }
    let shared = eventually(Duration::from_secs(60), || async {
        handles.iter().all(|h| (3..=5).contains(&h.owned_leases().len()))
    })
    .await;
    let owned: Vec<usize> = handles.iter().map(|h| h.owned_leases().len()).collect();
    assert!(shared, "the 12 leases were not shared among the three: {owned:?}");
    let (read_before, _) = read_load(&env.emulator);
    let started = Instant::now();
    tokio::time::sleep(WINDOW).await;
    let seconds = started.elapsed().as_secs_f64();
    let (read_after, _) = read_load(&env.emulator);
    let drained = Drained {
        rate: (read_after - read_before) / seconds,
        delivered: env.deliveries.distinct(),
        load: env.emulator.load(DB, ITEMS),
    };
    for handle in handles {
        handle.stop().await;
    }
    drained
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_draining_a_backlog_reads_within_its_read_budget() {
    let drained = drain(
        |_| {},
        |options| options.read_budget = Some(ReadBudget::RequestUnits(BUDGET)),
    )
    .await;
    let (rate, delivered, load) = (drained.rate, drained.delivered, drained.load);
    println!(
        "read budget {BUDGET} RU/s: {rate:.0} RU/s read over {WINDOW:?}; {delivered} of {BACKLOG} delivered; {} low-priority requests refused ({} 429s in all, the backlog's writes included)",
        load.low_priority_throttled, load.throttled
    );
    assert!(
        (0.8 * f64::from(BUDGET)..=1.1 * f64::from(BUDGET)).contains(&rate),
        "the fleet read {rate:.0} RU/s with a budget of {BUDGET}"
    );
    assert!(
        delivered < BACKLOG,
        "the backlog was drained: the budget held nothing back"
    );
    assert_eq!(load.low_priority_throttled, 0, "a read reached the container's limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_in_a_throughput_bucket_are_held_to_its_share_and_go_on() {
    // Bucket 2 may spend 10 % of the 4,000 RU/s: the fleet, with no read budget of its own,
    // reads at about 400 RU/s, the service refusing the rest (429/3212) and the SDK retrying
    // them.
    let drained = drain(
        |emulator| emulator.set_throughput_bucket(DB, ITEMS, 2, 10.0),
        |options| options.read_throughput_bucket = Some(2),
    )
    .await;
    let (rate, delivered, load) = (drained.rate, drained.delivered, drained.load);
    println!(
        "bucket of 400 RU/s: {rate:.0} RU/s read over {WINDOW:?}; {delivered} of {BACKLOG} delivered; {} reads refused by the bucket",
        load.bucket_throttled
    );
    // Admitted before it is charged, as the service does: the pages under way when a window's
    // share runs out overshoot it a little (pages of 100 documents cost about 200 RU here).
    assert!(rate <= 1.25 * 400.0, "the fleet read {rate:.0} RU/s in a bucket of 400");
    assert!(
        delivered > 1_000,
        "the fleet did not go on reading: {delivered} delivered"
    );
    assert!(
        load.bucket_throttled > 0,
        "the bucket refused nothing: it held nothing back"
    );
    assert!(
        delivered < BACKLOG,
        "the backlog was drained: the bucket held nothing back"
    );
}
