"""Tests of dls.serve() in resident mode: each runs a body script in a
subprocess against a fake of nymph's runtime API on loopback, so exits,
output and changes of directory and environment are the process's own."""

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest
from urllib.parse import urlsplit, parse_qs

from . import fakehttp

ROOT = pathlib.Path(__file__).resolve().parent.parent  # python/
SECRET = "7rtsecretpath"  # the runtime API's secret path segment; no output may show it
TIMEOUT = 60  # seconds a script may take; they take well under one
BOUND = 10.0  # how long the fake holds a wait that should end at once


def inv(n, **fields):
    """An invocation as GET next answers it: inv_<n>, attempt 1, and fields
    (input, workdir, env...)."""
    doc = {"invocation_id": "inv_%d" % n, "attempt": 1, "env": {"NYMPH_INVOCATION_ID": "inv_%d" % n}}
    doc.update(fields)
    return doc


class FakeRuntime(fakehttp.Fake):
    """nymph's runtime API for one warm process. GET next answers from
    script, in order: a dict is an invocation (200), an int a bare status
    (204, 500...); once script is used up, 410."""

    def __init__(self, script, stdout_path=None):
        super().__init__()
        self.script = list(script)
        self.requests = []      # (method, path after the base, body bytes), in order
        self.posts = {}         # path after the base -> body bytes
        self.stdout_at_post = {}  # path -> the process's stdout when that post arrived
        self.stdout_path = stdout_path
        self.view = {"phase": "setup", "host_key": "hk1_resident", "worker_id": "w-1",
                     "invocation_id": "", "attempt": 0}
        self.on_lifecycle_get = None  # called (under cond) on each GET lifecycle without wait
        self.before_next = None       # called (not under cond) before GET next answers
        fake = self
        prefix = "/v1/runtime/" + SECRET + "/"

        class Handler(fakehttp.JSONHandler):
            def route(self, method):
                url = urlsplit(self.path)
                if not url.path.startswith(prefix):
                    return self.answer(404, {"error": "unknown URL"})
                path = url.path[len(prefix):]
                length = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(length) if length else b""
                with fake.cond:
                    fake.requests.append((method, path, data))
                    if method == "POST":
                        fake.posts[path] = data
                        if fake.stdout_path:
                            fake.stdout_at_post[path] = pathlib.Path(fake.stdout_path).read_text()
                    fake.cond.notify_all()
                if method == "GET" and path == "next":
                    return self.next()
                if method == "GET" and path == "lifecycle":
                    return self.lifecycle(parse_qs(url.query).get("wait") == ["draining"])
                if method == "POST" and path in ("init/error",) or path.endswith(("/result", "/error")):
                    return self.answer(202, {"status": "recorded"})
                if method == "POST" and path.endswith("/publish"):
                    return self.answer(201, {"name": json.loads(data.decode())["name"], "attempt": 1, "size": 3})
                return self.answer(404, {"error": "unknown URL"})

            def next(self):
                if fake.before_next:
                    fake.before_next()
                with fake.cond:
                    fake.view["phase"] = "ready" if fake.view["phase"] == "setup" else fake.view["phase"]
                    step = fake.script.pop(0) if fake.script else 410
                if isinstance(step, dict):
                    return self.answer(200, step, [("Lakeshore-Invocation-Id", str(step.get("invocation_id")))])
                if step == 204:
                    return self.answer(204)
                if step == 410:
                    return self.answer(410, {"error": "the worker is stopping", "shutdown": True})
                return self.answer(step, {"error": "broken on purpose"})

            def lifecycle(self, wait):
                with fake.cond:
                    if wait:
                        fake.cond.wait_for(lambda: fake.view["phase"] == "draining" or fake.closing, timeout=BOUND)
                    elif fake.on_lifecycle_get:
                        fake.on_lifecycle_get()
                    view = dict(fake.view)
                self.answer(200, view)

            def do_GET(self):
                self.route("GET")

            def do_POST(self):
                self.route("POST")

        self.server = fakehttp.start(Handler)

    @property
    def url(self):
        return "http://127.0.0.1:%d/v1/runtime/%s" % (self.server.server_port, SECRET)

    def paths(self, method=None):
        with self.cond:
            return [p for m, p, _ in self.requests if method in (None, m)]

    def doc(self, path):
        """The JSON a post to path carried."""
        return json.loads(self.posts[path].decode("utf-8"))


