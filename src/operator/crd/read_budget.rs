//! The read budget: what the workers' change feed reads may spend of the monitored container's
//! throughput, and the throughput bucket they are sent in.

use kube::KubeSchema;
use serde::Deserialize;
use serde::Serialize;

use crate::processor::ReadBudget;

/// Request units a second all the workers' change feed reads may spend together, shared among
/// the live workers by the leases each reads: pages shrink and idle polls space out to stay
/// within it, so that draining a backlog leaves the application its throughput. Reads always go
/// at low priority (priority-based execution). Give `requestUnits` or `percentOfProvisioned`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!(has(self.requestUnits) && has(self.percentOfProvisioned))").message("readBudget: give requestUnits or percentOfProvisioned, not both"))]
pub struct ReadBudgetSpec {
    /// Request units a second for the whole fleet's reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000000))]
    pub request_units: Option<i32>,
    /// A percentage (1–100) of the monitored container's provisioned throughput (its own manual
    /// throughput, or its autoscale maximum; read again every ten minutes). A container sharing
    /// its database's throughput has none of its own: reads are then not paced (a warning says
    /// so); give `requestUnits` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub percent_of_provisioned: Option<i32>,
    /// The throughput bucket (1–5) reads are sent in (`x-ms-cosmos-throughput-bucket`): the
    /// account's bucket configuration caps what they may spend, and the service refuses them
    /// past it (429, sub-status 3212) before the application's requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 5))]
    pub throughput_bucket: Option<i32>,
}

impl ReadBudgetSpec {
    /// The fleet's budget it sets (`None`: none; only a bucket, say), or which field is wrong.
    pub fn budget(&self) -> Result<Option<ReadBudget>, &'static str> {
        let percent = |p: i32| u8::try_from(p).ok().filter(|p| (1..=100).contains(p));
        match (self.request_units, self.percent_of_provisioned) {
            (Some(_), Some(_)) => Err("readBudget: give requestUnits or percentOfProvisioned, not both"),
            (Some(units), None) => u32::try_from(units)
                .ok()
                .filter(|u| *u >= 1)
                .map(|u| Some(ReadBudget::RequestUnits(u)))
                .ok_or("readBudget.requestUnits must be at least 1"),
            (None, Some(p)) => percent(p)
                .map(|p| Some(ReadBudget::PercentOfProvisioned(p)))
                .ok_or("readBudget.percentOfProvisioned must be between 1 and 100"),
            (None, None) => Ok(None),
        }
    }

    /// The throughput bucket it names, or that it is out of range.
    pub fn bucket(&self) -> Result<Option<u8>, &'static str> {
        self.throughput_bucket
            .map(|b| u8::try_from(b).ok().filter(|b| (1..=5).contains(b)))
            .map_or(Ok(None), |b| {
                b.map(Some).ok_or("readBudget.throughputBucket must be between 1 and 5")
            })
    }
}
