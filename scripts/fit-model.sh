#!/usr/bin/env bash
# Measures the tuning model's constants on this machine: for each transport,
# the per-message latency alpha and the bandwidth beta in
#   time(bytes) = alpha + bytes / beta
# fitted (least squares, relative error) to 2-rank sendrecv_perf times at
# 8 B .. 8 MiB. The planner's `Model::for_transport` (nccl-rs/src/plan.rs)
# holds the figures this printed; rerun it after changing a transport.
#   bash scripts/fit-model.sh            # needs release binaries (cargo build --release -p nccl-perf)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
REPS=${REPS:-5}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "# load $(cut -d' ' -f1-3 /proc/loadavg)"
for cfg in SHM TCP; do
  env=(); [ $cfg = TCP ] && env=(NCCL_SHM_DISABLE=1)
  for r in $(seq "$REPS"); do
    # One size per run: in a sweep the perf tool's buffers are sized for the
    # largest message, which slows the middle sizes (cache misses).
    for s in 8 128 2048 32768 524288 8388608; do
      env "${env[@]}" NCCL_SOCKET_IFNAME=lo timeout 300 "$BIN/ncclrun" -n 2 "$BIN/sendrecv_perf" \
        -b $s -e $s -n 1000 -w 100 -c 0 2>&1 | awk -v c=$cfg '/^ +[0-9]/ {print c, $1, $6}' >> "$out"
    done
  done
done
python3 - "$out" <<'PY'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    cfg, size, t = line.split()
    rows.setdefault(cfg, {}).setdefault(int(size), []).append(float(t) * 1e-6)
for cfg, by in rows.items():
    pts = [(s, statistics.median(ts)) for s, ts in sorted(by.items())]
    # Weighted least squares minimising relative error: weight 1/t^2.
    sw = sx = sy = sxx = sxy = 0.0
    for s, t in pts:
        w = 1.0 / (t * t)
        sw += w; sx += w * s; sy += w * t; sxx += w * s * s; sxy += w * s * t
    slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    alpha = (sy - slope * sx) / sw
    beta = 1.0 / slope
    print(f"{cfg}: alpha {alpha*1e6:.2f} us, beta {beta/1e9:.2f} GB/s  (medians of runs; size: time us)")
    for s, t in pts:
        print(f"    {s:>9}: {t*1e6:9.1f}   model {(alpha + s/beta)*1e6:9.1f}")
PY
