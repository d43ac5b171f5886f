#!/usr/bin/env bash
# Multi-host fault tests: 4 ranks, each in its own network namespace
# (ncclns0..3 on the bridge ncclbr0, 10.77.0.0/24; see setup.sh), started
# torchrun-style with `ip netns exec`. Every scenario runs under `timeout`,
# so a hang fails the run instead of stalling it. Prints a table (fault,
# times injected, survived correctly, worst time to error) and exits
# non-zero if any scenario failed.
#
#   NETNS_SCENARIOS="loss1 loss5 kill linkdown garbage rootflood mismatch"
#                        which to run (default: all)
#   NETNS_BIN_DIR=dir    where netns_worker and all_reduce_perf are
#                        (default ${CARGO_TARGET_DIR:-target}/release; built if missing)
#   NETNS_NO_BUILD=1     never build (e.g. from inside `cargo test`)
#   NETNS_KEEP=1         keep the logs directory even on success
#   NETNS_GARBAGE_HERD=N slowloris connections per new port (default 80, more
#                        than the bootstrap root's 64 pending slots)
#   NETNS_GARBAGE_ROOT_FREEZE_MS=N  how long the stranger stalls rank 0 when a
#                        bootstrap root starts listening (default 0: never;
#                        the rootflood scenario stalls the root on purpose)
#
# Needs root, iproute2 (ip, ss), nftables; installs them from Debian if
# missing. Touches nothing outside the namespaces it creates.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
. "$repo/scripts/env.sh"
. "$here/common.sh"

if [ "$(id -u)" != 0 ]; then
  echo "netns: needs root (network namespaces, nftables)" >&2
  exit 2
fi
ensure_packages ip:iproute2 ss:iproute2 nft:nftables ping:iputils-ping timeout:coreutils

BIN=${NETNS_BIN_DIR:-${CARGO_TARGET_DIR:-$repo/target}/release}
if [ ! -x "$BIN/netns_worker" ] || [ ! -x "$BIN/all_reduce_perf" ]; then
  if [ "${NETNS_NO_BUILD:-0}" != 1 ]; then
    ensure_toolchain
    echo "== netns: building release binaries"
    (cd "$repo" && cargo build --release -p nccl-tests-suite -p nccl-perf) || exit 2
    BIN=${CARGO_TARGET_DIR:-$repo/target}/release
  fi
fi
if [ ! -x "$BIN/netns_worker" ]; then
  echo "netns: no netns_worker in $BIN" >&2
  exit 2
fi
WORKER=$BIN/netns_worker
PERF=$BIN/all_reduce_perf
[ -x "$PERF" ] || PERF=

# One run at a time on this host (the namespaces have fixed names).
exec 9>/tmp/nccl-rs-netns.lock
if command -v flock >/dev/null 2>&1 && ! flock -w 600 9; then
  echo "netns: another run holds /tmp/nccl-rs-netns.lock" >&2
  exit 2
fi

SCENARIOS=${NETNS_SCENARIOS:-loss1 loss5 kill linkdown garbage rootflood mismatch}
WORK=$(mktemp -d /tmp/nccl-netns.XXXXXX)
N=$NETNS_N
PORT=29600
FAILED=0
ROWS=()
BG=()

cleanup() {
  for p in "${BG[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  bash "$here/teardown.sh"
}
trap cleanup EXIT
trap 'echo "netns: interrupted" >&2; exit 130' INT TERM

now_ms() { date +%s%3N; }
log() { echo "== netns: $*"; }
bad() {
  echo "FAIL: $*" >&2
  FAILED=1
}
# row FAULT INJECTED SURVIVED WORST
row() { ROWS+=("$1|$2|$3|$4"); }

