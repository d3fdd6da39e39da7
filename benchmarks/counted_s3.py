"""moto_server's S3 with a count of the requests it answered, for the benchmarks that count S3 requests.

    .venv/bin/python -m benchmarks.counted_s3 --port P

The same application `moto_server` serves (moto.server: DomainDispatcherApplication over create_backend_app, through
werkzeug's threaded server and moto's request handler), wrapped so that each request is counted by HTTP method and
by what it reaches (`request_kind`) before moto answers it; `GET /_requests` answers the counts so far as JSON (and is not counted). moto's own request
recorder writes each request with its body from many threads into one file, whose lines interleave.
"""

from __future__ import annotations

import argparse
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple

COUNTS_PATH = "/_requests"


class CountedRequests:
    """A WSGI application in front of `app` that counts the requests it passes on, by method."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app, self.counts, self.lock = app, Counter[str](), threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == COUNTS_PATH:
            with self.lock:
                body = json.dumps(dict(self.counts)).encode()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        kind = request_kind(environ.get("PATH_INFO", ""), environ.get("QUERY_STRING", ""))
        with self.lock:
            self.counts[f"{environ.get('REQUEST_METHOD', '?')} {kind}"] += 1
        return self.app(environ, start_response)


def request_kind(path: str, query: str) -> str:
    """What a request is, or reaches in the lakehouse's layout: a listing, a multi-object delete, a part of a
    multipart upload, a Delta log, the lakehouse's own state (its checkpoint, registry, progress files and locks), a
    raw batch, a data file, or something else."""
    if "list-type" in query or query.startswith("prefix=") or "&prefix=" in query:
        return "listing"
    if query == "delete" or query.startswith("delete"):
        return "batch_delete"
    if "uploads" in query or "uploadId" in query:
        return "multipart"
    if "/_delta_log/" in path:
        return "delta_log"
    if "/_state/" in path:
        return "state"
    if "/raw/" in path:
        return "raw"
    if path.endswith(".parquet"):
        return "data"
    return "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = DomainDispatcherApplication(create_backend_app)
    run_simple("127.0.0.1", args.port, CountedRequests(app), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
