"""Submit runs to a Lakeshore control plane and read them back.

A run is many jobs on one queue, listed or made from a matrix
(docs/runs.md)::

    from dreamlake import lakeshore as dls

    client = dls.Client()            # LAKESHORE_URL, LAKESHORE_TOKEN
    run = client.submit_run("evals", ["python3", "eval.py", "--model", "{model}"],
                            matrix={"model": ["a", "b"], "epoch": ["1", "2"]})
    run.wait(progress=True)          # the final status once every job ended
    for line in run.results():       # one dict per job, in index order
        print(line["index"], line["state"], line["result"])

Every call is safe to send again, so every call is retried, a bounded number
of times with backoff, when the control plane cannot be reached or answers
5xx or 429: GETs read, a cancel asks again for what is left, and a submit
always carries an idempotency key (a fresh uuid4 unless given), so a retry
whose first try was written but whose answer was lost finds that run
instead of making a second one.

The token goes in the Authorization header and nowhere else: no error,
repr or progress line holds it, and redirects are never followed (urllib
would carry the header to wherever one points). Standard library only,
Python >= 3.8.
"""

import dataclasses
import http.client
import json
import os
import random
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

__all__ = [
    "ENV_URL", "ENV_TOKEN", "NEXT_INDEX_HEADER", "LakeshoreError", "APIError",
    "Client", "Run", "RunStatus",
]

ENV_URL = "LAKESHORE_URL"
ENV_TOKEN = "LAKESHORE_TOKEN"

# NEXT_INDEX_HEADER names the first job index of the next page of a run's
# results; it is absent on the last page.
NEXT_INDEX_HEADER = "Lakeshore-Next-Index"

USER_AGENT = "dreamlake-lakeshore-python/1"

# What a run's defaults may hold besides argv, matrix and jobs (the fields
# of POST /v1/runs).
RUN_DEFAULTS = ("name", "env", "run_config", "timeout_s", "max_attempts", "retry", "idempotency_key")

# A submit of 10,000 jobs is written within API Gateway's 29 s; a request
# gets twice that before it counts as lost (and is retried).
_TIMEOUT = 60.0
_ATTEMPTS = 5        # tries of one call in all
_BACKOFF = 0.5       # seconds before the first retry, doubled after each
_MAX_BACKOFF = 8.0
# A results page stops once it holds 4 MiB, plus the job that crossed it;
# anything else the control plane answers is small.
_MAX_PAGE = 64 << 20
_MAX_VIEW = 4 << 20
_CLIP = 200          # how much of a non-JSON error answer a message quotes
# cancel() calls POST /v1/runs/{id}/cancel at most this often: each call
# works up to 20 s, enough for thousands of jobs.
_MAX_CANCEL_CALLS = 100

# The code an error answer without the control plane's own error body
# carries (a proxy or API Gateway answered), as the Go client reads it.
_CODE_FOR_STATUS = {400: "invalid", 401: "unauthorized", 403: "forbidden", 404: "not_found",
                    405: "not_allowed", 409: "conflict", 410: "worker_gone", 413: "too_large",
                    429: "unavailable", 502: "unavailable", 503: "unavailable", 504: "unavailable"}


