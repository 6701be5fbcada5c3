"""Tests of dreamlake.lakeshore.run (publish) against a fake lifecycle endpoint on loopback."""

import json
import os
import tempfile
import unittest
from unittest import mock

from dreamlake import lakeshore as dls
from dreamlake.lakeshore import lifecycle

from . import fakehttp

SECRET = "3q9publishsecret"  # no error may show it


class FakePublish(fakehttp.Fake):
    """The lifecycle endpoint's publish route for one run: records each
    request and answers an artifact, or the refusal set in status."""

    def __init__(self):
        super().__init__()
        self.path = "/v1/lifecycle/" + SECRET
        self.requests = []   # (content type, decoded body)
        self.status = None   # when set: answer {"error": message} with it
        self.message = ""
        fake = self

        class Handler(fakehttp.JSONHandler):
            def do_POST(self):
                if self.path != fake.path + "/publish":
                    return self.answer(404, {"error": "unknown URL"})
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    doc = json.loads(body.decode())
                except ValueError:
                    return self.answer(400, {"error": "bad JSON"})
                with fake.cond:
                    fake.requests.append((self.headers.get("Content-Type"), doc))
                    status, message = fake.status, fake.message
                if status:
                    return self.answer(status, {"error": message})
                name = doc.get("name") or os.path.basename(doc["path"])
                self.answer(201, {"name": name, "attempt": 2, "size": 7, "sha256": "ab" * 32,
                                  "content_type": "text/plain", "created_at": "2026-12-03T13:00:00Z"})

        self.server = fakehttp.start(Handler)

    @property
    def url(self):
        return "http://127.0.0.1:%d%s" % (self.server.server_port, self.path)


class PublishTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakePublish()
        self.addCleanup(self.fake.close)
        env = mock.patch.dict(os.environ, {lifecycle.ENV_URL: self.fake.url})
        env.start()
        self.addCleanup(env.stop)
        os.environ.pop(lifecycle.ENV_RUNTIME_API, None)  # patch.dict restores it
        self.dir = tempfile.mkdtemp()
        self.addCleanup(os.rmdir, self.dir)
        cwd = os.getcwd()
        os.chdir(self.dir)
        self.addCleanup(os.chdir, cwd)

    def test_publish(self):
        got = dls.run.publish("out/preds.jsonl")
        self.assertEqual(got["name"], "preds.jsonl")
        self.assertEqual(got["size"], 7)
        self.assertEqual(got["sha256"], "ab" * 32)
        got = dls.run.publish("./out", name="checkpoint")
        self.assertEqual(got["name"], "checkpoint")
        dls.run.publish("/abs/ckpt")
        here = os.getcwd()
        self.assertEqual(self.fake.requests, [
            ("application/json", {"path": os.path.join(here, "out", "preds.jsonl")}),
            ("application/json", {"path": os.path.join(here, "out"), "name": "checkpoint"}),
            ("application/json", {"path": "/abs/ckpt"}),
        ])

    def test_refusals(self):
        for status, message in ((404, '"nope" does not exist in the run directory'),
                                (409, "this run cannot publish: its attempt has ended"),
                                (413, "over the size limit"),
                                (400, "outside the run directory")):
            with self.subTest(status=status):
                self.fake.status, self.fake.message = status, message
                with self.assertRaises(lifecycle.LifecycleError) as cm:
                    dls.run.publish("nope")
                self.assertEqual(cm.exception.status, status)
                self.assertIn(message, str(cm.exception))
                self.assertNotIn(SECRET, str(cm.exception))

    def test_bad_arguments(self):
        with self.assertRaises(ValueError):
            dls.run.publish("")
        with self.assertRaises(TypeError):
            dls.run.publish("x", name=7)
        self.assertEqual(self.fake.requests, [])

    def test_outside_nymph(self):
        del os.environ[lifecycle.ENV_URL]  # patch.dict restores it
        self.assertIsNone(dls.run.publish("out"))
        os.environ[lifecycle.ENV_RUNTIME_API] = "http://127.0.0.1:1/v1/runtime/x"
        with self.assertRaises(lifecycle.LifecycleError):
            dls.run.publish("out")
        self.assertEqual(self.fake.requests, [])

    def test_unreachable(self):
        self.fake.close()
        with self.assertRaises(lifecycle.LifecycleError) as cm:
            dls.run.publish("out", timeout=5)
        self.assertIsNone(cm.exception.status)
        self.assertNotIn(SECRET, str(cm.exception))


if __name__ == "__main__":
    unittest.main()
