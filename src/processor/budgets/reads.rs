//! The monitored container's read budget as this instance spends it. The change feed is read
//! from the very container that serves the application: a backlog drained as fast as it can be
//! read takes the application's request units. With a read budget (`--read-budget`, request
//! units a second for the whole fleet), each instance reads within its part of it — the same
//! [`ThroughputShare`] the lease container's budget is spent by, its part growing with the leases
//! it reads ([`read_part`]):
//!
//! - a read waits until the share has room for what a page is reckoned to cost (the last pages'
//!   charge), and what the service charged for it is spent afterwards (a page is charged by what
//!   it returns; what was read was spent, so the debt is kept up to [`OWE_AT_MOST`]);
//! - pages are sized to at most [`PAGE_SECONDS`] of the share ([`page_items`]), so that one page
//!   does not spend several seconds of it at once;
//! - leases that are caught up poll at most [`IDLE_PART`] of the share ([`idle_spacing`]), so
//!   that a fleet of many idle leases leaves its budget to the leases with changes.
//!
//! Change feed reads go at low priority (`x-ms-cosmos-priority-level: Low`), and with the
//! throughput bucket `--read-throughput-bucket` when one is set: the service keeps both apart
//! from the application's requests ([`crate::cosmos::MonitoredContainer::reader`]).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::processor::budgets::share::{Holding, Listed, ThroughputShare, part_of};

/// At most how many seconds of this instance's share a page is sized to spend.
pub const PAGE_SECONDS: f64 = 1.0;
/// The part of this instance's share its caught-up leases spend polling at most.
pub const IDLE_PART: f64 = 0.25;
/// At most how many seconds of its share an instance owes after pages that cost more than it
/// was reckoned (a page's charge is known only once it is read).
const OWE_AT_MOST: f64 = 10.0;
/// What a share's first request is reckoned at before any page was read (request units): a
/// page's cost is reckoned at a second of the share until one is known.
const FIRST_ESTIMATE: f64 = 5.0;
/// The most documents a page asks for while what a document costs is not known yet: a small
/// first page tells, before pages of many documents spend several seconds of the share at once.
pub const PROBE_ITEMS: u32 = 10;
/// What an empty page is reckoned to cost before one was read: the service's least charge.
const EMPTY_PAGE: f64 = 1.0;
/// How much a new page's charge weighs in the running figures (an exponential average).
const WEIGHT: f64 = 0.2;

/// The part of the read budget of an instance that reads `owned` of the `leases` listed, `free`
/// of them owned by nobody, among `instances` live instances: as the lease container's budget is
/// shared ([`part_of`]), without the handoffs (a lease moving is read by neither side meanwhile).
pub fn read_part(owned: usize, leases: usize, free: usize, instances: usize) -> f64 {
    let mine = Holding {
        owned,
        asked: 0,
        awaiting: 0,
    };
    let listed = Listed {
        leases,
        free,
        handoffs: 0,
    };
    part_of(mine, listed, instances)
}

/// How many documents a page may ask for: at most `max_items`, and no more than a page of
/// [`PAGE_SECONDS`] of `rate` request units a second costs at `per_document` units each (at
/// least one); [`PROBE_ITEMS`] while that is not known.
pub fn page_items(max_items: u32, rate: Option<f64>, per_document: Option<f64>) -> u32 {
    let Some(rate) = rate else {
        return max_items;
    };
    let Some(per_document) = per_document else {
        return max_items.min(PROBE_ITEMS);
    };
    if per_document.is_nan() || per_document <= 0.0 || !rate.is_finite() {
        return max_items;
    }
    let fits = (rate * PAGE_SECONDS / per_document).floor();
    if fits >= f64::from(max_items) {
        max_items
    } else {
        (fits as u32).max(1)
    }
}

/// How far the page size a reader asks for may be from what the budget affords before the
/// reader is opened again with it: within that, a page costs what the share allows give or take.
const RESIZE_RATIO: f64 = 1.25;

/// The page size a reader asking for `current` documents changes to, the budget affording
/// `advised`; `None`: it stays (within [`RESIZE_RATIO`] of it).
pub fn resize_to(current: u32, advised: u32) -> Option<u32> {
    let ratio = f64::from(advised.max(1)) / f64::from(current.max(1));
    (!(1.0 / RESIZE_RATIO..RESIZE_RATIO).contains(&ratio)).then_some(advised.max(1))
}

