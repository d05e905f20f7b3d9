"""A dependency-free Python 3.8+ client for lockd (the line protocol of proto.md).

The quick way, a lock held for the body of a ``with`` and renewed in the background::

    from lockd_client import lock

    with lock("deploy", server="127.0.0.1:5001", ttl=30) as token:
        deploy(fencing_token=token)

The lease is a session lease with a grace (``session=10`` seconds by default, at most the
ttl): if this process dies, even by SIGKILL, the server frees the lock at most that long
after, rather than when the ttl ends; if the connection drops (a server restart, a firewall
reset), the renewal thread reconnects and renews within the grace and the body holds on.
If the lease is lost while the body runs (a renewal is refused, or no renewal got through
within the grace), the ``with`` raises :class:`LeaseLost` when the body ends.
Python cannot stop a running thread, nor safely raise an exception in it from the renewal
thread, so a body that runs long looks for itself, between steps. The token the ``with``
gives is an ``int`` that also tells (a :class:`HeldToken`)::

    with lock("deploy", ttl=30) as token:
        for step in steps:
            token.check()        # raises LeaseLost at once if the lease is gone
            step(token)

``token.lost`` (True once lost) and ``token.lost_event`` (a :class:`threading.Event`, set at
the loss: ``token.lost_event.wait(5)`` instead of ``time.sleep(5)``, or handed to worker
threads) tell too; or pass ``on_lost=callback`` (called once, at the loss, in the renewal
thread; for instance ``_thread.interrupt_main`` to get a KeyboardInterrupt in the main
thread).

The full client::

    c = Client("127.0.0.1:5001")
    token = c.lock("deploy", ttl="5m", wait=10)   # raises Timeout if still held after 10 s
    c.renew("deploy", token)                      # -> ttl_ms; raises NotHeld if lost
    c.unlock("deploy", token)
    c.status("deploy")                            # LockStatus, or None if free
    c.break_lock("deploy")                        # an operator's force-release -> leases ended
    for event in Client().watch("deploy"):        # Event(kind, name, id, token, unix_ms)
        print(event.kind, event.id, event.token)

Several addresses, the front-ends of one lockd cluster (any of them serves any request and
knows every token), as lockctl's ``--server a:5001,b:5001``: ``server="a:5001,b:5001"`` (no
spaces), a list of ``"host:port"`` strings, or ``$LOCKD_ADDR=a:5001,b:5001``. A new
connection tries them in turn from the first, each for ``timeout``, and raises ConnectionLost
naming every address if none connects. After a connection fails (reset, closed without a
word, no reply in time) the next one starts at the address after it, which is tried last:
so a :class:`Lease` renews through another front-end within its grace, and a ``lock`` that
waits sends the same LOCK through the next one, keeping its place in the queue.
``client.address`` is
the address connected to, and over TLS its host is the name the certificate must be valid
for. Separate lockd servers are no cluster: each would grant the same lock::

    c = Client("locks-a:5001,locks-b:5001,locks-c:5001")

Shared locks and semaphores (proto.md, "Shared locks and semaphores"; lockctl's ``--shared``
and ``--limit N``): every way to lock takes ``shared=True`` (any number of shared holders
together, never beside an exclusive one) or ``limit=n`` (up to n holders at once); without
either the lock is exclusive::

    with lock("db-backup", limit=2):             # at most two backups at once
        backup()
    c.detail("db-backup")                        # LockDetail: every Holder and Waiter, modes

Several names at once (proto.md, "Several names at once"): ``also=[...]`` takes them with
``name`` as one set, all at once or none, and returns a token per name (``name``'s first); a
Holder or Waiter of a set names its other names in ``also``::

    tokens = c.lock("db-migrate", ttl=600, also=["cache-flush"])   # [token, token2]
    c.detail("cache-flush").holders[0].also                         # ["db-migrate"]

Each holder is one id: a LOCK by an id that already holds the name is its retry and gets the
same token back, so one process that takes two slots gives each its own ``id``.

A process killed while it waits in ``Client.lock`` (or in ``with lock(...)``) leaves the
server's queue at once and never gets the lock: a plain LOCK is sent with ``detach`` (the wait
is tied to the connection, the lease is not), a session LOCK is tied to it anyway.

TLS (a lockd started with ``--tls-cert``; proto.md, "TLS"), with the standard ``ssl`` module:
``ca`` is the CA that signed lockd's certificate (default: the system's), ``cert`` and ``key``
a client certificate for a lockd that requires one (mutual TLS; its subject's CN names the
client); giving either implies ``tls=True``. The server's certificate must be valid for the
host of ``server``. ``tls`` may also be an ``ssl.SSLContext`` of your own::

    c = Client("locks.example.com:5001", ca="ca.pem", cert="me.pem", key="me.key")
    with lock("deploy", server="locks.example.com:5001", tls=True):   # the system's CAs
        ...

Without any of these, the variables lockctl reads decide: ``$LOCKD_TLS`` (1, true, yes or on),
``$LOCKD_TLS_CA``, ``$LOCKD_CLIENT_CERT`` and ``$LOCKD_CLIENT_KEY``; ``tls=False`` ignores them.
A handshake that fails (an untrusted, expired or misnamed server certificate, a plain-TCP
port, a missing or refused client certificate) raises :class:`TlsError`, a ConnectionLost
that trying again will not cure.

Authentication (a lockd started with ``--auth-file``; proto.md, "Authentication and rights"):
``user`` and ``secret`` (or ``secret_file``, whose first line is the secret) make every
connection, reconnects included, start with ``AUTH <user> <secret>``::

    c = Client("locks:5001", user="ci", secret_file="/etc/lockd/ci.secret")
    with lock("deploy", user="ci", secret=os.environ["CI_LOCKD_SECRET"]):
        ...

Without them, the variables lockctl reads decide: ``$LOCKD_USER`` with ``$LOCKD_SECRET`` or
``$LOCKD_SECRET_FILE`` (what ``lockctl run`` passes on to its command). A user without a
secret, a secret without a user, or a secret given two ways raises ValueError. A wrong user
or secret raises :class:`Denied` (exit code 2) at once, and is not retried; a request to a
lockd that needs a login, made without one, raises :class:`NoAuth` (2). The secret appears
in no message and no ``repr``. With mutual TLS a client certificate may log the connection in
by itself (then give no user).

Every ``ERR <code>`` reply raises the :class:`ServerError` subclass of that code (``Timeout``,
``NotHeld``, ``BadArg``, ...; ``.code`` holds the word); a connection that fails or closes
raises :class:`ConnectionLost`. Durations are seconds (int or float) or protocol strings
("250ms", "5m", "1h30m").

Every error has an ``exit_code``, the exit code lockctl and lockd.sh use for the same failure,
so a script can end with ``sys.exit(e.exit_code)``: 1 the lock is held by someone else or the
wait ran out (Timeout), 2 usage or a refusal by the server (ServerError, ProtocolError), 3 the
server is unreachable or the connection was lost (ConnectionLost), 4 the lock was lost or a
token is not the live lease (NotHeld, LeaseLost), 6 a newer ``supersede`` request took this
waiting one's place in the queue (Superseded). Arguments this client refuses itself raise
ValueError or TypeError, which are usage errors (2).
"""

import itertools
import os
import random
import re
import select
import socket
import ssl
import threading
import time
import urllib.parse

