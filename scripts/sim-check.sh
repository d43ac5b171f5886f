#!/usr/bin/env bash
# The fabric simulator's stage (docs/simulation.md), after the workspace
# build (its unit and closed-form tests run with the workspace's):
#  - scale: a 16,384-rank ring all-reduce and hierarchical all-reduce of
#    1 GiB on a rail-optimized two-tier fabric each simulate in < 30 s,
#    through the symmetric shortcut;
#  - validation: the predictions for docs/performance.md's fabric table
#    (1-64 MiB rows; held out of the calibration) agree within 15% in
#    median and 25% at worst.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${CARGO_TARGET_DIR:-target}/release/fabric_sim
cargo build --release -p fabric-sim
for algo in ring hier; do
  start=$(date +%s%N)
  out=$("$BIN" --ranks 16384 --ranks-per-host 8 --rails 8 --rails-layout optimized --hosts-per-leaf 32 \
    --sizes 1G --algo "$algo" --json)
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  echo "$out" | grep -q '"mode":"symmetric"' || { echo "sim-check: $algo at 16384 ranks did not take the symmetric shortcut" >&2; exit 1; }
  echo "sim-check: 16384-rank $algo all-reduce simulated in $ms ms"
  [ "$ms" -lt 30000 ] || { echo "sim-check: too slow (limit 30 s)" >&2; exit 1; }
done
data=$(mktemp /tmp/sim-check.XXXXXX)
trap 'rm -f "$data"' EXIT
FABRIC_BIN_DIR=$(dirname "$BIN") bash scripts/fabric/sim-validate.sh perfdoc >"$data"
summary=$(DATA=$data FABRIC_BIN_DIR=$(dirname "$BIN") bash scripts/fabric/sim-validate.sh report | tail -1)
echo "sim-check: $summary"
echo "$summary" | awk '{ m = $5; w = $7; gsub(/%,?/, "", m); gsub(/%/, "", w); exit !(NF >= 7 && $1 + 0 >= 12 && m + 0 <= 15 && w + 0 <= 25) }' \
  || { echo "sim-check: validation outside its bounds" >&2; exit 1; }
