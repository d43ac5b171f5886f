#!/bin/bash
# two-guests.sh — two soft-RoCE guests joined by a QEMU `-netdev socket`
# link, with netem loss inside both, run a 2-rank job over verbs: one rank
# per guest, so every byte crosses the lossy link and RC has to recover.
#
#   bash scripts/rxe/two-guests.sh      # as root (apt-get), like run.sh
#
# Guest A (rank 0, hosts the bootstrap root) is 10.0.3.1/24 and listens on
# 127.0.0.1:PORT; guest B (rank 1) is 10.0.3.2/24 and connects to it. Each
# guest's /init creates rxe0 on eth0 and runs /payload/guest-pair.sh: netem
# loss on eth0, wait for the peer, then RANK=r WORLD_SIZE=2
# MASTER_ADDR=10.0.3.1 all_reduce_perf -b 8 -e 1M -f 4 -c 1 -n 5 -w 1 with
# NCCL_NET=IB and NCCL_IB_TIMEOUT=14 (exits non-zero on wrong data), the
# NET/IB check on its log, netem's drop count and rxe's counters. Passes only
# if both guests report rc=0.
#
# Env: RXE_LOSS (netem loss in each guest, default 1%; 0 = none),
# RXE_PAIR_PROG (program in /payload/bin, default all_reduce_perf; e.g.
# matrix_worker, with RXE_PAIR_ARGS= and RXE_LARGE_EVERY), RXE_PAIR_ARGS (its
# arguments), RXE_PAIR_IB_TIMEOUT (NCCL_IB_TIMEOUT in the guests, default 14;
# "default" = NCCL's 20, see guest-pair.sh), RXE_PAIR_SMP (vCPUs per guest, default 2),
# RXE_PAIR_MEM (default 1G), RXE_TIMEOUT (per guest, default 600 s),
# RXE_SKIP_BUILD=1 (reuse the binaries), RXE_BINS, RXE_BIN_CARGO_ARGS,
# RXE_WORK, RXE_STEP_TIMEOUT, as in run.sh.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
WORK=${RXE_WORK:-/tmp/nccl-rs-rxe}
mkdir -p "$WORK"
t0=$(date +%s)
stamp() { echo "[rxe-pair] $(( $(date +%s) - t0 ))s: $*"; }

# 1. binaries -------------------------------------------------------------------
PAYLOAD="$WORK/pair-payload"
BINS=${RXE_BINS:-ncclrun all_reduce_perf matrix_worker}
if [ "${RXE_SKIP_BUILD:-0}" != 1 ]; then
  stamp "building $BINS (cargo build --release ${RXE_BIN_CARGO_ARGS:--p nccl-perf -p nccl-tests-suite --bins})"
  # shellcheck disable=SC2086
  (cd "${RXE_CARGO_ROOT:-$REPO}" && cargo build --release ${RXE_BIN_CARGO_ARGS:--p nccl-perf -p nccl-tests-suite --bins} \
      --message-format=json-render-diagnostics) > "$WORK/pair-bins.json"
  rm -rf "$PAYLOAD"; mkdir -p "$PAYLOAD/bin"
  for b in $BINS; do
    exe=$(grep '"reason":"compiler-artifact"' "$WORK/pair-bins.json" |
      sed -n 's/.*"executable":"\([^"]*\/'"$b"'\)".*/\1/p' | tail -n 1)
    [ -n "$exe" ] && [ -x "$exe" ] || { echo "[rxe-pair] binary $b was not built" >&2; exit 1; }
    cp "$exe" "$PAYLOAD/bin/$b"
    if [ "${RXE_STRIP:-1}" = 1 ] && command -v strip >/dev/null; then strip --strip-debug "$PAYLOAD/bin/$b"; fi
  done
fi
[ -d "$PAYLOAD/bin" ] || { echo "[rxe-pair] no payload; run without RXE_SKIP_BUILD" >&2; exit 1; }
install -m 755 "$HERE/guest-pair.sh" "$PAYLOAD/guest-pair.sh"
{
  for v in RXE_PAIR_PROG RXE_PAIR_ARGS RXE_PAIR_IB_TIMEOUT RXE_LARGE_EVERY RXE_STEP_TIMEOUT; do
    if [ -n "${!v+x}" ]; then printf "%s='%s'\n" "$v" "${!v}"; fi
  done
} > "$PAYLOAD/coll.env"

# 2. packages, kernel, initramfs (one image for both guests) ---------------------
stamp "host setup"
eval "$("$HERE/setup-host.sh")"
"$HERE/mkinitramfs.sh" "$KDIR" "$KVER" "$PAYLOAD" "$WORK/pair-initrd.cpio.gz"
stamp "kernel $KVER, initramfs built"

# 3. boot A (listens), then B (connects) -------------------------------------------
port=""
for _ in $(seq 50); do
  p=$(( 20000 + RANDOM % 20000 ))
  if ! ss -Hltn "sport = :$p" 2>/dev/null | grep -q .; then port=$p; break; fi
done
[ -n "$port" ] || { echo "[rxe-pair] no free port" >&2; exit 1; }
LOSS=${RXE_LOSS:-1%}
export RXE_SMP=${RXE_PAIR_SMP:-2} RXE_MEM=${RXE_PAIR_MEM:-1G}
KERNEL="$KDIR/boot/vmlinuz-$KVER"
stamp "booting guest A (rank 0, 10.0.3.1, listen 127.0.0.1:$port) and guest B (rank 1, 10.0.3.2); loss $LOSS"
RXE_NETDEV="socket,id=n0,listen=127.0.0.1:$port" RXE_MAC=52:54:00:00:03:01 RXE_PREFIX="  A| " \
  "$HERE/boot.sh" "$KERNEL" "$WORK/pair-initrd.cpio.gz" "$WORK/console-A.log" \
  rxeip=10.0.3.1/24 rxepair=0 rxepeer=10.0.3.2 "rxeloss=$LOSS" &
apid=$!
# QEMU's connect side fails at once if nobody listens yet.
for _ in $(seq 100); do
  ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break
  sleep 0.1
done
RXE_NETDEV="socket,id=n0,connect=127.0.0.1:$port" RXE_MAC=52:54:00:00:03:02 RXE_PREFIX="  B| " \
  "$HERE/boot.sh" "$KERNEL" "$WORK/pair-initrd.cpio.gz" "$WORK/console-B.log" \
  rxeip=10.0.3.2/24 rxepair=1 rxepeer=10.0.3.1 "rxeloss=$LOSS" &
bpid=$!
set +e
wait $bpid; brc=$?
wait $apid; arc=$?
set -e

grep -hE 'guest-pair r[01] .*(chose|communicator|netem|counters|END|FAIL)|RXE-RESULT' "$WORK/console-A.log" "$WORK/console-B.log" |
  sed 's/^/[rxe-pair] summary: /' || true
sed -n '/# Collective test starting/,/# Avg bus bandwidth/p' "$WORK/console-A.log" | sed 's/^/[rxe-pair] rank 0: /' || true
stamp "guest A rc=$arc, guest B rc=$brc; stage time $(( $(date +%s) - t0 )) s (logs: $WORK/console-A.log, $WORK/console-B.log)"
if [ "$arc" != 0 ] || [ "$brc" != 0 ]; then
  echo "[rxe-pair] FAILED" >&2
  exit 1
fi
