//! The code's shape, checked on every run: layers point down only (cli → operator → processor →
//! cosmos), no import circle among the processor's modules, and no production file over 600
//! lines or function over 80 lines in `src/` without a note in the code saying why (a comment
//! containing `longer than the limit because`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 600;
const MAX_FUNCTION_LINES: usize = 80;
const NOTE: &str = "longer than the limit because";

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, with its text.
fn sources(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
                out.push((path, text));
            }
        }
    }
    out.sort();
    out
}

/// The production part of a file: everything before its `#[cfg(test)]` module (files that
/// are only tests, `*_tests.rs`, have none).
fn production(path: &Path, text: &str) -> Vec<String> {
    if path.to_string_lossy().ends_with("_tests.rs") {
        return Vec::new();
    }
    text.lines()
        .take_while(|line| !line.starts_with("#[cfg(test)]"))
        .map(str::to_owned)
        .collect()
}

/// The name of the function a line starts, if it starts one.
fn function_name(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    for prefix in ["pub(crate) ", "pub(super) ", "pub ", "const ", "async ", "unsafe "] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let rest = rest.strip_prefix("fn ")?;
    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some(&rest[..end])
}

/// (name, first line index, length) of every function with a body in `lines`.
fn functions(lines: &[String]) -> Vec<(String, usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(name) = function_name(&lines[i]) else {
            i += 1;
            continue;
        };
        let (mut depth, mut opened, mut j) = (0i32, false, i);
        while j < lines.len() {
            for c in lines[j].chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if (opened && depth <= 0) || (!opened && lines[j].trim_end().ends_with(';')) {
                break;
            }
            j += 1;
        }
        if opened {
            out.push((name.to_owned(), i, j - i + 1));
            i = j + 1;
        } else {
            i += 1;
        }
    }
    out
}

/// Whether a note saying why sits in the comments just above line `at`.
fn noted_above(lines: &[String], at: usize) -> bool {
    lines[..at]
        .iter()
        .rev()
        .take_while(|l| {
            let l = l.trim_start();
            l.starts_with("//") || l.starts_with("#[")
        })
        .any(|l| l.contains(NOTE))
}

#[test]
fn no_production_file_or_function_is_longer_than_the_limits_without_a_note() {
    let mut too_long = Vec::new();
    for (path, text) in sources(&src()) {
        let lines = production(&path, &text);
        let shown = path.strip_prefix(src()).unwrap_or(&path).display().to_string();
        if lines.len() > MAX_FILE_LINES && !text.contains(NOTE) {
            too_long.push(format!("{shown}: {} lines", lines.len()));
        }
        for (name, at, length) in functions(&lines) {
            if length > MAX_FUNCTION_LINES && !noted_above(&lines, at) {
                too_long.push(format!("{shown}: fn {name}: {length} lines"));
            }
        }
    }
    assert!(
        too_long.is_empty(),
        "over {MAX_FILE_LINES} lines a file or {MAX_FUNCTION_LINES} a function, without a comment saying `{NOTE} …`:\n{}",
        too_long.join("\n")
    );
}

/// The modules of `crate::<layer>` a file refers to (`use super::x`, `super::x::`, and
/// `crate::<layer>::x`), for a file of that layer.
fn sibling_references(text: &str, layer: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let crate_path = format!("crate::{layer}::");
    for line in text.lines().take_while(|l| !l.starts_with("#[cfg(test)]")) {
        let line = line.trim_start();
        if line.starts_with("//") {
            continue;
        }
        for marker in ["super::", crate_path.as_str()] {
            for (at, _) in line.match_indices(marker) {
                // `super::super::` and the like leave the layer's directory: not a sibling.
                let rest = &line[at + marker.len()..];
                // `use super::{a::X, b};` names each module of the group.
                let heads: Vec<&str> = match rest.strip_prefix('{') {
                    Some(group) => group.split('}').next().unwrap_or("").split(',').collect(),
                    None => vec![rest],
                };
                for head in heads {
                    let name: String = head
                        .trim_start()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() && name != "super" && name != "self" {
                        out.insert(name);
                    }
                }
            }
        }
    }
    out
}

/// The import graph among the modules directly in `src/<layer>/`.
fn module_graph(layer: &str) -> BTreeMap<String, BTreeSet<String>> {
    let dir = src().join(layer);
    let files = sources(&dir);
    let names: BTreeSet<String> = files
        .iter()
        .filter(|(p, _)| p.parent() == Some(dir.as_path()))
        .filter_map(|(p, _)| Some(p.file_stem()?.to_string_lossy().into_owned()))
        .filter(|n| n != "mod" && !n.ends_with("_tests"))
        .collect();
    let mut graph = BTreeMap::new();
    for (path, text) in &files {
        let Some(stem) = path.file_stem().map(|s| s.to_string_lossy().into_owned()) else {
            continue;
        };
        if path.parent() != Some(dir.as_path()) || !names.contains(&stem) {
            continue;
        }
        let uses: BTreeSet<String> = sibling_references(text, layer)
            .into_iter()
            .filter(|n| names.contains(n) && *n != stem)
            .collect();
        graph.insert(stem, uses);
    }
    graph
}

/// A cycle in `graph`, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_processor_s_modules_import_each_other_without_a_circle() {
    let graph = module_graph("processor");
    assert!(graph.len() > 20, "the processor's modules were not found: {graph:?}");
    assert!(
        graph["coordinator"].contains("cycle_plan"),
        "references are found: {graph:?}"
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!("an import circle in src/processor: {}", cycle.join(" → "));
    }
}

#[test]
fn a_circle_is_found_where_there_is_one() {
    let graph: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]
        .into_iter()
        .map(|(from, to)| (from.to_owned(), BTreeSet::from([to.to_owned()])))
        .collect();
    let cycle = find_cycle(&graph).expect("a → b → c → a");
    assert_eq!(cycle.first(), cycle.last());
    assert_eq!(cycle.len(), 4);
    let refs = sibling_references(
        "use super::lease::{Lease, LeaseStore};\nuse super::error::LeaseError;\nlet x = super::owned::UpdateError::Gone;\n// super::runtime::Shared in a comment\nuse crate::processor::shared::Shared;\nuse super::{split::split, telemetry};",
        "processor",
    );
    let expected = ["lease", "error", "owned", "shared", "split", "telemetry"];
    assert_eq!(refs, BTreeSet::from(expected.map(str::to_owned)));
}

#[test]
fn layers_point_down_only() {
    // cli → operator → processor → cosmos: a layer never names one above it.
    let above: [(&str, &[&str]); 3] = [
        ("cosmos", &["processor", "operator", "cli", "worker"]),
        ("processor", &["operator", "cli", "worker", "metrics"]),
        ("operator", &["cli"]),
    ];
    let mut wrong = Vec::new();
    for (layer, forbidden) in above {
        for (path, text) in sources(&src().join(layer)) {
            for name in forbidden {
                if text.contains(&format!("crate::{name}::")) || text.contains(&format!("crate::{name};")) {
                    wrong.push(format!("{} names crate::{name}", path.display()));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
