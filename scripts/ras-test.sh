#!/usr/bin/env bash
# The RAS test (docs/ras.md): a job of all-reduces in a loop, one rank
# stopped with SIGSTOP, and `ncclras` must name it, the operation it holds
# up, and the ranks waiting on it within 2 s.
#   1. loopback, plain processes (any user): 4 ranks under `ncclrun -n 4`,
#      the text form (`ncclras`, `ncclras -v`) and NCCL's bare protocol.
#   2. network namespaces (root only): 8 ranks, 4 namespaces ras-h0..3 x 2
#      ranks on a bridge of our own (namespace ras-br, 10.77.0.0/24), through
#      `ncclrun -H ... --rsh "ip netns exec"`; the JSON form, parsed.
# Then SIGCONT: the job must finish its loop and exit 0. Every wait has a
# deadline; the namespaces and processes are removed on exit.
#   RAS_BIN_DIR=dir   ncclrun, ncclras and ras_loop already built there
#                     (default: build them into target/release)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${RAS_BIN_DIR:-}" ]; then
  cargo build --release -q -p nccl-perf --bin ncclrun --bin ncclras --example ras_loop
  RAS_BIN_DIR=${CARGO_TARGET_DIR:-target}/release
fi
BIN=$RAS_BIN_DIR
LOOP=$BIN/examples/ras_loop
WORK=$(mktemp -d /tmp/ras-test.XXXXXX)
TAG="ras-test-$$"
NS=(ras-h0 ras-h1 ras-h2 ras-h3)
BRNS=ras-br
JOB=""
STOPPED=""

cleanup() {
  set +e
  [ -n "$STOPPED" ] && kill -CONT "$STOPPED" 2>/dev/null
  [ -n "$JOB" ] && kill "$JOB" 2>/dev/null && sleep 1 && kill -9 "$JOB" 2>/dev/null
  # Ranks of this run only (tagged), should ncclrun have left any.
  for p in $(pgrep -f "$LOOP" 2>/dev/null); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "RAS_TEST_TAG=$TAG" && kill -9 "$p"
  done
  if [ "$(id -u)" = 0 ]; then
    for ns in "${NS[@]}" "$BRNS"; do ip netns del "$ns" 2>/dev/null; done
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "ras-test: FAIL: $*" >&2; exit 1; }

# rank_pid R: the pid of rank R of this run.
rank_pid() {
  local p
  for p in $(pgrep -f "$LOOP"); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "RAS_TEST_TAG=$TAG" &&
      tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "RANK=$1"; then
      echo "$p"
      return
    fi
  done
}

# wait_running N: until every rank of N logged 50 calls (20 s at most).
wait_running() {
  local n=$1 r ok
  for _ in $(seq 1 200); do
    ok=1
    for r in $(seq 0 $((n - 1))); do
      [ "$( (tr -d ' ' <"$WORK/log/rank$r") 2>/dev/null || echo 0)" -gt 50 ] 2>/dev/null || ok=0
    done
    [ $ok = 1 ] && return 0
    kill -0 "$JOB" 2>/dev/null || fail "the job ended early: $(tail -5 "$WORK/job.out")"
    sleep 0.1
  done
  fail "the job did not start in 20 s: $(tail -5 "$WORK/job.out")"
}

# finish: SIGCONT the stopped rank; the job must end well within 60 s.
finish() {
  kill -CONT "$STOPPED"
  STOPPED=""
  for _ in $(seq 1 600); do
    kill -0 "$JOB" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$JOB" 2>/dev/null && fail "the job did not finish after SIGCONT"
  wait "$JOB" || fail "the job failed after SIGCONT: $(tail -5 "$WORK/job.out")"
  JOB=""
  grep -q "^ras_loop: [0-9]* all-reduces" "$WORK/job.out" || fail "no summary: $(tail -5 "$WORK/job.out")"
}

