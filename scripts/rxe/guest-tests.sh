#!/bin/sh
# guest-tests.sh — runs inside the soft-RoCE guest (copied to /payload by
# run.sh). Runs every test binary in /payload/tests with --include-ignored,
# so the hardware tests use rxe0 and the unit tests run too. Exits non-zero
# if any binary fails. Set RXE_TEST_ARGS on the host to pass a filter.
# Environment from /init: RXE_DEV, RXE_GID_INDEX, RXE_ADDR.
export VERBS_TEST_DEVICE="${RXE_DEV:-rxe0}"
export NCCL_IB_HCA="=${RXE_DEV:-rxe0}"
export RUST_BACKTRACE=1
[ -f /payload/test-args ] && ARGS=$(cat /payload/test-args)
fail=0
for t in /payload/tests/*; do
  [ -x "$t" ] || continue
  name=${t##*/}
  echo "[guest-tests] BEGIN $name"
  start=$(cut -d' ' -f1 /proc/uptime)
  # shellcheck disable=SC2086
  timeout "${RXE_TEST_TIMEOUT:-400}" "$t" --include-ignored --test-threads=1 --show-output $ARGS
  rc=$?
  end=$(cut -d' ' -f1 /proc/uptime)
  echo "[guest-tests] END $name rc=$rc wall=$(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.1f", b-a}')s"
  [ $rc = 0 ] || fail=$((fail + 1))
done
exit $fail