__all__ = [
    "HeldToken",
    "HeldTokens",
    "DEFAULT_SERVER",
    "DEFAULT_GRACE",
    "EXIT_HELD",
    "EXIT_USAGE",
    "EXIT_UNREACHABLE",
    "EXIT_LOST",
    "EXIT_SUPERSEDED",
    "EXIT_UNAVAILABLE",
    "LockdError",
    "ConnectionLost",
    "TlsError",
    "ProtocolError",
    "ServerError",
    "Syntax",
    "Unknown",
    "BadArg",
    "Encoding",
    "TooLong",
    "Timeout",
    "NotHeld",
    "Conflict",
    "Replaced",
    "Limit",
    "Lagged",
    "Shutdown",
    "NoAuth",
    "Denied",
    "Unavailable",
    "LeaseLost",
    "Superseded",
    "LockStatus",
    "Holder",
    "Waiter",
    "LockDetail",
    "Event",
    "Client",
    "Lease",
    "lock",
]

DEFAULT_SERVER = "127.0.0.1:5001"
#: Session grace of a :class:`Lease`, in seconds: how long the server keeps the lease after its
#: connection drops, for the renewal thread to reconnect.
DEFAULT_GRACE = 10

# Exit codes, the same as lockctl's and lockd.sh's (see ``LockdError.exit_code``).
#: The lock is held by someone else, or the wait ran out.
EXIT_HELD = 1
#: Usage error, or the server refused the request.
EXIT_USAGE = 2
#: The server is unreachable, or the connection was lost.
EXIT_UNREACHABLE = 3
#: The lock was lost, or a token is not the live lease.
EXIT_LOST = 4
#: lockd was reached but could not serve the request for the whole wait (ERR UNAVAILABLE).
EXIT_UNAVAILABLE = 5
#: A newer ``supersede`` request took this waiting request's place in the queue.
EXIT_SUPERSEDED = 6
#: Longest reply line we accept; the server's replies are far shorter.
_MAX_REPLY = 64 * 1024


class LockdError(Exception):
    """Base of every error this module raises. ``exit_code`` is lockctl's code for it."""

    exit_code = EXIT_USAGE


class ConnectionLost(LockdError, ConnectionError):
    """Could not connect, or the connection failed or closed before the reply came."""

    exit_code = EXIT_UNREACHABLE


class TlsError(ConnectionLost):
    """The TLS handshake failed, or lockd refused this client's certificate: the same
    connection will fail the same way, so the message says what to change."""


class ProtocolError(LockdError):
    """The server sent a reply this client does not understand."""


class ServerError(LockdError):
    """An ``ERR <code> <message>`` reply. ``code`` is the protocol's word, ``message`` the rest."""

    code = ""

    def __init__(self, code, message):
        super().__init__("ERR %s %s" % (code, message) if message else "ERR %s" % code)
        self.code = code
        self.message = message


class Syntax(ServerError):
    """ERR SYNTAX: a malformed request (a bug in the caller or this client)."""


class Unknown(ServerError):
    """ERR UNKNOWN: no such command."""


class BadArg(ServerError):
    """ERR BADARG: bad name, id, duration or token; ttl 0 or over the server's --max-ttl."""


class Encoding(ServerError):
    """ERR ENCODING: the line was not UTF-8."""


class TooLong(ServerError):
    """ERR TOOLONG: the line was longer than the server's --max-line; the connection is closed."""


class Timeout(ServerError):
    """ERR TIMEOUT: LOCK's wait ran out, or a wait=0 try found the lock held."""

    exit_code = EXIT_HELD


class NotHeld(ServerError):
    """ERR NOTHELD: the token is not the live lease (released, expired or taken over)."""

    exit_code = EXIT_LOST


class Conflict(ServerError):
    """ERR CONFLICT: this id holds the lock with a session lease on another open connection, or
    in another mode; or the LOCK does not fit the name (``shared`` or an exclusive LOCK on a
    semaphore, a semaphore of another ``limit``, ``limit`` on a shared or exclusive lock)."""


class Replaced(ServerError):
    """ERR REPLACED: a newer LOCK with the same id took this waiting LOCK's place."""


class Superseded(ServerError):
    """ERR SUPERSEDED: a newer LOCK with ``supersede`` (of another id) took the whole queue,
    this waiting LOCK's place with it; the holder keeps the lock."""

    exit_code = EXIT_SUPERSEDED


class Limit(ServerError):
    """ERR LIMIT: too many connections or held locks on the server."""


class Lagged(ServerError):
    """ERR LAGGED: a watcher fell too far behind."""


class Shutdown(ServerError):
    """ERR SHUTDOWN: the server is stopping."""


class Unavailable(ServerError):
    """ERR UNAVAILABLE: this front-end cannot serve the request now (a cluster front-end cut
    off from etcd, an election); another one, or the same one later, may. ``lock`` sends the
    LOCK again through the next address for the rest of its wait before it raises this."""

    exit_code = EXIT_UNAVAILABLE


class NoAuth(ServerError):
    """ERR NOAUTH: the server needs a login first (give ``user`` and a secret)."""


class Denied(ServerError):
    """ERR DENIED: a wrong user or secret, or the user lacks the right on the name."""


_ERRORS = {
    cls.__name__.upper(): cls
    for cls in (Syntax, Unknown, BadArg, Encoding, TooLong, Timeout, NotHeld, Conflict,
                Replaced, Limit, Lagged, Shutdown, NoAuth, Denied, Superseded, Unavailable)
}

#: The most of a secret file read: a secret is one short line.
_MAX_SECRET_FILE = 64 * 1024


class LeaseLost(LockdError):
    """The lease ended while it was meant to be held: stop the work, it is no longer exclusive."""

    exit_code = EXIT_LOST

    def __init__(self, name, token, reason):
        super().__init__("lease on %r (token %d) lost: %s" % (name, token, reason))
        self.name = name
        self.token = token
        self.reason = reason


class _Record:
    """A value read from a reply: its fields are its ``__slots__``; equal when they all are."""

    __slots__ = ()

    def __init__(self, *values):
        # A field added later (a holder's note) is None unless given.
        values = values + (None,) * (len(self.__slots__) - len(values))
        for key, value in zip(self.__slots__, values):
            setattr(self, key, value)

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, ", ".join(
            "%s=%r" % (k, getattr(self, k)) for k in self.__slots__))

    def __eq__(self, other):
        return type(other) is type(self) and all(
            getattr(self, k) == getattr(other, k) for k in self.__slots__)


class LockStatus(_Record):
    """One held lock, as STATUS reports it: the holder granted first (``id``, ``token``,
    ``ttl_ms``, ``session``), the queue length ``waiters``, how many hold it (``holders``) and
    its ``mode``: ``"exclusive"``, ``"shared"`` or ``"limit:<n>"`` (a semaphore of n), and that
    holder's ``note`` (``LOCK ... note=``, decoded), or None."""

    __slots__ = ("name", "id", "token", "ttl_ms", "session", "waiters", "holders", "mode", "note")

    def __init__(self, name, id, token, ttl_ms, session, waiters, holders=1, mode="exclusive",
                 note=None):
        super().__init__(name, id, token, ttl_ms, session, waiters, holders, mode, note)


class Holder(_Record):
    """One holder of a lock, a ``HOLDER`` line of ``STATUS <name> detail``; ``mode`` as in
    :class:`LockStatus`; ``note`` its note, or None; ``also`` the other names of its set (the
    line's ``and=`` fields, in the order its LOCK gave them: its one lease holds them too), []
    for a lease of one name."""

    __slots__ = ("name", "id", "token", "held_ms", "ttl_ms", "session", "mode", "note", "also")

    def __init__(self, name, id, token, held_ms, ttl_ms, session, mode, note=None, also=()):
        super().__init__(name, id, token, held_ms, ttl_ms, session, mode, note, list(also))


