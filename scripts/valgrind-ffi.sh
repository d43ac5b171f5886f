#!/usr/bin/env bash
# Runs the C ABI test programs under valgrind's memcheck: any memory error or
# definitely/indirectly lost block fails. Expects `cargo test --release -p nccl-ffi`
# to have built them (target/release/nccl-c-tests).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
ensure_packages valgrind:valgrind
D=target/release/nccl-c-tests
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
for t in "initall_c" "errors_c" "nonblocking_c config"; do
  echo "-- valgrind $t"
  # shellcheck disable=SC2086
  timeout 900 valgrind -q --leak-check=full --errors-for-leak-kinds=definite,indirect --error-exitcode=9 $D/$t \
    > /tmp/valgrind-ffi.log 2>&1 || { cat /tmp/valgrind-ffi.log; echo "FAILED under valgrind: $t"; exit 1; }
  tail -n 1 /tmp/valgrind-ffi.log
done
echo "C ABI under valgrind: no memory errors, no leaks"
