//! What the account's provisioned throughput refused: the 429s the SDK emulator answered, and
//! the request units it charged, per container, as they passed the [`super::edge::Edge`] (the
//! faults injected on purpose are counted by the fault injector, not here). Every answer is
//! counted, also those a client then retried by itself: this is what the service would have
//! shown in its metrics, not what the client saw.

use std::collections::BTreeMap;
use std::sync::Mutex;

use azure_core::http::StatusCode;
use azure_core::http::headers::{HeaderName, Headers};

const REQUEST_CHARGE: HeaderName = HeaderName::from_static("x-ms-request-charge");

/// Counts by container (`database/container`).
#[derive(Debug, Default)]
pub struct Throttles {
    by_container: Mutex<BTreeMap<String, ContainerLoad>>,
}

/// What one container answered so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerLoad {
    /// Requests answered 429 (throttled).
    pub throttled: u64,
    /// Requests answered.
    pub requests: u64,
    /// Request units charged (`x-ms-request-charge` of every answer, throttled ones included).
    pub request_units: f64,
    /// Of those, the request units of writes (creates, replaces, upserts, deletes).
    pub write_units: f64,
    /// Requests at low priority answered 429 (`x-ms-cosmos-priority-level: Low`).
    pub low_priority_throttled: u64,
    /// Requests answered 429 because their throughput bucket's share was spent (sub-status 3212).
    pub bucket_throttled: u64,
}

/// What kind of request an answer went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answered {
    /// A write (not a read or a query).
    pub write: bool,
    /// Sent at low priority.
    pub low_priority: bool,
}

/// The container a store path names (`dbs/db/colls/c/…` → `db/c`); `None` for the account,
/// databases and containers themselves.
fn container_of(path: &str) -> Option<String> {
    let mut segments = path.trim_matches('/').split('/');
    match (
        segments.next(),
        segments.next(),
        segments.next(),
        segments.next(),
        segments.next(),
    ) {
        (Some("dbs"), Some(db), Some("colls"), Some(coll), Some(_)) => Some(format!("{db}/{coll}")),
        _ => None,
    }
}

impl Throttles {
    /// Records one answer to a request on `path`.
    pub fn record(&self, path: &str, kind: Answered, status: StatusCode, headers: &Headers) {
        let Some(container) = container_of(path) else {
            return;
        };
        let charge = headers
            .get_optional_str(&REQUEST_CHARGE)
            .and_then(|c| c.trim().parse::<f64>().ok())
            .filter(|c| c.is_finite())
            .unwrap_or_default();
        let mut map = self
            .by_container
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let load = map.entry(container).or_default();
        load.requests += 1;
        load.request_units += charge;
        if kind.write {
            load.write_units += charge;
        }
        if status == StatusCode::TooManyRequests {
            load.throttled += 1;
            load.low_priority_throttled += u64::from(kind.low_priority);
            let sub_status = headers.get_optional_str(&HeaderName::from_static("x-ms-substatus"));
            load.bucket_throttled += u64::from(sub_status.is_some_and(|s| s.trim() == "3212"));
        }
    }

    /// Every container's counts, by `database/container`.
    pub fn report(&self) -> BTreeMap<String, ContainerLoad> {
        self.by_container
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_counted_by_the_container_their_path_names() {
        const WRITE: Answered = Answered {
            write: true,
            low_priority: false,
        };
        const READ: Answered = Answered {
            write: false,
            low_priority: false,
        };
        const LOW_READ: Answered = Answered {
            write: false,
            low_priority: true,
        };
        let throttles = Throttles::default();
        let mut charged = Headers::new();
        charged.insert(REQUEST_CHARGE, "12.5");
        throttles.record("/dbs/db/colls/leases/docs/a", WRITE, StatusCode::Ok, &charged);
        throttles.record("/dbs/db/colls/leases/docs/a", READ, StatusCode::Ok, &charged);
        throttles.record(
            "dbs/db/colls/leases/docs",
            WRITE,
            StatusCode::TooManyRequests,
            &Headers::new(),
        );
        let mut bucket_spent = Headers::new();
        bucket_spent.insert(HeaderName::from_static("x-ms-substatus"), "3212");
        throttles.record(
            "dbs/db/colls/leases/docs",
            LOW_READ,
            StatusCode::TooManyRequests,
            &bucket_spent,
        );
        throttles.record("/dbs/db/colls/items/docs", WRITE, StatusCode::Ok, &charged);
        throttles.record("/dbs/db/colls/leases", READ, StatusCode::Ok, &charged);
        throttles.record("/dbs/db", WRITE, StatusCode::TooManyRequests, &Headers::new());
        let report = throttles.report();
        assert_eq!(
            report["db/leases"],
            ContainerLoad {
                throttled: 2,
                requests: 4,
                request_units: 25.0,
                write_units: 12.5,
                low_priority_throttled: 1,
                bucket_throttled: 1,
            }
        );
        assert_eq!(report["db/items"].requests, 1);
        assert!(!report.contains_key("db/other"));
        assert_eq!(report.len(), 2);
    }
}
