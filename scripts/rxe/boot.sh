#!/bin/bash
# boot.sh — boots the soft-RoCE guest under QEMU (TCG: KVM is not usable on
# our machines) and returns the guest's verdict.
#
# Usage: boot.sh <vmlinuz> <initrd.cpio.gz> <console.log> [extra kernel args]
# Env:   RXE_TIMEOUT (s, default 600), RXE_SMP (2), RXE_MEM (2G),
#        RXE_NETDEV (QEMU -netdev for eth0, default "user,id=n0"; the
#        device is virtio-net-pci on netdev n0), RXE_MAC (its MAC address),
#        RXE_PREFIX (prefix of the console lines echoed, default "  | "),
#        RXE_NETDEV2 (QEMU -netdev for a second NIC, eth1, with id=n1;
#        unset: no second NIC)
#
# The guest's /init prints "RXE-RESULT rc=N" and writes N to the
# isa-debug-exit port, so QEMU exits with 2N+1. Both must agree; anything
# else (QEMU exiting 0 after a guest panic, a timeout, a missing line) is a
# failure with exit code 200 (guest did not report) or 124 (timeout).
set -uo pipefail
KERNEL=$1 INITRD=$2 LOG=$3
shift 3
TIMEOUT=${RXE_TIMEOUT:-600}
start=$(date +%s.%N)
# The console goes to the log and, prefixed, to our stdout for CI to show.
timeout -k 10 "$TIMEOUT" qemu-system-x86_64 \
  -accel tcg,thread=multi -cpu max -smp "${RXE_SMP:-2}" -m "${RXE_MEM:-2G}" \
  -nographic -no-reboot \
  -kernel "$KERNEL" -initrd "$INITRD" \
  -append "console=ttyS0 panic=-1 quiet loglevel=3 $*" \
  -netdev "${RXE_NETDEV:-user,id=n0}" -device "virtio-net-pci,netdev=n0${RXE_MAC:+,mac=$RXE_MAC}" \
  ${RXE_NETDEV2:+-netdev "$RXE_NETDEV2" -device virtio-net-pci,netdev=n1} \
  -device isa-debug-exit,iobase=0xf4,iosize=0x04 \
  < /dev/null 2>&1 | tr -d '\r' | tee "$LOG" | sed -u "s#^#${RXE_PREFIX:-  | }#"
qrc=${PIPESTATUS[0]}
wall=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
marker=$(sed -n 's/.*RXE-RESULT rc=\([0-9]*\).*/\1/p' "$LOG" | tail -n 1)
if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
  echo "boot.sh: guest timed out after ${TIMEOUT}s (wall ${wall}s)" >&2
  exit 124
fi
if [ $((qrc & 1)) = 1 ] && [ -n "$marker" ] && [ $(((qrc - 1) / 2)) = "$marker" ]; then
  echo "boot.sh: guest reported rc=$marker (qemu exit $qrc, wall ${wall}s)" >&2
  exit "$marker"
fi
echo "boot.sh: guest did not report (qemu exit $qrc, console marker '${marker:-none}', wall ${wall}s); see $LOG" >&2
exit 200
