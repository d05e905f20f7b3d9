"""Tests of lockd_client against a real lockd at $LOCKD_ADDR (skipped when it is not set).

    LOCKD_ADDR=127.0.0.1:5001 python3 -m unittest -v test_lockd_client

Every test uses lock names of its own, so a shared server and reruns do not disturb them, and
leaves nothing behind: whatever is still held under its names when it ends is released (and
the test fails, since it should have released it itself). Waits are bounded by generous
deadlines that only guard against hanging; no test depends on how fast anything happens.
"""

import os
import threading
import time
import unittest
import uuid

import lockd_client
from lockd_client import (BadArg, Client, Conflict, ConnectionLost, Holder, LeaseLost,
                          LockdError, LockDetail, LockStatus, NotHeld, ProtocolError,
                          ServerError, Timeout, Waiter, lock)

ADDR = os.environ.get("LOCKD_ADDR")
GUARD = 20.0  # seconds: only a failure guard


def fresh(prefix):
    return "%s-%s" % (prefix, uuid.uuid4().hex[:12])


def dead_addr():
    """A loopback address where nothing listens: a port bound a moment ago and let go."""
    import socket as _socket
    with _socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return "127.0.0.1:%d" % s.getsockname()[1]


def eventually(predicate, what):
    deadline = time.monotonic() + GUARD
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("not within %ss: %s" % (GUARD, what))


class ServerTest(unittest.TestCase):
    """A test against the server: its lock names come from ``self.name()``, and any of them
    still held when the test ends is released, and fails the test."""

    def setUp(self):
        self._names = []
        self.addCleanup(self._release_leftovers)

    def name(self, prefix):
        name = fresh(prefix)
        self._names.append(name)
        return name

    def _release_leftovers(self):
        left = []
        with Client(ADDR, id=fresh("janitor")) as janitor:
            for name in self._names:
                held = janitor.detail(name)
                if held is None:
                    continue
                left.append(name)
                for holder in held.holders:  # every one of a shared lock or a semaphore
                    try:
                        janitor.unlock(name, holder.token)
                    except NotHeld:
                        pass
        self.assertEqual(left, [], "the test left these locks held")

    def lock_in_background(self, client, name, **options):
        """``client.lock(name, **options)`` in a thread; the list gets the token."""
        got = []
        waiter = threading.Thread(target=lambda: got.append(client.lock(name, **options)))
        waiter.start()
        self.addCleanup(waiter.join, GUARD)
        return waiter, got

    def waiting(self, client, name, count):
        """Waits until ``count`` wait for ``name``."""
        eventually(lambda: getattr(client.status(name), "waiters", 0) == count,
                   "%d wait for %s" % (count, name))


