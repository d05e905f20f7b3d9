#!/usr/bin/env bash
# lockd against Redis locks, side by side, on loopback: builds both programs in release mode,
# starts redis-server (persistence off) and lockd on loopback ports, runs every scenario with
# one load generator, prints one markdown table, and stops what it started.
#
#   contrib/bench/run.sh            # full run (about 6-10 minutes on 2 cores)
#   QUICK=1 contrib/bench/run.sh    # smoke run: short and small
#
# Environment: LOCKD_PORT (17001), REDIS_PORT (17379), OUT (a directory for rows and logs),
# ROUNDS (3; 1 with QUICK): the throughput and latency scenarios run that many times, lockd and
# Redis in turn, and the table reports each measure's median, so a burst of other work on a
# shared machine does not decide a row.
#
# Same-run comparisons of lockd builds (lockd alone, no Redis), after the table:
#   LOCKD_BASELINE_BIN=path   an older lockd to compare this one with (the mutex scenarios)
#   LOCKD_BASELINE_NAME=text  what to call it in the output (default: its path)
#   METRICS_COMPARE=1         this lockd with --metrics-listen on METRICS_PORT (17002), its
#                             /metrics fetched every second, against this lockd without
#   TLS_COMPARE=1             this lockd over TLS (--tls-cert/--tls-key, a throwaway CA and
#                             server certificate made for the run in OUT/tls) against this
#                             lockd over plain TCP; adds the part conn (a new connection: TCP
#                             connect, TLS handshake, first PING) to the default parts
#   COMPARE_ROUNDS (6; 1 with QUICK): rounds of the builds in turn, the order rotating
#                             each round so that none always runs first or last
#   COMPARE_PARTS (unc,con,sem; unc,con,conn with TLS_COMPARE=1 alone): the scenarios each
#                             build runs (the baseline skips sem, which lockd has had only
#                             since semaphores came)
#   COMPARE_ONLY=1            skip the Redis table and run only the comparisons
#
#   COMPARE_ONLY=1 TLS_COMPARE=1 contrib/bench/run.sh   # TLS against plain: about 4 minutes
#
# The closest peer, dflockd (a Go FIFO lock server), when its binary is given:
#   DFLOCKD=path              also run `lockbench peer`: lockd, dflockd and Redis on fresh
#                             servers, PEER_ROUNDS (3; 1 with QUICK) interleaved rounds of the
#                             mutex scenarios (uncontended C=1/64, contended C=16/64 held 0 and
#                             100 µs), the systems' order rotating each round; a table of
#                             medians, ranges, ratios and server CPU per operation. Without
#                             DFLOCKD nothing of it runs.
#   PEER_ONLY=1               with DFLOCKD: skip the Redis table and the comparisons
#   LOCKBENCH_PEER_SCENARIOS  a comma-separated list of the peer scenarios to run (all six
#                             by default; con.c16.h0 alone, to profile it)
#   DFLOCKD_PORT (16388)
#
#   DFLOCKD=../shared/peers/dflockd PEER_ONLY=1 contrib/bench/run.sh   # about 10 minutes
#
# Cluster mode (lockd --etcd) against etcd's own lock API has a script of its own, which starts a
# 3-member etcd cluster and lockd front-ends on it: contrib/bench/etcd.sh (see its header).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

lockd_port=${LOCKD_PORT:-17001}
redis_port=${REDIS_PORT:-17379}
metrics_port=${METRICS_PORT:-17002}
baseline_bin=${LOCKD_BASELINE_BIN:-}
baseline_name=${LOCKD_BASELINE_NAME:-$baseline_bin}
metrics_compare=${METRICS_COMPARE:-0}
tls_compare=${TLS_COMPARE:-0}
compare_only=${COMPARE_ONLY:-0}
dflockd_bin=${DFLOCKD:-}
dflockd_port=${DFLOCKD_PORT:-16388}
peer_only=${PEER_ONLY:-0}
peer_rounds=${PEER_ROUNDS:-3}
if [ -n "$dflockd_bin" ] && [ ! -x "$dflockd_bin" ]; then
  echo "run.sh: DFLOCKD=$dflockd_bin is not an executable" >&2
  exit 2
