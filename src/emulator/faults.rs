//! Service faults `cfp emulator` can inject, as the service answers them: a share of requests
//! throttled (429 with a retry-after; 429/3212 when a throughput bucket is spent), unavailable
//! (503) or timed out (408); reads whose session is not available (404/1002), writes refused by a
//! region that no longer takes them (403/3), an account the region does not know (403/1008) —
//! the answers the SDK turns into its own 503/20310–20312 after its recovery fails — and outages
//! during which every request fails. For testing what clients do under faults, over the control
//! API.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::http_server::Response;

/// One kind of injected failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// 429/3200: request rate too large, retry after a short delay.
    Throttled,
    /// 503: the service is unavailable.
    Unavailable,
    /// 408: the request timed out on the service.
    Timeout,
    /// The connection is reset before an answer.
    Reset,
    /// 429/3212: a throughput bucket's budget is spent, retry after a short delay.
    BucketThrottled,
    /// 404/1002 (reads only): the read session is not available on this replica.
    ReadSessionUnavailable,
    /// 403/3 (writes only): this region does not take writes (any more).
    WriteForbidden,
    /// 403/1008: the region does not know the database account.
    AccountNotFound,
}

impl Fault {
    /// Every kind, in the order the control API lists them.
    pub const ALL: [Fault; 8] = [
        Fault::Throttled,
        Fault::Unavailable,
        Fault::Timeout,
        Fault::Reset,
        Fault::BucketThrottled,
        Fault::ReadSessionUnavailable,
        Fault::WriteForbidden,
        Fault::AccountNotFound,
    ];

    /// Parses a kind's name (`429`, `503`, `408`, `reset`, `429/3212`, `404/1002`, `403/3`,
    /// `403/1008`).
    pub fn parse(code: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == code.trim())
    }

    /// The status code (0 for a reset connection).
    pub fn code(self) -> u16 {
        match self {
            Fault::Throttled | Fault::BucketThrottled => 429,
            Fault::Unavailable => 503,
            Fault::Timeout => 408,
            Fault::Reset => 0,
            Fault::ReadSessionUnavailable => 404,
            Fault::WriteForbidden | Fault::AccountNotFound => 403,
        }
    }

    /// The name the control API and reports use.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Throttled => "429",
            Fault::Unavailable => "503",
            Fault::Timeout => "408",
            Fault::Reset => "reset",
            Fault::BucketThrottled => "429/3212",
            Fault::ReadSessionUnavailable => "404/1002",
            Fault::WriteForbidden => "403/3",
            Fault::AccountNotFound => "403/1008",
        }
    }

    /// Whether the service answers a read (`read`) or a write this way: a session is missing
    /// only for a read, and only a write is refused by a region that takes none.
    pub fn applies_to(self, read: bool) -> bool {
        match self {
            Fault::ReadSessionUnavailable => read,
            Fault::WriteForbidden => !read,
            _ => true,
        }
    }

    /// The response the service gives.
    pub fn response(self) -> Response {
        let (code, message, sub_status) = match self {
            Fault::Throttled => (
                "TooManyRequests",
                "Request rate is large. More Request Units may be needed, so no changes were made.",
                "3200",
            ),
            Fault::Unavailable => ("ServiceUnavailable", "The service is currently unavailable.", "0"),
            Fault::Timeout => ("RequestTimeout", "The request timed out.", "0"),
            Fault::BucketThrottled => (
                "TooManyRequests",
                "Request rate is large: the throughput bucket's budget is spent.",
                "3212",
            ),
            Fault::ReadSessionUnavailable => (
                "NotFound",
                "The read session is not available for the input session token.",
                "1002",
            ),
            Fault::WriteForbidden => (
                "Forbidden",
                "The requested operation cannot be performed at this region.",
                "3",
            ),
            Fault::AccountNotFound => (
                "Forbidden",
                "The database account does not exist in this region.",
                "1008",
            ),
            Fault::Reset => {
                let mut response = crate::http_server::response(500, "text/plain", "");
                response.extensions_mut().insert(crate::http_server::ResetConnection);
                return response;
            }
        };
        let mut response = crate::http_server::json(
            self.code(),
            &serde_json::json!({"code": code, "message": format!("{message} (injected by cfp emulator)")}),
        );
        let headers = response.headers_mut();
        headers.insert("x-ms-substatus", hyper::header::HeaderValue::from_static(sub_status));
        if matches!(self, Fault::Throttled | Fault::BucketThrottled) {
            headers.insert("x-ms-retry-after-ms", hyper::header::HeaderValue::from_static("50"));
        }
        response
    }
}

#[derive(Default)]
struct State {
    /// Each Cosmos request waits between half and one and a half of this before it is answered.
    latency: Duration,
    rate: f64,
    kinds: Vec<Fault>,
    outage_until: Option<Instant>,
    injected: BTreeMap<&'static str, u64>,
}