class Resident:
    """A body script in a temporary directory, served resident against a
    fake runtime API."""

    def __init__(self, test, source, script, name="body.py", **fake_args):
        tmp = tempfile.TemporaryDirectory()
        test.addCleanup(tmp.cleanup)
        self.test = test
        self.dir = pathlib.Path(tmp.name)
        self.path = self.dir / name
        self.path.write_text(textwrap.dedent(source))
        self.log = self.dir / "hooks.log"
        self.stdout_path = self.dir / "stdout.txt"
        self.stderr_path = self.dir / "stderr.txt"
        self.stdout_path.write_text("")
        self.fake = FakeRuntime(script, stdout_path=self.stdout_path, **fake_args)
        test.addCleanup(self.fake.close)

    def run(self, argv=None, **env):
        """Runs the script until it exits; returns (status, stdout, stderr).
        stdout and stderr are files, not pipes, so the fake can read what
        the process has written when a post arrives."""
        # Without PYTHONUNBUFFERED, as nymph starts bodies: stdout to a file
        # is block-buffered, so only a flush puts a line there.
        e = {k: v for k, v in os.environ.items() if not k.startswith("NYMPH_") and k != "PYTHONUNBUFFERED"}
        e.update(PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1", HOOK_LOG=str(self.log),
                 NYMPH_RUNTIME_API=self.fake.url)
        e.update(env)
        with open(str(self.stdout_path), "w") as out, open(str(self.stderr_path), "w") as err:
            p = subprocess.run([sys.executable] + (argv or [str(self.path)]), cwd=str(self.dir), env=e,
                               stdout=out, stderr=err, timeout=TIMEOUT)
        stdout, stderr = self.stdout_path.read_text(), self.stderr_path.read_text()
        for text in (stdout, stderr):
            self.test.assertNotIn(SECRET, text)  # the runtime API's URL is never printed
        return p.returncode, stdout, stderr

    def hooks(self):
        return self.log.read_text().split() if self.log.exists() else []


MAIN = 'if __name__ == "__main__":\n    dls.serve()\n'

# Every hook and the body append a word to HOOK_LOG. The body answers by
# its input: {"raise": msg} raises, {"exit": n} calls sys.exit(n), "none"
# returns None, {"print": s} prints s first; anything else is echoed with
# what the process holds.
HOOKED = textwrap.dedent("""
    import json, os, sys
    import dreamlake.lakeshore as dls

    def note(what):
        with open(os.environ["HOOK_LOG"], "a") as f:
            f.write(what + "\\n")

    MODEL = {}
    CALLS = []

    @dls.lifecycle.on_host_setup
    def load():
        note("host")
        MODEL["token"] = "tok-%d" % os.getpid()

    @dls.lifecycle.on_run_setup
    def prep():
        note("run:%s:%s" % (os.path.basename(os.getcwd()), os.environ.get("JOB_VAR", "-")))

    @dls.body
    def evaluate(inp):
        CALLS.append(inp)
        note("body")
        if isinstance(inp, dict) and "print" in inp:
            print(inp["print"])
        if isinstance(inp, dict) and "raise" in inp:
            raise ValueError(inp["raise"])
        if isinstance(inp, dict) and "exit" in inp:
            sys.exit(inp["exit"])
        if inp == "none":
            return None
        if inp == "set":
            return {1, 2}
        return {"echo": inp, "model": MODEL.get("token"), "pid": os.getpid(), "calls": len(CALLS),
                "cwd": os.getcwd(), "job_var": os.environ.get("JOB_VAR"),
                "proc_var": os.environ.get("PROC_VAR"), "inv": os.environ.get("NYMPH_INVOCATION_ID")}

""") + MAIN