# check_json FILE VICTIM LAST N: the stuck entry names VICTIM, the op the
# waiters are in (LAST, its last started call, or the one after), and
# every other rank as blocked, with its direct waiters waiting on it.
check_json() {
  python3 - "$@" <<'PY'
import json, sys
path, victim, last, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
d = json.load(open(path))
assert d["job"]["ranks"] == n, d["job"]
(c,) = [c for c in d["communicators"] if c["nranks"] == n]
assert c["status"] == "ranks behind", c["status"]
stuck = [s for s in c["stuck"] if s["rank"] == victim]
assert stuck, "victim not named: %s" % c["stuck"]
s = stuck[0]
assert s["reason"] == "unresponsive", s
ranks = {r["rank"]: r for r in c["ranks"]}
assert ranks[victim]["state"] == "unresponsive", ranks[victim]
others = [r for r in range(n) if r != victim]
assert sorted(s["blocked"]) == others, s
assert s["op"] in (last, last + 1), (s["op"], last)
assert s["op"] == max(ranks[r]["last_started"] for r in others), s
assert s["waited_on_by"], s
for w in s["waited_on_by"]:
    wo = ranks[w["rank"]]["waiting_on"]
    assert wo["peer"] == victim and wo["what"] == w["what"], (w, wo)
procs = [p for p in d["processes"] if victim in p["ranks"]]
assert procs and procs[0]["status"] == "unresponsive", procs
print("ras-test: rank %d named: holds up op #%d (its log: started #%d), waited on by %s"
      % (victim, s["op"], last, ", ".join("%d (%s)" % (w["rank"], w["what"]) for w in s["waited_on_by"])))
PY
}

now() { date +%s.%N; }
elapsed() { python3 -c "import sys; print('%.2f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$1" "$(now)"; }

echo "== RAS on loopback: 4 processes, the text form"
mkdir -p "$WORK/log"
PORT=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
export NCCL_RAS_ADDR=127.0.0.1:$PORT
RAS_TEST_TAG=$TAG timeout -k 5 120 "$BIN/ncclrun" -n 4 -x RAS_TEST_TAG \
  "$LOOP" --seconds 6 --log "$WORK/log" >"$WORK/job.out" 2>&1 &
JOB=$!
wait_running 4
# Heartbeats reach every process within a few intervals of init.
for _ in $(seq 1 50); do
  "$BIN/ncclras" -t 5 >"$WORK/ok.txt" || fail "ncclras: $(cat "$WORK/ok.txt")"
  grep -q "^  processes: 4 ok$" "$WORK/ok.txt" && break
  sleep 0.1
done
grep -q "^  1 hosts, 4 processes, 4 ranks$" "$WORK/ok.txt" || fail "summary: $(cat "$WORK/ok.txt")"
grep -q "^  processes: 4 ok$" "$WORK/ok.txt" || fail "processes: $(cat "$WORK/ok.txt")"
grep -Eq "^  [0-9a-f]{16}    4/4  (OK|RANKS BEHIND) " "$WORK/ok.txt" || fail "communicator: $(cat "$WORK/ok.txt")"
# The victim must not be the process serving the port: a stopped server
# answers nobody (its port stays bound). On separate hosts, ask another host.
SERVER=$(sed -n 's/^nccl-rs RAS status, served by .* pid \([0-9]*\) .*/\1/p' "$WORK/ok.txt")
for VICTIM in 2 1; do
  STOPPED=$(rank_pid $VICTIM)
  [ "$STOPPED" != "$SERVER" ] && break
done
[ -n "$STOPPED" ] || fail "no pid for rank $VICTIM"
kill -STOP "$STOPPED"
T0=$(now)
named=""
for _ in $(seq 1 40); do
  "$BIN/ncclras" -v -t 2 >"$WORK/stuck.txt" 2>&1 || true
  if grep -q "^    rank $VICTIM UNRESPONSIVE (.* pid $STOPPED; .*): holds up op #[0-9]*$" "$WORK/stuck.txt" &&
    grep -Eq "^      waited on by ranks .*\((recv|send)\)" "$WORK/stuck.txt"; then
    named=$(elapsed "$T0")
    break
  fi
  sleep 0.1