@unittest.skipUnless(ADDR, "set LOCKD_ADDR to a running lockd")
class ClientTest(ServerTest):
    def setUp(self):
        super().setUp()
        self.a = Client(ADDR, id=fresh("alice"))
        self.b = Client(ADDR, id=fresh("bob"))
        self.addCleanup(self.a.close)
        self.addCleanup(self.b.close)

    def test_ping(self):
        self.assertTrue(self.a.ping())

    def test_lock_unlock_and_tokens_grow(self):
        name = self.name("basic")
        t1 = self.a.lock(name, ttl=30)
        self.a.unlock(name, t1)
        t2 = self.b.lock(name, ttl="30s")
        self.assertGreater(t2, t1)
        self.b.unlock(name, t2)

    def test_try_lock_conflict_raises_timeout_with_code(self):
        name = self.name("try")
        token = self.a.lock(name, ttl=30)
        with self.assertRaises(Timeout) as cm:
            self.b.lock(name, wait=0)
        self.assertEqual(cm.exception.code, "TIMEOUT")
        self.assertIsNone(self.b.try_lock(name))
        self.a.unlock(name, token)
        token = self.b.try_lock(name)
        self.assertIsNotNone(token)
        self.b.unlock(name, token)

    def test_same_id_again_gets_same_token(self):
        name = self.name("again")
        t1 = self.a.lock(name)
        self.assertEqual(self.a.lock(name), t1)
        self.a.unlock(name, t1)

    def test_unlock_with_a_stale_token_raises_notheld(self):
        name = self.name("stale")
        token = self.a.lock(name)
        self.a.unlock(name, token)
        with self.assertRaises(NotHeld) as cm:
            self.a.unlock(name, token)
        self.assertEqual(cm.exception.code, "NOTHELD")
        with self.assertRaises(NotHeld):
            self.a.renew(name, token)
        with self.assertRaises(NotHeld):
            self.a.check(name, token)

    def test_renew_and_check_report_ttl(self):
        name = self.name("renew")
        token = self.a.lock(name, ttl=5)
        self.assertEqual(self.a.renew(name, token, ttl=60), 60000)
        left = self.a.check(name, token)
        self.assertGreater(left, 5000)
        self.assertLessEqual(left, 60000)
        self.a.unlock(name, token)

    def test_bad_arguments(self):
        name = self.name("bad")
        with self.assertRaises(BadArg) as cm:
            self.a.lock(name, ttl=0)
        self.assertEqual(cm.exception.code, "BADARG")
        with self.assertRaises(ValueError):
            self.a.lock("two words")
        with self.assertRaises(ValueError):
            self.a.lock("line\nbreak")
        # The connection is still usable after a refusal.
        self.assertTrue(self.a.ping())

    def test_status_one_and_all(self):
        name = self.name("status")
        self.assertIsNone(self.a.status(name))
        token = self.a.lock(name, ttl=30)
        st = self.a.status(name)
        self.assertIsInstance(st, LockStatus)
        self.assertEqual((st.name, st.id, st.token, st.session, st.waiters),
                         (name, self.a.id, token, False, 0))
        # ttl_ms counts down between the two STATUS calls: compare the rest.
        listed = [s for s in self.b.status() if s.name == name]
        self.assertEqual([(s.id, s.token, s.session) for s in listed],
                         [(self.a.id, token, False)])
        self.a.unlock(name, token)
        self.assertIsNone(self.a.status(name))

    def test_a_note_round_trips_and_a_refusal_names_the_holder(self):
        name = self.name("note")
        note = "release 1.4.2 by ci job 8812: 100% \u2603"
        token = self.a.lock(name, ttl=30, note=note)
        self.assertEqual(self.a.status(name).note, note)
        self.assertEqual([s.note for s in self.b.status() if s.name == name], [note])
        detail = self.b.detail(name)
        self.assertEqual((detail.status.note, detail.holders[0].note), (note, note))
        with self.assertRaises(Timeout) as cm:
            self.b.lock(name, wait=0)
        self.assertIn("held by %s " % self.a.id, cm.exception.message)
        self.assertIn("note=release%201.4.2", cm.exception.message)
        with self.assertRaises(ValueError):
            self.b.lock(name, note="tab\tinside")
        # A retry without a note keeps it.
        self.assertEqual(self.a.lock(name, ttl=30), token)
        self.assertEqual(self.a.status(name).note, note)
        self.a.unlock(name, token)
        token = self.a.lock(name)
        self.assertIsNone(self.a.status(name).note)
        self.a.unlock(name, token)

    def test_waiter_is_granted_when_the_holder_unlocks(self):
        name = self.name("fifo")
        token = self.a.lock(name)
        waiter, got = self.lock_in_background(self.b, name, wait=GUARD)
        self.waiting(self.a, name, 1)
        self.a.unlock(name, token)
        waiter.join(GUARD)
        self.assertEqual(len(got), 1)
        self.assertGreater(got[0], token)
        self.b.unlock(name, got[0])

    def test_a_session_lease_with_grace_outlives_its_connection_when_renewed(self):
        name = self.name("grace")
        token = self.a.lock(name, ttl=60, session=30)
        self.assertTrue(self.b.status(name).session)
        self.a.close()
        # Within the grace, the holder comes back on another connection and renews.
        self.assertGreater(self.b.renew(name, token), 0)
        self.assertEqual(self.b.status(name).token, token)
        self.b.unlock(name, token)

    def test_a_plain_lock_is_not_a_session_lease(self):
        name = self.name("plain")
        token = self.a.lock(name, ttl=60)
        self.assertFalse(self.b.status(name).session)
        self.a.close()
        self.assertGreater(self.b.check(name, token), 0)
        self.b.unlock(name, token)

    def test_session_lease_ends_with_the_connection(self):
        name = self.name("session")
        self.a.lock(name, session=True)
        self.a.close()
        eventually(lambda: self.b.status(name) is None, "the session lease is dropped")

    def test_a_semaphore_of_two_grants_two_at_once_and_queues_a_third(self):
        name = self.name("sem")
        t1 = self.a.lock(name, ttl=30, limit=2)
        t2 = self.b.lock(name, ttl=30, limit=2)
        st = self.a.status(name)
        self.assertEqual((st.token, st.holders, st.mode), (t1, 2, "limit:2"))
        c = Client(ADDR, id=fresh("carol"))
        self.addCleanup(c.close)
        self.assertIsNone(c.try_lock(name, limit=2))
        waiter, got = self.lock_in_background(c, name, ttl=30, wait=GUARD, limit=2)
        self.waiting(self.a, name, 1)
        self.a.unlock(name, t1)
        waiter.join(GUARD)
        self.assertEqual(len(got), 1)
        self.assertEqual([h.token for h in self.a.detail(name).holders], [t2, got[0]])
        self.b.unlock(name, t2)
        c.unlock(name, got[0])

    def test_shared_holders_hold_together_while_an_exclusive_one_waits(self):
        name = self.name("rw")
        t1 = self.a.lock(name, ttl=30, shared=True)
        t2 = self.b.lock(name, ttl=30, shared=True)
        writer = Client(ADDR, id=fresh("writer"))
        self.addCleanup(writer.close)
        waiter, got = self.lock_in_background(writer, name, ttl=30, wait=GUARD)
        self.waiting(self.a, name, 1)
        # Strict FIFO: a shared LOCK does not overtake the waiting exclusive one.
        reader = Client(ADDR, id=fresh("reader"))
        self.addCleanup(reader.close)
        self.assertIsNone(reader.try_lock(name, shared=True))
        self.a.unlock(name, t1)
        self.assertEqual(self.a.status(name).waiters, 1)
        self.b.unlock(name, t2)
        waiter.join(GUARD)
        self.assertEqual(len(got), 1)
        st = self.a.status(name)
        self.assertEqual((st.id, st.token, st.holders, st.mode), (writer.id, got[0], 1,
                                                                  "exclusive"))
        writer.unlock(name, got[0])

    def test_detail_shows_every_holder_and_waiter_with_its_mode(self):
        name = self.name("detail")
        self.assertIsNone(self.a.detail(name))
        t1 = self.a.lock(name, ttl=30, shared=True)
        t2 = self.b.lock(name, ttl=30, shared=True, session=True)
        writer = Client(ADDR, id=fresh("writer"))
        self.addCleanup(writer.close)
        waiter, got = self.lock_in_background(writer, name, ttl=30, wait=GUARD)
        self.waiting(self.a, name, 1)
        d = self.a.detail(name)
        self.assertIsInstance(d, LockDetail)
        self.assertEqual(d.status, LockStatus(name, self.a.id, t1, d.status.ttl_ms, False, 1, 2,
                                              "shared"))
        self.assertEqual([(h.id, h.token, h.session, h.mode) for h in d.holders],
                         [(self.a.id, t1, False, "shared"), (self.b.id, t2, True, "shared")])
        self.assertTrue(all(isinstance(h, Holder) for h in d.holders))
        self.assertEqual(len(d.waiters), 1)
        w = d.waiters[0]
        self.assertIsInstance(w, Waiter)
        self.assertEqual((w.name, w.position, w.id, w.session, w.mode),
                         (name, 1, writer.id, False, "exclusive"))
        self.a.unlock(name, t1)
        self.b.unlock(name, t2)
        waiter.join(GUARD)
        d = self.a.detail(name)
        self.assertEqual([(h.token, h.mode) for h in d.holders], [(got[0], "exclusive")])
        self.assertEqual((d.status.holders, d.status.mode, d.waiters), (1, "exclusive", []))
        writer.unlock(name, got[0])

    def test_a_lock_that_does_not_fit_the_name_raises_conflict_exit_code_2(self):
        name = self.name("conflict")
        token = self.a.lock(name, ttl=30, limit=2)
        for options in [{"shared": True}, {}, {"limit": 3}]:
            with self.assertRaises(Conflict, msg=options) as cm:
                self.b.lock(name, wait=GUARD, **options)
            self.assertEqual((cm.exception.code, cm.exception.exit_code), ("CONFLICT", 2))
        # The same id in another mode: no upgrade or downgrade.
        with self.assertRaises(Conflict):
            self.a.lock(name, shared=True)
        with self.assertRaises(Conflict):
            with lock(name, server=ADDR, shared=True):
                self.fail("the body must not run")
        with self.assertRaises(BadArg):
            self.b.lock(name, limit=0)
        self.assertEqual(self.a.status(name).holders, 1)
        self.a.unlock(name, token)

    def test_unreachable_server_raises_connection_lost(self):
        with Client("127.0.0.1:1", timeout=2) as c:
            with self.assertRaises(ConnectionLost):
                c.ping()

    def test_bad_server_address(self):
        with self.assertRaises(ValueError):
            Client("no-port-here")

    def test_a_dead_first_address_is_passed_over_for_the_next(self):
        dead = dead_addr()
        with Client("%s,%s" % (dead, ADDR), id=fresh("failover")) as c:
            self.assertTrue(c.ping())
            self.assertNotEqual(c.address, dead)
            name = self.name("failover")
            token = c.lock(name, ttl=30)
            c.unlock(name, token)

    def test_every_address_dead_raises_connection_lost_naming_each(self):
        dead = [dead_addr(), dead_addr()]
        with Client(dead, timeout=2) as c:
            with self.assertRaises(ConnectionLost) as caught:
                c.ping()
        for addr in dead:
            self.assertIn(addr, str(caught.exception))
        self.assertEqual(caught.exception.exit_code, 3)


