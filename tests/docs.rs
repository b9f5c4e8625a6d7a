//! The documentation: the book (`book.toml`, pages in `docs/`) builds with the pinned mdBook, and
//! every relative link and `#anchor` in README.md and docs/**/*.md resolves — in the Markdown
//! (the file exists; a page of the book links only inside the book) and in the built HTML (where
//! mdBook turned `x.md` into `x.html`). Anchors are checked against the `id="…"` attributes of
//! the built pages, so they are mdBook's own heading ids; README.md, outside the book, gets
//! mdBook's rule (lower case, spaces to `-`, other punctuation dropped) applied to its headings.
//! And the Python handler the HTTP page shows is the file the tests run behind a real worker.

use std::collections::{BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// The version `tools/docs/mdbook.sh` installs.
const MDBOOK_VERSION: &str = "0.5.4";

/// The pinned mdBook, where `tools/docs/mdbook.sh` installs it; the test fails with one line
/// saying how to install it when it is not there.
fn mdbook() -> PathBuf {
    let printed = std::process::Command::new("bash")
        .arg(format!("{ROOT}/tools/docs/mdbook.sh"))
        .arg("--print")
        .output()
        .expect("run tools/docs/mdbook.sh --print");
    let path = PathBuf::from(String::from_utf8_lossy(&printed.stdout).trim());
    let version = std::process::Command::new(&path).arg("--version").output();
    let found = version.is_ok_and(|v| String::from_utf8_lossy(&v.stdout).trim() == format!("mdbook v{MDBOOK_VERSION}"));
    assert!(
        found,
        "mdbook {MDBOOK_VERSION} is missing at {}: install it with `bash tools/docs/mdbook.sh` (cargo install mdbook --version {MDBOOK_VERSION} --locked --no-default-features)",
        path.display()
    );
    path
}

/// Builds the book at `root` into `out`; panics with mdBook's output when it fails.
fn build_book(root: &Path, out: &Path) {
    let output = std::process::Command::new(mdbook())
        .arg("build")
        .arg(root)
        .arg("--dest-dir")
        .arg(out)
        .output()
        .expect("run mdbook build");
    assert!(
        output.status.success(),
        "mdbook build failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Every `.md` file under `dir`.
fn markdown_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read a docs directory").flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The link targets of a Markdown text with their line numbers: `[text](target)` outside code
/// blocks and code spans.
fn markdown_links(text: &str) -> Vec<(usize, String)> {
    let mut links = Vec::new();
    let mut fenced = false;
    for (number, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            let target = rest[..end].split_whitespace().next().unwrap_or_default();
            links.push((number + 1, target.to_string()));
            rest = &rest[end..];
        }
    }
    links
}

/// The values of the attribute `name` (such as ` id`, with the space before it) in an HTML text.
fn attributes<'a>(html: &'a str, name: &str) -> impl Iterator<Item = String> + 'a {
    let opening = format!("{name}=\"");
    let parts: Vec<&'a str> = html.split(opening.as_str()).skip(1).collect();
    parts
        .into_iter()
        .filter_map(|part| part.split('"').next())
        .map(str::to_string)
}

/// The `href="…"` targets inside the `<main>` element of a built page.
fn html_links(html: &str) -> Vec<String> {
    let main = html.split("<main>").nth(1).and_then(|m| m.split("</main>").next());
    attributes(main.unwrap_or_default(), "href").collect()
}

/// The `id="…"` attributes of a built page.
fn html_ids(html: &str) -> BTreeSet<String> {
    attributes(html, " id").collect()
}

/// The ids mdBook gives the headings of a Markdown text: lower case, letters, digits, `-` and `_`
/// kept, spaces as `-`, everything else dropped; a repeated id gets `-1`, `-2`, ...
fn heading_ids(text: &str) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        let Some(heading) = line
            .strip_prefix('#')
            .filter(|_| !fenced)
            .map(|h| h.trim_start_matches('#'))
        else {
            continue;
        };
        let id: String = heading
            .trim()
            .chars()
            .filter_map(|c| match c {
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
                c if c.is_whitespace() => Some('-'),
                _ => None,
            })
            .collect();
        let count = seen.entry(id.clone()).or_default();
        ids.insert(if *count == 0 {
            id.clone()
        } else {
            format!("{id}-{count}")
        });
        *count += 1;
    }
    ids
}

