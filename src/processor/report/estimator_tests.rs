use super::*;
use crate::cosmos::RangeContinuation;
use serde_json::json;

fn page(docs: Vec<serde_json::Value>, continuation: &str, session: Option<&str>) -> ChangePage {
    ChangePage {
        documents: docs,
        changes: Vec::new(),
        range_id: None,
        continuations: vec![RangeContinuation {
            range: EpkRange::full(),
            continuation: continuation.into(),
        }],
        session_token: session.map(str::to_owned),
        lsn: None,
        request_charge: 0.0,
        retries: 0,
    }
}

#[test]
fn lag_from_service_and_emulator_pages() {
    // Service: the item carries _lsn, the continuation is a quoted LSN.
    assert_eq!(
        page_lag(&page(
            vec![json!({"id": "a", "_lsn": 91})],
            "\"91\"",
            Some("0:1#100#3=100")
        )),
        10
    );
    // Emulator: no _lsn, the cursor after the item carries its LSN.
    let cursor = r#"{"kind":"change_feed_cursor_v1","lsn":41,"epk":"05","id":"a"}"#;
    assert_eq!(
        page_lag(&page(vec![json!({"id": "a"})], cursor, Some("0:1#48#0=48"))),
        8
    );
    assert_eq!(page_lag(&page(vec![], "\"100\"", Some("0:1#100"))), 0);
    assert_eq!(
        page_lag(&page(vec![json!({"id": "a"})], "bad", None)),
        1,
        "unknown LSNs never look like a huge backlog"
    );
}

#[test]
fn a_range_is_cut_along_the_partitions() {
    let partitions = [EpkRange::new("", "40"), EpkRange::new("40", "FF")];
    let cases: Vec<(EpkRange, Vec<Piece>)> = vec![
        // One lease per partition.
        (EpkRange::new("", "40"), vec![Piece::Partition(EpkRange::new("", "40"))]),
        // A sub-range (leases per partition > 1).
        (EpkRange::new("20", "40"), vec![Piece::Part(EpkRange::new("20", "40"))]),
        // A lease over a split: one piece per child.
        (
            EpkRange::full(),
            vec![
                Piece::Partition(EpkRange::new("", "40")),
                Piece::Partition(EpkRange::new("40", "FF")),
            ],
        ),
        // A sub-range across a split point: a part of each child.
        (
            EpkRange::new("30", "50"),
            vec![
                Piece::Part(EpkRange::new("30", "40")),
                Piece::Part(EpkRange::new("40", "50")),
            ],
        ),
    ];
    for (range, expected) in cases {
        assert_eq!(pieces(&partitions, &range), expected, "{range}");
    }
    assert_eq!(
        pieces(&[], &EpkRange::full()),
        vec![Piece::Partition(EpkRange::full())],
        "no routing map: the range as it is"
    );
}

fn counted(docs: usize, continuation: &str, session: &str) -> ChangePage {
    page(vec![json!({"id": "d"}); docs], continuation, Some(session))
}

#[test]
fn counting_stops_when_nothing_more_is_pending_and_extrapolates_beyond_its_reads() {
    // An empty page: done.
    let mut tally = Tally::after(Some(10));
    assert!(tally.add(&counted(0, "\"10\"", "0:1#50")));
    assert_eq!(tally.counted, 0);
    // The read reached the partition's latest LSN: done, exact.
    let mut tally = Tally::after(Some(10));
    assert!(tally.add(&counted(7, "\"50\"", "0:1#50")));
    assert_eq!((tally.counted, tally.estimate()), (7, 7));
    // Later changes of the partition may be in other sub-ranges: read on.
    let mut tally = Tally::after(Some(10));
    assert!(!tally.add(&counted(7, "\"40\"", "0:1#50")));
    assert!(tally.add(&counted(0, "\"40\"", "0:1#50")));
    assert_eq!(tally.counted, 7);
    // The reads stopped after 1000 documents over LSNs 10..4010 (a fourth of the partition's
    // changes there): the 2000 LSNs after them hold about 500 more.
    let mut tally = Tally::after(Some(10));
    assert!(!tally.add(&counted(1000, "\"4010\"", "0:1#6010")));
    assert_eq!(tally.estimate(), 1500);
    // Without a continuation: from the first document's LSN, else from 0.
    let mut tally = Tally::after(None);
    tally.add(&page(vec![json!({"_lsn": 101})], "\"300\"", Some("0:1#500")));
    assert_eq!((tally.from, tally.estimate()), (Some(100), 2));
    let mut tally = Tally::after(None);
    tally.add(&counted(100, "\"400\"", "0:1#800"));
    assert_eq!(tally.estimate(), 200);
    // Unknown LSNs: what was counted.
    let mut tally = Tally::after(None);
    assert!(!tally.add(&page(vec![json!({"id": "d"}); 3], "bad", None)));
    assert_eq!(tally.estimate(), 3);
}

#[test]
fn a_split_parent_beside_its_children_is_not_estimated() {
    let lease = |min: &str, max: &str| Lease::new("p", &EpkRange::new(min, max), None);
    let parent = lease("", "FF");
    let children = [lease("", "80"), lease("80", "FF")];
    let all = [parent.clone(), children[0].clone(), children[1].clone()];
    let ids = |leases: Vec<Lease>| leases.into_iter().map(|l| l.lease_token).collect::<Vec<_>>();
    assert_eq!(ids(estimated(&all)), vec!["-80", "80-FF"]);
    // Until both children exist, the parent is the lease of the uncovered half.
    assert_eq!(ids(estimated(&[parent, children[0].clone()])), vec!["-FF", "-80"]);
}