# launch NAME TIMEOUT_S [VAR=VALUE...]: starts the N ranks of scenario NAME,
# rank R in namespace ncclnsR, each wrapped in `timeout`; RANKPIDS holds the
# `timeout` processes (the worker prints its own pid in a `PID` line).
launch() {
  local name=$1 t=$2 r
  shift 2
  PORT=$((PORT + 1))
  RANKPIDS=()
  for r in $(seq 0 $((N - 1))); do
    ip netns exec "$(netns_name "$r")" timeout -k 5 "$t" env \
      RANK="$r" WORLD_SIZE="$N" LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
      MASTER_ADDR="$(netns_ip 0)" MASTER_PORT="$PORT" \
      NCCL_SOCKET_IFNAME=veth NCCL_SOCKET_FAMILY=AF_INET NCCL_SHM_DISABLE=1 \
      "$@" "${CMD[@]}" >"$WORK/$name.$r.out" 2>"$WORK/$name.$r.err" &
    RANKPIDS+=($!)
    BG+=($!)
  done
}

# wait_ranks: waits for the ranks of the last launch; CODES holds exit codes.
wait_ranks() {
  local p
  CODES=()
  for p in "${RANKPIDS[@]}"; do
    { wait "$p"; } 2>/dev/null # (no "Killed" notice for the victim)
    CODES+=($?)
  done
}

# wait_line NAME PREFIX SECS: until every rank printed a line starting with PREFIX.
wait_line() {
  local name=$1 prefix=$2 until=$(($(date +%s) + $3)) r all
  while [ "$(date +%s)" -le "$until" ]; do
    all=1
    for r in $(seq 0 $((N - 1))); do
      grep -q "^$prefix " "$WORK/$name.$r.out" 2>/dev/null || all=0
    done
    [ $all = 1 ] && return 0
    sleep 0.05
  done
  return 1
}

wait_line_rank() { # wait_line_rank NAME RANK PREFIX SECS
  local until=$(($(date +%s) + $4))
  while [ "$(date +%s)" -le "$until" ]; do
    grep -q "^$3 " "$WORK/$1.$2.out" 2>/dev/null && return 0
    sleep 0.02
  done
  return 1
}

field() { # field NAME RANK PREFIX N: Nth word of the rank's first PREFIX line
  awk -v p="$3" -v n="$4" '$1 == p { print $n; exit }' "$WORK/$1.$2.out" 2>/dev/null
}
result_text() { grep -m1 '^RESULT ' "$WORK/$1.$2.out" 2>/dev/null | cut -d' ' -f6-; }
show_rank() {
  echo "--- $1 rank $2 (exit ${CODES[$2]:-?}): stdout" >&2
  tail -n 5 "$WORK/$1.$2.out" >&2
  echo "--- stderr" >&2
  tail -n 8 "$WORK/$1.$2.err" >&2
}

nft_loss() { # nft_loss PCT: drop PCT% of test-subnet packets arriving in each namespace
  local r
  for r in $(seq 0 $((N - 1))); do
    ip netns exec "$(netns_name "$r")" nft -f - <<EOF
table inet $NETNS_NFT_TABLE {
  chain input {
    type filter hook input priority 0; policy accept;
    ip saddr $NETNS_SUBNET.0/24 numgen random mod 100 < $1 counter drop
  }
}
EOF
  done
}
nft_first_syn_drop() { # drops the first SYN of every connection between ranks (a 1 s retransmit)
  local r
  for r in $(seq 0 $((N - 1))); do
    ip netns exec "$(netns_name "$r")" nft -f - <<EOF
table inet $NETNS_NFT_TABLE {
  set seen {
    type ipv4_addr . inet_service
    flags dynamic, timeout
    timeout 120s
  }
  chain input {
    type filter hook input priority 0; policy accept;
    ip saddr $(netns_ip 0)-$(netns_ip $((N - 1))) tcp flags & (syn | ack) == syn ip saddr . tcp sport @seen accept
    ip saddr $(netns_ip 0)-$(netns_ip $((N - 1))) tcp flags & (syn | ack) == syn add @seen { ip saddr . tcp sport } counter drop
  }
}
EOF
  done
}
nft_dropped() {
  local r sum=0 c
  for r in $(seq 0 $((N - 1))); do
    c=$(ip netns exec "$(netns_name "$r")" nft list table inet "$NETNS_NFT_TABLE" 2>/dev/null | awk '/counter packets/ { for (i = 1; i < NF; i++) if ($i == "packets") print $(i + 1) }')
    sum=$((sum + ${c:-0}))
  done
  echo $sum
}
nft_clear() {
  local r
  for r in $(seq 0 $((N - 1))); do
    ip netns exec "$(netns_name "$r")" nft delete table inet "$NETNS_NFT_TABLE" 2>/dev/null || true
  done
}

