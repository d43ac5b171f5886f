#!/bin/bash
# run.sh — the soft-RoCE stage: runs nccl-rs's verbs tests against a real
# RDMA device (rdma_rxe) inside a QEMU guest, from a machine whose own kernel
# has no RDMA.
#
#   bash scripts/rxe/run.sh
#
# 1. builds the test binaries (cargo test --no-run --release -p transport-verbs);
# 2. installs packages and fetches Debian's kernel (setup-host.sh; cached);
# 3. packs an initramfs with busybox, the rxe modules, libibverbs + the rxe
#    provider, ibv_* tools, the test binaries and guest-tests.sh
#    (mkinitramfs.sh);
# 4. boots it (boot.sh): the guest creates rxe0, runs ibv_devinfo and an
#    ibv_rc_pingpong loopback, then the tests with --include-ignored.
# Exits with the guest's failure count (0 = all passed); 124 on timeout; 200
# if the guest never reported. Needs root for apt-get (CI runs as root).
#
# Env: RXE_WORK (cache dir, default /tmp/nccl-rs-rxe), RXE_CARGO_ARGS (default
# "-p transport-verbs"), RXE_TEST_ARGS (filter/args for every test binary),
# RXE_TIMEOUT (guest wall-clock limit, default 600 s), RXE_SKIP_BUILD=1
# (reuse the last build's binaries), RXE_CARGO_ROOT (workspace to build in,
# default this repository).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
WORK=${RXE_WORK:-/tmp/nccl-rs-rxe}
mkdir -p "$WORK"
t0=$(date +%s)
stamp() { echo "[rxe] $(( $(date +%s) - t0 ))s: $*"; }

# 1. test binaries -----------------------------------------------------------
PAYLOAD="$WORK/payload"
if [ "${RXE_SKIP_BUILD:-0}" != 1 ]; then
  stamp "building test binaries (cargo test --no-run --release ${RXE_CARGO_ARGS:--p transport-verbs})"
  # shellcheck disable=SC2086
  (cd "${RXE_CARGO_ROOT:-$REPO}" && cargo test --no-run --release ${RXE_CARGO_ARGS:--p transport-verbs} \
      --message-format=json-render-diagnostics) > "$WORK/build.json"
  rm -rf "$PAYLOAD"; mkdir -p "$PAYLOAD/tests"
  # Test executables: compiler artifacts with "executable" set and a test
  # profile.
  grep '"reason":"compiler-artifact"' "$WORK/build.json" | grep '"test":true' |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | sort -u > "$WORK/tests.txt"
  [ -s "$WORK/tests.txt" ] || { echo "[rxe] no test binaries built" >&2; exit 1; }
  while read -r exe; do
    # Binaries are named <target>-<hash>: keep the target name.
    name=$(basename "$exe"); name=${name%-*}
    cp "$exe" "$PAYLOAD/tests/$name"
  done < "$WORK/tests.txt"
  stamp "test binaries: $(cd "$PAYLOAD/tests" && echo *)"
fi
[ -d "$PAYLOAD/tests" ] || { echo "[rxe] no payload; run without RXE_SKIP_BUILD" >&2; exit 1; }
install -m 755 "$HERE/guest-tests.sh" "$PAYLOAD/guest-tests.sh"
printf '%s\n' "${RXE_TEST_ARGS:-}" > "$PAYLOAD/test-args"

# 2. packages and kernel ------------------------------------------------------
stamp "host setup"
eval "$("$HERE/setup-host.sh")"
stamp "kernel $KVER ready"

# 3. initramfs ------------------------------------------------------------------
"$HERE/mkinitramfs.sh" "$KDIR" "$KVER" "$PAYLOAD" "$WORK/initrd.cpio.gz"
stamp "initramfs built"

# 4. boot ------------------------------------------------------------------------
stamp "booting the guest (TCG); console follows"
set +e
"$HERE/boot.sh" "$KDIR/boot/vmlinuz-$KVER" "$WORK/initrd.cpio.gz" "$WORK/console.log"
rc=$?
set -e
grep -E '^test result|\[guest-tests\] END|END ibv_rc_pingpong|RXE-RESULT' "$WORK/console.log" | sed 's/^/[rxe] summary: /' || true
stamp "done: rc=$rc (console log: $WORK/console.log)"
exit $rc
