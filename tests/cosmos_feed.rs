//! The Cosmos facts the processor relies on, checked against the SDK's in-memory emulator.

use std::time::Duration;

use changefeed_operator::cosmos::{EpkRange, FeedReader, MonitoredContainer, StartFrom};
use changefeed_operator::emulator::{ContainerSpec, Emulator};
use serde_json::json;

const READ: Duration = Duration::from_secs(10);

async fn setup(
    partitions: u32,
) -> (
    Emulator,
    MonitoredContainer,
    changefeed_operator::cosmos::DocumentContainer,
) {
    let emulator = Emulator::in_process();
    let spec = ContainerSpec {
        database: "db".into(),
        container: "items".into(),
        partition_key: "/pk".into(),
        partitions,
    };
    emulator.create_container(&spec).await.unwrap();
    let account = emulator.account().await.unwrap();
    let monitored = account.monitored("db", "items").await.unwrap();
    let docs = account.documents("db", "items").await.unwrap();
    (emulator, monitored, docs)
}

async fn write(docs: &changefeed_operator::cosmos::DocumentContainer, ids: std::ops::Range<usize>) {
    for i in ids {
        let pk = format!("pk{}", i % 97);
        docs.upsert(&pk, &json!({"id": format!("d{i}"), "pk": pk, "n": i}))
            .await
            .unwrap();
    }
}

async fn drain(reader: &mut FeedReader) -> (Vec<String>, String) {
    let mut ids = Vec::new();
    loop {
        let page = reader.next_page(READ).await.unwrap();
        assert_eq!(page.continuations.len(), 1, "one range, one continuation");
        if page.documents.is_empty() {
            return (ids, page.continuations[0].continuation.clone());
        }
        ids.extend(page.documents.iter().map(|d| d["id"].as_str().unwrap().to_owned()));
    }
}

#[tokio::test]
async fn ranges_beginning_now_and_resume_from_a_raw_continuation() {
    let (_emulator, monitored, docs) = setup(4).await;
    let ranges = monitored.feed_ranges(false).await.unwrap();
    assert_eq!(ranges.len(), 4);
    assert_eq!(ranges[0].min, "");
    assert_eq!(ranges[3].max, "FF");

    // "Now" readers opened before the writes, polled once to anchor them.
    let mut anchors = Vec::new();
    for range in &ranges {
        let mut reader = monitored.reader(range, None, StartFrom::Now, 100).await.unwrap();
        let (ids, continuation) = drain(&mut reader).await;
        assert!(ids.is_empty());
        anchors.push(continuation);
    }
    write(&docs, 0..200).await;

    let mut total = 0;
    for (range, anchor) in ranges.iter().zip(&anchors) {
        let mut from_start = monitored.reader(range, None, StartFrom::Beginning, 7).await.unwrap();
        let (all, end) = drain(&mut from_start).await;
        let mut resumed = monitored
            .reader(range, Some(anchor), StartFrom::Beginning, 100)
            .await
            .unwrap();
        let (after_anchor, _) = drain(&mut resumed).await;
        assert_eq!(
            all.len(),
            after_anchor.len(),
            "the anchor precedes every write of {range}"
        );
        // Resuming from the end continuation yields nothing new.
        let mut at_end = monitored
            .reader(range, Some(&end), StartFrom::Beginning, 100)
            .await
            .unwrap();
        assert!(drain(&mut at_end).await.0.is_empty());
        total += all.len();
    }
    assert_eq!(total, 200);
}