fi
if [ "$peer_only" != 0 ] && [ -z "$dflockd_bin" ]; then
  echo "run.sh: PEER_ONLY=1 needs DFLOCKD" >&2
  exit 2
fi
if [ "$peer_only" != 0 ]; then
  compare_only=1
fi
default_parts=unc,con,sem
if [ "$tls_compare" != 0 ] && [ -z "$baseline_bin" ] && [ "$metrics_compare" = 0 ]; then
  default_parts=unc,con,conn
elif [ "$tls_compare" != 0 ]; then
  default_parts=unc,con,sem,conn
fi
compare_parts=${COMPARE_PARTS:-$default_parts}
baseline_parts=$(echo "$compare_parts" | tr "," "\n" | { grep -vx sem || true; } | paste -sd, -)
quick=()
rounds=${ROUNDS:-3}
compare_rounds=${COMPARE_ROUNDS:-6}
if [ "${QUICK:-0}" != 0 ]; then
  quick=(--quick)
  rounds=${ROUNDS:-1}
  compare_rounds=${COMPARE_ROUNDS:-1}
  peer_rounds=${PEER_ROUNDS:-1}
fi
if [ -n "$baseline_bin" ] && [ ! -x "$baseline_bin" ]; then
  echo "run.sh: LOCKD_BASELINE_BIN=$baseline_bin is not an executable" >&2
  exit 2
fi
if [ -n "$baseline_bin" ] && [ -z "$baseline_parts" ]; then
  echo "run.sh: COMPARE_PARTS=$compare_parts leaves the baseline nothing to run" >&2
  exit 2
fi
comparing=0
if [ -n "$baseline_bin" ] || [ "$metrics_compare" != 0 ] || [ "$tls_compare" != 0 ]; then
  comparing=1
fi
if [ "$compare_only" != 0 ] && [ "$comparing" = 0 ] && [ "$peer_only" = 0 ]; then
  echo "run.sh: COMPARE_ONLY=1 needs LOCKD_BASELINE_BIN, METRICS_COMPARE=1 or TLS_COMPARE=1" >&2
  exit 2
fi
out=${OUT:-$(mktemp -d /tmp/lockbench.XXXXXX)}
mkdir -p "$out"
rows=$out/rows.tsv
peer_rows=$out/peer.tsv
: >"$peer_rows"
compare_rows=$out/compare.tsv
: >"$rows"
: >"$compare_rows"

# 10,000 waiting connections need more than 20,000 descriptors across client and servers.
# Where the hard limit can't be raised (a container without CAP_SYS_RESOURCE), take all of it.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

log() { echo "run.sh: $*" >&2; }
log "open-files limit: $(ulimit -n)"

if { [ "$compare_only" = 0 ] || [ -n "$dflockd_bin" ]; } && ! command -v redis-server >/dev/null 2>&1; then
  log "installing redis-server"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq redis-server >/dev/null
fi

log "building (release, with symbols for the profiles)"
# The load generator is a member of the workspace: it builds into the same target/.
cargo build --profile profiling --quiet --bin lockd
cargo build --profile profiling --quiet -p lockbench
lockd_bin=$root/target/profiling/lockd
bench=$root/target/profiling/lockbench

# The TLS pass's certificates: made afresh for each run, never kept in the repository.
tls_dir=$out/tls
if [ "$tls_compare" != 0 ]; then
  "$bench" certs "$tls_dir"
fi

lockd_pid=""
redis_pid=""
dflockd_pid=""
stop_servers() {
  for pid in $lockd_pid $redis_pid $dflockd_pid; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  lockd_pid=""
  redis_pid=""
  dflockd_pid=""
}
trap stop_servers EXIT
trap 'stop_servers; exit 130' INT TERM

