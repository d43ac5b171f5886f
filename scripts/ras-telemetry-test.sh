#!/usr/bin/env bash
# The RAS telemetry test (docs/ras.md, docs/observability.md): 4 ranks on 4
# network namespaces (rtl-h0..3, one rank each, a bridge of our own in
# namespace rtl-br, 10.79.0.0/24), TCP, NCCL_ALGO=Ring, run a fixed
# schedule of all-reduces while rank $LOSSY's namespace drops 5% of the
# packets arriving on its veth (nftables numgen). Then, with the job idle
# and the loss removed, one RAS JSON query (asked in rtl-h0, so three of
# the four ranks' telemetry is pulled from remote processes) must report:
#   * for every rank, exactly one peer it sent to and one it received
#     from, each exactly the bytes the ring schedule moves, both ends
#     agreeing, the send edges forming one ring;
#   * retransmits on the link that carries data into the lossy rank, the
#     top-ranked link touching the lossy rank, and every link not touching
#     it with fewer retransmits than that link.
# The verbose text form must show the per-peer table and name the link.
# Every wait has a deadline; namespaces and processes are removed on exit.
#   RAS_BIN_DIR=dir   ncclrun, ncclras and ras_telemetry already built there
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "ras-telemetry-test: skipped (needs root for network namespaces)"
  exit 0
fi
command -v nft >/dev/null || { echo "ras-telemetry-test: FAIL: nft missing" >&2; exit 1; }
if [ -z "${RAS_BIN_DIR:-}" ]; then
  cargo build --release -q -p nccl-perf --bin ncclrun --bin ncclras --example ras_telemetry
  RAS_BIN_DIR=${CARGO_TARGET_DIR:-target}/release
fi
BIN=$RAS_BIN_DIR
EX=$BIN/examples/ras_telemetry
N=4
LOSSY=2
ITERS=${RTL_ITERS:-24}
COUNT=${RTL_COUNT:-262144}
WORK=$(mktemp -d /tmp/ras-telemetry-test.XXXXXX)
NS=(rtl-h0 rtl-h1 rtl-h2 rtl-h3)
BRNS=rtl-br
JOB=""

cleanup() {
  set +e
  touch "$WORK/go" "$WORK/hold"
  if [ -n "$JOB" ]; then
    for _ in $(seq 1 50); do kill -0 "$JOB" 2>/dev/null || break; sleep 0.1; done
    kill "$JOB" 2>/dev/null
  fi
  for ns in "${NS[@]}" "$BRNS"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "ras-telemetry-test: FAIL: $*" >&2; exit 1; }

# wait_logs WORD SECONDS: until every rank's log says WORD.
wait_logs() {
  local r ok
  for _ in $(seq 1 $(($2 * 10))); do
    ok=1
    for r in $(seq 0 $((N - 1))); do
      [ "$(cat "$WORK/log/rank$r" 2>/dev/null)" = "$1" ] || ok=0
    done
    [ $ok = 1 ] && return 0
    kill -0 "$JOB" 2>/dev/null || fail "the job ended early: $(tail -5 "$WORK/job.out")"
    sleep 0.1
  done
  fail "not every rank reached '$1' in $2 s: $(tail -5 "$WORK/job.out")"
}

T0=$(date +%s)
for ns in "${NS[@]}" "$BRNS"; do ip netns del "$ns" 2>/dev/null || true; done
ip netns add $BRNS
ip -n $BRNS link set lo up
ip -n $BRNS link add rtlbr0 type bridge
ip -n $BRNS link set rtlbr0 type bridge stp_state 0 forward_delay 0
ip -n $BRNS link set rtlbr0 up
for i in 0 1 2 3; do
  ns=${NS[$i]}
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip -n "$ns" link add eth0 type veth peer name rtlp$i netns $BRNS
  ip -n $BRNS link set rtlp$i master rtlbr0
  ip -n $BRNS link set rtlp$i up
  ip -n "$ns" addr add 10.79.0.$((i + 1))/24 dev eth0
  ip -n "$ns" link set eth0 up
done
for i in 1 2 3; do
  ok=0
  for _ in $(seq 1 50); do
    ip netns exec rtl-h0 ping -c1 -W1 -q 10.79.0.$((i + 1)) >/dev/null 2>&1 && { ok=1; break; }
    sleep 0.1
  done
  [ $ok = 1 ] || fail "rtl-h0 cannot reach 10.79.0.$((i + 1))"
done
# The agent: each namespace is a host of its own name (NCCL_HOSTID).
cat >"$WORK/agent" <<'SH'
#!/bin/sh
ns=$1
shift
exec ip netns exec "$ns" env NCCL_HOSTID="$ns" "$@"
SH
chmod +x "$WORK/agent"
mkdir -p "$WORK/log"
timeout -k 5 120 "$BIN/ncclrun" -H rtl-h0:1,rtl-h1:1,rtl-h2:1,rtl-h3:1 \
  --rsh "$WORK/agent" --master-addr 10.79.0.1 -x NCCL_SOCKET_IFNAME=eth0 -x NCCL_ALGO=Ring \
  "$EX" --iters "$ITERS" --count "$COUNT" --log "$WORK/log" --go "$WORK/go" --hold "$WORK/hold" \
  --deadline 100 >"$WORK/job.out" 2>&1 &
