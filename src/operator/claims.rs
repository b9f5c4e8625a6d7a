//! Lease-set claims: a lease set (lease container + lease prefix) belongs to one
//! `ChangeFeedProcessor`. The first resource to run it records its claim in the lease container
//! (`{prefix}.claim`: cluster, namespace, name, uid — a document the .NET layout ignores); every
//! other resource that points at the same lease set is refused: no workers, no admin action
//! (rewind, restore, lease cleanup), no lag. The operator acts with its own identity for anyone
//! who may write a resource, so this is what keeps one namespace from moving or deleting another
//! namespace's leases. Decisions here are pure; the reads and writes are in
//! `reconcile::claim`.

use serde::{Deserialize, Serialize};

/// The annotation on the resource that holds a claim which hands it to another resource
/// (`<namespace>/<name>`, in the same cluster): the holder stops its workers, then writes the
/// handover; the named resource takes the claim once the holder's workers are gone.
pub const HAND_OVER_ANNOTATION: &str = "changefeed.io/hand-over-lease-set-to";

/// The annotation with which a resource asks for the lease set whose claim a deleted resource
/// of another namespace left (`<namespace>/<name>` of that resource): without it the claim stays.
pub const TAKE_OVER_ANNOTATION: &str = "changefeed.io/take-over-lease-set-from";

/// A resource that claims (or may claim) a lease set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Claimant {
    /// The cluster the resource lives in (the UID of its `kube-system` namespace).
    pub cluster: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID: a resource deleted and created again under the same name is another resource.
    pub uid: String,
}

impl Claimant {
    /// `namespace/name`, as messages and the handover annotation name a resource.
    pub fn path(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The claim document's contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Claim {
    /// Who holds the lease set.
    pub claimant: Claimant,
    /// The resource (`namespace/name`) the holder hands the lease set to, once its workers are
    /// gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hand_over_to: Option<String>,
}

/// What a resource may do with a lease set, given its claim document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nobody claims it: create the claim (the first resource to run it holds it).
    Create,
    /// This resource holds it.
    Held,
    /// The holder handed it to this resource: take it once the holder's workers are gone.
    TakeHandover(Claimant),
    /// Another resource of this cluster holds it: whether it still exists decides (it is taken
    /// over, with a warning, only when it does not).
    CheckHolder(Claimant),
    /// Another cluster's resource holds it: refused (its existence cannot be checked from here).
    Refused(Claimant),
}

/// Judges the claim `found` (none: unclaimed) for resource `me`.
pub fn judge(found: Option<&Claim>, me: &Claimant) -> Verdict {
    let Some(claim) = found else {
        return Verdict::Create;
    };
    let holder = &claim.claimant;
    if holder == me {
        return Verdict::Held;
    }
    if holder.cluster != me.cluster {
        return Verdict::Refused(holder.clone());
    }
    if claim.hand_over_to.as_deref() == Some(me.path().as_str()) {
        return Verdict::TakeHandover(holder.clone());
    }
    Verdict::CheckHolder(holder.clone())
}

/// What a resource is told when another holds its lease set (its status' message).
pub fn refusal(holder: &Claimant, same_cluster: bool) -> String {
    let whose = if same_cluster {
        format!("ChangeFeedProcessor {} (uid {})", holder.path(), holder.uid)
    } else {
        format!(
            "ChangeFeedProcessor {} in another cluster (kube-system uid {})",
            holder.path(),
            holder.cluster
        )
    };
    format!(
        "the lease set (lease container and processor name) is claimed by {whose}: this resource starts no workers, runs no rewind, restore or cleanup and reports no lag; give it another processorName or lease container, or have the holder hand it over (annotation {HAND_OVER_ANNOTATION}: <namespace>/<name> on the holder)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(cluster: &str, namespace: &str, name: &str, uid: &str) -> Claimant {
        Claimant {
            cluster: cluster.into(),
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    #[test]
    fn verdicts() {
        let me = who("c1", "a", "orders", "u1");
        let other = who("c1", "b", "orders", "u2");
        let claim = |holder: &Claimant, to: Option<&str>| Claim {
            claimant: holder.clone(),
            hand_over_to: to.map(str::to_owned),
        };
        let cases = [
            ("unclaimed", None, Verdict::Create),
            ("mine", Some(claim(&me, None)), Verdict::Held),
            (
                "mine, being handed on",
                Some(claim(&me, Some("b/orders"))),
                Verdict::Held,
            ),
            (
                "another namespace's",
                Some(claim(&other, None)),
                Verdict::CheckHolder(other.clone()),
            ),
            (
                "handed to me",
                Some(claim(&other, Some("a/orders"))),
                Verdict::TakeHandover(other.clone()),
            ),
            (
                "handed to someone else",
                Some(claim(&other, Some("c/orders"))),
                Verdict::CheckHolder(other.clone()),
            ),
            (
                "my name, an earlier uid (deleted and created again)",
                Some(claim(&who("c1", "a", "orders", "u0"), None)),
                Verdict::CheckHolder(who("c1", "a", "orders", "u0")),
            ),
            (
                "another cluster's",
                Some(claim(&who("c2", "a", "orders", "u1"), Some("a/orders"))),
                Verdict::Refused(who("c2", "a", "orders", "u1")),
            ),
        ];
        for (case, found, want) in cases {
            assert_eq!(judge(found.as_ref(), &me), want, "{case}");
        }
    }

    #[test]
    fn the_claim_document_round_trips_in_camel_case() {
        let claim = Claim {
            claimant: who("c1", "a", "orders", "u1"),
            hand_over_to: Some("b/orders".into()),
        };
        let json = serde_json::to_value(&claim).unwrap();
        assert_eq!(json["claimant"]["namespace"], "a");
        assert_eq!(json["handOverTo"], "b/orders");
        assert_eq!(serde_json::from_value::<Claim>(json).unwrap(), claim);
    }

    #[test]
    fn a_refusal_names_the_holder_and_the_way_out() {
        let text = refusal(&who("c1", "b", "orders", "u2"), true);
        assert!(text.contains("b/orders") && text.contains("u2") && text.contains(HAND_OVER_ANNOTATION));
    }
}
