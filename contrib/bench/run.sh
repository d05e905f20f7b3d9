#!/usr/bin/env bash
# lockd against Redis locks, side by side, on loopback: builds both programs in release mode,
# starts redis-server (persistence off) and lockd on loopback ports, runs every scenario with
# one load generator, prints one markdown table, and stops what it started.
#
#   contrib/bench/run.sh            # full run (about 5-10 minutes on 2 cores)
#   QUICK=1 contrib/bench/run.sh    # smoke run: short and small
#
# Environment: LOCKD_PORT (17001), REDIS_PORT (17379), OUT (a directory for rows and logs),
# ROUNDS (3; 1 with QUICK): the throughput and latency scenarios run that many times, lockd and
# Redis in turn, and the table reports each measure's median, so a burst of other work on a
# shared machine does not decide a row.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

lockd_port=${LOCKD_PORT:-17001}
redis_port=${REDIS_PORT:-17379}
quick=()
rounds=${ROUNDS:-3}
if [ "${QUICK:-0}" != 0 ]; then
  quick=(--quick)
  rounds=${ROUNDS:-1}
fi
out=${OUT:-$(mktemp -d /tmp/lockbench.XXXXXX)}
mkdir -p "$out"
rows=$out/rows.tsv
: >"$rows"

# 10,000 waiting connections need more than 20,000 descriptors across client and servers.
# Where the hard limit can't be raised (a container without CAP_SYS_RESOURCE), take all of it.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

log() { echo "run.sh: $*" >&2; }
log "open-files limit: $(ulimit -n)"

if ! command -v redis-server >/dev/null 2>&1; then
  log "installing redis-server"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq redis-server >/dev/null
fi

log "building (release, with symbols for the profiles)"
cargo build --profile profiling --quiet --bin lockd
cargo build --release --quiet --manifest-path contrib/bench/Cargo.toml
lockd_bin=$root/target/profiling/lockd
bench=$root/contrib/bench/target/release/lockbench

lockd_pid=""
redis_pid=""
stop_servers() {
  for pid in $lockd_pid $redis_pid; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  lockd_pid=""
  redis_pid=""
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

# start_servers [extra lockd flags...]: a fresh lockd and a fresh, empty redis-server.
start_servers() {
  "$lockd_bin" --listen "127.0.0.1:$lockd_port" --max-connections 30000 \
    --max-locks 2000000 "$@" 2>>"$out/lockd.log" &
  lockd_pid=$!
  redis-server --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no \
    --maxclients 30000 --daemonize no --loglevel warning --dir "$out" \
    >>"$out/redis.log" 2>&1 &
  redis_pid=$!
  wait_port "$lockd_port"
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

started=$(date +%s)
for round in $(seq 1 "$rounds"); do
  log "round $round of $rounds"
  phase perf
done
phase waiters
phase held
phase expiry

datadir_note="lockd \`--help\` lists no \`--data-dir\` in this build: no durable-state rows."
if "$lockd_bin" --help | grep -q -- '--data-dir'; then
  log "scenario group: perf with --data-dir"
  data=$(mktemp -d "$out/data.XXXXXX")
  "$lockd_bin" --listen "127.0.0.1:$lockd_port" --max-connections 30000 \
    --max-locks 2000000 --data-dir "$data" 2>>"$out/lockd.log" &
  lockd_pid=$!
  wait_port "$lockd_port"
  "$bench" perf --lockd "127.0.0.1:$lockd_port" --lockd-pid "$lockd_pid" \
    --label lockd-datadir "${quick[@]}" >>"$rows"
  stop_servers
  rm -rf "$data"
  datadir_note="Rows marked \`--data-dir\` ran lockd with \`--data-dir\` (durable state), against the same in-memory Redis."
fi

cores=$(nproc)
mem=$(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)
cpu=$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)
{
  echo "Machine: ${cores} cores (${cpu:-unknown CPU}), ${mem} memory, Linux $(uname -r)."
  echo "lockd $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'), $(redis-server --version | awk '{print $1, $2, $3}'), loopback, one load generator (tokio, $(nproc) worker threads) on the same cores."
  echo "Throughput and latency rows: median of $rounds round(s); scale and expiry rows: one run each on fresh servers."
  if [ ${#quick[@]} -gt 0 ]; then
    echo "**QUICK run** (QUICK=1): short runs and 1/10 sizes; not for publishing."
  fi
  echo "$datadir_note"
  echo
  "$bench" table "$rows"
  echo
  echo "Took $(( $(date +%s) - started )) s. Rows: $rows"
}
