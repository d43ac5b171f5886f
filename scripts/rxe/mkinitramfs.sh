#!/bin/bash
# mkinitramfs.sh — packs the guest's root filesystem:
#   busybox (static) + its applets, the kernel modules of the rxe / virtio-net
#   chain (plus sch_netem), iproute2's `ip`, `rdma` and `tc`, libibverbs
#   with the rxe provider, ibv_devinfo / ibv_rc_pingpong, our /init, and a
#   payload directory (test binaries, nccl-rs binaries, the scripts that run
#   them) at /payload.
# Shared libraries are copied for every ELF file of the payload, at any
# depth, and for the tools (found with ldd), plus what is dlopen'ed and so invisible to ldd (libibverbs itself for
# our binaries, the rxe provider for libibverbs).
#
# Usage: mkinitramfs.sh <kernel-dir> <kver> <payload-dir> <out.cpio.gz>
set -euo pipefail
KDIR=$1 KVER=$2 PAYLOAD=$3 OUT=$4
HERE=$(cd "$(dirname "$0")" && pwd)
LIBDIR=/usr/lib/x86_64-linux-gnu
ROOT=$(mktemp -d "${TMPDIR:-/tmp}/rxe-root.XXXXXX")
trap 'rm -rf "$ROOT"' EXIT

# Debian's merged-/usr layout, so every path a host binary expects exists.
mkdir -p "$ROOT"/usr/{bin,sbin,lib64} "$ROOT$LIBDIR" "$ROOT"/{etc,proc,sys,dev,tmp,run,root}
ln -s usr/bin "$ROOT/bin"; ln -s usr/sbin "$ROOT/sbin"; ln -s usr/lib "$ROOT/lib"; ln -s usr/lib64 "$ROOT/lib64"

add_lib() {   # add_lib <path>: copy one shared object (dereferenced)
  local src=$1 dst
  case "$src" in
    */ld-linux-x86-64.so.2) dst="$ROOT/usr/lib64/ld-linux-x86-64.so.2" ;;
    *) dst="$ROOT$LIBDIR/$(basename "$src")" ;;
  esac
  [ -e "$dst" ] || cp -L "$src" "$dst"
}
add_deps() {  # add_deps <elf>: copy what ldd says it needs
  ldd "$1" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\/.*ld-linux/ {print $1}' |
    while read -r lib; do add_lib "$lib"; done
}
add_bin() {   # add_bin <name-or-path> [dest-dir]
  local src
  src=$(command -v "$1") || { echo "mkinitramfs: $1 not found on the host" >&2; exit 1; }
  cp -L "$src" "$ROOT${2:-/usr/bin}/$(basename "$src")"
  add_deps "$src"
}

# --- userland --------------------------------------------------------------
cp /bin/busybox "$ROOT/usr/bin/busybox"
for b in ip rdma tc ibv_devinfo ibv_devices ibv_rc_pingpong; do add_bin "$b"; done
for applet in $("$ROOT/usr/bin/busybox" --list); do
  [ -e "$ROOT/usr/bin/$applet" ] || ln -s busybox "$ROOT/usr/bin/$applet"
done
# The kernel's request_module() runs /sbin/modprobe.
ln -sf ../bin/busybox "$ROOT/usr/sbin/modprobe"

# libibverbs (dlopen'ed by nccl-rs) and the rxe provider (dlopen'ed by
# libibverbs, found through /etc/libibverbs.d/rxe.driver).
add_lib "$LIBDIR/libibverbs.so.1"; add_deps "$LIBDIR/libibverbs.so.1"
mkdir -p "$ROOT$LIBDIR/libibverbs" "$ROOT/etc/libibverbs.d"
for p in "$LIBDIR"/libibverbs/librxe-rdmav*.so; do cp -L "$p" "$ROOT$LIBDIR/libibverbs/"; add_deps "$p"; done
cp /etc/libibverbs.d/rxe.driver "$ROOT/etc/libibverbs.d/"
# glibc dlopens libgcc_s for unwinding (Rust panics, pthread_cancel).
add_lib "$LIBDIR/libgcc_s.so.1"

# --- kernel modules (with their dependencies, from modules.dep) -------------
# sch_netem: loss inside the guests of two-guests.sh.
MODS="virtio_pci virtio_net crc32_generic rdma_rxe sch_netem"
SRC="$KDIR/lib/modules/$KVER"
DST="$ROOT/usr/lib/modules/$KVER"
mkdir -p "$DST"
cp "$SRC"/modules.order "$SRC"/modules.builtin "$SRC"/modules.builtin.modinfo "$DST/"
for m in $MODS; do
  if grep -qE "/$m\.ko(\.xz|\.zst)?$" "$SRC/modules.builtin"; then continue; fi
  line=$(grep -E "/$m\.ko(\.xz|\.zst)?:" "$SRC/modules.dep") || { echo "mkinitramfs: module $m not in $KVER" >&2; exit 1; }
  for f in ${line/:/}; do
    mkdir -p "$DST/$(dirname "$f")"
    cp "$SRC/$f" "$DST/$f"
  done
done
# busybox's modprobe/insmod want plain .ko files.
find "$DST" -name '*.ko.xz' -exec xz -d {} +
find "$DST" -name '*.ko.zst' -exec zstd -q -d --rm {} +
depmod -b "$ROOT" "$KVER"

# --- configuration, init and payload ---------------------------------------
echo "root:x:0:0:root:/root:/bin/sh" > "$ROOT/etc/passwd"
echo "root:x:0:" > "$ROOT/etc/group"
printf '127.0.0.1 localhost\n10.0.2.15 guest\n' > "$ROOT/etc/hosts"
install -m 755 "$HERE/init" "$ROOT/init"
mkdir -p "$ROOT/payload"
cp -a "$PAYLOAD"/. "$ROOT/payload/"
find "$ROOT/payload" -type f | while read -r f; do
  if [ "$(head -c 4 "$f" | tail -c 3)" = ELF ]; then add_deps "$f"; fi
done

(cd "$ROOT" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) > "$OUT"
echo "initramfs $OUT: $(du -h "$OUT" | cut -f1)" >&2
