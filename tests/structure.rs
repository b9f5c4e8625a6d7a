//! The code's shape, checked on every run: layers point down only (cli → operator → worker →
//! processor → cosmos), no import circle among the crate's modules, no production file over 600
//! lines or function over 80 lines in `src/` without a note in the code saying why (a comment
//! containing `longer than the limit because`), and each folder's map names the modules it has.

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

/// A module's path in the crate (`["processor", "run", "coordinator"]`) from its file.
fn module_of(path: &Path) -> Vec<String> {
    let relative = path.strip_prefix(src()).unwrap_or(path).with_extension("");
    let mut segments: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if segments.last().is_some_and(|s| s == "mod") {
        segments.pop();
    }
    segments
}

/// The paths written in `text` that start at `crate`, `super` or `self`, with use groups
/// expanded (`crate::a::{b::C, d}` is `crate::a::b::C` and `crate::a::d`).
fn written_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    for start in ["crate::", "super::", "self::"] {
        for (at, _) in text.match_indices(start) {
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let (mut end, mut depth) = (at, 0i32);
            while end < bytes.len() {
                let c = bytes[end] as char;
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    c if depth == 0 && !(c.is_alphanumeric() || c == '_' || c == ':' || c == '*') => break,
                    _ => {}
                }
                end += 1;
                if depth == 0 && c == '}' {
                    break;
                }
            }
            out.extend(expand(&text[at..end]));
        }
    }
    out
}

