#!/usr/bin/env bash
# A rolling upgrade with a mixed fleet, run by hand (it needs a build of an earlier version, which
# CI does not make): two `cfp worker`s of the earlier version on `cfp emulator`, replaced one at a
# time by workers of this checkout while documents are written. Prints how often each document was
# delivered, the lease documents after (version-1 leases of the earlier version rewritten as
# version 0 by the new workers), and exits non-zero when a document was lost.
#
#   tools/rolling-upgrade.sh <git revision | path of an earlier cfp binary> [documents]
#
# A revision is built in a worktree of its own (target directory under $TMPDIR); this checkout's
# `cfp` is built with cargo as usual.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OLD_SPEC=${1:?usage: tools/rolling-upgrade.sh <git revision | path of an earlier cfp> [documents]}
DOCS=${2:-1000}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cfp-rolling-upgrade.XXXXXX")

if [[ -x $OLD_SPEC ]]; then
  OLD=$OLD_SPEC
else
  git worktree add --detach "$WORK/old-tree" "$OLD_SPEC" >/dev/null
  CARGO_TARGET_DIR="$WORK/old-target" cargo build --quiet --bin cfp --manifest-path "$WORK/old-tree/Cargo.toml"
  OLD="$WORK/old-target/debug/cfp"
fi
cargo build --quiet --bin cfp
NEW=${CARGO_TARGET_DIR:-target}/debug/cfp

PIDS=()
cleanup() {
  kill -TERM "${PIDS[@]}" 2>/dev/null || true
  if [[ -d $WORK/old-tree ]]; then git worktree remove --force "$WORK/old-tree" || true; fi
}
trap cleanup EXIT

# Waits (at most $2 seconds) until command $1 succeeds.
await() {
  local deadline=$((SECONDS + $2))
  until eval "$1"; do
    if ((SECONDS > deadline)); then echo "timed out waiting for: $1" >&2; return 1; fi
    sleep 0.2
  done
}
delivered() { cat "$WORK"/*.out 2>/dev/null | grep -o '"id":"doc-[0-9]*"' | sort -u | wc -l; }

PORT=$((20000 + RANDOM % 20000))
"$NEW" emulator --port "$PORT" --container db/items:/pk:4 >"$WORK/emulator.log" 2>&1 &
PIDS+=($!)
EP=http://127.0.0.1:$PORT/
await "curl -sf ${EP}_emulator/ranges?database=db\&container=items >/dev/null" 30
W=(worker --endpoint "$EP" --database db --container items --handler stdout --poll-interval 100ms
  --lease-acquire-interval 1s --lease-renew-interval 500ms --lease-expiration 3s --start-from beginning)

STARTED=
start() { # start <binary> <instance> <tag>: its pid in STARTED
  RUST_LOG=info "$1" "${W[@]}" --instance "$2" >"$WORK/$2-$3.out" 2>"$WORK/$2-$3.err" &
  STARTED=$!
  PIDS+=("$STARTED")
}
start "$OLD" w1 old; A=$STARTED
start "$OLD" w2 old; B=$STARTED
# The earlier workers hold every lease before writes start.
await "[[ \$(\"$NEW\" checkpoints export --endpoint $EP --database db --container items --lease-container leases 2>/dev/null | grep -c '\"owner\": \"w[12]\"') -ge 4 ]]" 60

# Documents are written in 20 parts while the workers are replaced one at a time.
(
  for i in $(seq 0 19); do
    "$NEW" write --endpoint "$EP" --database db --container items --first $((i * DOCS / 20)) \
      --count $(((i + 1) * DOCS / 20 - i * DOCS / 20)) >/dev/null
    sleep 0.3
  done
) &
WRITER=$!
PIDS+=("$WRITER")
await "[[ \$(delivered) -ge $((DOCS / 10)) ]]" 60
kill -TERM "$A"; wait "$A" || true
start "$NEW" w1 new; A=$STARTED
await "[[ \$(delivered) -ge $((DOCS / 4)) ]]" 60
kill -TERM "$B"; wait "$B" || true
start "$NEW" w2 new; B=$STARTED
wait "$WRITER"
await "[[ \$(delivered) -ge $DOCS ]]" 90 || true

echo "deliveries per document (count: documents):"
cat "$WORK"/*.out | grep -o '"id":"doc-[0-9]*"' | sort | uniq -c | awk '{c[$1]++} END {for (k in c) print "  " k ": " c[k]}'
echo "distinct: $(delivered) of $DOCS"
echo "leases after the upgrade (version 0: named by the partition key range id; version 1: by its range):"
"$NEW" checkpoints export --endpoint "$EP" --database db --container items --lease-container leases 2>/dev/null \
  | grep -E '^      "(id|owner)"' | paste - - | sed -E 's/^ *"id": "[^"]*\.\.([^"]*)",[[:space:]]*"owner": "([^"]*)".*/  lease \1: owner \2/'
echo "leases rewritten as version 0 by the new workers: $(grep -h "rewritten as version 0" "$WORK"/*-new.err | wc -l)"
echo "logs: $WORK"
[[ $(delivered) -ge $DOCS ]]
