//! A container's provisioned throughput as the service spends it on every request — reads, queries
//! and change feed pages as well as writes — with priority-based execution: once a second's
//! budget runs short, low-priority requests are refused first. Pure decisions over a clock the
//! caller passes; the edge ([`super::edge`]) asks before serving and debits after.
//!
//! - A one-second window per container and region, as the SDK emulator keeps for writes per
//!   partition. A request is admitted while its window has budget left, and debited what it was
//!   charged once answered (as the service and the Java SDK's throughput control do), so one
//!   request may overshoot the window.
//! - Priority (`x-ms-cosmos-priority-level`, `High` by default): "if both priorities are present
//!   and the user goes above the configured RU/s, low priority requests start getting throttled
//!   first" (Microsoft Learn, .NET `PriorityLevel`). The service does not publish how; here a
//!   low-priority request is admitted only if one like the last low-priority one still fits in
//!   what the window leaves after keeping back what high-priority requests spend in it — what
//!   they spent so far and what they would spend in the rest of it at the previous window's
//!   pace — so an application whose own load fits the budget is not refused because of
//!   low-priority reads. A refusal is 429 with sub-status 3200 (the service documents
//!   no other sub-status for priority) and `x-ms-retry-after-ms` the rest of the window.
//! - Throughput buckets (`x-ms-cosmos-throughput-bucket`, 1–5): where the account configures a
//!   bucket for the container, the requests in it spend at most its percentage of the
//!   container's throughput a second, and past it are refused with sub-status 3212
//!   (`ThroughputBucketLimitExhausted`, as the SDK names it) whatever the container has left
//!   (Microsoft Learn, throughput buckets); requests in no bucket, or in one not configured,
//!   spend the container's budget alone.
//! - Change feed pages are charged [`page_charge`]: the SDK emulator charges any page a flat
//!   1 RU, whatever it holds. Query pages keep that flat charge for now (the processor's lease
//!   listings would cost what they return only once its lease pacing counts them).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The length of a budget window.
pub const WINDOW: Duration = Duration::from_secs(1);

/// The priority a request asks for (`x-ms-cosmos-priority-level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// The default.
    High,
    /// Throttled first.
    Low,
}

impl Priority {
    /// The priority a header value names (`Low`, any case); `High` for anything else or none.
    pub fn of(header: Option<&str>) -> Self {
        match header {
            Some(value) if value.trim().eq_ignore_ascii_case("low") => Self::Low,
            _ => Self::High,
        }
    }
}

/// The throughput bucket a request names (`x-ms-cosmos-throughput-bucket`: 1 to 5); `None` for
/// none, or a value that is not one.
pub fn bucket_of(header: Option<&str>) -> Option<u32> {
    header?.trim().parse().ok().filter(|bucket| (1..=5).contains(bucket))
}

/// Why a request was refused, and how long until the window that refused it is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The container's budget (429/3200).
    Budget(Duration),
    /// The share of it the request's throughput bucket may spend (429/3212).
    Bucket(Duration),
}

impl Refusal {
    /// The service's sub-status for it.
    pub fn sub_status(self) -> u32 {
        match self {
            Refusal::Budget(_) => 3200,
            Refusal::Bucket(_) => 3212,
        }
    }

    /// How long until the window that refused it is over.
    pub fn wait(self) -> Duration {
        match self {
            Refusal::Budget(wait) | Refusal::Bucket(wait) => wait,
        }
    }
}

/// The request units of a change feed page whose body is `bytes` long: 1 RU for the page
/// (what the SDK emulator charges any page, an empty poll included) and, for what it returns, the
/// documented rate of a point read — "a point read for a 1-KB item is equivalent to one Request
/// Unit" (Microsoft Learn, Request Units) — per KB.
pub fn page_charge(bytes: usize) -> f64 {
    1.0 + bytes as f64 / 1024.0
}

/// One container's budget in one region: its current window.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    /// Request units per second.
    ru_per_second: f64,
    /// When the current window started.
    started: Instant,
    /// Request units charged to low-priority requests in the current window.
    spent_low: f64,
    /// Request units charged to high-priority requests in the current window.
    spent_high: f64,
    /// What high-priority requests spent in the previous window (kept back from low ones).
    previous_high: f64,
    /// The charge of the last low-priority request (the size of the next, as far as one knows).
    last_low: f64,
}

