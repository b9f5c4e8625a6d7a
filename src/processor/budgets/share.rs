//! This instance's share of the lease container's provisioned throughput, spent before the
//! container says no. A 429 is how a throttled lease container says its budget is spent — by then
//! every instance's writes of that second are refused together, heartbeats among them. Where the
//! container's provisioned request units a second are known (its own offer; an autoscale offer's
//! maximum), each instance spends at most its part of them — of the [`margin`] of the budget, a
//! part that grows with the leases it owns and hands over ([`part_of`]) — counting every request it
//! sent there (reads, heartbeats and renewals too, at what the container charged for them): writes
//! that can wait wait until this instance's share has room for them. The 429-driven pace
//! ([`crate::processor::budgets::writes`]) stays on top, for what a share cannot know (the
//! other processors of a shared lease container, a hot physical partition).
//!
//! [`ThroughputShare::wait`] is the decision, tested on its own.

use std::time::Duration;

use tokio::time::Instant;

use crate::processor::leases::lease::Lease;

/// How many standard deviations of a second's writes the room left in the budget covers
/// ([`margin`]).
const SPREAD: f64 = 3.0;
/// What a lease write is charged (request units), as the room left in the budget counts it.
const WRITE_CHARGE: f64 = 12.0;
/// The most of a budget the instances share out, however large it is.
const MOST_SHARED: f64 = 0.9;

/// The part of `provisioned` request units a second the instances share out among themselves:
/// the rest is room for their writes that meet in one second of the budget's window. Each
/// instance writes at its own times, so the request units of one second vary about the mean
/// as a count of independent writes does (a standard deviation of √(charge × mean)); the room
/// left is [`SPREAD`] of those. At 400 RU/s, the service's smallest, the instances share 60 %
/// (75 % leaves a 50-instance rebalance's busiest seconds over the budget); at 1,000 RU/s 72 %,
/// from about 10,000 RU/s [`MOST_SHARED`].
pub fn margin(provisioned: f64) -> f64 {
    if !provisioned.is_finite() || provisioned <= 0.0 {
        return 0.0;
    }
    // budget × (1 − m) = SPREAD × √(charge × m × budget), solved for √m.
    let spread = SPREAD * (WRITE_CHARGE * provisioned).sqrt();
    let root = (-spread + (spread * spread + 4.0 * provisioned * provisioned).sqrt()) / (2.0 * provisioned);
    (root * root).min(MOST_SHARED)
}

/// What a write is reckoned to cost before the container says (request units): about a lease
/// replace. The actual charge replaces the estimate once the write is answered.
const ESTIMATE: f64 = 10.0;
/// At most how long an instance's unspent share is kept for later (seconds' worth): an instance
/// idle for a while does not then spend several seconds' worth of its share in one.
const KEEP: f64 = 0.25;
/// At most how long an instance that spent past its share (writes sent after their patience, a
/// burst of reads) waits it off (seconds' worth), or four writes' estimate if more: the
/// container's budget is a one-second window, a second spent past it leaves the next one whole.
const OWE_AT_MOST: f64 = 1.0;

/// What one instance holds of the leases listed, as its part of the budget weighs it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Holding {
    /// Leases it owns.
    pub(crate) owned: usize,
    /// Of those, the leases another instance asked for: a release each to write.
    pub(crate) asked: usize,
    /// Leases it asked another instance for and awaits: a take-up each to write.
    pub(crate) awaiting: usize,
}

/// What a listing shows of the leases the instances share out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Listed {
    /// Leases listed.
    pub(crate) leases: usize,
    /// Of those, leases nobody owns: to be taken, by any instance alike.
    pub(crate) free: usize,
    /// Leases asked of their owner by another instance: handoffs under way.
    pub(crate) handoffs: usize,
}

/// What `me` holds of `leases` (its owned count as it knows it: `owned`), and what the listing
/// shows of them all.
pub(crate) fn holding_in(leases: &[Lease], me: &str, owned: usize) -> (Holding, Listed) {
    let mut holding = Holding {
        owned,
        ..Holding::default()
    };
    let mut listed = Listed {
        leases: leases.len(),
        ..Listed::default()
    };
    for lease in leases {
        let owner = lease.owner.as_deref().unwrap_or_default();
        listed.free += usize::from(owner.is_empty());
        let Some((to, _)) = lease.handoff_request() else {
            continue;
        };
        if owner.is_empty() || owner == to {
            continue;
        }
        listed.handoffs += 1;
        holding.asked += usize::from(owner == me);
        holding.awaiting += usize::from(to == me);
    }
    (holding, listed)
}

