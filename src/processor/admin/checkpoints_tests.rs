use super::*;
use time::macros::datetime;

const NOW: OffsetDateTime = datetime!(2026-11-25 12:00:00 UTC);

fn lease(min: &str, max: &str, lsn: Option<u64>) -> Lease {
    let mut lease = Lease::new("p", &EpkRange::new(min, max), lsn.map(|n| format!("\"{n}\"")));
    lease.etag = format!("e-{min}");
    lease
}

fn tokens(leases: impl IntoIterator<Item = impl std::borrow::Borrow<Lease>>) -> Vec<String> {
    leases.into_iter().map(|l| l.borrow().lease_token.clone()).collect()
}

#[test]
fn a_rewind_by_range_moves_only_the_leases_sharing_keys_with_it_also_for_short_hex() {
    let full = |hex: &str| format!("{hex:0<32}");
    let leases = [
        lease("", &full("10"), Some(5)),
        lease(&full("10"), &full("20"), Some(6)),
        lease(&full("20"), &full("30"), Some(7)),
        lease(&full("30"), "FF", Some(8)),
    ];
    let none = BTreeMap::new();
    // (selected range, the leases moved)
    let cases: Vec<((String, String), Vec<usize>)> = vec![
        (("20".into(), "30".into()), vec![2]),
        ((full("20"), full("30")), vec![2]),
        (("2".into(), "3".into()), vec![2]),
        (("18".into(), "30".into()), vec![1, 2]),
        (("20".into(), "31".into()), vec![2, 3]),
        (("".into(), "10".into()), vec![0]),
        (("30".into(), "FF".into()), vec![3]),
    ];
    for ((min, max), moved) in cases {
        let selection = Selection {
            leases: Vec::new(),
            ranges: vec![EpkRange::new(min.as_str(), max.as_str())],
        };
        let plan = plan_rewind(&leases, StartFrom::Beginning, &selection, &none).unwrap();
        let want: Vec<String> = moved.iter().map(|&i| leases[i].lease_token.clone()).collect();
        assert_eq!(tokens(plan.moves.iter().map(|m| &m.lease)), want, "--range {min}-{max}");
    }
}

#[test]
fn an_export_lists_every_lease_with_its_position_and_reads_back() {
    let mut a = lease("", "7F", Some(12));
    a.owner = Some("pod-1".into());
    a.timestamp = Some(NOW);
    let b = lease("7F", "FF", None).start_from_beginning();
    let export = export(&[b, a], "p", "db/orders", "rid==", NOW);
    assert_eq!(tokens_of(&export), ["-7F", "7F-FF"]);
    assert_eq!(export.leases[0].lsn, Some(12));
    assert_eq!(export.leases[0].owner.as_deref(), Some("pod-1"));
    assert_eq!(export.leases[1].start_from.as_deref(), Some("beginning"));
    let json = serde_json::to_string(&export).unwrap();
    assert!(json.contains("\"containerRid\":\"rid==\""), "{json}");
    assert!(json.contains("\"mode\":\"latest-version\""), "{json}");
    assert_eq!(serde_json::from_str::<Export>(&json).unwrap(), export);
}

fn tokens_of(export: &Export) -> Vec<String> {
    export.leases.iter().map(|l| l.range.lease_token()).collect()
}

