"""Tests of dls.body / dls.serve() in plain mode (resident mode:
test_resident.py): each runs a body script in a subprocess with a temporary
directory and nymph's variables, as nymph would."""

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap
import unittest

ROOT = pathlib.Path(__file__).resolve().parent.parent  # python/
TIMEOUT = 60  # seconds a script may take; they take well under one


class Script:
    """A body script in a temporary directory, run the way nymph runs one."""

    def __init__(self, test, source, name="body.py"):
        tmp = tempfile.TemporaryDirectory()
        test.addCleanup(tmp.cleanup)
        self.dir = pathlib.Path(tmp.name)
        self.path = self.dir / name
        self.path.write_text(textwrap.dedent(source))
        self.result = self.dir / "result.json"
        self.log = self.dir / "hooks.log"

    def run(self, inp=None, argv=None, result_file=True, **env):
        """Runs it; inp (a str) is written as the input file. Returns the
        CompletedProcess."""
        e = {k: v for k, v in os.environ.items() if not k.startswith("NYMPH_")}
        e.update(PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1", HOOK_LOG=str(self.log))
        if result_file:
            e["NYMPH_RESULT_FILE"] = str(self.result)
        if inp is not None:
            (self.dir / "input.json").write_text(inp)
            e["NYMPH_INPUT_FILE"] = str(self.dir / "input.json")
        e.update(env)
        return subprocess.run([sys.executable] + (argv or [str(self.path)]), cwd=str(self.dir), env=e,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                              timeout=TIMEOUT)

    def hooks(self):
        return self.log.read_text().split() if self.log.exists() else []


# Every hook and the body append their name to HOOK_LOG.
HOOKED = textwrap.dedent("""
    import json, os
    import dreamlake.lakeshore as dls

    def note(what):
        with open(os.environ["HOOK_LOG"], "a") as f:
            f.write(what + "\\n")

    @dls.lifecycle.on_host_setup
    def host_a(): note("host_a")

    @dls.lifecycle.on_run_setup
    def run_a(): note("run_a:" + os.path.basename(os.getcwd()))

    @dls.lifecycle.on_host_setup
    def host_b(): note("host_b")

    @dls.lifecycle.on_run_setup
    def run_b(): note("run_b")

    @dls.body
    def evaluate(inp):
        note("body")
        return {"echo": inp, "n": 1}

    if __name__ == "__main__":
        dls.serve()
""")


class ServeTest(unittest.TestCase):
    def assertOK(self, p):
        self.assertEqual(p.returncode, 0, "stdout: %s\nstderr: %s" % (p.stdout, p.stderr))

    def assertFailed(self, p, s, *texts):
        """Exit status 1, each of texts on stderr, no result file."""
        self.assertEqual(p.returncode, 1, p.stderr)
        for text in texts:
            self.assertIn(text, p.stderr)
        self.assertFalse(s.result.exists())

    def test_hooks_in_order_once_each(self):
        s = Script(self, HOOKED)
        p = s.run('{"x":1}')
        self.assertOK(p)
        self.assertEqual(s.hooks(), ["host_a", "host_b", "run_a:" + s.dir.name, "run_b", "body"])

    def test_input_reaches_body_and_result_is_json(self):
        s = Script(self, HOOKED)
        p = s.run('{"prompt": "héllo", "n": [1, 2.5, null]}')
        self.assertOK(p)
        self.assertEqual(json.loads(s.result.read_text(encoding="utf-8")),
                         {"echo": {"prompt": "héllo", "n": [1, 2.5, None]}, "n": 1})
        self.assertEqual(p.stdout, "")  # under nymph the result goes to the file only

    def test_scalar_input(self):
        s = Script(self, HOOKED)
        self.assertOK(s.run('"third"'))
        self.assertEqual(json.loads(s.result.read_text()), {"echo": "third", "n": 1})

    def test_no_input_is_none(self):
        s = Script(self, HOOKED)
        self.assertOK(s.run())
        self.assertEqual(json.loads(s.result.read_text()), {"echo": None, "n": 1})

    def test_outside_nymph_prints_result(self):
        s = Script(self, HOOKED)
        p = s.run('[1, 2]', result_file=False)
        self.assertOK(p)
        self.assertEqual(json.loads(p.stdout), {"echo": [1, 2], "n": 1})
        self.assertFalse(s.result.exists())

    def test_failing_host_setup(self):
        s = Script(self, HOOKED.replace('def host_b(): note("host_b")',
                                        'def host_b(): raise RuntimeError("no weights here")'))
        self.assertFailed(s.run('{"x":1}'), s, "on_host_setup hook", "host_b",
                          "Traceback (most recent call last)", "RuntimeError: no weights here")
        self.assertEqual(s.hooks(), ["host_a"])  # nothing after the failing hook

    def test_failing_run_setup(self):
        s = Script(self, HOOKED.replace('def run_b(): note("run_b")', 'def run_b(): 1 / 0'))
        self.assertFailed(s.run(), s, "on_run_setup hook", "run_b", "Traceback", "ZeroDivisionError")
        self.assertNotIn("body", s.hooks())

    def test_failing_body(self):
        s = Script(self, HOOKED.replace('return {"echo": inp, "n": 1}', 'raise KeyError("missing")'))
        self.assertFailed(s.run('{}'), s, "the body", "evaluate", "Traceback", "KeyError: 'missing'")

    def test_result_not_json(self):
        for bad in ("{1, 2}", "float('nan')", "{'a': object()}"):
            with self.subTest(bad=bad):
                s = Script(self, HOOKED.replace('return {"echo": inp, "n": 1}', "return " + bad))
                self.assertFailed(s.run('{}'), s, "not JSON-serialisable", "evaluate")

    def test_none_leaves_the_result_file_alone(self):
        # A body that appends its own JSON lines and returns None keeps them.
        s = Script(self, HOOKED.replace('return {"echo": inp, "n": 1}',
                                        'open(os.environ["NYMPH_RESULT_FILE"], "a").write("{\\"r\\":1}\\n")'))
        self.assertOK(s.run())
        self.assertEqual(s.result.read_text(), '{"r":1}\n')

    def test_bad_input(self):
        s = Script(self, HOOKED)
        self.assertFailed(s.run('{"x": '), s, "NYMPH_INPUT_FILE is not JSON")
        self.assertNotIn("body", s.hooks())

    def test_module_function(self):
        # A module without @dls.body or a __main__ block.
        s = Script(self, """
            import dreamlake.lakeshore as dls
            LOADED = []

            @dls.lifecycle.on_host_setup
            def warm(): LOADED.append("model")

            def evaluate(inp): return {"got": inp, "loaded": LOADED}
        """, name="mymod.py")
        p = s.run('{"k": 3}', argv=["-m", "dreamlake.lakeshore.serve", "mymod:evaluate"])
        self.assertOK(p)
        self.assertEqual(p.stderr, "")  # no warning from runpy about a module loaded twice
        self.assertEqual(json.loads(s.result.read_text()), {"got": {"k": 3}, "loaded": ["model"]})

    def test_module_function_already_registered(self):
        s = Script(self, HOOKED, name="hooked.py")
        p = s.run('5', argv=["-m", "dreamlake.lakeshore.serve", "hooked:evaluate"])
        self.assertOK(p)
        self.assertEqual(json.loads(s.result.read_text()), {"echo": 5, "n": 1})
        self.assertEqual(s.hooks().count("body"), 1)

    def test_module_function_other_than_registered(self):
        s = Script(self, HOOKED + "\ndef other(inp): return 0\n", name="hooked.py")
        self.assertFailed(s.run('5', argv=["-m", "dreamlake.lakeshore.serve", "hooked:other"]), s, "registers")

    def test_module_function_usage(self):
        s = Script(self, HOOKED, name="hooked.py")
        for args, status, text in ((["hooked"], 2, "usage"), (["hooked:nope"], 1, "has no nope"),
                                   (["nosuchmodule:f"], 1, "cannot import nosuchmodule")):
            with self.subTest(args=args):
                p = s.run(argv=["-m", "dreamlake.lakeshore.serve"] + args)
                self.assertEqual(p.returncode, status, p.stderr)
                self.assertIn(text, p.stderr)
        self.assertFalse(s.result.exists())

    def test_body_twice(self):
        s = Script(self, HOOKED.replace("if __name__", "@dls.body\ndef again(inp): return 0\n\nif __name__"))
        p = s.run()
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("ServeError: dls.body is used twice in one process", p.stderr)
        self.assertIn("evaluate", p.stderr)
        self.assertIn("again", p.stderr)
        self.assertEqual(s.hooks(), [])

    def test_no_body(self):
        s = Script(self, "import dreamlake.lakeshore as dls\ndls.serve()\n")
        p = s.run()
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("ServeError: no body to serve", p.stderr)

    def test_hooks_reject_parentheses(self):
        import dreamlake.lakeshore as dls
        for deco in (dls.lifecycle.on_host_setup, dls.lifecycle.on_run_setup, dls.body):
            with self.subTest(deco=deco.__name__):
                with self.assertRaisesRegex(TypeError, "without parentheses"):
                    deco(None)  # not a function


if __name__ == "__main__":
    unittest.main()
