"""Tests of lockd_client's answer to ``ERR UNAVAILABLE`` (a cluster front-end cut off from
etcd), against fake front-ends on 127.0.0.1 that answer every request so: the LOCK is sent
again, through the next address, for the rest of its wait, and then raised as
:class:`Unavailable` (exit code 5). No lockd needed: ``python3 -m unittest
test_lockd_client_unavailable``.
"""

import socket
import threading
import time
import unittest

from lockd_client import EXIT_UNAVAILABLE, Client, Unavailable


class FakeFrontEnd:
    """OK PONG to PING, ERR UNAVAILABLE to every other line; counts the LOCKs it got."""

    def __init__(self):
        self.locks = 0
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
                if line.startswith(b"LOCK "):
                    self.locks += 1
                conn.sendall(b"OK PONG\n" if line.strip() == b"PING"
                             else b"ERR UNAVAILABLE etcd has no leader; try again\n")

    def close(self):
        self.sock.close()


class Unavailability(unittest.TestCase):
    def setUp(self):
        self.fakes = [FakeFrontEnd(), FakeFrontEnd()]

    def tearDown(self):
        for fake in self.fakes:
            fake.close()

    def test_without_a_wait_each_address_is_tried_once(self):
        c = Client(",".join(f.addr for f in self.fakes), id="a", timeout=5)
        with self.assertRaises(Unavailable) as raised:
            c.lock("x", wait=0)
        self.assertEqual(raised.exception.code, "UNAVAILABLE")
        self.assertEqual(raised.exception.exit_code, EXIT_UNAVAILABLE)
        self.assertEqual([f.locks for f in self.fakes], [1, 1])
        c.close()

    def test_the_lock_is_sent_again_for_its_whole_wait_and_no_longer(self):
        c = Client(self.fakes[0].addr, id="a", timeout=5)
        started = time.monotonic()
        with self.assertRaises(Unavailable):
            c.lock("x", wait=0.8)
        took = time.monotonic() - started
        self.assertGreaterEqual(took, 0.75)
        self.assertLess(took, 5.0)  # generous: only that it gives up
        self.assertGreater(self.fakes[0].locks, 2)
        c.close()


if __name__ == "__main__":
    unittest.main()