/// The part of the budget of an instance holding `mine` of the leases `listed`, among
/// `instances` live instances. In steady state, as much for each instance as for the fair share
/// of leases it is due, and as much again for each lease it owns, or may take (its share of the
/// leases nobody owns) — what an instance writes grows with its leases (checkpoints, renewals,
/// acquisitions) — so that once the leases are shared fairly the parts are equal (without
/// leases too), and an instance alone has the whole budget for taking them all. While leases
/// are handed over, half the budget goes by those handoffs instead: each needs a release from
/// its owner and a take-up from its requester, so an owner handing over most of its leases
/// keeps half of the budget to the end of it. The parts add up to the whole.
pub(crate) fn part_of(mine: Holding, listed: Listed, instances: usize) -> f64 {
    let instances = instances.max(1) as f64;
    let steady = if listed.leases == 0 {
        1.0 / instances
    } else {
        let leases = listed.leases as f64;
        let holds = mine.owned as f64 + listed.free as f64 / instances;
        (holds.min(leases) + leases / instances) / (2.0 * leases)
    };
    if listed.handoffs == 0 {
        return steady;
    }
    let moving = ((mine.asked + mine.awaiting) as f64 / (2.0 * listed.handoffs as f64)).min(1.0);
    (steady + moving) / 2.0
}

/// How often a container's provisioned throughput is read again (it can be changed).
const READ_EVERY: Duration = Duration::from_secs(600);

/// A container's provisioned throughput as last read.
#[derive(Debug, Default)]
pub(crate) struct ProvisionedThroughput {
    /// When it was last read.
    read_at: Option<Instant>,
    /// Request units a second; `None`: not known.
    units: Option<u64>,
}

impl ProvisionedThroughput {
    /// The `container`'s provisioned request units a second (the lease container, the monitored
    /// container), read again by `read` once the last reading is [`READ_EVERY`] old; `None`: not
    /// known. A read that fails (an identity without the right to read it, say) leaves the last
    /// value: the container's 429s alone then pace what is spent there.
    pub(crate) async fn current<E: std::fmt::Display>(
        &mut self,
        container: &str,
        read: impl Future<Output = Result<Option<u64>, E>>,
    ) -> Option<u64> {
        let now = Instant::now();
        if self.read_at.is_some_and(|at| now.duration_since(at) < READ_EVERY) {
            return self.units;
        }
        let first = self.read_at.replace(now).is_none();
        match read.await {
            Ok(units) => {
                if units != self.units {
                    tracing::info!(units, container, "a container's provisioned throughput (RU/s)");
                }
                self.units = units;
            }
            Err(error) if first => tracing::info!(
                %error,
                container,
                "a container's provisioned throughput could not be read: what is spent there is paced by its 429s alone"
            ),
            Err(error) => tracing::debug!(%error, container, "reading a container's provisioned throughput failed"),
        }
        self.units
    }
}

/// This instance's share of the lease container's provisioned throughput.
#[derive(Debug)]
pub(crate) struct ThroughputShare {
    /// The request units a second the instances share out (the [`margin`] of the container's
    /// provisioned throughput); `None`: not known (no offer of its own, serverless, not
    /// readable): no share, only the 429-driven pace.
    shared: Option<f64>,
    /// This instance's part of them, between 0 and 1.
    part: f64,
    /// Request units this instance may spend now (negative: spent ahead of its share).
    level: f64,
    /// When `level` was brought up to date.
    at: Instant,
    /// The store's request charge so far, when `level` was brought up to date.
    charged: f64,
    /// What the writes admitted and not answered yet are reckoned to cost.
    reserved: f64,
    /// What a request is reckoned to cost before it is answered ([`ESTIMATE`] for a write).
    estimate: f64,
    /// At most how many seconds' worth of its rate this instance owes after spending past its
    /// share ([`OWE_AT_MOST`] for writes).
    owe_at_most: f64,
    /// This instance's phase (0 to 1): how far below what it may keep its level starts, and starts
    /// again after an idle spell (at most a write's [`ESTIMATE`] short of sending) — so that
    /// instances started together, or idle until a moment they share (an acquire cycle, a burst of
    /// changes), do not all send a write in the same second of the budget's window: 50 instances
    /// with a share of 6 RU/s each would send 500 RU at once.
    phase: f64,
}

