"""A warm Python body: its "model" loads once per process, in an
on_host_setup hook, and the body scores each invocation's input with it.

Plain (one invocation per process; run by hand it prints its result):

    PYTHONPATH=python WARM_LOAD_S=0 python3 examples/warm/eval.py

Resident (a run config with resident: true, so nymph sets
NYMPH_RUNTIME_API): the process loads the model once and serves invocation
after invocation; every result names the same model token and pid.

Environment:
  WARM_LOAD_S    seconds the load takes (default 2): what a resident process saves
  WARM_LOAD_LOG  when set, a file each load appends one line to ("<token>"),
                 so a test can count the loads

The result is {"model": <token of the process's load>, "pid": <the process>,
"input": <the input; for a matrix job without one, its cell>,
"score": <a number derived from the input>, "scratch": <the scratch
directory on_run_setup made in the workdir>}.
"""

import json
import os
import secrets
import time
import zlib

import dreamlake.lakeshore as dls

MODEL = {}  # filled by load(); stays for every body this process serves


@dls.lifecycle.on_host_setup
def load():
    # Stands in for loading weights: slow, once per process.
    time.sleep(float(os.environ.get("WARM_LOAD_S", "2")))
    token = "model-%x-%d-%s" % (id(MODEL), os.getpid(), secrets.token_hex(4))
    MODEL.update(token=token, weight=7)
    log = os.environ.get("WARM_LOAD_LOG")
    if log:
        with open(log, "a") as f:
            f.write(token + "\n")


@dls.lifecycle.on_run_setup
def scratch():
    # Runs in the invocation's workdir: a per-invocation place to write.
    os.makedirs("scratch", exist_ok=True)


def matrix_cell():
    """The job's matrix cell ({"task": "mmlu", "shard": "0"}) when it is a
    job of a matrix run (nymph sets LAKESHORE_MATRIX_<AXIS> per
    invocation), else None."""
    prefix = "LAKESHORE_MATRIX_"
    cell = {k[len(prefix):].lower(): v for k, v in os.environ.items() if k.startswith(prefix)}
    return cell or None


@dls.body
def evaluate(inp):
    if inp is None:
        inp = matrix_cell()  # a matrix job: its cell is its input
    data = json.dumps(inp, sort_keys=True).encode("utf-8")
    return {"model": MODEL["token"], "pid": os.getpid(), "input": inp,
            "score": (zlib.crc32(data) % 1000) * MODEL["weight"] / 1000.0,
            "scratch": os.path.abspath("scratch") if os.path.isdir("scratch") else None}


if __name__ == "__main__":
    dls.serve()