class Waiter(_Record):
    """One waiter of a lock, a ``WAITER`` line of ``STATUS <name> detail``: ``position`` 1 is
    next in the queue; ``mode`` is what it asks for; ``also`` the other names of its set
    (``and=``, in its LOCK's order), [] for a request of one name."""

    __slots__ = ("name", "position", "id", "waited_ms", "session", "mode", "also")

    def __init__(self, name, position, id, waited_ms, session, mode, also=()):
        super().__init__(name, position, id, waited_ms, session, mode, list(also))


class LockDetail(_Record):
    """A held lock in full, as ``STATUS <name> detail`` reports it: ``status`` (its
    :class:`LockStatus`), every holder in grant order and the waiters in queue order (the
    first 1000; ``status.waiters`` counts them all)."""

    __slots__ = ("status", "holders", "waiters")


class Event(_Record):
    """One change of a watched lock, an ``EVENT`` line of ``WATCH``: ``kind`` (``"acquired"``,
    ``"released"``, ``"expired"`` or ``"dropped"``: a session lease whose connection closed),
    the lock's ``name``, the holder's ``id`` and ``token``, and the server's clock when it
    happened, ``unix_ms``."""

    __slots__ = ("kind", "name", "id", "token", "unix_ms")


def _parse_event(line):
    """``EVENT <kind> <name> <id> <token> <unix-ms>`` -> Event."""
    words = line.split(" ")
    if len(words) != 6 or words[0] != "EVENT" or not (words[4].isdigit() and words[5].isdigit()):
        raise ProtocolError("bad event line: %r" % line)
    return Event(words[1], words[2], words[3], int(words[4]), int(words[5]))


def _fields(line, words):
    """The ``key=value`` words of a reply line as a dict (ProtocolError if one is missing)."""
    fields = dict(w.split("=", 1) for w in words if "=" in w)
    return lambda key, kind=str: _field(line, fields, key, kind)


def _field(line, fields, key, kind):
    try:
        return kind(fields[key])
    except (KeyError, ValueError):
        raise ProtocolError("bad reply line: %r" % line) from None


def _note(line, value):
    """A reply's ``note=`` value, percent-decoded (proto.md, Notes); None without one."""
    if value is None:
        return None
    if re.search(r"%(?![0-9A-Fa-f]{2})", value):
        raise ProtocolError("bad note in reply line: %r" % line)
    try:
        return urllib.parse.unquote(value, errors="strict")
    except UnicodeDecodeError:
        raise ProtocolError("bad note in reply line: %r" % line) from None


def _note_option(note):
    """`` note=<text>`` for a LOCK (last: it takes the rest of the line), or "" for none."""
    if note is None:
        return ""
    note = str(note).rstrip(" \t")
    if any(ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0 for c in note):
        raise ValueError("note %r has a control character; a note is printable text" % note)
    return " note=" + note if note else ""


def _parse_status(words):
    """``<name> held id=.. token=.. ttl_ms=.. session=.. waiters=.. [holders=.. mode=..]`` ->
    LockStatus."""
    line = " ".join(words)
    if len(words) < 2 or words[1] != "held":
        raise ProtocolError("bad status: %r" % line)
    get = _fields(line, words[2:])
    # An exclusive lock's line has neither holders= nor mode=.
    shape = ((get("holders", int), get("mode")) if "mode=" in line else (1, "exclusive"))
    note = _note(line, dict(w.split("=", 1) for w in words[2:] if "=" in w).get("note"))
    return LockStatus(words[0], get("id"), get("token", int), get("ttl_ms", int),
                      get("session") == "1", get("waiters", int), *shape, note)


def _also(words):
    """A detail line's ``and=<name>`` fields (a set's other names; the one key that repeats),
    in order."""
    return [w[4:] for w in words if w.startswith("and=")]


def _parse_holder(line):
    """``HOLDER <name> id=.. token=.. held_ms=.. ttl_ms=.. session=.. mode=.. [and=..]...``
    -> Holder."""
    words = line.split()
    get = _fields(line, words[2:])
    note = _note(line, dict(w.split("=", 1) for w in words[2:] if "=" in w).get("note"))
    return Holder(words[1], get("id"), get("token", int), get("held_ms", int),
                  get("ttl_ms", int), get("session") == "1", get("mode"), note,
                  _also(words[2:]))


def _parse_waiter(line):
    """``WAITER <name> <position> id=.. waited_ms=.. session=.. mode=.. [and=..]...`` ->
    Waiter."""
    words = line.split()
    if len(words) < 3 or not words[2].isdigit():
        raise ProtocolError("bad reply line: %r" % line)
    get = _fields(line, words[3:])
    return Waiter(words[1], int(words[2]), get("id"), get("waited_ms", int),
                  get("session") == "1", get("mode"), _also(words[3:]))


def _split_addr(server):
    """'host:port' or '[v6]:port' -> (host, port)."""
    host, sep, port = server.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError("server must be host:port, not %r" % server)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _split_servers(server):
    """'host:port', or several comma-separated without spaces ('a:5001,b:5001'), or a list or
    tuple of 'host:port' -> ``[(text, (host, port)), ...]``, in the order given. Strict, as
    lockctl reads LOCKD_ADDR: an empty entry or a space is a ValueError, not an address."""
    texts = list(server) if isinstance(server, (list, tuple)) else server.split(",")
    if not texts or any(not isinstance(t, str) or not t or t != t.strip() for t in texts):
        raise ValueError("server must be host:port, or several comma-separated without spaces "
                         "(a:5001,b:5001), not %r" % (server,))
    return [(t, _split_addr(t)) for t in texts]


def _word(what, value):
    """Checks a name or id is one protocol word, so it can neither split nor add a request."""
    if not isinstance(value, str) or not value or any(c.isspace() or ord(c) < 32 or ord(c) == 127
                                                      for c in value):
        raise ValueError("%s must be a non-empty word without whitespace: %r" % (what, value))
    if len(value.encode("utf-8")) > 255:
        raise ValueError("%s is longer than 255 bytes" % what)
    return value


def _duration(what, value):
    """Seconds (int/float) or a protocol duration string -> a protocol word."""
    if isinstance(value, bool):
        raise TypeError("%s must be seconds or a duration string" % what)
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError("%s must not be negative" % what)
        return "%dms" % round(value * 1000)
    return _word(what, value)


def _seconds(value):
    """Seconds of a duration given as a number; None for a string (the server knows)."""
    return float(value) if isinstance(value, (int, float)) else None


_UNIT_MS = {"ms": 1, "s": 1000, "m": 60000, "h": 3600000, "d": 86400000}


