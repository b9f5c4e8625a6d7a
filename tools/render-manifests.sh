#!/usr/bin/env bash
# Renders manifests/operator.yaml, the install without Helm, from the chart (a test fails when the
# checked-in file differs: run this after changing the chart).
#
#   tools/render-manifests.sh            # writes manifests/operator.yaml
#   tools/render-manifests.sh OUT        # writes OUT
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out="${1:-$root/manifests/operator.yaml}"
helm="$(bash "$root/tools/k8s/build.sh" | tail -n 1)/helm"
{
  echo "# changefeed-operator without Helm: kubectl apply -f crds/ -f manifests/operator.yaml"
  echo "# Rendered from charts/changefeed-operator by tools/render-manifests.sh; do not edit by hand."
  echo "apiVersion: v1"
  echo "kind: Namespace"
  echo "metadata:"
  echo "  name: changefeed-operator"
  "$helm" template changefeed-operator "$root/charts/changefeed-operator" \
    --namespace changefeed-operator --set crds.install=false
} > "$out.partial"
mv "$out.partial" "$out"
