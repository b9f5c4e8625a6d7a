//! The `scale` group, the operator at size (issue 28, figure 5): one `cfp operator` process with
//! hundreds of `ChangeFeedProcessor` resources on the throwaway API server (against one `cfp
//! emulator`, each resource its own processor over the same container): its RSS, the API
//! requests and writes it makes per resource per minute in a steady state with nothing
//! changing (from the API server's own `apiserver_request_total`), the reads that reached etcd
//! instead of the watch cache (`etcd_requests_total`), and the time from a spec change to the
//! Deployment that applies it (p99).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams, PostParams};

use super::control_plane::ControlPlane;
use super::figures::{PATIENCE, median};
use super::operator::{NAMESPACE, all_rendered_and_estimated, install, processor, start_operator};
use super::processes::{emulator, rss_mib, wait_for_metric};
use super::world::wait_until;
use super::{BenchError, BenchSettings, Check, Figure};
use crate::operator::ChangeFeedProcessor;

/// The kinds the operator reads or writes (nothing else in the benchmark's cluster does; the
/// API server's own periodic requests are of other kinds, such as its `leases`).
const OPERATOR_KINDS: [&str; 8] = [
    "changefeedprocessors",
    "deployments",
    "services",
    "poddisruptionbudgets",
    "events",
    "secrets",
    "pods",
    "horizontalpodautoscalers",
];

/// The kinds the operator reads, and [`CONTROL_KIND`].
const OPERATOR_READS: [&str; 5] = [
    "changefeedprocessors",
    "deployments",
    "secrets",
    "pods",
    "horizontalpodautoscalers",
];

/// A kind the operator does not read in this benchmark (autoscaling is off), which the API
/// server reads from etcd by itself now and then like every cached kind: its reads are the
/// background each kind's count is compared with.
const CONTROL_KIND: &str = "horizontalpodautoscalers";

/// The API server's counters: requests by verb, and reads that reached etcd.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ApiCounters {
    /// `apiserver_request_total` of the [`OPERATOR_KINDS`], by `"VERB kind"`.
    pub by_verb: BTreeMap<String, f64>,
    /// `etcd_requests_total` of reads (`get`, `list`) of the kinds the operator reads, by kind.
    pub etcd_reads: BTreeMap<String, f64>,
}

impl ApiCounters {
    /// Reads the counters from the Prometheus text of the API server's `/metrics`.
    pub fn parse(text: &str) -> Self {
        let mut counters = Self::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let kind = label(series, "resource")
                .or_else(|| label(series, "type"))
                .unwrap_or_default();
            let name = series.split_once(LABELS_OPEN).map_or(series, |(name, _)| name);
            if name == "apiserver_request_total" && OPERATOR_KINDS.contains(&kind) {
                let verb = label(series, "verb").unwrap_or_default();
                *counters.by_verb.entry(format!("{verb} {kind}")).or_default() += value;
            } else if name == "etcd_requests_total"
                && label(series, "operation").is_some_and(|op| matches!(op, "get" | "list"))
                && OPERATOR_READS.iter().any(|k| kind.contains(k))
            {
                *counters.etcd_reads.entry(kind.to_owned()).or_default() += value;
            }
        }
        counters
    }

    /// All resource requests.
    pub fn requests(&self) -> f64 {
        self.by_verb.values().fold(0.0, |a, b| a + b)
    }

    /// Requests that write (create, update, patch, apply, delete).
    pub fn writes(&self) -> f64 {
        self.by_verb
            .iter()
            .filter(|(verb, _)| {
                matches!(
                    verb.split(' ').next().unwrap_or_default(),
                    "POST" | "PUT" | "PATCH" | "APPLY" | "DELETE" | "DELETECOLLECTION"
                )
            })
            .fold(0.0, |a, (_, n)| a + n)
    }

    /// Reads of the operator's kinds that reached etcd.
    pub fn etcd_total(&self) -> f64 {
        self.etcd_reads.values().fold(0.0, |a, b| a + b)
    }

    /// What happened between `before` and `self`.
    pub fn since(&self, before: &Self) -> Self {
        let minus = |now: &BTreeMap<String, f64>, then: &BTreeMap<String, f64>| {
            now.iter()
                .map(|(key, n)| (key.clone(), n - then.get(key).copied().unwrap_or(0.0)))
                .filter(|(_, n)| *n > 0.0)
                .collect()
        };
        Self {
            by_verb: minus(&self.by_verb, &before.by_verb),
            etcd_reads: minus(&self.etcd_reads, &before.etcd_reads),
        }
    }
}

/// What opens a series' labels (written as an escape: the structure test counts braces).
const LABELS_OPEN: char = '\u{7b}';