JOB=$!
wait_logs ready 30
ip netns exec "${NS[$LOSSY]}" nft -f - <<NFT
table inet rtl_loss {
  chain input {
    type filter hook input priority 0; policy accept;
    iifname "eth0" ip saddr 10.79.0.0/24 numgen random mod 100 < 5 counter drop
  }
}
NFT
touch "$WORK/go"
wait_logs done 60
DROPPED=$(ip netns exec "${NS[$LOSSY]}" nft list table inet rtl_loss | sed -n 's/.*packets \([0-9]*\) bytes.*/\1/p')
ip netns exec "${NS[$LOSSY]}" nft delete table inet rtl_loss
echo "ras-telemetry-test: $ITERS all-reduces of $COUNT floats done; $DROPPED packets dropped into rank $LOSSY"
# Heartbeats and the telemetry of every process (the remote ones too).
got=""
for _ in $(seq 1 30); do
  if ip netns exec rtl-h0 "$BIN/ncclras" -f json -t 5 >"$WORK/ras.json" 2>"$WORK/ncclras.err" &&
    python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
t = d["telemetry"]
sys.exit(0 if t and t["answered"] == t["processes"] == int(sys.argv[2]) else 1)' "$WORK/ras.json" $N; then
    got=1
    break
  fi
  sleep 0.2
done
[ -n "$got" ] || fail "no full telemetry answer: $(cat "$WORK/ncclras.err" "$WORK/ras.json")"
python3 - "$WORK/ras.json" $N $ITERS $COUNT $LOSSY <<'PY' || fail "check: $(cat "$WORK/ras.json")"
import json, sys
path, n, iters, count, lossy = sys.argv[1], *map(int, sys.argv[2:])
d = json.load(open(path))
(c,) = [c for c in d["communicators"] if c["nranks"] == n]
ranks = {r["rank"]: r for r in c["ranks"]}
assert sorted(ranks) == list(range(n)), sorted(ranks)
# Ring all-reduce: 2(n-1) steps of count/n floats to the next rank.
want = iters * 2 * (n - 1) * (count // n) * 4
peers = {r: {p["peer"]: p for p in ranks[r]["telemetry"]} for r in ranks}
nxt, prv = {}, {}
for r in range(n):
    sent = {p: q["bytes_sent"] for p, q in peers[r].items() if q["bytes_sent"]}
    recv = {p: q["bytes_recv"] for p, q in peers[r].items() if q["bytes_recv"]}
    assert list(sent.values()) == [want], ("rank", r, "sent", sent, "want", want)
    assert list(recv.values()) == [want], ("rank", r, "recv", recv, "want", want)
    (nxt[r],), (prv[r],) = sent, recv
for r in range(n):
    # Both ends agree, message for message.
    a, b = peers[r][nxt[r]], peers[nxt[r]][r]
    assert a["bytes_sent"] == b["bytes_recv"] and a["msgs_sent"] == b["msgs_recv"] > 0, (r, a, b)
    assert prv[nxt[r]] == r, (nxt, prv)
seen, at = [], 0
while at not in seen:
    seen.append(at)
    at = nxt[at]
assert len(seen) == n, ("not one ring", nxt)
print("ras-telemetry-test: ring %s; every rank sent and received exactly %d B" % ("->".join(map(str, seen + [0])), want))
links = [l for l in d["links"] if l["comm"] == c["id"]]
touch = lambda l: lossy in (l["a"]["rank"], l["b"]["rank"])
into = [l for l in links if {l["a"]["rank"], l["b"]["rank"]} == {prv[lossy], lossy}]
assert len(into) == 1, links
into = into[0]
for l in links:
    print("  %-44s %12d B %6d retransmits %9s per MB%s" % (
        l["name"], l["bytes"], l["retransmits"], l["retransmits_per_mb"], " OUTLIER" if l["outlier"] else ""))
assert into["retransmits"] > 0, ("no retransmits into the lossy rank", into)
assert touch(links[0]), ("top-ranked link does not touch rank %d" % lossy, links[0])
for l in links:
    if not touch(l):
        assert l["retransmits"] < into["retransmits"], ("a clean link retransmits as much", l, into)
assert any(into["name"] in e for e in d["link_errors"]), d["link_errors"]
print("ras-telemetry-test: top link %s (%d retransmits)" % (links[0]["name"], links[0]["retransmits"]))
PY
ip netns exec rtl-h0 "$BIN/ncclras" -v -t 5 >"$WORK/ras.txt" || fail "ncclras -v: $(cat "$WORK/ras.txt")"
grep -Eq "^ +rank +peer +bytes sent" "$WORK/ras.txt" || fail "no telemetry table: $(cat "$WORK/ras.txt")"
grep -Eq "^  comm [0-9a-f]{16}: rank [0-9] \(host rtl-h[0-9]\) <-> rank [0-9] \(host rtl-h[0-9]\): [1-9][0-9]* retransmits" "$WORK/ras.txt" ||
  fail "no link named: $(cat "$WORK/ras.txt")"
cat "$WORK/ras.txt"
touch "$WORK/hold"
for _ in $(seq 1 300); do kill -0 "$JOB" 2>/dev/null || break; sleep 0.1; done
kill -0 "$JOB" 2>/dev/null && fail "the job did not finish"
wait "$JOB" || fail "the job failed: $(tail -5 "$WORK/job.out")"
JOB=""
echo "ras-telemetry-test: ok ($(($(date +%s) - T0)) s)"
