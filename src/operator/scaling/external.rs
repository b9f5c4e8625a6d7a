//! What the workers run when a HorizontalPodAutoscaler (KEDA creates one per ScaledObject)
//! targets the resource's `/scale`: the external autoscaler rules, and the built-in one only
//! estimates. Pure: the reconciler lists the HPAs and applies the answer.

/// A HorizontalPodAutoscaler that targets a resource's `/scale`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalAutoscaler {
    /// Its name.
    pub name: String,
    /// Whether it has decided the replicas yet (it has a status).
    pub acted: bool,
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
        Ok(Some(ExternalAutoscaler { name, acted: true })) => Some((
            Some(spec_replicas),
            "ExternalAutoscaler",
            format!(
                "HorizontalPodAutoscaler {name:?} targets this resource and sets spec.replicas ({spec_replicas}) through /scale; the built-in autoscaler only estimates (delete the HPA or set autoscaling.enabled to false)"
            ),
        )),
        Ok(Some(ExternalAutoscaler { name, acted: false })) => Some((
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
    fn an_external_autoscaler_is_never_overridden() {
        let hpa = |acted| {
            Ok(Some(ExternalAutoscaler {
                name: "keda-hpa-orders".into(),
                acted,
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
