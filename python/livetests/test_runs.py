"""dreamlake.lakeshore's client against a real control plane and nymph.

tests/python_runs_test.go starts `lakeshore dev` and a nymph serving
LAKESHORE_TEST_QUEUE, then runs these with LAKESHORE_URL and
LAKESHORE_TOKEN set; LAKESHORE_TEST_IDLE_QUEUE is a queue nobody serves.
"""

import http.server
import io
import json
import os
import threading
import unittest
import urllib.error
import urllib.request
import uuid
from unittest import mock

from dreamlake import lakeshore as dls

QUEUE = os.environ.get("LAKESHORE_TEST_QUEUE", "")
IDLE = os.environ.get("LAKESHORE_TEST_IDLE_QUEUE", "")
WAIT = 120.0  # how long a run of four tiny jobs may take on a loaded machine

# Each job appends two records to its result file as JSON lines: "{model}"
# is the job's value on that axis (the control plane writes it into argv),
# the epoch comes from LAKESHORE_MATRIX_EPOCH.
BODY = ('for k in 1 2; do echo "{\\"model\\":\\"{model}\\",\\"epoch\\":\\"$LAKESHORE_MATRIX_EPOCH\\",\\"k\\":$k}"; '
        'done >> "$NYMPH_RESULT_FILE"')
MATRIX = {"model": ["a", "b"], "epoch": ["1", "2"]}
# Axes in name order, the first varying slowest: epoch, then model.
ORDER = [("a", "1"), ("b", "1"), ("a", "2"), ("b", "2")]


def setUpModule():
    if not (QUEUE and IDLE and os.environ.get(dls.client.ENV_URL)):
        raise unittest.SkipTest("run by tests/python_runs_test.go, which sets the plane and queues")


class LosingProxy:
    """Relays requests to the control plane, but drops the connection
    instead of relaying the answer to the first POST /v1/runs: a submit the
    control plane wrote whose answer the client never sees."""

    def __init__(self, upstream):
        self.lost = 0
        proxy = self
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def relay(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type", "accept")}
                req = urllib.request.Request(upstream + self.path, data=body, method=self.command, headers=headers)
                try:
                    with direct.open(req, timeout=60) as resp:
                        status, got, answer = resp.status, resp.headers, resp.read()
                except urllib.error.HTTPError as e:
                    status, got, answer = e.code, e.headers, e.read()
                if self.command == "POST" and self.path == "/v1/runs" and proxy.lost == 0:
                    proxy.lost += 1
                    self.close_connection = True
                    return
                self.send_response(status)
                for k in ("Content-Type", dls.client.NEXT_INDEX_HEADER):
                    if got.get(k):
                        self.send_header(k, got[k])
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_GET = do_POST = relay

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.url = "http://127.0.0.1:%d" % self.server.server_port

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class RunsTest(unittest.TestCase):
    def setUp(self):
        self.client = dls.Client()  # from LAKESHORE_URL and LAKESHORE_TOKEN

    def test_matrix_run(self):
        run = self.client.submit_run(QUEUE, ["/bin/sh", "-c", BODY], matrix=MATRIX, name="py-matrix")
        self.assertEqual(run.total, 4)
        self.assertTrue(run.created)
        err = io.StringIO()
        with mock.patch("sys.stderr", err):
            st = run.wait(progress=True, poll_interval=0.2, timeout=WAIT)
        self.assertEqual((st.state, st.done_count, st.succeeded, st.failed, st.name), ("done", 4, 4, 0, "py-matrix"))
        self.assertEqual(err.getvalue().splitlines()[-1], "run %s: 4/4 done, 4 succeeded, 0 failed" % run.id)

        want = [[{"model": m, "epoch": e, "k": k} for k in (1, 2)] for m, e in ORDER]
        for page_size in (None, 1):  # one page, and a page per job
            with self.subTest(page_size=page_size):
                got = list(run.results(page_size=page_size))
                self.assertEqual([line["index"] for line in got], [0, 1, 2, 3])
                self.assertEqual([line["state"] for line in got], ["succeeded"] * 4)
                self.assertEqual([line["exit_code"] for line in got], [0] * 4)
                self.assertEqual([line["result"] for line in got], want)

        records = list(run.results(records=True))
        self.assertEqual([r["index"] for r in records], [0, 0, 1, 1, 2, 2, 3, 3])
        self.assertEqual([r["record"] for r in records], [rec for job in want for rec in job])

        again = self.client.run(run.id)  # a later process finds it by id
        self.assertEqual((again.id, again.total), (run.id, 4))

    def test_cancel_on_an_idle_queue(self):
        run = self.client.submit_run(IDLE, ["/bin/true"], jobs=[{}, {}, {"argv": ["/bin/false"]}])
        self.assertEqual(self.client.run_status(run.id).queued, 3)
        got = run.cancel()
        self.assertEqual(got, {"run_id": run.id, "cancelled": 3, "remaining": 0})
        st = run.wait(poll_interval=0.2, timeout=WAIT)
        self.assertEqual((st.state, st.cancelled, st.done_count, st.succeeded), ("done", 3, 3, 0))
        self.assertEqual([line["state"] for line in run.results()], ["cancelled"] * 3)

    def test_same_key_same_run(self):
        key = "py-" + uuid.uuid4().hex
        first = self.client.submit_run(IDLE, ["/bin/true"], jobs=[{}, {}], idempotency_key=key)
        second = self.client.submit_run(IDLE, ["/bin/true"], jobs=[{}, {}], idempotency_key=key)
        self.addCleanup(first.cancel)
        self.assertEqual(second.id, first.id)
        self.assertEqual((first.created, second.created), (True, False))
        with self.assertRaises(dls.APIError) as cm:  # another body under the key
            self.client.submit_run(IDLE, ["/bin/false"], jobs=[{}, {}], idempotency_key=key)
        self.assertEqual((cm.exception.code, cm.exception.status), ("conflict", 409))

    def test_lost_answer_makes_one_run(self):
        proxy = LosingProxy(self.client.url)
        self.addCleanup(proxy.close)
        queue = IDLE + "-lost"
        via = dls.Client(proxy.url, os.environ[dls.client.ENV_TOKEN], backoff=0.05)
        run = via.submit_run(queue, ["/bin/true"], jobs=[{}, {}])
        self.addCleanup(run.cancel)
        self.assertEqual(proxy.lost, 1)
        self.assertFalse(run.created)  # the retry found the run the lost try made
        _, _, answer = self.client._call("GET", "/v1/runs", {"queue": queue})
        runs = json.loads(answer)["runs"]
        self.assertEqual([r["run_id"] for r in runs], [run.id])
        self.assertEqual(runs[0]["total"], 2)

    def test_bad_request(self):
        cases = {
            "argv names {nope}": dict(argv=["echo", "{nope}"], matrix={"model": ["a"]}),
            "matrix or jobs, not both": dict(argv=["echo"], matrix={"model": ["a"]}, jobs=[{}]),
        }
        for want, kw in cases.items():
            with self.subTest(want):
                with self.assertRaises(dls.APIError) as cm:
                    self.client.submit_run(QUEUE, **kw)
                e = cm.exception
                self.assertEqual((e.code, e.status), ("invalid", 400))
                self.assertIn(want, e.message)


if __name__ == "__main__":
    unittest.main()
