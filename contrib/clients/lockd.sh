# shellcheck shell=bash
# lockd.sh: a bash client library for lockd (see proto.md). Needs bash 4.1+ and nothing else:
# it talks TCP through bash's own /dev/tcp, so no netcat.
#
# Use it from a script in three lines:
#
#     #!/usr/bin/env bash
#     . /usr/local/share/lockd/lockd.sh
#     lockd_run nightly-backup ttl=1m -- /usr/local/bin/backup.sh
#
# Configuration (environment variables, read at each call):
#   LOCKD_ADDR        host:port of the server (default 127.0.0.1:5001; [v6]:port for IPv6)
#   LOCKD_ID          the id sent with LOCK (default <hostname>:<pid of this shell>)
#   LOCKD_IO_TIMEOUT  seconds to wait for a reply that should come at once (default 10)
#   LOCKD_KILL_AFTER  seconds lockd_run waits after SIGTERM before SIGKILL (default 10)
#
# Functions and what they return:
#   lockd_lock NAME [ttl=DUR] [wait=DUR]   waits for NAME (forever, or up to wait=); prints
#                                          the fencing token on stdout and sets LOCKD_TOKEN
#   lockd_try NAME [ttl=DUR]               lockd_lock with wait=0: one try, no waiting
#   lockd_unlock NAME TOKEN                releases the lease
#   lockd_renew NAME TOKEN [ttl=DUR]       extends the lease; prints ttl_ms on stdout
#   lockd_check NAME TOKEN                 is TOKEN the live lease? prints ttl_ms on stdout
#   lockd_run NAME [ttl=DUR] [wait=DUR] [try] -- CMD [ARGS...]
#                                          runs CMD holding NAME, renewing the lease in the
#                                          background; stops CMD if the lease is lost;
#                                          CMD sees LOCKD_NAME and LOCKD_TOKEN
#   lockd_request LINE                     sends one raw protocol line; sets LOCKD_REPLY
#
# Return codes of every function but lockd_run's command:
#   0  done
#   1  not got or not held: LOCK found the lock held (ERR TIMEOUT), or UNLOCK/RENEW/CHECK
#      found the token is not the live lease (ERR NOTHELD)
#   2  usage: bad arguments, refused locally or by the server (ERR SYNTAX, BADARG, ...)
#   3  no server: cannot connect, or the connection ended or timed out without a reply
#   4  any other server refusal (ERR CONFLICT, REPLACED, LIMIT, SHUTDOWN, ...)
#   5  (lockd_run only) the lease was lost while CMD ran, and CMD was stopped
# After a failure, LOCKD_ERROR holds the message (also printed on stderr) and LOCKD_REPLY the
# server's reply line, if there was one. lockd_run returns CMD's exit status when it ran and
# the lease held to its end; so, as with flock(1), pick commands whose own codes you can tell
# apart, or look at LOCKD_ERROR (empty after a clean run).
#
# Leases are plain (not `session`): each call opens its own short connection, so the lease
# must outlive it. A script killed while holding loses the lock when the ttl ends (lockd_run
# releases at once on SIGINT, SIGTERM and SIGHUP).

LOCKD_TOKEN=
LOCKD_REPLY=
LOCKD_ERROR=

# Prints "lockd: MESSAGE" on stderr, keeps it in LOCKD_ERROR and returns CODE.
lockd__fail() {
    LOCKD_ERROR=$2
    printf 'lockd: %s\n' "$2" >&2
    return "$1"
}

