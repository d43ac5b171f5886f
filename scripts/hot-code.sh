#!/usr/bin/env bash
# The code one small call runs: a 2-rank 8-byte collective under callgrind
# (rank 1 only; rank 0 runs natively, so rank 1 rarely waits), its
# instructions per call and the distinct 64-byte code lines it executes on
# every call, per function, with the fullest L1I set (64 sets, 8 ways: a
# set holding more than 8 hot lines misses on every call).
#   bash scripts/hot-code.sh [BIN] [op] [calls]
# BIN: a directory with ncclrun and the perf tools (default target/release);
# op: broadcast (default; rank 1 receives) or allreduce.
set -eu
cd "$(dirname "$0")/.."
BIN=${1:-target/release}; op=${2:-broadcast}; calls=${3:-20000}
. scripts/perf-tools.sh
command -v valgrind > /dev/null || { echo "hot-code: needs valgrind" >&2; exit 2; }
out=$(mktemp -d)
cat > "$out/wrap.sh" <<WRAP
#!/bin/sh
[ "\$RANK" = 1 ] && exec valgrind --tool=callgrind --dump-instr=yes --compress-pos=no \
  --compress-strings=no --callgrind-out-file=$out/rank1.out -q "\$@"
exec "\$@"
WRAP
chmod +x "$out/wrap.sh"
places=out; [ "$op" = broadcast ] && places=in
NCCL_SOCKET_IFNAME=lo timeout 600 "$BIN/ncclrun" -n 2 "$out/wrap.sh" "$BIN/$(tool "$op")" \
  -b 8 -e 8 -n "$calls" -w 100 -c 0 -P "$places" > /dev/null
python3 - "$out/rank1.out" "$calls" <<'PY'
import collections, sys
path, calls = sys.argv[1], int(sys.argv[2])
fn, skip = None, False
instr, lines = collections.Counter(), collections.defaultdict(set)
for l in open(path):
    if l.startswith('fn='):
        fn = l[3:].strip()
    elif l.startswith('calls='):
        skip = True  # the next line is the call's inclusive cost
    elif skip:
        skip = False
    elif l.startswith('0x'):
        addr, _, cost = l.split()[:3]
        instr[fn] += int(cost)
        if int(cost) >= calls * 3 // 4:
            lines[fn].add(int(addr, 16) >> 6)
hot = set().union(*lines.values())
sets = collections.Counter(x & 63 for x in hot)
print(f"instructions per call {sum(instr.values()) / calls:.0f} (one-time work included)")
print(f"hot code lines {len(hot)} ({len(hot) * 64} bytes); fullest set {max(sets.values())} lines")
for f, s in sorted(lines.items(), key=lambda kv: -len(kv[1]))[:15]:
    print(f"{len(s):5d}  {f[:100]}")
PY
rm -rf "$out"