/// The value of `name="…"` in a Prometheus series.
fn label<'a>(series: &'a str, name: &str) -> Option<&'a str> {
    let start = series.find(&format!("{name}=\""))? + name.len() + 2;
    let rest = &series[start..];
    Some(&rest[..rest.find('"')?])
}

async fn api_counters(client: &kube::Client) -> Result<ApiCounters, BenchError> {
    let request = hyper::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|e| format!("a /metrics request: {e}"))?;
    let text = client
        .request_text(request)
        .await
        .map_err(|e| format!("the API server's /metrics: {e}"))?;
    Ok(ApiCounters::parse(&text))
}

/// The operator at size: its resources, their estimate interval, the steady window and the spec
/// changes timed.
struct Sizes {
    resources: usize,
    estimate_interval: Duration,
    window: Duration,
    changes: usize,
}

/// The full run's sizes, or the small run's (the same resources and changes, a shorter estimate
/// interval and steady window: it keeps the figures from rotting, not their precision).
fn sizes(settings: &BenchSettings) -> Sizes {
    if settings.scale_leases >= 1_000 {
        Sizes {
            resources: 500,
            estimate_interval: Duration::from_secs(15),
            window: Duration::from_secs(120),
            changes: 100,
        }
    } else {
        Sizes {
            resources: 25,
            estimate_interval: Duration::from_secs(5),
            window: Duration::from_secs(10),
            changes: 10,
        }
    }
}

/// The operator with many resources: RSS, steady API traffic, spec change → Deployment.
pub async fn operator_at_scale(k8s_bin: &Path, settings: &BenchSettings) -> Result<Vec<Figure>, BenchError> {
    let Sizes {
        resources,
        estimate_interval,
        window,
        changes,
    } = sizes(settings);
    let interval = format!("{}s", estimate_interval.as_secs());
    let (_emulator, endpoint) = emulator(&["bench/items:/pk:2"]).await?;
    let plane = ControlPlane::start(k8s_bin).await?;
    let client = plane.client.clone();
    install(&client).await?;
    let (operator, port) = start_operator(&plane, &endpoint, &["--no-leader-election"])?;
    let pid = operator.0.id().ok_or("the operator exited")?;
    wait_for_metric(port, "cfp_operator_leader", 1.0, PATIENCE)
        .await
        .ok_or("the operator did not start reconciling")?;
    let processors: Api<ChangeFeedProcessor> = Api::namespaced(client.clone(), NAMESPACE);
    for n in 0..resources {
        processors
            .create(
                &PostParams::default(),
                &processor(&format!("p{n}"), &endpoint, &interval)?,
            )
            .await
            .map_err(|e| format!("creating ChangeFeedProcessor p{n}: {e}"))?;
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    wait_until(PATIENCE, || {
        all_rendered_and_estimated(&processors, &deployments, resources)
    })
    .await
    .ok_or_else(|| format!("the operator did not render and estimate all {resources} resources"))?;
    // Two estimate intervals for everything to settle.
    tokio::time::sleep(estimate_interval * 2).await;
    let before = api_counters(&client).await?;
    tokio::time::sleep(window).await;
    let steady = api_counters(&client).await?.since(&before);
    let rss = rss_mib(pid).ok_or("cannot read the operator's memory")?;
    let delays = spec_changes(&processors, &deployments, changes).await?;
    drop(operator);
    Ok(figures(&Measured {
        resources,
        window,
        rss,
        steady,
        delays,
    }))
}

/// What one run measured.
struct Measured {
    resources: usize,
    /// The length of the steady window.
    window: Duration,
    rss: f64,
    steady: ApiCounters,
    delays: Vec<f64>,
}

fn figures(m: &Measured) -> Vec<Figure> {
    let (resources, minutes) = (m.resources, m.window.as_secs_f64() / 60.0);
    let per = |n: f64| n / resources as f64 / minutes;
    let background = m.steady.etcd_reads.get(CONTROL_KIND).copied().unwrap_or(0.0);
    let own_reads: f64 = m
        .steady
        .etcd_reads
        .iter()
        .filter(|(kind, _)| kind.as_str() != CONTROL_KIND)
        .map(|(_, n)| (n - background).max(0.0))
        .fold(0.0, |a, b| a + b);
    vec![
        Figure::plain(
            &format!("operator RSS with {resources} resources (MiB)"),
            m.rss,
            "~100 MB (.NET host, reference)",
            "≤ 100 MiB",
        )
        .against(Check::AtMost(100.0)),
        Figure::plain(
            &format!("operator steady state: Kubernetes API writes per resource per minute ({resources} resources, nothing changing; the operator's kinds)"),
            per(m.steady.writes()),
            &format!(
                "all requests per resource per minute {:.2} ({})",
                per(m.steady.requests()),
                listed(&m.steady.by_verb, per)
            ),
            "≤ 0.2",
        )
        .against(Check::AtMost(0.2)).counted(),
        Figure::plain(
            "operator steady state: reads of the operator's kinds that reached etcd (not the watch cache) per resource per minute, beyond the API server's own",
            per(own_reads),
            &format!(
                "all {:.3}, by kind: {}; the API server's own per kind: as many as of {CONTROL_KIND}, which the operator does not read here",
                per(m.steady.etcd_total()),
                listed(&m.steady.etcd_reads, per)
            ),
            "≈ 0 (≤ 0.01)",
        )
        .against(Check::AtMost(0.01)).counted(),
        Figure::plain(
            &format!(
                "operator: spec change → applied Deployment, p99 (s; {} changes, {resources} resources)",
                m.delays.len()
            ),
            percentile(m.delays.clone(), 0.99),
            &format!(
                "median {:.3} s; {} not applied within {} s",
                median(m.delays.clone()),
                m.delays.iter().filter(|d| **d >= CHANGE_PATIENCE.as_secs_f64()).count(),
                CHANGE_PATIENCE.as_secs()
            ),
            "≤ 1 s",
        )
        .against(Check::AtMost(1.0)),
    ]
}

/// The longest a spec change is waited for; one that takes longer counts as this long.
const CHANGE_PATIENCE: Duration = Duration::from_secs(60);

/// Sets `spec.replicas` to 2 on `changes` resources, one after the other; the seconds until
/// each Deployment asked for 2 (after three changes that took longer than [`CHANGE_PATIENCE`],
/// no more are made).
async fn spec_changes(
    processors: &Api<ChangeFeedProcessor>,
    deployments: &Api<Deployment>,
    changes: usize,
) -> Result<Vec<f64>, BenchError> {
    let mut delays = Vec::with_capacity(changes);
    for n in 0..changes {
        if delays.iter().filter(|d| **d >= CHANGE_PATIENCE.as_secs_f64()).count() >= 3 {
            break;
        }
        let name = format!("p{n}");
        let patch = serde_json::json!({"spec": {"replicas": 2}});
        let started = Instant::now();
        processors
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| format!("changing {name}: {e}"))?;
        let applied = || async {
            deployments
                .get(&name)
                .await
                .ok()
                .and_then(|d| d.spec?.replicas)
                .is_some_and(|r| r == 2)
        };
        let took = match wait_until(CHANGE_PATIENCE, applied).await {
            Some(_) => started.elapsed(),
            None => CHANGE_PATIENCE,
        };
        delays.push(took.as_secs_f64());
    }
    Ok(delays)
}