class ResidentTest(unittest.TestCase):
    def assertExit(self, run, status):
        code, stdout, stderr = run
        self.assertEqual(code, status, "stdout: %s\nstderr: %s" % (stdout, stderr))
        return stdout, stderr

    def test_two_invocations_one_process(self):
        r = Resident(self, HOOKED, [inv(1, input={"x": [1, 2.5, "é"]}), inv(2)])
        self.assertExit(r.run(), 0)
        one, two = r.fake.doc("inv_1/result"), r.fake.doc("inv_2/result")
        self.assertEqual(one["echo"], {"x": [1, 2.5, "é"]})
        self.assertIsNone(two["echo"])  # no input key: None
        # One process, its on_host_setup once, its module state seen by both.
        self.assertEqual(r.hooks().count("host"), 1)
        self.assertEqual(one["pid"], two["pid"])
        self.assertEqual(one["model"], "tok-%d" % one["pid"])
        self.assertEqual(two["model"], one["model"])
        self.assertEqual((one["calls"], two["calls"]), (1, 2))
        self.assertEqual((one["inv"], two["inv"]), ("inv_1", "inv_2"))
        # One compact UTF-8 JSON value.
        raw = r.fake.posts["inv_1/result"]
        self.assertEqual(raw, json.dumps(one, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
        self.assertEqual(r.fake.paths(), ["next", "inv_1/result", "next", "inv_2/result", "next"])

    def test_none_is_an_empty_body(self):
        r = Resident(self, HOOKED, [inv(1, input="none"), inv(2, input=7)])
        self.assertExit(r.run(), 0)
        self.assertEqual(r.fake.posts["inv_1/result"], b"")
        self.assertEqual(r.fake.doc("inv_2/result")["echo"], 7)

    def test_failing_body_reports_and_serves_on(self):
        r = Resident(self, HOOKED, [inv(1, input={"raise": "bad x"}), inv(2, input={"exit": 3}), inv(3, input=1)])
        _, stderr = self.assertExit(r.run(), 0)
        err = r.fake.doc("inv_1/error")
        self.assertEqual((err["error_type"], err["error_message"]), ("ValueError", "bad x"))
        self.assertIn("Traceback (most recent call last):", err["stack_trace"])
        self.assertIn("ValueError: bad x", err["stack_trace"])
        self.assertTrue(all(isinstance(line, str) and "\n" not in line for line in err["stack_trace"]))
        self.assertIn("the body __main__.evaluate failed:", stderr)
        self.assertIn("Traceback (most recent call last)", stderr)
        self.assertIn("ValueError: bad x", stderr)
        # SystemExit from the body fails its invocation only.
        err = r.fake.doc("inv_2/error")
        self.assertEqual(err["error_type"], "SystemExit")
        self.assertEqual(err["error_message"], "the body __main__.evaluate called sys.exit(3)")
        self.assertEqual(r.fake.doc("inv_3/result")["calls"], 3)  # still the same process
        self.assertNotIn("inv_1/result", r.fake.posts)
        self.assertNotIn("inv_2/result", r.fake.posts)

    def test_failing_run_setup_reports_and_serves_on(self):
        src = HOOKED.replace('def prep():', 'def prep():\n    if os.environ.get("JOB_VAR") == "boom": 1 / 0')
        r = Resident(self, src, [inv(1, env={"JOB_VAR": "boom"}), inv(2, input=2)])
        _, stderr = self.assertExit(r.run(), 0)
        err = r.fake.doc("inv_1/error")
        self.assertEqual(err["error_type"], "ZeroDivisionError")
        self.assertIn("on_run_setup hook __main__.prep failed:", stderr)
        self.assertEqual(r.hooks().count("body"), 1)  # only the second invocation's
        self.assertEqual(r.fake.doc("inv_2/result")["echo"], 2)

    def test_workdir_and_env_per_invocation(self):
        r = Resident(self, HOOKED, [])
        a, b = r.dir / "a", r.dir / "b"
        a.mkdir()
        b.mkdir()
        r.fake.script = [
            inv(1, workdir=str(a), env={"JOB_VAR": "one", "PROC_VAR": "job's"}),
            inv(2, workdir=str(b), env={"JOB_VAR": "two"}, input={"raise": "after env"}),
            {"invocation_id": "inv_3", "attempt": 1},  # no workdir, no env: the process's own
        ]
        self.assertExit(r.run(PROC_VAR="process's"), 0)
        one, three = r.fake.doc("inv_1/result"), r.fake.doc("inv_3/result")
        self.assertEqual((one["cwd"], one["job_var"], one["proc_var"]), (str(a.resolve()), "one", "job's"))
        self.assertEqual((three["cwd"], three["job_var"], three["proc_var"]),
                         (str(r.dir.resolve()), None, "process's"))
        self.assertIsNone(three["inv"])  # NYMPH_INVOCATION_ID came with the env, and went with it
        self.assertEqual(r.hooks(), ["host", "run:a:one", "body", "run:b:two", "body",
                                     "run:%s:-" % r.dir.name, "body"])

    def test_publish_per_invocation(self):
        # serve() sets NYMPH_LIFECYCLE_URL for each invocation, so
        # run.publish reaches that invocation's endpoint, with a relative
        # path made absolute against its workdir; once the invocation is
        # over there is nothing to publish into.
        body = textwrap.dedent("""
            import dreamlake.lakeshore as dls

            @dls.body
            def evaluate(inp):
                return dls.run.publish(inp, name="out")
        """) + MAIN
        r = Resident(self, body, [])
        a = r.dir / "a"
        a.mkdir()
        r.fake.script = [
            inv(1, workdir=str(a), input="preds.txt", env={"NYMPH_LIFECYCLE_URL": r.fake.url + "/lc1"}),
            inv(2, input="preds.txt"),
        ]
        self.assertExit(r.run(), 0)
        self.assertEqual(r.fake.doc("lc1/publish"), {"path": str(a.resolve() / "preds.txt"), "name": "out"})
        self.assertEqual(r.fake.doc("inv_1/result"), {"name": "out", "attempt": 1, "size": 3})
        self.assertIn("NYMPH_LIFECYCLE_URL is unset", r.fake.doc("inv_2/error")["error_message"])

    def test_bad_invocation_fails_alone(self):
        r = Resident(self, HOOKED, [])
        r.fake.script = [inv(1, workdir=str(r.dir / "missing")), inv(2, workdir=0), inv(3, env={"JOB_VAR": 1}),
                         inv(4, env={"A=B": "x"}), inv(5, input="fine")]
        _, stderr = self.assertExit(r.run(), 0)
        for n, text in ((1, "cannot enter the invocation's workdir and env"),
                        (2, "the invocation's workdir is not a string"),
                        (3, "the invocation's env is not an object of strings"),
                        (4, "cannot enter the invocation's workdir and env")):
            with self.subTest(n=n):
                err = r.fake.doc("inv_%d/error" % n)
                self.assertEqual(err["error_type"], "BadInvocation")
                self.assertIn(text, err["error_message"])
                self.assertIn(text, stderr)
        five = r.fake.doc("inv_5/result")
        self.assertEqual((five["echo"], five["cwd"], five["calls"]), ("fine", str(r.dir.resolve()), 1))

    def test_bad_result_is_an_error(self):
        r = Resident(self, HOOKED, [inv(1, input="set"), inv(2, input=3)])
        _, stderr = self.assertExit(r.run(), 0)
        err = r.fake.doc("inv_1/error")
        self.assertEqual(err["error_type"], "BadResult")
        self.assertIn("not JSON-serialisable (set)", err["error_message"])
        self.assertIn("not JSON-serialisable (set)", stderr)
        self.assertEqual(r.fake.doc("inv_2/result")["echo"], 3)

    def test_output_is_flushed_before_the_post(self):
        r = Resident(self, HOOKED, [inv(1, input={"print": "line-of-one"}),
                                    inv(2, input={"print": "line-of-two", "raise": "x"})])
        stdout, _ = self.assertExit(r.run(), 0)
        # stdout is a file, so block-buffered: the lines are there at the
        # post only when the client flushed first.
        self.assertIn("line-of-one\n", r.fake.stdout_at_post["inv_1/result"])
        self.assertIn("line-of-two\n", r.fake.stdout_at_post["inv_2/error"])
        self.assertEqual(stdout, "line-of-one\nline-of-two\n")

    def test_failing_host_setup(self):
        src = HOOKED.replace('note("host")', 'note("host"); raise RuntimeError("no weights here")')
        r = Resident(self, src, [inv(1)])
        _, stderr = self.assertExit(r.run(), 1)
        err = r.fake.doc("init/error")
        self.assertEqual((err["error_type"], err["error_message"]), ("RuntimeError", "no weights here"))
        self.assertIn("RuntimeError: no weights here", err["stack_trace"])
        self.assertIn("on_host_setup hook __main__.load failed:", stderr)
        self.assertIn("Traceback (most recent call last)", stderr)
        self.assertEqual(r.fake.paths(), ["init/error"])  # no next asked
        self.assertEqual(r.hooks(), ["host"])

    def test_204_asks_again(self):
        r = Resident(self, HOOKED, [204, 204, inv(1, input="late")])
        self.assertExit(r.run(), 0)
        self.assertEqual(r.fake.doc("inv_1/result")["echo"], "late")
        self.assertEqual(r.fake.paths(), ["next", "next", "next", "inv_1/result", "next"])

    def test_read_timeout_asks_again(self):
        # A GET next held past the client's read timeout is asked again.
        src = HOOKED.replace("MODEL = {}", "sys.modules['dreamlake.lakeshore.serve']._NEXT_TIMEOUT = 0.2\nMODEL = {}")
        r = Resident(self, src, [inv(1, input="after a timeout")])
        held = threading.Event()

        def hold_the_first():
            if not held.is_set():
                held.set()
                time.sleep(1.0)  # past the client's 0.2 s; answered to a closed connection
        r.fake.before_next = hold_the_first
        self.assertExit(r.run(), 0)
        self.assertEqual(r.fake.doc("inv_1/result")["echo"], "after a timeout")
        self.assertGreaterEqual(r.fake.paths().count("next"), 3)

    def test_unservable(self):
        for status in (500, 403, 404):
            with self.subTest(status=status):
                r = Resident(self, HOOKED, [inv(1, input=1), status, inv(2)])
                _, stderr = self.assertExit(r.run(), 1)
                self.assertIn("cannot serve: GET next answered %d: broken on purpose" % status, stderr)
                self.assertEqual(r.fake.paths(), ["next", "inv_1/result", "next"])
        r = Resident(self, HOOKED, [{"no": "id"}])
        _, stderr = self.assertExit(r.run(), 1)
        self.assertIn("GET next answered something other than an invocation", stderr)
        self.assertEqual(r.hooks(), ["host"])

    def test_bad_url_runs_nothing(self):
        for url in ("127.0.0.1:9/v1/runtime/" + SECRET, "http://[::1/" + SECRET):
            with self.subTest(url=url):
                r = Resident(self, HOOKED, [])
                _, stderr = self.assertExit(r.run(NYMPH_RUNTIME_API=url), 1)
                self.assertIn("NYMPH_RUNTIME_API is not", stderr)
                self.assertEqual(r.hooks(), [])
        # A dead one: nothing listens.
        r = Resident(self, HOOKED, [])
        url = r.fake.url
        r.fake.close()
        _, stderr = self.assertExit(r.run(NYMPH_RUNTIME_API=url), 1)
        self.assertIn("cannot serve: GET next failed: the runtime API is unreachable", stderr)

    def test_python_m(self):
        r = Resident(self, HOOKED, [inv(1, input="m")], name="hooked.py")
        self.assertExit(r.run(argv=["-m", "dreamlake.lakeshore.serve", "hooked:evaluate"]), 0)
        self.assertEqual(r.fake.doc("inv_1/result")["echo"], "m")

    SHUTDOWN = HOOKED.replace(MAIN, "") + textwrap.dedent("""
        import time
        from dreamlake.lakeshore import lifecycle

        @lifecycle.on_shutdown
        def first():
            note("first-start")
            lifecycle.info()  # tells the fake this hook runs
            time.sleep(float(os.environ.get("FIRST_SLEEP", "0")))
            note("first-end")

        @lifecycle.on_shutdown
        def second():
            note("second")
    """) + MAIN

    def test_410_runs_shutdown_hooks_once(self):
        r = Resident(self, self.SHUTDOWN, [inv(1, input=1)])
        self.assertExit(r.run(), 0)
        self.assertEqual(r.hooks(), ["host", "run:%s:-" % r.dir.name, "body", "first-start", "first-end", "second"])
        # lifecycle's drain watcher asked {base}/lifecycle?wait=draining.
        self.assertIn("lifecycle", r.fake.paths("GET"))

    def test_410_while_the_watcher_runs_the_hooks(self):
        # The drain comes first: the watcher runs first(), which is still
        # sleeping when 410 arrives. The process waits for it and runs
        # second() once, on one thread or the other.
        r = Resident(self, self.SHUTDOWN, [inv(1, input=1)])
        ran = threading.Event()
        r.fake.on_lifecycle_get = ran.set
        r.fake.before_next = lambda: ran.wait(BOUND)  # no next answered before first() runs
        r.fake.view["phase"] = "draining"
        self.assertExit(r.run(FIRST_SLEEP="0.5"), 0)
        hooks = r.hooks()
        for h in ("first-start", "first-end", "second"):
            self.assertEqual(hooks.count(h), 1, hooks)
        self.assertLess(hooks.index("first-end"), hooks.index("second"))

    def test_lifecycle_reads_the_runtime_api(self):
        src = HOOKED.replace("return {\"echo\": inp,",
                             "from dreamlake.lakeshore import lifecycle\n"
                             "    return {\"phase\": lifecycle.phase(), \"host_key\": lifecycle.host_key(),\n"
                             "            \"echo\": inp,")
        r = Resident(self, src, [inv(1)])
        self.assertExit(r.run(), 0)
        got = r.fake.doc("inv_1/result")
        self.assertEqual((got["phase"], got["host_key"]), ("ready", "hk1_resident"))
        self.assertEqual(r.fake.paths("GET").count("lifecycle"), 2)
        # NYMPH_LIFECYCLE_URL, when set, wins over the runtime API's.
        r = Resident(self, src, [inv(1)])
        other = FakeRuntime([])
        self.addCleanup(other.close)
        other.view["phase"] = "draining"
        self.assertExit(r.run(NYMPH_LIFECYCLE_URL=other.url + "/lifecycle"), 0)
        self.assertEqual(r.fake.doc("inv_1/result")["phase"], "draining")
        self.assertNotIn("lifecycle", r.fake.paths("GET"))


class WarmExampleTest(unittest.TestCase):
    """examples/warm/eval.py, served resident and plain."""

    EXAMPLE = ROOT.parent / "examples" / "warm" / "eval.py"

    def test_resident_loads_once(self):
        r = Resident(self, "", [])
        dirs = [r.dir / ("job%d" % i) for i in range(3)]
        for d in dirs:
            d.mkdir()
        r.fake.script = [inv(i, workdir=str(d), input={"i": i}) for i, d in enumerate(dirs)]
        loads = r.dir / "loads.log"
        code, stdout, stderr = r.run(argv=[str(self.EXAMPLE)], WARM_LOAD_S="0.2", WARM_LOAD_LOG=str(loads))
        self.assertEqual(code, 0, stderr)
        results = [r.fake.doc("inv_%d/result" % i) for i in range(3)]
        self.assertEqual(len(loads.read_text().splitlines()), 1)
        self.assertEqual({x["model"] for x in results}, {loads.read_text().strip()})
        self.assertEqual(len({x["pid"] for x in results}), 1)
        self.assertEqual([x["input"] for x in results], [{"i": 0}, {"i": 1}, {"i": 2}])
        self.assertEqual([x["scratch"] for x in results], [str((d / "scratch").resolve()) for d in dirs])
        self.assertTrue(all(isinstance(x["score"], float) for x in results))

    def test_plain_loads_per_process(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        loads = pathlib.Path(tmp.name) / "loads.log"
        e = {k: v for k, v in os.environ.items() if not k.startswith("NYMPH_")}
        e.update(PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1", WARM_LOAD_S="0", WARM_LOAD_LOG=str(loads))
        results = []
        for _ in range(2):
            p = subprocess.run([sys.executable, str(self.EXAMPLE)], cwd=tmp.name, env=e, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, universal_newlines=True, timeout=TIMEOUT)
            self.assertEqual(p.returncode, 0, p.stderr)
            results.append(json.loads(p.stdout))
        tokens = loads.read_text().split()
        self.assertEqual(len(tokens), 2)
        self.assertEqual([x["model"] for x in results], tokens)
        self.assertNotEqual(tokens[0], tokens[1])
        self.assertIsNone(results[0]["input"])


if __name__ == "__main__":
    unittest.main()
