//! The load-balancing policy: which leases one instance takes in an acquire cycle. Pure.
//!
//! Unlike the reference "equal partitions" strategy, which steals at most one lease per cycle,
//! an instance takes everything it needs in one cycle:
//! 1. it counts every live instance (lease owners and heartbeats, so that a new instance that
//!    owns nothing yet is counted by everyone), and from that its fair share: `L / W` or one more,
//!    with exactly `L % W` instances holding one more;
//! 2. it takes free (expired or unowned) leases first;
//! 3. then it steals from the most loaded owners, but only from an owner that holds more than
//!    the floor share and at least two more than the thief would after the steal — so an owner
//!    at or below its fair share is never robbed, and two instances can never trade a lease back
//!    and forth (ping-pong).
//!
//! An instance does not steal in its first cycle: that cycle announces it (heartbeat), so that
//! instances starting together all count each other before anyone steals.
//!
//! Among equally good candidates each instance prefers a different order (a hash of its name
//! and the lease id), so instances that act in the same cycle rarely race for the same lease.

use std::collections::{BTreeMap, BTreeSet};

/// What the balancer needs to know about one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseState {
    /// The lease id.
    pub id: String,
    /// The owner, when the lease is owned and not expired.
    pub live_owner: Option<String>,
}

/// The leases `me` should try to acquire now, free ones first, then ones to steal.
pub fn leases_to_acquire(leases: &[LeaseState], me: &str, live_instances: &[String], may_steal: bool) -> Vec<String> {
    if leases.is_empty() {
        return Vec::new();
    }
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for lease in leases {
        if let Some(owner) = &lease.live_owner {
            *counts.entry(owner.as_str()).or_default() += 1;
        }
    }
    let mut workers: BTreeSet<&str> = counts.keys().copied().collect();
    workers.extend(live_instances.iter().map(String::as_str));
    workers.insert(me);

    let total = leases.len();
    let floor = total / workers.len();
    let extra = total % workers.len();
    let ceil = floor + usize::from(extra > 0);
    let mut mine = counts.get(me).copied().unwrap_or(0);
    let others_at_ceil = counts.iter().filter(|(w, c)| **w != me && **c >= ceil).count();
    let target = if extra > 0 && others_at_ceil < extra { ceil } else { floor };
    if mine >= target {
        return Vec::new();
    }

    let mut take = Vec::new();
    let mut free: Vec<&LeaseState> = leases.iter().filter(|l| l.live_owner.is_none()).collect();
    free.sort_by_key(|l| preference(me, &l.id));
    for lease in free {
        if mine == target {
            return take;
        }
        take.push(lease.id.clone());
        mine += 1;
    }

    if !may_steal {
        return take;
    }
    let mut by_owner: BTreeMap<&str, Vec<&LeaseState>> = BTreeMap::new();
    for lease in leases {
        if let Some(owner) = lease.live_owner.as_deref().filter(|o| *o != me) {
            by_owner.entry(owner).or_default().push(lease);
        }
    }
    for held in by_owner.values_mut() {
        held.sort_by_key(|l| std::cmp::Reverse(preference(me, &l.id)));
    }
    while mine < target {
        // The most loaded owner (ties broken by name, so every instance sees the same order).
        let Some((_, held)) = by_owner
            .iter_mut()
            .max_by(|(a, x), (b, y)| x.len().cmp(&y.len()).then(b.cmp(a)))
        else {
            break;
        };
        let held_count = held.len();
        if held_count <= floor || held_count < mine + 2 {
            break;
        }
        if let Some(lease) = held.pop() {
            take.push(lease.id.clone());
            mine += 1;
        }
    }
    take
}

