//! Whether an object the operator would apply or delete under a resource's name is that
//! resource's: it carries an owner reference with the resource's UID. An object of that name
//! that is someone else's (a platform team's NetworkPolicy, another controller's Service) is
//! left alone and named in a `NameConflict` condition. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::operator::spec_values::ConfigProblem;

/// Whether the object with `meta` is owned by the resource with `uid`.
pub fn owned_by(meta: &ObjectMeta, uid: &str) -> bool {
    !uid.is_empty()
        && meta
            .owner_references
            .iter()
            .flatten()
            .any(|owner| owner.uid == uid && owner.kind == "ChangeFeedProcessor")
}

/// The problem a resource gets when an object it would write is someone else's: `kind` and
/// `name` say which.
pub fn name_conflict(kind: &str, name: &str) -> ConfigProblem {
    ConfigProblem {
        reason: "NameConflict",
        message: format!(
            "{kind} {name:?} exists and is not this resource's (no owner reference to it): the operator leaves it alone and applies nothing; rename the resource, or remove that {kind} if it is not needed"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn meta(owners: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            owner_references: Some(
                owners
                    .iter()
                    .map(|(kind, uid)| OwnerReference {
                        kind: (*kind).into(),
                        uid: (*uid).into(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn only_an_owner_reference_with_the_resource_s_uid_makes_an_object_its() {
        let cases = [
            ("ours", meta(&[("ChangeFeedProcessor", "u1")]), "u1", true),
            (
                "ours among others",
                meta(&[("ReplicaSet", "x"), ("ChangeFeedProcessor", "u1")]),
                "u1",
                true,
            ),
            ("no owner", ObjectMeta::default(), "u1", false),
            (
                "an earlier resource of the name",
                meta(&[("ChangeFeedProcessor", "u0")]),
                "u1",
                false,
            ),
            ("another kind with the uid", meta(&[("Deployment", "u1")]), "u1", false),
            (
                "a resource without uid",
                meta(&[("ChangeFeedProcessor", "")]),
                "",
                false,
            ),
        ];
        for (case, meta, uid, want) in cases {
            assert_eq!(owned_by(&meta, uid), want, "{case}");
        }
    }

    #[test]
    fn a_conflict_names_the_object() {
        let problem = name_conflict("NetworkPolicy", "deny-all");
        assert_eq!(problem.reason, "NameConflict");
        assert!(
            problem.message.contains("NetworkPolicy \"deny-all\""),
            "{}",
            problem.message
        );
    }
}
