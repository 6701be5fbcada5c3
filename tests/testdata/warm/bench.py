"""The body of BenchmarkWarmStart (tests/warm_resident_test.go): its
setup takes WARM_LOAD_S seconds (a model load), and the body answers the
wall-clock time it was entered, so the benchmark measures submit → body
entered, warm against cold."""

import os
import time

import dreamlake.lakeshore as dls


@dls.lifecycle.on_host_setup
def load():
    time.sleep(float(os.environ.get("WARM_LOAD_S", "1")))


@dls.body
def entered(inp):
    return {"entered": time.time()}


if __name__ == "__main__":
    dls.serve()
