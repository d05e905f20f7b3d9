"""Tests of lockd_client's login against a real lockd started with --auth-file (skipped unless
$LOCKD_TEST_SECRET is set).

    LOCKD_ADDR=127.0.0.1:5001 LOCKD_TEST_SECRET=<secret of ci> \
        python3 -m unittest -v test_lockd_client_auth

The auth file must have ``user ci <hash> lock=ci-* read=*``: ci may take and read the names
that start with ``ci-``, and no other. $LOCKD_USER and the other login variables are cleared
for each test, so only what a test gives counts.
"""

import os
import tempfile
import time
import unittest
import uuid

from lockd_client import Client, Denied, NoAuth, lock

ADDR = os.environ.get("LOCKD_ADDR")
SECRET = os.environ.get("LOCKD_TEST_SECRET")
WRONG = "not-the-secret-0123456789abcdef"
#: Far longer than a refused login may take: a refusal that is retried would take longer.
FAST = 10.0
LOGIN_VARIABLES = ("LOCKD_USER", "LOCKD_SECRET", "LOCKD_SECRET_FILE")


def fresh(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:12])


@unittest.skipUnless(ADDR and SECRET, "needs a lockd with an auth file at $LOCKD_ADDR")
class LoginTest(unittest.TestCase):
    def setUp(self):
        saved = {k: os.environ.pop(k) for k in LOGIN_VARIABLES if k in os.environ}
        self.addCleanup(os.environ.update, saved)
        for k in LOGIN_VARIABLES:
            self.addCleanup(os.environ.pop, k, None)

    def secret_file(self, text):
        f = tempfile.NamedTemporaryFile("w", suffix=".secret", delete=False)
        self.addCleanup(os.unlink, f.name)
        with f:
            f.write(text)
        return f.name

    def assert_round_trip(self, client):
        name = fresh("ci")
        token = client.lock(name, ttl=30)
        self.assertEqual(client.status(name).token, token)
        client.unlock(name, token)
        self.assertIsNone(client.status(name))

    def test_user_and_secret_arguments(self):
        with Client(ADDR, user="ci", secret=SECRET) as c:
            self.assert_round_trip(c)

    def test_secret_file_first_line_without_its_line_ending(self):
        path = self.secret_file(SECRET + "\r\nsecond line is ignored\n")
        with Client(ADDR, user="ci", secret_file=path) as c:
            self.assert_round_trip(c)

    def test_the_variables_lockctl_reads(self):
        os.environ["LOCKD_USER"] = "ci"
        os.environ["LOCKD_SECRET"] = SECRET
        with Client(ADDR) as c:
            self.assert_round_trip(c)
        del os.environ["LOCKD_SECRET"]
        os.environ["LOCKD_SECRET_FILE"] = self.secret_file(SECRET + "\n")
        with Client(ADDR) as c:
            self.assert_round_trip(c)
        with lock(fresh("ci"), server=ADDR, ttl=30) as token:
            self.assertGreater(token, 0)

    def test_every_new_connection_logs_in_again(self):
        with Client(ADDR, user="ci", secret=SECRET) as c:
            self.assertTrue(c.ping())
            for _ in range(3):
                c.close()  # the next request connects anew, and must AUTH first
                self.assert_round_trip(c)

    def test_a_wrong_secret_is_denied_at_once_and_never_shown(self):
        started = time.monotonic()
        with Client(ADDR, user="ci", secret=WRONG) as c:
            with self.assertRaises(Denied) as caught:
                c.status()
        self.assertLess(time.monotonic() - started, FAST)
        e = caught.exception
        self.assertEqual(e.exit_code, 2)
        self.assertIn("ci", str(e))
        self.assertNotIn(WRONG, str(e))
        self.assertNotIn(WRONG, repr(e))

    def test_no_user_on_a_server_that_needs_one_is_noauth(self):
        with Client(ADDR) as c:
            with self.assertRaises(NoAuth) as caught:
                c.status()
        self.assertEqual(caught.exception.exit_code, 2)

    def test_a_name_outside_the_rights_is_denied(self):
        with Client(ADDR, user="ci", secret=SECRET) as c:
            with self.assertRaises(Denied) as caught:
                c.lock(fresh("deploy"), ttl=30)
            self.assertEqual(caught.exception.exit_code, 2)
            self.assertTrue(c.ping())  # the refusal left the connection usable

    def test_half_given_or_doubly_given_credentials_are_usage_errors(self):
        for kwargs in ({"user": "ci"}, {"secret": SECRET},
                       {"user": "ci", "secret": SECRET, "secret_file": "/nonexistent"},
                       {"user": "ci", "secret": "two words"},
                       {"user": "ci", "secret_file": "/nonexistent/secret"}):
            with self.assertRaises(ValueError, msg=kwargs) as caught:
                Client(ADDR, **kwargs)
            self.assertNotIn(SECRET, str(caught.exception))


if __name__ == "__main__":
    unittest.main()
