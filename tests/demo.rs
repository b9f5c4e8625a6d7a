//! `cfp demo` run as a newcomer would, but not on a terminal: plain progress lines, then the
//! verification table, which must say nothing was lost.

use crate::common::CFP;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_loses_nothing_through_a_crash_a_split_and_a_new_worker() {
    let output = tokio::process::Command::new(CFP)
        .args([
            "demo",
            "--duration",
            "12s",
            "--workers",
            "2",
            "--partitions",
            "4",
            "--rate",
            "100",
        ])
        .output()
        .await
        .expect("run cfp demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let table = stdout.split("verification").nth(1).unwrap_or_default();
    println!("cfp demo --duration 12s --workers 2 --partitions 4 --rate 100:\nverification{table}");
    assert!(
        output.status.success(),
        "cfp demo failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    let row = |name: &str| -> String {
        table
            .lines()
            .find(|l| l.trim_start().starts_with(name))
            .map(|l| l.trim_start()[name.len()..].trim().to_owned())
            .unwrap_or_default()
    };
    let written: usize = row("written").parse().expect("written");
    assert!(written >= 1000, "about 100/s for 12 s: {written}");
    assert_eq!(row("lost"), "0");
    assert_eq!(row("delivered (unique)"), written.to_string());
    assert!(
        row("failover (kill -9)").ends_with("(lease expiration 5 s)") && !row("failover (kill -9)").starts_with('-')
    );
    assert!(
        !row("rebalance (+1 worker)").starts_with('-'),
        "the new worker got its share"
    );
    assert!(
        row("split").starts_with("partitions 4 → 5, leases 4 → 5"),
        "{}",
        row("split")
    );
    assert!(table.contains("result: OK, nothing lost"));
    for event in ["kill -9 worker-2", "split done", "added worker-3", "drained"] {
        assert!(stdout.contains(event), "event {event:?} missing:\n{stdout}");
    }
}