done
[ -n "$named" ] || fail "rank $VICTIM not named: $(cat "$WORK/stuck.txt")"
python3 -c "import sys; sys.exit(float(sys.argv[1]) > 2.0)" "$named" || fail "named after $named s (over 2 s)"
echo "ras-test: text: rank $VICTIM named $named s after SIGSTOP"
cat "$WORK/stuck.txt"
# NCCL's bare protocol (`echo verbose status | nc localhost 28028`).
exec 3<>"/dev/tcp/127.0.0.1/$PORT"
echo "VERBOSE STATUS" >&3
timeout 5 cat <&3 >"$WORK/bare.txt" || true
exec 3<&-
grep -q "^nccl-rs RAS status, served by " "$WORK/bare.txt" || fail "bare protocol: $(cat "$WORK/bare.txt")"
finish
unset NCCL_RAS_ADDR

if [ "$(id -u)" != 0 ]; then
  echo "== RAS on network namespaces skipped (needs root)"
  exit 0
fi
echo "== RAS on network namespaces: 8 ranks, 4 namespaces x 2, the JSON form"
for ns in "${NS[@]}" "$BRNS"; do ip netns del "$ns" 2>/dev/null || true; done
ip netns add $BRNS
ip -n $BRNS link set lo up
ip -n $BRNS link add rasbr0 type bridge
ip -n $BRNS link set rasbr0 type bridge stp_state 0 forward_delay 0
ip -n $BRNS link set rasbr0 up
for i in 0 1 2 3; do
  ns=${NS[$i]}
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip -n "$ns" link add eth0 type veth peer name rasp$i netns $BRNS
  ip -n $BRNS link set rasp$i master rasbr0
  ip -n $BRNS link set rasp$i up
  ip -n "$ns" addr add 10.77.0.$((i + 1))/24 dev eth0
  ip -n "$ns" link set eth0 up
done
for i in 1 2 3; do
  ok=0
  for _ in $(seq 1 50); do
    ip netns exec ras-h0 ping -c1 -W1 -q 10.77.0.$((i + 1)) >/dev/null 2>&1 && { ok=1; break; }
    sleep 0.1
  done
  [ $ok = 1 ] || fail "ras-h0 cannot reach 10.77.0.$((i + 1))"
done
rm -rf "$WORK/log" && mkdir -p "$WORK/log"
RAS_TEST_TAG=$TAG timeout -k 5 180 "$BIN/ncclrun" -H ras-h0:2,ras-h1:2,ras-h2:2,ras-h3:2 \
  --rsh "ip netns exec" --master-addr 10.77.0.1 -x RAS_TEST_TAG -x NCCL_SOCKET_IFNAME=eth0 \
  "$LOOP" --seconds 10 --log "$WORK/log" >"$WORK/job.out" 2>&1 &
JOB=$!
wait_running 8
VICTIM=3
STOPPED=$(rank_pid $VICTIM)
[ -n "$STOPPED" ] || fail "no pid for rank $VICTIM"
[ "$(ip netns identify "$STOPPED")" = ras-h1 ] || fail "rank $VICTIM is not in ras-h1"
kill -STOP "$STOPPED"
T0=$(now)
LAST=$(tr -d ' ' <"$WORK/log/rank$VICTIM")
named=""
for _ in $(seq 1 40); do
  # Asked in ras-h0: the victim's own namespace may be served by the victim.
  if ip netns exec ras-h0 "$BIN/ncclras" -f json -t 2 >"$WORK/stuck.json" 2>"$WORK/ncclras.err" &&
    check_json "$WORK/stuck.json" $VICTIM "$LAST" 8 >"$WORK/check.out" 2>&1; then
    named=$(elapsed "$T0")
    break
  fi
  sleep 0.1
done
[ -n "$named" ] || fail "rank $VICTIM not named: $(cat "$WORK/check.out" "$WORK/ncclras.err" "$WORK/stuck.json")"
cat "$WORK/check.out"
python3 -c "import sys; sys.exit(float(sys.argv[1]) > 2.0)" "$named" || fail "named after $named s (over 2 s)"
echo "ras-test: json: rank $VICTIM named $named s after SIGSTOP"
ip netns exec ras-h0 "$BIN/ncclras" -v -t 2 || true
finish
echo "ras-test: ok"