/// `base/relative` with `.` and `..` resolved, without touching the file system.
fn join(base: &Path, relative: &str) -> PathBuf {
    let mut out = PathBuf::new();
    for component in base.join(relative).components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The file a link in `file` points to and its anchor (empty when none); `None` for a link that
/// leaves the repository's files (a URL, a mail address).
fn local_target<'t>(file: &Path, target: &'t str) -> Option<(PathBuf, &'t str)> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
    let resolved = match (path, file.parent()) {
        ("", _) | (_, None) => file.to_path_buf(),
        (path, Some(dir)) => join(dir, path),
    };
    Some((resolved, anchor))
}

/// A book: its root (with `book.toml`), its pages' directory and where it was built.
struct Book<'a> {
    root: &'a Path,
    src: &'a Path,
    out: &'a Path,
}

impl Book<'_> {
    /// The ids of the page a Markdown file of the book became, or of a Markdown file outside it.
    fn ids_of(&self, file: &Path) -> BTreeSet<String> {
        match file.strip_prefix(self.src) {
            Ok(page) => std::fs::read_to_string(self.out.join(page).with_extension("html"))
                .map(|html| html_ids(&html))
                .unwrap_or_default(),
            Err(_) => heading_ids(&std::fs::read_to_string(file).unwrap_or_default()),
        }
    }

    /// The broken links of one Markdown file, each as `file:line: target: why`.
    fn check_markdown(&self, file: &Path) -> Vec<String> {
        let text = std::fs::read_to_string(file).expect("read a Markdown file");
        let shown = file.strip_prefix(self.root).unwrap_or(file).display().to_string();
        let mut broken = Vec::new();
        for (line, target) in markdown_links(&text) {
            let Some((resolved, anchor)) = local_target(file, &target) else {
                continue;
            };
            let why = if !resolved.exists() {
                Some("no such file".to_string())
            } else if file.starts_with(self.src) && !resolved.starts_with(self.src) {
                Some("a page of the book links outside the book (it would not resolve in the built book; name the file in a code span)".to_string())
            } else if !anchor.is_empty() && resolved.extension().is_none_or(|e| e != "md") {
                Some("an anchor in a file that is not a page".to_string())
            } else if !anchor.is_empty() && !self.ids_of(&resolved).contains(anchor) {
                Some(format!("no heading with the id `{anchor}` there"))
            } else {
                None
            };
            if let Some(why) = why {
                broken.push(format!("{shown}:{line}: {target}: {why}"));
            }
        }
        broken
    }

    /// The broken links of the built page of one Markdown file of the book.
    fn check_html(&self, file: &Path) -> Vec<String> {
        let Ok(page) = file.strip_prefix(self.src) else {
            return Vec::new();
        };
        if page == Path::new("SUMMARY.md") {
            // The table of contents becomes the sidebar of every page, not a page of its own.
            return Vec::new();
        }
        let built = self.out.join(page).with_extension("html");
        let Ok(html) = std::fs::read_to_string(&built) else {
            return vec![format!("{}: no built page {}", page.display(), built.display())];
        };
        let mut broken = Vec::new();
        for target in html_links(&html) {
            let Some((resolved, anchor)) = local_target(&built, &target) else {
                continue;
            };
            let ok = resolved.is_file()
                && (anchor.is_empty()
                    || html_ids(&std::fs::read_to_string(&resolved).unwrap_or_default()).contains(anchor));
            if !ok {
                broken.push(format!(
                    "{} (built): {target}: does not resolve in the book",
                    page.display()
                ));
            }
        }
        broken
    }

    /// Every broken link of these Markdown files, in their text and in the built pages.
    fn broken_links(&self, files: &[PathBuf]) -> Vec<String> {
        files
            .iter()
            .flat_map(|file| [self.check_markdown(file), self.check_html(file)].concat())
            .collect()
    }
}

#[test]
fn the_book_builds_and_every_link_and_anchor_resolves() {
    let root = Path::new(ROOT);
    let out = tempfile::tempdir().expect("a temporary directory");
    build_book(root, out.path());
    let src = root.join("docs");
    let book = Book {
        root,
        src: &src,
        out: out.path(),
    };
    let mut files = markdown_files(&src);
    files.push(root.join("README.md"));
    let broken = book.broken_links(&files);
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_page_of_docs_is_in_the_summary() {
    let src = Path::new(ROOT).join("docs");
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).expect("read docs/SUMMARY.md");
    let listed: BTreeSet<PathBuf> = markdown_links(&summary)
        .into_iter()
        .map(|(_, t)| join(&src, &t))
        .collect();
    let missing: Vec<String> = markdown_files(&src)
        .into_iter()
        .filter(|f| !f.ends_with("SUMMARY.md") && !listed.contains(f))
        .map(|f| f.display().to_string())
        .collect();
    assert!(missing.is_empty(), "pages not in docs/SUMMARY.md: {missing:?}");
}