#[tokio::test]
async fn a_split_fans_a_parent_continuation_out_to_its_children() {
    let (emulator, monitored, docs) = setup(2).await;
    let ranges = monitored.feed_ranges(false).await.unwrap();
    let parent: EpkRange = ranges[0].clone();
    let mut reader = monitored
        .reader(&parent, None, StartFrom::Beginning, 1000)
        .await
        .unwrap();
    write(&docs, 0..100).await;
    let (before, checkpoint) = drain(&mut reader).await;
    write(&docs, 100..200).await;

    let after = emulator
        .split("db", "items", None, Duration::from_millis(50))
        .await
        .unwrap();
    assert_eq!(after.len(), 3);
    let refreshed = monitored.feed_ranges(true).await.unwrap();
    assert_eq!(refreshed.len(), 3);
    let children: Vec<_> = refreshed.iter().filter(|r| parent.contains(r)).cloned().collect();
    assert_eq!(children.len(), 2);

    // Each child resumed from the parent's checkpoint delivers exactly its share of the new writes.
    let mut child_ids = Vec::new();
    for child in &children {
        let mut r = monitored
            .reader(child, Some(&checkpoint), StartFrom::Beginning, 1000)
            .await
            .unwrap();
        let (ids, _) = drain(&mut r).await;
        child_ids.extend(ids);
    }
    // The parent reader opened before the split sees the split as several continuations.
    let mut parent_reader = monitored
        .reader(&parent, Some(&checkpoint), StartFrom::Beginning, 1000)
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut parts = 0;
    for _ in 0..10 {
        match parent_reader.next_page(READ).await {
            Ok(page) => {
                parts = parts.max(page.continuations.len());
                seen.extend(page.documents.iter().map(|d| d["id"].as_str().unwrap().to_owned()));
                if page.documents.is_empty() {
                    break;
                }
            }
            Err(e) => panic!("parent read failed: {e}"),
        }
    }
    assert_eq!(parts, 2, "the parent's reader spans both children after the split");
    assert_eq!(before.len() + child_ids.len(), before.len() + seen.len());
    child_ids.sort();
    seen.sort();
    assert_eq!(
        child_ids, seen,
        "children resumed from the parent checkpoint see what the parent reader sees"
    );
    assert!(!child_ids.is_empty());
}

#[tokio::test]
async fn the_change_feed_of_an_epk_sub_range_holds_exactly_the_documents_hashed_into_it() {
    // One physical partition, read as four equal sub-ranges (one lease each with
    // leasesPerPartition 4): every document in exactly one of them, and resuming a sub-range from
    // its raw continuation yields only its own later changes.
    let (_emulator, monitored, docs) = setup(1).await;
    let ranges = monitored.feed_ranges(false).await.unwrap();
    assert_eq!(ranges.len(), 1);
    let parts = ranges[0].divide(4).unwrap();
    write(&docs, 0..300).await;
    let mut seen: Vec<(String, usize)> = Vec::new();
    let mut ends = Vec::new();
    for (index, part) in parts.iter().enumerate() {
        let mut reader = monitored.reader(part, None, StartFrom::Beginning, 50).await.unwrap();
        let (ids, end) = drain(&mut reader).await;
        seen.extend(ids.into_iter().map(|id| (id, index)));
        ends.push(end);
    }
    let mut ids: Vec<&String> = seen.iter().map(|(id, _)| id).collect();
    ids.sort();
    ids.dedup();
    let per_part: Vec<usize> = (0..4).map(|i| seen.iter().filter(|(_, p)| *p == i).count()).collect();
    println!("300 documents over 4 sub-ranges of one partition: {per_part:?}");
    assert_eq!(seen.len(), 300, "each document exactly once");
    assert_eq!(ids.len(), 300);
    assert!(per_part.iter().all(|&n| n > 0), "{per_part:?}");
    // A logical partition lies in one sub-range: its order is kept within one lease.
    for pk in 0..97 {
        let mut parts_of_pk: Vec<usize> = seen
            .iter()
            .filter(|(id, _)| id[1..].parse::<usize>().unwrap() % 97 == pk)
            .map(|(_, part)| *part)
            .collect();
        parts_of_pk.dedup();
        assert_eq!(parts_of_pk.len(), 1, "pk{pk} spread over sub-ranges {parts_of_pk:?}");
    }
    write(&docs, 300..400).await;
    let mut later = 0;
    for (part, end) in parts.iter().zip(&ends) {
        let mut reader = monitored
            .reader(part, Some(end), StartFrom::Beginning, 50)
            .await
            .unwrap();
        let (ids, _) = drain(&mut reader).await;
        assert!(ids.iter().all(|id| id[1..].parse::<usize>().unwrap() >= 300), "{ids:?}");
        later += ids.len();
    }
    assert_eq!(later, 100);
}

