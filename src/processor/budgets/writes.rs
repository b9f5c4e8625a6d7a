//! How this instance spends the lease container's request units when they run short. A lease
//! container has a provisioned budget (RU/s, each physical partition an equal share); a write
//! past it is answered 429. Writes that keep leases alive — the heartbeat, a lease's own
//! renewal — must get through within the lease expiration, whatever else is written: a lease
//! lost to throttling is redelivered work, for nothing. Checkpoints can wait (the next one
//! carries a later position; waiting only slows the lease down), so they yield:
//!
//! - once a checkpoint was throttled (until [`CALM`] passes without a 429), no checkpoint of this
//!   instance is sent while a write that keeps leases alive is under way (without throttling
//!   nothing waits for them);
//! - a checkpoint is sent at low priority (`x-ms-cosmos-priority-level: Low`: where the account
//!   has priority-based execution, the service throttles it first) and a 429 comes back at once
//!   rather than after the SDK's own retries, which would spend the next second's budget first;
//! - after a 429, checkpoints pause for the retry-after and go on at a rate cut (at most once a
//!   second) by the part of the budget's window the retry-after says is spent — by half when the
//!   budget ran out early in its window, by a tenth when it is back almost at once — which grows
//!   again by half a second (at least two checkpoints a second more) and is lifted after [`CALM`]
//!   without a 429 (increase and multiplicative decrease, as TCP shares a link): several instances
//!   sharing one budget each leave room for the others' heartbeats instead of spending every window
//!   at its start, and throttling that comes and goes does not starve the checkpoints;
//! - checkpoints wait their turn in order (a FIFO turnstile), so that none waits for ever;
//! - where the container's provisioned throughput is known, they also wait for this instance's
//!   share of it ([`crate::processor::budgets::share`]), so that the fleet's writes
//!   stay under the budget before any 429.
//!
//! [`BudgetState::delay`] is the decision, tested on its own.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::processor::budgets::share::ThroughputShare;
use crate::processor::leases::lease::LeaseStore;

/// How much of itself the rate grows a second while checkpoints go through, and at least how
/// many checkpoints a second it grows by.
const GROWTH: f64 = 0.5;
const MIN_GROWTH: f64 = 2.0;
/// The least rate checkpoints are cut to (writes a second).
const MIN_RATE: f64 = 1.0;
/// The rate is cut at most once per this (one budget window: the 429s of one window are one
/// signal).
const CUT_EVERY: Duration = Duration::from_secs(1);
/// How long without a 429 before checkpoints are no longer rate-limited.
pub const CALM: Duration = Duration::from_secs(30);
/// The pause after a 429 without a retry-after, and the bounds of any pause.
const DEFAULT_PAUSE: Duration = Duration::from_millis(500);
const MIN_PAUSE: Duration = Duration::from_millis(20);
const MAX_PAUSE: Duration = Duration::from_secs(5);
/// How often a checkpoint waiting behind a write that keeps leases alive looks again.
const RECHECK: Duration = Duration::from_millis(100);

/// The most of its rate a 429 leaves checkpoints (one that says the budget is back almost at
/// once): with the rate's growth of half a second, throttling that comes and goes (a busy
/// moment, a fault) slows checkpoints down without starving them.
const MAX_KEPT: f64 = 0.9;

/// The share of their rate a 429 whose retry-after is `pause` leaves checkpoints: the part of the
/// budget's window (a second) that was left when the budget ran out — a budget spent early in
/// its window was asked for far more than it has — between a half and [`MAX_KEPT`].
fn kept_after(pause: Duration) -> f64 {
    (1.0 - pause.as_secs_f64() / CUT_EVERY.as_secs_f64()).clamp(0.5, MAX_KEPT)
}

/// What this instance knows of the lease container's budget.
#[derive(Debug)]
struct BudgetState {
    /// Writes that keep leases alive under way.
    vital: usize,
    /// No checkpoint before this (a 429's retry-after).
    paused_until: Option<Instant>,
    /// Checkpoints a second allowed; `None`: not limited (nothing throttled lately).
    rate: Option<f64>,
    /// Checkpoints that may be sent now at `rate` (at most one second's worth, at least one).
    tokens: f64,
    /// When `tokens` was last topped up.
    refilled: Instant,
    /// When the last 429 cut the rate.
    cut_at: Option<Instant>,
    /// When checkpoints were last answered 429.
    throttled_at: Option<Instant>,
    /// When the checkpoints of the last second were admitted.
    recent: VecDeque<Instant>,
    /// Checkpoints answered 429 since the count was last taken.
    throttles: u64,
    /// This instance's share of the container's provisioned throughput.
    share: ThroughputShare,
}