@unittest.skipUnless(ADDR, "set LOCKD_ADDR to a running lockd")
class LeaseTest(ServerTest):
    def setUp(self):
        super().setUp()
        self.other = Client(ADDR, id=fresh("other"))
        self.addCleanup(self.other.close)

    def test_with_lock_holds_releases_and_yields_the_token(self):
        name = self.name("with")
        with lock(name, server=ADDR, ttl=30) as token:
            st = self.other.status(name)
            self.assertEqual(st.token, token)
            self.assertIsNone(self.other.try_lock(name))
        self.assertIsNone(self.other.status(name))

    def test_a_lease_is_a_session_lease_with_grace_unless_asked_not_to(self):
        name = self.name("kind")
        with lock(name, server=ADDR, ttl=30):
            self.assertTrue(self.other.status(name).session)
        with lock(name, server=ADDR, ttl=30, session=False):
            self.assertFalse(self.other.status(name).session)
        self.assertIsNone(self.other.status(name))

    def test_lease_outlives_its_ttl_by_renewal(self):
        name = self.name("renewed")
        lease = lock(name, server=ADDR, ttl=1)
        with lease as token:
            # Stay well past the 1 s ttl: only renewals keep the lock.
            time.sleep(2.5)
            self.other.check(name, token)
            lease.check()
            self.assertFalse(lease.lost)
        self.assertIsNone(self.other.status(name))

    def test_lost_lease_is_seen_by_check_and_raised_at_exit(self):
        name = self.name("lost")
        called = threading.Event()
        lease = lock(name, server=ADDR, ttl=1, on_lost=lambda _lease: called.set())
        with self.assertRaises(LeaseLost) as cm:
            with lease as token:
                # Another process takes the lease away (as an expiry would).
                self.other.unlock(name, token)
                eventually(lambda: lease.lost, "the renewal thread notices")
                with self.assertRaises(LeaseLost):
                    lease.check()
        self.assertTrue(called.is_set())
        self.assertEqual(cm.exception.token, token)
        self.assertIn("NOTHELD", cm.exception.reason)

    def test_body_exception_is_not_masked(self):
        name = self.name("body")
        with self.assertRaises(KeyError):
            with lock(name, server=ADDR, ttl=30):
                raise KeyError("from the body")
        self.assertIsNone(self.other.status(name))

    def test_wait_zero_on_a_held_lock_raises_timeout(self):
        name = self.name("busy")
        token = self.other.lock(name, ttl=30)
        with self.assertRaises(lockd_client.Timeout):
            with lock(name, server=ADDR, wait=0):
                self.fail("the body must not run")
        self.other.unlock(name, token)

    def test_leases_of_a_semaphore_and_shared_leases_hold_together(self):
        name = self.name("lease-sem")
        with lock(name, server=ADDR, ttl=30, limit=2, id=fresh("one")) as t1:
            with lock(name, server=ADDR, ttl=30, limit=2, id=fresh("two")) as t2:
                self.assertEqual([h.token for h in self.other.detail(name).holders], [t1, t2])
                with self.assertRaises(Timeout):
                    with lock(name, server=ADDR, limit=2, wait=0, id=fresh("three")):
                        self.fail("a third slot of two")
        name = self.name("lease-rw")
        with lock(name, server=ADDR, ttl=30, shared=True, id=fresh("one")):
            with lock(name, server=ADDR, ttl=30, shared=True, id=fresh("two")):
                self.assertEqual(self.other.status(name).mode, "shared")
                self.assertIsNone(self.other.try_lock(name))
        self.assertIsNone(self.other.status(name))

    def test_two_leases_exclude_each_other(self):
        name = self.name("exclusive")
        inside = []
        overlaps = []

        def worker():
            for _ in range(5):
                with lock(name, server=ADDR, ttl=5, wait=GUARD, id=fresh("w")):
                    inside.append(1)
                    if len(inside) > 1:
                        overlaps.append(1)
                    time.sleep(0.01)
                    inside.pop()

        threads = [threading.Thread(target=worker) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(GUARD * 2)
        self.assertFalse(any(t.is_alive() for t in threads))
        self.assertEqual(overlaps, [])

    def test_two_holders_in_one_process_without_ids_queue_and_never_share_a_grant(self):
        # Two clients, no id given: each LOCK is a holder of its own.
        name = self.name("py-held")
        c1, c2 = Client(ADDR), Client(ADDR)
        self.addCleanup(c1.close)
        self.addCleanup(c2.close)
        t1 = c1.lock(name, ttl=10)
        with self.assertRaises(Timeout):
            c2.lock(name, ttl=10, wait=0)
        with self.assertRaises(Timeout):
            c1.lock(name, ttl=10, wait=0)
        c1.unlock(name, t1)
        # Two threads, each in ``with lock()``: the second waits its turn, no CONFLICT.
        name = self.name("py-thr")
        inside, overlaps, tokens, errors = [], [], [], []

        def worker():
            try:
                with lock(name, server=ADDR, ttl=10, wait=GUARD, note="worker") as token:
                    tokens.append(token)
                    inside.append(1)
                    if len(inside) > 1:
                        overlaps.append(1)
                    self.assertEqual(self.other.status(name).note, "worker")
                    time.sleep(0.05)
                    inside.pop()
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=worker) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(GUARD * 2)
        self.assertEqual(errors, [])
        self.assertEqual(overlaps, [])
        self.assertEqual(len(set(tokens)), 2, tokens)

    def test_the_token_of_a_with_tells_its_body_of_the_loss(self):
        # The body has only ``token``: it waits on token.lost_event as a worker would between
        # steps, while another connection takes the lease away (UNLOCK of its token), and the
        # helper's next renewal (NOTHELD) signals it; on_lost is called once, with the Lease.
        name = self.name("py-lost")
        calls = []
        with self.assertRaises(LeaseLost):
            with lock(name, server=ADDR, ttl=1, on_lost=calls.append) as token:
                self.assertIsInstance(token, int)
                self.assertEqual(self.other.status(name).token, token)
                self.assertFalse(token.lost)
                token.check()
                self.other.unlock(name, token)
                self.assertTrue(token.lost_event.wait(GUARD), "the loss was never signalled")
                self.assertTrue(token.lost)
                with self.assertRaises(LeaseLost):
                    token.check()
        self.assertEqual(calls, [token.lease])
        self.assertEqual(calls[0].lost_event, token.lost_event)

    def test_the_tokens_of_a_set_tell_of_a_break(self):
        name, other = self.name("py-lost-set"), self.name("py-lost-set")
        with self.assertRaises(LeaseLost):
            with lock(name, server=ADDR, ttl=1, also=[other]) as tokens:
                self.assertEqual(len(tokens), 2)
                self.other.break_lock(name, tokens[0], force=True)
                self.assertTrue(tokens.lost_event.wait(GUARD), "the loss was never signalled")
                self.assertTrue(tokens.lost)



