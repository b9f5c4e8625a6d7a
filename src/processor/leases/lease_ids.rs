//! The grammar of a processor's document ids in the lease container. Under a lease prefix a
//! document is exactly one of: a lease `{prefix}..{token}`, a marker `{prefix}.{info|lock|claim}`
//! or a heartbeat `{prefix}.instance.{name}`; anything else that merely starts with the prefix
//! (another processor's document whose name extends this one) is foreign: never taken, deleted or
//! counted. Processor and instance names cannot contain `..`, so one id parses one way only.

/// The longest processor or instance name.
pub const MAX_NAME: usize = 128;

/// The markers a processor keeps beside its leases.
pub const MARKERS: [&str; 3] = ["info", "lock", "claim"];

/// Why a name cannot prefix lease ids.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} must be 1 to 128 ASCII letters, digits, '-' and '_', with single dots between them (no '..', no leading or trailing '.'), so that its lease ids cannot reach into another processor's"
)]
pub struct BadName(pub String);

/// Checks a processor or instance name against the grammar.
pub fn check_name(name: &str) -> Result<(), BadName> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let fits = (1..=MAX_NAME).contains(&name.len())
        && name.chars().all(allowed)
        && !name.contains("..")
        && !name.starts_with('.')
        && !name.ends_with('.');
    if fits { Ok(()) } else { Err(BadName(name.to_owned())) }
}

/// Whether `token` is a lease token: an effective-partition-key range `{min}-{max}` in hex (the
/// .NET v3 layout) or a partition key range id (version-0 leases).
pub fn is_lease_token(token: &str) -> bool {
    let hex = |part: &str| part.chars().all(|c| c.is_ascii_hexdigit());
    match token.split_once('-') {
        Some((min, max)) => hex(min) && hex(max),
        None => !token.is_empty() && token.chars().all(|c| c.is_ascii_digit()),
    }
}

/// What a document id that starts with `{prefix}.` is to the processor with that prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind<'a> {
    /// A lease, with its token.
    Lease(&'a str),
    /// A marker (`info`, `lock`, `claim`).
    Marker(&'a str),
    /// An instance's heartbeat, with the instance's name.
    Heartbeat(&'a str),
    /// Not this processor's: another's whose prefix extends this one, or a malformed id.
    Foreign,
}

/// Classifies `id` for the processor with `prefix`.
pub fn classify<'a>(prefix: &str, id: &'a str) -> IdKind<'a> {
    let Some(rest) = id.strip_prefix(prefix).and_then(|r| r.strip_prefix('.')) else {
        return IdKind::Foreign;
    };
    if let Some(token) = rest.strip_prefix('.') {
        return if is_lease_token(token) {
            IdKind::Lease(token)
        } else {
            IdKind::Foreign
        };
    }
    if let Some(name) = rest.strip_prefix("instance.") {
        return if check_name(name).is_ok() {
            IdKind::Heartbeat(name)
        } else {
            IdKind::Foreign
        };
    }
    match MARKERS.iter().find(|m| **m == rest) {
        Some(marker) => IdKind::Marker(marker),
        None => IdKind::Foreign,
    }
}

/// Whether two lease prefixes nest (one extends the other), so that one's listing would see the
/// other's documents.
pub fn prefixes_nest(a: &str, b: &str) -> bool {
    a != b && (a.starts_with(b) || b.starts_with(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cannot_reach_into_another_processor_s_ids() {
        let cases = [
            ("orders", true),
            ("orders.v2", true),
            ("Orders_v2-eu", true),
            ("orders-7d9f5-b1", true),
            ("", false),
            ("orders..x", false),
            ("orders.", false),
            (".orders", false),
            ("orders/x", false),
            ("orders#1", false),
            ("KmhJAA==", false),
            ("ordérs", false),
            ("with space", false),
        ];
        for (name, ok) in cases {
            assert_eq!(check_name(name).is_ok(), ok, "{name:?}");
        }
        assert!(check_name(&"a".repeat(MAX_NAME)).is_ok());
        assert!(check_name(&"a".repeat(MAX_NAME + 1)).is_err());
    }

    #[test]
    fn an_id_is_this_processor_s_only_when_it_is_exactly_one_of_its_shapes() {
        let prefix = "ordersacct.documents.azure.com_KmhJAA==_KmhJAOkGgKQ=";
        let id = |rest: &str| format!("{prefix}{rest}");
        let nested = format!("{prefix}..x{}..00-3F", &prefix["orders".len()..]);
        let cases = [
            (id("..00-3F"), IdKind::Lease("00-3F")),
            (id("..-FF"), IdKind::Lease("-FF")),
            (id("..12"), IdKind::Lease("12")),
            (id(".info"), IdKind::Marker("info")),
            (id(".claim"), IdKind::Marker("claim")),
            (id(".instance.orders-7d9f5-b1"), IdKind::Heartbeat("orders-7d9f5-b1")),
            (nested, IdKind::Foreign),
            (id("..x..00-3F"), IdKind::Foreign),
            (id(".instance.a..b"), IdKind::Foreign),
            (id(".other"), IdKind::Foreign),
            (id("x..00-3F"), IdKind::Foreign),
            (format!("other{prefix}..00-3F"), IdKind::Foreign),
        ];
        for (id, want) in &cases {
            assert_eq!(classify(prefix, id), *want, "{id}");
        }
    }

    #[test]
    fn prefixes_nest_when_one_extends_the_other() {
        assert!(prefixes_nest("a_b_c", "a_b_c..x_b_c"));
        assert!(prefixes_nest("a_b_c..x_b_c", "a_b_c"));
        assert!(!prefixes_nest("a_b_c", "a_b_c"));
        assert!(!prefixes_nest("orders_b_c", "orders2_b_c"));
    }
}
