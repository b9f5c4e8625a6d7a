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
    /// Of those, the request units of writes (creates, replaces, upserts, deletes): what the SDK
    /// emulator debits from the budget (reads and queries are charged, never debited).
    pub write_units: f64,
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
    /// Records one answer to a request on `path` (`write`: not a read or a query).
    pub fn record(&self, path: &str, write: bool, status: StatusCode, headers: &Headers) {
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
        if write {
            load.write_units += charge;
        }
        if status == StatusCode::TooManyRequests {
            load.throttled += 1;
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
        let throttles = Throttles::default();
        let mut charged = Headers::new();
        charged.insert(REQUEST_CHARGE, "12.5");
        throttles.record("/dbs/db/colls/leases/docs/a", true, StatusCode::Ok, &charged);
        throttles.record("/dbs/db/colls/leases/docs/a", false, StatusCode::Ok, &charged);
        throttles.record(
            "dbs/db/colls/leases/docs",
            true,
            StatusCode::TooManyRequests,
            &Headers::new(),
        );
        throttles.record("/dbs/db/colls/items/docs", true, StatusCode::Ok, &charged);
        throttles.record("/dbs/db/colls/leases", false, StatusCode::Ok, &charged);
        throttles.record("/dbs/db", true, StatusCode::TooManyRequests, &Headers::new());
        let report = throttles.report();
        assert_eq!(
            report["db/leases"],
            ContainerLoad {
                throttled: 1,
                requests: 3,
                request_units: 25.0,
                write_units: 12.5,
            }
        );
        assert_eq!(report["db/items"].requests, 1);
        assert!(!report.contains_key("db/other"));
        assert_eq!(report.len(), 2);
    }
}
