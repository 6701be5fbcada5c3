"""Talk to nymph's lifecycle endpoint from a body.

nymph puts the URL of a per-run loopback endpoint in each body's environment
as NYMPH_LIFECYCLE_URL; a resident process (one nymph hands invocation after
invocation, see dreamlake.lakeshore.serve) has NYMPH_RUNTIME_API instead, and
its lifecycle endpoint is that API's /lifecycle. Through it a body reads its phase and the worker's
host key, waits for a drain, runs shutdown hooks within the drain's grace
window, and, once it has flushed, hands its invocation back to the queue
instead of recording an outcome::

    from dreamlake.lakeshore import lifecycle

    @lifecycle.on_shutdown
    def flush():
        save_checkpoint(budget=lifecycle.deadline())
        lifecycle.requeue()   # last: nymph ends the body once it accepts

Scripts served by ``dreamlake.lakeshore.serve()`` also register setup
hooks here: ``@lifecycle.on_host_setup`` (once per process, before the first
body) and ``@lifecycle.on_run_setup`` (before every body); serve() runs them.

Outside nymph (both variables unset) everything stays out of the way: phase(),
host_key(), info() and deadline() return None, wait_draining() returns None,
on_shutdown registers nothing that ever runs, and requeue() returns False.

Either URL's path is a secret of the run, so nothing here prints it; errors say
"the lifecycle endpoint" instead. Standard library only, Python >= 3.8.
"""

import datetime
import http.client
import json
import os
import re
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request

__all__ = [
    "ENV_URL", "SETUP", "READY", "DRAINING", "LifecycleError",
    "phase", "host_key", "info", "deadline", "wait_draining",
    "on_shutdown", "on_host_setup", "on_run_setup", "requeue",
]

ENV_URL = "NYMPH_LIFECYCLE_URL"
# A resident process's runtime API; its lifecycle endpoint is this plus
# "/lifecycle". NYMPH_LIFECYCLE_URL, when set, wins.
ENV_RUNTIME_API = "NYMPH_RUNTIME_API"

SETUP = "setup"        # the run's setup commands are still running
READY = "ready"        # the body runs and no drain has started
DRAINING = "draining"  # flush and exit (or requeue) before deadline()
# nymph's last phase (the grace is over, everything is being ended). Its
# endpoint reads DRAINING then, deadline past; should one send this, a body
# reads it as DRAINING all the same: both mean "flush and go", and phase()
# answers only the three above.
_TERMINATING = "terminating"

# Probes (phase, host_key, info, deadline) must not stall a body that only
# wants to log or branch on the answer.
_PROBE_TIMEOUT = 2.0
_REQUEUE_TIMEOUT = 10.0
# A held wait is asked again after this long without an answer, so a wedged
# server cannot hang the waiter for ever.
_HOLD_TIMEOUT = 300.0
# The pause before asking again after a failed or early-answered wait,
# doubled after each error up to the maximum.
_MIN_PAUSE, _MAX_PAUSE = 0.1, 5.0
_MAX_BODY = 1 << 20  # a view is tiny

# No proxy: urllib would route even 127.0.0.1 through HTTP_PROXY from the
# body's environment, and a proxy must never see the secret URL.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class LifecycleError(Exception):
    """The lifecycle endpoint refused a request or could not be reached.

    ``status`` is the HTTP status of a refusal (409 for a requeue while not
    draining, 403, 404, ...), or None when there was no answer.
    """

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class _BadURL(LifecycleError):
    """The variable is set but names nothing to send HTTP to."""


def _base():
    """The endpoint's URL without a trailing slash, or None outside nymph:
    NYMPH_LIFECYCLE_URL, else NYMPH_RUNTIME_API's /lifecycle."""
    url = os.environ.get(ENV_URL, "").strip().rstrip("/")
    if url:
        return url
    api = os.environ.get(ENV_RUNTIME_API, "").strip().rstrip("/")
    return api + "/lifecycle" if api else None


def _variable():
    """The name of the variable _base() reads, for error messages."""
    return ENV_URL if os.environ.get(ENV_URL, "").strip() else ENV_RUNTIME_API


