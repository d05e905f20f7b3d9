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
Python cannot safely raise an exception inside the main thread from the renewal thread, so a
body that runs long should look for itself, between steps::

    lease = lock("deploy", ttl=30)
    with lease as token:
        for step in steps:
            lease.check()        # raises LeaseLost at once if the lease is gone
            step(token)

or pass ``on_lost=callback`` (called once, in the renewal thread; for instance
``_thread.interrupt_main`` to get a KeyboardInterrupt in the main thread).

The full client::

    c = Client("127.0.0.1:5001")
    token = c.lock("deploy", ttl="5m", wait=10)   # raises Timeout if still held after 10 s
    c.renew("deploy", token)                      # -> ttl_ms; raises NotHeld if lost
    c.unlock("deploy", token)
    c.status("deploy")                            # LockStatus, or None if free

Shared locks and semaphores (proto.md, "Shared locks and semaphores"; lockctl's ``--shared``
and ``--limit N``): every way to lock takes ``shared=True`` (any number of shared holders
together, never beside an exclusive one) or ``limit=n`` (up to n holders at once); without
either the lock is exclusive::

    with lock("db-backup", limit=2):             # at most two backups at once
        backup()
    c.detail("db-backup")                        # LockDetail: every Holder and Waiter, modes

Each holder is one id: a LOCK by an id that already holds the name is its retry and gets the
same token back, so one process that takes two slots gives each its own ``id``.

A process killed while it waits in ``Client.lock`` (or in ``with lock(...)``) leaves the
server's queue at once and never gets the lock: a plain LOCK is sent with ``detach`` (the wait
is tied to the connection, the lease is not), a session LOCK is tied to it anyway.

Every ``ERR <code>`` reply raises the :class:`ServerError` subclass of that code (``Timeout``,
``NotHeld``, ``BadArg``, ...; ``.code`` holds the word); a connection that fails or closes
raises :class:`ConnectionLost`. Durations are seconds (int or float) or protocol strings
("250ms", "5m", "1h30m").

Every error has an ``exit_code``, the exit code lockctl and lockd.sh use for the same failure,
so a script can end with ``sys.exit(e.exit_code)``: 1 the lock is held by someone else or the
wait ran out (Timeout), 2 usage or a refusal by the server (ServerError, ProtocolError), 3 the
server is unreachable or the connection was lost (ConnectionLost), 4 the lock was lost or a
token is not the live lease (NotHeld, LeaseLost). Arguments this client refuses itself raise
ValueError or TypeError, which are usage errors (2).
"""

import os
import re
import socket
import threading
import time

__all__ = [
    "DEFAULT_SERVER",
    "DEFAULT_GRACE",
    "EXIT_HELD",
    "EXIT_USAGE",
    "EXIT_UNREACHABLE",
    "EXIT_LOST",
    "LockdError",
    "ConnectionLost",
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
    "LeaseLost",
    "LockStatus",
    "Holder",
    "Waiter",
    "LockDetail",
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
#: Longest reply line we accept; the server's replies are far shorter.
_MAX_REPLY = 64 * 1024


class LockdError(Exception):
    """Base of every error this module raises. ``exit_code`` is lockctl's code for it."""

    exit_code = EXIT_USAGE


class ConnectionLost(LockdError, ConnectionError):
    """Could not connect, or the connection failed or closed before the reply came."""

    exit_code = EXIT_UNREACHABLE


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


class Limit(ServerError):
    """ERR LIMIT: too many connections or held locks on the server."""


class Lagged(ServerError):
    """ERR LAGGED: a watcher fell too far behind."""


class Shutdown(ServerError):
    """ERR SHUTDOWN: the server is stopping."""


