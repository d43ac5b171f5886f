#!/usr/bin/env bash
# Builds libnccl and lays it out as an NCCL install under the target dir:
#   <target>/<profile>/nccl-dist/lib/libnccl.so.2      (the cdylib, SONAME libnccl.so.2)
#   <target>/<profile>/nccl-dist/lib/libnccl.so -> libnccl.so.2
#   <target>/<profile>/nccl-dist/lib/libnccl.a
#   <target>/<profile>/nccl-dist/include/nccl.h
# Usage: ffi/scripts/dist.sh [--release]   (honours CARGO_TARGET_DIR)
set -euo pipefail
cd "$(dirname "$0")/../.."   # the workspace root
profile=debug
args=()
if [ "${1:-}" = "--release" ]; then profile=release; args+=(--release); fi
cargo build -p nccl-ffi "${args[@]}"
target=${CARGO_TARGET_DIR:-$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')}
out="$target/$profile/nccl-dist"
mkdir -p "$out/lib" "$out/include"
cp "$target/$profile/libnccl.so" "$out/lib/libnccl.so.2.tmp" && mv "$out/lib/libnccl.so.2.tmp" "$out/lib/libnccl.so.2"
ln -sfn libnccl.so.2 "$out/lib/libnccl.so"
cp "$target/$profile/libnccl.a" "$out/lib/libnccl.a"
cp ffi/include/nccl.h "$out/include/nccl.h"
echo "$out"