#[test]
fn the_checker_finds_a_missing_file_a_missing_anchor_and_a_link_out_of_the_book() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let root = dir.path();
    let src = root.join("src");
    std::fs::create_dir_all(&src).expect("create src");
    std::fs::write(root.join("book.toml"), "[book]\ntitle = \"t\"\n").expect("write book.toml");
    std::fs::write(root.join("notes.txt"), "outside").expect("write notes.txt");
    std::fs::write(src.join("SUMMARY.md"), "# Summary\n\n- [A](a.md)\n- [B](b.md)\n").expect("write SUMMARY.md");
    std::fs::write(src.join("b.md"), "# B page\n\n## Some Section, here\n").expect("write b.md");
    let a = "# A\n\n[ok](b.md#some-section-here) [ok](#a) `[code](nowhere.md)`\n\n\
             [gone](missing.md)\n[anchor](b.md#no-such-section)\n[out](../notes.txt)\n";
    std::fs::write(src.join("a.md"), a).expect("write a.md");
    let out = root.join("book");
    build_book(root, &out);
    let book = Book {
        root,
        src: &src,
        out: &out,
    };
    let broken = book.broken_links(&[src.join("a.md"), src.join("b.md")]);
    let expected = [
        "src/a.md:5: missing.md: no such file",
        "src/a.md:6: b.md#no-such-section: no heading with the id `no-such-section` there",
        "src/a.md:7: ../notes.txt: a page of the book links outside the book",
    ];
    for line in expected {
        assert!(
            broken.iter().any(|b| b.starts_with(line)),
            "{line:?} not in {broken:#?}"
        );
    }
    assert!(
        broken.iter().any(|b| b.contains("(built): missing.html")),
        "{broken:#?}"
    );
    let good = ["some-section-here", "#a:", "nowhere"];
    assert!(
        !broken.iter().any(|b| good.iter().any(|g| b.contains(g))),
        "{broken:#?}"
    );
}

#[test]
fn heading_ids_follow_mdbook() {
    let ids = heading_ids(
        "# `cfp worker`\n## Accounts without keys (Microsoft Entra ID)\n```\n# not a heading\n```\n## A\n## A\n",
    );
    let expected: BTreeSet<String> = ["cfp-worker", "accounts-without-keys-microsoft-entra-id", "a", "a-1"]
        .map(String::from)
        .into();
    assert_eq!(ids, expected);
}

#[test]
fn the_documented_python_handler_is_the_file_the_tests_run() {
    let page = std::fs::read_to_string(format!("{ROOT}/docs/http-handler.md")).expect("read docs/http-handler.md");
    let block = page
        .split("```python\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a Python block in docs/http-handler.md");
    let file = std::fs::read_to_string(format!("{ROOT}/tests/python/example_handler.py")).expect("read the handler");
    let code = file
        .splitn(3, "\"\"\"")
        .nth(2)
        .unwrap_or_default()
        .trim_start_matches('\n');
    assert!(
        block == code,
        "the Python handler of docs/http-handler.md differs from tests/python/example_handler.py (below its docstring)"
    );
}

#[test]
fn the_published_performance_table_is_the_rendering_of_the_published_run() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let output = std::process::Command::new(crate::common::CFP)
        .args(["bench", "--render"])
        .arg(root.join("bench/published.json"))
        .output()
        .expect("run cfp bench --render");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let rendered = String::from_utf8_lossy(&output.stdout);
    let page = std::fs::read_to_string(root.join("docs/performance.md")).unwrap();
    let begin = "<!-- published-table:begin -->\n";
    let published = page
        .split_once(begin)
        .and_then(|(_, rest)| rest.split_once("<!-- published-table:end -->"))
        .map(|(table, _)| table)
        .expect("docs/performance.md marks its published table");
    assert_eq!(
        published, rendered,
        "the table is edited by hand or from another run: regenerate it with tools/publish-bench.sh"
    );
    assert!(
        rendered.contains("run: commit "),
        "the published run names its commit: {rendered}"
    );
}