impl BudgetState {
    /// Nothing spent at `now`; `phase`: this instance's phase in its share
    /// ([`ThroughputShare::new`]).
    fn new(now: Instant, phase: f64) -> Self {
        Self {
            vital: 0,
            paused_until: None,
            rate: None,
            tokens: 0.0,
            refilled: now,
            cut_at: None,
            throttled_at: None,
            recent: VecDeque::new(),
            throttles: 0,
            share: ThroughputShare::new(now, phase),
        }
    }
}

/// The lease container's budget as this instance spends it (shared by its lease tasks, its
/// renewer and its heartbeat).
pub(crate) struct WriteBudget {
    state: Mutex<BudgetState>,
    /// Checkpoints wait here in order.
    turnstile: tokio::sync::Mutex<()>,
    /// The lease store whose request charge this instance's share is spent on (`None`: none
    /// counted).
    meter: Option<Arc<dyn LeaseStore>>,
}

impl std::fmt::Debug for WriteBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteBudget")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl Default for WriteBudget {
    fn default() -> Self {
        Self {
            state: Mutex::new(BudgetState::new(Instant::now(), fastrand::f64())),
            turnstile: tokio::sync::Mutex::new(()),
            meter: None,
        }
    }
}

/// How a paced write takes its turn among this instance's writes that can wait.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Turn<'a> {
    /// In order, behind the writes waiting before it (a newcomer's requests and acquisitions).
    InOrder,
    /// Ahead of the writes waiting their turn, at the same pace (the take-up of a lease handed
    /// over to this instance, whose processing waits for it).
    Ahead,
    /// In order until the token is cancelled, then ahead (a lease's checkpoints and release:
    /// once its processing is cancelled a handoff follows, and a requester waits).
    AheadOnce(&'a CancellationToken),
}

/// What a paced write does once its patience has passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Late {
    /// Goes ahead of the writes waiting their turn, still within the instance's share and its
    /// pauses, and is sent as any other write ([`Spend::Plain`], with the SDK's own retries): a
    /// write is never put off for ever, and never sent past the share (what many instances had
    /// waiting past its patience, sent at once, would be far more than the budget).
    Ahead,
    /// Gives up at once and sends nothing ([`Throttled::held_back`]): an acquisition left for
    /// the next acquire cycle.
    GiveUp,
}

/// How a lease write spends the lease container's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Spend {
    /// It keeps the lease alive (a renewal): checkpoints wait while it is under way.
    Vital,
    /// Sent as any write that cannot wait, with the SDK's own retries of a 429.
    Plain,
    /// It can wait (a checkpoint, a release) and was admitted by the budget: sent at low
    /// priority, a 429 answered at once.
    Deferrable,
}

/// A 429: the lease container's budget refused a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Throttle {
    /// When to send it again, when the answer said.
    pub(crate) retry_after: Option<Duration>,
}

/// An error that may be a 429 (the lease container's budget refused the write).
pub(crate) trait Throttled {
    /// The 429 this error is, if it is one.
    fn throttled(&self) -> Option<Throttle>;

    /// The error of a write the budget held back past its patience, unsent ([`Late::GiveUp`]).
    fn held_back() -> Self;
}

impl Throttled for crate::processor::leases::lease::LeaseStoreError {
    fn throttled(&self) -> Option<Throttle> {
        self.is_throttled().then(|| Throttle {
            retry_after: self.retry_after(),
        })
    }

    fn held_back() -> Self {
        Self::HeldBack
    }
}

/// An admitted write under way: once it is dropped (answered, or given up) its estimate no
/// longer counts against the share — its actual charge does.
struct Settle<'a>(&'a WriteBudget);

impl Drop for Settle<'_> {
    fn drop(&mut self) {
        self.0.state().share.settle();
    }
}

/// A write that keeps leases alive, under way: checkpoints wait until it is dropped.
pub(crate) struct VitalWrite<'a>(&'a WriteBudget);

impl Drop for VitalWrite<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.vital = state.vital.saturating_sub(1);
    }
}

