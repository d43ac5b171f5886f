#!/bin/sh
# guest-coll.sh — runs inside the soft-RoCE guest after guest-tests.sh (copied
# to /payload by run.sh). Every step runs over verbs on rxe0:
#   1. matrix_worker under `ncclrun -n N` for each N in RXE_MATRIX_RANKS
#      ("2 4"): every collective x datatype x op x in/out-of-place x count x
#      root, exact results, 1 in RXE_LARGE_EVERY large (1,000,003-element)
#      cases plus one per collective;
#   2. `ncclrun -n 2 all_reduce_perf -b 8 -e 1M -f 4 -c 1` (its table goes
#      to the console, hence to the host's log).
# Each rank's stderr (NCCL_DEBUG=INFO) goes to its own file, from which the
# script asserts that every rank chose NET/IB on rxe0 (and that none fell
# back to NET/Socket or used shared memory); a step passes only if its exit
# status is 0 and that check passes. Exits with the number of failed steps.
# Environment from /init: RXE_DEV, RXE_ADDR; from run.sh (via
# /payload/coll.env): RXE_MATRIX_RANKS, RXE_LARGE_EVERY, RXE_PERF_ARGS,
# RXE_STEP_TIMEOUT; from guest-rails.sh: RXE_COLL_HCA (NCCL_IB_HCA, default
# "=$RXE_DEV") and RXE_COLL_DEVS (the devices every rank must log as its
# NET/IB ports, default $RXE_DEV).
[ -f /payload/coll.env ] && . /payload/coll.env
B=/payload/bin
DEV=${RXE_DEV:-rxe0}
DEVS=${RXE_COLL_DEVS:-$DEV}
export NCCL_NET=IB NCCL_IB_HCA="${RXE_COLL_HCA:-=$DEV}" NCCL_SOCKET_IFNAME=eth0 NCCL_DEBUG=INFO
# Ranks of one guest share a host: without this the core would connect them
# through shared memory and verbs would carry nothing.
export NCCL_SHM_DISABLE=1
export NCCL_RS_LARGE_EVERY=${RXE_LARGE_EVERY:-100000}
export NO_COLOR=1 RUST_BACKTRACE=1
ESC=$(printf '\033')
now() { cut -d' ' -f1 /proc/uptime; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }

# check_ib <logdir> <nranks>: every rank's log names each of DEVS as a NET/IB port,
# rank 0's says the communicator runs on IB, and nothing fell back.
check_ib() {
  ok=0 r=0
  while [ "$r" -lt "$2" ]; do
    f="$1/rank$r.log"
    sed -i "s/$ESC\[[0-9;]*m//g" "$f" 2>/dev/null
    for d in $DEVS; do
      line=$(grep -m1 "NET/IB: using $d:1 \[RoCE\]" "$f")
      if [ -n "$line" ]; then
        echo "[guest-coll] rank $r chose verbs: ${line#*INFO }"
      else
        echo "[guest-coll] FAIL: rank $r has no 'NET/IB: using $d:1 [RoCE]' line"; ok=1
      fi
    done
    if grep -qE 'falling back to NET/Socket|transport=(SHM|Socket)' "$f"; then
      echo "[guest-coll] FAIL: rank $r did not use NET/IB:"; grep -E 'falling back|transport=' "$f"; ok=1
    fi
    r=$((r + 1))
  done
  line=$(grep -m1 'communicator ready.*transport=IB' "$1/rank0.log")
  if [ -n "$line" ]; then
    echo "[guest-coll] rank 0: ${line#*INFO }"
  else
    echo "[guest-coll] FAIL: rank 0 has no 'communicator ready ... transport=IB' line"; ok=1
  fi
  return $ok
}

# step <name> <nranks> <cmd...>: runs cmd under ncclrun with per-rank stderr
# logs, then checks exit status and transport.
fail=0
step() {
  name=$1 n=$2; shift 2
  dir=/tmp/coll-$name
  mkdir -p "$dir"
  echo "[guest-coll] BEGIN $name: ncclrun -n $n $*"
  start=$(now)
  $B/ncclrun -n "$n" --timeout "${RXE_STEP_TIMEOUT:-300}" -- \
    sh -c 'exec "$@" 2> "'"$dir"'/rank$RANK.log"' rank "$@"
  rc=$?
  wall=$(since "$start")
  check_ib "$dir" "$n"; ib=$?
  if [ $rc != 0 ] || [ $ib != 0 ]; then
    r=0
    while [ "$r" -lt "$n" ]; do
      echo "[guest-coll] rank $r stderr (last 40 lines):"
      tail -n 40 "$dir/rank$r.log" | sed "s/^/  r$r: /"
      r=$((r + 1))
    done
    fail=$((fail + 1))
  fi
  echo "[guest-coll] END $name rc=$rc ib=$([ $ib = 0 ] && echo ok || echo FAIL) wall=${wall}s"
}

for n in ${RXE_MATRIX_RANKS:-2 4}; do
  step "matrix-n$n" "$n" $B/matrix_worker
done
# shellcheck disable=SC2086
step perf-n2 2 $B/all_reduce_perf ${RXE_PERF_ARGS:--b 8 -e 1M -f 4 -c 1}
exit $fail
