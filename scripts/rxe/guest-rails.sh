#!/bin/sh
# guest-rails.sh — runs inside the soft-RoCE guest of rails.sh (started by
# /init when the kernel command line has rxerails=2): rxe0 on eth0 and rxe1
# on eth1 are two rails.
# 1. every test binary in /payload/tests with --include-ignored on rxe0
#    alone (NCCL_IB_HCA==rxe0: one rail, as before rails existed);
# 2. the same with both devices as rails (NCCL_IB_HCA==rxe0,rxe1): the
#    hardware tests' connections then stripe over two rails;
# 3. the multi-rail test (VERBS_TEST_RAILS=rxe0,rxe1): messages of 100 B,
#    48 KiB, 8 MiB and 3 MiB + 12345 B arrive bit for bit, and the 8 MiB one
#    makes each device send at least its share in MTU-sized packets
#    (hw_counters/sent_pkts).
# 4. (optional, see below) collectives under ncclrun over both rails.
# Prints both devices' non-zero counters. Exits with the number of failed
# runs.
export RUST_BACKTRACE=1 VERBS_TEST_DEVICE=rxe0
fail=0
for d in rxe0 rxe1; do
  echo "[guest-rails] $d: $(cat /sys/class/infiniband/$d/ports/1/state) GID[1] $(cat /sys/class/infiniband/$d/ports/1/gids/1)"
done
# run <label> <binary> [args]: one test run, timed; failures are counted.
run() {
  label=$1; shift
  echo "[guest-rails] BEGIN $label"
  t=$(cut -d' ' -f1 /proc/uptime)
  timeout "${RXE_TEST_TIMEOUT:-400}" "$@" --test-threads=1
  rc=$?
  echo "[guest-rails] END $label rc=$rc wall=$(awk -v a="$t" -v b="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN{printf "%.1f", b-a}')s"
  [ $rc = 0 ] || fail=$((fail + 1))
}
for hca in "=rxe0" "=rxe0,rxe1"; do
  for t in /payload/tests/loopback /payload/tests/transport_verbs; do
    NCCL_IB_HCA=$hca run "${t##*/} NCCL_IB_HCA=$hca" "$t" --include-ignored
  done
done
VERBS_TEST_RAILS=rxe0,rxe1 run "rails test" /payload/tests/transport_verbs --ignored --exact \
  hw_tests::rails_stripe_large_messages_over_every_device --nocapture
# 4. with the nccl-rs programs in the payload (rails.sh with RXE_RAILS_COLL=1):
#    guest-coll.sh's matrix and perf steps over both rails; rxe1 must carry
#    a share of the traffic.
if [ -x /payload/bin/ncclrun ] && [ -x /payload/guest-coll.sh ]; then
  before=$(cat /sys/class/infiniband/rxe1/ports/1/hw_counters/sent_pkts)
  RXE_COLL_HCA="=rxe0,rxe1" RXE_COLL_DEVS="rxe0 rxe1" RXE_DEV=rxe0 /payload/guest-coll.sh
  rc=$?
  after=$(cat /sys/class/infiniband/rxe1/ports/1/hw_counters/sent_pkts)
  echo "[guest-rails] END collectives on two rails rc=$rc; rxe1 sent $((after - before)) packets"
  [ $rc = 0 ] || fail=$((fail + 1))
  [ $((after - before)) -ge 1000 ] || { echo "[guest-rails] FAIL: rxe1 carried almost nothing"; fail=$((fail + 1)); }
fi
for d in rxe0 rxe1; do
  c=""
  for f in /sys/class/infiniband/$d/ports/1/hw_counters/*; do
    v=$(cat "$f" 2>/dev/null) || continue
    [ "$v" != 0 ] && c="$c ${f##*/}=$v"
  done
  echo "[guest-rails] $d counters:$c"
done
echo "[guest-rails] END failures=$fail"
exit $fail
