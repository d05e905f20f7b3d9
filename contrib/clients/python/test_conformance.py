"""The conformance scenarios (../conformance/scenarios.json; its README says the format),
played by this client against a real lockd per scenario: ``python3 -m unittest
test_conformance``. LOCKD_BIN names the binary (default: the repository's
target/release/lockd, then target/debug/lockd).

A ``watch`` is ``Client.watch``, a generator of typed events. A ``lock``'s ``and`` names are
``Client.lock``'s ``also=`` (then it returns a token per name), a detail entry's ``and`` its
Holder's or Waiter's ``also``.
"""

import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

import lockd_client as lc

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..", "..")
SCENARIOS = json.load(open(os.path.join(HERE, "..", "conformance", "scenarios.json")))
HAS = {"hold", "tls", "resend", "watch"}
GUARD = 10.0

#: Scenarios this client is known to fail, each with why (unittest's expectedFailure: if it
#: passes one day, the run says so, and the entry goes).
KNOWN = {}


def lockd_bin():
    for path in (os.environ.get("LOCKD_BIN"), os.path.join(ROOT, "target/release/lockd"),
                 os.path.join(ROOT, "target/debug/lockd")):
        if path and os.path.exists(path):
            return path
    raise unittest.SkipTest("no lockd: set LOCKD_BIN or build it (cargo build)")


