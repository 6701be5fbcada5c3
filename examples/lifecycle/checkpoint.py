"""A body that works in steps, saves a checkpoint when its worker drains,
asks to be handed back, and resumes from the checkpoint on its next attempt,
wherever that runs (docs/lifecycle.md).

Environment: CHECKPOINT_DIR, a directory every attempt reaches (a shared
volume, or an object store a real body would upload to); STEPS, the steps in
all (default 100); STEP_MS, the time one step takes (default 50). The module
`dreamlake.lakeshore.lifecycle` is standard library only (python/ in the
repository): put that directory on PYTHONPATH, or `pip install ./python`.

    lakeshore submit --queue gpu --env CHECKPOINT_DIR=/mnt/shared/run-42 \\
        --env PYTHONPATH=/opt/lakeshore/python -- python3 checkpoint.py
"""

import json
import os
import threading
import time
from datetime import datetime, timezone

from dreamlake.lakeshore import lifecycle

DIR = os.environ["CHECKPOINT_DIR"]
PATH = os.path.join(DIR, "checkpoint.json")
STEPS = int(os.environ.get("STEPS", "100"))
STEP_S = int(os.environ.get("STEP_MS", "50")) / 1000

state = {"step": 0, "stopped": False}
lock = threading.Lock()


def now():
    return datetime.now(timezone.utc).isoformat()


def load():
    try:
        with open(PATH) as f:
            return json.load(f)
    except FileNotFoundError:
        return {"step": 0}


def save(ck):
    """Write the checkpoint whole or not at all (a rename)."""
    tmp = PATH + ".tmp"
    with open(tmp, "w") as f:
        json.dump(ck, f)
    os.replace(tmp, PATH)


@lifecycle.on_shutdown  # inside the grace window: flush, then return
def flush():
    seen = now()
    with lock:
        state["stopped"] = True  # no step after the one saved
        step = state["step"]
    save({"step": step, "attempt": int(os.environ.get("NYMPH_ATTEMPT", "0")),
          "saved_at": now(), "drain_seen_at": seen})
    print(f"draining: saved step {step}; asking to be handed back", flush=True)
    lifecycle.requeue()  # nymph ends the body now


def main():
    resumed_from = load()["step"]
    state["step"] = resumed_from
    print(f"attempt {os.environ.get('NYMPH_ATTEMPT')}: phase {lifecycle.phase()}, "
          f"host key {lifecycle.host_key()!r}, starting at step {resumed_from} of {STEPS}", flush=True)
    while True:
        with lock:
            if state["stopped"]:
                break
            if state["step"] >= STEPS:
                break
            state["step"] += 1
            step = state["step"]
        time.sleep(STEP_S)
        if step % 10 == 0:
            print(f"step {step}", flush=True)
    if state["stopped"]:
        threading.Event().wait()  # the hook hands the run back; nymph ends it
    with open(os.environ["NYMPH_RESULT_FILE"], "w") as f:
        json.dump({"steps": STEPS, "resumed_from": resumed_from}, f)
    print(f"done: {STEPS} steps, resumed from step {resumed_from}", flush=True)


if __name__ == "__main__":
    main()
