//! The `ChangeFeedProcessor` field reference in Markdown (`cfp crd --markdown`, committed as
//! `docs/reference/changefeedprocessor.md`), generated from the CRD's OpenAPI v3 schema — the same
//! object `cfp crd` prints — so it says exactly what `kubectl explain` and the API server say:
//! per object a section with a table of its fields (type, default, validation, description).
//! Embedded Kubernetes types (their nested descriptions are left out of the CRD) are listed as
//! one field, not expanded.

use std::fmt::Write as _;

use serde_json::{Map, Value};

/// The reference of the CRD that `cfp crd` prints.
pub fn crd_markdown() -> String {
    reference_markdown(&super::crd_json())
}

/// The Markdown reference of a CustomResourceDefinition given as JSON: its names, subresources
/// and printer columns, then per version every object of its schema with a table of its fields.
pub fn reference_markdown(crd: &Value) -> String {
    let kind = text(crd, "/spec/names/kind");
    let mut out = format!("# {kind} reference\n\n");
    out.push_str(
        "Generated from the CustomResourceDefinition by `cfp crd --markdown` (a test fails when this page \
         differs); do not edit it: change the field doc comments in `src/operator/crd/` and run \
         `cargo run -- crd --markdown > docs/reference/changefeedprocessor.md`.\n\n",
    );
    for version in items(crd, "/spec/versions") {
        names(&mut out, crd, version);
        printer_columns(&mut out, version);
        if let Some(schema) = version.pointer("/schema/openAPIV3Schema") {
            for name in ["spec", "status"] {
                if let Some(node) = schema.pointer(&format!("/properties/{name}")) {
                    sections(&mut out, name, node, 2);
                }
            }
        }
    }
    out
}

/// The resource's names, scope and subresources, and the kind's description.
fn names(out: &mut String, crd: &Value, version: &Value) {
    let quoted = |pointer: &str| {
        let list: Vec<String> = items(crd, pointer)
            .iter()
            .filter_map(|v| v.as_str())
            .map(code)
            .collect();
        list.join(", ")
    };
    let _ = writeln!(
        out,
        "`apiVersion: {}/{}`, `kind: {}` — plural {}, short names {}, categories {}, scope {}.",
        text(crd, "/spec/group"),
        text(version, "/name"),
        text(crd, "/spec/names/kind"),
        code(text(crd, "/spec/names/plural")),
        quoted("/spec/names/shortNames"),
        quoted("/spec/names/categories"),
        text(crd, "/spec/scope"),
    );
    if version.pointer("/subresources/status").is_some() {
        out.push_str("\nSubresources: `status`");
        if let Some(scale) = version.pointer("/subresources/scale") {
            let _ = write!(
                out,
                ", `scale` (replicas `{}`, status `{}`, selector `{}`)",
                text(scale, "/specReplicasPath"),
                text(scale, "/statusReplicasPath"),
                text(scale, "/labelSelectorPath"),
            );
        }
        out.push_str(".\n");
    }
    let description = text(version, "/schema/openAPIV3Schema/description");
    if !description.is_empty() {
        let _ = writeln!(out, "\n{}", one_line(description));
    }
    out.push('\n');
}

/// The columns `kubectl get` prints.
fn printer_columns(out: &mut String, version: &Value) {
    let columns = items(version, "/additionalPrinterColumns");
    if columns.is_empty() {
        return;
    }
    out.push_str("`kubectl get` columns:\n\n| column | type | JSON path | description |\n|---|---|---|---|\n");
    for column in columns {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            text(column, "/name"),
            text(column, "/type"),
            code(text(column, "/jsonPath")),
            cell(text(column, "/description")),
        );
    }
    out.push('\n');
}

/// The section of the object at `path` (a table of its fields), then those of its expanded
/// fields, depth first.
fn sections(out: &mut String, path: &str, node: &Value, level: usize) {
    let Some(fields) = expanded_fields(node) else {
        return;
    };
    let _ = writeln!(out, "{} `{path}`\n", "#".repeat(level.min(3)));
    let own = node.get("description").and_then(Value::as_str).unwrap_or_default();
    if !own.is_empty() {
        let _ = writeln!(out, "{}\n", one_line(own));
    }
    let object = object_of(node);
    let rules = validations(object);
    if !rules.is_empty() {
        out.push_str("Rules the API server checks:\n\n");
        rules.iter().for_each(|rule| {
            let _ = writeln!(out, "- {rule}");
        });
        out.push('\n');
    }
    out.push_str("| field | type | default | validation | description |\n|---|---|---|---|---|\n");
    let required = required_names(object);
    for (name, field) in fields {
        let child = child_path(path, name, field);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            code(name),
            field_type(&child, field),
            field.get("default").map(|d| code(&d.to_string())).unwrap_or_default(),
            cell(&field_validation(field, required.contains(&name.as_str())).join("; ")),
            cell(field.get("description").and_then(Value::as_str).unwrap_or_default()),
        );
    }
    out.push('\n');
    for (name, field) in fields {
        sections(out, &child_path(path, name, field), field, level + 1);
    }
}