/// The least time between two polls of one caught-up lease, for `leases` leases read at `rate`
/// request units a second, an empty page costing `empty_page`: together they spend at most
/// [`IDLE_PART`] of the rate. Zero without a rate.
pub fn idle_spacing(rate: Option<f64>, leases: usize, empty_page: f64) -> Duration {
    let Some(rate) = rate.filter(|r| r.is_finite() && *r > 0.0) else {
        return Duration::ZERO;
    };
    let seconds = leases as f64 * empty_page.max(0.0) / (IDLE_PART * rate);
    Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX)
}

/// A read admitted by the budget: what it was reckoned at counts against the share until it is
/// answered ([`Ticket::spent`]) or given up (dropped).
#[derive(Debug)]
pub(crate) struct Ticket {
    allowance: Arc<ReadAllowance>,
    reserved: f64,
}

impl Ticket {
    /// The read was answered at `now`: `charge` request units for `documents` documents.
    pub(crate) fn spent(mut self, now: Instant, charge: f64, documents: usize) {
        // Settled here: what is dropped after has nothing left to give back.
        let reserved = std::mem::take(&mut self.reserved);
        self.allowance.spent(now, reserved, charge, documents);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // Spent or given up: the estimate no longer counts; what was charged does.
        self.allowance
            .state()
            .share
            .settle_units(std::mem::take(&mut self.reserved));
    }
}

/// What this instance knows of the read budget and of what its pages cost.
#[derive(Debug)]
struct ReadState {
    /// This instance's part of the fleet's read budget.
    share: ThroughputShare,
    /// Request units its change feed reads were charged so far.
    charged: f64,
    /// A page's charge per document, on average (`None`: no page with documents yet).
    per_document: Option<f64>,
    /// What an empty page costs, on average.
    empty_page: f64,
    /// What a page costs, on average (`None`: no page read yet).
    page: Option<f64>,
    /// Leases this instance reads.
    leases: usize,
}

/// The monitored container's read budget as this instance spends it (shared by its lease
/// readers): see the module.
#[derive(Debug)]
pub(crate) struct ReadAllowance {
    state: Mutex<ReadState>,
}

impl Default for ReadAllowance {
    fn default() -> Self {
        Self::new(Instant::now(), fastrand::f64())
    }
}

/// A running average taking in `sample`.
fn averaged(average: f64, sample: f64) -> f64 {
    average + WEIGHT * (sample - average)
}