#[test]
fn rewind_table() {
    let leases = [
        lease("", "3F", Some(5)),
        lease("3F", "7F", Some(6)),
        lease("7F", "FF", Some(7)),
    ];
    let anchored: BTreeMap<String, String> = leases.iter().map(|l| (l.id.clone(), "\"99\"".into())).collect();
    let at = datetime!(2026-11-24 08:00:00 UTC);
    let select = |leases: &[&str], ranges: &[(&str, &str)]| Selection {
        leases: leases.iter().map(|s| (*s).to_owned()).collect(),
        ranges: ranges.iter().map(|(a, b)| EpkRange::new(*a, *b)).collect(),
    };
    // (to, selection, moved leases, (continuation, startFrom) of each move | error part)
    type Expected = Result<(Vec<&'static str>, Option<&'static str>, Option<&'static str>), &'static str>;
    let cases: Vec<(StartFrom, Selection, Expected)> = vec![
        (
            StartFrom::Beginning,
            Selection::default(),
            Ok((vec!["-3F", "3F-7F", "7F-FF"], None, Some("beginning"))),
        ),
        (
            StartFrom::Now,
            select(&["3F-7F"], &[]),
            Ok((vec!["3F-7F"], Some("\"99\""), None)),
        ),
        (
            StartFrom::Time(at),
            select(&[], &[("40", "80")]),
            Ok((vec!["3F-7F", "7F-FF"], None, Some("2026-11-24T08:00:00Z"))),
        ),
        (
            StartFrom::Beginning,
            select(&[&leases[0].id], &[]),
            Ok((vec!["-3F"], None, Some("beginning"))),
        ),
        (
            StartFrom::Beginning,
            select(&["nope"], &[]),
            Err("no lease matches lease \"nope\""),
        ),
        (
            StartFrom::Beginning,
            select(&[], &[("FF", "FFFF")]),
            Err("no lease matches range"),
        ),
    ];
    for (to, selection, expected) in cases {
        match (plan_rewind(&leases, to, &selection, &anchored), expected) {
            (Ok(plan), Ok((moved, continuation, start))) => {
                assert_eq!(
                    tokens(plan.moves.iter().map(|m| &m.lease)),
                    moved,
                    "{to:?} {selection:?}"
                );
                for m in &plan.moves {
                    assert_eq!(
                        (m.to.continuation.as_deref(), m.to.start_from.as_deref()),
                        (continuation, start)
                    );
                }
                assert!(plan.creates.is_empty() && plan.deletes.is_empty());
            }
            (Err(error), Err(part)) => assert!(error.to_string().contains(part), "{error}"),
            (got, want) => panic!("{to:?} {selection:?}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn a_moved_lease_keeps_its_owner_and_loses_stale_properties() {
    let mut old = lease("", "FF", Some(40)).start_from_beginning();
    old.owner = Some("pod-1".into());
    old.request_handoff("pod-2", NOW);
    for (stale, value) in [
        (HANDLER_FAILING_PROPERTY, "since 10:00"),
        (STALLED_PROPERTY, "on pod-1 at 10:05: no progress for 300 s"),
        (LATEST_LSN_PROPERTY, "90"),
    ] {
        old.properties.insert(stale.into(), value.into());
    }
    let moved = Position::at(StartFrom::Now, Some("\"77\"")).apply_to(&old);
    assert_eq!(moved.continuation.as_deref(), Some("\"77\""));
    assert!(moved.properties.is_empty(), "{:?}", moved.properties);
    assert_eq!((moved.owner.as_deref(), moved.etag.as_str()), (Some("pod-1"), "e-"));
    let at = datetime!(2026-11-24 08:00:00 UTC);
    let moved = Position::at(StartFrom::Time(at), None).apply_to(&old);
    assert_eq!(moved.continuation, None);
    assert_eq!(
        moved.start_from(StartFrom::Now),
        StartFrom::Time(at),
        "the worker reads the time back"
    );
}

fn exported(leases: &[Lease]) -> Export {
    export(leases, "p", "db/orders", "rid==", NOW)
}

#[test]
fn import_table() {
    let whole = lease("", "FF", Some(10));
    let halves = [lease("", "7F", Some(20)), lease("7F", "FF", Some(21))];
    let quarters = [
        lease("", "3F", Some(30)),
        lease("3F", "7F", Some(31)),
        lease("7F", "FF", Some(32)),
    ];
    // (exported, current, moved, created, deleted, notes)
    type Case = (
        Vec<Lease>,
        Vec<Lease>,
        Vec<&'static str>,
        Vec<&'static str>,
        Vec<&'static str>,
        usize,
    );
    let cases: Vec<Case> = vec![
        // Same ranges: moved in place.
        (
            halves.to_vec(),
            halves.to_vec(),
            vec!["-7F", "7F-FF"],
            vec![],
            vec![],
            0,
        ),
        // Split since the export: the parent is leased whole again, the children deleted.
        (
            vec![whole.clone()],
            halves.to_vec(),
            vec![],
            vec!["-FF"],
            vec!["-7F", "7F-FF"],
            0,
        ),
        // One half split since: that half again, the other moved.
        (
            halves.to_vec(),
            quarters.to_vec(),
            vec!["7F-FF"],
            vec!["-7F"],
            vec!["-3F", "3F-7F"],
            0,
        ),
        // A lease outside the export is left alone (and said so).
        (vec![halves[0].clone()], halves.to_vec(), vec!["-7F"], vec![], vec![], 1),
    ];
    for (from, current, moved, created, deleted, notes) in cases {
        let plan = plan_import(&current, &exported(&from), "p", FeedMode::LatestVersion).unwrap();
        let label = tokens(&from);
        assert_eq!(tokens(plan.moves.iter().map(|m| &m.lease)), moved, "{label:?}");
        assert_eq!(tokens(&plan.creates), created, "{label:?}");
        assert_eq!(tokens(&plan.deletes), deleted, "{label:?}");
        assert_eq!(plan.notes.len(), notes, "{label:?}");
        for m in &plan.moves {
            let source = from.iter().find(|l| l.range() == m.lease.range()).unwrap();
            assert_eq!(m.to.continuation, source.continuation);
        }
    }
    let plan = plan_import(
        &halves,
        &exported(std::slice::from_ref(&whole)),
        "p",
        FeedMode::LatestVersion,
    )
    .unwrap();
    assert_eq!(plan.creates[0].continuation.as_deref(), Some("\"10\""));
    assert_eq!(plan.creates[0].id, "p..-FF");
}

#[test]
fn an_import_refuses_what_is_not_an_export_of_this_container() {
    let mut bad = exported(&[lease("", "FF", Some(1))]);
    bad.leases.push(bad.leases[0].clone());
    assert!(matches!(
        plan_import(&[], &bad, "p", FeedMode::LatestVersion),
        Err(PlanError::Overlap(..))
    ));
    bad.leases.clear();
    assert_eq!(
        plan_import(&[], &bad, "p", FeedMode::LatestVersion),
        Err(PlanError::Empty)
    );
    bad.format = 2;
    assert_eq!(
        plan_import(&[], &bad, "p", FeedMode::LatestVersion),
        Err(PlanError::Format(2))
    );
}

#[test]
fn an_import_applies_only_to_the_database_container_and_resource_id_it_was_taken_of() {
    // The export is of db/orders, resource id rid==.
    let export = exported(&[lease("", "FF", Some(1))]);
    // (current container, its resource id, other_container, accepted)
    let cases = [
        ("db/orders", "rid==", false, true),
        // Deleted and created again under its name: another resource id.
        ("db/orders", "rid2==", false, false),
        // Another container (or database) that happens to have the same resource id (an
        // emulator started again hands out the same ones).
        ("db/items", "rid==", false, false),
        ("other/orders", "rid==", false, false),
        // --other-container imports it anyway.
        ("db/orders", "rid2==", true, true),
        ("db/items", "rid==", true, true),
    ];
    for (current, rid, other_container, accepted) in cases {
        assert_eq!(
            check_container(&export, current, rid, other_container).is_ok(),
            accepted,
            "{current} ({rid}), other_container {other_container}"
        );
    }
}

#[test]
fn live_signs_table() {
    let expiration = Duration::from_secs(60);
    let owned = |owner: &str, seconds_ago: i64| {
        let mut l = lease("", "FF", Some(1));
        l.owner = Some(owner.into());
        l.timestamp = Some(NOW - time::Duration::seconds(seconds_ago));
        l
    };
    let beat = |name: &str, seconds_ago: i64| (name.to_owned(), NOW - time::Duration::seconds(seconds_ago));
    // (heartbeats, leases, signs)
    type Case = (Vec<(String, OffsetDateTime)>, Vec<Lease>, usize);
    let cases: Vec<Case> = vec![
        (vec![], vec![lease("", "FF", Some(1))], 0),
        (vec![beat("pod-1", 5)], vec![], 1),
        (vec![beat("pod-1", 500)], vec![owned("pod-1", 500)], 0),
        (vec![], vec![owned("pod-1", 10)], 1),
        // A heartbeat ahead of this clock counts as live.
        (vec![beat("pod-1", -30)], vec![], 1),
        // The command's own heartbeat and leases do not count.
        (vec![beat("me", 1)], vec![owned("me", 1)], 0),
    ];
    for (instances, leases, signs) in cases {
        let snapshot = LeaseSnapshot {
            leases,
            instances,
            ..LeaseSnapshot::default()
        };
        let found = live_signs(&snapshot, NOW, expiration, "me");
        assert_eq!(found.len(), signs, "{found:?}");
    }
}

#[test]
fn a_plan_says_what_it_changes() {
    let plan = plan_import(
        &[lease("", "7F", Some(20)), lease("7F", "FF", Some(21))],
        &exported(&[lease("", "FF", Some(10))]),
        "p",
        FeedMode::LatestVersion,
    )
    .unwrap();
    assert_eq!(
        plan.lines(),
        [
            "create -FF: LSN 10",
            "delete -7F (its range is restored as a whole)",
            "delete 7F-FF (its range is restored as a whole)"
        ]
    );
    assert!(!plan.is_empty());
    assert_eq!(tokens(plan.touched()), ["-7F", "7F-FF"]);
}

#[test]
fn a_running_instance_is_found_by_what_changes_not_by_its_clock() {
    let beat = datetime!(2026-11-24 07:00:00 UTC); // an hour behind: looks long dead
    let mut owned = lease("", "80", Some(40));
    owned.owner = Some("pod-1".into());
    owned.etag = "e1".into();
    let mut free = lease("80", "FF", Some(41));
    free.etag = "e2".into();
    let before = LeaseSnapshot {
        leases: vec![owned.clone(), free.clone()],
        instances: vec![("pod-1".into(), beat), ("gone".into(), beat)],
        ..LeaseSnapshot::default()
    };
    let watched = Duration::from_secs(21);
    // Nothing changed: nobody runs.
    assert!(changed_signs(&before, &before, watched, "me").is_empty());
    let mut after = before.clone();
    after.instances[0].1 = beat + time::Duration::seconds(17);
    after.instances.push(("me".into(), beat));
    after.leases[0].etag = "e3".into();
    after.leases[1].etag = "e4".into(); // unowned: written by nobody running
    assert_eq!(
        changed_signs(&before, &after, watched, "me"),
        [
            "instance pod-1 sent a heartbeat within the 21 s watched",
            "lease -80 of pod-1 was written within the 21 s watched"
        ]
    );
}

#[test]
fn an_import_writes_the_leases_it_creates_in_the_processors_mode_and_refuses_another_modes_export() {
    use FeedMode::{AllVersionsAndDeletes as All, LatestVersion as Latest};
    let all_versions = |mut lease: Lease| {
        lease.mode = Some(All.lease_mode().to_owned());
        lease
    };
    let halves = [lease("", "7F", Some(20)), lease("7F", "FF", Some(21))].map(all_versions);
    let whole = all_versions(lease("", "FF", Some(10)));
    let of_all = export(std::slice::from_ref(&whole), "p", "db/orders", "rid==", NOW);
    let mut unrecorded = of_all.clone();
    unrecorded.mode = None;
    let of_latest = export(&[lease("", "FF", Some(10))], "p", "db/orders", "rid==", NOW);
    // (current leases, export, the mode the caller knows, the mode of the import | the refusal)
    type Case<'a> = (&'a [Lease], &'a Export, Option<FeedMode>, Result<FeedMode, PlanError>);
    let cases: Vec<Case> = vec![
        (&halves, &of_all, None, Ok(All)),
        (&[], &of_all, None, Ok(All)),
        (&[], &of_all, Some(All), Ok(All)),
        // An export of an earlier version records no mode: the lease set's, or the known one.
        (&halves, &unrecorded, None, Ok(All)),
        (&[], &unrecorded, Some(All), Ok(All)),
        (&[], &unrecorded, None, Ok(Latest)),
        (&[], &of_latest, None, Ok(Latest)),
        (
            &halves,
            &of_latest,
            None,
            Err(PlanError::OtherMode {
                exported: Latest,
                current: All,
            }),
        ),
        (
            &[],
            &of_all,
            Some(Latest),
            Err(PlanError::OtherMode {
                exported: All,
                current: Latest,
            }),
        ),
    ];
    for (i, (current, exported, known, expected)) in cases.into_iter().enumerate() {
        assert_eq!(import_mode(current, exported, known), expected, "case {i}");
    }
    assert_eq!(of_all.mode, Some(All));
    // Across a split since the export, and into an empty lease set: created in the mode.
    for current in [&halves[..], &[]] {
        let plan = plan_import(current, &of_all, "p", All).unwrap();
        assert_eq!(plan.creates.len(), 1);
        assert_eq!(plan.creates[0].mode.as_deref(), Some("Full-Fidelity Feed"));
    }
}
