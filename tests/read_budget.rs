//! The read budget (issue 55 §1): a fleet draining a backlog reads within the request units a
//! second it was given, whatever the backlog, so that the application keeps its throughput. The
//! emulator charges a change feed page by what it returns (`1 + KB`), from the container's
//! provisioned throughput (4,000 RU/s here: the budget, not the container, must be what holds
//! the fleet back). Three in-process instances with `read_budget = 400` drain 6,000 documents of
//! about 2 KB (~12,000 RU of pages: half a minute at the budget, three seconds at the
//! container's throughput); over ten seconds once the leases are shared, the change feed reads
//! spent 320–440 RU/s, the backlog was not drained (so the budget, not the backlog, held them
//! back), and no read was refused (none reached the container's limit). The figures are printed.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_draining_a_backlog_reads_within_its_read_budget() {
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
    let env = Env::on(emulator).await;
    write_backlog(&env.items).await;

    let mut handles: Vec<ProcessorHandle> = Vec::new();
    for name in ["a", "b", "c"] {
        let mut options = env.options(name);
        options.leases_per_partition = 3;
        options.acquire_interval = Duration::from_secs(1);
        options.read_budget = Some(ReadBudget::RequestUnits(BUDGET));
        let processor = env.processor(options, env.recorder(name)).await;
        handles.push(processor.start().await.expect("start"));
    }
    let shared = eventually(Duration::from_secs(60), || async {
        handles.iter().all(|h| (3..=5).contains(&h.owned_leases().len()))
    })
    .await;
    let owned: Vec<usize> = handles.iter().map(|h| h.owned_leases().len()).collect();
    assert!(shared, "the 12 leases were not shared among the three: {owned:?}");

    let (read_before, throttled_before) = read_load(&env.emulator);
    let delivered_before = env.deliveries.distinct();
    let started = Instant::now();
    tokio::time::sleep(WINDOW).await;
    let seconds = started.elapsed().as_secs_f64();
    let (read_after, throttled_after) = read_load(&env.emulator);
    let delivered = env.deliveries.distinct();
    let rate = (read_after - read_before) / seconds;
    let low_refused = env.emulator.load(DB, ITEMS).low_priority_throttled;
    println!(
        "read budget {BUDGET} RU/s: {rate:.0} RU/s read over {seconds:.1} s by {owned:?} leases; {} documents delivered in the window, {delivered} of {BACKLOG} in all; {} reads refused ({low_refused} at low priority)",
        delivered - delivered_before,
        throttled_after - throttled_before
    );
    for handle in handles {
        handle.stop().await;
    }
    assert!(
        (0.8 * f64::from(BUDGET)..=1.1 * f64::from(BUDGET)).contains(&rate),
        "the fleet read {rate:.0} RU/s with a budget of {BUDGET}"
    );
    assert!(
        delivered < BACKLOG,
        "the backlog was drained: the budget held nothing back"
    );
    assert_eq!(low_refused, 0, "a read reached the container's limit");
}