# --- correct results under random loss -------------------------------------
scenario_loss() {
  local pct=$1 name=loss$1 r ok=0 cases dropped t0 secs perf_ok="" pfail=0
  log "$pct% random loss: sample of the exact-checked matrix"
  nft_loss "$pct"
  t0=$(now_ms)
  CMD=("$WORKER")
  launch "$name" 150 NETNS_MODE=matrix NETNS_CASES="${NETNS_LOSS_CASES:-120}" NETNS_LARGE="${NETNS_LOSS_LARGE:-3}" NCCL_RS_TIMEOUT=60
  wait_ranks
  secs=$((($(now_ms) - t0) / 1000))
  for r in $(seq 0 $((N - 1))); do
    if [ "${CODES[$r]}" = 0 ] && [ "$(field "$name" "$r" CASES 4)" = 0 ]; then
      ok=$((ok + 1))
    else
      bad "$name: rank $r: exit ${CODES[$r]} ($( [ "${CODES[$r]}" = 124 ] && echo hang || result_text "$name" "$r"))"
      show_rank "$name" "$r"
    fi
  done
  cases=$(field "$name" 0 CASES 3)
  if [ -n "$PERF" ]; then
    # nccl-tests-style all-reduce with data checks (-c 1): exits non-zero on a wrong element.
    local maxb=16M
    [ "$pct" -ge 5 ] && maxb=4M # TCP throughput collapses at 5% loss (~10 MB/s here)
    CMD=("$PERF" -b 1M -e "$maxb" -f 4 -d float -o sum -n 3 -w 1 -c 1)
    launch "$name-perf" 120 NCCL_RS_TIMEOUT=60
    wait_ranks
    for r in $(seq 0 $((N - 1))); do
      if [ "${CODES[$r]}" != 0 ]; then
        pfail=1
        bad "$name-perf: rank $r exit ${CODES[$r]}"
        show_rank "$name-perf" "$r"
      fi
    done
    [ $pfail = 0 ] && perf_ok=", all_reduce_perf 1M-$maxb 0 wrong"
    [ $pfail = 0 ] || perf_ok=", all_reduce_perf FAILED"
  fi
  dropped=$(nft_dropped)
  nft_clear
  log "$name: $dropped packets dropped, $ok/$N ranks exact over ${cases:-?} cases in ${secs}s"
  row "$pct% packet loss (nftables numgen)" "1 run, $dropped pkts dropped" "$ok/$N ranks exact (${cases:-?} cases)$perf_ok" "- (no error expected)"
}

# --- SIGKILL a rank in the middle of a 64 MiB all-reduce --------------------
scenario_kill() {
  local v name r ok=0 runs=0 worst=0 pid t0 at tte text
  for v in ${NETNS_KILL_RANKS:-2 0}; do
    name=kill$v
    runs=$((runs + 1))
    log "SIGKILL rank $v in the middle of 64 MiB all-reduces"
    CMD=("$WORKER")
    launch "$name" 90 NETNS_MODE=big NETNS_BIG_SECS=40 NCCL_RS_TIMEOUT=60
    if ! wait_line "$name" PHASE 60; then
      bad "$name: ranks never reached the 64 MiB phase"
      wait_ranks
      for r in $(seq 0 $((N - 1))); do show_rank "$name" "$r"; done
      continue
    fi
    sleep 0.3
    pid=$(field "$name" "$v" PID 3)
    t0=$(now_ms)
    kill -9 "$pid"
    wait_ranks
    local good=1
    for r in $(seq 0 $((N - 1))); do
      [ "$r" = "$v" ] && continue
      at=$(field "$name" "$r" RESULT 5)
      text=$(result_text "$name" "$r")
      if [ "$(field "$name" "$r" RESULT 3)" != err ] || [ -z "$at" ]; then
        good=0
        bad "$name: survivor rank $r: no error (exit ${CODES[$r]}): $text"
        show_rank "$name" "$r"
        continue
      fi
      tte=$((at - t0))
      [ $tte -gt $worst ] && worst=$tte
      echo "   rank $r: error after ${tte} ms: $text"
      if [ $tte -gt 10000 ]; then
        good=0
        bad "$name: rank $r took ${tte} ms to fail"
      fi
      if ! grep -q "rank $v" <<<"$text"; then
        good=0
        bad "$name: rank $r: error does not name rank $v: $text"
      fi
      if [ "${CODES[$r]}" != 0 ]; then
        good=0
        bad "$name: rank $r exit ${CODES[$r]}"
        show_rank "$name" "$r"
      fi
    done
    [ $good = 1 ] && ok=$((ok + 1))
  done
  row "SIGKILL a rank mid 64 MiB all-reduce" "$runs (ranks ${NETNS_KILL_RANKS:-2 0})" "$ok/$runs: all $((N - 1)) survivors failed naming it" "$worst ms"
}

