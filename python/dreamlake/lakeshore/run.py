"""Publish a body's outputs as artifacts of its attempt.

Inside a body nymph runs, ``publish`` hands a file or a directory of the
run to nymph, which uploads it to the control plane's storage and records
it under this invocation and attempt (operators fetch it with
``lakeshore artifacts get``)::

    from dreamlake import lakeshore as dls

    dls.run.publish("predictions.jsonl")
    dls.run.publish("./out", name="checkpoint")   # a directory: a tar.gz

    @dls.lifecycle.on_shutdown
    def flush():
        save_checkpoint("./out")
        dls.run.publish("./out", name="checkpoint")  # works while draining
        dls.lifecycle.requeue()

It talks to nymph's lifecycle endpoint (NYMPH_LIFECYCLE_URL) the way
``dreamlake.lakeshore.lifecycle`` does: no proxy, and no error shows the
URL. In a resident process serve() sets the variable for each invocation,
so publish works from the body function as it does from a plain body.
Standard library only, Python >= 3.8.
"""

import os

from . import lifecycle
from .lifecycle import LifecycleError

__all__ = ["publish"]


def publish(path, name=None, timeout=None):
    """Publish the file or directory at path as an artifact of this attempt
    and return it as recorded: a dict with name, attempt, size, sha256,
    content_type and created_at.

    name defaults to the file or directory's base name; publishing a name
    again replaces the earlier artifact of that name. A relative path is made
    absolute against os.getcwd(); the path must lie inside the run's
    directory (a symbolic link out of it is refused). A directory is sent as
    a tar.gz of its regular files and directories (links inside it are left
    out).

    Works while the run drains, so a shutdown hook can flush a checkpoint.
    nymph bounds each step of the upload, so by default this waits as long as
    the upload takes; timeout (seconds) bounds the wait for each answer.

    Returns None outside nymph (neither NYMPH_LIFECYCLE_URL nor
    NYMPH_RUNTIME_API set), as the other lifecycle calls stay out of the way
    there; in a resident process outside an invocation it raises
    LifecycleError, as there is no attempt to publish into. Raises LifecycleError with
    nymph's message when it refuses, its status telling why: 400 a bad name
    or path, 404 no such path, 409 the attempt has ended, 413 over a limit,
    502 the upload failed.
    """
    path = os.fspath(path)
    if not isinstance(path, str) or not path:
        raise ValueError("publish: path must be a non-empty str")
    if name is not None and not isinstance(name, str):
        raise TypeError("publish: name must be a str or None")
    base = os.environ.get(lifecycle.ENV_URL, "").strip().rstrip("/")
    if not base:
        if os.environ.get(lifecycle.ENV_RUNTIME_API, "").strip():
            # A resident process outside an invocation (serve() sets the
            # variable for each one): no attempt to publish into.
            raise LifecycleError("publish: no invocation to publish into here (%s is unset)" % lifecycle.ENV_URL)
        return None
    payload = {"path": os.path.abspath(path)}
    if name:
        payload["name"] = name
    return lifecycle._call(base + "/publish", "POST", timeout, payload)