# A name, id, token or duration must be one non-empty word of printable characters: anything
# else could split the request or smuggle in a second line.
lockd__word() {
    local what=$1 value=$2
    if [[ -z $value || $value =~ [[:space:][:cntrl:]] ]]; then
        lockd__fail 2 "$what must be one word without spaces or control characters: '$value'"
        return
    fi
    if ((${#value} > 255)); then
        lockd__fail 2 "$what is longer than 255 bytes"
        return
    fi
}

# Sends LINE on a new connection and reads one reply line into LOCKD_REPLY. A second argument
# "wait" reads without a time limit (a LOCK answered when its turn comes).
lockd__roundtrip() {
    local line=$1 patience=${2:-} addr=${LOCKD_ADDR:-127.0.0.1:5001}
    local host port fd reply='' limit=${LOCKD_IO_TIMEOUT:-10}
    LOCKD_REPLY=
    host=${addr%:*}
    port=${addr##*:}
    host=${host#[}
    host=${host%]}
    if [[ -z $host || $addr != *:* || ! $port =~ ^[0-9]+$ ]]; then
        lockd__fail 2 "LOCKD_ADDR must be host:port, not '$addr'"
        return
    fi
    # The group's redirection hides bash's own "connect: ..." noise; the fd stays open after.
    if ! { exec {fd}<>"/dev/tcp/$host/$port"; } 2>/dev/null; then
        lockd__fail 3 "cannot connect to $addr"
        return
    fi
    if ! { printf '%s\n' "$line" >&"$fd"; } 2>/dev/null; then
        exec {fd}>&-
        lockd__fail 3 "cannot send to $addr"
        return
    fi
    local ok=0
    if [[ $patience == wait ]]; then
        IFS= read -r -u "$fd" reply || ok=$?
    else
        IFS= read -r -t "$limit" -u "$fd" reply || ok=$?
    fi
    exec {fd}>&-
    reply=${reply%$'\r'}
    LOCKD_REPLY=$reply
    if ((ok != 0)) && [[ -z $reply ]]; then
        if ((ok > 128)); then
            lockd__fail 3 "no reply from $addr within ${limit}s"
        else
            lockd__fail 3 "$addr closed the connection without a reply"
        fi
        return
    fi
    return 0
}

# Maps LOCKD_REPLY (an ERR line) to a return code, with its message on stderr.
lockd__refused() {
    local code=${LOCKD_REPLY#ERR }
    code=${code%% *}
    case $code in
        TIMEOUT | NOTHELD) lockd__fail 1 "$LOCKD_REPLY" ;;
        SYNTAX | UNKNOWN | BADARG | ENCODING | TOOLONG) lockd__fail 2 "$LOCKD_REPLY" ;;
        *) lockd__fail 4 "$LOCKD_REPLY" ;;
    esac
}

# Splits ttl=/wait= options (as in the protocol) into the named variables of the caller.
# Usage: lockd__options ALLOWED "$@"; sets lockd__ttl, lockd__wait, lockd__try.
lockd__options() {
    local allowed=$1 opt
    shift
    lockd__ttl='' lockd__wait='' lockd__try=''
    for opt in "$@"; do
        case $opt in
            ttl=*) [[ $allowed == *ttl* ]] && lockd__ttl=${opt#ttl=} && continue ;;
            wait=*) [[ $allowed == *wait* ]] && lockd__wait=${opt#wait=} && continue ;;
            try) [[ $allowed == *try* ]] && lockd__try=1 && continue ;;
        esac
        lockd__fail 2 "unknown option '$opt' (expected: ${allowed// /, })"
        return
    done
    if [[ -n $lockd__ttl ]]; then lockd__word ttl "$lockd__ttl" || return; fi
    if [[ -n $lockd__wait ]]; then lockd__word wait "$lockd__wait" || return; fi
    return 0
}

# Sends one raw request line and reads one reply line into LOCKD_REPLY. Returns 0 for an OK
# reply, else the codes above. For a reply of several lines (STATUS, WATCH), use nc.
lockd_request() {
    LOCKD_ERROR=
    if (($# != 1)) || [[ -z $1 || $1 == *$'\n'* ]]; then
        lockd__fail 2 "usage: lockd_request 'ONE PROTOCOL LINE'"
        return
    fi
    lockd__roundtrip "$1" wait || return
    [[ $LOCKD_REPLY == OK || $LOCKD_REPLY == "OK "* ]] && return 0
    lockd__refused
}

# lockd_lock NAME [ttl=DUR] [wait=DUR]: waits for the lock (forever without wait=), then prints
# its fencing token on stdout and sets LOCKD_TOKEN. Returns 1 if wait= ran out.
lockd_lock() {
    LOCKD_ERROR='' LOCKD_TOKEN=''
    local name=${1:-} id=${LOCKD_ID:-${HOSTNAME:-localhost}:$$} line
    if (($# < 1)); then
        lockd__fail 2 "usage: lockd_lock NAME [ttl=DUR] [wait=DUR]"
        return
    fi
    shift
    local lockd__ttl lockd__wait lockd__try
    lockd__options "ttl wait" "$@" || return
    lockd__word name "$name" || return
    lockd__word id "$id" || return
    line="LOCK $name $id"
    [[ -n $lockd__ttl ]] && line+=" ttl=$lockd__ttl"
    [[ -n $lockd__wait ]] && line+=" wait=$lockd__wait"
    lockd__roundtrip "$line" wait || return
    if [[ $LOCKD_REPLY =~ ^OK\ ([0-9]+)$ ]]; then
        LOCKD_TOKEN=${BASH_REMATCH[1]}
        printf '%s\n' "$LOCKD_TOKEN"
        return 0
    fi
    if [[ $LOCKD_REPLY == ERR* ]]; then
        lockd__refused
        return
    fi
    lockd__fail 4 "unexpected reply to LOCK: $LOCKD_REPLY"
}

# lockd_try NAME [ttl=DUR]: one try (wait=0). Returns 1 at once if the lock is held.
lockd_try() {
    if (($# < 1)); then
        lockd__fail 2 "usage: lockd_try NAME [ttl=DUR]"
        return
    fi
    local name=$1
    shift
    local lockd__ttl lockd__wait lockd__try
    lockd__options "ttl" "$@" || return
    lockd_lock "$name" ${lockd__ttl:+"ttl=$lockd__ttl"} wait=0
}

# Shared by unlock, renew and check: VERB NAME TOKEN [ttl=DUR].
lockd__with_token() {
    local verb=$1 name=${2:-} token=${3:-} line
    LOCKD_ERROR=
    if (($# < 3)); then
        lockd__fail 2 "usage: lockd_${verb,,} NAME TOKEN"
        return
    fi
    shift 3
    lockd__word name "$name" || return
    if [[ ! $token =~ ^[0-9]+$ ]]; then
        lockd__fail 2 "token must be a positive integer: '$token'"
        return
    fi
    line="$verb $name $token"
    local lockd__ttl lockd__wait lockd__try
    if [[ $verb == RENEW ]]; then
        lockd__options "ttl" "$@" || return
        [[ -n $lockd__ttl ]] && line+=" ttl=$lockd__ttl"
    elif (($# > 0)); then
        lockd__fail 2 "usage: lockd_${verb,,} NAME TOKEN"
        return
    fi
    lockd__roundtrip "$line" || return
    case $LOCKD_REPLY in
        OK) return 0 ;;
        "OK ttl_ms="*)
            printf '%s\n' "${LOCKD_REPLY#OK ttl_ms=}"
            return 0
            ;;
        ERR*) lockd__refused ;;
        *) lockd__fail 4 "unexpected reply to $verb: $LOCKD_REPLY" ;;
    esac
}

# lockd_unlock NAME TOKEN: releases the lease. Returns 1 if TOKEN no longer held it.
lockd_unlock() { lockd__with_token UNLOCK "$@"; }

# lockd_renew NAME TOKEN [ttl=DUR]: extends the lease; prints the new ttl in ms. Returns 1 if
# the lease is gone: the caller has lost the lock and must stop.
lockd_renew() { lockd__with_token RENEW "$@"; }

# lockd_check NAME TOKEN: returns 0 (and prints the ttl left in ms) if TOKEN is the live lease.
lockd_check() { lockd__with_token CHECK "$@"; }

# Sleeps SECONDS in a way that a TERM to this shell interrupts at once, without leaving a
# sleep process behind holding the caller's stdout or stderr open.
lockd__nap() {
    sleep "$1" &
    lockd__nap_pid=$!
    wait "$lockd__nap_pid" 2>/dev/null
    lockd__nap_pid=
}

# The renewal loop of lockd_run, run as a background subshell: renews every third of the
# lease; on ERR NOTHELD, or when the server stayed unreachable for a whole lease, it stops
# the command (TERM, then KILL after LOCKD_KILL_AFTER seconds) and exits 5. A TERM from
# lockd_run ends it with 0, or with 5 if it had already found the lease lost.
lockd__renewer() {
    local name=$1 token=$2 cmd_pid=$3 ttl_ms=$4 renew_rc
    local last_ok=$SECONDS why=''
    lockd__nap_pid='' lockd__lost=''
    trap 'if [[ -n $lockd__nap_pid ]]; then kill "$lockd__nap_pid" 2>/dev/null || true; fi
          if [[ -n $lockd__lost ]]; then exit 5; fi
          exit 0' TERM
    while :; do
        lockd__nap "$(lockd__ms_to_s $((ttl_ms / 3)))"
        renew_rc=0
        lockd_renew "$name" "$token" >/dev/null 2>&1 || renew_rc=$?
        case $renew_rc in
            0)
                [[ $LOCKD_REPLY =~ ^OK\ ttl_ms=([0-9]+)$ ]] && ttl_ms=${BASH_REMATCH[1]}
                last_ok=$SECONDS
                ;;
            3)
                # The server may be restarting: keep trying while the lease could still live.
                if (((SECONDS - last_ok) * 1000 >= ttl_ms)); then
                    why="the server was unreachable for a whole lease: $LOCKD_ERROR"
                fi
                ;;
            *) why="RENEW refused: $LOCKD_ERROR" ;;
        esac
        if [[ -n $why ]]; then
            lockd__lost=1
            printf 'lockd: lease on %s lost (%s); stopping the command (pid %s)\n' \
                "$name" "$why" "$cmd_pid" >&2
            kill -TERM "$cmd_pid" 2>/dev/null || true
            local waited=0 grace=${LOCKD_KILL_AFTER:-10}
            while kill -0 "$cmd_pid" 2>/dev/null && ((waited < grace * 10)); do
                lockd__nap 0.1
                waited=$((waited + 1))
            done
            kill -KILL "$cmd_pid" 2>/dev/null || true
            exit 5
        fi
    done
}

# 1234 -> 1.234 (sleep takes fractional seconds); at least 0.05 s.
lockd__ms_to_s() {
    local ms=$1
    ((ms < 50)) && ms=50
    printf '%d.%03d' $((ms / 1000)) $((ms % 1000))
}

# lockd_run NAME [ttl=DUR] [wait=DUR] [try] -- CMD [ARGS...]: takes the lock (waiting, or
# once with `try`), runs CMD while a background job renews the lease every third of its ttl,
# then releases it. If the lease is lost (renewal refused, or the server unreachable for a
# whole ttl) CMD gets SIGTERM (SIGKILL LOCKD_KILL_AFTER seconds later) and lockd_run returns 5.
# The signal goes to CMD's process only: a CMD that starts children of its own should pass
# it on to them (or `exec` its last command). Otherwise lockd_run returns CMD's status.
# CMD keeps this shell's stdin, stdout and stderr, and gets LOCKD_NAME and LOCKD_TOKEN in its
# environment (pass the token on to what you protect).
lockd_run() {
    LOCKD_ERROR=
    local name=${1:-}
    if (($# < 1)); then
        lockd__fail 2 "usage: lockd_run NAME [ttl=DUR] [wait=DUR] [try] -- CMD [ARGS...]"
        return
    fi
    shift
    local opts=()
    while (($# > 0)) && [[ $1 != -- ]]; do
        opts+=("$1")
        shift
    done
    if (($# < 2)); then
        lockd__fail 2 "usage: lockd_run NAME [ttl=DUR] [wait=DUR] [try] -- CMD [ARGS...]"
        return
    fi
    shift
    local lockd__ttl lockd__wait lockd__try
    lockd__options "ttl wait try" ${opts[@]+"${opts[@]}"} || return
    if [[ -n $lockd__try && -n $lockd__wait ]]; then
        lockd__fail 2 "lockd_run: use try or wait=, not both"
        return
    fi
    [[ -n $lockd__try ]] && lockd__wait=0
    # Signals are caught from before the LOCK is sent, so that one arriving between the grant
    # and the start of CMD still releases the lock rather than leaving it held for a whole ttl.
    local saved_traps stopping='' forwarded=''
    saved_traps=$(trap -p INT TERM HUP)
    trap 'stopping=INT' INT
    trap 'stopping=TERM' TERM
    trap 'stopping=HUP' HUP
    local rc=0 token=''
    lockd_lock "$name" ${lockd__ttl:+"ttl=$lockd__ttl"} ${lockd__wait:+"wait=$lockd__wait"} \
        >/dev/null || rc=$?
    if ((rc == 0)); then
        token=$LOCKD_TOKEN
        # A first renewal right away tells us the lease length in ms, whatever form ttl= took.
        lockd_renew "$name" "$token" >/dev/null || rc=$?
        [[ $rc == 1 ]] && rc=5
    fi
    if ((rc != 0)) || [[ -n $stopping ]]; then
        if [[ -n $token ]]; then lockd_unlock "$name" "$token" >/dev/null 2>&1 || true; fi
        trap - INT TERM HUP
        eval "$saved_traps"
        if [[ -n $stopping ]]; then kill "-$stopping" "$BASHPID"; fi
        return "$rc"
    fi
    local ttl_ms=${LOCKD_REPLY#OK ttl_ms=}
    # Explicit <&0: a background job of a non-interactive shell would otherwise get /dev/null.
    LOCKD_NAME=$name LOCKD_TOKEN=$token "$@" <&0 &
    local cmd_pid=$!
    lockd__renewer "$name" "$token" "$cmd_pid" "$ttl_ms" &
    local renew_pid=$!
    local cmd_rc=0
    while :; do
        cmd_rc=0
        wait "$cmd_pid" 2>/dev/null || cmd_rc=$?
        if [[ -n $stopping && -z $forwarded ]]; then
            # A trapped signal woke us: pass it on once, then wait for the command to end.
            forwarded=1
            kill "-$stopping" "$cmd_pid" 2>/dev/null || true
            continue
        fi
        kill -0 "$cmd_pid" 2>/dev/null || break
    done
    local renew_rc=0
    kill -TERM "$renew_pid" 2>/dev/null || true
    wait "$renew_pid" 2>/dev/null || renew_rc=$?
    trap - INT TERM HUP
    eval "$saved_traps"
    if ((renew_rc == 5)); then
        lockd__fail 5 "lease on $name lost while the command ran; it was stopped"
        return
    fi
    lockd_unlock "$name" "$token" >/dev/null || true
    LOCKD_ERROR=
    if [[ -n $stopping ]]; then
        # End as the caller would have without us: of the same signal (its traps restored).
        kill "-$stopping" "$BASHPID"
    fi
    return "$cmd_rc"
}
