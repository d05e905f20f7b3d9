"""Tests of lockd_client's LOCK of a set of names (``also=``), against a fake server on
127.0.0.1 that grants every LOCK with one token per name and keeps the lines it got: the
words sent (``and=<name>`` per further name, before the note) and the list of tokens read
back; and the ``and=`` fields of detail lines, read into ``also``. No lockd needed: ``python3 -m unittest test_lockd_client_sets``. (The set's grant
itself, by a real lockd, is ``SetTest`` in test_lockd_client.)
"""

import socket
import threading
import unittest

from lockd_client import Client, ProtocolError


class FakeServer:
    """OK PONG to PING; a LOCK gets ``OK`` and one token per name (``short``: one fewer)."""

    def __init__(self, short=False):
        self.lines = []
        self.short = short
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.addr = "127.0.0.1:%d" % self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                text = line.decode().rstrip("\n")
                self.lines.append(text)
                if text.startswith("LOCK "):
                    names = 1 + sum(1 for w in text.split(" note=")[0].split()
                                    if w.startswith("and="))
                    tokens = [str(40 + i) for i in range(names - (1 if self.short else 0))]
                    conn.sendall(("OK %s\n" % " ".join(tokens)).encode())
                else:
                    conn.sendall(b"OK PONG\n")

    def close(self):
        self.sock.close()


class Sets(unittest.TestCase):
    def test_a_set_sends_and_words_and_returns_a_token_per_name(self):
        fake = FakeServer()
        c = Client(fake.addr, id="ci-7", timeout=5)
        tokens = c.lock("db-migrate", ttl=600, also=["cache-flush"], note="two names")
        self.assertEqual(tokens, [40, 41])
        line = [l for l in fake.lines if l.startswith("LOCK ")][-1]
        self.assertTrue(line.startswith("LOCK db-migrate ci-7 ttl="), line)
        self.assertIn(" and=cache-flush note=two names", line)
        # One name: the token alone, as before.
        self.assertEqual(c.lock("db-migrate"), 40)
        c.close()
        fake.close()

    def test_detail_lines_name_a_sets_other_names_in_also(self):
        import lockd_client
        h = lockd_client._parse_holder(
            "HOLDER db-migrate id=ci-7 token=40 held_ms=5 ttl_ms=9 session=0 mode=exclusive"
            " granted=1700000000000 and=cache-flush and=queue note=two%20names")
        self.assertEqual((h.also, h.note), (["cache-flush", "queue"], "two names"))
        w = lockd_client._parse_waiter(
            "WAITER cache-flush 1 id=ci-8 waited_ms=3 session=0 mode=shared and=db-migrate")
        self.assertEqual((w.also, w.mode), (["db-migrate"], "shared"))
        # A line of one name has none.
        self.assertEqual(lockd_client._parse_waiter(
            "WAITER a 1 id=x waited_ms=3 session=0 mode=exclusive").also, [])

    def test_a_reply_without_a_token_per_name_is_a_protocol_error(self):
        fake = FakeServer(short=True)
        c = Client(fake.addr, id="ci-7", timeout=5)
        with self.assertRaises(ProtocolError):
            c.lock("a", also=["b", "c"])
        c.close()
        fake.close()


if __name__ == "__main__":
    unittest.main()