class Proxy:
    """Forwards a port to lockd until cut; then passes nothing and closes nothing."""

    def __init__(self, target):
        self.cut = threading.Event()
        self.through = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.addr = "127.0.0.1:%d" % self.sock.getsockname()[1]
        self.target = target
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                inner, _ = self.sock.accept()
                outer = socket.create_connection(self.target)
            except OSError:
                return
            self.through += [inner, outer]
            for a, b in ((inner, outer), (outer, inner)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def drop(self):
        """Closes every connection through it, both sides."""
        for sock in self.through:
            try:
                sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            except OSError:
                pass
        self.through = []

    def _pump(self, src, dst):
        while True:
            try:
                data = src.recv(4096)
            except OSError:
                return
            if self.cut.is_set():
                return  # nothing passes; the sockets stay open until the run ends
            if not data:
                dst.close()
                return
            dst.sendall(data)


def unavailable():
    """A fake front-end cut off from etcd: OK PONG to PING, ERR UNAVAILABLE to everything
    else. Its port; it ends with the run."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve(conn):
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                conn.sendall(b"OK PONG\n" if line.strip().upper() == b"PING"
                             else b"ERR UNAVAILABLE etcd has no leader; try again\n")

    def accept():
        while True:
            threading.Thread(target=serve, args=(server.accept()[0],), daemon=True).start()
    threading.Thread(target=accept, daemon=True).start()
    return "127.0.0.1:%d" % server.getsockname()[1]


class World:
    def __init__(self, scenario, tmp):
        self.tmp, self.args, self.pki = tmp, [], None
        self.clients, self.tokens, self.pending, self.holds = {}, {}, {}, {}
        self.watches = {}
        self.proxy, self.froze_at = None, None
        server = scenario.get("server", {})
        if server.get("tls"):
            self.pki = tmp
            subprocess.run([os.path.join(HERE, "..", "conformance", "make-pki"), tmp], check=True)
            self.args += ["--tls-cert", tmp + "/server.pem", "--tls-key", tmp + "/server.key",
                          "--tls-client-ca", tmp + "/ca.pem"]
        if server.get("auth"):
            lines = ""
            for user, u in SCENARIOS["users"].items():
                lines += subprocess.run([lockd_bin(), "--auth-hash", "%s %s" % (user, u["rights"])],
                                        input=u["secret"] + "\n", capture_output=True, text=True,
                                        check=True).stdout
            with open(tmp + "/users", "w") as f:
                f.write(lines)
            self.args += ["--auth-file", tmp + "/users"]
        self.start("127.0.0.1:0")

    def start(self, listen):
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKD_") and k != "RUST_LOG"}
        self.proc = subprocess.Popen([lockd_bin(), "--listen", listen] + self.args, env=env,
                                     stderr=subprocess.PIPE, text=True)
        for line in self.proc.stderr:
            found = re.search(r"\d+\.\d+\.\d+\.\d+:\d+", line)
            if "listening" in line and found:
                self.addr = found.group(0)
                break
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()

    def stop(self):
        self.proc.send_signal(signal.SIGCONT)
        self.proc.kill()
        self.proc.wait()
        for client in self.clients.values():
            client.close()

    def _proxy(self):
        if self.proxy is None:
            self.proxy = Proxy(lc._split_addr(self.addr))
        return self.proxy

    def options(self, name, step):
        addrs = [self.addr]
        if "addrs" in step:
            addrs = []
            for a in step["addrs"]:
                if a == "proxy":
                    addrs.append(self._proxy().addr)
                elif a == "unavailable":
                    addrs.append(unavailable())
                elif a == "dead":
                    s = socket.create_server(("127.0.0.1", 0))
                    addrs.append("127.0.0.1:%d" % s.getsockname()[1])
                    s.close()
                else:
                    addrs.append(self.addr)
        if step.get("via") == "proxy":
            addrs = [self._proxy().addr]
        o = {"server": ",".join(addrs), "id": name, "timeout": 5.0, "tls": False}
        if step.get("id") == "default":
            del o["id"]
        if self.pki:
            o.update(tls=True, ca=self.pki + "/ca.pem", cert=self.pki + "/client.pem",
                     key=self.pki + "/client.key")
        user = step.get("user")
        if user:
            o["user"] = user
            secret = SCENARIOS["users"][user]["secret"]
            if step.get("secret") == "env":
                os.environ["LOCKD_SECRET"] = secret  # read by Client(), unset after it
            elif step.get("secret") == "file":
                o["secret_file"] = self.tmp + "/" + user + ".secret"
                with open(o["secret_file"], "w") as f:
                    f.write(secret + "\n")
            else:
                o["secret"] = "not-the-secret-0123456789"
        return o

    def token(self, v):
        return self.tokens[v] if isinstance(v, str) else v

    def outcome(self, step, fn):
        want = step.get("expect")
        try:
            got = fn()
        except lc.ServerError as e:
            if e.code == want:
                return
            raise AssertionError("%s; expected %s" % (e, want))
        if want:
            raise AssertionError("answered %r; expected %s" % (got, want))
        for key, value in step.get("result", {}).items():
            value = self.tokens[value] if key == "token" and isinstance(value, str) else value
            if isinstance(value, list):
                value = [dict(v, token=self.token(v["token"])) if "token" in v else v for v in value]
            if got.get(key) != value:
                raise AssertionError("answered %r; expected %s=%r" % (got, key, value))

    def lock(self, step):
        c, s = self.clients[step["client"]], step
        box = {"done": threading.Event()}

        box["names"] = [s["name"]] + list(s.get("and", []))

        def run():
            try:
                got = c.lock(s["name"], ttl=ms(s.get("ttl_ms")), wait=ms(s.get("wait_ms")),
                             session=ms(s.get("grace_ms")) or True if s.get("session") else False,
                             shared=s.get("shared", False), limit=s.get("limit"),
                             supersede=s.get("supersede", False), note=s.get("note"),
                             also=s.get("and", ()))
                # A set's LOCK returns a token per name, one name's its token alone.
                box["tokens"] = got if s.get("and") else [got]
            except lc.LockdError as e:
                box["error"] = e
            box["at"] = time.monotonic()
            box["done"].set()
        self.pending[s.get("as", "_")] = box
        threading.Thread(target=run, daemon=True).start()
        if not s.get("async"):
            self.wait(s.get("as", "_"), s)

    def wait(self, of, step):
        box = self.pending[of]
        assert box["done"].wait(GUARD), "the LOCK %s was not answered" % of

        def result():
            if "error" in box:
                raise box["error"]
            tokens = box["tokens"]
            assert len(tokens) == len(box["names"]), "granted %r for %r" % (tokens, box["names"])
            # ``<as>`` is the first name's token, ``<as>.<name>`` each name's.
            self.tokens[of] = tokens[0]
            for name, token in zip(box["names"], tokens):
                self.tokens["%s.%s" % (of, name)] = token
        self.outcome(step, result)

    def hold(self, step):
        h = {"end": threading.Event(), "lost": threading.Event(), "done": threading.Event(),
             "ttl": step["ttl_ms"] / 1000.0, "got": threading.Event()}
        self.holds[step["as"]] = h
        o = self.options(step["client"], step)

        def lost(_lease):
            h["lost_at"] = time.monotonic()
            h["lost"].set()

        def run():
            try:
                with lc.lock(step["name"], ttl=h["ttl"], on_lost=lost, **o) as token:
                    self.tokens[step["as"]] = token
                    h["got"].set()
                    # The body hears of the loss through its token (a HeldToken).
                    while not (h["end"].is_set() or token.lost_event.wait(0.01)):
                        pass
            except lc.LockdError as e:
                h["error"] = e
            h["done"].set()
        threading.Thread(target=run, daemon=True).start()
        if not step.get("async"):
            self.granted(step["as"])

    def granted(self, of):
        """Waits for the body of the hold ``of`` to run (its token saved under ``of``)."""
        assert self.holds[of]["got"].wait(GUARD), "no lock for the helper: %s" % (
            self.holds[of].get("error"))

    def step(self, s):
        op, c, name = s["op"], self.clients.get(s.get("client")), s.get("name")
        if op == "connect":
            o = self.options(s["client"], s)
            try:
                self.clients[s["client"]] = c = lc.Client(**o)
            finally:
                os.environ.pop("LOCKD_SECRET", None)
            return self.outcome(s, c.ping)
        if op == "lock":
            return self.lock(s)
        if op == "await":
            if s["of"] in self.holds:
                return self.granted(s["of"])
            return self.wait(s["of"], s)
        if op == "pending":
            time.sleep(s.get("ms", 300) / 1000.0)
            if s["of"] in self.holds:
                h = self.holds[s["of"]]
                assert not (h["got"].is_set() or h["done"].is_set()), \
                    "the helper runs (or failed: %s); it should still wait" % h.get("error")
            else:
                assert not self.pending[s["of"]]["done"].is_set(), "answered; it should still wait"
        elif op == "distinct":
            tokens = [self.tokens[t] for t in s["tokens"]]
            assert len(set(tokens)) == len(tokens), "%r are %r: not all different" % (
                s["tokens"], tokens)
        elif op in ("unlock", "renew", "check"):
            args = [name, self.token(s["token"])] + ([ms(s.get("ttl_ms"))] if op == "renew" else [])
            return self.outcome(s, lambda: {"left": getattr(c, op)(*args)})
        elif op == "status":
            return self.outcome(s, lambda: status(c.status(name)))
        elif op == "status_all":
            return self.outcome(s, lambda: {"names": [x.name for x in c.status()]})
        elif op == "detail":
            def detail():
                d = c.detail(name)
                if d is None:
                    return {"free": True}
                # A holder's note, and a set's other names (``and``), are named only where it
                # has them (the lists compare whole).
                return {"holders": [dict({"id": h.id, "token": h.token, "mode": h.mode},
                                         **({"note": h.note} if h.note is not None else {}),
                                         **({"and": h.also} if h.also else {}))
                                    for h in d.holders],
                        "waiters": [dict({"id": w.id, "position": w.position, "mode": w.mode},
                                         **({"and": w.also} if w.also else {}))
                                    for w in d.waiters]}
            return self.outcome(s, detail)
        elif op == "watch":
            self.watches[s["client"]] = c.watch(name, timeout=GUARD)
        elif op == "event":
            def event():
                e = next(self.watches[s["client"]])
                return {"kind": e.kind, "name": e.name, "id": e.id, "token": e.token}
            return self.outcome(s, event)
        elif op == "hold":
            self.hold(s)
        elif op == "end":
            h = self.holds[s["of"]]
            h["end"].set()
            assert h["done"].wait(GUARD), "the helper did not return"
            assert "error" not in h, "the helper failed: %s" % h.get("error")
        elif op == "lost":
            h = self.holds[s["of"]]
            assert h["lost"].wait(GUARD), "no loss signalled"
            assert h["done"].wait(GUARD), "the helper did not return after the loss"
            assert isinstance(h.get("error"), lc.LeaseLost), "ended with %r" % h.get("error")
            if "before" in s:
                at = self.pending[s["before"]]["at"]
                assert h["lost_at"] < at, "signalled %.3fs after the grant" % (h["lost_at"] - at)
            if s.get("within_ttl_of_freeze"):
                late = h["lost_at"] - self.froze_at - h["ttl"]
                assert late <= 0, "signalled %.3fs after the ttl since the freeze" % late
        elif op == "sleep":
            time.sleep(s["ms"] / 1000.0)
        elif op == "freeze":
            self.froze_at = time.monotonic()
            self.proc.send_signal(signal.SIGSTOP)
            time.sleep(s["ms"] / 1000.0)
            self.proc.send_signal(signal.SIGCONT)
        elif op == "cut":
            self.proxy.cut.set()
        elif op == "drop":
            self.proxy.drop()
        elif op == "restart":
            self.proc.kill()
            self.proc.wait()
            self.start(self.addr)
        else:
            raise AssertionError("unknown op %s" % op)


def ms(v):
    return None if v is None else v / 1000.0


def status(st):
    if st is None:
        return {"free": True}
    return {"id": st.id, "token": st.token, "waiters": st.waiters, "session": st.session,
            "mode": st.mode, "holders": st.holders, "note": st.note}


class Conformance(unittest.TestCase):
    pass


def make(scenario):
    def test(self):
        lack = [n for n in scenario.get("needs", []) if n not in HAS]
        if lack:
            self.skipTest("this client has no %s" % ", ".join(lack))
        with tempfile.TemporaryDirectory() as tmp:
            world = World(scenario, tmp)
            try:
                for i, step in enumerate(scenario["steps"], 1):
                    try:
                        world.step(step)
                    except AssertionError as e:
                        raise AssertionError("step %d %s: %s" % (i, json.dumps(step), e)) from None
            finally:
                world.stop()
    if scenario["name"] in KNOWN:
        test = unittest.expectedFailure(test)
    return test


for _scenario in SCENARIOS["scenarios"]:
    setattr(Conformance, "test_" + _scenario["name"], make(_scenario))

if __name__ == "__main__":
    unittest.main()