# --- a link taken down in the middle of a collective ------------------------
scenario_linkdown() {
  local v name r ok=0 runs=0 worst=0 t0 at tte text ns dev deadline=10
  for v in ${NETNS_LINKDOWN_RANKS:-2 0}; do
    name=linkdown$v
    ns=$(netns_name "$v")
    dev=$(netns_if "$v")
    runs=$((runs + 1))
    log "link $dev of rank $v down in the middle of 64 MiB all-reduces (NCCL_RS_TIMEOUT=$deadline)"
    CMD=("$WORKER")
    launch "$name" 90 NETNS_MODE=big NETNS_BIG_SECS=40 NCCL_RS_TIMEOUT=$deadline NCCL_RS_BOOTSTRAP_TIMEOUT=12
    if ! wait_line "$name" PHASE 60; then
      bad "$name: ranks never reached the 64 MiB phase"
      wait_ranks
      continue
    fi
    sleep 0.3
    t0=$(now_ms)
    ip -n "$ns" link set "$dev" down
    wait_ranks
    ip -n "$ns" link set "$dev" up
    wait_reachable
    local good=1
    for r in $(seq 0 $((N - 1))); do
      at=$(field "$name" "$r" RESULT 5)
      text=$(result_text "$name" "$r")
      if [ "${CODES[$r]}" = 124 ] || [ "${CODES[$r]}" = 137 ]; then
        good=0
        bad "$name: rank $r hung (killed by the outer timeout)"
        show_rank "$name" "$r"
        continue
      fi
      if [ "$(field "$name" "$r" RESULT 3)" != err ] || [ -z "$at" ]; then
        good=0
        bad "$name: rank $r: no error (exit ${CODES[$r]}): $text"
        show_rank "$name" "$r"
        continue
      fi
      tte=$((at - t0))
      [ $tte -gt $worst ] && worst=$tte
      echo "   rank $r: error after ${tte} ms (exit after drop $(field "$name" "$r" DROPPED 3) ms): $text"
      if [ $tte -gt $(((deadline + 5) * 1000)) ]; then
        good=0
        bad "$name: rank $r took ${tte} ms, beyond the ${deadline} s deadline"
      fi
    done
    [ $good = 1 ] && ok=$((ok + 1))
  done
  row "link down (ip link set veth down)" "$runs (ranks ${NETNS_LINKDOWN_RANKS:-2 0})" "$ok/$runs: all $N ranks failed, none hung" "$worst ms (deadline ${deadline} s)"
}

wait_reachable() {
  local r i
  for r in $(seq 1 $((N - 1))); do
    for i in $(seq 1 50); do
      ip netns exec "$(netns_name 0)" ping -c1 -W1 -q "$(netns_ip "$r")" >/dev/null 2>&1 && break
      sleep 0.1
    done
  done
}