@unittest.skipUnless(ADDR, "set LOCKD_ADDR to a running lockd")
class SetTest(ServerTest):
    """A LOCK of several names (``also=``) against the real server: one lease, a token per
    name (used as given for each name, whatever they are), ended whole through any name."""

    def setUp(self):
        super().setUp()
        self.a = Client(ADDR, id=fresh("alice"))
        self.b = Client(ADDR, id=fresh("bob"))
        self.addCleanup(self.a.close)
        self.addCleanup(self.b.close)

    def test_a_set_is_granted_whole_and_one_unlock_releases_every_name(self):
        first, second = self.name("set-db"), self.name("set-cache")
        tokens = self.a.lock(first, ttl=30, also=[second])
        self.assertEqual(len(tokens), 2)
        self.assertEqual(self.a.status(first).token, tokens[0])
        self.assertEqual(self.a.status(second).token, tokens[1])
        self.assertEqual([h.also for h in self.a.detail(first).holders], [[second]])
        self.assertEqual([h.also for h in self.a.detail(second).holders], [[first]])
        # One lease: a renewal or a check through either name, with its token.
        self.assertGreater(self.a.renew(second, tokens[1], ttl=60), 30000)
        self.assertGreater(self.a.check(first, tokens[0]), 30000)
        self.a.unlock(first, tokens[0])
        self.assertIsNone(self.a.status(first))
        self.assertIsNone(self.a.status(second))
        with self.assertRaises(NotHeld):
            self.a.check(second, tokens[1])

    def test_an_overlapping_set_that_does_not_wait_is_refused_and_takes_nothing(self):
        first, second, third = self.name("ov-a"), self.name("ov-b"), self.name("ov-c")
        tokens = self.a.lock(first, also=[second])
        with self.assertRaises(Timeout):
            self.b.lock(third, wait=0, also=[second])
        self.assertIsNone(self.a.status(third))
        self.a.unlock(second, tokens[1])
        got = self.b.lock(third, wait=0, also=[second])
        self.b.unlock(third, got[0])

    def test_a_set_waits_for_its_held_name_and_then_holds_both(self):
        first, second = self.name("wait-a"), self.name("wait-b")
        token = self.a.lock(second)
        waiter, got = self.lock_in_background(self.b, first, also=[second])
        self.waiting(self.a, second, 1)
        self.assertEqual(got, [])
        # The waiter's line names its set's other name; the holder's (one name) none.
        d = self.a.detail(second)
        self.assertEqual([(h.id, h.also) for h in d.holders], [(self.a.id, [])])
        self.assertEqual([(w.id, w.also) for w in d.waiters], [(self.b.id, [first])])
        self.a.unlock(second, token)
        waiter.join(GUARD)
        self.assertEqual(len(got), 1)
        tokens = got[0]
        self.assertEqual(self.a.status(first).token, tokens[0])
        self.assertEqual(self.a.status(second).token, tokens[1])
        self.b.unlock(second, tokens[1])
        self.assertIsNone(self.a.status(first))

    def test_a_lease_on_a_set_holds_every_name_and_releases_them_together(self):
        first, second = self.name("lease-a"), self.name("lease-b")
        with lock(first, server=ADDR, ttl=30, also=[second]) as tokens:
            self.assertEqual(len(tokens), 2)
            self.assertEqual(self.a.status(first).token, tokens[0])
            self.assertEqual(self.a.status(second).token, tokens[1])
        self.assertIsNone(self.a.status(first))
        self.assertIsNone(self.a.status(second))


