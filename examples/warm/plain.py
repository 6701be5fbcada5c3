"""A warm Python body in plain mode: the "model" loads once, in an
on_host_setup hook, and the body answers each invocation's input with it.

Run by hand it prints its result:

    PYTHONPATH=python python3 examples/warm/plain.py

Under nymph (``lakeshore submit ... -- python3 examples/warm/plain.py``,
with ``--env PYTHONPATH=<repo>/python``) the result is each job's
{"input": <its input>, "model": {...}}.
"""

import os

import dreamlake.lakeshore as dls

MODEL = {}


@dls.lifecycle.on_host_setup
def warm():
    # Stands in for loading weights: done before the body, once per process.
    MODEL.update(name="echo-1", loads=MODEL.get("loads", 0) + 1, pid=os.getpid())


@dls.lifecycle.on_run_setup
def prep():
    os.makedirs("scratch", exist_ok=True)


@dls.body
def evaluate(inp):
    return {"input": inp, "model": {"name": MODEL["name"], "loads": MODEL["loads"]},
            "scratch": os.path.isdir("scratch")}


if __name__ == "__main__":
    dls.serve()
