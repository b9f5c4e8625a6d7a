#!/usr/bin/env bash
# Builds the pod sandbox ("pause") image of the end-to-end cluster as an OCI archive: the
# Kubernetes module's own build/pause/linux/pause.c, compiled static with gcc, packaged with umoci.
# No registry is reached. Prints the archive's path; skips the build when it exists.
#
#   tools/k8s/pause-image.sh          # into the directory of tools/k8s/build.sh --print
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out="$(bash "$here/build.sh" --print)/pause-3.10.oci.tar"
if [[ -f "$out" ]]; then echo "$out"; exit 0; fi
source=$(cd "$here/kube" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gcc -Os -static -DVERSION=3.10-cfp -o "$work/pause" "$source"
umoci init --layout "$work/oci"
umoci new --image "$work/oci:build"
umoci unpack --rootless --image "$work/oci:build" "$work/bundle" >/dev/null
install -D -m 0755 "$work/pause" "$work/bundle/rootfs/pause"
umoci repack --image "$work/oci:build" "$work/bundle" >/dev/null
umoci config --image "$work/oci:build" --tag 3.10 --os linux --architecture amd64 \
  --config.entrypoint /pause --config.user 65535:65535
umoci rm --image "$work/oci:build"
umoci gc --layout "$work/oci"
mkdir -p "$(dirname "$out")"
tar -C "$work/oci" -cf "$out.partial" .
mv "$out.partial" "$out"
echo "$out"