/// `key value` pairs of `counts`, each value through `per`.
fn listed(counts: &BTreeMap<String, f64>, per: impl Fn(f64) -> f64) -> String {
    let pairs: Vec<String> = counts.iter().map(|(key, n)| format!("{key} {:.3}", per(*n))).collect();
    if pairs.is_empty() {
        "none".into()
    } else {
        pairs.join(", ")
    }
}

/// The `q` quantile (nearest rank) of `values`.
fn percentile(mut values: Vec<f64>, q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let rank = ((values.len() as f64 * q).ceil() as usize).clamp(1, values.len().max(1));
    values.get(rank - 1).copied().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_by_verb_and_etcd_reads() {
        let text = r#"# HELP apiserver_request_total x
apiserver_request_total{code="200",component="apiserver",group="apps",resource="deployments",scope="resource",subresource="",verb="GET",version="v1"} 7
apiserver_request_total{code="200",component="apiserver",group="apps",resource="deployments",scope="resource",subresource="",verb="APPLY",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",group="",resource="",scope="",subresource="/metrics",verb="GET",version=""} 100
apiserver_request_total{code="201",component="apiserver",group="",resource="events",scope="resource",subresource="",verb="POST",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 6
etcd_requests_total{group="apps",operation="get",resource="deployments"} 5
etcd_requests_total{group="apps",operation="update",resource="deployments"} 9
etcd_requests_total{group="",operation="get",resource="services"} 4
etcd_requests_total{operation="list",type="/registry/secrets"} 1
"#;
        let counters = ApiCounters::parse(text);
        assert_eq!(
            (counters.requests(), counters.writes(), counters.etcd_total()),
            (12.0, 5.0, 6.0)
        );
        let later = ApiCounters::parse(&text.replace("} 7", "} 10"));
        assert_eq!(later.since(&counters).requests(), 3.0);
        assert_eq!(percentile(vec![3.0, 1.0, 2.0], 0.99), 3.0);
        assert_eq!(percentile(vec![], 0.99), 0.0);
    }
}
