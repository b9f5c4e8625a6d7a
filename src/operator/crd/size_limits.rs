//! Size limits on every string, list and map of the spec that does not set its own: a resource
//! is read into the operator's memory on every watch event, so whoever may write one must not
//! be able to make it arbitrarily large. Mostly the embedded Kubernetes types (containers,
//! volumes, affinity, ...), whose generated schemas carry no limits.

use serde_json::{Map, Value};

/// The longest string a field without its own limit may hold.
pub const MAX_STRING: u64 = 4096;
/// The longest string of the fields that hold scripts and values (`command`, `args`, an
/// environment variable's `value`).
pub const MAX_LONG_STRING: u64 = 32 * 1024;
/// The most items of a list, or entries of a map, without its own limit.
pub const MAX_ITEMS: u64 = 64;

/// The fields whose strings get [`MAX_LONG_STRING`].
const LONG_STRING_FIELDS: [&str; 3] = ["command", "args", "value"];

/// Adds `maxLength`, `maxItems` and `maxProperties` wherever `schema` (a structural schema) and
/// everything below it lacks them.
pub fn bound_sizes(schema: &mut Value) {
    bound(schema, MAX_STRING);
}

fn bound(schema: &mut Value, max_string: u64) {
    let Some(node) = schema.as_object_mut() else {
        return;
    };
    let is_string = node.get("type").and_then(Value::as_str) == Some("string")
        || node.get("x-kubernetes-int-or-string").and_then(Value::as_bool) == Some(true);
    if is_string && !node.contains_key("enum") {
        node.entry("maxLength").or_insert(max_string.into());
    }
    if node.get("type").and_then(Value::as_str) == Some("array") {
        node.entry("maxItems").or_insert(MAX_ITEMS.into());
    }
    if node.get("additionalProperties").is_some_and(Value::is_object) {
        node.entry("maxProperties").or_insert(MAX_ITEMS.into());
    }
    bound_children(node, max_string);
}

fn bound_children(node: &mut Map<String, Value>, max_string: u64) {
    if let Some(properties) = node.get_mut("properties").and_then(Value::as_object_mut) {
        for (name, property) in properties.iter_mut() {
            let max = if LONG_STRING_FIELDS.contains(&name.as_str()) {
                MAX_LONG_STRING
            } else {
                MAX_STRING
            };
            bound(property, max);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(child) = node.get_mut(key) {
            bound(child, max_string);
        }
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(children) = node.get_mut(key).and_then(Value::as_array_mut) {
            children.iter_mut().for_each(|child| bound(child, max_string));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unbounded(schema: &Value, path: &str, found: &mut Vec<String>) {
        let Some(node) = schema.as_object() else {
            return;
        };
        let kind = node.get("type").and_then(Value::as_str);
        let int_or_string = node.get("x-kubernetes-int-or-string").is_some();
        if (kind == Some("string") || int_or_string) && !node.contains_key("maxLength") && !node.contains_key("enum") {
            found.push(path.to_owned());
        }
        if kind == Some("array") && !node.contains_key("maxItems") {
            found.push(path.to_owned());
        }
        if node.get("additionalProperties").is_some_and(Value::is_object) && !node.contains_key("maxProperties") {
            found.push(path.to_owned());
        }
        for (name, child) in node.get("properties").and_then(Value::as_object).into_iter().flatten() {
            unbounded(child, &format!("{path}.{name}"), found);
        }
        for key in ["items", "additionalProperties"] {
            if let Some(child) = node.get(key) {
                unbounded(child, &format!("{path}[]"), found);
            }
        }
    }

    #[test]
    fn every_string_list_and_map_of_the_spec_has_a_size_limit() {
        let crd = crate::operator::crd::crd_json();
        let versions = crd
            .pointer("/spec/versions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        assert!(!versions.is_empty());
        for version in versions {
            let spec = version
                .pointer("/schema/openAPIV3Schema/properties/spec")
                .cloned()
                .unwrap_or_default();
            let mut found = Vec::new();
            unbounded(&spec, "spec", &mut found);
            assert!(found.is_empty(), "without a size limit: {found:?}");
        }
    }

    #[test]
    fn own_limits_are_kept_and_scripts_get_the_long_limit() {
        let mut schema = serde_json::json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 63},
                "args": {"type": "array", "items": {"type": "string"}},
                "mode": {"type": "string", "enum": ["a", "b"]},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "port": {"x-kubernetes-int-or-string": true},
            }
        });
        bound_sizes(&mut schema);
        let at = |pointer: &str| schema.pointer(pointer).cloned();
        assert_eq!(at("/properties/name/maxLength"), Some(63.into()));
        assert_eq!(at("/properties/args/maxItems"), Some(MAX_ITEMS.into()));
        assert_eq!(at("/properties/args/items/maxLength"), Some(MAX_LONG_STRING.into()));
        assert_eq!(at("/properties/mode/maxLength"), None);
        assert_eq!(at("/properties/labels/maxProperties"), Some(MAX_ITEMS.into()));
        assert_eq!(
            at("/properties/labels/additionalProperties/maxLength"),
            Some(MAX_STRING.into())
        );
        assert_eq!(at("/properties/port/maxLength"), Some(MAX_STRING.into()));
    }
}
