"""The import names: dreamlake.lakeshore, and lakeshore as its alias."""

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = pathlib.Path(__file__).resolve().parent.parent  # python/


class NamesTest(unittest.TestCase):
    def test_both_spellings(self):
        from dreamlake import lakeshore as a
        import dreamlake.lakeshore as b
        self.assertIs(a, b)
        self.assertTrue(callable(a.lifecycle.phase))
        self.assertTrue(callable(a.Client))

    def test_alias_is_the_same_modules(self):
        import dreamlake.lakeshore as dls
        import lakeshore
        import lakeshore.client
        import lakeshore.lifecycle
        from lakeshore import lifecycle
        self.assertIs(lifecycle, dls.lifecycle)
        self.assertIs(lakeshore.lifecycle, dls.lifecycle)
        self.assertIs(sys.modules["lakeshore.lifecycle"], dls.lifecycle)
        self.assertIs(sys.modules["lakeshore.client"], dls.client)
        for name in dls.__all__:
            self.assertIs(getattr(lakeshore, name), getattr(dls, name), name)

    def test_serve_is_the_function(self):
        # dreamlake.lakeshore.serve is a submodule and dls.serve the
        # function it holds: importing the submodule by name keeps it so.
        import dreamlake.lakeshore as dls
        import dreamlake.lakeshore.serve  # noqa: F401
        import lakeshore.serve  # noqa: F401
        mod = sys.modules["dreamlake.lakeshore.serve"]
        self.assertIs(sys.modules["lakeshore.serve"], mod)
        self.assertIs(dls.serve, mod.serve)
        self.assertIs(dls.body, mod.body)
        self.assertTrue(callable(dls.serve))

    def test_every_submodule_is_aliased(self):
        # The alias maps the submodules dreamlake.lakeshore imported; one
        # it does not import would load twice under the old name.
        import lakeshore  # noqa: F401
        pkg = ROOT / "dreamlake" / "lakeshore"
        files = sorted([p.stem for p in pkg.glob("*.py") if p.stem != "__init__"] +
                       [p.parent.name for p in pkg.glob("*/__init__.py")])
        self.assertEqual(files, ["client", "lifecycle", "run", "serve"])
        for stem in files:
            self.assertIs(sys.modules["lakeshore." + stem], sys.modules["dreamlake.lakeshore." + stem], stem)

    def test_dreamlake_is_a_namespace(self):
        # No dreamlake/__init__.py: other dreamlake.* distributions share
        # the name.
        self.assertFalse((ROOT / "dreamlake" / "__init__.py").exists())
        import dreamlake
        self.assertIsNone(getattr(dreamlake, "__file__", None))

    def test_both_names_install(self):
        # setuptools lays out what a wheel holds (build_py, from
        # pyproject.toml's package list), in a copy so the tree stays clean;
        # both names then import from there alone.
        try:
            import setuptools
        except ImportError:
            setuptools = None
        if setuptools is None or int(setuptools.__version__.split(".")[0]) < 61:
            if os.environ.get("CI") == "true":
                self.fail("setuptools>=61 is missing: CI checks the package's layout")
            self.skipTest("setuptools>=61 is not installed")
        with tempfile.TemporaryDirectory() as tmp:
            src, out = os.path.join(tmp, "src"), os.path.join(tmp, "out")
            shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
            env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
            env.pop("PYTHONPATH", None)
            subprocess.run([sys.executable, "-c", "import setuptools; setuptools.setup()", "-q",
                            "build_py", "--build-lib", out], cwd=src, env=env, check=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
            got = sorted(str(p.relative_to(out)) for p in pathlib.Path(out).rglob("*.py"))
            self.assertEqual(got, ["dreamlake/lakeshore/__init__.py", "dreamlake/lakeshore/client.py",
                                   "dreamlake/lakeshore/lifecycle.py", "dreamlake/lakeshore/run.py",
                                   "dreamlake/lakeshore/serve/__init__.py",
                                   "dreamlake/lakeshore/serve/__main__.py", "lakeshore/__init__.py"])
            check = ("from dreamlake import lakeshore as dls; import lakeshore; "
                     "assert lakeshore.lifecycle is dls.lifecycle and dls.Client and dls.lifecycle.phase; "
                     "assert lakeshore.serve is dls.serve and callable(dls.serve) and dls.body; "
                     "assert lakeshore.run is dls.run and callable(dls.run.publish)")
            subprocess.run([sys.executable, "-c", check], cwd=tmp, env=dict(env, PYTHONPATH=out),
                           check=True, timeout=60)


if __name__ == "__main__":
    unittest.main()