/// The in-process emulator answers as `cfp emulator` does (one translation serves both): pages of
/// several documents carry each one's `_lsn`, in order, and the continuation after a page is the
/// quoted LSN of its last document, which resumes exactly after it.
#[tokio::test]
async fn in_process_pages_carry_lsns_and_quoted_lsn_continuations() {
    let (_emulator, monitored, docs) = setup(2).await;
    write(&docs, 0..60).await;
    let mut seen = 0;
    for range in monitored.feed_ranges(false).await.unwrap() {
        let mut reader = monitored.reader(&range, None, StartFrom::Beginning, 7).await.unwrap();
        let mut lsns = Vec::new();
        loop {
            let page = reader.next_page(READ).await.unwrap();
            let continuation = page.continuations[0].continuation.clone();
            if page.documents.is_empty() {
                assert_eq!(Some(continuation), lsns.last().map(|l| format!("\"{l}\"")), "{range}");
                break;
            }
            assert!(page.documents.len() <= 7);
            let page_lsns: Vec<u64> = page.documents.iter().map(|d| d["_lsn"].as_u64().unwrap()).collect();
            assert_eq!(
                continuation,
                format!("\"{}\"", page_lsns[page_lsns.len() - 1]),
                "{range}"
            );
            lsns.extend(page_lsns);
        }
        assert!(lsns.windows(2).all(|w| w[0] < w[1]), "{range}: {lsns:?}");
        // A reader resumed from the quoted LSN of the n-th document starts at the next one.
        let middle = format!("\"{}\"", lsns[lsns.len() / 2]);
        let mut resumed = monitored
            .reader(&range, Some(&middle), StartFrom::Beginning, 1)
            .await
            .unwrap();
        let next = resumed.next_page(READ).await.unwrap();
        assert_eq!(
            next.documents[0]["_lsn"].as_u64(),
            lsns.get(lsns.len() / 2 + 1).copied()
        );
        seen += lsns.len();
    }
    assert_eq!(seen, 60);
}

/// Each range's feed read to the end in pages of 25: the ids in order and the continuations.
async fn drain_all(
    monitored: &MonitoredContainer,
    ranges: &[EpkRange],
    from: &[Option<String>],
) -> (Vec<Vec<String>>, Vec<String>) {
    let mut ids = Vec::new();
    let mut ends = Vec::new();
    for (range, from) in ranges.iter().zip(from) {
        let mut reader = monitored
            .reader(range, from.as_deref(), StartFrom::Beginning, 25)
            .await
            .unwrap();
        let (read, end) = drain(&mut reader).await;
        ids.push(read);
        ends.push(end);
    }
    (ids, ends)
}

/// On the service a merged partition's LSNs go on above both parents' and a parent's continuation
/// resumes where it stopped (each parent range read from the child); the SDK emulator numbers the
/// merged partition from 1 again, which `cfp emulator`'s edge translates.
#[tokio::test]
async fn a_merge_resumes_each_parent_continuation_where_it_stopped() {
    let (emulator, monitored, docs) = setup(2).await;
    let parents = monitored.feed_ranges(false).await.unwrap();
    assert_eq!(parents.len(), 2);
    write(&docs, 0..100).await;
    // Updates raise each parent's LSN above the count of its documents.
    write(&docs, 0..100).await;
    let (first, checkpoints) = drain_all(&monitored, &parents, &[None, None]).await;
    assert_eq!(first.iter().map(Vec::len).sum::<usize>(), 100);
    write(&docs, 100..140).await;

    let ids: Vec<String> = emulator
        .partitions("db", "items")
        .await
        .unwrap()
        .iter()
        .map(|p| p.id.clone())
        .collect();
    let merged = emulator
        .merge("db", "items", [&ids[0], &ids[1]], Duration::from_millis(50))
        .await
        .unwrap();
    assert_eq!(merged.len(), 1);
    assert_eq!(monitored.feed_ranges(true).await.unwrap().len(), 1);

    // Each parent's checkpoint resumes on the merged partition with exactly what it had not read.
    let from: Vec<Option<String>> = checkpoints.iter().cloned().map(Some).collect();
    let (resumed, ends) = drain_all(&monitored, &parents, &from).await;
    let mut got: Vec<String> = resumed.concat();
    got.sort();
    let mut expected: Vec<String> = (100..140).map(|i| format!("d{i}")).collect();
    expected.sort();
    assert_eq!(got, expected, "checkpoints {checkpoints:?}, resumed {resumed:?}");
    for (end, checkpoint) in ends.iter().zip(&checkpoints) {
        let (end, checkpoint) = (formats_lsn(end), formats_lsn(checkpoint));
        assert!(
            end >= checkpoint,
            "LSNs go on increasing across the merge: {checkpoint} then {end}"
        );
    }

    // Writes after the merge follow, from either parent's continuation and the merged range's.
    write(&docs, 140..160).await;
    let (later, _) = drain_all(
        &monitored,
        &parents,
        &ends.iter().cloned().map(Some).collect::<Vec<_>>(),
    )
    .await;
    let mut later: Vec<String> = later.concat();
    later.sort();
    let mut expected: Vec<String> = (140..160).map(|i| format!("d{i}")).collect();
    expected.sort();
    assert_eq!(later, expected);
    // A read of the merged range from the beginning has every document once, in LSN order.
    let whole = monitored.feed_ranges(true).await.unwrap();
    let mut reader = monitored
        .reader(&whole[0], None, StartFrom::Beginning, 30)
        .await
        .unwrap();
    let (all, _) = drain(&mut reader).await;
    assert_eq!(all.len(), 160);
    // And a point read with the session the writes left still answers.
    assert!(docs.read("pk3", "d3").await.unwrap().is_some());
}

