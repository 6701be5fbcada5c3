"""A resident body for the warm crash table (tests/warm_resident_test.go).

Every step leaves a mark in the directory $WARM_MARKS, one line appended
per event, so the test can count loads, bodies and hooks:

  loads            a line per on_host_setup (the pid)
  pid-<inv>        the pid of the process serving each body
  done-<inv>       the attempt of each body that returned
  orphan-<inv>     the pid of a child the body left running
  shutdown         "<pid> <seconds left in the grace>" per on_shutdown
  url              the process's NYMPH_RUNTIME_API

The input's "do" says what the body does on attempt 1: exit (os._exit
mid-body), wait-kill (sleep until the test SIGKILLs the process), orphan
(start a child, then sleep), hang (any attempt), slow (sleep input.s
seconds, any attempt), url (write the runtime API's URL). With
WARM_SETUP_FAILS set, on_host_setup raises.
"""

import os
import subprocess
import sys
import time

import dreamlake.lakeshore as dls

MARKS = os.environ["WARM_MARKS"]


def mark(name, text):
    with open(os.path.join(MARKS, name), "a") as f:
        f.write(text + "\n")


@dls.lifecycle.on_host_setup
def setup():
    mark("loads", str(os.getpid()))
    if os.environ.get("WARM_SETUP_FAILS"):
        raise RuntimeError("no checkpoint at /models/missing.pt")


@dls.lifecycle.on_shutdown
def flush():
    left = dls.lifecycle.deadline()
    mark("shutdown", "%d %.3f" % (os.getpid(), -1.0 if left is None else left))


@dls.body
def body(inp):
    inp = inp or {}
    do = inp.get("do", "")
    inv = os.environ["NYMPH_INVOCATION_ID"]
    attempt = int(os.environ["NYMPH_ATTEMPT"])
    print("body of %s attempt %d" % (inv, attempt))
    if do == "url":
        mark("url", os.environ["NYMPH_RUNTIME_API"])
    mark("pid-" + inv, str(os.getpid()))
    if attempt == 1:
        if do == "exit":
            sys.stdout.flush()
            os._exit(3)
        if do == "wait-kill":
            time.sleep(300)
        if do == "orphan":
            child = subprocess.Popen(["sleep", "300"])
            mark("orphan-" + inv, str(child.pid))
            time.sleep(300)
    if do == "hang":
        time.sleep(300)
    if do == "slow":
        time.sleep(float(inp.get("s", 2)))
    mark("done-" + inv, str(attempt))
    return {"attempt": attempt, "pid": os.getpid()}


if __name__ == "__main__":
    dls.serve()