/// The fields of an object, or of an array's items, when the reference expands them: when at
/// least one has a description (embedded Kubernetes types have none in the CRD).
fn expanded_fields(node: &Value) -> Option<&Map<String, Value>> {
    let fields = object_of(node).get("properties")?.as_object()?;
    fields
        .values()
        .any(|f| f.get("description").is_some())
        .then_some(fields)
}

/// The node itself, or for an array its items.
fn object_of(node: &Value) -> &Value {
    match node.get("type").and_then(Value::as_str) {
        Some("array") => node.get("items").unwrap_or(node),
        _ => node,
    }
}

/// A field's path: `parent.name`, with `[]` for the items of an array.
fn child_path(parent: &str, name: &str, field: &Value) -> String {
    let items = if field.get("type").and_then(Value::as_str) == Some("array") {
        "[]"
    } else {
        ""
    };
    format!("{parent}.{name}{items}")
}

/// The type column: the schema type, linked to its section when the reference expands it.
fn field_type(path: &str, field: &Value) -> String {
    let name = type_name(field);
    if expanded_fields(field).is_some() {
        format!("[{name}](#{})", anchor(path))
    } else {
        name
    }
}

/// A schema's type in words: `string (date-time)`, `array of string`, `map of string`, ...
fn type_name(node: &Value) -> String {
    if node.get("x-kubernetes-int-or-string").and_then(Value::as_bool) == Some(true) {
        return "integer or string".to_string();
    }
    match node.get("type").and_then(Value::as_str) {
        Some("array") => format!(
            "array of {}",
            node.get("items").map(type_name).unwrap_or_else(|| "any".into())
        ),
        Some("object") => match node.get("additionalProperties") {
            Some(values) if values.is_object() => format!("map of {}", type_name(values)),
            _ => "object".to_string(),
        },
        Some(kind) => match node.get("format").and_then(Value::as_str) {
            Some(format) => format!("{kind} ({format})"),
            None => kind.to_string(),
        },
        None => "any".to_string(),
    }
}

/// The validation column: required, allowed values, bounds, lengths, patterns and the messages
/// of the CEL rules.
fn field_validation(field: &Value, required: bool) -> Vec<String> {
    let mut parts = Vec::new();
    if required {
        parts.push("required".to_string());
    }
    let node = object_of(field);
    if let Some(values) = node.get("enum").and_then(Value::as_array) {
        let values: Vec<String> = values.iter().map(|v| code(v.as_str().unwrap_or_default())).collect();
        parts.push(format!("one of {}", values.join(", ")));
    }
    match (number(node, "minimum"), number(node, "maximum")) {
        (Some(min), Some(max)) => parts.push(format!("{min}–{max}")),
        (Some(min), None) => parts.push(format!("≥ {min}")),
        (None, Some(max)) => parts.push(format!("≤ {max}")),
        (None, None) => {}
    }
    // An array's string bounds are its items' bounds.
    let each = if std::ptr::eq(node, field) { "" } else { "each item's " };
    if let Some(min) = number(node, "minLength") {
        parts.push(format!("{each}length ≥ {min}"));
    }
    if let Some(max) = number(node, "maxLength") {
        parts.push(format!("{each}length ≤ {max}"));
    }
    if let Some(max) = number(field, "maxItems") {
        parts.push(format!("at most {max} items"));
    }
    if let Some(pattern) = node.get("pattern").and_then(Value::as_str) {
        parts.push(format!("matches {}", code(pattern)));
    }
    if expanded_fields(field).is_none() {
        parts.extend(validations(node));
    }
    parts
}

/// The CEL rules of a schema node: each rule's message, or the rule itself without one.
fn validations(node: &Value) -> Vec<String> {
    let rules = node.get("x-kubernetes-validations").and_then(Value::as_array);
    rules
        .into_iter()
        .flatten()
        .map(|rule| match rule.get("message").and_then(Value::as_str) {
            Some(message) => one_line(message),
            None => format!(
                "CEL {}",
                code(rule.get("rule").and_then(Value::as_str).unwrap_or_default())
            ),
        })
        .collect()
}

/// The names an object requires.
fn required_names(node: &Value) -> Vec<&str> {
    let names = node.get("required").and_then(Value::as_array);
    names.into_iter().flatten().filter_map(Value::as_str).collect()
}

