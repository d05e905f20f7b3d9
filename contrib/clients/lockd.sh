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
#   LOCKD_ADDR        host:port of the server (default 127.0.0.1:5001; [v6]:port for IPv6),
#                     or several, comma-separated without spaces (a:5001,b:5001,c:5001):
#                     the front-ends of one lockd cluster, as for lockctl. Each connection
#                     tries them in turn from the first (lockd_run's renewer, after losing its
#                     connection, from the one after it, which it tries last); return code 3
#                     names them all if none connects. A LOCK that waits (lockd_lock,
#                     lockd_run) and loses its connection is sent again, same id, through
#                     the next one for the rest of its wait, so it keeps its place in the
#                     cluster's queue. Not for separate lockd servers: each
#                     would grant the same lock.
#   LOCKD_ID          the id sent with LOCK (default <hostname>:<pid>:<n>, the pid of the
#                     (sub)shell that calls, n counting its LOCKs: each LOCK a holder of its
#                     own, so two subshells never share an id, nor a grant)
#   LOCKD_IO_TIMEOUT  seconds to wait for a reply that should come at once (default 10)
#   LOCKD_KILL_AFTER  seconds lockd_run waits after SIGTERM before SIGKILL (default 10; at
#                     most a quarter of the lease's grace, so that CMD is gone before the
#                     lease could end)
#   LOCKD_NOTE        a note for people sent with every LOCK of lockd_lock, lockd_try and
#                     lockd_run ("release 1.4.2 by ci job 8812"): printable text, at most the
#                     server's --max-note bytes; STATUS, WATCH and refused LOCKs show it with
#                     the holder (proto.md, "Notes and blocked-by answers"). Empty: none.
#   LOCKD_USER        log in as this user (a lockd started with --auth-file): every
#                     connection, the renewer's reconnects included, starts with
#                     AUTH <user> <secret>; needs one of:
#   LOCKD_SECRET      the user's secret, or
#   LOCKD_SECRET_FILE a file whose first line is the secret (its line ending stripped)
#                     These are lockctl's variables: `lockctl run --user` passes LOCKD_USER
#                     and LOCKD_SECRET_FILE (or an inherited LOCKD_SECRET) on to its command.
#                     A user without a secret, a secret without a user, both LOCKD_SECRET and
#                     LOCKD_SECRET_FILE, or a login the server refuses (a wrong user or
#                     secret: ERR DENIED) return 2, as does any call without LOCKD_USER to a
#                     server that needs one (ERR NOAUTH). The secret is never printed, nor
#                     traced by `set -x`.
#   LOCKD_TLS_CA      connect over TLS, trusting the CA in this file (lockctl's --tls-ca);
#   LOCKD_TLS=1       the same with the system's CAs (lockctl's --tls);
#   LOCKD_CLIENT_CERT and LOCKD_CLIENT_KEY: present this client certificate (mutual TLS).
#                     bash has no TLS of its own: each connection is an `openssl s_client`
#                     (OpenSSL 3.0+) behind two pipes, which checks lockd's certificate
#                     against the host of LOCKD_ADDR. A certificate that is refused either
#                     way ends the connection: return code 3, openssl's reason in the message.
#
# Functions and what they return:
#   lockd_lock NAME [ttl=DUR] [wait=DUR] [MODE] [supersede] [and=NAME]...
#                                          waits for NAME (forever, or up to wait=); prints
#                                          the fencing token on stdout and sets LOCKD_TOKEN;
#                                          and=NAME (repeated): a set, every name at once or
#                                          none, a token per name (printed on one line, in
#                                          LOCKD_TOKENS; LOCKD_TOKEN is the first name's)
#   lockd_try NAME [ttl=DUR] [MODE] [and=NAME]...
#                                          lockd_lock with wait=0: one try, no waiting
#   lockd_unlock NAME TOKEN                releases the lease
#   lockd_renew NAME TOKEN [ttl=DUR]       extends the lease; prints ttl_ms on stdout
#   lockd_check NAME TOKEN                 is TOKEN the live lease? prints ttl_ms on stdout
#   lockd_break NAME [TOKEN] [force]       breaks NAME (every holder's lease, or TOKEN's);
#                                          prints how many; force: hand it on at once
#   lockd_status [NAME]                    prints every holder and waiter of NAME (or every
#                                          held lock) and sets LOCKD_MODE, LOCKD_HOLDERS,
#                                          LOCKD_WAITERS, LOCKD_HOLDER_NOTE (the first
#                                          holder's note, decoded; empty for none) and
#                                          LOCKD_HOLDER_AND (the other names of the first
#                                          holder's set, space-separated; empty for one name)
#   lockd_run NAME [ttl=DUR] [wait=DUR] [try] [session=DUR] [MODE] [supersede] [at_least=DUR]
#             [and=NAME]... -- CMD [ARGS...]
#                                          runs CMD holding NAME, renewing the lease in the
#                                          background; stops CMD if the lease is lost;
#                                          CMD sees LOCKD_NAME and LOCKD_TOKEN. at_least=:
#                                          if CMD ends sooner than DUR after the grant, NAME
#                                          stays held until then (once per window, as
#                                          lockctl run --at-least; needs bash 5)
#   lockd_watch [NAME]                     prints each change of NAME (or of every lock)
#                                          as it comes: KIND NAME ID TOKEN UNIX_MS
#   lockd_request LINE                     sends one raw protocol line; sets LOCKD_REPLY
#
# MODE, as lockctl's --exclusive, --shared and --limit N (proto.md, "Shared locks and
# semaphores"), one of:
#   exclusive  the lock alone (the default)
#   shared     beside any other shared holders, never beside an exclusive one
#   limit=N    one of N slots of a semaphore: up to N holders at once (limit=1 is exclusive)
# A name is one kind or the other while it is held or waited for: a LOCK that does not fit it
# (shared on a semaphore, another N, ...) is refused with ERR CONFLICT, return code 2. Each
# holder is one id: a LOCK by an id that already holds NAME is its retry and gets the same
# token back, so a script that takes two slots itself gives each its own LOCKD_ID.
#
# Return codes, the same as lockctl's exit codes:
#   0  done
#   1  not got: the lock is held by someone else (lockd_try, wait=0, try) or wait= ran out
#      (ERR TIMEOUT)
#   2  usage or refusal: bad arguments, refused locally or by the server (ERR SYNTAX, BADARG,
#      CONFLICT, REPLACED, LIMIT, SHUTDOWN, ...), or a reply this library does not understand
#   3  no server: cannot connect, or the connection ended or timed out without a reply
#   4  lock lost: UNLOCK/RENEW/CHECK found TOKEN is not the live lease (ERR NOTHELD), or
#      lockd_run lost its lease while CMD ran (and stopped CMD)
#   5  lockd was reached but could not serve the request (ERR UNAVAILABLE: a cluster
#      front-end cut off from etcd); lockd_lock and lockd_run send their LOCK again, through
#      the next address of LOCKD_ADDR, for the rest of wait= before they return it
#   6  superseded: a newer `supersede` request took this waiting one's place (ERR SUPERSEDED)
# lockd_run returns CMD's exit status when it ran and the lease held to its end (126/127 if
# CMD could not be run / was not found, 128+N if signal N ended it); so, as with flock(1),
# pick commands whose own codes you can tell apart, or look at LOCKD_ERROR (empty after a
# clean run). After a failure, LOCKD_ERROR holds the message (also printed on stderr) and
# LOCKD_REPLY the server's reply line, if there was one.
#
# Killed while waiting: a waiting LOCK is tied to its connection (lockd_lock sends `detach`,
# lockd_run a `session` LOCK), so a script killed while it waits leaves the queue at once and
# never gets the lock. `t=$(lockd_lock ...)` waits in a subshell that outlives a script killed
# on its own (kill PID rather than a Ctrl-C to the whole group); it notices within a second
# that the script ($$) is gone and gives up. A signal that lockd_run traps (INT, TERM, HUP)
# ends its wait within a second too.
#
# Leases: lockd_lock's lease is plain: each call opens its own short connection, so the lease
# must outlive it, until lockd_unlock or the end of its ttl. lockd_run holds a session lease
# with a grace (session=DUR, default 10s, at most the ttl) on a connection that its renewer
# keeps open: if lockd_run is killed, even with SIGKILL, the lock is free at most DUR later
# (at once when it can still release it: SIGINT, SIGTERM, SIGHUP, or its own shell killed
# alone while the renewer lives). If that connection drops while CMD runs (a server restart,
# a firewall reset), the renewer reconnects and renews within DUR and CMD runs on; if it
# cannot, the lease may be gone, and CMD is stopped (return code 4). session=0 ties the lease
# to the connection with no grace. A connect to a machine that does not answer at all blocks
# until the kernel gives up (bash's /dev/tcp has no connect timeout), before the next address
# of LOCKD_ADDR is tried.