# --- garbage and strays at every listening port -----------------------------
scenario_garbage() {
  local name=garbage r ok=0 anchors=() ips=() a stop=$WORK/attack.stop total ports seen missing=0 warns=0 line
  log "garbage and stray connections to every listening port while the job runs"
  mkdir -p "$WORK/ids"
  # One idle process per namespace: the attacker reads /proc/PID/net/tcp of
  # these (the namespace's sockets) to find every listening port at once.
  # It runs on a host of its own (10.77.0.100, the bridge's namespace).
  # Listeners live only while the job connects; to keep them open long
  # enough to be hit, the first SYN of every connection between ranks is
  # dropped (each connect takes a 1 s retransmit) and one rank in turn
  # joins 1.5 s late.
  nft_first_syn_drop
  for r in $(seq 0 $((N - 1))); do
    ip netns exec "$(netns_name "$r")" sleep 300 &
    anchors+=($!)
    BG+=($!)
    disown $!
    ips+=("$(netns_ip "$r")")
  done
  # `ss -ltnp` in every namespace, every 0.2 s: the ports an operator sees
  # from the network (not loopback ones, such as the RAS query port on
  # 127.0.0.1, which no other host can reach).
  (
    while [ ! -e "$stop" ]; do
      for r in $(seq 0 $((N - 1))); do
        ip netns exec "$(netns_name "$r")" ss -ltnpH 2>/dev/null | grep netns_worker | awk '$4 !~ /^127\./ { print $4 }'
      done
      sleep 0.2
    done
  ) >"$WORK/ss.ports" &
  local sspid=$!
  BG+=($sspid)
  PORT=$((PORT + 1))
  ip netns exec "$NETNS_BRNS" timeout -k 5 150 env NETNS_MODE=attack \
    NETNS_ATTACK_PIDS="$(IFS=,; echo "${anchors[*]}")" NETNS_ATTACK_IPS="$(IFS=,; echo "${ips[*]}")" \
    NETNS_ATTACK_TARGETS="$(netns_ip 0):$PORT" NETNS_ATTACK_STOP="$stop" NETNS_ATTACK_SECS=140 \
    NETNS_ATTACK_ROOT_FREEZE_MS="${NETNS_GARBAGE_ROOT_FREEZE_MS:-0}" NETNS_ATTACK_HERD="${NETNS_GARBAGE_HERD:-80}" \
    "$WORKER" >"$WORK/attack.out" 2>"$WORK/attack.err" &
  local apid=$!
  BG+=($apid)
  sleep 0.5
  PORT=$((PORT - 1)) # launch takes the next port: the one under attack already
  CMD=("$WORKER")
  launch "$name" 150 NETNS_MODE=garbage NETNS_ROUNDS="${NETNS_GARBAGE_ROUNDS:-3}" NETNS_CASES="${NETNS_GARBAGE_CASES:-40}" NETNS_LARGE=1 \
    NETNS_ID_DIR="$WORK/ids" NETNS_JOIN_DELAY_MS=1500 NCCL_RS_TIMEOUT=60 NCCL_RS_BOOTSTRAP_TIMEOUT=30
  wait_ranks
  touch "$stop"
  local syn_dropped
  syn_dropped=$(nft_dropped)
  nft_clear
  wait "$apid"
  wait "$sspid" 2>/dev/null
  for a in "${anchors[@]}"; do kill "$a" 2>/dev/null; done
  line=$(grep -m1 '^ATTACK ' "$WORK/attack.out")
  echo "   $line" | cut -c1-400
  total=$(sed -n 's/.*connections=\([0-9]*\).*/\1/p' <<<"$line")
  ports=$(sed -n 's/.* ports=\([0-9]*\).*/\1/p' <<<"$line")
  for r in $(seq 0 $((N - 1))); do
    warns=$((warns + $(grep -c 'WARN' "$WORK/$name.$r.err")))
    if [ "${CODES[$r]}" = 0 ] && [ "$(field "$name" "$r" CASES 4)" = 0 ]; then
      ok=$((ok + 1))
    else
      bad "$name: rank $r: exit ${CODES[$r]}: $(result_text "$name" "$r")"
      show_rank "$name" "$r"
    fi
  done
  seen=$(sort -u "$WORK/ss.ports" | grep -c .)
  for a in $(sort -u "$WORK/ss.ports"); do
    grep -q "[=,]$a\(,\| \|$\)" <<<"$line" || missing=$((missing + 1))
  done
  echo "   ss -ltnp saw $seen job ports; $missing of them not attacked; $warns WARN lines in the ranks' logs; $syn_dropped first SYNs dropped"
  [ "${total:-0}" -gt 0 ] || bad "garbage: the attacker made no connection"
  [ "$missing" = 0 ] || bad "garbage: $missing listening ports seen by ss were not attacked"
  row "garbage/strays on every listening port" "${total:-0} conns on ${ports:-0} ports (ss saw $seen)" "$ok/$N ranks exact ($(field "$name" 0 CASES 3) cases, ${NETNS_GARBAGE_ROUNDS:-3} comms), $warns WARNs" "- (no error expected)"
}