/// Decides, request by request, whether to fail it.
#[derive(Default)]
pub struct FaultInjector {
    state: Mutex<State>,
}

impl FaultInjector {
    /// The injector's state; a lock poisoned by a panic elsewhere is used as it is.
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Fails `rate` (0..=1) of the requests, with kinds drawn evenly from `kinds`.
    pub fn configure(&self, rate: f64, kinds: Vec<Fault>) {
        let mut state = self.state();
        state.rate = if kinds.is_empty() { 0.0 } else { rate.clamp(0.0, 1.0) };
        state.kinds = kinds;
    }

    /// Answers every request slowly: after between half and one and a half of `latency`, as a
    /// loaded account does (zero: at once).
    pub fn slow_down(&self, latency: Duration) {
        self.state().latency = latency;
    }

    /// How long the next request waits before it is answered (zero unless slowed down).
    pub fn delay(&self) -> Duration {
        let latency = self.state().latency;
        latency.mul_f64(0.5 + fastrand::f64())
    }

    /// Fails every request (503) for `duration`.
    pub fn outage(&self, duration: Duration) {
        self.state().outage_until = Some(Instant::now() + duration);
    }

    /// Stops injecting.
    pub fn clear(&self) {
        let mut state = self.state();
        state.rate = 0.0;
        state.kinds.clear();
        state.outage_until = None;
        state.latency = Duration::ZERO;
    }

    /// The fault for the next request (a read or a write), if it is to fail: one of the kinds
    /// that the service answers such a request with.
    pub fn next(&self, read: bool) -> Option<Fault> {
        let mut state = self.state();
        let fault = if state.outage_until.is_some_and(|until| Instant::now() < until) {
            Some(Fault::Unavailable)
        } else if state.rate > 0.0 && fastrand::f64() < state.rate {
            let kinds: Vec<Fault> = state.kinds.iter().copied().filter(|k| k.applies_to(read)).collect();
            fastrand::choice(kinds)
        } else {
            None
        }?;
        *state.injected.entry(fault.name()).or_default() += 1;
        Some(fault)
    }

    /// What is configured and how many of each fault were injected.
    pub fn report(&self) -> serde_json::Value {
        let state = self.state();
        let outage = state
            .outage_until
            .map(|until| until.saturating_duration_since(Instant::now()).as_millis() as u64)
            .unwrap_or(0);
        serde_json::json!({
            "rate": state.rate,
            "kinds": state.kinds.iter().map(|k| k.name()).collect::<Vec<_>>(),
            "outageRemainingMs": outage,
            "latencyMs": state.latency.as_millis() as u64,
            "injected": state.injected,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_outages_and_counts() {
        let faults = FaultInjector::default();
        assert!(
            (0..100).all(|_| faults.next(true).is_none()),
            "nothing injected by default"
        );
        faults.configure(1.0, vec![Fault::Throttled]);
        assert_eq!(faults.next(true), Some(Fault::Throttled));
        faults.configure(0.0, vec![Fault::Throttled]);
        faults.outage(Duration::from_secs(60));
        assert_eq!(faults.next(true), Some(Fault::Unavailable));
        faults.slow_down(Duration::from_millis(100));
        let delay = faults.delay();
        assert!(
            delay >= Duration::from_millis(50) && delay <= Duration::from_millis(150),
            "{delay:?}"
        );
        assert_eq!(faults.report()["latencyMs"], 100);
        faults.clear();
        assert_eq!(faults.next(true), None);
        assert_eq!(faults.delay(), Duration::ZERO);
        assert_eq!(faults.report()["injected"]["429"], 1);
        assert_eq!(faults.report()["injected"]["503"], 1);
        let throttled = Fault::Throttled.response();
        assert_eq!(throttled.status(), 429);
        assert_eq!(throttled.headers()["x-ms-retry-after-ms"], "50");
        assert_eq!(Fault::parse("408"), Some(Fault::Timeout));
        assert_eq!(Fault::parse("500"), None);
        for fault in Fault::ALL {
            assert_eq!(Fault::parse(fault.name()), Some(fault));
        }
        assert_eq!(Fault::parse("403/1008"), Some(Fault::AccountNotFound));
        // A session is missing only for a read; only a write is refused by a read region.
        let faults = FaultInjector::default();
        faults.configure(1.0, vec![Fault::WriteForbidden]);
        assert_eq!(faults.next(true), None);
        assert_eq!(faults.next(false), Some(Fault::WriteForbidden));
        faults.configure(1.0, vec![Fault::ReadSessionUnavailable]);
        assert_eq!(faults.next(false), None);
        let refused = Fault::ReadSessionUnavailable.response();
        assert_eq!(refused.status(), 404);
        assert_eq!(refused.headers()["x-ms-substatus"], "1002");
    }
}
