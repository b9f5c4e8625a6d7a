#!/usr/bin/env bash
# Builds the pinned control-plane binaries the test suite uses (kube-apiserver, kubectl, etcd,
# controller-manager, scheduler, kubelet, kube-proxy and helm) from the Go wrapper modules beside this script, into a cache directory. Skips what is
# already built (bump the pin's -rN when a version changes).
#
#   tools/k8s/build.sh            # builds into $CFP_K8S_BIN (default ~/.cache/changefeed-operator/k8s-<pin>)
#   tools/k8s/build.sh --print    # prints that directory and builds nothing
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
kube_version="v1.35.4"
pin="kube-1.35.4-etcd-3.6.16-r2"
bin="${CFP_K8S_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/changefeed-operator/k8s-$pin}"
if [[ "${1:-}" == "--print" ]]; then echo "$bin"; exit 0; fi
mkdir -p "$bin"
export GOFLAGS="${GOFLAGS:-} -trimpath" CGO_ENABLED=0

# Stamp the real version (clients such as helm check it).
version_flags="-X k8s.io/component-base/version.gitVersion=$kube_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=35 -X k8s.io/client-go/pkg/version.gitVersion=$kube_version -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=35"

build() { # module-dir package output
  if [[ -x "$bin/$3" ]]; then echo "k8s tools: $3 present in $bin" >&2; return; fi
  echo "k8s tools: building $3 (cold builds take minutes on 2 cores)" >&2
  local started=$SECONDS
  (cd "$here/$1" && go build -ldflags="-s -w $version_flags" -o "$bin/$3.partial" "$2")
  mv "$bin/$3.partial" "$bin/$3"
  echo "k8s tools: built $3 in $((SECONDS - started)) s" >&2
}
build etcd go.etcd.io/etcd/server/v3 etcd
build kube k8s.io/kubernetes/cmd/kube-apiserver kube-apiserver
build kube k8s.io/kubernetes/cmd/kubectl kubectl
# The single-node cluster of the end-to-end tests (tests/cluster): node agent and controllers.
build kube k8s.io/kubernetes/cmd/kube-controller-manager kube-controller-manager
build kube k8s.io/kubernetes/cmd/kube-scheduler kube-scheduler
build kube k8s.io/kubernetes/cmd/kubelet kubelet
build kube k8s.io/kubernetes/cmd/kube-proxy kube-proxy
helm_version="v3.22.0"
# As helm's own release build does, stamp the Kubernetes version `helm template` and `helm lint`
# assume (else 1.20, which the chart's kubeVersion refuses): the control plane's.
version_flags="-X helm.sh/helm/v3/internal/version.version=$helm_version -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=35 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=35"
# A helm built before that stamp is rebuilt (the stamp file records the flags it was built with).
if [[ "$(cat "$bin/helm.ldflags" 2>/dev/null)" != "$version_flags" ]]; then rm -f "$bin/helm"; fi
build helm helm.sh/helm/v3/cmd/helm helm
echo "$version_flags" > "$bin/helm.ldflags"
echo "$bin"
