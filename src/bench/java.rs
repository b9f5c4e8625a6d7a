//! The processor users would pick instead — the Java v4 change feed processor
//! (`bench/java-peer`) — beside `cfp worker`, both as processes against one `cfp emulator` on
//! loopback: the same backlog, handlers that only count, the same lease timings, interleaved
//! rounds. Throughput, first document after process start, and rebalancing 1 → 4 over 32 leases
//! (Java steals one lease per acquire cycle).

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{ChildStdout, Command};

use super::BenchError;
use super::figures::{PATIENCE, is_fair, raw_read};
use super::loopback::{Round, reached, workers_round};
use super::processes::{Owned, cpu_seconds, emulator, worker, write_loopback_backlog};
use super::{BenchSettings, Check, Figure};
use crate::cosmos::{AccountAuth, CosmosAccount, EMULATOR_KEY};

/// The reference timings (renew 17 s, acquire 13 s, expiration 60 s) scaled by `scale`, in ms.
fn timings_ms(scale: f64) -> (u64, u64, u64) {
    let ms = |s: f64| (s * 1000.0 * scale).round() as u64;
    (ms(17.0), ms(13.0), ms(60.0))
}

/// One running Java processor instance and its event lines.
struct JavaInstance {
    child: Owned,
    lines: Lines<BufReader<ChildStdout>>,
}

impl JavaInstance {
    /// Starts the peer on `bench/<feed>` with leases under `prefix`, as host `host`.
    fn start(
        jar: &Path,
        endpoint: &str,
        feed: &str,
        prefix: &str,
        host: &str,
        extra: &[String],
    ) -> Result<Self, BenchError> {
        let mut child = Command::new("java")
            .arg("-DCOSMOS.HTTP_CONNECTION_WITHOUT_TLS_ALLOWED=true")
            .arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=error")
            .arg("-jar")
            .arg(jar)
            .args(["--endpoint", endpoint, "--key", EMULATOR_KEY, "--database", "bench"])
            .args(["--feed", feed, "--leases", "leases", "--prefix", prefix, "--host", host])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting java (a JDK 17+ is needed): {e}"))?;
        let stdout = child.stdout.take().ok_or("no java stdout")?;
        Ok(Self {
            child: Owned(child),
            lines: BufReader::new(stdout).lines(),
        })
    }

    /// Waits for the event `name`: its JSON and when it arrived.
    async fn event(&mut self, name: &str) -> Result<(Value, Instant), BenchError> {
        tokio::time::timeout(PATIENCE, async {
            while let Ok(Some(line)) = self.lines.next_line().await {
                if let Ok(event) = serde_json::from_str::<Value>(&line)
                    && event["event"] == name
                {
                    return Ok((event, Instant::now()));
                }
            }
            Err(BenchError::from(format!("the Java processor exited before {name}")))
        })
        .await
        .map_err(|_| BenchError::from(format!("no {name} from the Java processor in time")))?
    }

    /// Asks it to stop (its leases are released) and waits a bounded time.
    async fn stop(mut self) {
        if let Some(mut stdin) = self.child.0.stdin.take() {
            let _ = stdin.write_all(b"stop\n").await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(30), self.event("stopped")).await;
    }
}

/// Owners of the leases whose ids start with `prefix`, by owner ("" for none).
async fn owners(account: &CosmosAccount, prefix: &str) -> Result<HashMap<String, usize>, BenchError> {
    let leases = account.documents("bench", "leases").await?;
    let docs = leases.list_by_id_prefix(prefix).await?;
    let mut counts = HashMap::new();
    for doc in docs {
        let id = doc.body["id"].as_str().unwrap_or_default();
        if crate::processor::leases::adopt::is_lease_id(id, prefix) && doc.body.get("LeaseToken").is_some() {
            let owner = doc.body["Owner"].as_str().unwrap_or_default().to_owned();
            *counts.entry(owner).or_default() += 1;
        }
    }
    Ok(counts)
}

