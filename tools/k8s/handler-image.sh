#!/usr/bin/env bash
# Builds the handler sidecar image of the end-to-end cluster as an OCI archive: handler.c beside
# this script (a naive HTTP handler that records every batch and answers late), compiled static
# with gcc, packaged with umoci as cfp.local/handler:1, user 65532. No registry is reached. Prints
# the archive's path; skips the build when an archive of the same source exists.
#
#   tools/k8s/handler-image.sh        # into the directory of tools/k8s/build.sh --print
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
digest=$(cat "$here/handler.c" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-12)
out="$(bash "$here/build.sh" --print)/handler-$digest.oci.tar"
if [[ -f "$out" ]]; then echo "$out"; exit 0; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gcc -Os -static -Wall -Wextra -Werror -std=c11 -o "$work/handler" "$here/handler.c"
umoci init --layout "$work/oci"
umoci new --image "$work/oci:build"
umoci unpack --rootless --image "$work/oci:build" "$work/bundle" >/dev/null
install -D -m 0755 "$work/handler" "$work/bundle/rootfs/handler"
umoci repack --image "$work/oci:build" "$work/bundle" >/dev/null
umoci config --image "$work/oci:build" --tag 1 --os linux --architecture amd64 \
  --config.entrypoint /handler --config.user 65532:65532 \
  --config.env PORT=8080 --config.env RECORD_DIR=/records --config.env DELAY_MS=1500
umoci rm --image "$work/oci:build"
umoci gc --layout "$work/oci"
mkdir -p "$(dirname "$out")"
tar -C "$work/oci" -cf "$out.partial" .
mv "$out.partial" "$out"
echo "$out"
