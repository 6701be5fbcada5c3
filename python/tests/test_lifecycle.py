"""Tests of dreamlake.lakeshore.lifecycle against a fake lifecycle endpoint on loopback."""

import datetime
import io
import json
import os
import queue
import socket
import threading
import time
import unittest
from unittest import mock
from urllib.parse import urlsplit, parse_qs

from dreamlake.lakeshore import lifecycle

from . import fakehttp

SECRET = "3q9testsecret"  # the run's secret path segment; no error may show it
BOUND = 10.0  # how long a test waits for what should happen at once


def rfc3339(t):
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class FakeNymph(fakehttp.Fake):
    """Implements the lifecycle endpoint's contract for one run."""

    def __init__(self, path="/v1/lifecycle/" + SECRET):
        super().__init__()
        self.path = path  # the endpoint's path
        self.view = {"phase": "ready", "host_key": "hk1_abc", "worker_id": "w-1",
                     "invocation_id": "inv-1", "attempt": 2, "extra": "ignored"}
        self.waits = 0        # held wait requests that arrived
        self.requeues = 0
        self.early_waits = 0  # answer this many waits at once, not draining
        self.fail_waits = 0   # answer this many waits with 503
        self.status = None    # when set, answer everything with this status
        fake = self

        class Handler(fakehttp.JSONHandler):
            def do_GET(self):
                url = urlsplit(self.path)
                if fake.status:
                    return self.answer(fake.status, {"error": "refused"})
                if url.path != fake.path:
                    return self.answer(404, {"error": "unknown URL"})
                if parse_qs(url.query).get("wait") == ["draining"]:
                    with fake.cond:
                        if fake.early_waits:
                            fake.early_waits -= 1
                        elif fake.fail_waits:
                            fake.fail_waits -= 1
                            return self.answer(503, {"error": "restarting"})
                        else:
                            fake.waits += 1
                            fake.cond.notify_all()
                            fake.cond.wait_for(lambda: fake.view["phase"] in ("draining", "terminating") or fake.closing,
                                               timeout=BOUND)
                with fake.cond:
                    view = dict(fake.view)
                self.answer(200, view)

            def do_POST(self):
                if fake.status:
                    return self.answer(fake.status, {"error": "refused"})
                if self.path != fake.path + "/requeue":
                    return self.answer(404, {"error": "unknown URL"})
                with fake.cond:
                    if fake.view["phase"] != "draining":
                        return self.answer(409, {"error": "not draining"})
                    fake.requeues += 1
                    view = dict(fake.view)
                self.answer(202, view)

        self.server = fakehttp.start(Handler)

    @property
    def url(self):
        return "http://127.0.0.1:%d%s" % (self.server.server_port, self.path)

    def drain(self, seconds=3600):
        with self.cond:
            self.view["phase"] = "draining"
            self.view["deadline"] = rfc3339(time.time() + seconds)
            self.cond.notify_all()

    def wait_for_waits(self, n=1):
        with self.cond:
            if not self.cond.wait_for(lambda: self.waits >= n, timeout=BOUND):
                raise AssertionError("no held wait arrived")


