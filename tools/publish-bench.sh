#!/usr/bin/env bash
# Regenerates the table at the top of docs/performance.md from a run of the landed code: builds
# the `dist` profile (what the image ships), runs the groups of that table alone on this machine,
# keeps the run as bench/published.json (its commit, profile and date in its label) and writes
# `cfp bench --render` of it between the table's markers. A test fails when the table is not the
# rendering of that file: the table is never edited by hand. Run on a clean checkout of main with
# nothing else running.
#
#   tools/publish-bench.sh
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
groups="throughput,busy handler,rebalance,failover,latency,resources,worker processes,operator,lease-store cost,java v4 peer,balance by work"
if [ -n "$(git status --porcelain)" ]; then
  echo "publish-bench: the checkout has changes; publish from a clean checkout of the landed code" >&2
  exit 1
fi
[ -f bench/java-peer/target/java-peer-0.1.0.jar ] || bash bench/java-peer/build.sh
bash tools/k8s/build.sh > /dev/null
cargo build --locked --profile dist
target="${CARGO_TARGET_DIR:-target}"
label="commit $(git rev-parse --short=12 HEAD), profile dist, $(date -u +%Y-%m-%d)"
"$target/dist/cfp" bench --only "$groups" --json bench/published.json.partial --label "$label"
mv bench/published.json.partial bench/published.json
"$target/dist/cfp" bench --render bench/published.json > bench/published.md.partial
python3 - docs/performance.md bench/published.md.partial <<'PY'
import sys
doc, table = sys.argv[1], open(sys.argv[2]).read()
text = open(doc).read()
begin, end = "<!-- published-table:begin -->\n", "<!-- published-table:end -->"
head, rest = text.split(begin, 1)
_, tail = rest.split(end, 1)
open(doc, "w").write(head + begin + table + end + tail)
PY
rm bench/published.md.partial
echo "publish-bench: docs/performance.md and bench/published.json regenerated ($label)"