/// A per-instance order over lease ids (FNV-1a of both), stable across runs.
fn preference(me: &str, id: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in me.bytes().chain([0]).chain(id.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leases(owners: &[(&str, usize)], free: usize) -> Vec<LeaseState> {
        let mut out = Vec::new();
        for (owner, n) in owners {
            for i in 0..*n {
                out.push(LeaseState { id: format!("{owner}-{i}"), live_owner: Some((*owner).to_owned()) });
            }
        }
        for i in 0..free {
            out.push(LeaseState { id: format!("free-{i}"), live_owner: None });
        }
        out
    }

    fn instances(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    /// Runs acquire cycles (everyone plans on the same snapshot, then all steals apply, a
    /// conflicting steal going to the first claimant) until nothing moves; returns (cycles, moves,
    /// final counts).
    fn simulate(mut state: Vec<LeaseState>, names: &[&str]) -> (usize, usize, BTreeMap<String, usize>) {
        let live = instances(names);
        let mut moves = 0;
        for cycle in 0..20 {
            let plans: Vec<(String, Vec<String>)> =
                names.iter().map(|me| ((*me).to_owned(), leases_to_acquire(&state, me, &live, true))).collect();
            let mut changed = false;
            let mut claimed = BTreeSet::new();
            for (me, ids) in plans {
                for id in ids {
                    if !claimed.insert(id.clone()) {
                        continue;
                    }
                    let lease = state.iter_mut().find(|l| l.id == id).unwrap();
                    if lease.live_owner.is_some() {
                        moves += 1;
                    }
                    lease.live_owner = Some(me.clone());
                    changed = true;
                }
            }
            if !changed {
                let mut counts = BTreeMap::new();
                for l in &state {
                    *counts.entry(l.live_owner.clone().unwrap_or_default()).or_default() += 1;
                }
                return (cycle, moves, counts);
            }
        }
        panic!("did not converge");
    }

    #[test]
    fn table() {
        struct Case {
            name: &'static str,
            owners: &'static [(&'static str, usize)],
            free: usize,
            me: &'static str,
            live: &'static [&'static str],
            want: usize,
        }
        let cases = [
            Case { name: "alone takes every free lease", owners: &[], free: 8, me: "a", live: &[], want: 8 },
            Case { name: "nothing to take at fair share", owners: &[("a", 4), ("b", 4)], free: 0, me: "a", live: &[], want: 0 },
            Case { name: "new instance steals its whole share at once", owners: &[("a", 32)], free: 0, me: "b", live: &["c", "d"], want: 8 },
            Case { name: "free leases before stealing", owners: &[("a", 6)], free: 2, me: "b", live: &[], want: 2 },
            Case { name: "never steal from an owner at fair share", owners: &[("a", 3), ("b", 3), ("c", 2)], free: 0, me: "d", live: &[], want: 0 },
            Case { name: "one over ceil gives one", owners: &[("a", 5), ("b", 3)], free: 0, me: "c", live: &[], want: 2 },
            Case { name: "uneven: the remainder goes to those already at ceil", owners: &[("a", 3), ("b", 3), ("c", 3)], free: 1, me: "d", live: &[], want: 1 },
            Case { name: "no ping-pong between neighbours one apart", owners: &[("a", 5), ("b", 4)], free: 0, me: "b", live: &[], want: 0 },
            Case { name: "no leases", owners: &[], free: 0, me: "a", live: &["b"], want: 0 },
        ];
        for case in cases {
            let state = leases(case.owners, case.free);
            let got = leases_to_acquire(&state, case.me, &instances(case.live), true);
            assert_eq!(got.len(), case.want, "{}: {got:?}", case.name);
            let unique: BTreeSet<_> = got.iter().collect();
            assert_eq!(unique.len(), got.len(), "{}: duplicates", case.name);
            assert!(got.iter().all(|id| !id.starts_with(&format!("{}-", case.me))), "{}: took own lease", case.name);
        }
    }

    #[test]
    fn first_cycle_takes_only_free_leases() {
        let state = leases(&[("a", 6)], 2);
        assert_eq!(leases_to_acquire(&state, "b", &[], false).len(), 2);
        assert!(leases_to_acquire(&leases(&[("a", 8)], 0), "b", &[], false).is_empty());
    }

    #[test]
    fn scale_out_one_to_four_converges_in_one_cycle_with_minimum_moves() {
        let (cycles, moves, counts) = simulate(leases(&[("a", 32)], 0), &["a", "b", "c", "d"]);
        assert!(cycles <= 2, "cycles {cycles}");
        assert_eq!(moves, 24, "moves");
        assert!(counts.values().all(|c| *c == 8), "{counts:?}");
    }

    #[test]
    fn uneven_shares_end_within_one_of_each_other() {
        for (total, names) in [(10usize, vec!["a", "b", "c", "d"]), (7, vec!["a", "b", "c"]), (33, vec!["a", "b", "c", "d", "e"])] {
            let (cycles, _, counts) = simulate(leases(&[("a", total)], 0), &names);
            let max = counts.values().max().unwrap();
            let min = counts.values().min().unwrap();
            assert!(max - min <= 1, "{total} over {names:?}: {counts:?}");
            assert!(cycles <= 2, "{total} over {names:?}: {cycles} cycles");
        }
    }

    #[test]
    fn crash_leaves_free_leases_that_survivors_share() {
        let (cycles, moves, counts) = simulate(leases(&[("a", 8), ("b", 8)], 8), &["a", "b"]);
        assert_eq!(moves, 0, "free leases are taken, nothing is stolen");
        assert_eq!(counts.get("a"), Some(&12));
        assert_eq!(counts.get("b"), Some(&12));
        assert!(cycles <= 1);
    }
}