impl ThroughputShare {
    /// No share known yet, at `now`; `phase` (0 to 1, random per instance): see the field.
    pub(crate) fn new(now: Instant, phase: f64) -> Self {
        let phase = if phase.is_finite() { phase.clamp(0.0, 1.0) } else { 0.0 };
        Self {
            shared: None,
            part: 1.0,
            level: -phase * ESTIMATE,
            at: now,
            charged: 0.0,
            reserved: 0.0,
            estimate: ESTIMATE,
            owe_at_most: OWE_AT_MOST,
            phase,
        }
    }

    /// The same share for requests reckoned at `estimate` request units before they are
    /// answered, owing at most `owe_at_most` seconds' worth of the rate: a read of the change
    /// feed is charged by what it returns, and what was read was spent.
    pub(crate) fn with_costs(mut self, estimate: f64, owe_at_most: f64) -> Self {
        self.estimate = estimate.max(0.0);
        self.owe_at_most = owe_at_most.max(0.0);
        self.level = -self.phase * self.estimate;
        self
    }

    /// Request units a second this instance may spend; `None`: no share known.
    pub(crate) fn rate(&self) -> Option<f64> {
        self.shared.map(|shared| shared * self.part)
    }

    /// The container's provisioned throughput (`None`: not known) and this instance's part of
    /// it ([`part_of`]).
    pub(crate) fn set(&mut self, provisioned: Option<f64>, part: f64) {
        // `margin` is 0 for a budget that is not one: nothing shared, filtered out below.
        self.set_shared(provisioned.map(|ru| ru * margin(ru)), part);
    }

    /// The request units a second the instances share out (`None`: not known) and this
    /// instance's part of them.
    pub(crate) fn set_shared(&mut self, shared: Option<f64>, part: f64) {
        self.shared = shared.filter(|ru| ru.is_finite() && *ru > 0.0);
        self.part = if part.is_finite() { part.clamp(0.01, 1.0) } else { 1.0 };
    }

    /// How long a write must still wait at `now`, the store having charged `charged` request
    /// units so far; `None`: it may go (then [`ThroughputShare::reserve`] it).
    pub(crate) fn wait(&mut self, now: Instant, charged: f64) -> Option<Duration> {
        // The writes read the total before they take turns here, in any order: only a later
        // total than the last counted spends anything.
        let spent = (charged - self.charged).max(0.0);
        self.charged = self.charged.max(charged);
        let rate = self.rate()?;
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        // What is kept is capped, not what the writes under way are reckoned at: a share spent
        // on writes still unanswered goes on filling up. An instance idle long enough to keep
        // all it may starts again its phase's way below that.
        let most = rate * KEEP + self.reserved;
        let refilled = self.level + elapsed * rate;
        let kept = if refilled > most {
            most - self.phase * (rate * KEEP + self.estimate)
        } else {
            refilled
        };
        self.level = (kept - spent).max(-(rate * self.owe_at_most).max(4.0 * self.estimate));
        self.at = now;
        let short = self.reserved - self.level;
        (short > 0.0).then(|| Duration::from_secs_f64(short / rate))
    }

    /// A write was admitted: reckoned at the share's estimate until it is answered.
    pub(crate) fn reserve(&mut self) {
        self.reserve_units(self.estimate);
    }

    /// An admitted write was answered: its actual charge is in the store's total now.
    pub(crate) fn settle(&mut self) {
        self.settle_units(self.estimate);
    }

    /// A request reckoned at `units` was admitted; returns what was reserved (nothing without
    /// a share), to be settled once it is answered.
    pub(crate) fn reserve_units(&mut self, units: f64) -> f64 {
        if self.shared.is_none() {
            return 0.0;
        }
        self.reserved += units;
        units
    }