impl Budget {
    /// A budget of `ru_per_second` whose first window starts at `now`.
    pub fn new(ru_per_second: f64, now: Instant) -> Self {
        Self {
            ru_per_second,
            started: now,
            spent_low: 0.0,
            spent_high: 0.0,
            previous_high: 0.0,
            last_low: 0.0,
        }
    }

    /// Moves to the window that holds `now`.
    fn roll(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.started);
        if elapsed < WINDOW {
            return;
        }
        // A window with nothing in it between tells that high-priority demand stopped.
        self.previous_high = match elapsed < 2 * WINDOW {
            true => self.spent_high,
            false => 0.0,
        };
        self.started = now;
        self.spent_low = 0.0;
        self.spent_high = 0.0;
    }

    /// Whether a request of `priority` may be served at `now`; if not, how long until the next
    /// window.
    pub fn admit(&mut self, priority: Priority, now: Instant) -> Result<(), Duration> {
        self.roll(now);
        let fits = match priority {
            Priority::High => self.spent_low + self.spent_high < self.ru_per_second,
            Priority::Low => {
                // High-priority requests still to come this window, at last window's pace.
                let left = 1.0 - now.saturating_duration_since(self.started).as_secs_f64() / WINDOW.as_secs_f64();
                let kept_back = self.spent_high + self.previous_high * left.max(0.0);
                self.spent_low + self.last_low.max(f64::MIN_POSITIVE) <= self.ru_per_second - kept_back
            }
        };
        if fits {
            return Ok(());
        }
        let rest = WINDOW.saturating_sub(now.saturating_duration_since(self.started));
        Err(rest.max(Duration::from_millis(1)))
    }

    /// Debits what a request of `priority` answered at `now` was charged.
    pub fn debit(&mut self, priority: Priority, charge: f64, now: Instant) {
        self.roll(now);
        let charge = if charge.is_finite() { charge.max(0.0) } else { 0.0 };
        match priority {
            Priority::High => self.spent_high += charge,
            Priority::Low => {
                self.spent_low += charge;
                self.last_low = charge;
            }
        }
    }
}

/// The budgets of the containers given a throughput, by region and container, and the shares of
/// them their throughput buckets may spend.
#[derive(Debug, Default)]
pub struct RequestBudgets {
    provisioned: Mutex<HashMap<String, f64>>,
    /// Per container, the percentage of its throughput each configured bucket may spend.
    buckets: Mutex<HashMap<String, HashMap<u32, f64>>>,
    windows: Mutex<HashMap<String, Budget>>,
}

