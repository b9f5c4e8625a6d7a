//! Pausing a processor's workload with annotations, as KEDA pauses a ScaledObject: while paused
//! the operator neither scales nor applies changes to the worker Deployment (it keeps estimating
//! and reporting). Pure.
//!
//! - `changefeed.io/paused: "true"` — the Deployment stays exactly as it is.
//! - `changefeed.io/paused-replicas: "N"` — paused too, with the Deployment held at N replicas
//!   (0 stops every worker without deleting anything).

use std::collections::BTreeMap;

/// The annotation that pauses the workload.
pub const PAUSED_ANNOTATION: &str = "changefeed.io/paused";
/// The annotation that pauses the workload at a replica count.
pub const PAUSED_REPLICAS_ANNOTATION: &str = "changefeed.io/paused-replicas";

/// A paused workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pause {
    /// The replicas to hold, when the annotation names them; else the Deployment is left as it is.
    pub replicas: Option<i32>,
}

/// A pause annotation whose value means nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PauseError {
    /// The replicas annotation is not a count from 0 to 1000.
    #[error("annotation {} must be a replica count from 0 to 1000, not {:?}", PAUSED_REPLICAS_ANNOTATION, .0)]
    Replicas(String),
    /// The paused annotation is neither `true` nor `false`.
    #[error("annotation {} must be \"true\" or \"false\", not {:?}", PAUSED_ANNOTATION, .0)]
    Paused(String),
}

/// Whether `annotations` pause the workload; an error in words for a value that means nothing.
pub fn pause_of(annotations: &BTreeMap<String, String>) -> Result<Option<Pause>, PauseError> {
    let replicas = match annotations.get(PAUSED_REPLICAS_ANNOTATION).map(|v| v.trim()) {
        None => None,
        Some(value) => match value.parse::<i32>() {
            Ok(n) if (0..=1000).contains(&n) => Some(n),
            _ => return Err(PauseError::Replicas(value.to_owned())),
        },
    };
    let paused = match annotations
        .get(PAUSED_ANNOTATION)
        .map(|v| v.trim().to_ascii_lowercase())
    {
        None => false,
        Some(value) if value == "true" => true,
        Some(value) if value == "false" => false,
        Some(value) => return Err(PauseError::Paused(value)),
    };
    Ok((paused || replicas.is_some()).then_some(Pause { replicas }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Annotations, and what they mean (or part of the error).
    type Case = (
        &'static [(&'static str, &'static str)],
        Result<Option<Pause>, &'static str>,
    );

    #[test]
    fn annotations_table() {
        let cases: [Case; 8] = [
            (&[], Ok(None)),
            (&[(PAUSED_ANNOTATION, "true")], Ok(Some(Pause { replicas: None }))),
            (&[(PAUSED_ANNOTATION, "True")], Ok(Some(Pause { replicas: None }))),
            (&[(PAUSED_ANNOTATION, "false")], Ok(None)),
            (
                &[(PAUSED_REPLICAS_ANNOTATION, "0")],
                Ok(Some(Pause { replicas: Some(0) })),
            ),
            (
                &[(PAUSED_ANNOTATION, "true"), (PAUSED_REPLICAS_ANNOTATION, " 3 ")],
                Ok(Some(Pause { replicas: Some(3) })),
            ),
            (&[(PAUSED_ANNOTATION, "yes")], Err("must be \"true\" or \"false\"")),
            (&[(PAUSED_REPLICAS_ANNOTATION, "-1")], Err("from 0 to 1000")),
        ];
        for (annotations, want) in cases {
            let map: BTreeMap<String, String> = annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            match (pause_of(&map), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{annotations:?}"),
                (Err(got), Err(want)) => assert!(got.to_string().contains(want), "{annotations:?}: {got}"),
                (got, want) => panic!("{annotations:?}: got {got:?}, want {want:?}"),
            }
        }
    }
}