LOCKD_TOKEN=
LOCKD_TOKENS=
LOCKD_REPLY=
LOCKD_ERROR=
LOCKD_MODE=
LOCKD_HOLDERS=0
LOCKD_WAITERS=0
LOCKD_HOLDER_NOTE=
LOCKD_HOLDER_AND=
# The address of LOCKD_ADDR of the latest connection, and its index in the list.
lockd__addr=
lockd__at=0

# Session grace of lockd_run when session= is not given, in ms.
LOCKD__DEFAULT_GRACE_MS=10000

# Prints "lockd: MESSAGE" on stderr, keeps it in LOCKD_ERROR and returns CODE.
lockd__fail() {
    LOCKD_ERROR=$2
    printf 'lockd: %s\n' "$2" >&2
    return "$1"
}

# Sets lockd__now to the time in milliseconds: bash 5's EPOCHREALTIME (its decimal mark may
# be a comma), else date(1). A variable rather than output for `$(...)`: the renewer reads
# the clock while lockd_run's TERM may come, and bash 5.2 fails to parse a multi-line TERM
# trap that runs during a command substitution ("trap: line 4: unexpected EOF while looking
# for matching `)'"; the subshell is then stuck, or ends with the wrong status), so the
# renewer's loop makes none (with EPOCHREALTIME).
lockd__clock() {
    if [[ -n ${EPOCHREALTIME:-} ]]; then
        local us=${EPOCHREALTIME//[.,]/}
        lockd__now=$((us / 1000))
    else
        lockd__now=$(date +%s%3N)
    fi
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

# Prints DUR in milliseconds. Knows the usual forms (250ms, 30s, 5m, 2h, 1d, 1h30m, plain
# seconds 30 or 1.5); returns 1 for any other (the server may still know it).
lockd__ms() {
    local rest=$1 total=0 n frac
    if [[ $rest =~ ^([0-9]{1,9})(\.([0-9]*))?$ ]]; then
        frac=${BASH_REMATCH[3]}000
        printf '%d\n' $((10#${BASH_REMATCH[1]} * 1000 + 10#${frac:0:3}))
        return 0
    fi
    [[ -n $rest ]] || return 1
    while [[ -n $rest ]]; do
        # A unit must be followed by the next number or the end: "5ms" is never "5m" + "s".
        [[ $rest =~ ^([0-9]{1,9})(ms|s|m|h|d)([0-9].*)?$ ]] || return 1
        n=$((10#${BASH_REMATCH[1]}))
        case ${BASH_REMATCH[2]} in
            s) n=$((n * 1000)) ;;
            m) n=$((n * 60000)) ;;
            h) n=$((n * 3600000)) ;;
            d) n=$((n * 86400000)) ;;
        esac
        total=$((total + n))
        rest=${BASH_REMATCH[3]}
    done
    printf '%d\n' "$total"
}

# Opens a connection to LOCKD_ADDR; its descriptor goes into the caller's lockd__fd. With
# several addresses they are tried in turn from the START-th (default 0, the first; counted
# round the list), and the first that connects (and logs in, if a user is set) is the one:
# lockd__addr and lockd__at say which. A login the server refuses is final (2), as it would be
# at every front-end.
lockd__connect() {
    local list=${LOCKD_ADDR:-127.0.0.1:5001} start=${1:-0} addrs=() addr host port i k n rc
    local probe=''
    if [[ $list == ,* || $list == *, || $list == *,,* || $list =~ [[:space:]] ]]; then
        lockd__fail 2 "LOCKD_ADDR must be host:port, or several comma-separated without spaces, not '$list'"
        return
    fi
    IFS=, read -r -a addrs <<<"$list"
    n=${#addrs[@]}
    for addr in "${addrs[@]}"; do
        host=${addr%:*}
        port=${addr##*:}
        if [[ -z $host || $addr != *:* || ! $port =~ ^[0-9]+$ ]]; then
            lockd__fail 2 "LOCKD_ADDR must be host:port, not '$addr'"
            return
        fi
    done
    for ((k = 0; k < n; k++)); do
        i=$(((start + k) % n))
        addr=${addrs[i]}
        host=${addr%:*}
        port=${addr##*:}
        host=${host#[}
        host=${host%]}
        if lockd__tls_wanted; then
            # openssl connects in the background: with somewhere else to go, a TCP probe first
            # tells a front-end that is down from one that is up.
            if ((n > 1)) && ! { exec {probe}<>"/dev/tcp/$host/$port"; } 2>/dev/null; then
                continue
            fi
            [[ -z ${probe:-} ]] || exec {probe}>&-
            lockd__tls_open "$host" "$port" || return
        # The group's redirection hides bash's own "connect: ..." noise; the fd stays open
        # after.
        elif ! { exec {lockd__fd}<>"/dev/tcp/$host/$port"; } 2>/dev/null; then
            continue
        fi
        lockd__addr=$addr lockd__at=$i
        rc=0
        lockd__login || rc=$?
        ((rc == 0)) && return 0
        lockd__disconnect
        # Cut off during the login: the next address may do better; a refusal would not.
        ((rc == 3 && k + 1 < n)) || return "$rc"
    done
    if ((n == 1)); then
        lockd__fail 3 "cannot connect to $list"
    else
        lockd__fail 3 "cannot connect to any of ${list//,/, }"
    fi
}

# Sends AUTH with LOCKD_USER and its secret on the new lockd__fd, if they are set (see the
# header). Runs with xtrace off, so that `set -x` never prints the secret.
lockd__login() {
    local traced=0 rc=0
    if [[ $- == *x* ]]; then
        traced=1
        set +x
    fi
    if [[ -n ${LOCKD_USER:-}${LOCKD_SECRET:-}${LOCKD_SECRET_FILE:-} ]]; then
        lockd__auth || rc=$?
    fi
    ((traced)) && set -x
    return "$rc"
}

lockd__auth() {
    local user=${LOCKD_USER:-} secret=${LOCKD_SECRET:-} file=${LOCKD_SECRET_FILE:-}
    local addr=$lockd__addr
    if [[ -n $secret && -n $file ]]; then
        lockd__fail 2 "the secret is given twice (LOCKD_SECRET and LOCKD_SECRET_FILE): give it one way"
        return
    fi
    if [[ -n $file ]]; then
        if [[ ! -r $file ]]; then
            lockd__fail 2 "cannot read the secret file $file"
            return
        fi
        IFS= read -r secret <"$file" || [[ -n $secret ]] || {
            lockd__fail 2 "the secret file $file is empty"
            return
        }
        secret=${secret%$'\r'}
    fi
    if [[ -z $user ]]; then
        lockd__fail 2 "a secret without a user: set LOCKD_USER"
        return
    fi
    if [[ -z $secret ]]; then
        lockd__fail 2 "LOCKD_USER=$user needs a secret: set LOCKD_SECRET or LOCKD_SECRET_FILE"
        return
    fi
    lockd__word LOCKD_USER "$user" || return
    if [[ $secret =~ [[:space:][:cntrl:]] || ${#secret} -gt 255 ]]; then
        lockd__fail 2 "the secret is not one word of at most 255 bytes"
        return
    fi
    lockd__exchange "AUTH $user $secret" || return
    case $LOCKD_REPLY in
        "OK $user" | OK) return 0 ;;
        # Every connection may do everything there.
        "ERR DENIED authentication is off"*) return 0 ;;
        "ERR DENIED "*)
            lockd__fail 2 "lockd at $addr refused to log in user $user ($LOCKD_REPLY): check LOCKD_USER and the secret"
            ;;
        ERR*) lockd__refused ;;
        *) lockd__fail 2 "unexpected reply to AUTH: $LOCKD_REPLY" ;;
    esac
}

# Closes the caller's lockd__fd, if open (and over TLS its openssl's output, lockd__rfd:
# openssl ends the connection when the last copy of its input is closed).
lockd__disconnect() {
    if [[ -n ${lockd__fd:-} ]]; then
        exec {lockd__fd}>&-
        lockd__fd=
    fi
    if [[ -n ${lockd__rfd:-} ]]; then
        exec {lockd__rfd}<&-
        lockd__rfd=
    fi
    if [[ -n ${lockd__tls_dir:-} ]]; then
        rm -rf "$lockd__tls_dir"
        lockd__tls_dir=
    fi
}

# Whether connections go over TLS (see the header).
lockd__tls_wanted() {
    [[ -n ${LOCKD_TLS_CA:-} || -n ${LOCKD_CLIENT_CERT:-} || ${LOCKD_TLS:-} == 1 ||
        ${LOCKD_TLS:-} == true ]]
}

# Opens a TLS connection to HOST PORT: openssl s_client in the background, its input written
# through the caller's lockd__fd and its output read through lockd__rfd (named pipes, unlinked
# once open; its messages in lockd__tls_dir/err). lockd's certificate must be signed by
# LOCKD_TLS_CA (else a CA of the system) and name HOST. openssl ends the connection at the end
# of its input (-no_ign_eof): when the last copy of lockd__fd is closed.
lockd__tls_open() {
    local host=$1 port=$2 dir opts=(-quiet -no_ign_eof -verify_return_error)
    if ! command -v openssl >/dev/null; then
        lockd__fail 2 "TLS (LOCKD_TLS_CA, LOCKD_TLS or LOCKD_CLIENT_CERT) needs openssl, which is not installed"
        return
    fi
    if [[ -n ${LOCKD_CLIENT_KEY:-} && -z ${LOCKD_CLIENT_CERT:-} ]]; then
        lockd__fail 2 "LOCKD_CLIENT_KEY without LOCKD_CLIENT_CERT"
        return
    fi
    local file
    for file in "${LOCKD_TLS_CA:-}" "${LOCKD_CLIENT_CERT:-}" "${LOCKD_CLIENT_KEY:-}"; do
        if [[ -n $file && ! -r $file ]]; then
            lockd__fail 2 "cannot read $file"
            return
        fi
    done
    # A line that starts with R, Q or k is a command to s_client (renegotiate, quit, key
    # update) unless it is told otherwise: RENEW and QUIT must go to lockd.
    if [[ -z ${lockd__nocommands:-} ]]; then
        lockd__nocommands=no
        if openssl s_client -help 2>&1 | grep -q -- -nocommands; then lockd__nocommands=yes; fi
    fi
    if [[ $lockd__nocommands != yes ]]; then
        lockd__fail 2 "TLS needs an openssl whose s_client has -nocommands (OpenSSL 3.0+)"
        return
    fi
    opts+=(-nocommands -connect "$host:$port")
    [[ -z ${LOCKD_TLS_CA:-} ]] || opts+=(-CAfile "$LOCKD_TLS_CA")
    if [[ $host =~ ^[0-9.]+$ || $host == *:* ]]; then
        opts+=(-verify_ip "$host")
    else
        opts+=(-verify_hostname "$host" -servername "$host")
    fi
    if [[ -n ${LOCKD_CLIENT_CERT:-} ]]; then
        opts+=(-cert "$LOCKD_CLIENT_CERT" -key "${LOCKD_CLIENT_KEY:-$LOCKD_CLIENT_CERT}")
    fi
    if ! dir=$(mktemp -d) || ! mkfifo "$dir/in" "$dir/out"; then
        lockd__fail 3 "cannot make the pipes to openssl"
        return
    fi
    openssl s_client "${opts[@]}" <"$dir/in" >"$dir/out" 2>"$dir/err" &
    exec {lockd__fd}>"$dir/in" {lockd__rfd}<"$dir/out"
    rm -f "$dir/in" "$dir/out"
    lockd__tls_dir=$dir
}

# Sends LINE on lockd__fd and reads one reply line into LOCKD_REPLY. PATIENCE is the number of
# seconds the reply may take (default LOCKD_IO_TIMEOUT), or "wait" for a LOCK that waits its
# turn: no limit, but it gives up when the script ($$) is gone or lockd_run caught a signal,
# looking once a second (a trapped signal does not interrupt bash's read).
lockd__exchange() {
    LOCKD_REPLY=
    # Written from a subshell: a write to a connection the server has reset raises SIGPIPE,
    # which must end that subshell (a failed send), not the caller's shell.
    if ! (printf '%s\n' "$1" >&"$lockd__fd") 2>/dev/null; then
        lockd__fail 3 "cannot send to $lockd__addr"
        return
    fi
    lockd__read "${2:-}"
}

# Reads one reply line from lockd__fd into LOCKD_REPLY (PATIENCE as for lockd__exchange).
lockd__read() {
    local patience=${1:-${LOCKD_IO_TIMEOUT:-10}} reply='' chunk rc=0
    local addr=$lockd__addr
    LOCKD_REPLY=
    if [[ $patience == wait ]]; then
        while :; do
            chunk='' rc=0
            IFS= read -r -t 1 -u "${lockd__rfd:-$lockd__fd}" chunk || rc=$?
            reply+=$chunk
            ((rc > 128)) || break # a whole line, or the end of the connection
            if [[ -n ${lockd__stopping:-} ]]; then
                lockd__fail 3 "stopped waiting for the reply: SIG$lockd__stopping"
                return
            fi
            if ! kill -0 "$$" 2>/dev/null; then
                lockd__fail 3 "stopped waiting for the reply: the script (pid $$) is gone"
                return
            fi
        done
    else
        IFS= read -r -t "$patience" -u "${lockd__rfd:-$lockd__fd}" reply || rc=$?
    fi
    reply=${reply%$'\r'}
    LOCKD_REPLY=$reply
    if ((rc != 0)) && [[ -z $reply ]]; then
        if ((rc > 128)); then
            lockd__fail 3 "no reply from $addr within ${patience}s"
        else
            local tls_why=''
            if [[ -n ${lockd__tls_dir:-} && -s $lockd__tls_dir/err ]]; then
                tls_why=$(grep -m1 -E ':error:|alert|verify error' "$lockd__tls_dir/err")
            fi
            lockd__fail 3 "$addr closed the connection without a reply${tls_why:+ (TLS: $tls_why)}"
        fi
        return
    fi
    return 0
}

# Sends LINE on a new connection and reads one reply line into LOCKD_REPLY (PATIENCE as for
# lockd__exchange).
lockd__roundtrip() {
    local lockd__fd='' lockd__rfd='' lockd__tls_dir='' rc=0
    lockd__connect || return
    lockd__exchange_round "$@" || rc=$?
    lockd__disconnect
    return "$rc"
}

# lockd__exchange on lockd__fd; answered ERR UNAVAILABLE (this front-end is cut off from etcd)
# with several addresses in LOCKD_ADDR, the same line once through each of the others in turn,
# as lockctl does: any front-end of a cluster serves any request. The last answer stays.
lockd__exchange_round() {
    local list=() tries=1
    IFS=, read -r -a list <<<"${LOCKD_ADDR:-127.0.0.1:5001}"
    lockd__exchange "$@" || return
    while [[ $LOCKD_REPLY == "ERR UNAVAILABLE"* ]] && ((tries < ${#list[@]})); do
        lockd__disconnect
        lockd__connect $((lockd__at + 1)) || return
        ((tries += 1))
        lockd__exchange "$@" || return
    done
    return 0
}

# Maps LOCKD_REPLY (an ERR line) to a return code, with its message on stderr.
lockd__refused() {
    local code=${LOCKD_REPLY#ERR }
    code=${code%% *}
    case $code in
        TIMEOUT) lockd__fail 1 "$LOCKD_REPLY" ;;
        NOTHELD) lockd__fail 4 "$LOCKD_REPLY" ;;
        SUPERSEDED) lockd__fail 6 "$LOCKD_REPLY" ;;
        UNAVAILABLE) lockd__fail 5 "$LOCKD_REPLY" ;;
        NOAUTH)
            lockd__fail 2 "$LOCKD_REPLY (set LOCKD_USER, and LOCKD_SECRET or LOCKD_SECRET_FILE)"
            ;;
        *) lockd__fail 2 "$LOCKD_REPLY" ;;
    esac
}

# Maps the reply to a LOCK: sets LOCKD_TOKEN for an OK, else returns the code of the refusal.
# A set's OK (and=: a token per name) sets LOCKD_TOKEN to the first name's and LOCKD_TOKENS to
# them all, space-separated, in the names' order (for one name, its token alone).
lockd__granted() {
    if [[ $LOCKD_REPLY =~ ^OK\ ([0-9]+)((\ [0-9]+)*)$ ]]; then
        LOCKD_TOKEN=${BASH_REMATCH[1]}
        LOCKD_TOKENS=${LOCKD_REPLY#OK }
        return 0
    fi
    if [[ $LOCKD_REPLY == ERR* ]]; then
        lockd__refused
        return
    fi
    lockd__fail 2 "unexpected reply to LOCK: $LOCKD_REPLY"
}

# Sets lockd__var to the variable that carries NAME's token to a set's job, as lockctl names it:
# LOCKD_TOKEN_ and NAME upper-cased, every byte but an ASCII letter or digit made `_`.
lockd__token_var() {
    local LC_ALL=C name=$1 i c out=LOCKD_TOKEN_
    for ((i = 0; i < ${#name}; i++)); do
        c=${name:i:1}
        case $c in
            [a-z]) c=${c^^} ;;
            [A-Z0-9]) ;;
            *) c=_ ;;
        esac
        out+=$c
    done
    lockd__var=$out
}

# Splits ttl=/wait=/session= options and the mode words (as in the protocol) into the named
# variables of the caller. Usage: lockd__options ALLOWED "$@"; sets lockd__ttl, lockd__wait,
# lockd__try, lockd__session and lockd__mode (the LOCK option of the mode: '' for exclusive,
# `shared` or `limit=N`). ALLOWED names the options taken; `mode` stands for exclusive, shared
# and limit=N, of which one at most may be given (as lockctl's --exclusive, --shared, --limit).
lockd__options() {
    local allowed=$1 opt mode_word='' expected
    shift
    lockd__ttl='' lockd__wait='' lockd__try='' lockd__session='' lockd__mode=''
    lockd__supersede='' lockd__at_least=''
    [[ $allowed == *and* ]] && lockd__and=()
    for opt in "$@"; do
        case $opt in
            and=*)
                if [[ $allowed == *and* ]]; then
                    lockd__word name "${opt#and=}" || return
                    lockd__and+=("${opt#and=}")
                    continue
                fi
                ;;
            at_least=*)
                [[ $allowed == *at_least* ]] && lockd__at_least=${opt#at_least=} && continue
                ;;
            supersede) [[ $allowed == *supersede* ]] && lockd__supersede=1 && continue ;;
            ttl=*) [[ $allowed == *ttl* ]] && lockd__ttl=${opt#ttl=} && continue ;;
            wait=*) [[ $allowed == *wait* ]] && lockd__wait=${opt#wait=} && continue ;;
            session=*)
                [[ $allowed == *session* ]] && lockd__session=${opt#session=} && continue
                ;;
            try) [[ $allowed == *try* ]] && lockd__try=1 && continue ;;
            exclusive | shared | limit=*)
                if [[ $allowed == *mode* ]]; then
                    if [[ -n $mode_word ]]; then
                        lockd__fail 2 \
                            "use one of exclusive, shared and limit=N, not $mode_word and $opt"
                        return
                    fi
                    mode_word=$opt
                    [[ $opt == exclusive ]] || lockd__mode=$opt
                    continue
                fi
                ;;
        esac
        expected=${allowed// /, }
        expected=${expected//mode/exclusive, shared, limit=N}
        lockd__fail 2 "unknown option '$opt' (expected: $expected)"
        return
    done
    if [[ -n $lockd__ttl ]]; then lockd__word ttl "$lockd__ttl" || return; fi
    if [[ -n $lockd__wait ]]; then lockd__word wait "$lockd__wait" || return; fi
    if [[ -n $lockd__session ]]; then lockd__word session "$lockd__session" || return; fi
    if [[ -n $lockd__at_least ]] && { ! lockd__ms "$lockd__at_least" >/dev/null ||
        [[ -z ${EPOCHREALTIME:-} ]]; }; then
        lockd__fail 2 "at_least= must be a duration such as 50m or 90s (and needs bash 5): '$lockd__at_least'"
        return
    fi
    local limit=${lockd__mode#limit=}
    if [[ $lockd__mode == limit=* && ! $limit =~ ^[0-9]{1,9}$ ]]; then
        lockd__fail 2 "limit= must be a whole number of holders, 1 to 100000: '$limit'"
        return
    fi
    return 0
}

# Sets the caller's line to the LOCK of NAME by the caller's id, with the caller's lockd__ttl,
# lockd__wait and lockd__mode (see lockd__options); the caller adds detach or session.
lockd__lock_line() {
    line="LOCK $1 $id"
    [[ -n $lockd__ttl ]] && line+=" ttl=$lockd__ttl"
    [[ -n $lockd__mode ]] && line+=" $lockd__mode"
    [[ -n ${lockd__supersede:-} ]] && line+=" supersede"
    local further
    for further in ${lockd__and[@]+"${lockd__and[@]}"}; do line+=" and=$further"; done
    return 0
}

# Sends the LOCK in LINE (without its wait=, added here from lockd__wait) on lockd__fd and
# reads its answer into LOCKD_REPLY, waiting as long as the LOCK does. If the connection drops
# before the answer and LOCKD_ADDR lists several front-ends, the same LOCK (same id) is sent
# through the next one for the rest of the wait: a lockd cluster gives it back its place in
# the queue, or the grant made to it meanwhile (proto.md, cluster mode). An ERR UNAVAILABLE
# or ERR SHUTDOWN (this front-end cannot serve it now) is sent again the same way, with a
# backoff (50ms doubling to 1s, jittered), through the next address (with one address, on
# the same connection after an UNAVAILABLE), for the rest of the wait (as long as it takes
# without one; each address once with wait=0): the same id gets back a grant whose answer
# was lost. When the wait is over, the last answer is the one returned.
lockd__lock_exchange() {
    local base=$1 wait_ms='' left='' rc sent=0 list=() started=${EPOCHREALTIME/./}
    local note=${LOCKD_NOTE:-}
    if [[ $note == *[[:cntrl:]]* ]]; then
        lockd__fail 2 "LOCKD_NOTE has a control character; a note is printable text"
        return
    fi
    local pause_ms=50 nap_ms
    IFS=, read -r -a list <<<"${LOCKD_ADDR:-127.0.0.1:5001}"
    if [[ -n $lockd__wait && -n $started ]]; then
        wait_ms=$(lockd__ms "$lockd__wait") || wait_ms=''
    fi
    while :; do
        local line=$base
        if [[ -n $wait_ms ]]; then
            left=$((wait_ms - (${EPOCHREALTIME/./} - started) / 1000))
            ((left > 0)) || left=0
            line+=" wait=${left}ms"
        elif [[ -n $lockd__wait ]]; then
            line+=" wait=$lockd__wait"
        fi
        # Last: note= takes the rest of the line.
        [[ -n $note ]] && line+=" note=$note"
        rc=0
        lockd__exchange "$line" wait || rc=$?
        ((sent += 1))
        if ((rc == 0)) && [[ -z ${lockd__stopping:-} ]] &&
            [[ $LOCKD_REPLY == "ERR UNAVAILABLE"* || $LOCKD_REPLY == "ERR SHUTDOWN"* ]]; then
            nap_ms=$((pause_ms / 2 + RANDOM % (pause_ms / 2 + 1)))
            if [[ $wait_ms == 0 ]]; then
                # No waiting: one try per address, no pause.
                ((sent < ${#list[@]})) || return 0
                nap_ms=0
            elif [[ -n $wait_ms ]]; then
                left=$((wait_ms - (${EPOCHREALTIME/./} - started) / 1000))
                ((left > 0)) || return 0
                ((nap_ms < left)) || nap_ms=$left
            elif [[ -n $lockd__wait ]]; then
                # A wait= without a clock to count it (bash < 5): a few rounds.
                ((sent <= 2 * ${#list[@]})) || return 0
            fi
            if ((${#list[@]} > 1)) || [[ $LOCKD_REPLY == "ERR SHUTDOWN"* ]]; then
                lockd__disconnect
                lockd__connect $((lockd__at + 1)) || return
            fi
            if ((nap_ms > 0)); then
                lockd__to_secs "$nap_ms"
                lockd__nap "$lockd__secs"
            fi
            pause_ms=$((pause_ms * 2))
            ((pause_ms <= 1000)) || pause_ms=1000
            continue
        fi
        # Only a connection lost before the answer goes on, while there is time and another
        # address; every address tried twice in a row is enough.
        [[ $rc == 3 && -z $LOCKD_REPLY && -z ${lockd__stopping:-} ]] || return "$rc"
        [[ $LOCKD_ERROR == *"closed the connection"* || $LOCKD_ERROR == "cannot send"* ]] ||
            return "$rc"
        ((${#list[@]} > 1 && sent <= 2 * ${#list[@]})) || return "$rc"
        [[ -z $left ]] || ((left > 0)) || return "$rc"
        lockd__disconnect
        lockd__connect $((lockd__at + 1)) || return
    done
}

# Sends one raw request line and reads one reply line into LOCKD_REPLY. Returns 0 for an OK
# reply, else the codes above. For STATUS use lockd_status; for WATCH, nc.
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

# Sets the caller's id to LOCKD_ID, or a new one for this LOCK (a holder of its own: the same
# id is the same client to lockd, whose LOCK again would get the same grant); returns 2 if it
# is not one word.
lockd__id() {
    if [[ -n ${LOCKD_ID:-} ]]; then
        id=$LOCKD_ID
    else
        lockd__ids=$((${lockd__ids:-0} + 1))
        id=${HOSTNAME:-localhost}:$BASHPID:$lockd__ids
    fi
    lockd__word id "$id"
}

# lockd_lock NAME [ttl=DUR] [wait=DUR] [exclusive | shared | limit=N] [supersede]: waits for the lock
# (forever without wait=), then prints its fencing token on stdout and sets LOCKD_TOKEN.
# Returns 1 if wait= ran out. The lease is plain (it outlives this call), but the wait is not:
# `detach` ends it if the script dies. `shared` holds the lock beside other shared holders,
# `limit=N` takes one of N slots of a semaphore; exclusive, alone, is the default.
# `supersede`: newest wins (proto.md): if the lock is held, every request waiting for it is
# refused (ERR SUPERSEDED, return code 6 for each) and this one waits first in line.
# `and=NAME` (repeated): a set, every name taken at once or none (proto.md, Several names at
# once); it prints a token per name on one line, space-separated in the names' order, and
# sets LOCKD_TOKENS to them (LOCKD_TOKEN: the first name's).
lockd_lock() {
    LOCKD_ERROR='' LOCKD_TOKEN='' LOCKD_TOKENS=''
    local name=${1:-} id line
    if (($# < 1)); then
        lockd__fail 2 "usage: lockd_lock NAME [ttl=DUR] [wait=DUR] [exclusive | shared | limit=N] [supersede] [and=NAME]..."
        return
    fi
    shift
    local lockd__ttl lockd__wait lockd__try lockd__session lockd__mode lockd__supersede
    local lockd__and=()
    lockd__options "ttl wait mode supersede and" "$@" || return
    if [[ -n $lockd__supersede && ${#lockd__and[@]} -gt 0 ]]; then
        lockd__fail 2 "lockd_lock: supersede takes one name, not a set (and=)"
        return
    fi
    lockd__word name "$name" || return
    lockd__id || return
    lockd__lock_line "$name"
    local lockd__fd='' lockd__rfd='' lockd__tls_dir='' rc=0
    lockd__connect || return
    lockd__lock_exchange "$line detach" || rc=$?
    lockd__disconnect
    ((rc == 0)) || return "$rc"
    lockd__granted || return
    local tokens=()
    read -r -a tokens <<<"$LOCKD_TOKENS"
    if ((${#tokens[@]} != 1 + ${#lockd__and[@]})); then
        lockd__fail 2 "unexpected reply to LOCK: $LOCKD_REPLY"
        return
    fi
    printf '%s\n' "$LOCKD_TOKENS"
}

# lockd_try NAME [ttl=DUR] [exclusive | shared | limit=N] [and=NAME]...: one try (wait=0).
# Returns 1 at once if the lock is held (in a way this request does not fit beside); of a set
# (and=), if any of its names is held or waited for, and then it takes none of them.
lockd_try() {
    if (($# < 1)); then
        lockd__fail 2 "usage: lockd_try NAME [ttl=DUR] [exclusive | shared | limit=N] [and=NAME]..."
        return
    fi
    local name=$1
    shift
    local lockd__ttl lockd__wait lockd__try lockd__session lockd__mode lockd__and=() further
    lockd__options "ttl mode and" "$@" || return
    local also=()
    for further in ${lockd__and[@]+"${lockd__and[@]}"}; do also+=("and=$further"); done
    lockd_lock "$name" ${lockd__ttl:+"ttl=$lockd__ttl"} ${lockd__mode:+"$lockd__mode"} wait=0 \
        ${also[@]+"${also[@]}"}
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
    local lockd__ttl lockd__wait lockd__try lockd__session lockd__mode
    if [[ $verb == RENEW ]]; then
        lockd__options "ttl" "$@" || return
        [[ -n $lockd__ttl ]] && line+=" ttl=$lockd__ttl"
    elif (($# > 0)); then
        lockd__fail 2 "usage: lockd_${verb,,} NAME TOKEN"
        return
    fi
    lockd__roundtrip "$line" || return
    lockd__answered "$verb"
}

# Maps the reply to UNLOCK, RENEW or CHECK to a return code; prints the ttl_ms it carries.
lockd__answered() {
    case $LOCKD_REPLY in
        OK) return 0 ;;
        "OK ttl_ms="*)
            printf '%s\n' "${LOCKD_REPLY#OK ttl_ms=}"
            return 0
            ;;
        ERR*) lockd__refused ;;
        *) lockd__fail 2 "unexpected reply to $1: $LOCKD_REPLY" ;;
    esac
}

# lockd_unlock NAME TOKEN: releases the lease. Returns 4 if TOKEN no longer held it.
lockd_unlock() { lockd__with_token UNLOCK "$@"; }

# lockd_renew NAME TOKEN [ttl=DUR]: extends the lease; prints the new ttl in ms. Returns 4 if
# the lease is gone: the caller has lost the lock and must stop.
lockd_renew() { lockd__with_token RENEW "$@"; }

# lockd_check NAME TOKEN: returns 0 (and prints the ttl left in ms) if TOKEN is the live lease,
# 4 if it is not.
lockd_check() { lockd__with_token CHECK "$@"; }

# lockd_break NAME [TOKEN] [force]: breaks NAME (BREAK): every holder's lease, or only
# TOKEN's, ends for its holder, whose next renewal returns 4 with who broke it in LOCKD_ERROR;
# prints how many leases it broke. The next waiter is granted (with a higher token) once the
# broken holder releases the lease or its deadline passes; with force, at once (the broken
# job may still run). Needs the admin right on NAME when the server has an auth file.
# Returns 4 if nothing (or no lease with TOKEN) holds NAME.
lockd_break() {
    local name=${1:-} token=${2:-} line force=
    LOCKD_ERROR=
    if (($# >= 2)) && [[ ${!#} == force ]]; then
        force=" force"
        set -- "${@:1:$#-1}"
        token=${2:-}
    fi
    if (($# < 1 || $# > 2)); then
        lockd__fail 2 "usage: lockd_break NAME [TOKEN] [force]"
        return
    fi
    lockd__word name "$name" || return
    line="BREAK $name"
    if (($# == 2)); then
        if [[ ! $token =~ ^[0-9]+$ ]]; then
            lockd__fail 2 "token must be a positive integer: '$token'"
            return
        fi
        line+=" $token"
    fi
    line+=$force
    lockd__roundtrip "$line" || return
    case $LOCKD_REPLY in
        "OK broken="*)
            printf '%s\n' "${LOCKD_REPLY#OK broken=}"
            return 0
            ;;
        ERR*) lockd__refused ;;
        *) lockd__fail 2 "unexpected reply to BREAK: $LOCKD_REPLY" ;;
    esac
}

# lockd_status [NAME]: prints the server's answer to `STATUS NAME detail`, one line each: a
# HOLDER line per holder (in grant order), a WAITER line per waiter (in queue order), each
# with its mode=exclusive, shared or limit:N, then the OK line (`OK NAME free` alone for a
# free lock); proto.md has their fields. A HOLDER or WAITER line of a set (LOCK ... and=) ends
# with an and=NAME field per other name of the set (before the holder's note=). Sets
# LOCKD_MODE (exclusive, shared or limit:N; empty when free), LOCKD_HOLDERS and LOCKD_WAITERS
# (how many), LOCKD_HOLDER_NOTE (the first holder's note, decoded) and LOCKD_HOLDER_AND (the
# other names of the first holder's set, space-separated, in its LOCK's order; empty for a
# lease of one name). Without NAME: one INFO line per held lock, then `OK COUNT`.
# LOCKD_REPLY holds the OK line.
lockd_status() {
    LOCKD_ERROR='' LOCKD_MODE='' LOCKD_HOLDERS=0 LOCKD_WAITERS=0 LOCKD_HOLDER_NOTE=''
    LOCKD_HOLDER_AND=''
    local line=STATUS holder_lines=0 lockd__fd='' lockd__rfd='' lockd__tls_dir='' rc=0 word
    local words=()
    if (($# > 1)); then
        lockd__fail 2 "usage: lockd_status [NAME]"
        return
    fi
    if (($# == 1)); then
        lockd__word name "$1" || return
        line="STATUS $1 detail"
    fi
    lockd__connect || return
    lockd__exchange_round "$line" || rc=$?
    while ((rc == 0)); do
        case $LOCKD_REPLY in
            "HOLDER "* | "WAITER "* | "INFO "*)
                if [[ $LOCKD_REPLY == "HOLDER "* ]]; then
                    holder_lines=$((holder_lines + 1))
                    if ((holder_lines == 1)); then
                        read -r -a words <<<"$LOCKD_REPLY"
                        for word in "${words[@]}"; do
                            [[ $word == and=* ]] && LOCKD_HOLDER_AND+="${LOCKD_HOLDER_AND:+ }${word#and=}"
                        done
                    fi
                fi
                printf '%s\n' "$LOCKD_REPLY"
                lockd__read || rc=$?
                ;;
            *) break ;;
        esac
    done
    lockd__disconnect
    ((rc == 0)) || return "$rc"
    case $LOCKD_REPLY in
        "OK "*) printf '%s\n' "$LOCKD_REPLY" ;;
        ERR*)
            lockd__refused
            return
            ;;
        *)
            lockd__fail 2 "unexpected reply to STATUS: $LOCKD_REPLY"
            return
            ;;
    esac
    if [[ $LOCKD_REPLY == "OK "*" held "* ]]; then
        # An exclusive lock's line has no holders= or mode=: its one HOLDER line says it all.
        LOCKD_MODE=exclusive LOCKD_HOLDERS=$holder_lines
        [[ $LOCKD_REPLY =~ \ mode=([^ ]+) ]] && LOCKD_MODE=${BASH_REMATCH[1]}
        [[ $LOCKD_REPLY =~ \ holders=([0-9]+) ]] && LOCKD_HOLDERS=${BASH_REMATCH[1]}
        [[ $LOCKD_REPLY =~ \ waiters=([0-9]+) ]] && LOCKD_WAITERS=${BASH_REMATCH[1]}
        # The note is percent-encoded (%XX): printf %b reads \xXX.
        if [[ $LOCKD_REPLY =~ \ note=([^ ]+)$ ]]; then
            local encoded=${BASH_REMATCH[1]//\\/%5C}
            printf -v LOCKD_HOLDER_NOTE '%b' "${encoded//%/\\x}"
        fi
    fi
    return 0
}

# lockd_watch [NAME]: WATCH NAME (every lock without one) on a connection of its own, and
# prints each event on stdout as it comes, one line: KIND NAME ID TOKEN UNIX_MS (KIND is
# acquired, released, expired or dropped: a session lease whose connection closed; UNIX_MS
# the server's clock). Says "lockd: watching NAME" on stderr once lockd has confirmed the
# watch (events from then on are seen). Runs until lockd ends the watch with an ERR (LAGGED:
# this watcher read too slowly; SHUTDOWN: 2), the connection ends (3), or the script is gone.
# For example: lockd_watch deploy | while read -r kind name id token ms; do ...; done
lockd_watch() {
    LOCKD_ERROR=
    local line=WATCH lockd__fd='' lockd__rfd='' lockd__tls_dir='' rc=0
    if (($# > 1)); then
        lockd__fail 2 "usage: lockd_watch [NAME]"
        return
    fi
    if (($# == 1)); then
        lockd__word name "$1" || return
        line="WATCH $1"
    fi
    lockd__connect || return
    lockd__exchange_round "$line" || rc=$?
    if ((rc == 0)) && [[ $LOCKD_REPLY != "OK watching"* ]]; then
        if [[ $LOCKD_REPLY == ERR* ]]; then
            lockd__refused || rc=$?
        else
            lockd__fail 2 "unexpected reply to WATCH: $LOCKD_REPLY" || rc=$?
        fi
    fi
    if ((rc == 0)); then
        printf 'lockd: %s\n' "${LOCKD_REPLY#OK }" >&2
        while :; do
            lockd__read wait || {
                rc=$?
                break
            }
            case $LOCKD_REPLY in
                "EVENT "*) printf '%s\n' "${LOCKD_REPLY#EVENT }" ;;
                ERR*)
                    lockd__refused || rc=$?
                    break
                    ;;
            esac
        done
    fi
    lockd__disconnect
    return "$rc"
}

# Sleeps SECONDS in a way that a TERM to this shell interrupts at once, without leaving a
# sleep process behind holding the caller's stdout or stderr open.
lockd__nap() {
    sleep "$1" &
    lockd__nap_pid=$!
    wait "$lockd__nap_pid" 2>/dev/null
    lockd__nap_pid=
}

# Sets lockd__secs to MS milliseconds in seconds, 1234 -> 1.234 (sleep and read -t take
# fractional seconds); at least 0.05 s. A variable, as lockd__clock sets one.
lockd__to_secs() {
    local ms=$1
    ((ms < 50)) && ms=50
    printf -v lockd__secs '%d.%03d' $((ms / 1000)) $((ms % 1000))
}

# Stops CMD_PID: TERM, then KILL after GRACE_MS (default LOCKD_KILL_AFTER seconds).
lockd__stop_command() {
    local cmd_pid=$1 waited=0 grace_ms=${2:-$((${LOCKD_KILL_AFTER:-10} * 1000))}
    kill -TERM "$cmd_pid" 2>/dev/null || true
    while kill -0 "$cmd_pid" 2>/dev/null && ((waited < grace_ms / 100)); do
        lockd__nap 0.1
        waited=$((waited + 1))
    done
    kill -KILL "$cmd_pid" 2>/dev/null || true
}

# RENEWs on the session connection (lockd__fd); if that connection is gone, reconnects and
# RENEWs on the new one, which the server then ties the lease to. Sets ttl_ms of the caller.
# The reconnect starts at the address after the one lost: with several front-ends, that one
# may be the one that is down. With UNTIL_MS (a time as lockd__clock tells it), no reply is waited
# for past it.
lockd__renew_session() {
    local name=$1 token=$2 patience=$3 until_ms=${4:-} rc=0 left_ms
    if [[ -n ${lockd__fd:-} ]]; then
        lockd__exchange "RENEW $name $token" "$patience" || rc=$?
    else
        rc=3
    fi
    if ((rc == 3)); then
        lockd__disconnect
        if [[ -n $until_ms ]]; then
            lockd__clock
            left_ms=$((until_ms - lockd__now))
            if ((left_ms <= 0)); then
                lockd__fail 3 "no time left to renew on another connection"
                return
            fi
            lockd__to_secs "$left_ms"
            patience=$lockd__secs
        fi
        lockd__connect $((lockd__at + 1)) || return
        rc=0
        lockd__exchange "RENEW $name $token" "$patience" || rc=$?
    fi
    ((rc == 0)) || return "$rc"
    lockd__answered RENEW >/dev/null || return
    ttl_ms=${LOCKD_REPLY#OK ttl_ms=}
}

# Releases the lease: on the session connection (lockd__fd) if it is still up, else on a new
# one. Quiet: if both fail, the lease ends by its grace or ttl.
lockd__release() {
    lockd__exchange "UNLOCK $1 $2" >/dev/null 2>&1 ||
        lockd_unlock "$1" "$2" >/dev/null 2>&1 || true
}

# Whether PID (a child of this shell) still runs: not yet exited, or exited but not reaped
# (a zombie, which kill still reaches). Without /proc it can't tell, and says no.
lockd__running() {
    local stat
    [[ -r /proc/$1/stat ]] || return 1
    stat=$(</proc/"$1"/stat) 2>/dev/null || return 1
    stat=${stat##*) }
    [[ ${stat%% *} != Z ]]
}

# at_least=: makes the lease a plain one (RENEW ... detach) that ends WINDOW_MS after the
# grant (GRANTED_US, EPOCHREALTIME in microseconds), on the session connection (lockd__fd)
# if it is still up, else on a new one. Returns 0 when lockd keeps it, 7 when the window is
# already over (nothing to keep), 6 when lockd did not keep it (said on stderr).
lockd__keep() {
    local name=$1 token=$2 window_ms=$3 granted_us=$4 left_ms rc=0
    left_ms=$((window_ms - (${EPOCHREALTIME/./} - granted_us) / 1000))
    ((left_ms > 0)) || return 7
    local line="RENEW $name $token ttl=${left_ms}ms detach"
    if [[ -n ${lockd__fd:-} ]]; then
        lockd__exchange "$line" && lockd__answered RENEW >/dev/null || rc=$?
    else
        lockd_request "$line" >/dev/null 2>&1 || rc=$?
    fi
    if ((rc != 0)); then
        printf 'lockd_run: at_least=%s: could not keep %s held (%s); releasing it\n' \
            "${lockd__at_least:-${window_ms}ms}" "$name" "${LOCKD_REPLY:-$LOCKD_ERROR}" >&2
        return 6
    fi
}

# The renewal loop of lockd_run, run as a background subshell that owns the session
# connection (lockd__fd). It works to a deadline: the time the latest RENEW that got through
# was sent (SENT_MS, first), plus how long the lease surely lives without another (the grace,
# or the ttl if shorter; the ttl for session=0): the server extended the lease after that
# send, and still had the connection then. It renews every third of that time, each reply
# waited for no later than the moment the command must be stopped: a margin (a tenth, 20ms
# to 2s) and the kill grace (LOCKD_KILL_AFTER, at most a quarter) before the deadline. When
# the lease is refused, or that moment comes with no renewal through, it stops the command
# (TERM, then KILL before the deadline) and exits 4: the command is stopped before lockd can
# grant the lock to anyone else. When lockd_run's own shell (OWNER) is gone, killed, it stops
# the command and releases the lock. A TERM from lockd_run ends it with 0, or with 4 if it had
# already found the lease lost. A USR1 (at_least=, given as WINDOW_MS after GRANTED_US, the
# grant's EPOCHREALTIME in microseconds) ends it after lockd__keep on its own connection,
# with lockd__keep's status (4 if the lease was lost first): the lease is made plain before
# the session connection closes, which would end a session=0 lease at once.
lockd__renewer() {
    local name=$1 token=$2 cmd_pid=$3 ttl_ms=$4 grace_ms=$5 owner=$6 last_sent=$7
    local window_ms=${8:-} granted_us=${9:-}
    local why='' hold_ms every_ms margin_ms kill_ms stop_at next_at now sent left rc
    local retry_ms=100 max_ms failed=''
    lockd__nap_pid='' lockd__lost='' lockd__keeping=''
    trap 'if [[ -n $lockd__nap_pid ]]; then kill "$lockd__nap_pid" 2>/dev/null || true; fi
          if [[ -n $lockd__lost ]]; then exit 4; fi
          exit 0' TERM
    trap 'lockd__keeping=1
          if [[ -n $lockd__nap_pid ]]; then kill "$lockd__nap_pid" 2>/dev/null || true; fi' USR1
    # How long the lease surely lives without a RENEW getting through: the grace (none for
    # session=0), but never past the ttl.
    hold_ms=$ttl_ms every_ms=$ttl_ms
    ((grace_ms > 0 && grace_ms < hold_ms)) && hold_ms=$grace_ms
    ((grace_ms > 0 && grace_ms < every_ms)) && every_ms=$grace_ms
    margin_ms=$((hold_ms / 10))
    ((margin_ms >= 20)) || margin_ms=20
    ((margin_ms <= 2000)) || margin_ms=2000
    kill_ms=$((${LOCKD_KILL_AFTER:-10} * 1000))
    ((kill_ms <= hold_ms / 4)) || kill_ms=$((hold_ms / 4))
    while :; do
        stop_at=$((last_sent + hold_ms - margin_ms - kill_ms))
        if [[ -n $failed ]]; then
            lockd__clock
            next_at=$((lockd__now + retry_ms))
        else
            next_at=$((last_sent + every_ms / 3))
        fi
        ((next_at <= stop_at)) || next_at=$stop_at
        lockd__clock
        now=$lockd__now
        if ((next_at > now)) && [[ -z $lockd__keeping ]]; then
            lockd__to_secs $((next_at - now))
            lockd__nap "$lockd__secs"
        fi
        if [[ -n $lockd__keeping ]]; then
            rc=0
            lockd__keep "$name" "$token" "$window_ms" "$granted_us" || rc=$?
            exit "$rc"
        fi
        if ! kill -0 "$owner" 2>/dev/null; then
            printf 'lockd: lockd_run (pid %s) is gone; stopping its command (pid %s)\n' \
                "$owner" "$cmd_pid" >&2
            lockd__stop_command "$cmd_pid" "$kill_ms"
            lockd__release "$name" "$token"
            exit 0
        fi
        lockd__clock
        sent=$lockd__now
        left=$((stop_at - sent))
        if ((left <= 0)); then
            why="no renewal got through within $((hold_ms - margin_ms - kill_ms))ms${LOCKD_ERROR:+: $LOCKD_ERROR}"
        else
            rc=0
            # No reply is waited for past the moment the command must be stopped.
            lockd__to_secs "$left"
            lockd__renew_session "$name" "$token" "$lockd__secs" "$stop_at" \
                >/dev/null 2>&1 || rc=$?
            case $rc in
                0) last_sent=$sent failed='' retry_ms=100 ;;
                3 | 5)
                    # The server may be restarting, or another front-end may serve: again
                    # soon, while the lease surely lives; after an ERR UNAVAILABLE through the
                    # next address, if there is one.
                    if ((rc == 5)) && [[ ${LOCKD_ADDR:-} == *,* ]]; then lockd__disconnect; fi
                    failed=1
                    max_ms=$((every_ms / 10))
                    ((max_ms >= 100)) || max_ms=100
                    retry_ms=$((retry_ms * 2))
                    ((retry_ms <= max_ms)) || retry_ms=$max_ms
                    ;;
                *) why="RENEW refused: $LOCKD_ERROR" ;;
            esac
        fi
        if [[ -n $why ]]; then
            lockd__lost=1
            printf 'lockd: lease on %s lost (%s); stopping the command (pid %s)\n' \
                "$name" "$why" "$cmd_pid" >&2
            lockd__stop_command "$cmd_pid" "$kill_ms"
            exit 4
        fi
    done
}

# lockd_run NAME [ttl=DUR] [wait=DUR] [try] [session=DUR] [exclusive | shared | limit=N] -- CMD
# [ARGS...]: takes the lock (waiting, or once with `try`; exclusive, or as lockd_lock's shared
# or limit=N) with a session lease of grace session= (default 10s, at most the ttl), runs CMD
# while a background job renews the lease, then releases it. If the lease
# is lost (renewal refused, or none got through within the grace, less a tenth and the kill
# grace: see lockd__renewer) CMD gets
# SIGTERM (SIGKILL LOCKD_KILL_AFTER seconds later, at most a quarter of the grace: both
# before lockd could grant the lock to anyone else) and lockd_run returns 4. The signal goes
# to CMD's process only: a CMD that starts children of its own should pass it on to them (or
# `exec` its last command). Otherwise lockd_run returns CMD's status. CMD keeps this shell's
# stdin, stdout and stderr, and gets LOCKD_NAME and LOCKD_TOKEN in its environment (pass the
# token on to what you protect). `and=NAME` (repeated) takes a set, every name at once or none
# (proto.md, Several names at once), as `lockctl run NAME NAME...` does: one lease, renewed and
# released through its first name; CMD also gets LOCKD_NAMES (the names, space-separated),
# LOCKD_TOKENS (their tokens, in the same order) and LOCKD_TOKEN_<NAME> per name (upper-cased,
# every byte but a letter or digit `_`: db-migrate gives LOCKD_TOKEN_DB_MIGRATE; two names that
# give the same variable are refused, return code 2, before anything is sent).
lockd_run() {
    LOCKD_ERROR=
    local name=${1:-}
    local usage="usage: lockd_run NAME [ttl=DUR] [wait=DUR] [try] [session=DUR]"
    usage+=" [exclusive | shared | limit=N] [supersede] [at_least=DUR] [and=NAME]..."
    usage+=" -- CMD [ARGS...]"
    if (($# < 1)); then
        lockd__fail 2 "$usage"
        return
    fi
    shift
    local opts=()
    while (($# > 0)) && [[ $1 != -- ]]; do
        opts+=("$1")
        shift
    done
    if (($# < 2)); then
        lockd__fail 2 "$usage"
        return
    fi
    shift
    local lockd__ttl lockd__wait lockd__try lockd__session lockd__mode lockd__supersede id
    local lockd__at_least granted_us='' lockd__and=()
    local grace_ms=$LOCKD__DEFAULT_GRACE_MS
    lockd__options "ttl wait try session mode supersede at_least and" ${opts[@]+"${opts[@]}"} ||
        return
    if [[ -n $lockd__supersede && ${#lockd__and[@]} -gt 0 ]]; then
        lockd__fail 2 "lockd_run: supersede takes one name, not a set (and=)"
        return
    fi
    # A set's job gets a token variable per name: two names must not give the same one.
    local names=() set_env=() further seen=' '
    names=("$name" ${lockd__and[@]+"${lockd__and[@]}"})
    if ((${#names[@]} > 1)); then
        for further in "${names[@]}"; do
            lockd__token_var "$further"
            if [[ $seen == *" $lockd__var "* ]]; then
                lockd__fail 2 "lockd_run: two names give the variable $lockd__var; rename one"
                return
            fi
            seen+="$lockd__var "
            set_env+=("$lockd__var")
        done
    fi
    if [[ -n $lockd__try && -n $lockd__wait ]]; then
        lockd__fail 2 "lockd_run: use try or wait=, not both"
        return
    fi
    [[ -n $lockd__try ]] && lockd__wait=0
    if [[ -n $lockd__session ]] && ! grace_ms=$(lockd__ms "$lockd__session"); then
        lockd__fail 2 "session= must be a duration such as 10s, 500ms or 1m: '$lockd__session'"
        return
    fi
    local given_ttl_ms
    if [[ -n $lockd__ttl ]] && given_ttl_ms=$(lockd__ms "$lockd__ttl") &&
        ((given_ttl_ms < grace_ms)); then
        grace_ms=$given_ttl_ms
    fi
    lockd__word name "$name" || return
    lockd__id || return
    local line
    lockd__lock_line "$name"
    if ((grace_ms > 0)); then line+=" session=${grace_ms}ms"; else line+=" session"; fi
    # Signals are caught from before the LOCK is sent, so that one arriving between the grant
    # and the start of CMD still releases the lock rather than leaving it held for a whole ttl.
    local saved_traps lockd__stopping='' forwarded=''
    saved_traps=$(trap -p INT TERM HUP)
    trap 'lockd__stopping=INT' INT
    trap 'lockd__stopping=TERM' TERM
    trap 'lockd__stopping=HUP' HUP
    local rc=0 token='' ttl_ms='' lockd__fd='' lockd__rfd='' lockd__tls_dir=''
    LOCKD_TOKEN=
    lockd__connect || rc=$?
    if ((rc == 0)); then lockd__lock_exchange "$line" || rc=$?; fi
    if ((rc == 0)); then lockd__granted || rc=$?; fi
    local tokens=()
    if ((rc == 0)); then
        read -r -a tokens <<<"$LOCKD_TOKENS"
        if ((${#tokens[@]} != ${#names[@]})); then
            lockd__fail 2 "unexpected reply to LOCK: $LOCKD_REPLY" || rc=$?
            if ((${#tokens[@]} > 0)); then lockd__release "$name" "${tokens[0]}"; fi
            tokens=()
        fi
    fi
    # at_least= counts from here, no earlier than the grant.
    granted_us=${EPOCHREALTIME/./}
    local renewed_at=''
    if ((rc == 0)); then
        token=$LOCKD_TOKEN
        # A first renewal right away tells us the lease length in ms, whatever form ttl= took,
        # and a time the lease surely lives from (its send).
        lockd__clock
        renewed_at=$lockd__now
        lockd__renew_session "$name" "$token" "${LOCKD_IO_TIMEOUT:-10}" || rc=$?
    fi
    if ((rc != 0)) || [[ -n $lockd__stopping ]]; then
        if [[ -n $token ]]; then lockd__release "$name" "$token"; fi
        lockd__disconnect
        trap - INT TERM HUP
        eval "$saved_traps"
        if [[ -n $lockd__stopping ]]; then kill "-$lockd__stopping" "$BASHPID"; fi
        return "$rc"
    fi
    # Explicit <&0: a background job of a non-interactive shell would otherwise get /dev/null,
    # and ignore SIGINT and SIGQUIT (so a Ctrl-C or a forwarded INT would not reach it): the
    # subshell takes them back before it becomes CMD. CMD does not get the session connection:
    # it must close when lockd_run's renewer ends.
    (
        trap - INT QUIT
        # Nor, over TLS, openssl's output.
        if [[ -n $lockd__rfd ]]; then exec {lockd__rfd}<&-; fi
        export LOCKD_NAME=$name LOCKD_TOKEN=$token
        if ((${#names[@]} > 1)); then
            export LOCKD_NAMES="${names[*]}" LOCKD_TOKENS="${tokens[*]}"
            for i in "${!set_env[@]}"; do export "${set_env[i]}=${tokens[i]}"; done
        fi
        if [[ $(type -t -- "$1") == file ]]; then exec "$@"; fi
        "$@"
    ) <&0 {lockd__fd}>&- &
    local cmd_pid=$!
    # The words of a background command are expanded in its own process: take this shell's
    # pid first.
    local owner=$BASHPID
    local window_ms=''
    if [[ -n $lockd__at_least ]]; then window_ms=$(lockd__ms "$lockd__at_least"); fi
    # The renewer starts with USR1 ignored, until it sets its own trap: a USR1 that comes
    # before (a command that ended at once) is lost, not fatal, and is sent again (below).
    local usr1_trap
    usr1_trap=$(trap -p USR1)
    trap '' USR1
    lockd__renewer "$name" "$token" "$cmd_pid" "$ttl_ms" "$grace_ms" "$owner" "$renewed_at" \
        "$window_ms" "$granted_us" &
    local renew_pid=$!
    if [[ -n $usr1_trap ]]; then eval "$usr1_trap"; else trap - USR1; fi
    # The renewer owns the connection now; this shell releases on a connection of its own.
    lockd__disconnect
    local cmd_rc=0
    while :; do
        # A trapped signal caught before this wait (while the command was being started)
        # does not interrupt it: pass it on first, or the command would run to its end.
        if [[ -n $lockd__stopping && -z $forwarded ]]; then
            forwarded=1
            kill "-$lockd__stopping" "$cmd_pid" 2>/dev/null || true
        fi
        cmd_rc=0
        wait "$cmd_pid" 2>/dev/null || cmd_rc=$?
        if [[ -n $lockd__stopping && -z $forwarded ]]; then
            # A trapped signal woke us: pass it on once, then wait for the command to end.
            forwarded=1
            kill "-$lockd__stopping" "$cmd_pid" 2>/dev/null || true
            continue
        fi
        kill -0 "$cmd_pid" 2>/dev/null || break
    done
    # at_least=: a job that ended before its window is over leaves the lock held, as a plain
    # lease that lockd ends when the window is (RENEW ... detach; nobody renews it). The
    # renewer does it on its own connection, before that connection closes (USR1).
    local renew_rc=0 keep=''
    if [[ -n $lockd__at_least && -z $lockd__stopping && -n $granted_us ]]; then keep=1; fi
    if [[ -n $keep ]]; then
        # Again until it is done: one sent before its trap was set went unseen.
        while kill -USR1 "$renew_pid" 2>/dev/null && lockd__running "$renew_pid"; do
            sleep 0.02
        done
    else
        kill -TERM "$renew_pid" 2>/dev/null || true
    fi
    wait "$renew_pid" 2>/dev/null || renew_rc=$?
    trap - INT TERM HUP
    eval "$saved_traps"
    if ((renew_rc == 4)); then
        lockd__fail 4 "lease on $name lost while the command ran; it was stopped"
        return
    fi
    # 143: our TERM came before the renewer had set its trap (a command that ended at once).
    case $renew_rc in
        0) ;;
        6 | 7) keep='' ;; # not kept (said so), or the window is over: released below
        143) ;;
        *)
            lockd__fail 4 "lease on $name may have lapsed: its renewal job ended (status $renew_rc)"
            return
            ;;
    esac
    if [[ -n $keep ]]; then
        LOCKD_ERROR=
        return "$cmd_rc"
    fi
    lockd_unlock "$name" "$token" >/dev/null || true
    LOCKD_ERROR=
    if [[ -n $lockd__stopping ]]; then
        # End as the caller would have without us: of the same signal (its traps restored).
        kill "-$lockd__stopping" "$BASHPID"
    fi
    return "$cmd_rc"
}
