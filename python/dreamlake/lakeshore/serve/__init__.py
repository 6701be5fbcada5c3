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

serve() picks its mode from the environment.

Plain mode (NYMPH_RUNTIME_API unset): one invocation, the process's own.
The input comes from NYMPH_INPUT_FILE, the result goes to NYMPH_RESULT_FILE.
Failures follow the shell's rules: a hook or the body that raises prints its
traceback on stderr and the process exits 1, and no result is written.

Resident mode (NYMPH_RUNTIME_API set, for a run config with resident: true):
nymph keeps the process warm and hands it invocation after invocation
through its runtime API. serve() runs the on_host_setup hooks once, then
loops: it asks the runtime API for the next invocation, changes into its
workdir and sets its env in os.environ, runs the on_run_setup hooks and the
body, flushes stdout and stderr (nymph gives the output written until then
to the invocation) and posts the result or the error. Then it changes back
to the directory the process started in and restores os.environ, whatever
happened. What survives from one body to the next is what lives in the
process: module globals, such as what the on_host_setup hooks loaded, and
anything else a body keeps in memory; the working directory and the
environment are per invocation. A hook or the body that raises (SystemExit
included), a result that is not JSON (BadResult) or a workdir or env that
cannot be entered (BadInvocation) fails that invocation only: the
traceback goes to stderr, the error to nymph, and the next invocation is
served. An on_host_setup hook that raises is reported to nymph and the
process exits 1. When nymph ends the process (410 Gone) the on_shutdown hooks
that have not run yet run, and the process exits 0. The runtime API's URL is
a secret of the run: nothing here prints it.

Standard library only, Python >= 3.8.
"""

import http.client
import json
import os
import re
import socket
import sys
import traceback
import urllib.error
import urllib.parse
import urllib.request

from .. import lifecycle

__all__ = ["ENV_RUNTIME_API", "ENV_INPUT_FILE", "ENV_RESULT_FILE", "ServeError", "body", "serve", "main"]

ENV_RUNTIME_API = lifecycle.ENV_RUNTIME_API  # set for a resident process
ENV_INPUT_FILE = "NYMPH_INPUT_FILE"    # the invocation's input, JSON; absent without one
ENV_RESULT_FILE = "NYMPH_RESULT_FILE"  # where the result goes; absent outside nymph

_PREFIX = "dreamlake.lakeshore.serve: "

# GET next is held up to about 20 s by nymph; a read that outlives this is
# asked again. Posts are answered at once.
_NEXT_TIMEOUT = 60.0
_POST_TIMEOUT = 60.0
_MAX_ANSWER = 16 << 20  # an invocation's input is at most a few MiB
# An invocation id goes into URL paths: nothing that could leave them.
_INVOCATION_ID = re.compile(r"[A-Za-z0-9_-]{1,200}\Z")


class ServeError(Exception):
    """serve() cannot serve: no body, two bodies, an unreadable input, a
    result that is not JSON, or a runtime API that cannot be reached."""


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

    Resident mode (NYMPH_RUNTIME_API set): run the on_host_setup hooks once,
    then serve invocation after invocation from nymph's runtime API (see the
    module's doc) until nymph ends the process: SystemExit(0) then, after
    the on_shutdown hooks not yet run. SystemExit(1) when the on_host_setup
    hooks fail or the runtime API cannot be used.

    In both modes on_shutdown hooks keep running on lifecycle's drain
    watcher meanwhile. Raises ServeError when no body is registered.
    """
    fn = _state.body
    if fn is None:
        raise ServeError("no body to serve: decorate a function with @dls.body, "
                         "or run python -m dreamlake.lakeshore.serve module:function")
    base = os.environ.get(ENV_RUNTIME_API, "").strip().rstrip("/")
    if base:
        _serve_resident(fn, base)
    else:
        _serve_plain(fn)


class _Failure(Exception):
    """An invocation (or the host setup) failed; why is already on stderr.
    doc is the runtime API's error body."""

    def __init__(self, error_type, message, stack_trace=()):
        super().__init__(message)
        self.doc = {"error_type": error_type, "error_message": message, "stack_trace": list(stack_trace)}


def _fail(message, error_type="ServeError"):
    """Prints message on stderr and returns the _Failure to raise."""
    print(_PREFIX + message, file=sys.stderr)
    sys.stderr.flush()
    return _Failure(error_type, message)