def _ms(value):
    """Milliseconds of a duration: seconds as a number, or a string in the usual forms ("250ms",
    "30s", "5m", "1h30m", "1.5"). None for any other form (the server may still know it)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return round(value * 1000)
    if not isinstance(value, str):
        return None
    plain = re.fullmatch(r"(\d+)(?:\.(\d*))?", value)
    if plain:
        return int(plain.group(1)) * 1000 + int((plain.group(2) or "")[:3].ljust(3, "0"))
    # A unit must be followed by the next number or the end: "5ms" is never "5m" + "s".
    parts = re.findall(r"(\d+)(ms|s|m|h|d)(?=\d|$)", value)
    if not parts or "".join(n + u for n, u in parts) != value:
        return None
    return sum(int(n) * _UNIT_MS[u] for n, u in parts)


def _session_option(session, detach):
    """The LOCK option for ``session`` (False/None, True, or a grace) and ``detach``."""
    if session is False or session is None:
        return " detach" if detach else ""
    if session is True or (isinstance(session, (int, float)) and session == 0):
        return " session"
    return " session=" + _duration("session", session)


def _mode_option(shared, limit):
    """The LOCK option of the mode: exclusive (no option, the default), ``shared``, or one slot
    of a semaphore of ``limit`` (``limit=<n>``, 1 to 100000; the server checks the range)."""
    if limit is None:
        return " shared" if shared else ""
    if shared:
        raise ValueError("shared and limit exclude each other")
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError("limit must be a whole number of holders, not %r" % (limit,))
    return " limit=%d" % limit


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def _env_flag(name):
    """A yes/no variable, read as lockctl reads it."""
    value = os.environ.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError("$%s must be 1, true, yes or on, or 0, false, no or off: %r"
                     % (name, os.environ[name]))


def _tls_context(tls, ca, cert, key):
    """The ssl.SSLContext to connect with (None for plain TCP; see the module's doc) and the
    client certificate's file, if known."""
    if isinstance(tls, ssl.SSLContext):
        if ca or cert or key:
            raise ValueError("give either an ssl.SSLContext or ca/cert/key, not both")
        return tls, None
    if tls is not None and not isinstance(tls, bool):
        raise TypeError("tls must be True, False, None or an ssl.SSLContext, not %r" % (tls,))
    if tls is None:
        tls = _env_flag("LOCKD_TLS")
        ca = ca or os.environ.get("LOCKD_TLS_CA") or None
        cert = cert or os.environ.get("LOCKD_CLIENT_CERT") or None
        key = key or os.environ.get("LOCKD_CLIENT_KEY") or None
    elif tls is False:
        if ca or cert or key:
            raise ValueError("tls=False with ca, cert or key")
        return None, None
    if not (tls or ca or cert):
        return None, None
    if key and not cert:
        raise ValueError("a client key without its certificate (cert=)")
    try:
        context = ssl.create_default_context(cafile=ca)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if cert:
            context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise ValueError("cannot set up TLS (ca=%r, cert=%r, key=%r): %s"
                         % (ca, cert, key, e)) from e
    return context, cert


def _tls_reason(e):
    """OpenSSL's reason for a failure, as ``WRONG_VERSION_NUMBER``."""
    return (getattr(e, "reason", None) or "").upper()


def _credentials(user, secret, secret_file):
    """``(user, secret)`` to log in with, or ``(None, None)``; the variables fill in what the
    arguments leave out (see the module's doc)."""
    user = user or os.environ.get("LOCKD_USER") or None
    if secret is None and secret_file is None:
        secret = os.environ.get("LOCKD_SECRET") or None
        secret_file = os.environ.get("LOCKD_SECRET_FILE") or None
        given = "$LOCKD_SECRET and $LOCKD_SECRET_FILE"
    else:
        given = "secret= and secret_file="
    if secret is not None and secret_file is not None:
        raise ValueError("the secret is given twice (%s): give it one way" % given)
    if secret_file is not None:
        secret = _read_secret(secret_file)
        source = "the first line of %s" % secret_file
    else:
        source = "the secret"
    if user is None and secret is None:
        return None, None
    if user is None:
        raise ValueError("a secret without a user: give user= (or $LOCKD_USER)")
    if secret is None:
        raise ValueError("user %r needs a secret: give secret= or secret_file= (or "
                         "$LOCKD_SECRET or $LOCKD_SECRET_FILE)" % user)
    _word("user", user)
    if not secret or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in secret):
        raise ValueError("%s is empty or not one word (whitespace or control characters)"
                         % source)
    return user, secret


def _read_secret(path):
    """The first line of ``path``, its line ending stripped."""
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_SECRET_FILE)
    except OSError as e:
        raise ValueError("cannot read the secret file %s: %s" % (path, e)) from e
    try:
        return data.split(b"\n", 1)[0].rstrip(b"\r").decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the first line of the secret file %s is not UTF-8" % path) from None


_next_id = itertools.count(1)


def default_id():
    """``<hostname>:<pid>:<n>``, ``n`` counting in this process: a new holder's id.

    The same id is the same client to lockd (its LOCK again is a retry, answered with the same
    grant), so two holders in one process (two clients, two threads, a worker pool) must never
    share one by default. A client without an ``id`` takes a new one for each LOCK, and keeps
    it across that LOCK's own resends.
    """
    return "%s:%d:%d" % (socket.gethostname(), os.getpid(), next(_next_id))