def _call(url, method, timeout, payload=None):
    """Send one request (payload, when given, as its JSON body) and return
    the JSON object it answers (a view, or a published artifact).

    Raises LifecycleError; its message never holds the URL.
    """
    if not url.startswith(("http://", "https://")):
        raise _BadURL(_variable() + " is not an http URL")
    data = b"" if method == "POST" else None
    headers = {"Accept": "application/json"}
    if payload is not None:
        data = json.dumps(payload).encode("utf-8")
        headers["Content-Type"] = "application/json"
    try:
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        with _opener.open(req, timeout=timeout) as resp:
            body = resp.read(_MAX_BODY)
    except urllib.error.HTTPError as e:
        try:
            message = _error_message(e.read(_MAX_BODY))
        except (OSError, http.client.HTTPException):
            message = ""
        finally:
            e.close()
        text = "the lifecycle endpoint answered %d" % e.code
        raise LifecycleError(text + (": " + message if message else ""), e.code) from None
    except urllib.error.URLError as e:
        # e.reason names at most host and port, never the path.
        raise LifecycleError("the lifecycle endpoint is unreachable: %s" % (e.reason,)) from None
    except (ValueError, http.client.InvalidURL):
        # A malformed URL; the exception's text may quote it.
        raise _BadURL(_variable() + " is not a valid URL") from None
    except (OSError, http.client.HTTPException) as e:
        # Timeouts and resets mid-answer; their text holds no URL.
        raise LifecycleError("the lifecycle endpoint failed: %s" % (e,)) from None
    try:
        view = json.loads(body.decode("utf-8"))
    except ValueError:
        view = None
    if not isinstance(view, dict):
        raise LifecycleError("the lifecycle endpoint answered something other than a JSON object")
    return view


def _error_message(body):
    """The message of an {"error": "..."} body, or ""."""
    try:
        doc = json.loads(body.decode("utf-8"))
    except ValueError:
        return ""
    message = doc.get("error") if isinstance(doc, dict) else None
    return message if isinstance(message, str) else ""


def info():
    """The run's view as a dict (phase, host_key, worker_id, invocation_id,
    attempt, and deadline once draining), or None outside nymph or when the
    endpoint cannot be read within a short timeout."""
    base = _base()
    if base is None:
        return None
    try:
        return _call(base, "GET", _PROBE_TIMEOUT)
    except LifecycleError:
        return None


def _phase_of(view):
    """The phase a view names as a body reads it: SETUP, READY or DRAINING
    ('terminating' reads DRAINING), or None for anything else."""
    value = view.get("phase") if view else None
    if value == _TERMINATING:
        return DRAINING
    return value if value in (SETUP, READY, DRAINING) else None


def phase():
    """'setup', 'ready' or 'draining', and nothing else: nymph's
    'terminating' (the grace is over) reads 'draining'. None outside nymph,
    when the endpoint cannot be read, or when it names a phase this library
    does not know."""
    return _phase_of(info())


def host_key():
    """The worker's host key ('hk1_...'); None when it has none, outside
    nymph, or when the endpoint cannot be read."""
    view = info()
    value = view.get("host_key") if view else None
    return value if isinstance(value, str) and value else None


def deadline():
    """Seconds left in the drain's grace window (0.0 once it has passed), or
    None when not draining, outside nymph, or the endpoint cannot be read."""
    view = info()
    if _phase_of(view) != DRAINING:
        return None
    end = _parse_time(view.get("deadline"))
    if end is None:
        return None
    return max(0.0, end - time.time())


# RFC 3339 as Go writes it: up to nine fractional digits and "Z", which
# datetime.fromisoformat accepts only from Python 3.11.
_RFC3339 = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(\.\d+)?(?:([Zz])|([+-])(\d\d):(\d\d))\Z")


def _parse_time(text):
    """Seconds since the epoch of an RFC 3339 time, or None."""
    m = _RFC3339.match(text) if isinstance(text, str) else None
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    try:
        start = datetime.datetime(year, month, day, hour, minute, min(second, 59),
                                  tzinfo=datetime.timezone.utc)
    except ValueError:
        return None
    offset = 0
    if m.group(9):
        offset = (int(m.group(10)) * 3600 + int(m.group(11)) * 60) * (1 if m.group(9) == "+" else -1)
    return start.timestamp() + float(m.group(7) or 0) - offset


def _permanent(err):
    """Whether asking again cannot help: a bad URL or a 4xx refusal (403 not
    this run's process, 404 gone) other than a timeout or rate limit."""
    if isinstance(err, _BadURL):
        return True
    return err.status is not None and 400 <= err.status < 500 and err.status not in (408, 429)


def wait_draining(timeout=None):
    """Block until the run is draining and return that view dict.

    Returns None when timeout (seconds) passes first, or outside nymph. Asks
    again when the endpoint answers early or fails, pausing briefly; raises
    LifecycleError when it refuses for good (a 4xx such as 403 or 404).
    """
    base = _base()
    if base is None:
        return None
    end = None if timeout is None else time.monotonic() + timeout
    pause = _MIN_PAUSE
    while True:
        hold = _HOLD_TIMEOUT if end is None else min(end - time.monotonic(), _HOLD_TIMEOUT)
        if hold <= 0:
            return None
        try:
            view = _call(base + "?wait=draining", "GET", hold)
        except LifecycleError as e:
            if _permanent(e):
                raise
            delay, pause = pause, min(2 * pause, _MAX_PAUSE)
        else:
            if _phase_of(view) == DRAINING:
                return view
            # Answered early (nymph shutting down, or a phase change short
            # of draining): the short pause keeps a server that never holds
            # from making this spin.
            delay = pause = _MIN_PAUSE
        if end is not None:
            delay = min(delay, max(0.0, end - time.monotonic()))
        time.sleep(delay)