impl BudgetState {
    /// Lifts the rate once [`CALM`] passed without a 429 since the last.
    fn calm_down(&mut self, now: Instant) {
        if self.throttled_at.is_some_and(|at| now.duration_since(at) >= CALM) {
            self.rate = None;
        }
    }

    /// Whether nothing limits a checkpoint at `now` (no 429 lately, no share known): it may go
    /// at once, without waiting its turn (and it is counted).
    fn unlimited(&mut self, now: Instant) -> bool {
        self.calm_down(now);
        let unlimited = self.rate.is_none() && self.share.rate().is_none();
        if unlimited {
            self.sent(now);
        }
        unlimited
    }

    /// How long a checkpoint must still wait at `now`, the store having charged `charged`
    /// request units so far; `None`: it may go (and it is counted).
    fn delay(&mut self, now: Instant, charged: f64) -> Option<Duration> {
        self.calm_down(now);
        if self.vital > 0 && self.rate.is_some() {
            return Some(RECHECK);
        }
        if let Some(until) = self.paused_until {
            if until > now {
                return Some(until - now);
            }
            self.paused_until = None;
        }
        if let Some(wait) = self.share.wait(now, charged) {
            return Some(wait);
        }
        if let Some(rate) = self.rate {
            let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
            self.tokens = (self.tokens + elapsed * rate).min(rate.max(1.0));
            self.refilled = now;
            if self.tokens < 1.0 {
                return Some(Duration::from_secs_f64((1.0 - self.tokens) / rate));
            }
            self.tokens -= 1.0;
        }
        self.share.reserve();
        self.sent(now);
        None
    }

    /// A checkpoint was admitted at `now`: counted in the last second's.
    fn sent(&mut self, now: Instant) {
        while self
            .recent
            .front()
            .is_some_and(|at| now.duration_since(*at) >= CUT_EVERY)
        {
            self.recent.pop_front();
        }
        self.recent.push_back(now);
    }

    /// A checkpoint was answered 429 at `now`, to be retried after `retry_after`.
    fn throttled(&mut self, now: Instant, retry_after: Option<Duration>) {
        let pause = retry_after.unwrap_or(DEFAULT_PAUSE).clamp(MIN_PAUSE, MAX_PAUSE);
        self.throttles += 1;
        let until = self.paused_until.map_or(now + pause, |until| until.max(now + pause));
        self.paused_until = Some(until);
        self.throttled_at = Some(now);
        // Paced from the end of the pause, not in a burst of what would have been sent during it.
        self.tokens = 0.0;
        self.refilled = until;
        if self.cut_at.is_some_and(|at| now.duration_since(at) < CUT_EVERY) {
            return;
        }
        // What went through in the last second (or the rate, when that was lower), cut by the
        // part of the budget's window the 429 says is spent.
        let sent = self
            .recent
            .iter()
            .filter(|at| now.duration_since(**at) < CUT_EVERY)
            .count() as f64;
        let base = self.rate.unwrap_or(sent);
        self.rate = Some((base * kept_after(pause)).max(MIN_RATE));
        self.cut_at = Some(now);
    }

    /// A checkpoint went through: the rate grows by half (at least two) a second — a rate cut
    /// while this instance sent little (just started, a quiet moment) is soon back to its need.
    fn passed(&mut self) {
        if let Some(rate) = self.rate {
            // `rate` checkpoints a second, each adding its part of the second's growth.
            self.rate = Some(rate + (rate * GROWTH).max(MIN_GROWTH) / rate.max(1.0));
        }
    }
}

impl WriteBudget {
    fn state(&self) -> std::sync::MutexGuard<'_, BudgetState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a write of this instance was answered 429 within [`CALM`].
    pub(crate) fn throttled_lately(&self) -> bool {
        self.state().throttled_at.is_some_and(|at| at.elapsed() < CALM)
    }

