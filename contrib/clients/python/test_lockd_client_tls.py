"""Tests of lockd_client's TLS against a real lockd that requires client certificates.

The Rust test suite (tests/it/contrib/python.rs) makes the certificates, starts the servers and
sets the variables; by hand, with a lockd started with --tls-cert, --tls-key and
--tls-client-ca, and a plain one:

    LOCKD_ADDR=127.0.0.1:5001 LOCKD_TLS_CA=ca.pem LOCKD_CLIENT_CERT=me.pem \\
    LOCKD_CLIENT_KEY=me.key LOCKD_TEST_OTHER_CA=other-ca.pem \\
    LOCKD_TEST_STRANGER_CERT=stranger.pem LOCKD_TEST_STRANGER_KEY=stranger.key \\
    LOCKD_TEST_PLAIN_ADDR=127.0.0.1:5002 python3 -m unittest -v test_lockd_client_tls

Every test is skipped without them, but for the offline ones.
"""

import os
import ssl
import time
import unittest
import uuid
from unittest import mock

import lockd_client
from lockd_client import Client, ConnectionLost, TlsError, lock

ENV = os.environ
ADDR = ENV.get("LOCKD_ADDR")
CA = ENV.get("LOCKD_TLS_CA")
CERT, KEY = ENV.get("LOCKD_CLIENT_CERT"), ENV.get("LOCKD_CLIENT_KEY")
OTHER_CA = ENV.get("LOCKD_TEST_OTHER_CA")
STRANGER = (ENV.get("LOCKD_TEST_STRANGER_CERT"), ENV.get("LOCKD_TEST_STRANGER_KEY"))
PLAIN_ADDR = ENV.get("LOCKD_TEST_PLAIN_ADDR")
#: Far longer than any failure here may take: a TLS failure is said at once, not timed out.
PATIENT = 30.0
#: The TLS settings of this suite's variables, removed: what each test gives is all there is.
NO_TLS_ENV = {k: "" for k in ("LOCKD_TLS", "LOCKD_TLS_CA", "LOCKD_CLIENT_CERT",
                              "LOCKD_CLIENT_KEY")}


def fresh(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:12])


@unittest.skipUnless(ADDR and CA and CERT and KEY and OTHER_CA and all(STRANGER) and PLAIN_ADDR,
                     "needs a lockd with mutual TLS (see the module's doc)")
class TlsTest(unittest.TestCase):

    def setUp(self):
        patch = mock.patch.dict(os.environ, NO_TLS_ENV)
        patch.start()
        self.addCleanup(patch.stop)

    def client(self, **tls):
        return Client(ADDR, id=fresh("tls"), timeout=PATIENT, **tls)

    def assert_refused(self, cause, server=ADDR, **tls):
        """Connecting with ``tls`` raises TlsError (exit code 3) naming ``cause``, at once."""
        started = time.monotonic()
        with self.assertRaises(TlsError) as caught:
            Client(server, id=fresh("tls"), timeout=PATIENT, **tls).ping()
        self.assertLess(time.monotonic() - started, PATIENT / 2, "waited for a timeout")
        self.assertIn(cause, str(caught.exception))
        self.assertEqual(caught.exception.exit_code, lockd_client.EXIT_UNREACHABLE)
        self.assertIsInstance(caught.exception, ConnectionLost)
        return str(caught.exception)

    def test_lock_status_and_unlock_with_a_client_certificate(self):
        name = fresh("tls-lock")
        with self.client(ca=CA, cert=CERT, key=KEY) as c:
            token = c.lock(name, ttl=60)
            self.assertEqual(c.status(name).token, token)
            c.unlock(name, token)
            self.assertIsNone(c.status(name))

    def test_a_lease_holds_over_tls_and_releases(self):
        name = fresh("tls-lease")
        with self.client(ca=CA, cert=CERT, key=KEY) as watcher:
            with lock(name, server=ADDR, ttl=30, ca=CA, cert=CERT, key=KEY) as token:
                self.assertEqual(watcher.status(name).token, token)
            self.assertIsNone(watcher.status(name))

    def test_an_ssl_context_of_ones_own(self):
        context = ssl.create_default_context(cafile=CA)
        context.load_cert_chain(CERT, KEY)
        with self.client(tls=context) as c:
            self.assertTrue(c.ping())

    def test_the_variables_lockctl_reads(self):
        with mock.patch.dict(os.environ, {"LOCKD_TLS_CA": CA, "LOCKD_CLIENT_CERT": CERT,
                                          "LOCKD_CLIENT_KEY": KEY}):
            with self.client() as c:
                self.assertTrue(c.ping())
            # tls=False means plain TCP, whatever the variables say.
            self.assertIsNone(Client(ADDR, tls=False)._tls)

    def test_a_server_certificate_from_another_ca_is_not_trusted(self):
        text = self.assert_refused("is not trusted", ca=OTHER_CA, cert=CERT, key=KEY)
        self.assertIn(ADDR, text)

    def test_a_missing_client_certificate_is_named(self):
        self.assert_refused("requires a client certificate", ca=CA)

    def test_a_client_certificate_from_another_ca_is_refused(self):
        text = self.assert_refused("refused the client certificate", ca=CA, cert=STRANGER[0],
                                   key=STRANGER[1])
        self.assertIn("not signed by a CA lockd trusts", text)

    def test_a_plain_port_is_named(self):
        self.assert_refused("plain TCP", server=PLAIN_ADDR, ca=CA)


class TlsOfflineTest(unittest.TestCase):
    """Arguments, without a server."""

    def setUp(self):
        patch = mock.patch.dict(os.environ, NO_TLS_ENV)
        patch.start()
        self.addCleanup(patch.stop)

    def test_plain_unless_asked(self):
        self.assertIsNone(Client("127.0.0.1:1")._tls)

    def test_the_server_certificate_and_name_are_checked(self):
        context = Client("127.0.0.1:1", tls=True)._tls
        self.assertTrue(context.check_hostname)
        self.assertEqual(context.verify_mode, ssl.CERT_REQUIRED)

    def test_bad_arguments(self):
        context = ssl.create_default_context()
        with self.assertRaises(ValueError):
            Client("127.0.0.1:1", tls=context, ca="ca.pem")
        with self.assertRaises(ValueError):
            Client("127.0.0.1:1", tls=False, ca="ca.pem")
        with self.assertRaises(ValueError):
            Client("127.0.0.1:1", tls=True, key="me.key")
        with self.assertRaises(TypeError):
            Client("127.0.0.1:1", tls="yes")
        with self.assertRaises(ValueError) as caught:
            Client("127.0.0.1:1", ca="no-such-ca.pem")
        self.assertIn("no-such-ca.pem", str(caught.exception))
        with mock.patch.dict(os.environ, {"LOCKD_TLS": "maybe"}):
            with self.assertRaises(ValueError):
                Client("127.0.0.1:1")
        with mock.patch.dict(os.environ, {"LOCKD_TLS": "off"}):
            self.assertIsNone(Client("127.0.0.1:1")._tls)


if __name__ == "__main__":
    unittest.main()
