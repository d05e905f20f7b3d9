#!/usr/bin/env bash
# lockd's cluster mode against etcd's own lock API, on loopback: builds lockd and the load
# generator with their etcd features, starts a 3-member etcd cluster (data in a temporary
# directory, removed at the end), and in each round measures in turn, the order rotating:
#   etcd       etcd's Lock/Unlock API (v3lock), each client with a lease of its own
#   lockd-1fe  one lockd front-end (--etcd on all three members), every client on it
#   lockd-2fe  two lockd front-ends on the same prefix, the clients spread over both
# Each turn runs the cluster scenarios of lockbench (uncontended C=1, C=16 and C=64, each
# client a name of its own; contended C=16 and C=64 on one name; see
# contrib/bench/src/cluster.rs) on fresh front-ends with a fresh prefix, then compacts etcd's
# history. Around each run lockbench reads etcd's own counters (every member's /metrics) and
# the CPU time of the front-ends and of the members (/proc/PID/stat): etcd transactions and
# RPCs per cycle, requests per transaction, CPU per request (see contrib/bench/src/counters.rs).
# Prints two markdown tables (the measures with lockd against etcd, and those costs) and stops
# what it started.
#
#   contrib/bench/etcd.sh            # 6 rounds of 15 runs of 5.5 s: about 10 minutes plus the builds
#   QUICK=1 contrib/bench/etcd.sh    # smoke run: 1 round of 1 s runs, under a minute plus the builds
#
# Needs etcd (3.4 or later) on PATH and protoc for the builds. Environment:
#   ROUNDS (6; 1 with QUICK)
#   LOCKBENCH_ONLY: a comma-separated list of scenario names (or their beginnings, such as
#     cl.con) to run alone, for a quick comparison; the table then has rows for those only
#   ETCD_PORT (17411): members' client ports are ETCD_PORT, +1, +2; peer ports +10, +11, +12
#   LOCKD_PORT (17031): the front-ends listen on LOCKD_PORT and LOCKD_PORT+1
#   ETCD_HEARTBEAT_MS (50), ETCD_ELECTION_MS (500): raft timings (etcd's defaults are 100
#     and 1000; shorter ones would risk needless elections on a busy 2-core machine)
#   OUT: a directory for rows and logs (default: a new one under /tmp)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

etcd_port=${ETCD_PORT:-17411}
lockd_port=${LOCKD_PORT:-17031}
heartbeat=${ETCD_HEARTBEAT_MS:-50}
election=${ETCD_ELECTION_MS:-500}
rounds=${ROUNDS:-6}
quick=()
if [ "${QUICK:-0}" != 0 ]; then
  quick=(--quick)
  rounds=${ROUNDS:-1}
fi
out=${OUT:-$(mktemp -d /tmp/lockbench-etcd.XXXXXX)}
mkdir -p "$out"
rows=$out/rows.tsv
: >"$rows"

log() { echo "etcd.sh: $*" >&2; }

command -v etcd >/dev/null || { log "etcd is not on PATH"; exit 2; }

log "building (lockd and lockbench with their etcd features, with symbols)"
cargo build --profile profiling --quiet --features etcd --bin lockd
cargo build --profile profiling --quiet --features etcd -p lockbench
# Copies, so that another build in this tree (run.sh builds lockd without the feature) can't
# change the binaries under a running measurement.
cp "$root/target/profiling/lockd" "$out/lockd"
cp "$root/target/profiling/lockbench" "$out/lockbench"
lockd_bin=$out/lockd
bench=$out/lockbench

data=$(mktemp -d /tmp/lockbench-etcd-data.XXXXXX)
etcd_pids=()
lockd_pids=()
stop_lockd() {
  local pid
  for pid in "${lockd_pids[@]}"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  lockd_pids=()
}
stop_all() {
  local pid
  stop_lockd
  for pid in "${etcd_pids[@]}"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  etcd_pids=()
  rm -rf "$data"
}
trap stop_all EXIT
trap 'stop_all; exit 130' INT TERM

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() {
  local port=$1 i
  for i in $(seq 1 100); do
    if ! port_free "$port"; then return 0; fi
    sleep 0.1
  done
  log "nothing listens on port $port"
  return 1
}

urls=()
cluster=()
for i in 0 1 2; do
  for p in $((etcd_port + i)) $((etcd_port + 10 + i)); do
    port_free "$p" || { log "port $p is taken (set ETCD_PORT)"; exit 2; }
  done
  urls+=("http://127.0.0.1:$((etcd_port + i))")
  cluster+=("m$i=http://127.0.0.1:$((etcd_port + 10 + i))")
done
for p in "$lockd_port" $((lockd_port + 1)); do
  port_free "$p" || { log "port $p is taken (set LOCKD_PORT)"; exit 2; }
done
endpoints=$(IFS=,; echo "${urls[*]}")
initial=$(IFS=,; echo "${cluster[*]}")

