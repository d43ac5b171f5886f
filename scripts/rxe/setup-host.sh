#!/bin/bash
# setup-host.sh — host side of the soft-RoCE harness: installs the Debian
# packages it needs (only those missing) and unpacks a Debian kernel that ships
# rdma_rxe as a module. Idempotent; the kernel is cached under $RXE_WORK.
#
# Prints the kernel directory and version as two lines:
#   KDIR=<dir with boot/vmlinuz-* and lib/modules/*>
#   KVER=<version>
#
# Needs root (apt-get). Debian 12 host; works without KVM and without any RDMA
# support in the host kernel.
set -euo pipefail
WORK=${RXE_WORK:-/tmp/nccl-rs-rxe}
mkdir -p "$WORK"
log() { echo "[rxe-setup] $*" >&2; }

# qemu-system-x86: the guest; busybox-static: the guest's userland; kmod:
# depmod; cpio/gzip/xz/zstd: initramfs and module unpacking; ibverbs-*:
# libibverbs, the rxe provider, ibv_devinfo and ibv_rc_pingpong (copied into
# the guest); iproute2: `ip` and `rdma` (copied into the guest).
PKGS="qemu-system-x86 busybox-static kmod cpio gzip xz-utils zstd libibverbs1 ibverbs-providers ibverbs-utils iproute2"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
export DEBIAN_FRONTEND=noninteractive
if [ -n "$missing" ] || [ ! -d "$WORK/kernel" ]; then
  t=$(date +%s)
  apt-get update -qq >&2
  log "apt lists updated in $(( $(date +%s) - t )) s"
fi
if [ -n "$missing" ]; then
  t=$(date +%s)
  log "installing:$missing"
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing >&2
  log "packages installed in $(( $(date +%s) - t )) s"
fi

# The kernel package name moves with Debian updates: resolve it through the
# linux-image-amd64 metapackage unless RXE_KPKG pins one.
KPKG=${RXE_KPKG:-}
if [ -z "$KPKG" ] && [ -f "$WORK/kernel/.kpkg" ]; then
  KPKG=$(cat "$WORK/kernel/.kpkg")
fi
if [ -z "$KPKG" ]; then
  KPKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
fi
[ -n "$KPKG" ] || { log "cannot resolve the kernel package (apt-cache depends linux-image-amd64)"; exit 1; }
KVER=${KPKG#linux-image-}
if [ ! -f "$WORK/kernel/boot/vmlinuz-$KVER" ] || [ ! -f "$WORK/kernel/lib/modules/$KVER/modules.dep" ]; then
  t=$(date +%s)
  rm -rf "$WORK/kernel" "$WORK"/linux-image-*.deb
  (cd "$WORK" && apt-get download "$KPKG" >&2)
  dpkg-deb -x "$WORK/${KPKG}"_*.deb "$WORK/kernel"
  # The package ships no modules.dep: generate it.
  depmod -b "$WORK/kernel" "$KVER"
  echo "$KPKG" > "$WORK/kernel/.kpkg"
  rm -f "$WORK"/linux-image-*.deb
  log "kernel $KVER downloaded and unpacked in $(( $(date +%s) - t )) s"
fi
grep -q "/rdma_rxe.ko" "$WORK/kernel/lib/modules/$KVER/modules.dep" \
  || { log "kernel $KVER has no rdma_rxe module"; exit 1; }
echo "KDIR=$WORK/kernel"
echo "KVER=$KVER"
