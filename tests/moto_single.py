#!/usr/bin/env python3
"""Run moto's server single-threaded, for race tests on a real emulator.

`moto_server` serves requests on many threads and moto's DynamoDB backend takes
no locks, so concurrent conditional writes are not reliably atomic there. This
script builds the very same WSGI app that `moto_server` builds
(moto.server.main: DomainDispatcherApplication(create_backend_app)) and serves
it with werkzeug's run_simple(..., threaded=False): one request at a time, so
every DynamoDB call is atomic, as on real DynamoDB.

Usage: python3 tests/moto_single.py [-H HOST] [-p PORT]
Exit status 3 means moto (or werkzeug) is not installed.
Used by server/store/storetest.MotoSingleThreaded.
"""

import argparse
import os
import signal
import sys

try:
    from werkzeug.serving import run_simple

    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        create_backend_app,
    )
except ImportError as exc:  # pragma: no cover - depends on the machine
    print(f"moto_single: moto is not installed: {exc}", file=sys.stderr)
    sys.exit(3)


def _exit(signum, frame):  # noqa: ARG001 - signal handler signature
    sys.exit(0)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-H", "--host", default="127.0.0.1", help="address to bind")
    parser.add_argument(
        "-p",
        "--port",
        type=int,
        default=int(os.environ.get("MOTO_PORT", "5000")),
        help="port to bind",
    )
    args = parser.parse_args(argv)

    # moto builds some URLs from MOTO_PORT, as moto_server does.
    os.environ.setdefault("MOTO_PORT", str(args.port))

    signal.signal(signal.SIGINT, _exit)
    signal.signal(signal.SIGTERM, _exit)

    app = DomainDispatcherApplication(create_backend_app)
    app.debug = True  # as moto_server does
    run_simple(
        args.host,
        args.port,
        app,
        threaded=False,
        processes=1,
        use_reloader=False,
    )


if __name__ == "__main__":
    main()