class Client:
    """One connection to lockd, opened on first use and again after a failure.

    A client is safe to share between threads (one request at a time), but a LOCK that waits
    holds the connection until it is answered: give each waiting thread its own client.
    ``timeout`` bounds every reply that should come at once, and each connection attempt; a
    waiting LOCK gets its ``wait`` on top of it (or no bound at all without ``wait``).
    ``server`` is ``host:port``, or several comma-separated (see the module's doc), default
    $LOCKD_ADDR, then 127.0.0.1:5001. ``tls``, ``ca``, ``cert`` and ``key``
    choose TLS, ``user``, ``secret`` and ``secret_file`` the login (see the module's doc); a
    file that cannot be used raises ValueError here.
    """

    def __init__(self, server=None, id=None, timeout=10.0, tls=None, ca=None, cert=None,
                 key=None, user=None, secret=None, secret_file=None):
        server = server or os.environ.get("LOCKD_ADDR") or DEFAULT_SERVER
        self._addrs = _split_servers(server)
        #: Every address, comma-separated (as LOCKD_ADDR gives them).
        self.server = ",".join(text for text, _ in self._addrs)
        # The address of the current (or latest) connection, and where the next connection
        # starts: the same one after a close for idleness, the one after it after a failure.
        self._at = 0
        self._start = 0
        #: The id every LOCK of this client is sent with; ``None``: each LOCK takes a new one
        #: (:func:`default_id`), so that two holders sharing a process never share an id.
        self.id = _word("id", id) if id else None
        self.timeout = timeout
        self._tls, self._cert = _tls_context(tls, ca, cert, key)
        self.user, self._secret = _credentials(user, secret, secret_file)
        self._sock = None
        self._file = None
        self._mutex = threading.Lock()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @property
    def address(self):
        """The address (``host:port``) of the current connection, or of the latest one (the
        first address before any)."""
        return self._addrs[self._at][0]

    def close(self):
        """Closes the connection (ending its `session` leases); the next call reconnects."""
        with self._mutex:
            self._drop()

    def _lost(self):
        """Drops a connection that failed. The next one starts at the address after it: with
        several front-ends, the one that failed may be the one that is down."""
        if self._sock is not None:
            self._start = self._at + 1
        self._drop()

    def _drop(self):
        for thing in (self._file, self._sock):
            if thing is not None:
                try:
                    thing.close()
                except OSError:
                    pass
        self._file = self._sock = None

    def _request(self, line, reply_timeout="default", read=None):
        """Sends one line and returns ``read()`` (default: the first reply line).

        After any failure the connection is dropped: a reply may still be on its way, and it
        must not be taken for the answer to a later request.
        """
        timeout = self.timeout if reply_timeout == "default" else reply_timeout
        with self._mutex:
            closed = self._sock is not None and self._stale()
            if closed == "gone":
                # Closed or reset without a word: that server may be down, so the new
                # connection starts at the next address.
                self._lost()
            elif closed:
                # lockd closed an idle connection (its --idle-timeout): what it said then is no
                # answer to this request; start afresh, on the same address.
                self._drop()
            try:
                if self._sock is None:
                    self._sock = self._connect()
                    self._file = self._sock.makefile("rb")
                    self._login()
                self._sock.settimeout(self.timeout)
                self._sock.sendall(line.encode("utf-8") + b"\n")
                self._sock.settimeout(timeout)
                return (read or self._read_line)()
            except ssl.SSLError as e:
                # A failed handshake, or a refused client certificate: in TLS 1.3 lockd judges
                # it after the handshake, and its refusal comes as the answer to a request.
                self._drop()
                raise TlsError(self._tls_failure(e)) from e
            except TlsError:
                self._drop()
                raise
            except ConnectionLost:
                self._lost()
                raise
            except socket.timeout:
                self._lost()
                raise ConnectionLost("no reply from %s to %r in time" % (self.address, line))
            except OSError as e:
                self._lost()
                raise ConnectionLost("%s: %s" % (self.address, e)) from e
            except BaseException:
                self._drop()
                raise

    def _stale(self):
        """Whether the server ended the connection while nothing was pending: None if not,
        "idle" if it said something first (lockd's ``ERR LIMIT`` before it closes an idle
        connection: the server is fine), "gone" if it closed or reset it without a word (it
        may have gone down). Over TLS the peek is at the raw bytes under it (an ``ERR LIMIT``
        comes in a TLS record; a server that died sends none), which it leaves unread."""
        try:
            if isinstance(self._sock, ssl.SSLSocket) and self._sock.pending():
                return "idle"
            readable, _, _ = select.select([self._sock], [], [], 0)
            if not readable:
                return None
            return "idle" if socket.socket.recv(self._sock, 1, socket.MSG_PEEK) else "gone"
        except (OSError, ValueError):
            return "gone"

    def _connect(self):
        """A new connection, over TLS if asked for: to the addresses in turn, from
        ``self._start`` on (round the list), each given ``timeout`` to connect; the first that
        connects is the one. A TLS failure is final, as in lockctl: another front-end would
        refuse the same configuration the same way."""
        count = len(self._addrs)
        failed = []
        for k in range(count):
            i = (self._start + k) % count
            text, addr = self._addrs[i]
            try:
                sock = socket.create_connection(addr, timeout=self.timeout)
            except OSError as e:
                if count == 1:
                    raise  # said by _request, as it always was
                failed.append("%s (%s)" % (text, e))
                continue
            self._at = self._start = i
            return self._secure(sock, addr[0])
        raise ConnectionLost("cannot connect to lockd at %s" % "; nor at ".join(failed))

    def _secure(self, sock, host):
        """``sock`` over TLS if asked for, the server's certificate checked against ``host``:
        the host of the address connected to."""
        if self._tls is None:
            return sock
        try:
            return self._tls.wrap_socket(sock, server_hostname=host)
        except socket.timeout:
            sock.close()
            raise TlsError("lockd at %s accepted the connection but sent no TLS handshake "
                           "within %ss: is it serving plain TCP there?"
                           % (self.address, self.timeout)) from None
        except BaseException:  # an ssl.SSLError is said by _request
            sock.close()
            raise

    def _login(self):
        """AUTH on a new connection, if a user is given. A refusal is final: Denied (or the
        ServerError of the reply), never naming the secret."""
        if self.user is None:
            return
        self._sock.settimeout(self.timeout)
        line = "AUTH %s %s\n" % (self.user, self._secret)
        try:
            self._sock.sendall(line.encode("utf-8"))
            reply = self._read_line()
        except socket.timeout:
            raise ConnectionLost("no reply from %s to AUTH in time" % self.address) from None
        if reply.startswith("OK"):
            return
        if reply.startswith("ERR DENIED authentication is off"):
            return  # every connection may do everything there
        if reply.startswith("ERR DENIED already authenticated as %s;" % self.user):
            return  # mutual TLS: the client certificate named this very user
        try:
            self._ok(reply)
        except Denied as e:
            raise Denied(e.code, "lockd at %s refused to log in user %s (%s): check user= "
                         "($LOCKD_USER) and the secret" % (self.address, self.user, e.message)
                         ) from None
        raise ProtocolError("unexpected reply to AUTH: %r" % reply)

    def _tls_failure(self, e):
        """One line naming the cause of a TLS failure and what to change."""
        reason = _tls_reason(e)
        about_cert = "ALERT" in reason and any(
            word in reason for word in ("CERTIFICATE", "UNKNOWN_CA", "ACCESS_DENIED",
                                        "DECRYPT_ERROR", "HANDSHAKE_FAILURE"))
        if isinstance(e, ssl.SSLCertVerificationError):
            hint = "" if "mismatch" in (e.verify_message or "").lower() else (
                " (give the CA that signed it as ca=, or $LOCKD_TLS_CA)")
            return ("the certificate of lockd at %s is not trusted: %s%s"
                    % (self.address, e.verify_message or e, hint))
        if reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG",
                      "UNKNOWN_PROTOCOL", "HTTP_REQUEST"):
            return ("lockd at %s did not answer in TLS: is it serving plain TCP there "
                    "(started without --tls-cert)?" % self.address)
        if "CERTIFICATE_REQUIRED" in reason or (about_cert and self._cert is None):
            return ("lockd at %s requires a client certificate (mutual TLS): give cert= and "
                    "key=, or $LOCKD_CLIENT_CERT and $LOCKD_CLIENT_KEY" % self.address)
        if about_cert:
            return ("lockd at %s refused the client certificate %s: %s"
                    % (self.address, self._cert, "it is not signed by a CA lockd trusts"
                       if "UNKNOWN_CA" in reason else e))
        return "TLS with lockd at %s failed: %s" % (self.address, e)

    def _read_line(self):
        raw = self._file.readline(_MAX_REPLY + 1)
        if not raw:
            self._lost()
            raise ConnectionLost("%s closed the connection" % self.address)
        if len(raw) > _MAX_REPLY:
            self._drop()
            raise ProtocolError("reply line longer than %d bytes" % _MAX_REPLY)
        return raw.decode("utf-8", "replace").rstrip("\r\n")

    @staticmethod
    def _ok(reply):
        """Returns the words after OK, or raises the ServerError of an ERR reply."""
        if reply == "OK" or reply.startswith("OK "):
            return reply[3:]
        if reply.startswith("ERR "):
            code, _, message = reply[4:].partition(" ")
            raise _ERRORS.get(code, ServerError)(code, message)
        raise ProtocolError("unexpected reply: %r" % reply)

    def _call(self, line, reply_timeout="default"):
        reply = self._request(line, reply_timeout)
        try:
            return self._ok(reply)
        except (TooLong, Lagged, Shutdown):
            self._lost()  # the server closes the connection after these (SHUTDOWN: it stops)
            raise

    def lock(self, name, ttl=None, wait=None, session=False, detach=True, shared=False,
             limit=None, supersede=False, note=None, also=()):
        """Takes the lock and returns its fencing token; waits in the FIFO queue while held.

        The lock is exclusive by default; ``shared=True`` holds it beside any other shared
        holders (never beside an exclusive one); ``limit=n`` takes one of the n slots of a
        semaphore (up to n holders at once). A LOCK that does not fit what the name is while
        held (``shared`` on a semaphore, another ``limit``, ...) raises Conflict.

        ``wait=None`` waits as long as it takes; ``wait=0`` tries once. Raises Timeout when the
        wait runs out. ``session=True`` ties the lease to this connection as well (it ends when
        the connection closes); ``session=<duration>`` gives it a grace: it ends that long
        after the connection closes unless a RENEW of its token (from any connection) comes
        first. Without ``session`` the lease is plain: it lasts until ``unlock`` or its ttl,
        whatever becomes of this process; only the wait is tied to the connection
        (``detach``), so a process killed while it waits leaves the queue. ``detach=False``
        sends a plain LOCK without it, for a lockd older than the option.

        With several addresses (the front-ends of one cluster), a connection lost while
        waiting is not the end of the wait: the same LOCK (same id) is sent again through the
        next front-end, for the rest of ``wait``. The cluster then gives it back its place in
        the queue, or the grant made to it meanwhile (proto.md, cluster mode). An ``ERR
        UNAVAILABLE`` (or ``ERR SHUTDOWN``) is sent again the same way, with a backoff (50ms
        doubling to 1s), through the next address (with one, on the same connection), for the
        rest of ``wait`` (as long as it takes without one; each address once with
        ``wait=0``): the LOCK may have been granted although its answer was lost, and the same
        id gets that grant back. When the wait is over the last one is raised
        (:class:`Unavailable`, exit code 5).

        ``note`` is a short text for people ("release 1.4.2 by ci job 8812", at most the
        server's ``--max-note`` bytes, printable), shown with the holder by STATUS and WATCH and
        to those a LOCK refused; the Timeout of a refused LOCK says who holds it, for how long,
        and with what note, when the user may read the lock.
        ``supersede=True``: newest wins. If the lock is held, every request waiting for it is
        refused (each raises Superseded), the holder keeps it and this one waits first in line;
        a newer ``supersede`` request raises Superseded here in turn.
        ``also``: further names, taken with ``name`` all at once or not at all (a LOCK of a
        set, ``and=``); then the return is a list of tokens, one per name (``name``'s first),
        and every other option applies to each name. One lease covers the set: renewing,
        checking or unlocking any one of its names, with the token given for it, does it for
        all. Use each name's own token for that name (the server gives the same number today;
        assume nothing). ``supersede`` with ``also`` is refused by the server (Syntax).
        """
        head = "LOCK %s %s" % (_word("name", name), self.id or default_id())
        also = [_word("name", n) for n in also]
        if ttl is not None:
            head += " ttl=" + _duration("ttl", ttl)
        tail = _session_option(session, detach) + _mode_option(shared, limit)
        if supersede:
            tail += " supersede"
        tail += "".join(" and=" + n for n in also)
        # The note comes last: it takes the rest of the line.
        tail += _note_option(note)
        word = None if wait is None else _duration("wait", wait)
        wait_ms = None if wait is None else _ms(wait)
        until = None if wait_ms is None else time.monotonic() + wait_ms / 1000.0
        lost = 0
        refused = 0
        pause = 0.05
        while True:
            line, reply_timeout = head, None
            if until is not None:
                left = max(0.0, until - time.monotonic())
                line += " wait=%dms" % int(left * 1000)
                reply_timeout = left + self.timeout
            elif word is not None:
                line += " wait=" + word  # a form only the server reads
            try:
                rest = self._call(line + tail, reply_timeout)
            except ConnectionLost:
                lost += 1
                out_of_time = until is not None and time.monotonic() >= until
                # Every address tried twice in a row without an answer: give up.
                if len(self._addrs) < 2 or out_of_time or lost > 2 * len(self._addrs):
                    raise
                time.sleep(0.05)
                continue  # the same LOCK through the next front-end
            except (Unavailable, Shutdown):
                refused += 1
                now = time.monotonic()
                if wait_ms == 0:
                    # No waiting: one try per address, no pause.
                    if refused >= len(self._addrs):
                        raise
                    pause = 0.0
                elif until is not None and now >= until:
                    raise
                if len(self._addrs) > 1:
                    # The next try goes to the next front-end: this one cannot serve it now.
                    with self._mutex:
                        self._lost()
                sleep = pause * (0.5 + random.random() / 2)
                if until is not None:
                    sleep = min(sleep, max(0.0, until - now))
                time.sleep(sleep)
                pause = min(pause * 2, 1.0)
                continue
            tokens = rest.split(" ")
            if len(tokens) != 1 + len(also) or not all(t.isdigit() for t in tokens):
                raise ProtocolError("unexpected reply to LOCK: %r" % rest)
            if also:
                return [int(t) for t in tokens]
            return int(rest)

    def try_lock(self, name, ttl=None, session=False, shared=False, limit=None, note=None):
        """One try: the token, or None if the lock is held (in a way this LOCK does not fit
        beside, or others wait for it first)."""
        try:
            return self.lock(name, ttl=ttl, wait=0, session=session, shared=shared, limit=limit,
                             note=note)
        except Timeout:
            return None

    def unlock(self, name, token):
        """Releases the lease. Raises NotHeld if ``token`` no longer held it."""
        self._call("UNLOCK %s %d" % (_word("name", name), int(token)))

    def break_lock(self, name, token=None, force=False):
        """Breaks ``name`` (``BREAK``): every holder's lease, or only ``token``'s, ends for its
        holder, whose next renew or check raises NotHeld saying who broke it; returns how many
        leases it broke. The name passes on (to the next waiter, with a higher token) once the
        broken holder releases it or its deadline passes, so the next holder never runs beside
        a job still being stopped; ``force=True`` hands it on at once (an emergency: the broken
        job may still run). Needs the ``admin`` right on the name when the server has an auth
        file. Raises NotHeld if nothing (or no lease with ``token``) holds the name. Not sent
        again by this client after a lost answer.
        """
        line = "BREAK %s" % _word("name", name)
        if token is not None:
            line += " %d" % int(token)
        if force:
            line += " force"
        rest = self._call(line)
        if not rest.startswith("broken=") or not rest[7:].isdigit():
            raise ProtocolError("unexpected reply to BREAK: %r" % (rest,))
        return int(rest[7:])

    def _ttl_ms(self, verb, rest):
        if not rest.startswith("ttl_ms=") or not rest[7:].isdigit():
            raise ProtocolError("unexpected reply to %s: %r" % (verb, rest))
        return int(rest[7:])

    def renew(self, name, token, ttl=None, detach=False):
        """Extends the lease (to ``ttl`` from now, default its own ttl); returns the ttl in ms.

        Raises NotHeld if the lease is gone: the caller has lost the lock and must stop.
        ``detach=True`` also makes a session lease a plain one: it no longer ends with any
        connection, only by ``unlock`` or its ttl.
        """
        line = "RENEW %s %d" % (_word("name", name), int(token))
        if ttl is not None:
            line += " ttl=" + _duration("ttl", ttl)
        if detach:
            line += " detach"
        return self._ttl_ms("RENEW", self._call(line))

    def check(self, name, token):
        """Returns the ms left on the lease if ``token`` is the live lease, else raises NotHeld."""
        return self._ttl_ms("CHECK", self._call("CHECK %s %d" % (_word("name", name), int(token))))

    def status(self, name=None):
        """With a name: its LockStatus, or None if free. Without: a list of every held lock."""
        if name is not None:
            rest = self._call("STATUS %s" % _word("name", name))
            words = rest.split()
            if words[1:2] == ["free"]:  # a cluster front-end adds how old its view is
                return None
            return _parse_status(words)
        return self._request("STATUS", read=self._read_status_lines)

    def detail(self, name):
        """Every holder and waiter of ``name`` (``STATUS <name> detail``): a LockDetail, or None
        if the lock is free. A holder or waiter of a set names the set's other names in its
        ``also``."""
        return self._request("STATUS %s detail" % _word("name", name), read=self._read_detail)

    def _read_detail(self):
        holders, waiters = [], []
        while True:
            line = self._read_line()
            if line.startswith("HOLDER "):
                holders.append(_parse_holder(line))
            elif line.startswith("WAITER "):
                waiters.append(_parse_waiter(line))
            else:
                break
        words = self._ok(line).split()
        if words[1:2] == ["free"]:
            return None
        return LockDetail(_parse_status(words), holders, waiters)

    def _read_status_lines(self):
        held = []
        while True:
            line = self._read_line()
            if line.startswith("INFO "):
                held.append(_parse_status(line[5:].split()))
                continue
            rest = self._ok(line)
            if not rest.isdigit() or int(rest) != len(held):
                raise ProtocolError("STATUS ended with %r after %d INFO lines" % (line, len(held)))
            return held

    def watch(self, name=None, timeout=None):
        """WATCH ``name`` (every lock with ``None``): a generator of :class:`Event`, one per
        change of the lock as it happens, from now on.

        The connection is given over to the watch: use another client for requests meanwhile.
        Each event is waited for as long as it takes, or ``timeout`` seconds (then
        ConnectionLost). An ``ERR`` ends the watch with its ServerError: ``Lagged`` when this
        watcher read too slowly and the server dropped it, ``Shutdown`` when it stops. Closing
        the generator (or leaving the loop and dropping it) closes the connection; the client
        reconnects on its next request.
        """
        line = "WATCH" if name is None else "WATCH " + _word("name", name)
        # Sent now, not at the first next(): the events start with this call.
        self._ok(self._request(line))
        return self._events(timeout)

    def _events(self, timeout):
        try:
            while True:
                with self._mutex:
                    if self._sock is None:
                        raise ConnectionLost("the watch's connection to %s is gone" % self.address)
                    try:
                        self._sock.settimeout(timeout)
                        reply = self._read_line()
                    except socket.timeout:
                        self._lost()
                        raise ConnectionLost("no event from %s within %ss" % (self.address, timeout))
                    except OSError as e:
                        self._lost()
                        raise ConnectionLost("%s: %s" % (self.address, e)) from e
                if reply.startswith("EVENT "):
                    yield _parse_event(reply)
                elif reply.startswith("ERR "):
                    self._ok(reply)
                # Anything else (an OK of a newer server) is no event: read on.
        finally:
            self.close()

    def ping(self):
        """True if the server answers PING."""
        return self._call("PING") == "PONG"


