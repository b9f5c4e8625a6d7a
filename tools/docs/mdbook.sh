#!/usr/bin/env bash
# Installs the pinned mdBook (the docs/ book's builder) with `cargo install` into a cache directory,
# skipped when it is already there. The docs tests (`tests/docs.rs`) build the book with it and
# check every link and anchor.
#
#   tools/docs/mdbook.sh          # installs into $CFP_MDBOOK_ROOT (default ~/.cache/changefeed-operator/mdbook-<version>)
#   tools/docs/mdbook.sh --print  # prints the path of the binary
#
# Without default features: no `serve`/`watch` (a web server and a file watcher the build does not
# need) and no search index, which keeps the cold install short.
set -euo pipefail
version=0.5.4
root="${CFP_MDBOOK_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/changefeed-operator/mdbook-$version}"
binary="$root/bin/mdbook"
if [[ "${1:-}" == "--print" ]]; then echo "$binary"; exit 0; fi
if [[ -x "$binary" ]] && [[ "$("$binary" --version)" == "mdbook v$version" ]]; then exit 0; fi

command -v cargo >/dev/null || { echo "cargo is missing: mdBook is installed with cargo install" >&2; exit 1; }
echo "docs: installing mdbook $version into $root" >&2
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
# Its own target directory: the project's (CARGO_TARGET_DIR) is not mixed with a tool's build.
CARGO_TARGET_DIR="$build" cargo install mdbook --version "$version" --locked --no-default-features \
  --root "$root" --quiet
"$binary" --version >/dev/null
