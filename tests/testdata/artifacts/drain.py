"""The body of TestArtifactsEndToEnd's hand-back (tests/publish_test.go).

Attempt 1 writes its pid to $MARK and works until its worker drains; its
on_shutdown hook then saves a checkpoint, publishes it, and asks to be
handed back. Attempt 2 publishes its final output and succeeds.
"""

import os
import time

import dreamlake.lakeshore as dls


@dls.lifecycle.on_shutdown
def flush():
    with open("ckpt.json", "w") as f:
        f.write('{"step": 3}')
    dls.run.publish("ckpt.json", name="checkpoint")
    dls.lifecycle.requeue()


@dls.body
def main(inp):
    attempt = int(os.environ["NYMPH_ATTEMPT"])
    if attempt == 1:
        with open(os.environ["MARK"], "w") as f:
            f.write("%d\n" % os.getpid())
        time.sleep(300)
    with open("final.txt", "w") as f:
        f.write("final of attempt %d" % attempt)
    dls.run.publish("final.txt")
    return {"attempt": attempt}


if __name__ == "__main__":
    dls.serve()