log "starting 3 etcd members on 127.0.0.1:$etcd_port-$((etcd_port + 2)) (heartbeat ${heartbeat} ms, election ${election} ms)"
for i in 0 1 2; do
  etcd --name "m$i" --data-dir "$data/m$i" \
    --listen-client-urls "${urls[$i]}" --advertise-client-urls "${urls[$i]}" \
    --listen-peer-urls "http://127.0.0.1:$((etcd_port + 10 + i))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((etcd_port + 10 + i))" \
    --initial-cluster "$initial" --initial-cluster-state new \
    --initial-cluster-token "lockbench-$$" \
    --heartbeat-interval "$heartbeat" --election-timeout "$election" \
    --logger zap --log-level warn >>"$out/etcd-m$i.log" 2>&1 &
  etcd_pids+=($!)
done
healthy=0
for _ in $(seq 1 100); do
  ok=0
  for u in "${urls[@]}"; do
    if curl -fsS -m 1 "$u/health" 2>/dev/null | grep -q '"health":"true"'; then ok=$((ok + 1)); fi
  done
  if [ "$ok" = 3 ]; then healthy=1; break; fi
  sleep 0.2
done
[ "$healthy" = 1 ] || { log "the etcd cluster did not become healthy (logs in $out)"; exit 1; }
status_before=$("$bench" etcd-status --etcd "$endpoints")
log "etcd healthy:"$'\n'"$status_before"

# start_lockd PORT PREFIX: one front-end on the cluster.
start_lockd() {
  "$lockd_bin" --listen "127.0.0.1:$1" --etcd "$endpoints" --etcd-prefix "$2" \
    2>>"$out/lockd-$1.log" &
  lockd_pids+=($!)
  wait_port "$1"
}

# One system's turn in a round.
turn() {
  local who=$1 round=$2
  log "round $round: $who"
  local target=()
  case $who in
    etcd)
      target=(--etcd "$endpoints")
      ;;
    lockd-1fe)
      start_lockd "$lockd_port" "/lockbench/r$round-1fe/"
      target=(--lockd "127.0.0.1:$lockd_port")
      ;;
    lockd-2fe)
      start_lockd "$lockd_port" "/lockbench/r$round-2fe/"
      start_lockd $((lockd_port + 1)) "/lockbench/r$round-2fe/"
      target=(--lockd "127.0.0.1:$lockd_port,127.0.0.1:$((lockd_port + 1))")
      ;;
  esac
  # What each run costs: etcd's counters from every member's /metrics (its client URLs), the
  # CPU time of the members and of the front-ends.
  target+=(--etcd-metrics "$endpoints" --etcd-pid "$(IFS=,; echo "${etcd_pids[*]}")")
  if [ ${#lockd_pids[@]} -gt 0 ]; then
    target+=(--lockd-pid "$(IFS=,; echo "${lockd_pids[*]}")")
  fi
  # Nothing may fail in these scenarios: a refused request or an error ends the run here,
  # with the reply in lockbench's last line, rather than leaving a row out.
  if ! "$bench" cluster "${target[@]}" --label "$who" "${quick[@]}" >>"$rows"; then
    log "round $round, $who: the scenarios failed (lockbench's error above; logs and rows in $out)"
    exit 1
  fi
  stop_lockd
  "$bench" etcd-compact --etcd "$endpoints" >>"$out/compact.log"
}

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
load_before=$(loadavg)
started=$(date +%s)
systems=(etcd lockd-1fe lockd-2fe)
round_loads=()
for round in $(seq 1 "$rounds"); do
  round_loads+=("$(loadavg | cut -d' ' -f1)")
  log "round $round of $rounds (load average $(loadavg))"
  n=${#systems[@]}
  for i in $(seq 0 $((n - 1))); do
    turn "${systems[$(((round - 1 + i) % n))]}" "$round"
  done
done
load_after=$(loadavg)
status_after=$("$bench" etcd-status --etcd "$endpoints")

term() { grep -o 'raft_term=[0-9]*' | cut -d= -f2 | sort -n | tail -1; }
db() { grep -o 'db_size=[0-9]*' | cut -d= -f2 | sort -n | tail -1; }
cores=$(nproc)
mem=$(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)
cpu=$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')
{
  echo "Machine: ${cores} cores (${cpu:-unknown CPU}), ${mem} memory, Linux $(uname -r)."
  echo "Load average (1, 5, 15 min) before the run: $load_before; after it: $load_after."
  echo "Load average (1 min) at the start of each round: ${round_loads[*]}."
  if [ ${#quick[@]} -gt 0 ]; then
    echo "**QUICK run** (QUICK=1): 1 s runs; not for publishing."
  fi
  echo
  echo "lockd $commit (--features etcd), $(etcd --version | head -1), 3 members on loopback (heartbeat ${heartbeat} ms, election timeout ${election} ms, data on $(df --output=fstype "$data" | tail -1)), one load generator (tokio, $(nproc) worker threads) on the same cores."
  echo "Raft term before the run: $(term <<<"$status_before"); after it: $(term <<<"$status_after") (a change means a leader election during the run). etcd database size after the run: $(( $(db <<<"$status_after") / 1048576 )) MiB."
  echo
  "$bench" cluster-table "$rows"
  echo
  echo "Took $(( $(date +%s) - started )) s. Rows: $rows"
}