impl RequestBudgets {
    /// Gives `container` (`dbs/db/colls/c`) a budget of `ru_per_second` in every region (a
    /// budget it had is replaced from the next request on).
    pub fn provision(&self, container: &str, ru_per_second: u64) {
        self.provisioned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(container.to_owned(), ru_per_second as f64);
        let suffix = format!("|{container}");
        let bucket = format!("|{container}#");
        self.windows
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|key, _| !key.ends_with(&suffix) && !key.contains(&bucket));
    }

    /// Whether `container` has a budget.
    pub fn has(&self, container: &str) -> bool {
        self.provisioned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(container)
    }

    /// Lets throughput bucket `bucket` of `container` spend at most `percent` of its throughput
    /// (the account's throughput bucket configuration); requests in a bucket not configured
    /// spend the container's budget alone.
    pub fn configure_bucket(&self, container: &str, bucket: u32, percent: f64) {
        self.buckets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(container.to_owned())
            .or_default()
            .insert(bucket, percent.clamp(0.0, 100.0));
    }

    /// Whether a request of `priority` in `bucket` may be served by `container` in `region` at
    /// `now`: its bucket's share first (a request past it is refused whatever the container has
    /// left), then [`Budget::admit`]; `Ok` where the container has no budget.
    pub fn admit(
        &self,
        region: &str,
        container: &str,
        priority: Priority,
        bucket: Option<u32>,
        now: Instant,
    ) -> Result<(), Refusal> {
        // A bucket's window admits a request while one like its last still fits (as low
        // priority does, with no high-priority demand to keep back).
        if let Some(Err(wait)) = self.with_bucket(region, container, bucket, now, |b| b.admit(Priority::Low, now)) {
            return Err(Refusal::Bucket(wait));
        }
        self.with(region, container, now, |budget| budget.admit(priority, now))
            .unwrap_or(Ok(()))
            .map_err(Refusal::Budget)
    }

    /// [`Budget::debit`] of `container` in `region`, and of the request's bucket.
    pub fn debit(
        &self,
        region: &str,
        container: &str,
        priority: Priority,
        bucket: Option<u32>,
        charge: f64,
        now: Instant,
    ) {
        self.with_bucket(region, container, bucket, now, |b| b.debit(Priority::Low, charge, now));
        self.with(region, container, now, |budget| budget.debit(priority, charge, now));
    }

    fn with<T>(&self, region: &str, container: &str, now: Instant, f: impl FnOnce(&mut Budget) -> T) -> Option<T> {
        let ru = self.provisioned_of(container)?;
        self.window(format!("{region}|{container}"), ru, now, f)
    }

    /// `f` of the window of `bucket` of `container` in `region`, where that bucket is configured.
    fn with_bucket<T>(
        &self,
        region: &str,
        container: &str,
        bucket: Option<u32>,
        now: Instant,
        f: impl FnOnce(&mut Budget) -> T,
    ) -> Option<T> {
        let bucket = bucket?;
        let percent = *self
            .buckets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(container)?
            .get(&bucket)?;
        let ru = self.provisioned_of(container)? * percent / 100.0;
        self.window(format!("{region}|{container}#{bucket}"), ru, now, f)
    }

    fn provisioned_of(&self, container: &str) -> Option<f64> {
        self.provisioned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(container)
            .copied()
    }

    fn window<T>(&self, key: String, ru: f64, now: Instant, f: impl FnOnce(&mut Budget) -> T) -> Option<T> {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        Some(f(windows.entry(key).or_insert_with(|| Budget::new(ru, now))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn priority_is_high_unless_low_is_asked() {
        assert_eq!(Priority::of(None), Priority::High);
        assert_eq!(Priority::of(Some("High")), Priority::High);
        assert_eq!(Priority::of(Some(" low ")), Priority::Low);
        assert_eq!(Priority::of(Some("medium")), Priority::High);
    }

    #[test]
    fn a_page_costs_one_unit_and_one_per_kilobyte_it_returns() {
        assert_eq!(page_charge(0), 1.0);
        assert_eq!(page_charge(2048), 3.0);
    }

    #[test]
    fn a_spent_window_refuses_until_the_next_and_says_how_long() {
        let t0 = Instant::now();
        let mut budget = Budget::new(400.0, t0);
        assert_eq!(budget.admit(Priority::High, t0), Ok(()));
        budget.debit(Priority::High, 399.0, t0);
        assert_eq!(budget.admit(Priority::High, t0 + ms(100)), Ok(()), "one unit left");
        budget.debit(Priority::High, 30.0, t0 + ms(100));
        assert_eq!(budget.admit(Priority::High, t0 + ms(300)), Err(ms(700)));
        assert_eq!(budget.admit(Priority::High, t0 + ms(1000)), Ok(()), "a new window");
    }

    /// What a low-priority drain in pages of 30 RU is admitted at `at`.
    fn drain_in_pages_of_30(budget: &mut Budget, at: Instant) -> f64 {
        let mut low = 0.0;
        while budget.admit(Priority::Low, at).is_ok() {
            budget.debit(Priority::Low, 30.0, at);
            low += 30.0;
        }
        low
    }

    #[test]
    fn low_priority_gets_what_high_priority_leaves_and_never_pushes_it_out() {
        let t0 = Instant::now();
        let mut budget = Budget::new(400.0, t0);
        // Window 1: the application spends 300 at high priority; a drain in pages of 30 gets
        // what is left, as long as its next page fits.
        budget.debit(Priority::High, 300.0, t0);
        let low = drain_in_pages_of_30(&mut budget, t0 + ms(10));
        assert_eq!(low, 90.0, "a fourth page would not have fitted");
        // Window 2: 300 kept back for the application before it spends it.
        let t1 = t0 + ms(1000);
        let low = drain_in_pages_of_30(&mut budget, t1);
        assert_eq!((low, budget.admit(Priority::Low, t1)), (90.0, Err(ms(1000))));
        for i in 0..30 {
            assert_eq!(budget.admit(Priority::High, t1 + ms(20 + i)), Ok(()), "write {i}");
            budget.debit(Priority::High, 10.0, t1 + ms(20 + i));
        }
        // Half a window on without high-priority requests: half of last window's is kept back.
        let mut budget = Budget::new(400.0, t0);
        budget.debit(Priority::High, 300.0, t0);
        budget.debit(Priority::High, 0.0, t1);
        let half = t1 + ms(500);
        let low = drain_in_pages_of_30(&mut budget, half);
        assert_eq!(low, 240.0, "400 − 150 kept back, in pages of 30");
        // High demand gone for a whole window: low gets all of it again.
        let t3 = t0 + ms(3000);
        let low = drain_in_pages_of_30(&mut budget, t3);
        assert_eq!(low, 390.0);
    }

    #[test]
    fn containers_without_a_budget_are_never_refused() {
        let budgets = RequestBudgets::default();
        let t0 = Instant::now();
        budgets.debit("East US", "dbs/db/colls/free", Priority::Low, None, 1e9, t0);
        assert_eq!(
            budgets.admit("East US", "dbs/db/colls/free", Priority::Low, None, t0),
            Ok(())
        );
        budgets.provision("dbs/db/colls/paid", 400);
        budgets.debit("East US", "dbs/db/colls/paid", Priority::High, None, 500.0, t0);
        assert!(
            budgets
                .admit("East US", "dbs/db/colls/paid", Priority::High, None, t0)
                .is_err()
        );
        assert_eq!(
            budgets.admit("West US", "dbs/db/colls/paid", Priority::High, None, t0),
            Ok(()),
            "each region has the provisioned throughput"
        );
    }

    #[test]
    fn a_changed_throughput_applies_from_the_next_request() {
        let budgets = RequestBudgets::default();
        let t0 = Instant::now();
        let paid = "dbs/db/colls/paid";
        budgets.provision(paid, 100_000);
        budgets.debit("East US", paid, Priority::High, None, 5_000.0, t0);
        assert_eq!(budgets.admit("East US", paid, Priority::High, None, t0), Ok(()));
        budgets.provision(paid, 1_000);
        budgets.debit("East US", paid, Priority::High, None, 1_001.0, t0 + ms(10));
        assert!(
            budgets
                .admit("East US", paid, Priority::High, None, t0 + ms(20))
                .is_err(),
            "1,000 a second now"
        );
        budgets.provision("dbs/db/colls/other", 400);
        assert!(
            budgets
                .admit("East US", paid, Priority::High, None, t0 + ms(30))
                .is_err(),
            "another container's change leaves this one's window"
        );
    }

    #[test]
    fn a_bucket_spends_its_share_and_is_refused_with_its_own_sub_status() {
        let budgets = RequestBudgets::default();
        let t0 = Instant::now();
        let items = "dbs/db/colls/items";
        budgets.provision(items, 1_000);
        budgets.configure_bucket(items, 1, 25.0);
        budgets.debit("East US", items, Priority::Low, Some(1), 250.0, t0);
        let refused = budgets.admit("East US", items, Priority::Low, Some(1), t0 + ms(100));
        assert_eq!(refused, Err(Refusal::Bucket(ms(900))));
        assert_eq!(refused.map_err(Refusal::sub_status), Err(3212));
        assert_eq!(
            budgets.admit("East US", items, Priority::High, None, t0 + ms(100)),
            Ok(()),
            "the application, in no bucket, has the rest of the container's budget"
        );
        assert_eq!(
            budgets.admit("East US", items, Priority::Low, Some(2), t0 + ms(100)),
            Ok(()),
            "a bucket not configured spends the container's budget alone"
        );
        assert_eq!(
            budgets.admit("East US", items, Priority::Low, Some(1), t0 + ms(1_000)),
            Ok(())
        );
        assert_eq!(bucket_of(Some(" 3 ")), Some(3));
        assert_eq!(bucket_of(Some("6")), None);
        assert_eq!(bucket_of(None), None);
    }
}