_ERRORS = {
    cls.__name__.upper(): cls
    for cls in (Syntax, Unknown, BadArg, Encoding, TooLong, Timeout, NotHeld, Conflict,
                Replaced, Limit, Lagged, Shutdown)
}


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
    its ``mode``: ``"exclusive"``, ``"shared"`` or ``"limit:<n>"`` (a semaphore of n)."""

    __slots__ = ("name", "id", "token", "ttl_ms", "session", "waiters", "holders", "mode")

    def __init__(self, name, id, token, ttl_ms, session, waiters, holders=1, mode="exclusive"):
        super().__init__(name, id, token, ttl_ms, session, waiters, holders, mode)


class Holder(_Record):
    """One holder of a lock, a ``HOLDER`` line of ``STATUS <name> detail``; ``mode`` as in
    :class:`LockStatus`."""

    __slots__ = ("name", "id", "token", "held_ms", "ttl_ms", "session", "mode")


class Waiter(_Record):
    """One waiter of a lock, a ``WAITER`` line of ``STATUS <name> detail``: ``position`` 1 is
    next in the queue; ``mode`` is what it asks for."""

    __slots__ = ("name", "position", "id", "waited_ms", "session", "mode")


class LockDetail(_Record):
    """A held lock in full, as ``STATUS <name> detail`` reports it: ``status`` (its
    :class:`LockStatus`), every holder in grant order and the waiters in queue order (the
    first 1000; ``status.waiters`` counts them all)."""

    __slots__ = ("status", "holders", "waiters")


def _fields(line, words):
    """The ``key=value`` words of a reply line as a dict (ProtocolError if one is missing)."""
    fields = dict(w.split("=", 1) for w in words if "=" in w)
    return lambda key, kind=str: _field(line, fields, key, kind)


def _field(line, fields, key, kind):
    try:
        return kind(fields[key])
    except (KeyError, ValueError):
        raise ProtocolError("bad reply line: %r" % line) from None


def _parse_status(words):
    """``<name> held id=.. token=.. ttl_ms=.. session=.. waiters=.. [holders=.. mode=..]`` ->
    LockStatus."""
    line = " ".join(words)
    if len(words) < 2 or words[1] != "held":
        raise ProtocolError("bad status: %r" % line)
    get = _fields(line, words[2:])
    # An exclusive lock's line has neither holders= nor mode=.
    shape = ((get("holders", int), get("mode")) if "mode=" in line else (1, "exclusive"))
    return LockStatus(words[0], get("id"), get("token", int), get("ttl_ms", int),
                      get("session") == "1", get("waiters", int), *shape)


def _parse_holder(line):
    """``HOLDER <name> id=.. token=.. held_ms=.. ttl_ms=.. session=.. mode=..`` -> Holder."""
    words = line.split()
    get = _fields(line, words[2:])
    return Holder(words[1], get("id"), get("token", int), get("held_ms", int),
                  get("ttl_ms", int), get("session") == "1", get("mode"))


def _parse_waiter(line):
    """``WAITER <name> <position> id=.. waited_ms=.. session=.. mode=..`` -> Waiter."""
    words = line.split()
    if len(words) < 3 or not words[2].isdigit():
        raise ProtocolError("bad reply line: %r" % line)
    get = _fields(line, words[3:])
    return Waiter(words[1], int(words[2]), get("id"), get("waited_ms", int),
                  get("session") == "1", get("mode"))


def _split_addr(server):
    """'host:port' or '[v6]:port' -> (host, port)."""
    host, sep, port = server.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError("server must be host:port, not %r" % server)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


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


def default_id():
    """``<hostname>:<pid>``, as lockctl does: one id per process."""
    return "%s:%d" % (socket.gethostname(), os.getpid())


class Client:
    """One connection to lockd, opened on first use and again after a failure.

    A client is safe to share between threads (one request at a time), but a LOCK that waits
    holds the connection until it is answered: give each waiting thread its own client.
    ``timeout`` bounds every reply that should come at once; a waiting LOCK gets its ``wait``
    on top of it (or no bound at all without ``wait``).
    """

    def __init__(self, server=None, id=None, timeout=10.0):
        self.server = server or os.environ.get("LOCKD_ADDR") or DEFAULT_SERVER
        self._addr = _split_addr(self.server)
        self.id = _word("id", id or default_id())
        self.timeout = timeout
        self._sock = None
        self._file = None
        self._mutex = threading.Lock()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        """Closes the connection (ending its `session` leases); the next call reconnects."""
        with self._mutex:
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
            try:
                if self._sock is None:
                    self._sock = socket.create_connection(self._addr, timeout=self.timeout)
                    self._file = self._sock.makefile("rb")
                self._sock.settimeout(self.timeout)
                self._sock.sendall(line.encode("utf-8") + b"\n")
                self._sock.settimeout(timeout)
                return (read or self._read_line)()
            except socket.timeout:
                self._drop()
                raise ConnectionLost("no reply from %s to %r in time" % (self.server, line))
            except OSError as e:
                self._drop()
                raise ConnectionLost("%s: %s" % (self.server, e)) from e
            except BaseException:
                self._drop()
                raise

    def _read_line(self):
        raw = self._file.readline(_MAX_REPLY + 1)
        if not raw:
            self._drop()
            raise ConnectionLost("%s closed the connection" % self.server)
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
            self._drop()  # the server closes the connection after these
            raise

    def lock(self, name, ttl=None, wait=None, session=False, detach=True, shared=False,
             limit=None):
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
        """
        line = "LOCK %s %s" % (_word("name", name), self.id)
        if ttl is not None:
            line += " ttl=" + _duration("ttl", ttl)
        reply_timeout = None
        if wait is not None:
            line += " wait=" + _duration("wait", wait)
            secs = _seconds(wait)
            if secs is not None:
                reply_timeout = secs + self.timeout
        line += _session_option(session, detach) + _mode_option(shared, limit)
        rest = self._call(line, reply_timeout)
        if not rest.isdigit():
            raise ProtocolError("unexpected reply to LOCK: %r" % rest)
        return int(rest)

    def try_lock(self, name, ttl=None, session=False, shared=False, limit=None):
        """One try: the token, or None if the lock is held (in a way this LOCK does not fit
        beside, or others wait for it first)."""
        try:
            return self.lock(name, ttl=ttl, wait=0, session=session, shared=shared, limit=limit)
        except Timeout:
            return None

    def unlock(self, name, token):
        """Releases the lease. Raises NotHeld if ``token`` no longer held it."""
        self._call("UNLOCK %s %d" % (_word("name", name), int(token)))

    def _ttl_ms(self, verb, rest):
        if not rest.startswith("ttl_ms=") or not rest[7:].isdigit():
            raise ProtocolError("unexpected reply to %s: %r" % (verb, rest))
        return int(rest[7:])

    def renew(self, name, token, ttl=None):
        """Extends the lease (to ``ttl`` from now, default its own ttl); returns the ttl in ms.

        Raises NotHeld if the lease is gone: the caller has lost the lock and must stop.
        """
        line = "RENEW %s %d" % (_word("name", name), int(token))
        if ttl is not None:
            line += " ttl=" + _duration("ttl", ttl)
        return self._ttl_ms("RENEW", self._call(line))

    def check(self, name, token):
        """Returns the ms left on the lease if ``token`` is the live lease, else raises NotHeld."""
        return self._ttl_ms("CHECK", self._call("CHECK %s %d" % (_word("name", name), int(token))))

    def status(self, name=None):
        """With a name: its LockStatus, or None if free. Without: a list of every held lock."""
        if name is not None:
            rest = self._call("STATUS %s" % _word("name", name))
            words = rest.split()
            if words[1:] == ["free"]:
                return None
            return _parse_status(words)
        return self._request("STATUS", read=self._read_status_lines)

    def detail(self, name):
        """Every holder and waiter of ``name`` (``STATUS <name> detail``): a LockDetail, or None
        if the lock is free."""
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
        if words[1:] == ["free"]:
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

    def ping(self):
        """True if the server answers PING."""
        return self._call("PING") == "PONG"


