#!/usr/bin/env bash
# Builds the cfp container image as an OCI archive without a Docker engine, with umoci (installed
# from Debian when missing). The image holds the binary of the dist profile (release + LTO), exactly the shared libraries it
# links, CA certificates and a non-root user (65532) — nothing else. Beside the archive: its SBOM,
# a CycloneDX JSON document of the crates the binary ships at their Cargo.lock versions (written by
# the pinned cargo-cyclonedx, tools/image/cyclonedx.sh), named with its sha256 digest by the
# image manifest's annotations `io.changefeed.sbom.name` / `.digest` / `.mediaType`.
#
#   tools/image/build.sh                         # cargo build --profile dist, then target/image/cfp-<version>.oci.tar (+ .cdx.json)
#   tools/image/build.sh --binary PATH --out F   # package an existing binary into F (SBOM: F without .oci.tar, + .cdx.json)
#   tools/image/build.sh --tools-only            # only make sure umoci and cargo-cyclonedx are installed
#
# Load it with `ctr -n k8s.io images import F`, or push it with
# `skopeo copy oci-archive:F docker://<registry>/cfp:<version>`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n 1)
binary="" out="" tools_only=false
while [[ $# -gt 0 ]]; do
  case "$1" in
    --binary) binary="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --tools-only) tools_only=true; shift ;;
    *) echo "usage: $0 [--binary PATH] [--out FILE] [--tools-only]" >&2; exit 2 ;;
  esac
done

if ! command -v umoci >/dev/null; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "umoci is missing; install it (Debian: apt-get install umoci) or run this as root" >&2
    exit 1
  fi
  echo "image: installing umoci" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q umoci >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q umoci >/dev/null; }
fi
bash "$root/tools/image/cyclonedx.sh"
if $tools_only; then exit 0; fi

if [[ -z "$binary" ]]; then
  target="${CARGO_TARGET_DIR:-$root/target}"
  (cd "$root" && cargo build --profile dist --locked --bin cfp)
  binary="$target/dist/cfp"
fi
out="${out:-$root/target/image/cfp-$version.oci.tar}"
mkdir -p "$(dirname "$out")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

layout="$work/oci"
umoci init --layout "$layout"
umoci new --image "$layout:build"
umoci unpack --rootless --image "$layout:build" "$work/bundle" >/dev/null
rootfs="$work/bundle/rootfs"
install -D -m 0755 "$binary" "$rootfs/usr/local/bin/cfp"
# Exactly the shared libraries the binary links (and the dynamic loader).
while read -r lib; do
  install -D -m 0755 "$lib" "$rootfs$lib"
done < <(ldd "$binary" | grep -o '/[^ ]*' | sort -u)
# TLS to Cosmos DB (and https handlers) verifies against the system CA bundle.
install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n' > "$rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$rootfs/etc/group"
umoci repack --image "$layout:build" "$work/bundle" >/dev/null

# The SBOM: the crate and its normal dependencies (no dev or build-only crates) for the target the
# binary is built for, at their Cargo.lock versions.
sbom="${out%.oci.tar}.cdx.json"
triple=$(rustc -vV | sed -n 's/^host: //p')
# Reproducible: the SBOM's timestamp is the commit's.
SOURCE_DATE_EPOCH=$(git -C "$root" log -1 --format=%ct 2>/dev/null || date +%s)
export SOURCE_DATE_EPOCH
(cd "$work" && "$(bash "$root/tools/image/cyclonedx.sh" --print)" cyclonedx \
  --manifest-path "$root/Cargo.toml" --format json --spec-version 1.5 --no-build-deps \
  --target "$triple" --override-filename "cfp-sbom-$$.cdx" >&2)
mv "$root/cfp-sbom-$$.cdx.json" "$sbom"
sbom_digest="sha256:$(sha256sum "$sbom" | cut -d' ' -f1)"

revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
umoci config --image "$layout:build" --tag "$version" \
  --os linux --architecture amd64 \
  --config.user 65532:65532 \
  --config.entrypoint /usr/local/bin/cfp \
  --config.workingdir / \
  --config.env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
  --config.label "org.opencontainers.image.title=cfp" \
  --config.label "org.opencontainers.image.description=changefeed-operator: Azure Cosmos DB change feed processing as a scaled set of worker pods" \
  --config.label "org.opencontainers.image.version=$version" \
  --config.label "org.opencontainers.image.revision=$revision" \
  --config.label "org.opencontainers.image.created=$created" \
  --config.label "org.opencontainers.image.licenses=MIT" \
  --manifest.annotation "org.opencontainers.image.version=$version" \
  --manifest.annotation "org.opencontainers.image.revision=$revision" \
  --manifest.annotation "org.opencontainers.image.created=$created" \
  --manifest.annotation "org.opencontainers.image.licenses=MIT" \
  --manifest.annotation "org.opencontainers.image.title=cfp" \
  --manifest.annotation "io.changefeed.sbom.name=$(basename "$sbom")" \
  --manifest.annotation "io.changefeed.sbom.digest=$sbom_digest" \
  --manifest.annotation "io.changefeed.sbom.mediaType=application/vnd.cyclonedx+json"
umoci rm --image "$layout:build"
umoci gc --layout "$layout"
tar -C "$layout" -cf "$out.partial" .
mv "$out.partial" "$out"
size=$(du -k "$out" | cut -f1)
echo "image: $out (tag $version, $size KiB); SBOM $sbom ($sbom_digest)" >&2
echo "$out"