# --- a flood of strays reaching a busy bootstrap root -----------------------
# First 300 strays connect and send one byte of a hello frame each (they hold
# the root's pending slots for its hello deadline); then rank 0 (with the
# root) is stalled (SIGSTOP) while ranks 1..3 connect and send their hello,
# 100 idle strays connect after them from 10.77.0.100, and rank 0 resumes:
# its root finds the ranks' connections between a full house of trickling
# strangers and 100 more in its accept queue. The job must still start and
# run exact.
scenario_rootflood() {
  local name=rootflood r ok=0 p0 strays=${NETNS_ROOTFLOOD_STRAYS:-100} trickles=${NETNS_ROOTFLOOD_TRICKLES:-300} until got=0 gott=0 listening=0
  log "$trickles trickling + $strays idle strays at a stalled bootstrap root, around the ranks' hellos"
  rm -f "$WORK/rootflood.strays" "$WORK/rootflood.trickles"
  CMD=("$WORKER")
  launch "$name" 60 NETNS_MODE=matrix NETNS_CASES=20 NETNS_LARGE=0 NCCL_RS_TIMEOUT=30 NCCL_RS_BOOTSTRAP_TIMEOUT=20 NETNS_START_DELAY_MS=2000
  # Ranks 1..3 start 2 s late.
  until=$(($(date +%s) + 3))
  while [ "$(date +%s)" -le "$until" ]; do
    if ip netns exec "$(netns_name 0)" ss -ltnH "sport = :$PORT" | grep -q .; then listening=1; break; fi
    sleep 0.01
  done
  # stray_conns COUNT FILE BYTE: COUNT connections from the stranger's host,
  # each sending BYTE (if any), held open for a while.
  stray_conns() {
    ip netns exec "$NETNS_BRNS" timeout 20 bash -c '
      n=0
      for i in $(seq 1 '"$1"'); do
        exec {fd}<>"/dev/tcp/'"$(netns_ip 0)/$PORT"'" || break
        [ -n "'"$3"'" ] && printf "'"$3"'" >&$fd
        n=$((n + 1)); echo $n > '"$2"'
      done
      sleep 8' 2>/dev/null &
    BG+=($!)
    disown $! # (no "Killed" notice when it is cleaned up)
  }
  stray_conns "$trickles" "$WORK/rootflood.trickles" '\x20'
  sleep 0.7 # the root accepts them and reads their byte
  p0=$(field "$name" 0 PID 3)
  [ -n "$p0" ] && kill -STOP "$p0"
  sleep 1.6 # ranks 1..3 connect and send their hellos into the root's queue
  stray_conns "$strays" "$WORK/rootflood.strays" ""
  # Resume rank 0 once the idle strays are all connected or their count has
  # stopped growing (a full accept queue drops further SYNs): at most 3 s.
  local last=-1 still=0 queue=0 qmax=0
  until=$(($(date +%s) + 3))
  while [ "$(date +%s)" -le "$until" ]; do
    got=$(cat "$WORK/rootflood.strays" 2>/dev/null || echo 0)
    [ "$got" -ge "$strays" ] && break
    if [ "$got" = "$last" ]; then still=$((still + 1)); else still=0; last=$got; fi
    [ "$still" -ge 5 ] && break
    sleep 0.1
  done
  # The root's accept queue now: Recv-Q (queued) and Send-Q (its bound).
  read -r queue qmax < <(ip netns exec "$(netns_name 0)" ss -ltnH "sport = :$PORT" | awk '{print $2, $3; exit}')
  [ -n "$p0" ] && kill -CONT "$p0"
  wait_ranks
  gott=$(cat "$WORK/rootflood.trickles" 2>/dev/null || echo 0)
  # Injected: the root resumed with its slots taken by trickling strays and
  # its accept queue holding the idle strays, or full to its bound.
  local want=$strays
  [ "${qmax:-0}" -gt 0 ] && [ "$qmax" -lt "$want" ] && want=$qmax
  if [ "$listening" != 1 ] || [ -z "$p0" ] || [ "${queue:-0}" -lt "$want" ] || [ "$gott" -lt "$trickles" ]; then
    bad "$name: not injected (root listening: $listening, strays connected: $gott trickling, $got idle; accept queue at resume ${queue:-?} of ${qmax:-?})"
  fi
  for r in $(seq 0 $((N - 1))); do
    if [ "${CODES[$r]}" = 0 ] && [ "$(field "$name" "$r" CASES 4)" = 0 ]; then
      ok=$((ok + 1))
    else
      bad "$name: rank $r: exit ${CODES[$r]}: $(result_text "$name" "$r")"
    fi
  done
  row "stray flood at a stalled bootstrap root" "1 run: $gott trickling + $got idle strays around 3 hellos, accept queue ${queue:-?}/${qmax:-?}" "$ok/$N ranks joined and exact" "- (no error expected)"
}

