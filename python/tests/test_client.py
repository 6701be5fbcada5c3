"""Tests of dreamlake.lakeshore.client against a scripted control plane on
loopback: retries, errors, paging, cancel's loop and wait's progress. The
same client meets the real control plane in tests/python_runs_test.go."""

import http.server
import io
import json
import os
import threading
import unittest
from unittest import mock
from urllib.parse import parse_qs, urlsplit

from dreamlake import lakeshore as dls

TOKEN = "tok-s3cr3t-operator"


class Answer:
    """One scripted answer: a status and a JSON body (or raw bytes), extra
    headers, or drop=True to close the connection without answering."""

    def __init__(self, status=200, body=None, headers=None, drop=False, raw=None):
        self.status, self.body, self.headers, self.drop, self.raw = status, body, headers or {}, drop, raw


class FakePlane:
    """Answers requests from a script, in order, and records each request
    (method, path, query, headers, JSON body)."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.requests = []
        self.lock = threading.Lock()
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def handle_any(self):
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                url = urlsplit(self.path)
                with fake.lock:
                    fake.requests.append({
                        "method": self.command, "path": url.path, "query": parse_qs(url.query),
                        "headers": dict(self.headers), "body": json.loads(raw) if raw else None})
                    a = fake.answers.pop(0) if fake.answers else Answer(500, {"error": {"code": "internal", "message": "script ran out"}})
                if a.drop:
                    self.close_connection = True
                    return
                body = a.raw if a.raw is not None else json.dumps(a.body).encode()
                self.send_response(a.status)
                for k, v in a.headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = handle_any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.server.server_port

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def created(run_id="run_1", total=4, status=201):
    return Answer(status, {"run_id": run_id, "total": total, "state": "running"})


def view(done, total=4, succeeded=None, failed=0, cancelled=0):
    succeeded = done - failed - cancelled if succeeded is None else succeeded
    return Answer(200, {"run_id": "run_1", "queue": "q", "state": "done" if done == total else "running",
                        "total": total, "done_count": done, "created_at": "2026-12-03T10:00:00Z",
                        "counts": {"queued": total - done, "running": 0, "succeeded": succeeded,
                                   "failed": failed, "cancelled": cancelled}, "new_field": 1})


def lines(*docs, next_index=None):
    raw = b"".join(json.dumps(d).encode() + b"\n" for d in docs)
    return Answer(200, raw=raw, headers={dls.client.NEXT_INDEX_HEADER: str(next_index)} if next_index is not None else {})


class TTY(io.StringIO):
    def isatty(self):
        return True


class ClientTest(unittest.TestCase):
    def plane(self, *answers):
        fake = FakePlane(*answers)
        self.addCleanup(fake.close)
        return fake, dls.Client(fake.url, TOKEN, backoff=0.01, timeout=10)

    def test_config_from_env_and_clear_errors(self):
        with mock.patch.dict(os.environ, {"LAKESHORE_URL": "http://127.0.0.1:9/", "LAKESHORE_TOKEN": TOKEN}):
            c = dls.Client()
            self.assertEqual(c.url, "http://127.0.0.1:9")
            self.assertNotIn(TOKEN, repr(c))
        with mock.patch.dict(os.environ, {"LAKESHORE_URL": "", "LAKESHORE_TOKEN": TOKEN}):
            with self.assertRaisesRegex(dls.LakeshoreError, "LAKESHORE_URL"):
                dls.Client()
        with mock.patch.dict(os.environ, {"LAKESHORE_URL": "http://127.0.0.1:9", "LAKESHORE_TOKEN": ""}):
            with self.assertRaisesRegex(dls.LakeshoreError, "LAKESHORE_TOKEN"):
                dls.Client()
        with self.assertRaisesRegex(dls.LakeshoreError, "not an http"):
            dls.Client("ftp://x", TOKEN)

    def test_submit_sends_the_run_and_a_key(self):
        fake, c = self.plane(created())
        run = c.submit_run("q", ["sh", "-c", "echo {model}"], matrix={"model": ["a", 2]},
                           name="n", env={"A": "1"}, timeout_s=30, max_attempts=2)
        self.assertEqual((run.id, run.total, run.created), ("run_1", 4, True))
        req = fake.requests[0]
        self.assertEqual((req["method"], req["path"]), ("POST", "/v1/runs"))
        self.assertEqual(req["headers"]["Authorization"], "Bearer " + TOKEN)
        body = req["body"]
        self.assertEqual(body["matrix"], {"model": ["a", "2"]})
        self.assertEqual((body["queue"], body["name"], body["env"], body["timeout_s"], body["max_attempts"]),
                         ("q", "n", {"A": "1"}, 30, 2))
        self.assertNotIn("jobs", body)
        self.assertEqual(len(body["idempotency_key"]), 36)  # a uuid4
        self.assertEqual(run.idempotency_key, body["idempotency_key"])

    def test_submit_refuses_what_it_cannot_send(self):
        _, c = self.plane()
        with self.assertRaisesRegex(TypeError, "timeout"):
            c.submit_run("q", ["x"], jobs=[{}], timeout=3)  # timeout_s is the field
        with self.assertRaisesRegex(TypeError, "list of strings"):
            c.submit_run("q", "python3 eval.py", jobs=[{}])
        with self.assertRaisesRegex(TypeError, "list of values"):
            c.submit_run("q", ["x"], matrix={"model": "abc"})

    def test_submit_retries_lost_answers_with_one_key(self):
        # The first try's answer is lost (the connection drops), the second
        # meets a 503: the third gets the run, and every try sent one key.
        fake, c = self.plane(Answer(drop=True), Answer(503, {"error": {"code": "unavailable", "message": "store"}}),
                             created(status=200))
        run = c.submit_run("q", ["x"], jobs=[{}], idempotency_key="k-1")
        self.assertEqual(run.id, "run_1")
        self.assertFalse(run.created)  # a replay: the run was made once
        keys = [r["body"]["idempotency_key"] for r in fake.requests]
        self.assertEqual(keys, ["k-1"] * 3)

    def test_generated_key_is_kept_across_retries(self):
        fake, c = self.plane(Answer(502, raw=b"<html>bad gateway</html>"), created())
        c.submit_run("q", ["x"], jobs=[{}])
        keys = {r["body"]["idempotency_key"] for r in fake.requests}
        self.assertEqual(len(fake.requests), 2)
        self.assertEqual(len(keys), 1)

    def test_retries_are_bounded(self):
        fake, c = self.plane(*[Answer(503, {"error": {"code": "unavailable", "message": "down"}})] * 10)
        with self.assertRaises(dls.APIError) as cm:
            c.submit_run("q", ["x"], jobs=[{}])
        self.assertEqual(len(fake.requests), c.attempts)
        self.assertEqual((cm.exception.code, cm.exception.status), ("unavailable", 503))

    def test_refusals_are_not_retried(self):
        fake, c = self.plane(Answer(400, {"error": {"code": "invalid", "message": "jobs[0]: argv is empty"}}))
        with self.assertRaises(dls.APIError) as cm:
            c.submit_run("q", ["x"], jobs=[{}])
        e = cm.exception
        self.assertEqual((e.code, e.message, e.status), ("invalid", "jobs[0]: argv is empty", 400))
        self.assertIsInstance(e, dls.LakeshoreError)
        self.assertEqual(len(fake.requests), 1)

    def test_error_without_the_api_body(self):
        _, c = self.plane(Answer(404, raw=b"no such\x00 thing" + b"x" * 500))
        with self.assertRaises(dls.APIError) as cm:
            c.run_status("run_1")
        self.assertEqual(cm.exception.code, "not_found")
        self.assertIn("HTTP 404: no such  thing", cm.exception.message)
        self.assertLess(len(cm.exception.message), 260)

    def test_unreachable_names_no_token(self):
        fake, c = self.plane()
        fake.close()
        with self.assertRaises(dls.LakeshoreError) as cm:
            c.run_status("run_1")
        self.assertNotIsInstance(cm.exception, dls.APIError)
        self.assertIsNone(cm.exception.status)
        self.assertNotIn(TOKEN, str(cm.exception))

    def test_redirects_are_not_followed(self):
        other, _ = self.plane()  # where the redirect points: must see nothing
        fake, c = self.plane(Answer(307, raw=b"", headers={"Location": other.url + "/v1/runs/run_1"}))
        with self.assertRaises(dls.APIError) as cm:
            c.run_status("run_1")
        self.assertEqual(cm.exception.status, 307)
        self.assertEqual(other.requests, [])

    def test_status(self):
        fake, c = self.plane(created(), view(3, failed=1))
        st = c.submit_run("q", ["x"], jobs=[{}]).status()
        self.assertEqual((st.state, st.total, st.done_count, st.succeeded, st.failed, st.queued), ("running", 4, 3, 2, 1, 1))
        self.assertFalse(st.done)
        self.assertEqual(fake.requests[1]["path"], "/v1/runs/run_1")

    def test_results_follow_pages(self):
        fake, c = self.plane(created(),
                             lines({"index": 0}, {"index": 1}, next_index=2),
                             lines({"index": 2}, next_index=3),
                             lines({"index": 3}))
        run = c.submit_run("q", ["x"], jobs=[{}])
        self.assertEqual([d["index"] for d in run.results(records=True, page_size=2)], [0, 1, 2, 3])
        gets = fake.requests[1:]
        self.assertEqual([g["query"]["from"] for g in gets], [["0"], ["2"], ["3"]])
        self.assertEqual(gets[0]["query"]["limit"], ["2"])
        self.assertEqual(gets[0]["query"]["records"], ["true"])

    def test_results_refuse_a_page_that_does_not_move_on(self):
        for bad in ("0", "x", "-4"):
            with self.subTest(next=bad):
                _, c = self.plane(Answer(200, raw=b'{"index":0}\n', headers={dls.client.NEXT_INDEX_HEADER: bad}))
                with self.assertRaisesRegex(dls.LakeshoreError, "does not follow"):
                    list(dls.Run(c, "run_1", 1).results())

    def test_results_refuse_a_line_that_is_no_object(self):
        _, c = self.plane(Answer(200, raw=b'{"index":0}\n[1]\n'))
        with self.assertRaisesRegex(dls.LakeshoreError, "line 2"):
            list(dls.Run(c, "run_1", 1).results())

    def test_cancel_asks_again_while_jobs_remain(self):
        fake, c = self.plane(Answer(202, {"run_id": "run_1", "cancelled": 3, "remaining": 5}),
                             Answer(202, {"run_id": "run_1", "cancelled": 5, "remaining": 0}))
        got = dls.Run(c, "run_1", 8).cancel()
        self.assertEqual(got, {"run_id": "run_1", "cancelled": 8, "remaining": 0})
        self.assertEqual([r["path"] for r in fake.requests], ["/v1/runs/run_1/cancel"] * 2)

    def test_cancel_is_bounded(self):
        n = dls.client._MAX_CANCEL_CALLS
        fake, c = self.plane(*[Answer(202, {"run_id": "run_1", "cancelled": 0, "remaining": 1})] * (n + 1))
        with self.assertRaisesRegex(dls.LakeshoreError, "1 jobs still to cancel after 100 calls"):
            dls.Run(c, "run_1", 1).cancel()
        self.assertEqual(len(fake.requests), n)

    def test_wait_progress_lines(self):
        # Not a terminal: a line each tenth reached (0 %, 50 %, 100 %); the
        # poll that shows no new tenth writes nothing.
        fake, c = self.plane(view(0), view(2), view(2), view(4, failed=1))
        err = io.StringIO()
        with mock.patch("sys.stderr", err):
            st = dls.Run(c, "run_1", 4).wait(progress=True, poll_interval=0.01)
        self.assertTrue(st.done)
        self.assertEqual(err.getvalue().splitlines(), [
            "run run_1: 0/4 done, 0 succeeded, 0 failed",
            "run run_1: 2/4 done, 2 succeeded, 0 failed",
            "run run_1: 4/4 done, 3 succeeded, 1 failed",
        ])
        self.assertEqual(len(fake.requests), 4)

    def test_wait_progress_on_a_terminal(self):
        _, c = self.plane(view(1), view(4, cancelled=4, succeeded=0))
        tty = TTY()
        with mock.patch("sys.stderr", tty):
            dls.Run(c, "run_1", 4).wait(progress=True, poll_interval=0.01)
        self.assertEqual(tty.getvalue(),
                         "\rrun run_1: 1/4 done, 1 succeeded, 0 failed"
                         "\rrun run_1: 4/4 done, 0 succeeded, 0 failed, 4 cancelled\n")

    def test_wait_quietly(self):
        _, c = self.plane(view(4))
        err = io.StringIO()
        with mock.patch("sys.stderr", err):
            dls.Run(c, "run_1", 4).wait(poll_interval=0.01)
        self.assertEqual(err.getvalue(), "")

    def test_wait_timeout(self):
        _, c = self.plane(*[view(1)] * 50)
        with self.assertRaisesRegex(TimeoutError, "1 of 4 jobs ended"):
            dls.Run(c, "run_1", 4).wait(poll_interval=0.01, timeout=0.05)


if __name__ == "__main__":
    unittest.main()
