#!/bin/sh
# guest-pair.sh — runs inside each of the two guests of two-guests.sh
# (started by /init when the kernel command line has rxepair=RANK). Both
# guests' eth0 are joined by QEMU's `-netdev socket`; each has rxe0 on it.
#
# 1. adds netem loss on eth0 (RXE_LOSS, e.g. 1%; 0 = none), so RC has to
#    retransmit;
# 2. waits for the peer to answer pings;
# 3. runs one rank of a 2-rank job over verbs: RANK = this guest's rank,
#    MASTER_ADDR = rank 0's guest (RXE_PAIR_PROG, default all_reduce_perf,
#    with RXE_PAIR_ARGS, default "-b 8 -e 1M -f 4 -c 1 -n 5 -w 1": exits
#    non-zero on wrong data), with NCCL_IB_TIMEOUT=RXE_PAIR_IB_TIMEOUT
#    (default 14, see below);
# 4. asserts from its log that it chose NET/IB on rxe0, and prints netem's
#    drop count and rxe's non-zero hardware counters (retransmissions).
# Environment from /init: RXE_RANK, RXE_PEER, RXE_LOSS, RXE_DEV, RXE_ADDR;
# /payload/coll.env may set RXE_PAIR_PROG, RXE_PAIR_ARGS, RXE_PAIR_IB_TIMEOUT,
# RXE_LARGE_EVERY (for matrix_worker), RXE_STEP_TIMEOUT.
[ -f /payload/coll.env ] && . /payload/coll.env
DEV=${RXE_DEV:-rxe0}
LOSS=${RXE_LOSS:-0}
PEER=${RXE_PEER:?rxepeer= missing on the kernel command line}
TC=/usr/bin/tc
CNT=/sys/class/infiniband/$DEV/ports/1/hw_counters
now() { cut -d' ' -f1 /proc/uptime; }
say() { echo "[guest-pair r$RXE_RANK $(now)s] $*"; }
if [ "$RXE_RANK" = 0 ]; then MASTER=$RXE_ADDR; else MASTER=$PEER; fi

if [ "$LOSS" != 0 ]; then
  modprobe sch_netem || { say "modprobe sch_netem failed"; exit 1; }
  $TC qdisc add dev eth0 root netem loss "$LOSS" || { say "tc netem failed"; exit 1; }
  say "netem: $($TC qdisc show dev eth0)"
fi

i=0
until ping -c 1 -W 1 "$PEER" > /dev/null 2>&1; do
  i=$((i + 1))
  [ $i -lt 120 ] || { say "peer $PEER does not answer"; exit 1; }
done
say "peer $PEER answers (after $i failed pings)"

export RANK=$RXE_RANK WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=$MASTER MASTER_PORT=${RXE_PAIR_PORT:-29500}
export NCCL_NET=IB NCCL_IB_HCA="=$DEV" NCCL_SOCKET_IFNAME=eth0 NCCL_DEBUG=INFO NO_COLOR=1 RUST_BACKTRACE=1
# A lost packet with nothing after it (the last of a message, or an ACK) is
# only resent when the ACK timeout expires: 4.096 us x 2^NCCL_IB_TIMEOUT,
# 4.3 s at NCCL's default of 20, which makes even 1% loss take minutes. 14
# (67 ms; 7 retries = 0.5 s of silence before a fatal error) is still far
# above the round trip under emulation (1-6 ms). "default" keeps NCCL's.
T=${RXE_PAIR_IB_TIMEOUT:-14}
[ "$T" = default ] || export NCCL_IB_TIMEOUT=$T
export NCCL_RS_LARGE_EVERY=${RXE_LARGE_EVERY:-100000}
PROG=/payload/bin/${RXE_PAIR_PROG:-all_reduce_perf}
ARGS=${RXE_PAIR_ARGS--b 8 -e 1M -f 4 -c 1 -n 5 -w 1}
say "BEGIN RANK=$RANK MASTER_ADDR=$MASTER_ADDR NCCL_IB_TIMEOUT=${NCCL_IB_TIMEOUT:-default} $PROG $ARGS"
t=$(now)
# shellcheck disable=SC2086
timeout "${RXE_STEP_TIMEOUT:-300}" "$PROG" $ARGS 2> /tmp/rank.log
rc=$?
wall=$(awk -v a="$t" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}')
sed -i "s/$(printf '\033')\[[0-9;]*m//g" /tmp/rank.log
ib=0
line=$(grep -m1 "NET/IB: using $DEV:1 \[RoCE\]" /tmp/rank.log)
if [ -n "$line" ]; then say "chose verbs: ${line#*INFO }"; else say "FAIL: no 'NET/IB: using $DEV:1 [RoCE]' line"; ib=1; fi
if grep -qE 'falling back to NET/Socket|transport=(SHM|Socket)' /tmp/rank.log; then say "FAIL: not NET/IB"; ib=1; fi
if [ "$RANK" = 0 ]; then
  line=$(grep -m1 'communicator ready.*transport=IB' /tmp/rank.log)
  if [ -n "$line" ]; then say "${line#*INFO }"; else say "FAIL: no 'communicator ready ... transport=IB' line"; ib=1; fi
fi
if [ $rc != 0 ] || [ $ib != 0 ]; then
  say "stderr (last 60 lines):"; tail -n 60 /tmp/rank.log | sed 's/^/  | /'
fi
[ "$LOSS" != 0 ] && say "netem: $($TC -s qdisc show dev eth0 | tr '\n' ' ')"
counters=""
for c in "$CNT"/*; do
  v=$(cat "$c" 2>/dev/null) || continue
  [ "$v" != 0 ] && counters="$counters ${c##*/}=$v"
done
say "rxe counters:$counters"
say "END rc=$rc ib=$([ $ib = 0 ] && echo ok || echo FAIL) wall=${wall}s"
[ $rc = 0 ] && [ $ib = 0 ]
