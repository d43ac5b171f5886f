"""Per-call cost of the Python binding above the Rust API: a one-rank
communicator, 8-byte in-place all_reduce in a tight loop, from Python (numpy
array; bytearray; torch tensor if installed) and from Rust (the `overhead`
example of this crate, built first). Median of 7 runs.

    cargo build --release --example overhead --manifest-path python/Cargo.toml
    python python/bench/overhead.py --rust $CARGO_TARGET_DIR/release/examples/overhead
"""

import argparse
import os
import statistics
import subprocess
import time

os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
os.environ.setdefault("NCCL_IB_DISABLE", "1")

import numpy as np  # noqa: E402

import nccl_rs  # noqa: E402

REPEATS = 7


def per_call_ns(fn, calls):
    for _ in range(1000):
        fn()
    runs = []
    for _ in range(REPEATS):
        t = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter_ns() - t) / calls)
    return statistics.median(runs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--rust", help="path of the built `overhead` example")
    args = ap.parse_args()
    comm = nccl_rs.Communicator(nccl_rs.UniqueId(), 1, 0)
    x = np.zeros(2, np.float32)
    b = bytearray(8)
    rows = [
        ("python numpy all_reduce(x)", per_call_ns(lambda: comm.all_reduce(x), args.calls)),
        ("python bytearray all_reduce(b, dtype='float32')",
         per_call_ns(lambda: comm.all_reduce(b, dtype="float32"), args.calls)),
    ]
    try:
        import torch

        t = torch.zeros(2)
        rows.append(("python torch all_reduce(t)", per_call_ns(lambda: comm.all_reduce(t), args.calls)))
    except ImportError:
        pass
    comm.close()
    rust = None
    if args.rust:
        out = subprocess.run([args.rust, str(args.calls)], check=True, capture_output=True, text=True, timeout=300)
        rust = float(out.stdout.strip().splitlines()[-1])
        rows.insert(0, ("rust all_reduce_in_place", rust))
    for name, ns in rows:
        extra = f"  (+{(ns - rust) / 1000:.2f} us over Rust)" if rust is not None and name.startswith("python") else ""
        print(f"{name:52s} {ns / 1000:8.2f} us/call{extra}")


if __name__ == "__main__":
    main()
