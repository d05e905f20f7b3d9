#!/usr/bin/env bash
# Four clients written like the old bash mutex client take turns on `lockd --compat` through
# real netcat, three rounds each; their recorded work intervals must never overlap.
#
# Usage: compat_nc.sh <path to lockd>
# The old server's environment configures lockd as it is: SERVER_ADDR, LOCK_PORT, UNLOCK_PORT,
# UNLOCK_PORT_TIMEOUT (defaults below: loopback and non-default ports).
set -euo pipefail

lockd=${1:?usage: compat_nc.sh <path to lockd>}
if ! command -v nc >/dev/null 2>&1; then
  echo "compat_nc.sh: nc (netcat) is not installed; install netcat-openbsd" >&2
  exit 2
fi

export SERVER_ADDR=${SERVER_ADDR:-127.0.0.1}
export LOCK_PORT=${LOCK_PORT:-15001}
export UNLOCK_PORT=${UNLOCK_PORT:-15002}
export UNLOCK_PORT_TIMEOUT=${UNLOCK_PORT_TIMEOUT:-30}
clients=4
rounds=3

work=$(mktemp -d)
lockd_pid=
cleanup() {
  if [ -n "$lockd_pid" ]; then
    kill "$lockd_pid" 2>/dev/null || true
    wait "$lockd_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "compat_nc.sh: $*" >&2
  echo "--- lockd log (last 40 lines)" >&2
  tail -n 40 "$work/lockd.log" >&2 || true
  exit 1
}

# The line protocol on a port of its own, so nothing collides with the two compat ports.
"$lockd" --compat --listen 127.0.0.1:0 -v >"$work/lockd.log" 2>&1 &
lockd_pid=$!

for _ in $(seq 200); do
  nc -z "$SERVER_ADDR" "$LOCK_PORT" 2>/dev/null && break
  kill -0 "$lockd_pid" 2>/dev/null || fail "lockd exited at start"
  sleep 0.05
done
nc -z "$SERVER_ADDR" "$LOCK_PORT" 2>/dev/null || fail "the lock port never opened"
if nc -z "$SERVER_ADDR" "$UNLOCK_PORT" 2>/dev/null; then
  fail "the unlock port is open while the lock is free"
fi

# The reply comes at once and the server closes: netcat exits long before its -w timeout.
started=$SECONDS
out=$(echo "lock:probe:$(date +%s)" | nc -w5 "$SERVER_ADDR" "$LOCK_PORT")
[ "$out" = oklocked ] || fail "probe lock answered '$out'"
out=$(echo "unlock:probe:$(date +%s)" | nc -w5 "$SERVER_ADDR" "$UNLOCK_PORT")
[ "$out" = okunlocked ] || fail "probe unlock answered '$out'"
[ $((SECONDS - started)) -lt 4 ] || fail "netcat waited for its timeout: the server did not close"

# The old client, as it was written: lock (retry until oklocked), work, unlock.
client() {
  local id=$1 round tries out start end
  for ((round = 1; round <= rounds; round++)); do
    tries=0
    while true; do
      out=$(echo "lock:$id:$(date +%s)" | nc -w2 "$SERVER_ADDR" "$LOCK_PORT" 2>/dev/null) || true
      [ "$out" = oklocked ] && break
      tries=$((tries + 1))
      [ "$tries" -lt 600 ] || { echo "$id: never got the lock" >&2; return 1; }
      sleep 0.1
    done
    start=$(date +%s%6N)
    # Which port is open tells the state.
    if nc -z "$SERVER_ADDR" "$LOCK_PORT" 2>/dev/null; then
      echo "$id: the lock port is open while $id holds the lock" >&2
      return 1
    fi
    sleep 0.2 # the work
    end=$(date +%s%6N)
    echo "$start $end $id $round" >>"$work/intervals"
    out=$(echo "unlock:$id:$(date +%s)" | nc -w2 "$SERVER_ADDR" "$UNLOCK_PORT" 2>/dev/null) || true
    [ "$out" = okunlocked ] || { echo "$id: unlock answered '$out'" >&2; return 1; }
  done
}

pids=()
for ((i = 1; i <= clients; i++)); do
  client "client-$i" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || status=1
done
[ "$status" -eq 0 ] || fail "a client failed"

[ -f "$work/intervals" ] || fail "no work was recorded"
count=$(wc -l <"$work/intervals")
[ "$count" -eq $((clients * rounds)) ] || fail "$count work intervals, expected $((clients * rounds))"

# Sorted by start, each interval must begin after every earlier one ended.
if ! sort -n "$work/intervals" | awk '
  NR > 1 && $1 < last_end { printf "overlap: %s %s starts before %s ended\n", $3, $4, last; bad = 1 }
  $2 > last_end { last_end = $2; last = $3 " " $4 }
  END { exit bad }' >&2; then
  sort -n "$work/intervals" >&2
  fail "work intervals overlap"
fi
echo "compat_nc.sh: $count work intervals by $clients netcat clients, none overlapping"