class _Hooks:
    """The on_shutdown hooks and the one thread that waits for the drain."""

    def __init__(self):
        # A Condition: run_now waits on it for the thread running hooks.
        self.lock = threading.Condition()
        self.pending = []       # registered, not yet run
        self.watching = False   # the waiting thread is started
        self.running = False    # a thread is running hooks
        self.drained = False    # the drain was seen

    def add(self, fn):
        with self.lock:
            self.pending.append(fn)
            if self.drained and not self.running:
                self.running = True
                _start(self.run)
            if not self.watching:
                self.watching = True
                _start(self.watch)

    def watch(self):
        try:
            view = wait_draining()
        except LifecycleError:
            return  # refused for good: there is no drain to run hooks for
        if view is None:
            return  # the variable went away
        with self.lock:
            self.drained = True
            if self.running:
                return
            self.running = True
        self.run()

    def run(self):
        """Run pending hooks one at a time, in order, until none is left."""
        while True:
            with self.lock:
                if not self.pending:
                    self.running = False
                    self.lock.notify_all()
                    return
                fn = self.pending.pop(0)
            try:
                fn()
            except BaseException:  # even sys.exit() in a hook must not skip the next
                name = getattr(fn, "__qualname__", repr(fn))
                print("lakeshore.lifecycle: shutdown hook %s failed:" % name, file=sys.stderr)
                traceback.print_exc(file=sys.stderr)


    def run_now(self):
        """Run the pending hooks on the calling thread, as the drain would,
        and return once none is pending or running. A hook that another
        thread is running is waited for, not run again: each hook runs at
        most once, whoever runs it."""
        with self.lock:
            self.drained = True
            while self.running:
                self.lock.wait()
            self.running = True
        self.run()


def _start(target):
    threading.Thread(target=target, name="lakeshore-lifecycle-shutdown", daemon=True).start()


_hooks = _Hooks()


def on_shutdown(fn):
    """Decorator: run fn() when the run starts draining.

    The first registration starts a daemon thread that waits for the drain and
    then runs the hooks one at a time in registration order; they share the
    grace window (see deadline()). An exception in a hook is printed to stderr
    and the next hook still runs. A hook registered after the drain was seen
    runs at once. Outside nymph nothing is registered. Returns fn unchanged.

    The hooks run on a daemon thread: if the main program exits first, they
    stop with it.
    """
    _check_hook(fn, "on_shutdown")
    if _base() is not None:
        _hooks.add(fn)
    return fn


def _check_hook(fn, name):
    if not callable(fn):
        raise TypeError("%s decorates a function: use @lifecycle.%s, without parentheses" % (name, name))


# The setup hooks, in registration order. dreamlake.lakeshore.serve() runs
# them; they register inside nymph and outside it alike, so a body script
# run by hand warms up as it does under nymph.
_host_setup_hooks = []
_run_setup_hooks = []


def on_host_setup(fn):
    """Decorator: serve() runs fn() once per process, before the first
    body it calls (with the other on_host_setup hooks, in registration
    order). The place to load what every invocation the process serves
    shares: a model's weights, a tokenizer. Returns fn unchanged.

    A plain body process serves one invocation, so the hooks run once per
    invocation; a resident process runs them once for all it serves, and
    what they leave in module globals stays for every later body.
    """
    _check_hook(fn, "on_host_setup")
    _host_setup_hooks.append(fn)
    return fn


def on_run_setup(fn):
    """Decorator: serve() runs fn() before every body call, in the
    invocation's run directory (the working directory nymph starts the body
    in, or the workdir a resident process is handed) and with its
    environment, after the on_host_setup hooks; in registration order.
    Returns fn unchanged."""
    _check_hook(fn, "on_run_setup")
    _run_setup_hooks.append(fn)
    return fn


def requeue():
    """Hand this invocation back to the queue instead of recording an outcome.

    Returns True when nymph accepts (it then ends the body: SIGTERM to its
    process group, then SIGKILL, so this is the last thing a shutdown hook
    does), False outside nymph. Raises LifecycleError with the server's
    message when refused (status 409 when the run is not draining) or when
    the endpoint cannot be reached.
    """
    base = _base()
    if base is None:
        return False
    _call(base + "/requeue", "POST", _REQUEUE_TIMEOUT)
    return True