    /// An admitted request reserved at `units` was answered (or given up).
    pub(crate) fn settle_units(&mut self, units: f64) {
        self.reserved = (self.reserved - units).max(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A share of 300 RU/s among `instances`, from now.
    fn sharing(instances: usize) -> (Instant, ThroughputShare) {
        let t0 = Instant::now();
        let mut share = ThroughputShare::new(t0, 0.0);
        share.set_shared(Some(300.0), 1.0 / instances as f64);
        (t0, share)
    }

    /// Admits writes of `charge` request units as fast as the share lets them for `seconds`,
    /// each answered at once; returns what was spent.
    fn spend_for(share: &mut ThroughputShare, t0: Instant, seconds: u64, charge: f64) -> f64 {
        spend_more(share, t0, seconds, charge, 0.0)
    }

    /// Like [`spend_for`], the store having charged `before` so far.
    fn spend_more(share: &mut ThroughputShare, t0: Instant, seconds: u64, charge: f64, before: f64) -> f64 {
        let (mut now, mut charged) = (t0, before);
        let end = t0 + Duration::from_secs(seconds);
        while now < end {
            match share.wait(now, charged) {
                None => {
                    share.reserve();
                    charged += charge;
                    share.settle();
                }
                Some(wait) => now += wait.max(Duration::from_millis(1)),
            }
        }
        charged - before
    }

    #[test]
    fn without_a_known_budget_nothing_waits() {
        let t0 = Instant::now();
        let mut share = ThroughputShare::new(t0, 0.0);
        assert_eq!(share.wait(t0, 1e9), None);
        share.set(Some(0.0), 0.25);
        assert_eq!(share.rate(), None, "no budget of zero");
        assert_eq!(share.wait(t0, 2e9), None);
    }

    #[test]
    fn an_instance_spends_its_part_of_the_margin_whatever_a_write_costs() {
        for (provisioned, instances, charge) in [
            (400.0, 1, 13.0),
            (400.0, 50, 13.0),
            (400.0, 8, 6.0),
            (10_000.0, 3, 40.0),
        ] {
            for phase in [0.0, 0.5, 1.0] {
                let t0 = Instant::now();
                let mut share = ThroughputShare::new(t0, phase);
                share.set(Some(provisioned), 1.0 / instances as f64);
                let rate = provisioned * margin(provisioned) / instances as f64;
                let total = spend_for(&mut share, t0, 60, charge);
                let spent = total / 60.0;
                assert!(
                    spent <= rate + charge / 60.0 && spent >= rate * 0.9,
                    "{provisioned} RU/s, {instances} instances, {charge} RU a write, phase {phase}: {spent} RU/s of {rate}"
                );
                // Idle for a minute, then busy again: its share again, less its phase's wait.
                let again = spend_more(&mut share, t0 + Duration::from_secs(120), 60, charge, total) / 60.0;
                assert!(
                    again >= rate * 0.9,
                    "after an idle spell, phase {phase}: {again} RU/s of {rate}"
                );
            }
        }
    }

    #[test]
    fn what_else_the_instance_sent_counts_against_its_share() {
        let (t0, mut share) = sharing(10); // 30 RU/s
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert_eq!(share.wait(at(0), 0.0), None);
        // A heartbeat and a listing charged 30 RU in the meantime: a second's worth.
        let wait = share.wait(at(100), 30.0).expect("spent ahead");
        assert!(
            wait.abs_diff(Duration::from_millis(900)) < Duration::from_millis(1),
            "27 RU short at 30 RU/s: {wait:?}"
        );
        assert_eq!(share.wait(at(1000), 30.0), None);
    }

    #[test]
    fn spending_far_past_the_share_is_waited_off_for_a_second_at_most() {
        for (instances, most) in [(1, 1000), (4, 1000), (10, 1_333), (50, 6_667)] {
            let t0 = Instant::now();
            let mut share = ThroughputShare::new(t0, 0.0);
            share.set_shared(Some(300.0), 1.0 / instances as f64);
            // Writes sent past their patience charged 5,000 RU at once.
            let wait = share.wait(t0, 5_000.0).expect("spent ahead");
            assert!(
                wait.abs_diff(Duration::from_millis(most)) < Duration::from_millis(1),
                "{instances} instances: {wait:?} (a second, or four writes' estimate if more)"
            );
        }
    }

    #[test]
    fn writes_under_way_are_reckoned_before_their_charge_is_known() {
        let (t0, mut share) = sharing(1); // 300 RU/s, 75 RU kept at most
        let later = t0 + Duration::from_secs(10);
        let mut admitted = 0;
        while share.wait(later, 0.0).is_none() {
            share.reserve();
            admitted += 1;
        }
        assert_eq!(
            admitted, 8,
            "75 RU kept: eight admitted before what they are reckoned at passes it"
        );
        share.settle();
        assert_eq!(
            share.wait(later, 0.0),
            None,
            "one answered (charged nothing): room again"
        );
    }

    #[test]
    fn the_share_goes_on_filling_while_writes_are_under_way() {
        // Writes of 13 RU answered 200 ms after they were sent, as many under way as the share
        // lets: the instance still spends its whole share.
        let (t0, mut share) = sharing(2); // 150 RU/s
        let (mut now, mut charged) = (t0, 0.0);
        let mut under_way: std::collections::VecDeque<Instant> = Default::default();
        let end = t0 + Duration::from_secs(60);
        while now < end {
            while under_way.front().is_some_and(|answered| *answered <= now) {
                under_way.pop_front();
                charged += 13.0;
                share.settle();
            }
            match share.wait(now, charged) {
                None => {
                    share.reserve();
                    under_way.push_back(now + Duration::from_millis(200));
                }
                Some(wait) => now += wait.clamp(Duration::from_millis(1), Duration::from_millis(5)),
            }
        }
        let spent = charged / 60.0;
        assert!((150.0 * 0.95..=151.0).contains(&spent), "{spent} RU/s of 150");
    }

    #[test]
    fn a_total_read_before_a_later_one_is_not_counted_twice() {
        // Writes under way read the store's total each, and take turns at the share in any
        // order: an older total after a newer one spends nothing again.
        let (t0, mut share) = sharing(1); // 300 RU/s
        assert_eq!(share.wait(t0, 0.0), None);
        assert!(share.wait(t0, 13.0).is_some(), "13 RU spent");
        let level = share.level;
        assert!(share.wait(t0, 0.0).is_some());
        assert!(share.wait(t0, 13.0).is_some());
        assert_eq!(share.level, level, "the 13 RU were counted once");
    }

    #[test]
    fn an_idle_instance_keeps_only_a_quarter_second_of_its_share() {
        let (t0, mut share) = sharing(2); // 150 RU/s
        assert_eq!(share.wait(t0 + Duration::from_secs(600), 0.0), None);
        assert!((share.level - 150.0 * KEEP).abs() < 1e-9, "{}", share.level);
    }

    #[test]
    fn a_part_grows_with_the_leases_owned_and_the_parts_add_up_to_the_whole() {
        let owning = |owned| Holding {
            owned,
            ..Holding::default()
        };
        let listed = |leases, free| Listed {
            leases,
            free,
            handoffs: 0,
        };
        // (owned, leases, free, instances): the part, no handoff under way.
        for (owned, leases, free, instances, part) in [
            (0, 0, 0, 4, 0.25),
            (50, 200, 0, 4, 0.25),
            (200, 200, 0, 8, 0.5625),
            (0, 200, 0, 8, 0.0625),
            (2_000, 2_000, 0, 50, 0.51),
            (0, 2_000, 0, 50, 0.01),
            (1, 1, 0, 1, 1.0),
            (300, 200, 0, 2, 0.75),
            // Alone, taking the leases nobody owns: the whole budget from the first.
            (0, 2_000, 2_000, 1, 1.0),
            (500, 2_000, 1_500, 1, 1.0),
            // Two, one lease in four free: each may take half of them.
            (750, 2_000, 500, 2, 0.5),
        ] {
            let got = part_of(owning(owned), listed(leases, free), instances);
            assert!(
                (got - part).abs() < 1e-9,
                "{owned} of {leases} ({free} free) among {instances}: {got}"
            );
        }
        let shared = 8.0 * part_of(owning(25), listed(200, 0), 8);
        assert!((shared - 1.0).abs() < 1e-9);
        // Some owned, the rest free: the parts still add up to the whole.
        let free = 4.0 * part_of(owning(20), listed(200, 120), 4);
        assert!((free - 1.0).abs() < 1e-9, "{free}");
    }

    #[test]
    fn an_owner_handing_over_keeps_half_the_budget_to_the_end_of_its_handoffs() {
        // One owner of 2,000 leases, 49 newcomers; `left` leases still to hand over, each
        // asked for by a newcomer, the newcomers owning the rest evenly.
        for left in [1_960, 1_000, 100, 10] {
            let taken = 1_960 - left;
            let owner = Holding {
                owned: 40 + left,
                asked: left,
                awaiting: 0,
            };
            let newcomer = |i: usize| Holding {
                owned: taken / 49 + usize::from(i < taken % 49),
                asked: 0,
                awaiting: left / 49 + usize::from(i < left % 49),
            };
            let listed = Listed {
                leases: 2_000,
                free: 0,
                handoffs: left,
            };
            let mine = part_of(owner, listed, 50);
            let all = mine + (0..49).map(|i| part_of(newcomer(i), listed, 50)).sum::<f64>();
            assert!((all - 1.0).abs() < 1e-9, "{left} left: the parts add up to {all}");
            assert!(mine >= 0.25, "{left} left: the owner's part {mine}");
        }
    }

    #[test]
    fn handoffs_and_free_leases_are_counted_from_the_listing() {
        let at = time::OffsetDateTime::now_utc();
        let lease = |owner: &str, to: Option<&str>| {
            let mut lease = Lease::new("p", &crate::cosmos::EpkRange::full(), None);
            lease.owner = Some(owner.to_owned()).filter(|o| !o.is_empty());
            if let Some(to) = to {
                lease.request_handoff(to, at);
            }
            lease
        };
        let leases = [
            lease("a", Some("b")),
            lease("a", Some("c")),
            lease("a", None),
            lease("c", Some("a")),
            lease("", Some("b")),
            lease("b", Some("b")),
        ];
        let (a, listed) = holding_in(&leases, "a", 3);
        assert_eq!(listed.handoffs, 3, "asked of a live owner by another instance");
        assert_eq!((listed.leases, listed.free), (6, 1));
        assert_eq!(
            a,
            Holding {
                owned: 3,
                asked: 2,
                awaiting: 1
            }
        );
        assert_eq!(holding_in(&leases, "b", 1).0.awaiting, 1);
    }

    #[test]
    fn a_part_is_a_share_of_the_margin_of_the_budget() {
        let (_, mut share) = sharing(4);
        assert_eq!(share.rate(), Some(75.0));
        let shared = 400.0 * margin(400.0);
        share.set(Some(400.0), 1.0);
        assert_eq!(share.rate(), Some(shared));
        share.set(Some(400.0), 0.0);
        assert_eq!(share.rate(), Some(shared / 100.0), "never less than a hundredth");
        share.set(Some(400.0), f64::NAN);
        assert_eq!(share.rate(), Some(shared));
        share.set(None, 0.25);
        assert_eq!(share.rate(), None);
        share.set(Some(0.0), 0.25);
        assert_eq!(share.rate(), None, "no budget of zero");
    }

    #[test]
    fn the_room_left_covers_three_deviations_of_a_seconds_writes() {
        // (provisioned RU/s, the part shared out, roughly)
        for (provisioned, part) in [(400.0, 0.598), (1_000.0, 0.721), (4_000.0, 0.849), (10_000.0, 0.9)] {
            let got = margin(provisioned);
            assert!((got - part).abs() < 1e-3, "{provisioned} RU/s: {got}");
        }
        let mut last = 0.0;
        for provisioned in [400.0, 600.0, 1_000.0, 2_500.0, 4_000.0, 6_000.0] {
            let m = margin(provisioned);
            let room = provisioned * (1.0 - m);
            let deviation = (WRITE_CHARGE * m * provisioned).sqrt();
            assert!(
                (room - SPREAD * deviation).abs() < 1e-6,
                "{provisioned} RU/s: {room} RU left"
            );
            assert!(m > last, "a larger budget shares out more of itself");
            last = m;
        }
        assert_eq!(margin(1e9), MOST_SHARED);
        assert_eq!(margin(0.0), 0.0);
        assert_eq!(margin(f64::NAN), 0.0);
    }

    #[test]
    fn instances_idle_until_the_same_moment_spread_their_first_writes_over_their_phases() {
        // 50 instances at 6 RU/s each (300 RU/s in all), idle, then each with a write at the
        // same moment: without phases all 50 would go at once (500 RU in one second of a
        // 400 RU/s budget). With phases spread over 0..1, what goes in any second leaves room
        // in the budget for the heartbeats (50 × 10 RU every 17 s).
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(60);
        let mut sent_at = Vec::new();
        for i in 0..50 {
            let mut share = ThroughputShare::new(t0, i as f64 / 50.0);
            share.set_shared(Some(300.0), 1.0 / 50.0);
            assert!(
                share.wait(t0, 0.0).is_some() || i == 0,
                "instance {i} starts short of a write"
            );
            let mut now = later;
            while let Some(wait) = share.wait(now, 0.0) {
                now += wait.max(Duration::from_micros(1));
            }
            sent_at.push(now.duration_since(later).as_secs_f64());
        }
        for start in 0..4 {
            let start = start as f64;
            let in_second = sent_at.iter().filter(|at| (start..start + 1.0).contains(*at)).count();
            assert!(
                in_second as f64 * ESTIMATE <= 340.0,
                "{in_second} writes in second {start}: {sent_at:?}"
            );
        }
        assert!(
            sent_at.iter().all(|at| *at <= KEEP + ESTIMATE / 6.0 + 1e-3),
            "each within one write's time at its share: {sent_at:?}"
        );
        assert!(sent_at.iter().filter(|at| **at == 0.0).count() < 10, "{sent_at:?}");
    }
}