/// One Java round over the backlog, and the seconds from its `start()` call to the first document.
async fn java_round(jar: &Path, endpoint: &str, round: u32, documents: usize) -> Result<(Round, f64), BenchError> {
    let spawned = Instant::now();
    let extra = [
        "--expect".to_owned(),
        documents.to_string(),
        "--max-items".into(),
        "1000".into(),
    ];
    let mut java = JavaInstance::start(jar, endpoint, "items", &format!("java-tp{round}-"), "h0", &extra)?;
    let (first, first_at) = java.event("first").await?;
    let (_, last_at) = java.event("drained").await?;
    let cpu = java.child.0.id().and_then(cpu_seconds).unwrap_or_default();
    java.stop().await;
    let round = Round {
        rate: documents as f64 / last_at.duration_since(first_at).as_secs_f64().max(0.001),
        first: first_at.duration_since(spawned).as_secs_f64(),
        cpu,
    };
    Ok((round, first["ms"].as_f64().unwrap_or_default() / 1000.0))
}

/// Scale-out 1 → 4 over the 32 leases of `bench/wide` with `start(instance)`: seconds from the
/// moment all four run to an even share. A wait that times out says which processes had exited
/// (an instance that died at its start can never take its share).
async fn scale_out<S, Fut>(account: &CosmosAccount, prefix: &str, mut start: S) -> Result<f64, BenchError>
where
    S: FnMut(&'static str) -> Fut,
    Fut: std::future::Future<Output = Result<Owned, BenchError>>,
{
    let mut running = vec![("a", start("a").await?)];
    let first = reached(
        &format!("{prefix}: the first instance taking the 32 leases"),
        || async { owners(account, prefix).await.is_ok_and(|c| c.get("a") == Some(&32)) },
    )
    .await;
    first.map_err(|error| with_exits(error, &mut running))?;
    for name in ["b", "c", "d"] {
        running.push((name, start(name).await?));
    }
    let joined = Instant::now();
    let even = reached(&format!("{prefix}: an even share"), || async {
        owners(account, prefix).await.is_ok_and(|c| is_fair(&c, 4, 32))
    })
    .await
    .map_err(|error| with_exits(error, &mut running))?;
    Ok(even.duration_since(joined).as_secs_f64())
}

/// `error`, saying which of the `running` processes had exited, and how.
fn with_exits(error: BenchError, running: &mut [(&str, Owned)]) -> BenchError {
    let exits: Vec<String> = running
        .iter_mut()
        .filter_map(|(name, child)| match child.0.try_wait() {
            Ok(Some(status)) => Some(format!("instance {name} exited ({status})")),
            _ => None,
        })
        .collect();
    if exits.is_empty() {
        format!("{error} (every instance still running)").into()
    } else {
        format!("{error}: {}", exits.join("; ")).into()
    }
}

/// The comparison with the Java v4 processor (the jar `bench/java-peer/build.sh` builds).
pub async fn against_java(settings: &BenchSettings, jar: &Path) -> Result<Vec<Figure>, BenchError> {
    let (_emulator, endpoint) = emulator(&["bench/items:/pk:32", "bench/wide:/pk:32", "bench/leases:/id:1"]).await?;
    let account = CosmosAccount::connect(&endpoint, &AccountAuth::emulator_key()).await?;
    // The loopback backlog (20 000 in the full run), not the whole 100 000, over 32 partitions:
    // the SDK emulator copies and sorts a whole partition for every change feed page it serves,
    // so on fewer, larger partitions its pages, not the processors, set the pace (on the service
    // every partition serves its own pages).
    let documents = write_loopback_backlog(&endpoint, settings.loopback_documents()).await?;
    let (mut ours, mut java, mut java_own_first, mut raw) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // Two rounds more than the other figures: a drain here lasts well under a second.
    for round in 0..settings.rounds + 2 {
        raw.push(
            raw_read(&account, super::world::ITEMS, documents, 1000)
                .await?
                .from_first_page,
        );
        ours.push(workers_round(&endpoint, &format!("cfp-tp{round}-"), 1, documents).await?);
        let (round, own) = java_round(jar, &endpoint, round, documents).await?;
        java.push(round);
        java_own_first.push(own);
    }

    let (renew, acquire, expiration) = timings_ms(settings.timing_scale);
    let (ours_s, java_s) = rebalance_rounds(&account, &endpoint, jar, (renew, acquire, expiration)).await?;
    let acquire_s = acquire as f64 / 1000.0;
    let median = super::figures::median;
    let of = |rounds: &[Round], field: fn(&Round) -> f64| median(rounds.iter().map(field).collect());
    Ok(vec![
        Figure::ratio(
            "throughput vs the Java v4 processor (documents/s, 1 process each, loopback)",
            of(&ours, |r| r.rate),
            "Java v4 change feed processor, same backlog and emulator",
            of(&java, |r| r.rate),
            "≥ 2 ×",
        )
        .against(Check::RatioAtLeast(2.0)),
        Figure::ratio(
            "throughput vs what the emulator serves (documents/s, loopback)",
            of(&ours, |r| r.rate),
            "a raw SDK change feed read of the same backlog over loopback, from its first page (the emulator's ceiling)",
            median(raw),
            "–",
        ),
        Figure::ratio(
            &format!("CPU seconds of the process from its start until the {documents} documents are handled"),
            of(&ours, |r| r.cpu),
            "Java v4 processor (JVM start and JIT included)",
            of(&java, |r| r.cpu),
            "–",
        ),
        Figure::ratio(
            "first document after process start (s, loopback)",
            of(&ours, |r| r.first),
            &format!(
                "Java v4 processor (JVM start included; {:.2} s from its start() call)",
                median(java_own_first)
            ),
            of(&java, |r| r.first),
            "< 0.5 s",
        )
        .against(Check::Below(0.5)),
        Figure::ratio(
            "rebalance 1 → 4 over 32 leases vs Java v4: acquire cycles (seconds ÷ acquire interval)",
            (ours_s / acquire_s).ceil(),
            "Java v4 processor (steals one lease per cycle)",
            (java_s / acquire_s).ceil(),
            "≤ 2 vs 8",
        )
        .against(Check::AtMost(2.0)),
    ])
}

/// Seconds a scale-out from 1 to 4 processes over 32 leases takes: ours, then the Java peer's,
/// both with lease timings (renew, acquire, expiration) in milliseconds.
async fn rebalance_rounds(
    account: &CosmosAccount,
    endpoint: &str,
    jar: &Path,
    (renew, acquire, expiration): (u64, u64, u64),
) -> Result<(f64, f64), BenchError> {
    let ours_flags: Vec<String> = vec![
        "--lease-renew-interval".into(),
        format!("{renew}ms"),
        "--lease-acquire-interval".into(),
        format!("{acquire}ms"),
        "--lease-expiration".into(),
        format!("{expiration}ms"),
    ];
    let ours_s = scale_out(account, "cfp-wide-", |name| {
        let (endpoint, flags) = (endpoint.to_owned(), ours_flags.clone());
        async move {
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            let (child, _) = worker(&endpoint, "wide", "cfp-wide-", name, &flags)?;
            Ok(child)
        }
    })
    .await?;
    let java_flags: Vec<String> = vec![
        "--renew-ms".into(),
        renew.to_string(),
        "--acquire-ms".into(),
        acquire.to_string(),
        "--expiration-ms".into(),
        expiration.to_string(),
    ];
    let java_s = scale_out(account, "java-wide-", |name| {
        let (endpoint, flags) = (endpoint.to_owned(), java_flags.clone());
        async move {
            let mut java = JavaInstance::start(jar, &endpoint, "wide", "java-wide-", name, &flags)?;
            // Counted from the moment its processor runs (the JVM's start is not a cycle).
            java.event("started").await?;
            Ok(java.child)
        }
    })
    .await?;
    Ok((ours_s, java_s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_timed_out_wait_says_which_processes_had_exited() {
        let spawn = |program: &str, args: &[&str]| Command::new(program).args(args).spawn().map(Owned);
        let (Ok(mut done), Ok(sleeping)) = (spawn("true", &[]), spawn("sleep", &["30"])) else {
            panic!("true and sleep are on every test machine");
        };
        let ended = tokio::time::timeout(Duration::from_secs(10), done.0.wait()).await;
        assert!(ended.is_ok_and(|status| status.is_ok()), "true did not exit");
        let mut running = vec![("a", done), ("b", sleeping)];
        let said = with_exits(BenchError::from("an even share: timed out"), &mut running).to_string();
        assert!(said.contains("instance a exited (exit status: 0)"), "{said}");
        assert!(!said.contains("instance b"), "{said}");
        let mut alive = vec![("b", running.remove(1).1)];
        let said = with_exits(BenchError::from("an even share: timed out"), &mut alive).to_string();
        assert!(said.ends_with("(every instance still running)"), "{said}");
    }
}
