#!/usr/bin/env bash
# example.sh DIR: the README's example, a command run under the lock, renewed in the
# background: DIR/deploy.sh (conformance/run-bash runs it against a real lockd).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PATH=$here:$PATH # `.` finds lockd.sh on the PATH
cd "${1:?usage: example.sh DIR}"
# README begin
. lockd.sh # $LOCKD_ADDR, or 127.0.0.1:5001
lockd_run deploy ttl=30s -- ./deploy.sh # SIGTERM the moment the lease is lost; $LOCKD_TOKEN
# README end