class _Held:
    """What a ``with`` body's token tells of its lease, between steps of its work."""

    lease = None

    @property
    def lost(self):
        """True once the lease is known to be lost (``lease.lost``)."""
        return self.lease.lost

    @property
    def lost_event(self):
        """The :class:`threading.Event` set at the loss (``lease.lost_event``)."""
        return self.lease.lost_event

    def check(self):
        """Raises LeaseLost if the lease is known to be lost (``lease.check()``)."""
        self.lease.check()


class HeldToken(int, _Held):
    """The token a ``with`` of a :class:`Lease` gives: the ``int`` itself (a fencing token
    to pass on, compare, format), which also tells whether its lease was lost (``lost``,
    ``lost_event``, ``check()``, and ``lease``), so that ``with lock(...) as token:`` needs
    no other name for it."""

    def __new__(cls, token, lease):
        self = super().__new__(cls, token)
        self.lease = lease
        return self

    def __reduce__(self):
        return (int, (int(self),))  # a copy or a pickle is the plain number


class HeldTokens(list, _Held):
    """The tokens a ``with`` of a :class:`Lease` of a set gives (a ``list``, ``name``'s
    first), which also tell whether the set's lease was lost, as :class:`HeldToken` does."""

    def __init__(self, tokens, lease):
        super().__init__(tokens)
        self.lease = lease

    def __reduce__(self):
        return (list, (list(self),))