/// The LSN of a quoted-LSN continuation.
fn formats_lsn(continuation: &str) -> u64 {
    continuation
        .trim_matches('"')
        .parse()
        .unwrap_or_else(|_| panic!("not a quoted LSN: {continuation}"))
}

/// Priority-based execution on a container's provisioned throughput: a backlog drained at low
/// priority (as every change feed reader of ours reads) is charged for what it reads and held to
/// what the application's high-priority writes leave of each second; the application, whose own
/// load fits the budget, is never refused because of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_priority_drain_is_refused_before_the_applications_high_priority_writes() {
    let emulator = Emulator::in_process();
    let spec = ContainerSpec {
        database: "db".into(),
        container: "items".into(),
        partition_key: "/pk".into(),
        partitions: 1,
    };
    emulator
        .create_container_with_throughput(&spec, Some(400))
        .await
        .unwrap();
    let account = emulator.account().await.unwrap();
    let monitored = account.monitored("db", "items").await.unwrap();
    let docs = account.documents("db", "items").await.unwrap();
    let payload = "x".repeat(2000);
    let body = move |i: usize| json!({"id": format!("d{i}"), "pk": format!("pk{}", i % 7), "payload": payload});
    // The backlog: 200 documents of about 2 KB (the SDK retries the 429s of its own writes).
    for i in 0..200 {
        docs.upsert(&format!("pk{}", i % 7), &body(i)).await.unwrap();
    }

    // The application: a write of about 12 RU every 80 ms (~150 RU/s of the 400), high priority.
    let stop = tokio_util::sync::CancellationToken::new();
    let application = tokio::spawn({
        let (docs, stop, body) = (docs.clone(), stop.clone(), body);
        async move {
            let mut written = 0;
            let mut tick = tokio::time::interval(Duration::from_millis(80));
            while !stop.is_cancelled() {
                tick.tick().await;
                let i = 1000 + written;
                docs.upsert(&format!("pk{}", i % 7), &body(i)).await.unwrap();
                written += 1;
            }
            written
        }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = emulator.load("db", "items");
    let range = monitored.feed_ranges(false).await.unwrap().remove(0);
    let mut reader = monitored.reader(&range, None, StartFrom::Beginning, 10).await.unwrap();
    let started = std::time::Instant::now();
    let mut drained = 0;
    while drained < 200 {
        drained += reader.next_page(Duration::from_secs(30)).await.unwrap().documents.len();
    }
    let took = started.elapsed();
    stop.cancel();
    let written = application.await.unwrap();
    let after = emulator.load("db", "items");
    let low = after.low_priority_throttled - before.low_priority_throttled;
    let high = (after.throttled - before.throttled) - low;
    let read_units = (after.request_units - after.write_units) - (before.request_units - before.write_units);
    println!(
        "drained {drained} documents (~2 KB) in {:.1} s at low priority, charged {read_units:.0} RU, refused {low} times; the application wrote {written} at high priority, refused {high} times",
        took.as_secs_f64()
    );
    assert!(
        read_units >= 400.0,
        "reading 200 × 2 KB is charged (~1 RU per KB): {read_units:.0} RU"
    );
    assert!(low > 0, "the drain was held to what the budget left");
    assert_eq!(high, 0, "the application was refused because of the drain");
}