def _guarded(who, catch, fn, *args):
    """fn(*args) (who names it: "the body m.f"); an exception of a catch
    type prints that who failed and its traceback on stderr and raises
    _Failure."""
    try:
        return fn(*args)
    except catch as e:
        print(_PREFIX + who + " failed:", file=sys.stderr)
        lines = traceback.format_exception(type(e), e, e.__traceback__)
        sys.stderr.write("".join(lines))
        sys.stderr.flush()
        if isinstance(e, SystemExit):
            message = "%s called sys.exit(%r)" % (who, e.code)
        else:
            message = str(e)
        raise _Failure(type(e).__name__, message, "".join(lines).splitlines()) from None


# What a failing hook or body is: plain mode lets SystemExit through (the
# body exits the process it owns); a resident process serves on.
_PLAIN_CATCH = (Exception,)
_RESIDENT_CATCH = (Exception, SystemExit)


def _host_setup(catch):
    """The on_host_setup hooks, once per process. Raises _Failure."""
    if _state.host_setup_done:
        return
    _run_hooks("on_host_setup", lifecycle._host_setup_hooks, catch)
    _state.host_setup_done = True


def _run_hooks(kind, hooks, catch):
    for hook in list(hooks):
        _guarded("%s hook %s" % (kind, _name(hook)), catch, hook)


def _invoke(fn, inp, catch):
    """One invocation in the current directory: its on_run_setup hooks,
    then the body. Returns the result as compact JSON, or None when the
    body returned None. Raises _Failure."""
    _run_hooks("on_run_setup", lifecycle._run_setup_hooks, catch)
    result = _guarded("the body %s" % _name(fn), catch, fn, inp)
    return None if result is None else _encode(fn, result)