class Lease:
    """A lock held for the body of a ``with`` and renewed by a background thread.

    ``with lease as token`` takes the lock (waiting up to ``wait``), starts the renewal thread
    and on exit stops it and releases the lock. ``token`` is a :class:`HeldToken` (an ``int``
    that tells of the loss: ``token.lost``, ``token.lost_event``, ``token.check()``). The lease is a session lease with a grace of
    ``session`` seconds (default 10, capped at the ttl; a duration string works too), held on
    one connection that the thread renews on: a killed process loses the lock at most the
    grace after, and a dropped connection is ridden out by reconnecting and renewing within
    it. ``session=True`` (or 0) ends the lease as soon as the connection closes;
    ``session=False`` takes a plain lease instead, which outlives the process until its ttl.
    ``shared`` and ``limit`` are :meth:`Client.lock`'s: a shared hold, or one slot of a
    semaphore; exclusive by default. ``supersede=True`` takes the queue if the lock is held
    (newest wins, see :meth:`Client.lock`): entering raises Superseded if a newer request
    takes it first.

    ``also``: further names, held with ``name`` as one set (:meth:`Client.lock`): entering
    returns the list of tokens, one per name (``name``'s first; also in ``lease.tokens``), and
    the one lease of the set is renewed and released through ``name``. The list is a
    :class:`HeldTokens`, which tells of the loss as a :class:`HeldToken` does.

    ``at_least`` (seconds, or a duration string): once per window. If the body ends normally
    sooner than that after the grant, leaving the ``with`` does not release the lock: it stays
    held, a plain lease the server ends ``at_least`` after the grant (nobody renews it), so
    that another host's ``wait=0`` try finds it held. ``lease.kept`` tells. A body that raised,
    or a lost lease, ends as without it; a window the server refuses (over its --max-ttl) is
    released as usual.

    The thread renews every third of the time the lease surely lives without a renewal (the
    grace, or the ttl if shorter). ``lease.lost`` turns True, and ``lease.check()`` starts
    raising LeaseLost, as soon as the thread finds the lease gone: a renewal answered NOTHELD,
    or none got through for that long, counted from when the last one that did was sent, less
    a margin (a tenth of it, at most half a second). No renewal attempt may outlast that, so
    the loss is known before the server can pass the lock on. Then ``lease.lost_event`` is
    set, ``on_lost(lease)`` is called once (in the renewal thread), and leaving the ``with``
    raises LeaseLost if the body itself ended normally (an exception from the body is left to
    propagate; ``lease.lost`` tells).

    What the body can't be given: Python cannot stop or interrupt a running thread, so the
    body runs on after the loss until it looks (``token.lost``, ``token.check()``,
    ``token.lost_event``) or ends. A body that writes to something the lock guards should
    look before each write, and pass the token on as a fencing token where it can.
    ``on_lost`` runs in the renewal thread: keep it short; what it raises is ignored.
    """

    def __init__(self, name, server=None, ttl=30, wait=None, id=None, session=DEFAULT_GRACE,
                 on_lost=None, timeout=10.0, shared=False, limit=None, tls=None, ca=None,
                 cert=None, key=None, user=None, secret=None, secret_file=None,
                 supersede=False, at_least=None, also=(), note=None):
        self.name = _word("name", name)
        self.note = note
        self.also = [_word("name", n) for n in also]
        self.supersede = supersede
        self.at_least = None if at_least is None else _ms(at_least)
        if at_least is not None and not self.at_least:
            raise ValueError("at_least must be a positive duration: %r" % (at_least,))
        self._granted = None
        #: True once leaving the ``with`` kept the lock held for ``at_least`` (not released).
        self.kept = False
        self.ttl = ttl
        self.wait = wait
        _mode_option(shared, limit)  # a mode that can't be asked for fails here, not in ``with``
        self.shared = shared
        self.limit = limit
        self.session = self._capped(session, ttl)
        self.on_lost = on_lost
        self._timeout = timeout
        self._client = Client(server, id=id, timeout=timeout, tls=tls, ca=ca, cert=cert,
                              key=key, user=user, secret=secret, secret_file=secret_file)
        self.token = None
        #: Every name's token (``name``'s first), once entered.
        self.tokens = []
        self.reason = None
        self._lost = threading.Event()
        self._stop = threading.Event()
        self._thread = None
        self._sent = None

    @staticmethod
    def _capped(session, ttl):
        """The grace, no longer than the ttl (the server would end the lease by then anyway)."""
        if session is True or session is False or session is None:
            return session
        grace, most = _ms(session), _ms(ttl)
        if grace is not None and most is not None and grace > most:
            return most / 1000.0
        return session

    def _hold_ms(self, ttl_ms):
        """How long the lease surely lives without a renewal getting through: the grace (none
        for a bare session lease), never past the ttl; the ttl for a plain lease."""
        if self.session is False or self.session is None:
            return ttl_ms
        if self.session is True:
            return 0
        grace = _ms(self.session)
        return ttl_ms if grace is None else min(grace, ttl_ms)

    @property
    def lost(self):
        """True once the lease is known to be lost."""
        return self._lost.is_set()

    @property
    def lost_event(self):
        """A :class:`threading.Event` set when the lease is lost: ``lease.lost_event.wait(5)``
        in a loop of the body, or handed to worker threads, as Go's context and Node's
        AbortSignal are. Python cannot interrupt a running thread: the body must look (this,
        ``lease.lost`` or ``lease.check()``) between steps of its work, and stop."""
        return self._lost

    def check(self):
        """Raises LeaseLost if the lease is known to be lost (no network round trip)."""
        if self._lost.is_set():
            raise LeaseLost(self.name, self.token or 0, self.reason or "lost")

    def __enter__(self):
        if self._thread is not None:
            raise RuntimeError("a Lease is entered once; make a new one")
        try:
            got = self._client.lock(self.name, ttl=self.ttl, wait=self.wait,
                                    session=self.session, shared=self.shared,
                                    limit=self.limit, supersede=self.supersede, also=self.also,
                                    note=self.note)
            self.tokens = got if self.also else [got]
            self.token = self.tokens[0]
            self._granted = time.monotonic()
            # A first renewal at once gives the lease's length in ms, whatever form ttl took,
            # and the time the lease surely lives from (when it was sent).
            self._sent = time.monotonic()
            ttl_ms = self._renew()
        except BaseException:
            if self.token is not None:
                self._release()
            self._client.close()
            raise
        self._thread = threading.Thread(target=self._renew_loop, args=(ttl_ms,),
                                        name="lockd-renew-%s" % self.name, daemon=True)
        self._thread.start()
        if self.also:
            return HeldTokens(self.tokens, self)
        return HeldToken(self.token, self)

    def __exit__(self, exc_type, exc, tb):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if not self.lost and not (exc_type is None and self._keep()):
            self._release()
        self._client.close()
        if self.lost and exc_type is None:
            raise LeaseLost(self.name, self.token, self.reason)
        return False

    def _renew(self, deadline=None):
        """RENEWs the lease and returns its ttl in ms. If the connection has dropped, renews once
        more on a new one (the client reconnects), which the server then ties the lease to;
        with a ``deadline`` (monotonic), only while there is time left before it."""
        try:
            return self._client.renew(self.name, self.token)
        except ConnectionLost:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                self._client.timeout = min(self._client.timeout, left)
            return self._client.renew(self.name, self.token)

    def _keep(self):
        """``at_least``: a body that ended sooner than ``at_least`` after the grant leaves the
        lock held until then, as a plain lease the server ends (``RENEW ... detach``; nobody
        renews it). Whether it was kept; if the server refuses (a window over its --max-ttl),
        the lock is released as usual."""
        if self.at_least is None or self._granted is None:
            return False
        left_ms = self.at_least - int((time.monotonic() - self._granted) * 1000)
        if left_ms <= 0:
            return False
        for _ in range(2):  # a second try on a new connection if this one has dropped
            try:
                self._client.renew(self.name, self.token, ttl="%dms" % left_ms, detach=True)
                self.kept = True
                return True
            except ConnectionLost:
                continue
            except LockdError:
                return False
        return False

    def _release(self):
        for _ in range(2):  # a second try on a new connection if this one has dropped
            try:
                self._client.unlock(self.name, self.token)
                return
            except NotHeld:
                return  # expired or taken meanwhile: nothing left to release
            except ConnectionLost:
                continue
            except LockdError:
                return  # the lease ends by its grace or ttl anyway

    def _renew_loop(self, ttl_ms):
        # The lease surely lives ``hold_ms`` from when a renewal that got through was *sent*
        # (the server counts from when it read it, which is later). The loss is told before
        # that, whatever a renewal in flight does: no attempt may outlast it, so another
        # holder can't be granted while the body still runs.
        last_ok = self._sent
        while True:
            hold_ms = self._hold_ms(ttl_ms)
            every_ms = hold_ms or ttl_ms
            deadline = last_ok + hold_ms / 1000.0 - min(0.5, hold_ms / 10000.0)
            if self._stop.wait(max(every_ms / 3000.0, 0.05)):
                return
            sent = time.monotonic()
            left = deadline - sent
            if hold_ms and left <= 0:
                self._mark_lost("no renewal got through within %d ms" % hold_ms)
                return
            # A renewal must not wait longer than this for its reply (or to connect), so a
            # silent server cannot keep the thread from noticing the lease may be gone.
            timeout = min(self._timeout, every_ms / 3000.0 + 1.0)
            self._client.timeout = min(timeout, left) if hold_ms else timeout
            try:
                ttl_ms = self._renew(deadline if hold_ms else None)
                last_ok = sent
            except (ConnectionLost, Unavailable, Shutdown) as e:
                # The server may be restarting, or (ERR UNAVAILABLE, SHUTDOWN) this front-end
                # can't serve it now and another may: retry, through the next address if there
                # is one, while the lease surely lives.
                if not isinstance(e, ConnectionLost) and len(self._client._addrs) > 1:
                    with self._client._mutex:
                        self._client._lost()
                if time.monotonic() >= deadline:
                    self._mark_lost("no renewal got through within %d ms (%s)" % (hold_ms, e))
                    return
            except LockdError as e:
                self._mark_lost(str(e))
                return

    def _mark_lost(self, reason):
        self.reason = reason
        self._lost.set()
        if self.on_lost is not None:
            try:
                self.on_lost(self)
            except Exception:  # a callback's failure must not hide the loss
                pass


