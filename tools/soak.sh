#!/usr/bin/env bash
# The long soak with an independent checker (docs/soak.md):
#
#   tools/soak.sh --seed 40 --duration 30m [--release] [more tools/soak/soak.py options]
#
# builds `cfp` (the dev profile, or --release), then runs tools/soak/soak.py: 8 `cfp worker`
# processes over 256 leases on `cfp emulator` for the duration while a schedule drawn from the
# seed makes every fault, and the checker (tools/soak/check.py) verifies the logs it kept in
# /tmp/soak-<seed>-<time> (or --out DIR). Exit code 0: nothing found; 1: the checker found a
# violation (report.json says which); 2: the soak itself failed. CARGO_TARGET_DIR is honoured.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
profile=debug
args=()
for arg in "$@"; do
  if [[ "$arg" == --release ]]; then profile=release; else args+=("$arg"); fi
done
flags=(--bin cfp --manifest-path "$root/Cargo.toml")
[[ "$profile" == release ]] && flags+=(--release)
cargo build "${flags[@]}"
target="${CARGO_TARGET_DIR:-$root/target}"
exec python3 "$root/tools/soak/soak.py" --cfp "$target/$profile/cfp" "${args[@]}"
