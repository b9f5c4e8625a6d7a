//! What an owner keeps up with, as it reports it for autoscaling on freshness: with every write
//! of a lease (its checkpoints, renewals, release) the owner writes into its `properties` the
//! documents a second it handled of the lease (`handledPerSecond`: an exponentially decayed count
//! over the decayed time since the owner took the lease, [`DecayedRate::counted_from`] — it
//! measures the owner, not the lease, and does not ramp up from nothing) and, once known, what a
//! document costs to read from the change feed (`readUnitsPerDocument`: the owner's running
//! figure over all its leases' pages). The operator sums the handled rates (each faded by how
//! long the lease was not written, [`handled_as_of`]) into what the fleet handles a second, and
//! divides a read budget by the cost of a document into what the budget can feed
//! ([`crate::processor::report::estimator`]). What one worker handles while it has work goes
//! beside them ([`crate::processor::leases::worker_capacity`]).

use std::time::Duration;

use crate::processor::leases::lease::Lease;
use crate::processor::leases::work_report::{DecayedRate, decay};

/// Lease property: the documents a second the owner handled of the lease, decayed.
pub const HANDLED_RATE_PROPERTY: &str = "handledPerSecond";

/// Lease property: request units a change feed page cost per document, as the owner read them.
pub const READ_UNITS_PROPERTY: &str = "readUnitsPerDocument";

/// The highest figure read from a lease: a value edited by hand beyond it is no report.
const MAX_FIGURE: f64 = 1e9;

/// How fast a handled rate fades once its lease is no longer written (an idle lease, a dead
/// owner): the reference processors' default acquire interval, twice, as the work report's.
pub const FADE_TIME_CONSTANT: Duration = Duration::from_secs(26);

/// What an owner measured of a lease, to be written with it.
#[derive(Debug, Clone, Copy, Default)]
pub struct CapacityReport {
    /// The documents a second handled of the lease, as of the write.
    pub handled_per_second: Option<f64>,
    /// Request units a document cost to read, when known.
    pub read_units_per_document: Option<f64>,
}

impl CapacityReport {
    /// The report of `handled` (this owner's count of the lease's handled documents, `None`
    /// before any) at `now`, and of `read_units` a document.
    pub fn of(handled: Option<&DecayedRate>, now: std::time::Instant, read_units: Option<f64>) -> Self {
        Self {
            handled_per_second: handled.map(|rate| rate.per_second(now)),
            read_units_per_document: read_units,
        }
    }

    /// Writes the report into `lease` (two decimals for a rate, three for a cost: the documents
    /// stay small and stable).
    pub fn record(&self, lease: &mut Lease) {
        let sane = |value: f64| {
            if value.is_finite() {
                value.clamp(0.0, MAX_FIGURE)
            } else {
                0.0
            }
        };
        if let Some(rate) = self.handled_per_second {
            lease
                .properties
                .insert(HANDLED_RATE_PROPERTY.into(), format!("{:.2}", sane(rate)));
        }
        if let Some(units) = self.read_units_per_document.filter(|u| u.is_finite() && *u > 0.0) {
            lease
                .properties
                .insert(READ_UNITS_PROPERTY.into(), format!("{:.3}", sane(units)));
        }
    }
}

/// A figure the lease's owner reported under `property`; `None` without one (or an unreadable
/// one).
fn reported(lease: &Lease, property: &str) -> Option<f64> {
    let value: f64 = lease.properties.get(property)?.parse().ok()?;
    (value.is_finite() && (0.0..=MAX_FIGURE).contains(&value)).then_some(value)
}

/// The documents a second the owner of `lease` handled of it when it last wrote it, faded by how
/// long it was not written before `now_ts` (seconds, the clock of whoever reads: a lease not
/// written is not handled); 0 without a report.
pub fn handled_as_of(lease: &Lease, now_ts: i64) -> f64 {
    let Some(rate) = reported(lease, HANDLED_RATE_PROPERTY) else {
        return 0.0;
    };
    let silent = lease
        .server_ts
        .map_or(0, |written| u64::try_from(now_ts - written).unwrap_or(0));
    rate * decay(Duration::from_secs(silent), FADE_TIME_CONSTANT)
}

/// Request units a document cost the owner of `lease` to read, when it reported it.
pub fn read_units_per_document(lease: &Lease) -> Option<f64> {
    reported(lease, READ_UNITS_PROPERTY).filter(|units| *units > 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cosmos::EpkRange;

    #[test]
    fn a_report_reads_back_and_fades_with_the_leases_silence() {
        let mut lease = Lease::new("p", &EpkRange::full(), None);
        assert_eq!(handled_as_of(&lease, 100), 0.0);
        assert_eq!(read_units_per_document(&lease), None);
        CapacityReport {
            handled_per_second: Some(250.456),
            read_units_per_document: Some(2.2749),
        }
        .record(&mut lease);
        assert_eq!(lease.properties[HANDLED_RATE_PROPERTY], "250.46");
        assert_eq!(lease.properties[READ_UNITS_PROPERTY], "2.275");
        lease.server_ts = Some(100);
        assert_eq!(handled_as_of(&lease, 100), 250.46);
        assert_eq!(handled_as_of(&lease, 90), 250.46, "a reader's clock behind: no fading");
        let faded = handled_as_of(&lease, 126);
        assert!((faded - 250.46 / std::f64::consts::E).abs() < 0.01, "{faded}");
        assert_eq!(read_units_per_document(&lease), Some(2.275));
    }

    #[test]
    fn nothing_known_writes_nothing_and_a_bad_value_is_no_report() {
        let mut lease = Lease::new("p", &EpkRange::full(), None);
        CapacityReport::default().record(&mut lease);
        assert!(lease.properties.is_empty());
        CapacityReport {
            handled_per_second: Some(f64::NAN),
            read_units_per_document: Some(0.0),
        }
        .record(&mut lease);
        assert_eq!(lease.properties[HANDLED_RATE_PROPERTY], "0.00");
        assert!(!lease.properties.contains_key(READ_UNITS_PROPERTY));
        for bad in ["-1", "NaN", "inf", "x", "1e308"] {
            lease.properties.insert(HANDLED_RATE_PROPERTY.into(), bad.into());
            lease.server_ts = Some(1);
            assert_eq!(handled_as_of(&lease, 1), 0.0, "{bad}");
        }
    }
}