    /// Marks a write that keeps leases alive as under way until the guard is dropped.
    pub(crate) fn vital(&self) -> VitalWrite<'_> {
        self.state().vital += 1;
        VitalWrite(self)
    }

    /// A budget that counts what `store` charged against this instance's share of the
    /// container's provisioned throughput (once [`WriteBudget::share_out`] says what it is).
    pub(crate) fn metered(store: Arc<dyn LeaseStore>) -> Self {
        Self {
            meter: Some(store),
            ..Self::default()
        }
    }

    /// The container's provisioned request units a second (`None`: not known) and this
    /// instance's part of them ([`crate::processor::budgets::share::part_of`]).
    pub(crate) fn share_out(&self, provisioned: Option<f64>, part: f64) {
        let mut state = self.state();
        state.share.set(provisioned, part);
        tracing::trace!(share = ?state.share.rate(), part, "this instance's share of the lease container's throughput (RU/s)");
    }

    /// Waits until a checkpoint may be sent (its turn, no write that keeps leases alive under
    /// way, no pause, the rate, this instance's share). Callers that may be cancelled race it
    /// against their token.
    async fn admit(&self) {
        if self.state().unlimited(Instant::now()) {
            return;
        }
        let _turn = self.turnstile.lock().await;
        self.admit_ahead().await;
    }

    /// Waits until a write may be sent in `turn`.
    async fn admit_in(&self, turn: Turn<'_>) {
        match turn {
            Turn::InOrder => self.admit().await,
            Turn::Ahead => self.admit_ahead().await,
            Turn::AheadOnce(token) => tokio::select! {
                biased;
                _ = async {
                    token.cancelled().await;
                    self.admit_ahead().await;
                } => {}
                _ = self.admit() => {}
            },
        }
    }

    /// Sends a write that can wait its turn until it is not answered 429 or `patience` has
    /// passed: each attempt is admitted by the budget in its `turn` and sent as
    /// [`Spend::Deferrable`], and a 429 tells the budget (the pace slows) and sends it again in
    /// its turn; once `patience` has passed, what `late` says. Checkpoints, and the writes that
    /// move leases (acquisitions, requests, releases), go this way: an instance that floods the
    /// budget with them crowds out every instance's heartbeat, and a write that fails after the
    /// SDK's few retries leaves a lease to expire.
    pub(crate) async fn paced<T, E, F, Fut>(
        &self,
        (patience, late): (Duration, Late),
        turn: Turn<'_>,
        mut send: F,
    ) -> Result<T, E>
    where
        E: Throttled,
        F: FnMut(Spend) -> Fut,
        Fut: std::future::Future<Output = Result<T, E>>,
    {
        let deadline = Instant::now() + patience;
        loop {
            let admitted = tokio::select! {
                biased;
                _ = tokio::time::sleep_until(deadline) => false,
                _ = self.admit_in(turn) => true,
            };
            if !admitted {
                if late == Late::GiveUp {
                    return Err(E::held_back());
                }
                self.admit_ahead().await;
                let _settle = Settle(self);
                return send(Spend::Plain).await;
            }
            let answered = {
                let _settle = Settle(self);
                send(Spend::Deferrable).await
            };
            let throttle = match answered {
                Err(error) => match error.throttled() {
                    Some(throttle) => throttle,
                    None => return Err(error),
                },
                Ok(written) => {
                    self.passed();
                    return Ok(written);
                }
            };
            self.throttled(throttle.retry_after);
        }
    }

    /// Waits until a write may be sent ahead of the writes waiting their turn, at the same
    /// pace (an owner handing over hundreds of leases at once would crowd out the other
    /// instances' heartbeats), and not while a write that keeps leases alive is under way (once
    /// throttled) or a 429's retry-after runs.
    async fn admit_ahead(&self) {
        loop {
            let charged = self.meter.as_ref().map_or(0.0, |store| store.request_charge());
            let delay = self.state().delay(Instant::now(), charged);
            match delay {
                None => return,
                Some(wait) => tokio::time::sleep(wait.min(MAX_PAUSE)).await,
            }
        }
    }

    /// A checkpoint was answered 429, to be retried after `retry_after` (when the answer said).
    pub(crate) fn throttled(&self, retry_after: Option<Duration>) {
        self.state().throttled(Instant::now(), retry_after);
    }

    /// A checkpoint went through.
    pub(crate) fn passed(&self) {
        self.state().passed();
    }

    /// Checkpoints answered 429 since the last call (for the metrics).
    pub(crate) fn take_throttles(&self) -> u64 {
        std::mem::take(&mut self.state().throttles)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processor::budgets::share::margin;

    fn state(now: Instant) -> BudgetState {
        BudgetState::new(now, 0.0)
    }

    /// A budget that admitted `sent` checkpoints, then was answered 429 with `retry_after`.
    async fn throttled_after(sent: usize, retry_after: Duration) -> std::sync::Arc<WriteBudget> {
        let budget = std::sync::Arc::new(WriteBudget::default());
        for _ in 0..sent {
            budget.admit().await;
        }
        budget.throttled(Some(retry_after));
        budget
    }

    #[test]
    fn checkpoints_go_freely_until_throttled_then_pause_and_are_paced_at_half() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut s = state(t0);
        for n in 0..40 {
            assert_eq!(s.delay(ms(n * 10), 0.0), None, "unlimited before any 429");
        }
        s.throttled(ms(400), Some(Duration::from_millis(600)));
        assert_eq!(
            s.delay(ms(500), 0.0),
            Some(Duration::from_millis(500)),
            "the retry-after"
        );
        assert_eq!(s.rate, Some(20.0), "half of the 40 sent in the last second");
        // A second 429 of the same window pauses again but does not cut twice.
        s.throttled(ms(450), Some(Duration::from_millis(700)));
        assert_eq!(s.rate, Some(20.0));
        assert_eq!(s.delay(ms(1149), 0.0), Some(Duration::from_millis(1)));
        // Paced from the end of the pause: a token every 50 ms at 20/s.
        let near = |d: Option<Duration>, want: u64| {
            d.is_some_and(|d| d.abs_diff(Duration::from_millis(want)) < Duration::from_micros(10))
        };
        assert!(near(s.delay(ms(1150), 0.0), 50));
        assert_eq!(s.delay(ms(1201), 0.0), None);
        assert!(near(s.delay(ms(1211), 0.0), 39), "0.02 + 0.2 of a token");
        s.passed();
        assert_eq!(
            s.rate,
            Some(20.5),
            "half of 20 a second, a twentieth of it per checkpoint"
        );
        // Calm for long enough: no limit any more.
        assert_eq!(s.delay(ms(450) + CALM, 0.0), None);
        assert_eq!(s.rate, None);
    }

    #[test]
    fn a_write_that_keeps_leases_alive_holds_checkpoints_back_once_they_were_throttled() {
        let budget = WriteBudget::default();
        let now = Instant::now();
        let vital = budget.vital();
        assert_eq!(budget.state().delay(now, 0.0), None, "nothing throttled: nothing waits");
        budget.state().throttled(now, Some(Duration::from_millis(100)));
        let later = now + Duration::from_millis(200);
        assert_eq!(
            budget.state().delay(later, 0.0),
            Some(RECHECK),
            "throttled: the heartbeat first"
        );
        drop(vital);
        assert_ne!(budget.state().delay(later, 0.0), Some(RECHECK), "then only the pace");
        let vital = budget.vital();
        assert_eq!(
            budget.state().delay(later + CALM, 0.0),
            None,
            "calm again: nothing waits"
        );
        drop(vital);
    }

    #[test]
    fn a_429_cuts_the_rate_by_the_part_of_the_window_its_retry_after_says_is_spent() {
        for (retry_after_ms, kept) in [
            (None, 0.5),
            (Some(900), 0.5),
            (Some(500), 0.5),
            (Some(300), 0.7),
            (Some(50), MAX_KEPT),
            (Some(0), MAX_KEPT),
        ] {
            let t0 = Instant::now();
            let mut s = state(t0);
            for n in 0..20 {
                assert_eq!(s.delay(t0 + Duration::from_millis(n * 10), 0.0), None);
            }
            s.throttled(
                t0 + Duration::from_millis(300),
                retry_after_ms.map(Duration::from_millis),
            );
            let rate = s.rate.expect("limited after a 429");
            assert!((rate - 20.0 * kept).abs() < 1e-9, "{retry_after_ms:?}: {rate}");
        }
    }

    #[test]
    fn throttling_that_comes_and_goes_does_not_starve_checkpoints() {
        // A 429 with a short retry-after every second (a fault, a busy moment), 20 checkpoints
        // admitted a second: the rate does not fall to the floor.
        let t0 = Instant::now();
        let mut s = state(t0);
        let mut now = t0;
        for _second in 0..30 {
            let mut admitted = 0;
            let end = now + CUT_EVERY;
            while now < end {
                match s.delay(now, 0.0) {
                    None => {
                        s.passed();
                        admitted += 1;
                        now += Duration::from_millis(1);
                    }
                    Some(wait) => now += wait.max(Duration::from_millis(1)),
                }
                if admitted == 3 {
                    s.throttled(now, Some(Duration::from_millis(50)));
                    admitted += 1;
                }
            }
        }
        assert!(s.rate.is_some_and(|rate| rate >= 10.0), "{:?}", s.rate);
    }

    #[test]
    fn the_rate_is_never_cut_below_the_floor_and_pauses_are_bounded() {
        let t0 = Instant::now();
        let mut s = state(t0);
        for n in 0..10u64 {
            s.throttled(t0 + CUT_EVERY * (n as u32 + 1), Some(Duration::from_secs(60)));
        }
        assert_eq!(s.rate, Some(MIN_RATE));
        let until = s.paused_until.expect("paused");
        assert!(until <= t0 + CUT_EVERY * 10 + MAX_PAUSE);
        s.throttled(t0, Some(Duration::ZERO));
        assert!(s.paused_until.is_some());
    }

    #[tokio::test]
    async fn checkpoints_are_admitted_in_order_at_the_rate() {
        // The budget's window was spent 400 ms into it: the rate is cut by half.
        let budget = throttled_after(10, Duration::from_millis(600)).await;
        let started = Instant::now();
        for _ in 0..5 {
            budget.admit().await;
        }
        let took = started.elapsed();
        // A pause of 600 ms, then 5 at 5 a second (half of the 10 sent): about 1.6 s.
        assert!(
            took >= Duration::from_millis(1500) && took <= Duration::from_secs(5),
            "{took:?}"
        );
    }

    /// A store's refusal in the `paced` tests: a 429 with a retry-after, or held back unsent.
    #[derive(Debug, PartialEq)]
    enum Refused {
        Throttled(Option<Duration>),
        HeldBack,
    }

    impl Throttled for Refused {
        fn throttled(&self) -> Option<Throttle> {
            match self {
                Refused::Throttled(retry_after) => Some(Throttle {
                    retry_after: *retry_after,
                }),
                Refused::HeldBack => None,
            }
        }

        fn held_back() -> Self {
            Refused::HeldBack
        }
    }

    #[tokio::test]
    async fn a_paced_write_answered_429_is_sent_again_after_its_retry_after_until_written() {
        let budget = WriteBudget::default();
        let sent = std::sync::Mutex::new(Vec::new());
        let started = Instant::now();
        let written = budget
            .paced((Duration::from_secs(30), Late::Ahead), Turn::InOrder, |spend| {
                let mut sent = sent.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                sent.push(spend);
                let attempt = sent.len();
                async move {
                    match attempt {
                        1..=3 => Err(Refused::Throttled(Some(Duration::from_millis(100)))),
                        _ => Ok(attempt),
                    }
                }
            })
            .await;
        assert_eq!(written.ok(), Some(4), "written at the fourth attempt");
        let sent = sent.into_inner().unwrap_or_default();
        assert_eq!(
            sent,
            [Spend::Deferrable; 4],
            "every attempt as a write that can wait (no SDK retries)"
        );
        assert!(started.elapsed() >= Duration::from_millis(300), "three retry-afters");
        assert_eq!(budget.take_throttles(), 3, "each 429 counted as throttling");
    }

    #[tokio::test]
    async fn a_paced_write_past_its_patience_is_sent_as_any_other_write() {
        let budget = WriteBudget::default();
        let sent = std::sync::Mutex::new(Vec::new());
        let written: Result<bool, Refused> = budget
            .paced((Duration::from_millis(300), Late::Ahead), Turn::InOrder, |spend| {
                sent.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(spend);
                async move {
                    match spend {
                        Spend::Deferrable => Err(Refused::Throttled(Some(Duration::from_millis(100)))),
                        _ => Ok(true),
                    }
                }
            })
            .await;
        assert_eq!(written.ok(), Some(true));
        let sent = sent.into_inner().unwrap_or_default();
        assert_eq!(
            sent.last(),
            Some(&Spend::Plain),
            "the last one with the SDK's own retries: {sent:?}"
        );
        assert!(
            sent[..sent.len() - 1].iter().all(|s| *s == Spend::Deferrable),
            "{sent:?}"
        );
    }

    #[tokio::test]
    async fn past_its_patience_a_write_still_waits_for_the_share_unless_it_gives_up() {
        let budget = WriteBudget {
            state: Mutex::new(state(Instant::now())),
            ..WriteBudget::default()
        };
        budget.share_out(Some(400.0), 10.0 / (400.0 * margin(400.0))); // 10 RU/s
        budget.state().share.reserve(); // a write under way: 10 RU, a second of the share
        let started = Instant::now();
        let sent = std::sync::Mutex::new(Vec::new());
        let send = |spend: Spend| {
            sent.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push((spend, started.elapsed()));
            async { Ok::<(), Refused>(()) }
        };
        let patience = Duration::from_millis(200);
        let given_up = budget.paced((patience, Late::GiveUp), Turn::InOrder, send).await;
        let gave_up_after = started.elapsed();
        budget.paced((patience, Late::Ahead), Turn::InOrder, send).await.ok();
        let sent = sent.into_inner().unwrap_or_default();
        assert_eq!(given_up, Err(Refused::HeldBack), "given up unsent");
        assert!(
            gave_up_after < Duration::from_millis(400),
            "at its patience: {gave_up_after:?}"
        );
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert!(
            sent[0].0 == Spend::Plain && sent[0].1 >= Duration::from_millis(900),
            "sent as any other write once the share had room, not at its patience: {sent:?}"
        );
    }

    #[tokio::test]
    async fn an_urgent_write_goes_ahead_of_the_writes_waiting_their_turn() {
        // Two a second from the end of a 500 ms pause.
        let budget = throttled_after(4, Duration::from_millis(500)).await;
        let waiting = {
            let budget = budget.clone();
            tokio::spawn(async move {
                for _ in 0..3 {
                    budget.admit().await;
                }
                Instant::now()
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let written: Result<Instant, Refused> = budget
            .paced((Duration::from_secs(30), Late::Ahead), Turn::Ahead, |_| async {
                Ok(Instant::now())
            })
            .await;
        let urgent_at = written.expect("written");
        let waiting_done = waiting.await.expect("the waiting writes");
        assert!(
            urgent_at < waiting_done,
            "the urgent write did not wait behind the queue"
        );
    }

    #[test]
    fn with_a_known_share_checkpoints_wait_for_it_before_any_429() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut s = state(t0);
        assert!(s.unlimited(at(0)), "no 429, no share: nothing waits");
        s.share.set(Some(400.0), 10.0 / (400.0 * margin(400.0))); // 10 RU/s
        assert!(!s.unlimited(at(0)), "a known share: writes wait their turn");
        assert_eq!(s.delay(at(0), 0.0), None);
        let wait = s.delay(at(0), 0.0).expect("the first write's estimate spent the share");
        assert_eq!(wait, Duration::from_secs(1), "10 RU reckoned at 10 RU/s");
        s.share.settle();
        // It was charged 13 RU, and a heartbeat 7 more: two seconds' worth of the share.
        let wait = s.delay(at(100), 20.0).expect("spent ahead");
        assert!(
            wait.abs_diff(Duration::from_millis(1900)) < Duration::from_millis(1),
            "{wait:?}"
        );
        assert_eq!(s.delay(at(2000), 20.0), None);
        assert_eq!(s.rate, None, "no 429 was needed");
    }

    #[tokio::test]
    async fn an_answered_write_no_longer_counts_as_reckoned() {
        let budget = WriteBudget {
            state: Mutex::new(state(Instant::now())),
            ..WriteBudget::default()
        };
        budget.share_out(Some(400.0), 10.0 / (400.0 * margin(400.0))); // 10 RU/s: one write reckoned fills it
        let written: Result<(), Refused> = budget
            .paced((Duration::from_secs(30), Late::Ahead), Turn::InOrder, |_| async {
                Ok(())
            })
            .await;
        assert!(written.is_ok());
        assert_eq!(budget.state().share.rate(), Some(10.0));
        assert_eq!(
            budget.state().delay(Instant::now(), 0.0),
            None,
            "the estimate was settled"
        );
    }

    #[test]
    fn a_429_marks_the_budget_throttled_until_calm() {
        let budget = WriteBudget::default();
        assert!(!budget.throttled_lately());
        budget.throttled(Some(Duration::from_millis(100)));
        assert!(budget.throttled_lately());
        budget.state().throttled_at = Some(Instant::now() - CALM);
        assert!(!budget.throttled_lately(), "calm again");
    }
}
