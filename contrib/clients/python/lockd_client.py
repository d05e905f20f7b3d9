"""A dependency-free Python 3.8+ client for lockd (the line protocol of proto.md).

The quick way, a lock held for the body of a ``with`` and renewed in the background::

    from lockd_client import lock

    with lock("deploy", server="127.0.0.1:5001", ttl=30) as token:
        deploy(fencing_token=token)

If the lease is lost while the body runs (a renewal is refused, or the server stays
unreachable for a whole ttl), the ``with`` raises :class:`LeaseLost` when the body ends.
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

Every ``ERR <code>`` reply raises the :class:`ServerError` subclass of that code (``Timeout``,
``NotHeld``, ``BadArg``, ...; ``.code`` holds the word); a connection that fails or closes
raises :class:`ConnectionLost`. Durations are seconds (int or float) or protocol strings
("250ms", "5m", "1h30m").
"""

import os
import socket
import threading
import time

__all__ = [
    "DEFAULT_SERVER",
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
    "Client",
    "Lease",
    "lock",
]

DEFAULT_SERVER = "127.0.0.1:5001"
#: Longest reply line we accept; the server's replies are far shorter.
_MAX_REPLY = 64 * 1024


class LockdError(Exception):
    """Base of every error this module raises."""


class ConnectionLost(LockdError, ConnectionError):
    """Could not connect, or the connection failed or closed before the reply came."""


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


class NotHeld(ServerError):
    """ERR NOTHELD: the token is not the live lease (released, expired or taken over)."""


class Conflict(ServerError):
    """ERR CONFLICT: this id holds the lock with a session lease on another open connection."""


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

    def __init__(self, name, token, reason):
        super().__init__("lease on %r (token %d) lost: %s" % (name, token, reason))
        self.name = name
        self.token = token
        self.reason = reason


class LockStatus:
    """One held lock, as STATUS reports it."""

    __slots__ = ("name", "id", "token", "ttl_ms", "session", "waiters")

    def __init__(self, name, id, token, ttl_ms, session, waiters):
        self.name = name
        self.id = id
        self.token = token
        self.ttl_ms = ttl_ms
        self.session = session
        self.waiters = waiters

    def __repr__(self):
        return "LockStatus(name=%r, id=%r, token=%d, ttl_ms=%d, session=%r, waiters=%d)" % (
            self.name, self.id, self.token, self.ttl_ms, self.session, self.waiters)

    def __eq__(self, other):
        return isinstance(other, LockStatus) and all(
            getattr(self, k) == getattr(other, k) for k in self.__slots__)


def _parse_status(words):
    """``<name> held id=.. token=.. ttl_ms=.. session=.. waiters=..`` -> LockStatus."""
    if len(words) < 2 or words[1] != "held":
        raise ProtocolError("bad status: %r" % " ".join(words))
    fields = dict(w.split("=", 1) for w in words[2:] if "=" in w)
    try:
        return LockStatus(words[0], fields["id"], int(fields["token"]), int(fields["ttl_ms"]),
                          fields["session"] == "1", int(fields["waiters"]))
    except (KeyError, ValueError):
        raise ProtocolError("bad status: %r" % " ".join(words)) from None


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

    def lock(self, name, ttl=None, wait=None, session=False):
        """Takes the lock and returns its fencing token; waits in the FIFO queue while held.

        ``wait=None`` waits as long as it takes; ``wait=0`` tries once. Raises Timeout when the
        wait runs out. ``session=True`` ties the lease to this connection as well.
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
        if session:
            line += " session"
        rest = self._call(line, reply_timeout)
        if not rest.isdigit():
            raise ProtocolError("unexpected reply to LOCK: %r" % rest)
        return int(rest)

    def try_lock(self, name, ttl=None, session=False):
        """One try: the token, or None if the lock is held."""
        try:
            return self.lock(name, ttl=ttl, wait=0, session=session)
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
    (a RENEW every third of the ttl, on its own connection), and on exit stops it and
    releases the lock. ``lease.lost`` turns True, and ``lease.check()`` starts raising
    LeaseLost, as soon as the thread finds the lease gone: renewal answered NOTHELD, or the
    server unreachable for a whole ttl. Then ``on_lost(lease)`` is called once (in the
    renewal thread), and leaving the ``with`` raises LeaseLost if the body itself ended
    normally (an exception from the body is left to propagate; ``lease.lost`` tells).
    """

    def __init__(self, name, server=None, ttl=30, wait=None, id=None, session=False,
                 on_lost=None, timeout=10.0):
        self.name = _word("name", name)
        self.ttl = ttl
        self.wait = wait
        self.session = session
        self.on_lost = on_lost
        self._client = Client(server, id=id, timeout=timeout)
        self._renewer = Client(self._client.server, id=self._client.id, timeout=timeout)
        self.token = None
        self.reason = None
        self._lost = threading.Event()
        self._stop = threading.Event()
        self._thread = None

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
                                           session=self.session)
        except BaseException:
            self._client.close()
            self._renewer.close()
            raise
        try:
            # A first renewal at once gives the lease's length in ms, whatever form ttl took.
            ttl_ms = self._renewer.renew(self.name, self.token)
        except BaseException:
            self._release()
            self._client.close()
            self._renewer.close()
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
        self._renewer.close()
        if self.lost and exc_type is None:
            raise LeaseLost(self.name, self.token, self.reason)
        return False

    def _release(self):
        try:
            self._client.unlock(self.name, self.token)
        except NotHeld:
            pass  # expired or taken meanwhile: nothing left to release
        except LockdError:
            pass  # unreachable: the lease ends by its ttl (or its session) anyway

    def _renew_loop(self, ttl_ms):
        last_ok = time.monotonic()
        while not self._stop.wait(max(ttl_ms / 3000.0, 0.05)):
            try:
                ttl_ms = self._renewer.renew(self.name, self.token)
                last_ok = time.monotonic()
            except ConnectionLost as e:
                # The server may be restarting: retry while the lease could still be live.
                if time.monotonic() - last_ok >= ttl_ms / 1000.0:
                    self._mark_lost("server unreachable for a whole lease (%s)" % e)
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


def lock(name, server=None, ttl=30, wait=None, id=None, session=False, on_lost=None,
         timeout=10.0):
    """A :class:`Lease` on ``name``: ``with lock("deploy", ttl=30) as token: ...``.

    ``server`` defaults to $LOCKD_ADDR, then 127.0.0.1:5001; ``ttl`` is the lease renewed every
    third of it; ``wait`` bounds the wait for the lock (None: forever; 0: one try, raising
    Timeout if held); ``id`` defaults to ``<hostname>:<pid>``.
    """
    return Lease(name, server=server, ttl=ttl, wait=wait, id=id, session=session,
                 on_lost=on_lost, timeout=timeout)