/// `a::{b, c::{d}}` as `a::b`, `a::c::d`.
fn expand(path: &str) -> Vec<String> {
    let Some(open) = path.find('{') else {
        return vec![path.split(" as ").next().unwrap_or(path).trim().to_owned()];
    };
    let close = path.rfind('}').unwrap_or(path.len());
    let (head, body) = (&path[..open], &path[open + 1..close]);
    let (mut items, mut depth, mut from) = (Vec::new(), 0, 0);
    for (i, c) in body.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&body[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    items.push(&body[from..]);
    items
        .into_iter()
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .flat_map(|item| expand(&format!("{head}{item}")))
        .collect()
}

/// The production text of a file without comment lines; a folder's `mod.rs` without its
/// re-exports (`pub use`: the folder's public face, not a dependency of it).
fn code(path: &Path, text: &str) -> String {
    let folder = path.file_name().is_some_and(|n| n == "mod.rs");
    production(path, text)
        .into_iter()
        .filter(|l| !l.trim_start().starts_with("//"))
        .filter(|l| !(folder && (l.starts_with("pub use") || l.starts_with("pub(crate) use"))))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The import graph of the crate's modules (one node per file, `main.rs`, `lib.rs` and test
/// files aside): an edge to the deepest module a path names.
fn crate_graph() -> BTreeMap<String, BTreeSet<String>> {
    let files: Vec<(PathBuf, String)> = sources(&src())
        .into_iter()
        .filter(|(p, _)| {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            !(name.ends_with("_tests.rs")
                || (p.parent() == Some(src().as_path()) && ["main.rs", "lib.rs"].contains(&name.as_str())))
        })
        .collect();
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(p, _)| module_of(p)).collect();
    let mut graph = BTreeMap::new();
    for (path, text) in &files {
        let module = module_of(path);
        let mut uses = BTreeSet::new();
        for written in written_paths(&code(path, text)) {
            let mut segments: Vec<&str> = written.split("::").map(str::trim).collect();
            let mut resolved: Vec<String> = match segments.first() {
                Some(&"crate") => Vec::new(),
                _ => module.clone(),
            };
            if segments.first() == Some(&"self") || segments.first() == Some(&"crate") {
                segments.remove(0);
            }
            while segments.first() == Some(&"super") {
                segments.remove(0);
                resolved.pop();
            }
            resolved.extend(segments.iter().map(|s| (*s).to_owned()));
            let target = (1..=resolved.len())
                .rev()
                .map(|n| resolved[..n].to_vec())
                .find(|prefix| modules.contains(prefix));
            if let Some(target) = target.filter(|t| *t != module) {
                uses.insert(target.join("::"));
            }
        }
        graph.insert(module.join("::"), uses);
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
fn no_module_of_the_crate_is_in_an_import_circle() {
    let graph = crate_graph();
    assert!(graph.len() > 100, "the crate's modules were not found: {graph:?}");
    assert!(
        graph["processor::run::coordinator"].contains("processor::policy::cycle_plan"),
        "references are found: {:?}",
        graph["processor::run::coordinator"]
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!("an import circle in src/: {}", cycle.join(" → "));
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
    let paths = written_paths(
        "use super::lease::{Lease, LeaseStore};\nlet x = super::owned::UpdateError::Gone;\nuse crate::processor::{run::shared::Shared, options};\nuse super::{split::split, telemetry as t};\nnot_crate::x::y",
    );
    let expected = [
        "super::lease::Lease",
        "super::lease::LeaseStore",
        "super::owned::UpdateError::Gone",
        "crate::processor::run::shared::Shared",
        "crate::processor::options",
        "super::split::split",
        "super::telemetry",
    ];
    assert_eq!(
        paths.iter().collect::<BTreeSet<_>>(),
        expected
            .iter()
            .map(|s| (*s).to_owned())
            .collect::<BTreeSet<_>>()
            .iter()
            .collect()
    );
}

#[test]
fn layers_point_down_only() {
    // cli → operator → worker → processor → cosmos: a layer never names one above it.
    let above: [(&str, &[&str]); 4] = [
        ("cosmos", &["processor", "worker", "operator", "cli"]),
        ("processor", &["worker", "operator", "cli"]),
        ("worker", &["operator", "cli"]),
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

/// The modules a folder's `mod.rs` (or `lib.rs`) declares: `mod name;` in any visibility.
fn declared_modules(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let mut rest = line.trim_start();
            for prefix in ["pub(crate) ", "pub(super) ", "pub "] {
                rest = rest.strip_prefix(prefix).unwrap_or(rest);
            }
            let name = rest.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(name.to_owned())
        })
        .collect()
}

/// The map of a folder: its `mod.rs`'s inner doc comment.
fn map_of(text: &str) -> String {
    text.lines()
        .filter_map(|line| line.strip_prefix("//!"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `map` names module `name` as code: `` `name` ``, `` [`name`] ``, `` `name::…` `` or
/// `` `name/` ``.
fn names_module(map: &str, name: &str) -> bool {
    ["`", "::", "/"]
        .iter()
        .any(|after| map.contains(&format!("`{name}{after}")))
}

#[test]
fn each_folders_map_names_the_modules_it_has() {
    let mut unnamed = Vec::new();
    let folders = sources(&src())
        .into_iter()
        .filter(|(path, _)| path.ends_with("mod.rs") || path == &src().join("lib.rs"));
    for (path, text) in folders {
        let map = map_of(&text);
        for module in declared_modules(&text) {
            if !names_module(&map, &module) {
                let shown = path.strip_prefix(src()).unwrap_or(&path).display().to_string();
                unnamed.push(format!("{shown}: {module}"));
            }
        }
    }
    assert!(
        unnamed.is_empty(),
        "each folder's map (its mod.rs's //! comment) names every module it has; not named:\n{}",
        unnamed.join("\n")
    );
}

#[test]
fn a_map_that_misses_a_module_is_found() {
    let text = "//! The room: [`kept`] and `other`.\n\npub mod kept;\nmod other;\npub(crate) mod new_one;\n";
    let map = map_of(text);
    let unnamed: Vec<String> = declared_modules(text)
        .into_iter()
        .filter(|m| !names_module(&map, m))
        .collect();
    assert_eq!(unnamed, ["new_one"]);
}