class Lease:
    """A lock held for the body of a ``with`` and renewed by a background thread.

    ``with lease as token`` takes the lock (waiting up to ``wait``), starts the renewal thread
    and on exit stops it and releases the lock. The lease is a session lease with a grace of
    ``session`` seconds (default 10, capped at the ttl; a duration string works too), held on
    one connection that the thread renews on: a killed process loses the lock at most the
    grace after, and a dropped connection is ridden out by reconnecting and renewing within
    it. ``session=True`` (or 0) ends the lease as soon as the connection closes;
    ``session=False`` takes a plain lease instead, which outlives the process until its ttl.
    ``shared`` and ``limit`` are :meth:`Client.lock`'s: a shared hold, or one slot of a
    semaphore; exclusive by default.

    The thread renews every third of the time the lease surely lives without a renewal (the
    grace, or the ttl if shorter). ``lease.lost`` turns True, and ``lease.check()`` starts
    raising LeaseLost, as soon as the thread finds the lease gone: a renewal answered NOTHELD,
    or none got through for that long. Then ``on_lost(lease)`` is called once (in the
    renewal thread), and leaving the ``with`` raises LeaseLost if the body itself ended
    normally (an exception from the body is left to propagate; ``lease.lost`` tells).
    """

    def __init__(self, name, server=None, ttl=30, wait=None, id=None, session=DEFAULT_GRACE,
                 on_lost=None, timeout=10.0, shared=False, limit=None):
        self.name = _word("name", name)
        self.ttl = ttl
        self.wait = wait
        _mode_option(shared, limit)  # a mode that can't be asked for fails here, not in ``with``
        self.shared = shared
        self.limit = limit
        self.session = self._capped(session, ttl)
        self.on_lost = on_lost
        self._timeout = timeout
        self._client = Client(server, id=id, timeout=timeout)
        self.token = None
        self.reason = None
        self._lost = threading.Event()
        self._stop = threading.Event()
        self._thread = None

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

    def check(self):
        """Raises LeaseLost if the lease is known to be lost (no network round trip)."""
        if self._lost.is_set():
            raise LeaseLost(self.name, self.token or 0, self.reason or "lost")

    def __enter__(self):
        if self._thread is not None:
            raise RuntimeError("a Lease is entered once; make a new one")
        try:
            self.token = self._client.lock(self.name, ttl=self.ttl, wait=self.wait,
                                           session=self.session, shared=self.shared,
                                           limit=self.limit)
            # A first renewal at once gives the lease's length in ms, whatever form ttl took.
            ttl_ms = self._renew()
        except BaseException:
            if self.token is not None:
                self._release()
            self._client.close()
            raise
        self._thread = threading.Thread(target=self._renew_loop, args=(ttl_ms,),
                                        name="lockd-renew-%s" % self.name, daemon=True)
        self._thread.start()
        return self.token

    def __exit__(self, exc_type, exc, tb):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if not self.lost:
            self._release()
        self._client.close()
        if self.lost and exc_type is None:
            raise LeaseLost(self.name, self.token, self.reason)
        return False

    def _renew(self):
        """RENEWs the lease and returns its ttl in ms. If the connection has dropped, renews once
        more on a new one (the client reconnects), which the server then ties the lease to."""
        try:
            return self._client.renew(self.name, self.token)
        except ConnectionLost:
            return self._client.renew(self.name, self.token)

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
        last_ok = time.monotonic()
        while True:
            hold_ms = self._hold_ms(ttl_ms)
            every_ms = hold_ms or ttl_ms
            # A renewal must not wait longer than this for its reply (or to connect), so a
            # silent server cannot keep the thread from noticing the lease may be gone.
            self._client.timeout = min(self._timeout, every_ms / 3000.0 + 1.0)
            if self._stop.wait(max(every_ms / 3000.0, 0.05)):
                return
            try:
                ttl_ms = self._renew()
                last_ok = time.monotonic()
            except ConnectionLost as e:
                # The server may be restarting: retry while the lease surely lives.
                if (time.monotonic() - last_ok) * 1000.0 >= hold_ms:
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
         timeout=10.0, shared=False, limit=None):
    """A :class:`Lease` on ``name``: ``with lock("deploy", ttl=30) as token: ...``.

    ``server`` defaults to $LOCKD_ADDR, then 127.0.0.1:5001; ``ttl`` is the lease, renewed in
    the background; ``session`` its grace (see :class:`Lease`); ``wait`` bounds the wait for
    the lock (None: forever; 0: one try, raising Timeout if held); ``id`` defaults to
    ``<hostname>:<pid>``. Exclusive unless ``shared=True`` (a shared hold) or ``limit=n`` (one
    slot of a semaphore of n).
    """
    return Lease(name, server=server, ttl=ttl, wait=wait, id=id, session=session,
                 on_lost=on_lost, timeout=timeout, shared=shared, limit=limit)
