//! What the workers run when a HorizontalPodAutoscaler (KEDA creates one per ScaledObject)
//! targets the resource's `/scale`: the external autoscaler rules, and the built-in one only
//! estimates. Pure: the reconciler lists the HPAs and applies the answer.

use crate::processor::report::keda_reading::KedaReading;

/// A HorizontalPodAutoscaler that targets a resource's `/scale`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalAutoscaler {
    /// Its name.
    pub name: String,
    /// Whether it has decided the replicas yet (it has a status).
    pub acted: bool,
    /// Whether KEDA made it for a ScaledObject (KEDA's scaler then reads the lease container).
    pub keda: bool,
}

/// The `KedaReadsLeases` condition of a resource KEDA scales.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KedaVerdict {
    /// Whether KEDA's scaler counts the lag of every lease.
    pub ok: bool,
    /// The condition's reason.
    pub reason: &'static str,
    /// What KEDA does with these leases, and what to do.
    pub message: String,
}

/// What KEDA's `azure-cosmosdb` scaler (through HorizontalPodAutoscaler `hpa`) makes of the
/// leases it would read (`keda`): the exact consequence, in the condition's message.
pub fn keda_verdict(hpa: &str, keda: &KedaReading) -> KedaVerdict {
    let remedy = "the built-in autoscaler reads every lease: delete the ScaledObject and leave autoscaling.enabled on";
    if !keda.unreadable.is_empty() {
        let shown: Vec<&str> = keda.unreadable.iter().take(3).map(String::as_str).collect();
        let more = keda.unreadable.len().saturating_sub(shown.len());
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        return KedaVerdict {
            ok: false,
            reason: "LeasesNotPartitions",
            message: format!(
                "KEDA (HorizontalPodAutoscaler {hpa:?}) cannot read {} of the leases ({}{more}): their LeaseToken names no partition key range (leases.perPartition > 1, or ranges split or merged since), so its scaler counts none of their lag and reports the processor active with a metric of at least 1 whatever their backlog — the workers never scale to zero, and with only such leases KEDA holds one replica; {remedy}",
                keda.unreadable.len(),
                shown.join(", ")
            ),
        };
    }
    if keda.beyond_first_page() {
        return KedaVerdict {
            ok: false,
            reason: "LeasesBeyondKedasPage",
            message: format!(
                "KEDA (HorizontalPodAutoscaler {hpa:?}) reads one page ({} documents) of its lease query, and {} documents lie under this processor's lease prefix: the lag of the leases beyond that page is not counted, so KEDA under-scales, and scales to zero while they have a backlog; {remedy}",
                keda.page, keda.documents
            ),
        };
    }
    KedaVerdict {
        ok: true,
        reason: "LeasesReadable",
        message: format!(
            "KEDA (HorizontalPodAutoscaler {hpa:?}) reads every lease ({} documents under the lease prefix, within its one page)",
            keda.documents
        ),
    }
}

/// The replicas and the `Scaling` condition (reason, message) while an external autoscaler may
/// rule; `None` when none targets the resource (the built-in autoscaler decides).
///
/// - An HPA that has decided sets `spec.replicas` through `/scale`: that is what runs.
/// - A new HPA that has not decided yet: `spec.replicas` is stale, the workers keep what runs.
/// - The HPAs could not be listed: one may exist, so nothing is overridden; the replicas hold.
pub fn external_plan<E: std::fmt::Display>(
    found: Result<Option<ExternalAutoscaler>, E>,
    current: Option<i32>,
    spec_replicas: i32,
) -> Option<(Option<i32>, &'static str, String)> {
    match found {
        Ok(None) => None,
        Ok(Some(ExternalAutoscaler { name, acted: true, .. })) => Some((
            Some(spec_replicas),
            "ExternalAutoscaler",
            format!(
                "HorizontalPodAutoscaler {name:?} targets this resource and sets spec.replicas ({spec_replicas}) through /scale; the built-in autoscaler only estimates (delete the HPA or set autoscaling.enabled to false)"
            ),
        )),
        Ok(Some(ExternalAutoscaler { name, acted: false, .. })) => Some((
            current.or(Some(spec_replicas)),
            "ExternalAutoscaler",
            format!(
                "HorizontalPodAutoscaler {name:?} targets this resource but has not decided yet: the current replicas are kept until it does"
            ),
        )),
        Err(error) => Some((
            current,
            "ExternalAutoscalerUnknown",
            format!("listing HorizontalPodAutoscalers failed, so the replicas are held: {error}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What was listed, and the replicas and reason wanted (`None`: the built-in autoscaler).
    type Found = Result<Option<ExternalAutoscaler>, String>;
    type Want = Option<(Option<i32>, &'static str)>;

    #[test]
    fn the_keda_verdict_names_what_keda_misses() {
        let reading = |unreadable: &[&str], documents| KedaReading {
            unreadable: unreadable.iter().map(|t| (*t).to_owned()).collect(),
            documents,
            page: 100,
        };
        #[rustfmt::skip]
        let cases = [
            ("version-0 leases on one page", reading(&[], 9), true, "LeasesReadable"),
            ("quarter leases", reading(&["-40", "40-80", "80-C0", "C0-FF"], 9), false, "LeasesNotPartitions"),
            ("past one page", reading(&[], 130), false, "LeasesBeyondKedasPage"),
            ("both: the leases first", reading(&["-40"], 130), false, "LeasesNotPartitions"),
        ];
        for (name, keda, ok, reason) in cases {
            let verdict = keda_verdict("keda-hpa-orders", &keda);
            assert_eq!((verdict.ok, verdict.reason), (ok, reason), "{name}");
            assert!(
                verdict.message.contains("keda-hpa-orders"),
                "{name}: {}",
                verdict.message
            );
        }
        let many = keda_verdict("h", &reading(&["a", "b", "c", "d", "e"], 9)).message;
        assert!(many.contains("5 of the leases (a, b, c and 2 more)"), "{many}");
    }

    #[test]
    fn an_external_autoscaler_is_never_overridden() {
        let hpa = |acted| {
            Ok(Some(ExternalAutoscaler {
                name: "keda-hpa-orders".into(),
                acted,
                keda: true,
            }))
        };
        #[rustfmt::skip]
        let cases: [(&str, Found, Option<i32>, Want); 6] = [
            ("none: the built-in autoscaler decides", Ok(None), Some(6), None),
            ("decided: spec.replicas", hpa(true), Some(6), Some((Some(2), "ExternalAutoscaler"))),
            ("not decided yet: what runs", hpa(false), Some(6), Some((Some(6), "ExternalAutoscaler"))),
            ("not decided, nothing runs yet: spec.replicas", hpa(false), None, Some((Some(2), "ExternalAutoscaler"))),
            ("listing failed: held", Err("forbidden".into()), Some(6), Some((Some(6), "ExternalAutoscalerUnknown"))),
            ("listing failed before any workload: nothing applied", Err("forbidden".into()), None, Some((None, "ExternalAutoscalerUnknown"))),
        ];
        for (name, found, current, want) in cases {
            let got = external_plan(found, current, 2);
            assert_eq!(got.as_ref().map(|(r, reason, _)| (*r, *reason)), want, "{name}");
        }
        let failed = external_plan::<String>(Err("forbidden".into()), Some(6), 2).unwrap().2;
        assert!(failed.contains("forbidden"), "{failed}");
    }
}