class OfflineTest(unittest.TestCase):
    def test_after_a_failure_the_next_connection_goes_to_the_next_address(self):
        # Two stand-ins for front-ends of one cluster. The first answers one PING, then closes
        # the connection without a word (as a front-end that died would), and still accepts
        # new connections; the next request must go to the second, not back to the first.
        import socket as _socket
        servers = [_socket.socket(), _socket.socket()]
        accepted = [0, 0]
        for srv in servers:
            srv.bind(("127.0.0.1", 0))
            srv.listen(4)

        def serve(i):
            srv = servers[i]
            while True:
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                accepted[i] += 1
                f = conn.makefile("rb")
                while f.readline():
                    conn.sendall(b"OK PONG\n")
                    if i == 0:
                        break
                f.close()  # the connection closes only once its file is closed too
                conn.close()

        threads = [threading.Thread(target=serve, args=(i,), daemon=True) for i in (0, 1)]
        for t in threads:
            t.start()
        addrs = ["127.0.0.1:%d" % srv.getsockname()[1] for srv in servers]
        c = Client(",".join(addrs), tls=False, user=None)
        try:
            self.assertTrue(c.ping())
            self.assertEqual(c.address, addrs[0])
            eventually(lambda: c._stale() == "gone", "the first one closes")
            self.assertTrue(c.ping())
            self.assertEqual(c.address, addrs[1])
            self.assertTrue(c.ping())
            self.assertEqual(accepted, [1, 1])
        finally:
            c.close()
            for srv in servers:
                srv.close()

    def test_server_lists(self):
        self.assertEqual(Client("a:1,b:2", tls=False, user=None).server, "a:1,b:2")
        self.assertEqual(Client(["a:1", "[::1]:2"], tls=False, user=None).server, "a:1,[::1]:2")
        self.assertEqual(lockd_client._split_servers("a:1,[::1]:2"),
                         [("a:1", ("a", 1)), ("[::1]:2", ("::1", 2))])
        for bad in ["a:1,", ",a:1", "a:1,,b:2", "a:1, b:2", "a:1,b", ["a:1", ""]]:
            with self.assertRaises(ValueError, msg=repr(bad)):
                Client(bad, tls=False, user=None)

    def test_a_connection_closed_for_idleness_is_replaced_not_answered(self):
        # A stand-in for lockd with --idle-timeout: answers one PING, then says it closes the
        # idle connection, as lockd does; the next request must go on a new connection.
        import socket as _socket
        server = _socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(2)
        port = server.getsockname()[1]
        served = []

        def serve():
            for i in range(2):
                conn, _ = server.accept()
                f = conn.makefile("rb")
                f.readline()
                conn.sendall(b"OK PONG\n")
                served.append(i)
                if i == 0:
                    conn.sendall(b"ERR LIMIT idle for 10m; closing\n")
                    conn.shutdown(_socket.SHUT_WR)
                    time.sleep(0.2)
                conn.close()

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        c = Client("127.0.0.1:%d" % port, tls=False, user=None)
        try:
            self.assertTrue(c.ping())
            eventually(lambda: served == [0], "the first answer")
            time.sleep(0.05)
            self.assertTrue(c.ping())
        finally:
            c.close()
            server.close()
        t.join(5)
        self.assertEqual(served, [0, 1])


    """What needs no server."""

    def test_exit_codes_are_lockctls(self):
        codes = {
            Timeout: 1,
            BadArg: 2,
            ServerError: 2,
            lockd_client.Conflict: 2,
            lockd_client.Shutdown: 2,
            ProtocolError: 2,
            LockdError: 2,
            ConnectionLost: 3,
            NotHeld: 4,
            LeaseLost: 4,
        }
        for cls, code in codes.items():
            self.assertEqual(cls.exit_code, code, cls.__name__)
        self.assertEqual(NotHeld("NOTHELD", "gone").exit_code, 4)

    def test_durations_in_ms(self):
        for text, ms in [("250ms", 250), ("30s", 30000), ("5m", 300000), ("1h30m", 5400000),
                         ("1.5", 1500), ("30", 30000), ("5ms", 5), (2, 2000), (0.25, 250)]:
            self.assertEqual(lockd_client._ms(text), ms, text)
        for text in ["1x", "1 m", "", "m5", True, None]:
            self.assertIsNone(lockd_client._ms(text), text)

    def test_the_grace_is_capped_at_the_ttl(self):
        self.assertEqual(lockd_client.Lease("x", ttl=5, session=10).session, 5)
        self.assertEqual(lockd_client.Lease("x", ttl="2m", session="30s").session, "30s")
        self.assertEqual(lockd_client.Lease("x", ttl=30).session, lockd_client.DEFAULT_GRACE)
        self.assertIs(lockd_client.Lease("x", session=False).session, False)

    def test_mode_options(self):
        option = lockd_client._mode_option
        self.assertEqual(option(False, None), "")
        self.assertEqual(option(True, None), " shared")
        self.assertEqual(option(False, 3), " limit=3")
        with self.assertRaises(ValueError):
            option(True, 2)
        for bad in ["2", 2.0, True]:
            with self.assertRaises(TypeError):
                option(False, bad)
        with self.assertRaises(ValueError):
            lockd_client.Lease("x", shared=True, limit=2)

    def test_status_lines_with_and_without_mode(self):
        parse = lockd_client._parse_status
        self.assertEqual(parse("a held id=x token=5 ttl_ms=9 session=0 waiters=2".split()),
                         LockStatus("a", "x", 5, 9, False, 2, 1, "exclusive"))
        self.assertEqual(
            parse("a held id=x token=5 ttl_ms=9 session=1 waiters=0 holders=3 mode=limit:4"
                  .split()),
            LockStatus("a", "x", 5, 9, True, 0, 3, "limit:4"))
        with self.assertRaises(ProtocolError):
            parse("a held id=x token=five ttl_ms=9 session=0 waiters=0".split())
        self.assertEqual(
            lockd_client._parse_waiter("WAITER a 2 id=y waited_ms=7 session=1 mode=shared"),
            Waiter("a", 2, "y", 7, True, "shared"))
        with self.assertRaises(ProtocolError):
            lockd_client._parse_holder("HOLDER a id=y token=1 held_ms=1 ttl_ms=1 session=0")

    def test_lock_options(self):
        option = lockd_client._session_option
        self.assertEqual(option(False, True), " detach")
        self.assertEqual(option(False, False), "")
        self.assertEqual(option(True, True), " session")
        self.assertEqual(option(0, True), " session")
        self.assertEqual(option(2.5, True), " session=2500ms")
        self.assertEqual(option("10s", True), " session=10s")


if __name__ == "__main__":
    unittest.main()