impl ReadAllowance {
    /// No budget yet, at `now`; `phase` (0 to 1, random per instance): where in a page's time
    /// this instance's first read starts ([`ThroughputShare::new`]).
    pub(crate) fn new(now: Instant, phase: f64) -> Self {
        Self {
            state: Mutex::new(ReadState {
                share: ThroughputShare::new(now, phase).with_costs(FIRST_ESTIMATE, OWE_AT_MOST),
                charged: 0.0,
                per_document: None,
                empty_page: EMPTY_PAGE,
                page: None,
                leases: 0,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, ReadState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The fleet's read budget (`None`: none, reads are not paced) and this instance's part of
    /// it ([`read_part`]), for the `leases` it reads.
    pub(crate) fn set(&self, budget: Option<f64>, part: f64, leases: usize) {
        let mut state = self.state();
        state.share.set_shared(budget, part);
        state.leases = leases;
    }

    /// Request units this instance's change feed reads were charged so far.
    #[cfg(test)]
    fn charged(&self) -> f64 {
        self.state().charged
    }

    /// A read may go at `now` (its ticket), or how long it must wait first.
    pub(crate) fn admit(self: &Arc<Self>, now: Instant) -> Result<Ticket, Duration> {
        let mut state = self.state();
        let charged = state.charged;
        if let Some(wait) = state.share.wait(now, charged) {
            return Err(wait);
        }
        // Before a page was read, a second of the share: this instance's first reads go one by one.
        let estimate = state
            .page
            .or(state.share.rate().map(|rate| rate * PAGE_SECONDS))
            .unwrap_or(0.0);
        Ok(Ticket {
            allowance: self.clone(),
            reserved: state.share.reserve_units(estimate),
        })
    }

    /// A read reckoned at `reserved` was answered at `now`: `charge` request units for
    /// `documents` documents.
    fn spent(&self, now: Instant, reserved: f64, charge: f64, documents: usize) {
        let mut state = self.state();
        state.share.settle_units(reserved);
        let charge = if charge.is_finite() { charge.max(0.0) } else { 0.0 };
        state.charged += charge;
        // Spent now, not at the next read: a read much later finds the level refilled since.
        let charged = state.charged;
        let _ = state.share.wait(now, charged);
        if charge <= 0.0 {
            return;
        }
        state.page = Some(state.page.map_or(charge, |page| averaged(page, charge)));
        if documents == 0 {
            state.empty_page = averaged(state.empty_page, charge);
        } else {
            let each = charge / documents as f64;
            state.per_document = Some(state.per_document.map_or(each, |average| averaged(average, each)));
        }
    }

    /// What a document costs to read, on average (`None`: no page with documents yet).
    pub(crate) fn per_document(&self) -> Option<f64> {
        self.state().per_document
    }

    /// How many documents a page may ask for, `max_items` at most ([`page_items`]).
    pub(crate) fn page_items(&self, max_items: u32) -> u32 {
        let state = self.state();
        page_items(max_items, state.share.rate(), state.per_document)
    }

    /// The page size a reader asking for `current` documents a page should change to, `max_items`
    /// at most; `None`: it stays ([`resize_to`]).
    pub(crate) fn resize(&self, current: u32, max_items: u32) -> Option<u32> {
        resize_to(current, self.page_items(max_items))
    }

    /// How long a caught-up lease waits before its next poll: `wait`, or longer where the
    /// budget's idle part calls for it ([`idle_spacing`]).
    pub(crate) fn idle_wait(&self, wait: Duration) -> Duration {
        let state = self.state();
        wait.max(idle_spacing(state.share.rate(), state.leases, state.empty_page))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_is_sized_to_a_second_of_the_share() {
        // (max items, rate, per document, items)
        let table = [
            (100, None, Some(1.0), 100),
            (100, Some(50.0), None, PROBE_ITEMS),
            (5, Some(50.0), None, 5),
            (100, Some(50.0), Some(1.0), 50),
            (100, Some(500.0), Some(1.0), 100),
            (100, Some(10.0), Some(30.0), 1),
            (1_000, Some(37.5), Some(2.5), 15),
            (100, Some(50.0), Some(0.0), 100),
            (100, Some(f64::INFINITY), Some(1.0), 100),
        ];
        for (max, rate, per_document, items) in table {
            assert_eq!(
                page_items(max, rate, per_document),
                items,
                "{max} {rate:?} {per_document:?}"
            );
        }
    }

    #[test]
    fn a_reader_is_resized_only_when_its_page_is_far_from_what_the_budget_affords() {
        // (current, advised, resized to)
        for (current, advised, to) in [
            (100, 100, None),
            (100, 90, None),
            (100, 81, None),
            (100, 80, None),
            (100, 79, Some(79)),
            (100, 19, Some(19)),
            (19, 20, None),
            (19, 24, Some(24)),
            (1, 0, None),
            (5, 0, Some(1)),
        ] {
            assert_eq!(resize_to(current, advised), to, "{current} → {advised}");
        }
    }

    #[test]
    fn idle_leases_poll_within_a_quarter_of_the_share() {
        assert_eq!(idle_spacing(None, 100, 1.0), Duration::ZERO);
        assert_eq!(idle_spacing(Some(0.0), 100, 1.0), Duration::ZERO);
        assert_eq!(idle_spacing(Some(40.0), 10, 1.0), Duration::from_secs(1));
        assert_eq!(idle_spacing(Some(40.0), 100, 2.0), Duration::from_secs(20));
        // The polls of all the leases together spend a quarter of the rate.
        for (rate, leases, empty) in [(37.5, 12, 1.0), (300.0, 2_000, 1.3)] {
            let spacing = idle_spacing(Some(rate), leases, empty).as_secs_f64();
            let spent = leases as f64 * empty / spacing;
            assert!((spent - IDLE_PART * rate).abs() < 1e-6, "{spent}");
        }
    }

    #[test]
    fn the_read_parts_follow_the_leases_and_add_up_to_the_whole() {
        let parts: Vec<f64> = [10, 10, 5, 0].iter().map(|owned| read_part(*owned, 30, 5, 4)).collect();
        let all: f64 = parts.iter().sum();
        assert!((all - 1.0).abs() < 1e-9, "{parts:?}");
        assert!(parts[0] > parts[2] && parts[2] > parts[3], "{parts:?}");
    }

    /// Readers of an instance at `rate` RU/s reading pages of `charge` each as fast as the
    /// allowance lets them, for `seconds`: the request units spent.
    fn read_for(allowance: &Arc<ReadAllowance>, t0: Instant, seconds: u64, charge: f64, readers: usize) -> f64 {
        let end = t0 + Duration::from_secs(seconds);
        let mut next = vec![t0; readers];
        let before = allowance.charged();
        while let Some((i, now)) = next.iter().copied().enumerate().min_by_key(|(_, at)| *at) {
            if now >= end {
                break;
            }
            match allowance.admit(now) {
                Ok(ticket) => {
                    ticket.spent(now, charge, 10);
                    next[i] = now + Duration::from_millis(20);
                }
                Err(wait) => next[i] = now + wait.max(Duration::from_millis(1)),
            }
        }
        allowance.charged() - before
    }

    #[test]
    fn readers_spend_the_share_and_no_more_whatever_a_page_costs() {
        for (rate, charge, readers) in [(100.0, 5.0, 1), (100.0, 60.0, 4), (37.5, 101.0, 10), (400.0, 10.0, 3)] {
            for phase in [0.0, 0.5, 1.0] {
                let t0 = Instant::now();
                let allowance = Arc::new(ReadAllowance::new(t0, phase));
                allowance.set(Some(rate), 1.0, readers);
                let spent = read_for(&allowance, t0, 120, charge, readers) / 120.0;
                assert!(
                    spent <= rate * 1.02 + charge / 120.0 && spent >= rate * 0.9,
                    "{rate} RU/s, pages of {charge} RU, {readers} readers, phase {phase}: {spent} RU/s"
                );
            }
        }
    }

    #[test]
    fn a_read_given_up_no_longer_holds_its_estimate() {
        let t0 = Instant::now();
        let allowance = Arc::new(ReadAllowance::new(t0, 0.0));
        allowance.set(Some(10.0), 1.0, 1);
        let later = t0 + Duration::from_secs(1);
        drop(allowance.admit(later).expect("a second's worth kept"));
        assert!(
            allowance.admit(later).is_ok(),
            "the first read's estimate was given back"
        );
    }

    #[test]
    fn a_read_answered_gives_its_estimate_back_once() {
        let t0 = Instant::now();
        let allowance = Arc::new(ReadAllowance::new(t0, 0.0));
        allowance.set(Some(100.0), 1.0, 2);
        let first = allowance.admit(t0).expect("the first read");
        first.spent(t0, 50.0, 10);
        // A second read under way holds its estimate (the first page's 50) until answered.
        let later = t0 + Duration::from_secs(2);
        let _second = allowance.admit(later).expect("the debt is waited off by now");
        let third = allowance.admit(later);
        assert!(third.is_err(), "the second's estimate still counts: {third:?}");
    }

    #[test]
    fn without_a_budget_reads_go_at_once_and_are_counted() {
        let t0 = Instant::now();
        let allowance = Arc::new(ReadAllowance::new(t0, 0.5));
        for _ in 0..100 {
            let ticket = allowance.admit(t0).expect("no budget: no wait");
            ticket.spent(t0, 50.0, 100);
        }
        assert_eq!(allowance.charged(), 5_000.0);
        assert_eq!(allowance.page_items(100), 100);
        assert_eq!(
            allowance.idle_wait(Duration::from_millis(50)),
            Duration::from_millis(50)
        );
    }

    #[test]
    fn pages_shrink_to_what_the_share_affords_once_their_cost_is_known() {
        let t0 = Instant::now();
        let allowance = Arc::new(ReadAllowance::new(t0, 0.0));
        allowance.set(Some(40.0), 1.0, 10);
        assert_eq!(allowance.page_items(100), PROBE_ITEMS, "nothing known of a page yet");
        let ticket = allowance.admit(t0).expect("the first read goes");
        assert!(
            allowance.admit(t0).is_err(),
            "the next waits for the first's cost to be known"
        );
        ticket.spent(t0, 201.0, 100);
        assert_eq!(allowance.page_items(100), 19, "2.01 RU a document: 40 RU a page");
        assert_eq!(allowance.idle_wait(Duration::from_millis(50)), Duration::from_secs(1));
        assert!(
            allowance.admit(t0).is_err(),
            "a page of five seconds' worth is waited off"
        );
    }
}
