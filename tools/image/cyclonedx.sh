#!/usr/bin/env bash
# Installs the pinned cargo-cyclonedx (the CycloneDX SBOM generator of the CycloneDX project) with
# `cargo install --locked` into a cache directory, skipped when it is already there.
# tools/image/build.sh runs it to write the image's SBOM beside the OCI archive.
#
#   tools/image/cyclonedx.sh          # installs into $CFP_CYCLONEDX_ROOT (default ~/.cache/changefeed-operator/cargo-cyclonedx-<version>)
#   tools/image/cyclonedx.sh --print  # prints the path of the binary
set -euo pipefail
version=0.5.9
root="${CFP_CYCLONEDX_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/changefeed-operator/cargo-cyclonedx-$version}"
binary="$root/bin/cargo-cyclonedx"
if [[ "${1:-}" == "--print" ]]; then echo "$binary"; exit 0; fi
if [[ -x "$binary" ]] && [[ "$("$binary" cyclonedx --version)" == *" $version" ]]; then exit 0; fi

command -v cargo >/dev/null || { echo "cargo is missing: cargo-cyclonedx is installed with cargo install" >&2; exit 1; }
echo "image: installing cargo-cyclonedx $version into $root" >&2
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
# Its own target directory: the project's (CARGO_TARGET_DIR) is not mixed with a tool's build.
CARGO_TARGET_DIR="$build" cargo install cargo-cyclonedx --version "$version" --locked \
  --root "$root" --quiet
"$binary" cyclonedx --version >/dev/null
