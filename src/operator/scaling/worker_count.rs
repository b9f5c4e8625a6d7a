//! How many workers a rate needs: whole workers for documents a second, held within the
//! tolerance, and counted in the leases they share. Pure.

use crate::operator::scaling::arrivals::TOLERANCE;

/// Workers handling `per_replica` documents a second each that handle `needed` a second.
pub fn replicas_for(needed: f64, per_replica: f64) -> i32 {
    let replicas = (needed / per_replica).ceil();
    if replicas.is_finite() && replicas > 0.0 {
        replicas.min(f64::from(i32::MAX)) as i32
    } else {
        0
    }
}

/// `wanted`, or `current` where the running workers handle what is `needed` within
/// [`TOLERANCE`].
pub fn keep_within_tolerance(wanted: i32, needed: f64, per_replica: f64, current: Option<i32>) -> i32 {
    let Some(current) = current.filter(|c| *c > 0) else {
        return wanted;
    };
    let ratio = needed / (f64::from(current) * per_replica);
    if (1.0 - TOLERANCE..=1.0 + TOLERANCE).contains(&ratio) && wanted != 0 {
        current
    } else {
        wanted
    }
}

/// The fewest workers that give the busiest of them no more than a tenth above the even share
/// that `wanted` workers are figured on: the leases are shared by count, so of `leases` over `n`
/// workers the busiest holds `ceil(leases / n)`, and the oldest pending change waits on it. Of
/// 32 leases, 15 workers leave two with 3 (41 % above 1/15): 16 are needed; 11 leave ten with 3
/// (3 % above 1/11): 11 do. `wanted` where the leases are not known.
pub fn workers_for_an_even_share(wanted: i32, leases: usize) -> i32 {
    if wanted <= 0 || leases == 0 {
        return wanted;
    }
    let leases = leases as f64;
    // The most leases the busiest may hold; none: one lease each is the best there is.
    let most = (leases * (1.0 + TOLERANCE) / f64::from(wanted)).floor().max(1.0);
    let workers = (leases / most).ceil();
    if workers.is_finite() && workers <= f64::from(i32::MAX) {
        workers as i32
    } else {
        wanted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_are_counted_in_the_leases_the_busiest_of_them_holds() {
        for (wanted, leases, workers, why) in [
            (15, 32, 16, "15 leave two with 3 leases, 41 % above an even share"),
            (12, 32, 16, "12 as well"),
            (16, 32, 16, "2 leases each"),
            (17, 32, 16, "17 leave one with 2, 6 % above: as 16 do"),
            (11, 32, 11, "11 leave ten with 3, 3 % above"),
            (9, 32, 11, "9 leave one with 4, 12 % above"),
            (8, 32, 8, "4 leases each"),
            (6, 32, 7, "6 leave one with 6, 12 % above"),
            (40, 32, 32, "one lease each at most: more workers hold none"),
            (3, 4, 4, "3 leave one with 2 of 4, half above"),
            (1, 32, 1, "one worker"),
            (0, 32, 0, "none"),
            (5, 0, 5, "leases unknown"),
        ] {
            assert_eq!(workers_for_an_even_share(wanted, leases), workers, "{why}");
        }
    }
}
