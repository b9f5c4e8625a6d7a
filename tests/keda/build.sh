#!/usr/bin/env bash
# Builds KEDA's own `azure-cosmosdb` scaler (the Go module github.com/kedacore/keda/v2, pinned in
# go.mod beside this script, its code unchanged) into a small command the KEDA test runs against
# `cfp emulator` (main.go), into a cache directory; skips the build when the binary was built
# from these very sources (a hash beside it). Prints the binary's path.
#
#   tests/keda/build.sh            # builds into $CFP_KEDA_BIN (default ~/.cache/changefeed-operator/keda-<pin>)
#   tests/keda/build.sh --print    # prints the binary's path and builds nothing
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
pin="keda-2.21.0-r1"
dir="${CFP_KEDA_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/changefeed-operator/$pin}"
bin="$dir/keda-cosmosdb"
if [[ "${1:-}" == "--print" ]]; then echo "$bin"; exit 0; fi
command -v go >/dev/null || { echo "keda: go is missing (the test builds KEDA's scaler from its Go module)" >&2; exit 1; }
# Keyed by the sources' content, not their times (a fresh checkout's files are all new).
sum=$(cat "$here/main.go" "$here/go.mod" "$here/go.sum" | sha256sum | cut -d' ' -f1)
if [[ -x $bin && "$(cat "$bin.sum" 2>/dev/null)" == "$sum" ]]; then
  echo "$bin"; exit 0
fi
mkdir -p "$dir"
echo "keda: building KEDA's azure-cosmosdb scaler (a cold build takes minutes on 2 cores)" >&2
started=$SECONDS
(cd "$here" && CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -trimpath -buildvcs=false" go build -ldflags="-s -w" -o "$bin.partial" .)
mv "$bin.partial" "$bin"
echo "$sum" > "$bin.sum"
echo "keda: built $bin in $((SECONDS - started)) s" >&2
echo "$bin"