#[test]
fn totals() {
    let lease = |token: &str, lag: u64| LeaseEstimate {
        lease_token: token.into(),
        feed_range: EpkRange::new(token, "FF"),
        owner: None,
        lag,
        checkpoint_age: None,
        started: true,
        handler_failing: None,
        stalled: None,
        error: None,
        reads: 1,
        oldest_pending_seconds: None,
        handled_per_second: (lag > 0).then_some(lag as f64 * 10.0),
        read_units_per_document: (lag > 0).then_some(lag as f64),
        partition_writes_per_second: (lag > 0).then_some(100.0 + lag as f64),
        worker_handled_per_second: None,
    };
    let estimate = ProcessorEstimate::new("p", vec![lease("80", 0), lease("", 5), lease("40", 7)]);
    assert_eq!(
        (estimate.lease_count, estimate.leases_with_lag, estimate.total_lag),
        (3, 2, 12)
    );
    assert_eq!(estimate.handled_per_second, 120.0, "the owners' handled rates summed");
    assert_eq!(
        estimate.read_units_per_document,
        Some(6.0),
        "the reported costs averaged"
    );
    assert_eq!(estimate.leases[0].lease_token, "");
    assert_eq!(
        estimate.oldest_pending_seconds, None,
        "a lease's age unknown: the processor's too"
    );
    let aged = |token: &str, lag: u64, age: u64| LeaseEstimate {
        oldest_pending_seconds: Some(age),
        ..lease(token, lag)
    };
    let estimate = ProcessorEstimate::new("p", vec![aged("80", 0, 0), aged("", 5, 12), aged("40", 7, 30)]);
    assert_eq!(estimate.oldest_pending_seconds, Some(30), "the oldest of all");
    // Two owners: one reporting 20 and 30 on its two leases (as of different writes), one 50.
    let owned = |token: &str, owner: &str, rate: Option<f64>| LeaseEstimate {
        owner: Some(owner.into()),
        worker_handled_per_second: rate,
        ..lease(token, 1)
    };
    let estimate = ProcessorEstimate::new(
        "p",
        vec![
            owned("", "a", Some(20.0)),
            owned("40", "a", Some(30.0)),
            owned("80", "b", Some(50.0)),
            owned("C0", "c", None),
        ],
    );
    assert_eq!(
        estimate.worker_handled_per_second,
        Some(37.5),
        "averaged per owner, then over owners"
    );
}

#[test]
fn a_split_is_told_by_partition_ids_beyond_the_original_ones() {
    let ids = |ids: &[&str]| {
        ids.iter()
            .map(|s| (*s).to_owned())
            .collect::<std::collections::BTreeSet<_>>()
    };
    // (ids of the partitions read, partitions now, split since)
    let cases = [
        (ids(&["0", "1", "2", "3"]), 4, false),
        // Only some partitions read, all original.
        (ids(&["1", "3"]), 4, false),
        (ids(&[]), 4, false),
        // 4 partitions, 0 split into 4 and 5: 5 partitions now.
        (ids(&["1", "2", "3", "4", "5"]), 5, true),
        (ids(&["5"]), 5, true),
        // 2 partitions, both split: 2, 3, 4, 5.
        (ids(&["2", "3", "4", "5"]), 4, true),
        // A merge of 0 and 1 into 2: 1 partition now.
        (ids(&["2"]), 1, true),
        // Not a number: not the service's original ids.
        (ids(&["a"]), 4, true),
    ];
    for (seen, partitions, split) in cases {
        assert_eq!(split_since(&seen, partitions), split, "{seen:?} of {partitions}");
    }
}

#[test]
fn a_lease_without_a_checkpoint_has_no_checkpoint_age() {
    let now = OffsetDateTime::now_utc();
    let mut rewound = Lease::new("p", &EpkRange::full(), None);
    rewound.checkpoint_time = Some(now - time::Duration::seconds(71));
    let estimate = lease_estimate(&rewound, 5, now);
    assert_eq!((estimate.started, estimate.checkpoint_age), (false, None));
    let mut checkpointed = rewound.clone();
    checkpointed.continuation = Some("\"12\"".into());
    assert_eq!(lease_estimate(&checkpointed, 5, now).checkpoint_age, Some(71));
}

#[test]
fn a_told_lag_is_as_old_as_the_newest_change_its_checkpoint_covers_at_most() {
    use crate::processor::leases::lag_report::{LagReport, record_report};
    let now = OffsetDateTime::now_utc();
    let mut lease = Lease::new("p", &EpkRange::full(), Some("\"400\"".into()));
    let report = |newest_ts: Option<i64>| {
        Some(LagReport {
            latest_lsn: 500,
            newest_ts,
        })
    };
    record_report(&mut lease, report(None));
    assert_eq!(
        lease_estimate(&lease, 100, now).oldest_pending_seconds,
        None,
        "no _ts told: unknown"
    );
    record_report(&mut lease, report(Some(now.unix_timestamp() - 42)));
    assert_eq!(lease_estimate(&lease, 100, now).oldest_pending_seconds, Some(42));
    assert_eq!(
        lease_estimate(&lease, 0, now).oldest_pending_seconds,
        Some(0),
        "caught up"
    );
    record_report(&mut lease, report(Some(now.unix_timestamp() + 5)));
    assert_eq!(
        lease_estimate(&lease, 100, now).oldest_pending_seconds,
        Some(0),
        "a _ts ahead of this clock counts as new"
    );
}
