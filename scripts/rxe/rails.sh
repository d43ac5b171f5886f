#!/bin/bash
# rails.sh — the multi-rail soft-RoCE check: one QEMU guest with two NICs,
# rxe0 on eth0 and rxe1 on eth1, runs (guest-rails.sh) the verbs
# transport's tests with --include-ignored on rxe0 alone, again with both
# devices as rails (NCCL_IB_HCA==rxe0,rxe1), then the multi-rail hardware
# test: a VerbsNet over both devices, connected to itself, moves messages
# up to 8 MiB bit for bit and each device sends at least its share of the
# large one.
#
#   bash scripts/rxe/rails.sh      # as root (apt-get), like run.sh
#
# Exits with the guest's verdict (0 = passed; 124 timeout; 200 no report).
# With RXE_RAILS_COLL=1 it also builds ncclrun, matrix_worker and
# all_reduce_perf, and the guest runs guest-coll.sh's steps with
# NCCL_IB_HCA==rxe0,rxe1 (RXE_MATRIX_RANKS, default "2").
#
# Env: RXE_WORK (cache, default /tmp/nccl-rs-rxe), RXE_SKIP_BUILD=1 (reuse
# the last build), RXE_TIMEOUT (guest limit, default 600 s),
# RXE_SMP/RXE_MEM, RXE_CARGO_ROOT, as in run.sh.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
WORK=${RXE_WORK:-/tmp/nccl-rs-rxe}
mkdir -p "$WORK"
t0=$(date +%s)
stamp() { echo "[rxe-rails] $(( $(date +%s) - t0 ))s: $*"; }

PAYLOAD="$WORK/rails-payload"
if [ "${RXE_SKIP_BUILD:-0}" != 1 ]; then
  stamp "building the transport-verbs test binaries"
  (cd "${RXE_CARGO_ROOT:-$REPO}" && cargo test --no-run --release -p transport-verbs --lib --test loopback \
      --message-format=json-render-diagnostics) > "$WORK/rails-build.json"
  rm -rf "$PAYLOAD"; mkdir -p "$PAYLOAD/tests"
  for t in transport_verbs loopback; do
    exe=$(grep '"reason":"compiler-artifact"' "$WORK/rails-build.json" | grep '"test":true' |
      sed -n 's/.*"executable":"\([^"]*\/'"$t"'-[^"]*\)".*/\1/p' | tail -n 1)
    [ -n "$exe" ] && [ -x "$exe" ] || { echo "[rxe-rails] test binary $t was not built" >&2; exit 1; }
    cp "$exe" "$PAYLOAD/tests/$t"
    if [ "${RXE_STRIP:-1}" = 1 ] && command -v strip >/dev/null; then strip --strip-debug "$PAYLOAD/tests/$t"; fi
  done
fi
if [ "${RXE_RAILS_COLL:-0}" = 1 ] && [ "${RXE_SKIP_BUILD:-0}" != 1 ]; then
  stamp "building ncclrun matrix_worker all_reduce_perf"
  (cd "${RXE_CARGO_ROOT:-$REPO}" && cargo build --release -p nccl-perf -p nccl-tests-suite --bins \
      --message-format=json-render-diagnostics) > "$WORK/rails-bins.json"
  mkdir -p "$PAYLOAD/bin"
  for b in ncclrun matrix_worker all_reduce_perf; do
    exe=$(grep '"reason":"compiler-artifact"' "$WORK/rails-bins.json" |
      sed -n 's/.*"executable":"\([^"]*\/'"$b"'\)".*/\1/p' | tail -n 1)
    [ -n "$exe" ] && [ -x "$exe" ] || { echo "[rxe-rails] binary $b was not built" >&2; exit 1; }
    cp "$exe" "$PAYLOAD/bin/$b"
    if [ "${RXE_STRIP:-1}" = 1 ] && command -v strip >/dev/null; then strip --strip-debug "$PAYLOAD/bin/$b"; fi
  done
  install -m 755 "$HERE/guest-coll.sh" "$PAYLOAD/guest-coll.sh"
  { for v in RXE_LARGE_EVERY RXE_PERF_ARGS RXE_STEP_TIMEOUT; do
      if [ -n "${!v:-}" ]; then printf "%s='%s'\n" "$v" "${!v}"; fi
    done
    printf "RXE_MATRIX_RANKS='%s'\n" "${RXE_MATRIX_RANKS:-2}"; } > "$PAYLOAD/coll.env"
fi
for t in transport_verbs loopback; do
  [ -x "$PAYLOAD/tests/$t" ] || { echo "[rxe-rails] no payload; run without RXE_SKIP_BUILD" >&2; exit 1; }
done
install -m 755 "$HERE/guest-rails.sh" "$PAYLOAD/guest-rails.sh"

stamp "host setup"
eval "$("$HERE/setup-host.sh")"
"$HERE/mkinitramfs.sh" "$KDIR" "$KVER" "$PAYLOAD" "$WORK/rails-initrd.cpio.gz"
stamp "kernel $KVER, initramfs built; booting (two NICs, rxe0 + rxe1)"
set +e
RXE_NETDEV2="user,id=n1,net=10.0.4.0/24" \
  "$HERE/boot.sh" "$KDIR/boot/vmlinuz-$KVER" "$WORK/rails-initrd.cpio.gz" "$WORK/console-rails.log" \
  rxerails=2
rc=$?
set -e
grep -E 'guest-rails|guest-coll\] (END|FAIL|rank)|^rail [0-9]|test result|RXE-RESULT|FAILED|panicked' "$WORK/console-rails.log" |
  sed 's/^/[rxe-rails] summary: /' || true
[ "$rc" = 0 ] || echo "[rxe-rails] FAILED: the guest exited $rc (see $WORK/console-rails.log)" >&2
stamp "done: rc=$rc, stage time $(( $(date +%s) - t0 )) s"
exit $rc