# --- mismatched collectives --------------------------------------------------
scenario_mismatch() {
  local v name r ok=0 runs=0 worst=0 ms text
  for v in ${NETNS_MISMATCH_RANKS:-1 3}; do
    name=mismatch$v
    runs=$((runs + 1))
    log "rank $v calls broadcast where the others call all_reduce (operation #3)"
    CMD=("$WORKER")
    launch "$name" 60 NETNS_MODE=mismatch FAULT_RANK="$v" NCCL_RS_TIMEOUT=30
    wait_ranks
    local good=1
    for r in $(seq 0 $((N - 1))); do
      ms=$(field "$name" "$r" RESULT 4)
      text=$(result_text "$name" "$r")
      if [ "$(field "$name" "$r" RESULT 3)" != err ] ||
        ! grep -q "invalid usage" <<<"$text" ||
        ! grep -qF "rank $v called broadcast(count=1024, float, root=0) as operation #3" <<<"$text" ||
        ! grep -qF "all_reduce(count=1024, float, sum)" <<<"$text"; then
        good=0
        bad "$name: rank $r (exit ${CODES[$r]}): $text"
        show_rank "$name" "$r"
        continue
      fi
      [ "${ms:-0}" -gt $worst ] && worst=$ms
      [ "$r" = 0 ] && echo "   rank 0: after ${ms} ms: $text"
    done
    [ $good = 1 ] && ok=$((ok + 1))
  done
  row "mismatched collectives" "$runs (ranks ${NETNS_MISMATCH_RANKS:-1 3})" "$ok/$runs: detected on all $N ranks" "$worst ms"
}

log "binaries from $BIN, logs in $WORK"
bash "$here/setup.sh" || exit 2
# IPv6 off in the test namespaces: no link-local addresses to pick.
for r in $(seq 0 $((N - 1))); do
  ip netns exec "$(netns_name "$r")" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 2>/dev/null || true
done
START=$(date +%s)
for s in $SCENARIOS; do
  case $s in
    loss1) scenario_loss 1 ;;
    loss5) scenario_loss 5 ;;
    kill) scenario_kill ;;
    linkdown) scenario_linkdown ;;
    garbage) scenario_garbage ;;
    rootflood) scenario_rootflood ;;
    mismatch) scenario_mismatch ;;
    *) bad "unknown scenario $s" ;;
  esac
done

echo
echo "## Faults on network namespaces ($N ranks, one per namespace, TCP over veth + bridge; $(($(date +%s) - START)) s)"
echo
echo "| fault | injected | survived correctly | worst time to error |"
echo "|---|---|---|---|"
for x in "${ROWS[@]}"; do
  IFS='|' read -r a b c d <<<"$x"
  echo "| $a | $b | $c | $d |"
done
echo
if [ $FAILED = 0 ]; then
  echo "netns: all scenarios passed"
  [ "${NETNS_KEEP:-0}" = 1 ] || rm -rf "$WORK"
  exit 0
fi
echo "netns: FAILED (logs in $WORK)"
exit 1
