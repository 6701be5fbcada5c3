"""What the tests' fake loopback servers share: a handler that answers
JSON, and a server on a free loopback port."""

import http.server
import json
import threading


class JSONHandler(http.server.BaseHTTPRequestHandler):
    """A quiet handler whose answer() sends a JSON document (or nothing)."""

    def log_message(self, *args):
        pass

    def answer(self, code, doc=None, headers=()):
        """Answers code with doc as JSON (no body when doc is None) and the
        extra (name, value) headers."""
        data = b"" if doc is None else json.dumps(doc).encode()
        try:
            self.send_response(code)
            for name, value in headers:
                self.send_header(name, value)
            if doc is not None:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass  # the client gave up on a held wait


def start(handler):
    """A ThreadingHTTPServer for handler on a free 127.0.0.1 port, serving
    on a daemon thread. Stop it with shutdown() and server_close()."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


class Fake:
    """A fake server's state: cond guards it and wakes held waits; close()
    sets closing, so held waits end, and stops the server."""

    def __init__(self):
        self.cond = threading.Condition()
        self.closing = False
        self.server = None

    def close(self):
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()