class LakeshoreError(Exception):
    """A call to the control plane failed: it could not be reached (after
    its retries), answered something that is not the API's, or the client
    is not configured. ``status`` is the HTTP status when there was one."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class APIError(LakeshoreError):
    """The control plane refused a call: ``code`` and ``message`` are the
    API's ({"error": {"code", "message"}}; "invalid", "not_found",
    "conflict", "unauthorized", ...), ``status`` the HTTP status, and
    ``reason``, when the API gives one, says more than the code."""

    def __init__(self, code, message, status=None, reason=""):
        super().__init__("%s: %s" % (code, message), status)
        self.code = code
        self.message = message
        self.reason = reason


def _retryable(err):
    """Whether asking again may help: no answer at all, or the control
    plane or a gateway in front of it briefly unable (5xx, 429)."""
    return err.status is None or err.status >= 500 or err.status == 429


def _clip(text):
    text = "".join(" " if ord(c) < 0x20 or ord(c) == 0x7F else c for c in text.strip())
    return text if len(text) <= _CLIP else text[:_CLIP] + "\u2026"


def _error_from_answer(status, body):
    """The APIError an error answer stands for: the API's own error body,
    or a code read from the status and a clipped copy of what came."""
    try:
        doc = json.loads(body.decode("utf-8"))
    except ValueError:
        doc = None
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict) and isinstance(err.get("code"), str) and err["code"]:
        message = err.get("message")
        reason = err.get("reason")
        return APIError(err["code"], message if isinstance(message, str) else "", status,
                        reason if isinstance(reason, str) else "")
    text = "HTTP %d" % status
    quoted = _clip(body.decode("utf-8", "replace"))
    code = _CODE_FOR_STATUS.get(status, "internal")
    return APIError(code, text + (": " + quoted if quoted else ""), status)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Refuses every redirect: the control plane answers none, and
    following one would send the bearer token wherever it points."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def _loopback(host):
    return host in ("localhost", "::1") or (host or "").startswith("127.")


@dataclasses.dataclass(frozen=True)
class RunStatus:
    """A run's state and counts, as GET /v1/runs/{id} answers them.

    ``state`` is "submitting", "running" or "done" (every job ended:
    done_count == total); ``counts`` maps "queued", "running", "succeeded",
    "failed" and "cancelled" to how many jobs are so (the properties of the
    same names read them)."""

    run_id: str
    queue: str
    state: str
    total: int
    done_count: int
    counts: dict
    name: str = ""
    created_at: str = ""

    @classmethod
    def from_dict(cls, doc):
        """The status an answer's JSON object holds; fields it does not
        know are ignored, so a newer control plane can add some."""
        if not isinstance(doc, dict):
            raise LakeshoreError("the run's status is not a JSON object")
        counts = doc.get("counts")
        return cls(run_id=str(doc.get("run_id", "")), queue=str(doc.get("queue", "")),
                   state=str(doc.get("state", "")), total=_int(doc.get("total")),
                   done_count=_int(doc.get("done_count")),
                   counts={k: _int(v) for k, v in counts.items()} if isinstance(counts, dict) else {},
                   name=str(doc.get("name") or ""), created_at=str(doc.get("created_at") or ""))

    @property
    def done(self):
        """Whether every job of the run has ended."""
        return self.state == "done"

    @property
    def queued(self):
        return self.counts.get("queued", 0)

    @property
    def running(self):
        return self.counts.get("running", 0)

    @property
    def succeeded(self):
        return self.counts.get("succeeded", 0)

    @property
    def failed(self):
        return self.counts.get("failed", 0)

    @property
    def cancelled(self):
        return self.counts.get("cancelled", 0)


def _int(v):
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


class Client:
    """One control plane, one operator token.

    ``url`` and ``token`` default to the environment's LAKESHORE_URL and
    LAKESHORE_TOKEN (what ``lakeshore dev`` prints). ``timeout`` bounds one
    try of a call in seconds; ``attempts`` is how many tries a call gets in
    all, the first retry after ``backoff`` seconds, doubling (with jitter)."""

    def __init__(self, url=None, token=None, *, timeout=_TIMEOUT, attempts=_ATTEMPTS, backoff=_BACKOFF):
        url = url if url is not None else os.environ.get(ENV_URL, "")
        token = token if token is not None else os.environ.get(ENV_TOKEN, "")
        url = url.strip().rstrip("/")
        if not url:
            raise LakeshoreError("no control plane: pass url= or set %s (lakeshore dev prints it)" % ENV_URL)
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise LakeshoreError("the control plane's URL is not an http(s) URL: %r" % (_clip(url),))
        if not token:
            raise LakeshoreError("no operator token: pass token= or set %s" % ENV_TOKEN)
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        self.url = url
        self._token = token
        self.timeout = timeout
        self.attempts = attempts
        self.backoff = backoff
        # Loopback never goes through a proxy (as Go's ProxyFromEnvironment
        # has it); anything else honours the environment's.
        proxies = urllib.request.ProxyHandler({}) if _loopback(parts.hostname) else urllib.request.ProxyHandler()
        self._opener = urllib.request.build_opener(proxies, _NoRedirect())

    def __repr__(self):
        return "Client(url=%r)" % (self.url,)  # never the token

    def submit_run(self, queue, argv, matrix=None, jobs=None, **defaults):
        """Submit a run on queue and return its Run.

        argv (a list of strings, or None when every listed job has its own)
        and ``defaults`` (name, env, run_config, timeout_s, max_attempts,
        retry, idempotency_key) are every job's; give either ``matrix``
        ({axis: [values]}, "{axis}" in argv taking the job's value) or
        ``jobs`` (a list of dicts whose fields replace the run's).

        The submit always carries an idempotency key (a fresh uuid4 unless
        given; Run.idempotency_key) and is retried with it, so it makes one
        run however many tries it takes. Raises APIError when refused
        ("invalid" for a bad request, "conflict" for a key reused with
        another body)."""
        unknown = sorted(set(defaults) - set(RUN_DEFAULTS))
        if unknown:
            raise TypeError("submit_run() got unknown fields %s (a run's defaults are %s)"
                            % (", ".join(unknown), ", ".join(RUN_DEFAULTS)))
        if isinstance(argv, (str, bytes)):
            raise TypeError("argv is a list of strings, e.g. ['python3', 'eval.py'], not one string")
        body = {"queue": queue}
        if argv is not None:
            body["argv"] = list(argv)
        if matrix is not None:
            body["matrix"] = {name: _axis(name, values) for name, values in dict(matrix).items()}
        if jobs is not None:
            body["jobs"] = list(jobs)
        for k in RUN_DEFAULTS:
            if defaults.get(k) is not None:
                body[k] = defaults[k]
        body["idempotency_key"] = body.get("idempotency_key") or str(uuid.uuid4())
        status, _, answer = self._call("POST", "/v1/runs", body=body)
        doc = _object(answer, "POST /v1/runs")
        run_id = doc.get("run_id")
        if not isinstance(run_id, str) or not run_id:
            raise LakeshoreError("POST /v1/runs answered no run_id", status)
        return Run(self, run_id, _int(doc.get("total")), created=status == 201,
                   idempotency_key=body["idempotency_key"])

    def run(self, run_id):
        """The Run of an existing run id (its total read from the control
        plane): what a later process uses to wait for, read or cancel it."""
        st = self.run_status(run_id)
        return Run(self, st.run_id or run_id, st.total)

    def run_status(self, run_id):
        """The RunStatus of run_id (GET /v1/runs/{id})."""
        _, _, answer = self._call("GET", "/v1/runs/" + _segment(run_id))
        return RunStatus.from_dict(_object(answer, "GET /v1/runs/{id}"))

    def _call(self, method, path, query=None, body=None, limit=_MAX_VIEW):
        """Send one call, retried while that may help, and return its
        status, headers and body. Raises APIError for an error answer and
        LakeshoreError when there was none after every try."""
        data = None if body is None else json.dumps(body).encode("utf-8")
        url = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        what = "%s %s" % (method, path)
        pause = self.backoff
        for attempt in range(1, self.attempts + 1):
            try:
                return self._send(method, url, data, limit, what)
            except LakeshoreError as e:
                if attempt == self.attempts or not _retryable(e):
                    raise
            # Jitter, so clients that failed together do not retry together.
            time.sleep(pause * random.uniform(0.5, 1.0))
            pause = min(2 * pause, _MAX_BACKOFF)
        raise AssertionError("unreachable")

    def _send(self, method, url, data, limit, what):
        headers = {"Accept": "application/json", "Authorization": "Bearer " + self._token,
                   "User-Agent": USER_AGENT}
        if data is not None:
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                answer = resp.read(limit + 1)
                status, got = resp.status, resp.headers
        except urllib.error.HTTPError as e:
            try:
                answer = e.read(64 << 10)
            except (OSError, http.client.HTTPException):
                answer = b""
            finally:
                e.close()
            raise _error_from_answer(e.code, answer) from None
        except urllib.error.URLError as e:
            raise LakeshoreError("%s: the control plane is unreachable: %s" % (what, e.reason)) from None
        except (OSError, http.client.HTTPException) as e:
            # Timeouts and connections dropped before a whole answer; the
            # text of these names no header.
            raise LakeshoreError("%s: no answer: %s" % (what, e or type(e).__name__)) from None
        if len(answer) > limit:
            raise LakeshoreError("%s: the answer is larger than %d bytes" % (what, limit), status)
        return status, got, answer


def _segment(run_id):
    if not isinstance(run_id, str) or not run_id:
        raise ValueError("a run id is a non-empty string")
    return urllib.parse.quote(run_id, safe="")


def _axis(name, values):
    """A matrix axis's values as the API takes them, strings; numbers are
    written as str() writes them."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError("matrix[%r] is a list of values, not %r" % (name, type(values).__name__))
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise TypeError("matrix[%r]: a value is a string or a number, not %r" % (name, type(v).__name__))
        out.append(v if isinstance(v, str) else str(v))
    return out


def _object(answer, what):
    try:
        doc = json.loads(answer.decode("utf-8"))
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise LakeshoreError("%s answered something other than a JSON object" % what)
    return doc


class Run:
    """A submitted run: ``id``, ``total`` (its jobs), ``created`` (False
    when the submit was a replay of an earlier one under the same
    idempotency key) and ``idempotency_key`` (None for a Run read back with
    Client.run)."""

    def __init__(self, client, run_id, total, created=True, idempotency_key=None):
        self._client = client
        self.id = run_id
        self.total = total
        self.created = created
        self.idempotency_key = idempotency_key

    def __repr__(self):
        return "Run(id=%r, total=%d)" % (self.id, self.total)

    def status(self):
        """The run's RunStatus now."""
        return self._client.run_status(self.id)

    def wait(self, progress=False, poll_interval=1.0, timeout=None):
        """Block until every job has ended (state "done") and return that
        RunStatus, asking every poll_interval seconds.

        Raises TimeoutError when timeout (seconds) passes first. With
        progress=True a line "done/total, succeeded, failed" goes to
        stderr: redrawn in place on a terminal, else one line each tenth of
        the run and one at the end."""
        end = None if timeout is None else time.monotonic() + timeout
        shown = _Progress(sys.stderr, self.id) if progress else None
        try:
            while True:
                st = self.status()
                if shown:
                    shown.show(st)
                if st.done:
                    return st
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError("run %s is not done after %gs: %d of %d jobs ended"
                                       % (self.id, timeout, st.done_count, st.total))
                time.sleep(poll_interval if left is None else min(poll_interval, left))
        finally:
            if shown:
                shown.close()

    def results(self, records=False, page_size=None):
        """Iterate over the run's results, one dict per job in index order:
        {"index", "invocation_id", "state", "attempt", "exit_code",
        "result"}, the result that of the attempt that counted.

        With records=True, one dict {"index", "record"} per element of each
        job's JSON-array result instead (a body that writes JSON lines to
        its result file gets one per line). Pages are fetched as the
        iteration reaches them, page_size jobs each (the control plane's
        most, 1,000, by default)."""
        path = "/v1/runs/%s/results" % _segment(self.id)
        start = 0
        while True:
            query = {"from": str(start)}
            if page_size is not None:
                query["limit"] = str(page_size)
            if records:
                query["records"] = "true"
            _, headers, answer = self._client._call("GET", path, query, limit=_MAX_PAGE)
            for n, line in enumerate(answer.split(b"\n")):
                if not line.strip():
                    continue
                try:
                    doc = json.loads(line.decode("utf-8"))
                except ValueError:
                    doc = None
                if not isinstance(doc, dict):
                    raise LakeshoreError("GET %s: line %d of the page from %d is not a JSON object"
                                         % (path, n + 1, start))
                yield doc
            nxt = headers.get(NEXT_INDEX_HEADER)
            if not nxt:
                return
            try:
                following = int(nxt)
            except ValueError:
                following = -1
            # Each page must start further on, so the iteration ends.
            if following <= start:
                raise LakeshoreError("GET %s: %s %r does not follow %d" % (path, NEXT_INDEX_HEADER, _clip(nxt), start))
            start = following

    def cancel(self):
        """Cancel every job of the run not yet ended, asking again while
        the control plane says some remain, and return {"run_id",
        "cancelled", "remaining": 0} with the cancelled count summed.

        Raises LakeshoreError if jobs still remain after 100 calls."""
        path = "/v1/runs/%s/cancel" % _segment(self.id)
        cancelled = 0
        remaining = 0
        for _ in range(_MAX_CANCEL_CALLS):
            _, _, answer = self._client._call("POST", path)
            doc = _object(answer, "POST " + path)
            cancelled += _int(doc.get("cancelled"))
            remaining = _int(doc.get("remaining"))
            if remaining <= 0:
                return {"run_id": self.id, "cancelled": cancelled, "remaining": 0}
        raise LakeshoreError("run %s: %d jobs still to cancel after %d calls; call cancel() again"
                             % (self.id, remaining, _MAX_CANCEL_CALLS))


class _Progress:
    """wait()'s progress line on a stream."""

    def __init__(self, stream, run_id):
        self.stream = stream
        self.run_id = run_id
        try:
            self.tty = bool(stream.isatty())
        except (AttributeError, ValueError, OSError):
            self.tty = False
        self.width = 0       # of the line drawn last (tty)
        self.tenth = -1      # the last tenth written (not a tty)

    def show(self, st):
        text = "run %s: %d/%d done, %d succeeded, %d failed" % (
            self.run_id, st.done_count, st.total, st.succeeded, st.failed)
        if st.cancelled:
            text += ", %d cancelled" % st.cancelled
        if self.tty:
            self.stream.write("\r" + text.ljust(self.width))
            self.width = len(text)
        else:
            tenth = 10 if st.total <= 0 else min(10, st.done_count * 10 // st.total)
            if tenth <= self.tenth:
                return
            self.tenth = tenth
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self):
        if self.tty and self.width:
            self.stream.write("\n")
            self.stream.flush()