wait_port() {
  local port=$1 i
  for i in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  log "nothing listens on port $port"
  return 1
}

# start_lockd BIN [extra lockd flags...]: a fresh lockd. Its per-address and per-name caps
# are raised through their environment variables, which builds older than the caps ignore:
# every benchmark client comes from 127.0.0.1, and the scale scenarios queue 10,000 waiters.
start_lockd() {
  local bin=$1
  shift
  LOCKD_MAX_CONNECTIONS_PER_IP=30000 LOCKD_MAX_WAITERS=30000 "$bin" --listen "127.0.0.1:$lockd_port" --max-connections 30000 \
    --max-locks 2000000 "$@" 2>>"$out/lockd.log" &
  lockd_pid=$!
  wait_port "$lockd_port"
}

# start_servers [extra lockd flags...]: a fresh lockd and a fresh, empty redis-server.
start_servers() {
  start_lockd "$lockd_bin" "$@"
  redis-server --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no \
    --maxclients 30000 --daemonize no --loglevel warning --dir "$out" \
    >>"$out/redis.log" 2>&1 &
  redis_pid=$!
  wait_port "$redis_port"
}

servers=(--lockd "127.0.0.1:$lockd_port" --redis "127.0.0.1:$redis_port")
phase() {
  local group=$1
  shift
  log "scenario group: $group"
  start_servers "$@"
  "$bench" "$group" "${servers[@]}" --lockd-pid "$lockd_pid" --redis-pid "$redis_pid" \
    "${quick[@]}" >>"$rows"
  stop_servers
}

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
load_before=$(loadavg)
started=$(date +%s)

datadir_note="lockd \`--help\` lists no \`--data-dir\` in this build: no durable-state rows."
if [ "$compare_only" = 0 ]; then
  for round in $(seq 1 "$rounds"); do
    log "round $round of $rounds"
    phase perf
  done
  phase waiters
  phase held
  phase expiry

  if "$lockd_bin" --help | grep -q -- '--data-dir'; then
    log "scenario group: perf with --data-dir"
    data=$(mktemp -d "$out/data.XXXXXX")
    start_lockd "$lockd_bin" --data-dir "$data"
    "$bench" perf --lockd "127.0.0.1:$lockd_port" --lockd-pid "$lockd_pid" \
      --label lockd-datadir "${quick[@]}" >>"$rows"
    stop_servers
    rm -rf "$data"
    datadir_note="Rows marked \`--data-dir\` ran lockd with \`--data-dir\` (durable state), against the same in-memory Redis."
  fi
fi
load_after_table=$(loadavg)

