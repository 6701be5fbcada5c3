"""Lakeshore from Python: submit runs and read them, and help bodies.

``dreamlake`` is a namespace package (PEP 420: no ``dreamlake/__init__.py``),
so this distribution and any other ``dreamlake.*`` one install side by side
without either owning, or overwriting, the shared top-level name::

    from dreamlake import lakeshore as dls

    run = dls.Client().submit_run("q", ["python3", "eval.py", "{model}"],
                                  matrix={"model": ["a", "b"]})
    run.wait(progress=True)
    for line in run.results():
        print(line["index"], line["state"], line["result"])

``dls.lifecycle`` is for bodies, the processes nymph runs: their phase, the
worker's host key, setup and drain hooks and requeue; ``dls.run.publish``
publishes a body's file or directory as an artifact of its attempt. ``@dls.body`` and
``dls.serve()`` make a Python function a body: serve() runs the setup hooks,
calls the function with the invocation's input and records its result. Standard library only,
Python >= 3.8.

Every submodule is imported here: ``import lakeshore`` (the older name) is
an alias that maps each of them under its own name, so both names reach the
same module objects and their state.
"""

from . import lifecycle
from . import run
from . import client
from .client import APIError, Client, LakeshoreError, Run, RunStatus
# The submodule dreamlake.lakeshore.serve (a package, so that
# `python -m dreamlake.lakeshore.serve` runs its __main__ without loading
# it twice) is loaded by this import; the name serve then means its function.
from .serve import ServeError, body, serve

__all__ = ["lifecycle", "run", "client", "Client", "Run", "RunStatus", "LakeshoreError", "APIError",
           "body", "serve", "ServeError"]
