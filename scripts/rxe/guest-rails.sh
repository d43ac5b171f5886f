#!/bin/sh
# guest-rails.sh — runs inside the soft-RoCE guest of rails.sh (started by
# /init when the kernel command line has rxerails=2): rxe0 on eth0 and rxe1
# on eth1 are two rails. Runs the transport's multi-rail hardware test,
# which builds a VerbsNet over both devices, connects it to itself and
# checks that messages (100 B, 48 KiB, 8 MiB, 3 MiB + 12345 B) arrive bit
# for bit and that the 8 MiB one made each device send at least its share
# in MTU-sized packets (hw_counters/sent_pkts). Prints both devices'
# non-zero counters. Exits non-zero on failure.
# Environment from /init: RXE_ADDR.
export VERBS_TEST_RAILS=rxe0,rxe1 RUST_BACKTRACE=1 NCCL_DEBUG=INFO
T=/payload/tests/transport_verbs
[ -x "$T" ] || { echo "[guest-rails] no $T"; exit 1; }
for d in rxe0 rxe1; do
  echo "[guest-rails] $d: $(cat /sys/class/infiniband/$d/ports/1/state) GID[1] $(cat /sys/class/infiniband/$d/ports/1/gids/1)"
done
timeout "${RXE_TEST_TIMEOUT:-400}" "$T" --ignored --exact hw_tests::rails_stripe_large_messages_over_every_device \
  --test-threads=1 --nocapture
rc=$?
for d in rxe0 rxe1; do
  c=""
  for f in /sys/class/infiniband/$d/ports/1/hw_counters/*; do
    v=$(cat "$f" 2>/dev/null) || continue
    [ "$v" != 0 ] && c="$c ${f##*/}=$v"
  done
  echo "[guest-rails] $d counters:$c"
done
echo "[guest-rails] END rc=$rc"
exit $rc
