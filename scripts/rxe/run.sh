#!/bin/bash
# run.sh — the soft-RoCE stage: runs nccl-rs's verbs tests against a real
# RDMA device (rdma_rxe) inside a QEMU guest, from a machine whose own kernel
# has no RDMA.
#
#   bash scripts/rxe/run.sh
#
# 1. builds the test binaries (cargo test --no-run --release -p transport-verbs)
#    and ncclrun, all_reduce_perf, matrix_worker (cargo build --release
#    -p nccl-perf -p nccl-tests-suite --bins);
# 2. installs packages and fetches Debian's kernel (setup-host.sh; cached);
# 3. packs an initramfs with busybox, the rxe modules, libibverbs + the rxe
#    provider, ibv_* tools, the binaries and the guest scripts
#    (mkinitramfs.sh);
# 4. boots it (boot.sh): the guest creates rxe0, runs ibv_devinfo and an
#    ibv_rc_pingpong loopback, then the tests with --include-ignored
#    (guest-tests.sh), then matrix_worker at 2 and 4 ranks and
#    all_reduce_perf over verbs, asserting NET/IB from the logs
#    (guest-coll.sh).
# Exits with the guest's failure count (0 = all passed); 124 on timeout; 200
# if the guest never reported. Needs root for apt-get (CI runs as root).
#
# Env: RXE_WORK (cache dir, default /tmp/nccl-rs-rxe), RXE_CARGO_ARGS (default
# "-p transport-verbs"), RXE_TEST_ARGS (filter/args for every test binary),
# RXE_TIMEOUT (guest wall-clock limit, default 600 s), RXE_SKIP_BUILD=1
# (reuse the last build's binaries), RXE_CARGO_ROOT (workspace to build in,
# default this repository), RXE_BINS / RXE_BIN_CARGO_ARGS (programs for
# /payload/bin and how to build them), RXE_STRIP=0 (keep debug info),
# RXE_MATRIX_RANKS ("2 4"), RXE_LARGE_EVERY (100000), RXE_PERF_ARGS
# ("-b 8 -e 1M -f 4 -c 1"), RXE_STEP_TIMEOUT (300 s per ncclrun step).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
WORK=${RXE_WORK:-/tmp/nccl-rs-rxe}
mkdir -p "$WORK"
t0=$(date +%s)
stamp() { echo "[rxe] $(( $(date +%s) - t0 ))s: $*"; }

# 1. binaries ------------------------------------------------------------------
# Test executables of RXE_CARGO_ARGS into payload/tests, and the nccl-rs
# programs named in RXE_BINS into payload/bin.
PAYLOAD="$WORK/payload"
BINS=${RXE_BINS:-ncclrun all_reduce_perf matrix_worker}
if [ "${RXE_SKIP_BUILD:-0}" != 1 ]; then
  stamp "building test binaries (cargo test --no-run --release ${RXE_CARGO_ARGS:--p transport-verbs})"
  # shellcheck disable=SC2086
  (cd "${RXE_CARGO_ROOT:-$REPO}" && cargo test --no-run --release ${RXE_CARGO_ARGS:--p transport-verbs} \
      --message-format=json-render-diagnostics) > "$WORK/build.json"
  stamp "building $BINS (cargo build --release ${RXE_BIN_CARGO_ARGS:--p nccl-perf -p nccl-tests-suite --bins})"
  # shellcheck disable=SC2086
  (cd "${RXE_CARGO_ROOT:-$REPO}" && cargo build --release ${RXE_BIN_CARGO_ARGS:--p nccl-perf -p nccl-tests-suite --bins} \
      --message-format=json-render-diagnostics) > "$WORK/bins.json"
  rm -rf "$PAYLOAD"; mkdir -p "$PAYLOAD/tests" "$PAYLOAD/bin"
  # Test executables: compiler artifacts with "executable" set and a test
  # profile.
  grep '"reason":"compiler-artifact"' "$WORK/build.json" | grep '"test":true' |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | sort -u > "$WORK/tests.txt"
  [ -s "$WORK/tests.txt" ] || { echo "[rxe] no test binaries built" >&2; exit 1; }
  # Debug info only makes the initramfs bigger; symbols stay for backtraces.
  put() { cp "$1" "$2"; if [ "${RXE_STRIP:-1}" = 1 ] && command -v strip >/dev/null; then strip --strip-debug "$2"; fi; }
  while read -r exe; do
    # Binaries are named <target>-<hash>: keep the target name.
    name=$(basename "$exe"); name=${name%-*}
    put "$exe" "$PAYLOAD/tests/$name"
  done < "$WORK/tests.txt"
  for b in $BINS; do
    exe=$(grep '"reason":"compiler-artifact"' "$WORK/bins.json" |
      sed -n 's/.*"executable":"\([^"]*\/'"$b"'\)".*/\1/p' | tail -n 1)
    [ -n "$exe" ] && [ -x "$exe" ] || { echo "[rxe] binary $b was not built (see $WORK/bins.json)" >&2; exit 1; }
    put "$exe" "$PAYLOAD/bin/$b"
  done
  stamp "test binaries: $(cd "$PAYLOAD/tests" && echo *); programs: $(cd "$PAYLOAD/bin" && echo *)"
