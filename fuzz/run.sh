#!/usr/bin/env bash
# Runs every fuzz target with cargo-fuzz (libFuzzer + AddressSanitizer) for
# SECS seconds each (default 60), from the seeds in fuzz/seeds/<target>.
# Works on the stable toolchain: RUSTC_BOOTSTRAP=1 lets it accept the -Z
# flags cargo-fuzz passes (or use a nightly toolchain: FUZZ_TOOLCHAIN=+nightly).
#
#   bash fuzz/run.sh [SECS] [TARGET...]
#   FUZZ_SMOKE=1 bash fuzz/run.sh [SECS]   # without cargo-fuzz: the same functions,
#                                          # random and mutated inputs, as a plain test
#
# Crashes land in fuzz/artifacts/<target>/; a summary line per target is printed.
set -uo pipefail
cd "$(dirname "$0")"
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(bootstrap_hello bootstrap_admission bootstrap_frames unique_id config_values tcp_handle verbs_wire shm_handle)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}

if [ "${FUZZ_SMOKE:-0}" = 1 ]; then
  FUZZ_SMOKE_SECS=$secs cargo test --release -- --nocapture
  exit $?
fi
if ! cargo fuzz --help >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz"
  cargo install cargo-fuzz || exit 2
fi
tc=${FUZZ_TOOLCHAIN:-}
[ -n "$tc" ] || export RUSTC_BOOTSTRAP=1
fail=0
summary=()
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  cp -n seeds/"$t"/* "corpus/$t/" 2>/dev/null || true
  log=$(mktemp)
  # -rss_limit_mb: a decoder must not allocate without bound; -timeout: nor hang.
  cargo $tc fuzz run "$t" "corpus/$t" -- -max_total_time="$secs" -rss_limit_mb=1024 -timeout=10 -print_final_stats=1 >"$log" 2>&1
  rc=$?
  runs=$(awk '/stat::number_of_executed_units/ { print $NF }' "$log")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  if [ $rc = 0 ]; then
    summary+=("$t: ${secs} s, ${runs:-?} runs, ${cov:-cov: ?}, no crash")
  else
    fail=1
    summary+=("$t: FAILED (exit $rc) after ${runs:-?} runs; see fuzz/artifacts/$t and $log")
    tail -40 "$log"
  fi
  [ $rc = 0 ] && rm -f "$log"
done
printf '%s\n' "${summary[@]}"
exit $fail