def lock(name, server=None, ttl=30, wait=None, id=None, session=DEFAULT_GRACE, on_lost=None,
         timeout=10.0, shared=False, limit=None, tls=None, ca=None, cert=None, key=None,
         user=None, secret=None, secret_file=None, supersede=False, at_least=None, also=(),
         note=None):
    """A :class:`Lease` on ``name``: ``with lock("deploy", ttl=30) as token: ...``; with
    ``also=[...]``, on a set of names: ``with lock("db-migrate", also=["cache-flush"]) as
    tokens: ...``.

    ``server`` (one address or several, as :class:`Client` takes it) defaults to $LOCKD_ADDR,
    then 127.0.0.1:5001; ``ttl`` is the lease, renewed in the background; ``session`` its
    grace (see :class:`Lease`); ``wait`` bounds the wait for the lock (None: forever; 0: one
    try, raising Timeout if held); ``id`` defaults to
    a new :func:`default_id` (one per ``lock()``: two holders in one process never share
    one). ``note`` is a note for people shown with the holder (:meth:`Client.lock`). Exclusive
    unless ``shared=True`` (a shared hold) or ``limit=n`` (one slot of a semaphore of n).
    ``tls``, ``ca``, ``cert``, ``key``, ``user``, ``secret`` and ``secret_file`` are
    :class:`Client`'s.

    To notice a lost lease in the body, look at ``token.lost``, ``token.check()`` (raises
    LeaseLost) or ``token.lost_event`` (a :class:`threading.Event`) between steps of the work
    (the token is a :class:`HeldToken`; the Lease has the same, ``lease.lost`` ...): Python
    cannot stop a running body from outside, so it runs on until it looks or ends, and
    leaving the ``with`` then raises LeaseLost. ``on_lost(lease)`` is called at once, in the
    renewal thread.
    """
    return Lease(name, server=server, ttl=ttl, wait=wait, id=id, session=session,
                 on_lost=on_lost, timeout=timeout, shared=shared, limit=limit, tls=tls, ca=ca,
                 cert=cert, key=key, user=user, secret=secret, secret_file=secret_file,
                 supersede=supersede, at_least=at_least, also=also, note=note)