fi
[ -d "$PAYLOAD/tests" ] && [ -d "$PAYLOAD/bin" ] || { echo "[rxe] no payload; run without RXE_SKIP_BUILD" >&2; exit 1; }
for s in guest-tests.sh guest-coll.sh guest-pair.sh; do install -m 755 "$HERE/$s" "$PAYLOAD/$s"; done
printf '%s\n' "${RXE_TEST_ARGS:-}" > "$PAYLOAD/test-args"
# Knobs of guest-coll.sh / guest-pair.sh, sourced in the guest.
{
  for v in RXE_MATRIX_RANKS RXE_LARGE_EVERY RXE_PERF_ARGS RXE_STEP_TIMEOUT RXE_PAIR_ARGS RXE_PAIR_IB_TIMEOUT; do
    if [ -n "${!v:-}" ]; then printf "%s='%s'\n" "$v" "${!v}"; fi
  done
} > "$PAYLOAD/coll.env"

# 2. packages and kernel ------------------------------------------------------
stamp "host setup"
eval "$("$HERE/setup-host.sh")"
stamp "kernel $KVER ready"

# 3. initramfs ------------------------------------------------------------------
"$HERE/mkinitramfs.sh" "$KDIR" "$KVER" "$PAYLOAD" "$WORK/initrd.cpio.gz"
stamp "initramfs built"

# 4. boot ------------------------------------------------------------------------
stamp "booting the guest (TCG); console follows"
set +e
"$HERE/boot.sh" "$KDIR/boot/vmlinuz-$KVER" "$WORK/initrd.cpio.gz" "$WORK/console.log"
rc=$?
set -e
grep -E '^test result|\[guest-tests\] END|END ibv_rc_pingpong|\[guest-coll\] (END|FAIL|rank)|^rank [0-9]+ of|\] END /payload|RXE-RESULT' \
  "$WORK/console.log" | sed 's/^/[rxe] summary: /' || true
# all_reduce_perf's table, as printed in the guest (stdout, not the logs).
sed -n '/\[guest-coll\] BEGIN perf-n2/,/\[guest-coll\] END perf-n2/p' "$WORK/console.log" |
  grep -vE '\[guest-coll\] (BEGIN|rank)' | sed 's/^/[rxe] perf: /' || true
[ "$rc" = 0 ] || echo "[rxe] FAILED: the soft-RoCE stage exited $rc (see the console above or $WORK/console.log)" >&2
stamp "done: rc=$rc, stage time $(( $(date +%s) - t0 )) s (console log: $WORK/console.log)"
exit $rc
