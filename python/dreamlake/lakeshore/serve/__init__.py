"""Serve a Python body: run its setup hooks, hand it its input, record its result.

A body script registers one function with ``@dls.body`` and ends with
``dls.serve()``; the hooks come from ``dls.lifecycle``::

    import dreamlake.lakeshore as dls

    @dls.lifecycle.on_host_setup   # once per process, before the first body
    def warm(): MODEL["weights"] = load("checkpoint.pt")

    @dls.body                      # input (JSON value or None) -> JSON-able result
    def evaluate(inp): return {"score": score(MODEL, inp)}

    if __name__ == "__main__":
        dls.serve()

or, without the last two lines, ``python -m dreamlake.lakeshore.serve
module:function``.

serve() picks its mode from the environment. Without NYMPH_RUNTIME_API
(every body nymph starts today) it runs the plain mode: one invocation, the
process's own. A resident process, handed invocation after invocation
through nymph's runtime API, is not served by this version: serve() then
raises ServeError rather than run the body once and leave the others
unanswered.

Failures follow the shell's rules: a hook or the body that raises prints
its traceback on stderr and the process exits 1, and no result is written.
Standard library only, Python >= 3.8.
"""

import json
import os
import sys
import traceback

from .. import lifecycle

__all__ = ["ENV_RUNTIME_API", "ENV_INPUT_FILE", "ENV_RESULT_FILE", "ServeError", "body", "serve", "main"]

ENV_RUNTIME_API = "NYMPH_RUNTIME_API"  # set for a resident process (not served yet)
ENV_INPUT_FILE = "NYMPH_INPUT_FILE"    # the invocation's input, JSON; absent without one
ENV_RESULT_FILE = "NYMPH_RESULT_FILE"  # where the result goes; absent outside nymph

_PREFIX = "dreamlake.lakeshore.serve: "


class ServeError(Exception):
    """serve() cannot serve: no body, two bodies, an unreadable input, a
    result that is not JSON, or a mode this version does not serve."""


class _State:
    def __init__(self):
        self.body = None           # the registered body function
        self.host_setup_done = False


_state = _State()


def _name(fn):
    module = getattr(fn, "__module__", None)
    qual = getattr(fn, "__qualname__", None) or repr(fn)
    return "%s.%s" % (module, qual) if module else qual


def body(fn):
    """Decorator: fn is this process's body. serve() calls it with the
    invocation's input (the JSON value, or None without one) and records
    what it returns, which must be JSON-serialisable; None records nothing
    (a result file the body wrote itself stands). One body per process: a
    second registration raises ServeError. Returns fn unchanged."""
    if not callable(fn):
        raise TypeError("body decorates a function: use @dls.body, without parentheses")
    if _state.body is not None:
        raise ServeError("dls.body is used twice in one process (on %s, then on %s): a process serves one body"
                         % (_name(_state.body), _name(fn)))
    _state.body = fn
    return fn


def serve():
    """Serve the registered body, in the mode the environment asks for.

    Plain mode (NYMPH_RUNTIME_API unset): run the on_host_setup hooks, then
    the on_run_setup hooks, read the input from NYMPH_INPUT_FILE (None when
    unset), call the body, and write its result as one JSON value to
    NYMPH_RESULT_FILE (to stdout when unset: run by hand). Any failure
    prints why on stderr and raises SystemExit(1) with no result written.
    on_shutdown hooks keep running on lifecycle's drain watcher meanwhile.

    Raises ServeError when no body is registered, or when NYMPH_RUNTIME_API
    is set: resident bodies are not served by this version.
    """
    fn = _state.body
    if fn is None:
        raise ServeError("no body to serve: decorate a function with @dls.body, "
                         "or run python -m dreamlake.lakeshore.serve module:function")
    if os.environ.get(ENV_RUNTIME_API):
        raise ServeError("resident bodies are not supported by this version of dreamlake.lakeshore yet "
                         "(%s is set): upgrade the package the body runs with" % ENV_RUNTIME_API)
    _serve_plain(fn)


def _serve_plain(fn):
    """One invocation: this process's."""
    _host_setup()
    inp = _read_input()
    result = _invoke(fn, inp)
    if result is None:
        return
    text = _encode(fn, result)
    path = os.environ.get(ENV_RESULT_FILE)
    if not path:
        print(text)
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        _fail("cannot write the result to %s: %s" % (ENV_RESULT_FILE, e))


def _host_setup():
    """The on_host_setup hooks, once per process."""
    if _state.host_setup_done:
        return
    _run_hooks("on_host_setup", lifecycle._host_setup_hooks)
    _state.host_setup_done = True


def _invoke(fn, inp):
    """One invocation in the current directory: its on_run_setup hooks,
    then the body. Returns what the body returned."""
    _run_hooks("on_run_setup", lifecycle._run_setup_hooks)
    try:
        return fn(inp)
    except Exception:
        _fail_with_traceback("the body %s failed:" % _name(fn))


def _run_hooks(kind, hooks):
    for hook in list(hooks):
        try:
            hook()
        except Exception:
            _fail_with_traceback("%s hook %s failed:" % (kind, _name(hook)))


def _read_input():
    path = os.environ.get(ENV_INPUT_FILE)
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        _fail("cannot read the input from %s: %s" % (ENV_INPUT_FILE, e))
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError as e:
        _fail("the input in %s is not JSON: %s" % (ENV_INPUT_FILE, e))


def _encode(fn, result):
    """result as compact JSON; NaN and infinities are not JSON either."""
    try:
        return json.dumps(result, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as e:
        _fail("the body %s returned a result that is not JSON-serialisable (%s): %s"
              % (_name(fn), type(result).__name__, e))


def _fail(message):
    print(_PREFIX + message, file=sys.stderr)
    sys.stderr.flush()
    raise SystemExit(1)


def _fail_with_traceback(message):
    print(_PREFIX + message, file=sys.stderr)
    traceback.print_exc(file=sys.stderr)
    sys.stderr.flush()
    raise SystemExit(1)


_USAGE = "usage: python -m dreamlake.lakeshore.serve module:function"


def main(argv):
    """``python -m dreamlake.lakeshore.serve module:function``: import module
    (from sys.path, which -m starts with the current directory), take
    function as the body unless the module registered it with @dls.body,
    and serve. Returns the exit status."""
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(_USAGE, file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module_name, sep, attr = argv[0].partition(":")
    if not sep or not module_name or not attr:
        print(_USAGE + " (got %r)" % argv[0], file=sys.stderr)
        return 2
    import importlib
    try:
        module = importlib.import_module(module_name)
    except Exception:
        print(_PREFIX + "cannot import %s:" % module_name, file=sys.stderr)
        traceback.print_exc(file=sys.stderr)
        return 1
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            print(_PREFIX + "%s has no %s" % (module_name, attr), file=sys.stderr)
            return 1
    if not callable(fn):
        print(_PREFIX + "%s:%s is not a function" % (module_name, attr), file=sys.stderr)
        return 1
    try:
        if _state.body is None:
            body(fn)
        elif _state.body is not fn:
            raise ServeError("%s registers %s with @dls.body, not %s:%s" % (
                module_name, _name(_state.body), module_name, attr))
        serve()
    except ServeError as e:
        print(_PREFIX + str(e), file=sys.stderr)
        return 1
    return 0