/// A bound as written in the schema, whole numbers without a fraction (`1`, not `1.0`).
fn number(node: &Value, key: &str) -> Option<String> {
    let value = node.get(key)?.as_f64()?;
    Some(if value.fract() == 0.0 {
        format!("{}", value as i64)
    } else {
        value.to_string()
    })
}

/// The id mdBook gives a heading: lower case, letters, digits, `-` and `_` kept, spaces as `-`,
/// everything else dropped.
fn anchor(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            c if c.is_whitespace() => Some('-'),
            _ => None,
        })
        .collect()
}

/// Text in a code span (backticks inside are avoided by a longer fence).
fn code(text: &str) -> String {
    if text.contains('`') {
        format!("`` {text} ``")
    } else {
        format!("`{text}`")
    }
}

/// Text for a table cell: one line, `|` escaped.
fn cell(text: &str) -> String {
    one_line(text).replace('|', "\\|")
}

/// A description's lines joined into one paragraph.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The string at a JSON pointer, or empty.
fn text<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
}

/// The array at a JSON pointer, or none.
fn items<'a>(value: &'a Value, pointer: &str) -> &'a [Value] {
    value
        .pointer(pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn crd() -> Value {
        json!({
            "spec": {
                "group": "example.io", "scope": "Namespaced",
                "names": {"kind": "Widget", "plural": "widgets", "shortNames": ["wd"], "categories": ["all"]},
                "versions": [{
                    "name": "v1",
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [{"name": "Size", "type": "integer", "jsonPath": ".spec.size", "description": "a | b"}],
                    "schema": {"openAPIV3Schema": {"description": "A widget.", "properties": {
                        "spec": {"type": "object", "description": "What it is.", "required": ["size"],
                            "x-kubernetes-validations": [{"rule": "self.size > 0 || true", "message": "size must\nbe positive"}],
                            "properties": {
                                "size": {"type": "integer", "format": "int32", "minimum": 1.0, "maximum": 64.0, "default": 1,
                                         "description": "How big.\nIn units."},
                                "mode": {"type": "string", "enum": ["Fast", "Slow"], "description": "How."},
                                "every": {"type": "string", "maxLength": 32, "description": "A duration.",
                                          "x-kubernetes-validations": [{"rule": "self.matches('^[0-9]+s$')", "message": "must be a duration"}]},
                                "labels": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Labels."},
                                "sidecars": {"type": "array", "description": "Containers.", "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
                                "headers": {"type": "array", "maxItems": 8, "description": "Headers.", "items": {"type": "object", "required": ["name"],
                                    "properties": {"name": {"type": "string", "minLength": 1, "description": "The name."}}}}
                            }}
                    }}}
                }]
            }
        })
    }

    #[test]
    fn the_reference_lists_every_field_with_its_type_default_validation_and_description() {
        let page = reference_markdown(&crd());
        let expected_lines = [
            "# Widget reference",
            "`apiVersion: example.io/v1`, `kind: Widget` — plural `widgets`, short names `wd`, categories `all`, scope Namespaced.",
            "Subresources: `status`.",
            "A widget.",
            "| Size | integer | `.spec.size` | a \\| b |",
            "## `spec`",
            "What it is.",
            "- size must be positive",
            "| `size` | integer (int32) | `1` | required; 1–64 | How big. In units. |",
            "| `mode` | string |  | one of `Fast`, `Slow` | How. |",
            "| `every` | string |  | length ≤ 32; must be a duration | A duration. |",
            "| `labels` | map of string |  |  | Labels. |",
            "| `sidecars` | array of object |  |  | Containers. |",
            "| `headers` | [array of object](#specheaders) |  | at most 8 items | Headers. |",
            "### `spec.headers[]`",
            "| `name` | string |  | required; length ≥ 1 | The name. |",
        ];
        for line in expected_lines {
            assert!(page.lines().any(|l| l == line), "missing line {line:?} in\n{page}");
        }
        assert!(
            !page.contains("spec.sidecars[]`"),
            "an embedded type is not expanded:\n{page}"
        );
    }

    #[test]
    fn anchors_follow_mdbook_s_heading_ids() {
        assert_eq!(anchor("spec.handler.http.headers[]"), "spechandlerhttpheaders");
        assert_eq!(anchor("Operating a processor"), "operating-a-processor");
        assert_eq!(anchor("`cfp worker` flags"), "cfp-worker-flags");
    }

    #[test]
    fn the_real_crd_s_reference_names_every_spec_field() {
        let page = crd_markdown();
        for field in [
            "`replicas`",
            "`autoscaling`",
            "`maxInFlightBatches`",
            "`stallTimeout`",
            "`observedGeneration`",
        ] {
            assert!(page.contains(&format!("| {field} |")), "{field} missing");
        }
        assert!(page.contains("### `spec.leases.connection`"));
    }
}