# One build's turn in a comparison round: a fresh lockd, the scenarios, stopped again.
# variant base|new|metrics|tls
variant() {
  local bin=$lockd_bin parts=$compare_parts flags=() scrape=() client=()
  case $1 in
    base) bin=$baseline_bin parts=$baseline_parts ;;
    metrics)
      flags=(--metrics-listen "127.0.0.1:$metrics_port")
      scrape=(--scrape "127.0.0.1:$metrics_port")
      ;;
    tls)
      flags=(--tls-cert "$tls_dir/server.pem" --tls-key "$tls_dir/server.key")
      client=(--tls-ca "$tls_dir/ca.pem")
      ;;
  esac
  log "comparison: $1"
  start_lockd "$bin" "${flags[@]}"
  if [ ${#scrape[@]} -gt 0 ]; then wait_port "$metrics_port"; fi
  "$bench" "$parts" --lockd "127.0.0.1:$lockd_port" --lockd-pid "$lockd_pid" --label "$1" \
    "${scrape[@]}" "${client[@]}" "${quick[@]}" >>"$compare_rows"
  stop_servers
}

round_loads=()
if [ "$comparing" = 1 ]; then
  builds=()
  if [ -n "$baseline_bin" ]; then builds+=(base); fi
  builds+=(new)
  if [ "$metrics_compare" != 0 ]; then builds+=(metrics); fi
  if [ "$tls_compare" != 0 ]; then builds+=(tls); fi
  for round in $(seq 1 "$compare_rounds"); do
    round_loads+=("$(loadavg | cut -d' ' -f1)")
    log "comparison round $round of $compare_rounds (load average $(loadavg))"
    n=${#builds[@]}
    for i in $(seq 0 $((n - 1))); do
      variant "${builds[$(((round - 1 + i) % n))]}"
    done
  done
fi
peer_loads=""
if [ -n "$dflockd_bin" ]; then
  log "peer comparison: lockd, dflockd and Redis, $peer_rounds interleaved round(s)"
  peer_loads="$(loadavg)"
  start_servers
  # dflockd's defaults would skew it: 1024 keys at most, idle connections closed after 23 s
  # (releasing their locks); it logs a line per expiry and disconnect, sent away here.
  "$dflockd_bin" --host 127.0.0.1 --port "$dflockd_port" --max-locks 1000000 \
    --read-timeout 600 2>/dev/null &
  dflockd_pid=$!
  wait_port "$dflockd_port"
  "$bench" peer --lockd "127.0.0.1:$lockd_port" --lockd-pid "$lockd_pid" \
    --redis "127.0.0.1:$redis_port" --redis-pid "$redis_pid" \
    --dflockd "127.0.0.1:$dflockd_port" --dflockd-pid "$dflockd_pid" \
    --rounds "$peer_rounds" "${quick[@]}" >>"$peer_rows"
  stop_servers
  peer_loads="$peer_loads; after it: $(loadavg)"
fi
load_after=$(loadavg)

cores=$(nproc)
mem=$(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)
cpu=$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')
{
  echo "Machine: ${cores} cores (${cpu:-unknown CPU}), ${mem} memory, Linux $(uname -r)."
  echo "Load average (1, 5, 15 min) before the run: $load_before; after it: $load_after."
  if [ ${#quick[@]} -gt 0 ]; then
    echo "**QUICK run** (QUICK=1): short runs and 1/10 sizes; not for publishing."
  fi
  if [ "$compare_only" = 0 ]; then
    echo
    echo "lockd $commit, $(redis-server --version | awk '{print $1, $2, $3}'), loopback, one load generator (tokio, $(nproc) worker threads) on the same cores."
    echo "Throughput and latency rows: median of $rounds round(s); scale and expiry rows: one run each on fresh servers."
    echo "$datadir_note"
    echo "Load average after the table: $load_after_table."
    echo
    "$bench" table "$rows"
  fi
  if [ "$comparing" = 1 ]; then
    echo
    echo "Same-run comparison, lockd alone: this lockd is $commit${baseline_bin:+, the baseline is $baseline_name}."
    echo "Load average (1 min) at the start of each round: ${round_loads[*]}."
    if [ "$tls_compare" != 0 ]; then
      echo "TLS: lockd \`--tls-cert\`/\`--tls-key\` with a CA and server certificate (ECDSA P-256) made for this run; the load generator uses rustls with the ring provider, as lockd does."
    fi
    echo
    "$bench" compare "$compare_rows"
  fi
  if [ -n "$dflockd_bin" ]; then
    echo
    echo "Peers, same servers throughout, $peer_rounds interleaved round(s): lockd $commit, dflockd ($("$dflockd_bin" --version 2>/dev/null | head -1 || true)), $(redis-server --version | awk '{print $1, $2, $3}')."
    echo "Load average before the peer rounds: $peer_loads."
    echo
    "$bench" peer-table "$peer_rows"
  fi
  echo
  all_rows=$rows
  if [ "$comparing" = 1 ]; then all_rows="$all_rows, $compare_rows"; fi
  if [ -n "$dflockd_bin" ]; then all_rows="$all_rows, $peer_rows"; fi
  echo "Took $(( $(date +%s) - started )) s. Rows: $all_rows"
}