def dead_url():
    """A loopback URL nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return "http://127.0.0.1:%d/v1/lifecycle/%s" % (port, SECRET)


class LifecycleTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeNymph()
        self.addCleanup(self.fake.close)
        env = mock.patch.dict(os.environ, {lifecycle.ENV_URL: self.fake.url})
        env.start()
        self.addCleanup(env.stop)
        os.environ.pop(lifecycle.ENV_RUNTIME_API, None)  # patch.dict restores it
        # Fresh hook state per test; the module's own is process-wide.
        hooks = mock.patch.object(lifecycle, "_hooks", lifecycle._Hooks())
        hooks.start()
        self.addCleanup(hooks.stop)

    def unset(self):
        del os.environ[lifecycle.ENV_URL]  # patch.dict restores it

    def test_info(self):
        view = lifecycle.info()
        self.assertEqual(view["invocation_id"], "inv-1")
        self.assertEqual(view["attempt"], 2)
        self.assertEqual(lifecycle.phase(), lifecycle.READY)
        self.assertEqual(lifecycle.host_key(), "hk1_abc")
        self.assertIsNone(lifecycle.deadline())

    def test_phase_mapping(self):
        # phase() answers setup, ready or draining and nothing else:
        # nymph's terminating reads draining, an unknown phase None.
        for sent, want in (("setup", "setup"), ("ready", "ready"), ("draining", "draining"),
                           ("terminating", "draining"), ("booting", None), ("", None), (7, None)):
            with self.subTest(sent=sent):
                self.fake.view["phase"] = sent
                self.assertEqual(lifecycle.phase(), want)
        self.unset()
        self.assertIsNone(lifecycle.phase())

    def test_terminating_is_draining(self):
        # The grace is over: deadline() reads 0 and a wait answers, as for
        # draining.
        with self.fake.cond:
            self.fake.view["phase"] = "terminating"
            self.fake.view["deadline"] = rfc3339(time.time() - 5)
        self.assertEqual(lifecycle.deadline(), 0.0)
        view = lifecycle.wait_draining(timeout=BOUND)
        self.assertIsNotNone(view)
        self.assertEqual(view["phase"], "terminating")

    def test_no_host_key(self):
        self.fake.view["host_key"] = ""
        self.assertIsNone(lifecycle.host_key())

    def test_outside_nymph(self):
        self.unset()
        self.assertIsNone(lifecycle.phase())
        self.assertIsNone(lifecycle.host_key())
        self.assertIsNone(lifecycle.info())
        self.assertIsNone(lifecycle.deadline())
        self.assertIsNone(lifecycle.wait_draining(timeout=1))
        self.assertFalse(lifecycle.requeue())

        def flush():
            raise AssertionError("hook ran outside nymph")
        self.assertIs(lifecycle.on_shutdown(flush), flush)
        self.assertFalse(lifecycle._hooks.watching)
        self.assertEqual(lifecycle._hooks.pending, [])

    def test_dead_or_bad_url_fails_soft(self):
        for url in (dead_url(), "ftp://x/" + SECRET, "http://[::" + SECRET,
                    "http://127.0.0.1:1/" + SECRET + " \x01"):
            with self.subTest(url=url.split(":")[0]):
                os.environ[lifecycle.ENV_URL] = url
                self.assertIsNone(lifecycle.phase())
                self.assertIsNone(lifecycle.host_key())
                self.assertIsNone(lifecycle.info())
                with self.assertRaises(lifecycle.LifecycleError) as cm:
                    lifecycle.requeue()
                self.assertNotIn(SECRET, str(cm.exception))

    def test_resident_process(self):
        # A resident process has NYMPH_RUNTIME_API, no NYMPH_LIFECYCLE_URL:
        # its lifecycle endpoint is the runtime API's /lifecycle.
        self.unset()
        runtime = FakeNymph(path="/v1/runtime/" + SECRET + "/lifecycle")
        self.addCleanup(runtime.close)
        runtime.view["host_key"] = "hk1_resident"
        os.environ[lifecycle.ENV_RUNTIME_API] = runtime.url[:-len("/lifecycle")] + "/"
        self.assertEqual(lifecycle.host_key(), "hk1_resident")
        runtime.drain()
        self.assertTrue(lifecycle.requeue())
        self.assertEqual(runtime.requeues, 1)
        # NYMPH_LIFECYCLE_URL, when set, wins.
        os.environ[lifecycle.ENV_URL] = self.fake.url
        self.assertEqual(lifecycle.host_key(), "hk1_abc")
        # Errors name the variable read, never the URL.
        for var in (lifecycle.ENV_URL, lifecycle.ENV_RUNTIME_API):
            with self.subTest(var=var):
                os.environ[var] = "ftp://x/" + SECRET
                with self.assertRaises(lifecycle.LifecycleError) as cm:
                    lifecycle.requeue()
                self.assertEqual(str(cm.exception), var + " is not an http URL")
                del os.environ[var]
        self.assertIsNone(lifecycle.phase())  # both unset: outside nymph

    def test_wait_draining(self):
        self.fake.early_waits = 1  # answered early once, then an error: both retried
        self.fake.fail_waits = 1
        got = queue.Queue()
        threading.Thread(target=lambda: got.put(lifecycle.wait_draining(timeout=BOUND)), daemon=True).start()
        self.fake.wait_for_waits()
        self.fake.drain()
        view = got.get(timeout=BOUND)
        self.assertEqual(view["phase"], lifecycle.DRAINING)
        left = lifecycle.deadline()
        self.assertTrue(3000 < left <= 3600, left)

    def test_wait_draining_timeout(self):
        self.assertIsNone(lifecycle.wait_draining(timeout=0.2))

    def test_wait_draining_refused(self):
        self.fake.status = 403
        with self.assertRaises(lifecycle.LifecycleError) as cm:
            lifecycle.wait_draining(timeout=BOUND)
        self.assertEqual(cm.exception.status, 403)
        self.assertIn("refused", str(cm.exception))
        self.assertNotIn(SECRET, str(cm.exception))

    def test_on_shutdown(self):
        ran = queue.Queue()

        @lifecycle.on_shutdown
        def first():
            ran.put(("first", lifecycle.deadline()))
            raise RuntimeError("boom")  # printed; the next hook still runs

        @lifecycle.on_shutdown
        def second():
            ran.put(("second", lifecycle.deadline()))

        self.assertTrue(callable(first))  # returned unchanged
        self.fake.wait_for_waits()
        self.assertTrue(ran.empty(), "a hook ran before the drain")
        stderr = io.StringIO()
        with mock.patch("sys.stderr", stderr):
            self.fake.drain()
            for want in ("first", "second"):
                name, left = ran.get(timeout=BOUND)
                self.assertEqual(name, want)
                self.assertTrue(0 < left <= 3600, left)

            # Registered after the drain was seen: runs at once.
            lifecycle.on_shutdown(lambda: ran.put(("late", None)))
            self.assertEqual(ran.get(timeout=BOUND)[0], "late")
        self.assertIn("RuntimeError: boom", stderr.getvalue())

    def test_on_shutdown_needs_a_function(self):
        with self.assertRaises(TypeError):
            lifecycle.on_shutdown()  # @lifecycle.on_shutdown() by mistake

    def test_requeue(self):
        with self.assertRaises(lifecycle.LifecycleError) as cm:
            lifecycle.requeue()
        self.assertEqual(cm.exception.status, 409)
        self.assertIn("not draining", str(cm.exception))
        self.assertNotIn(SECRET, str(cm.exception))

        self.fake.drain()
        self.assertTrue(lifecycle.requeue())
        self.assertEqual(self.fake.requeues, 1)

    def test_unknown_url(self):
        os.environ[lifecycle.ENV_URL] = self.fake.url.replace(SECRET, "other") + "/"
        self.assertIsNone(lifecycle.phase())
        with self.assertRaises(lifecycle.LifecycleError) as cm:
            lifecycle.requeue()
        self.assertEqual(cm.exception.status, 404)

    def test_parse_time(self):
        t = lifecycle._parse_time
        self.assertEqual(t("2026-12-02T10:00:00Z"), 1796205600.0)
        self.assertAlmostEqual(t("2026-12-02T10:00:00.123456789Z"), 1796205600.123456789, places=5)
        self.assertEqual(t("2026-12-02T11:00:00+01:00"), 1796205600.0)
        for bad in (None, "", "2026-13-02T10:00:00Z", "2026-12-02 10:00", 5):
            self.assertIsNone(t(bad), bad)


if __name__ == "__main__":
    unittest.main()