def _encode(fn, result):
    """result as compact UTF-8 JSON; NaN and infinities are not JSON
    either. Raises _Failure (BadResult)."""
    try:
        text = json.dumps(result, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
        text.encode("utf-8")  # a lone surrogate cannot be written
        return text
    except (TypeError, ValueError, RecursionError) as e:
        raise _fail("the body %s returned a result that is not JSON-serialisable (%s): %s"
                    % (_name(fn), type(result).__name__, e), "BadResult") from None


def _serve_plain(fn):
    """One invocation: this process's."""
    try:
        _host_setup(_PLAIN_CATCH)
        text = _invoke(fn, _read_input(), _PLAIN_CATCH)
        if text is not None:
            _write_result(text)
    except _Failure:
        raise SystemExit(1) from None


def _read_input():
    path = os.environ.get(ENV_INPUT_FILE)
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise _fail("cannot read the input from %s: %s" % (ENV_INPUT_FILE, e)) from None
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError as e:
        raise _fail("the input in %s is not JSON: %s" % (ENV_INPUT_FILE, e)) from None


def _write_result(text):
    path = os.environ.get(ENV_RESULT_FILE)
    if not path:
        print(text)
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise _fail("cannot write the result to %s: %s" % (ENV_RESULT_FILE, e)) from None


class _Unserved(Exception):
    """The runtime API cannot serve this process; the message never holds
    its URL."""


class _RuntimeAPI:
    """nymph's runtime API at base (a secret URL: never printed)."""

    def __init__(self, base):
        if not base.startswith(("http://", "https://")):
            raise _Unserved(ENV_RUNTIME_API + " is not an http URL")
        try:
            ok = bool(urllib.parse.urlsplit(base).hostname)
        except ValueError:
            ok = False
        if not ok:
            raise _Unserved(ENV_RUNTIME_API + " is not a valid URL")  # its text may quote it: not shown
        self.base = base

    def request(self, path, data, timeout):
        """(status, answer) of GET (data None) or POST data to base/path.
        Raises OSError (socket.timeout on a timeout) or _Unserved."""
        try:
            req = urllib.request.Request(self.base + "/" + path, data=data,
                                         method="GET" if data is None else "POST",
                                         headers={"Accept": "application/json", "Content-Type": "application/json"})
            with lifecycle._opener.open(req, timeout=timeout) as resp:
                return resp.status, resp.read(_MAX_ANSWER)
        except urllib.error.HTTPError as e:
            try:
                return e.code, e.read(_MAX_ANSWER)
            except OSError:
                return e.code, b""
            finally:
                e.close()
        except urllib.error.URLError as e:
            if isinstance(e.reason, socket.timeout):
                raise e.reason from None
            # e.reason names at most host and port, never the path.
            raise OSError("the runtime API is unreachable: %s" % (e.reason,)) from None
        except (ValueError, http.client.InvalidURL):
            # A malformed URL; the exception's text may quote it.
            raise _Unserved(ENV_RUNTIME_API + " is not a valid URL") from None
        except http.client.HTTPException as e:
            # A broken answer; its text holds no URL.
            raise OSError("the runtime API's answer is broken: %r" % (e,)) from None

    def next(self):
        """The next invocation's dict, or None when nymph ends the process.
        Raises _Unserved."""
        while True:
            try:
                status, answer = self.request("next", None, _NEXT_TIMEOUT)
            except socket.timeout:
                continue  # held past our patience: ask again
            except OSError as e:
                raise _Unserved("GET next failed: %s" % (e,)) from None
            if status == 204:
                continue
            if status == 410:
                return None
            if status != 200:
                raise _Unserved("GET next answered %d%s" % (status, _error_of(answer)))
            try:
                inv = json.loads(answer.decode("utf-8"))
            except ValueError:
                inv = None
            if not isinstance(inv, dict) or not isinstance(inv.get("invocation_id"), str) \
                    or not _INVOCATION_ID.match(inv["invocation_id"]):
                raise _Unserved("GET next answered something other than an invocation")
            return inv

    def post(self, path, data):
        """POST data; a refusal or no answer is printed on stderr (the
        invocation fails either way) and serving goes on."""
        try:
            status, answer = self.request(path, data, _POST_TIMEOUT)
        except OSError as e:
            status, answer = None, str(e).encode()
        if status != 202:
            what = path.rpartition("/")[2]
            print(_PREFIX + "the runtime API did not take the %s (%s)%s"
                  % (what, "no answer" if status is None else status, _error_of(answer)), file=sys.stderr)
            sys.stderr.flush()


def _error_of(answer):
    """': message' of an {"error": "message"} answer, or ''."""
    message = lifecycle._error_message(answer)
    return ": " + message if message else ""


def _serve_resident(fn, base):
    """Invocation after invocation from the runtime API at base."""
    try:
        api = _RuntimeAPI(base)
        try:
            _host_setup(_RESIDENT_CATCH)
        except _Failure as f:
            _flush()
            api.post("init/error", json.dumps(f.doc).encode("utf-8"))
            raise SystemExit(1) from None
        home = os.getcwd()
        while True:
            inv = api.next()
            if inv is None:
                lifecycle._hooks.run_now()
                raise SystemExit(0)
            _serve_one(api, fn, inv, home)
    except _Unserved as e:
        print(_PREFIX + "cannot serve: %s" % (e,), file=sys.stderr)
        raise SystemExit(1) from None


def _serve_one(api, fn, inv, home):
    """One invocation: in its workdir and env, restored afterwards."""
    saved = dict(os.environ)
    try:
        try:
            _enter(inv)
            text = _invoke(fn, inv.get("input"), _RESIDENT_CATCH)
        except _Failure as f:
            path, data = "error", json.dumps(f.doc).encode("utf-8")
        else:
            path, data = "result", b"" if text is None else text.encode("utf-8")
        _flush()
        api.post(inv["invocation_id"] + "/" + path, data)
    finally:
        _restore(saved)
        os.chdir(home)


def _enter(inv):
    """Change into the invocation's workdir and set its env. Raises _Failure."""
    workdir, env = inv.get("workdir"), inv.get("env") or {}
    if workdir is not None and not isinstance(workdir, str):  # os.chdir would take an int as a descriptor
        raise _fail("the invocation's workdir is not a string", "BadInvocation")
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise _fail("the invocation's env is not an object of strings", "BadInvocation")
    try:
        if workdir:
            os.chdir(workdir)
        os.environ.update(env)
    except (OSError, TypeError, ValueError) as e:
        raise _fail("cannot enter the invocation's workdir and env: %s" % (e,), "BadInvocation") from None


def _restore(saved):
    """os.environ back to saved."""
    for k in list(os.environ):
        if k not in saved:
            del os.environ[k]
    for k, v in saved.items():
        if os.environ.get(k) != v:
            os.environ[k] = v


def _flush():
    """stdout and stderr into their pipes: nymph gives what is there when
    a result or an error is posted to that invocation."""
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError, AttributeError):
            pass  # closed or replaced by the body: nothing to wait for


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
