"""A fault-injecting HTTP proxy in front of the local S3 (and Kinesis) endpoint (moto_server), run as a process of
its own.

    python -m cdc_assets_tests.s3_fault_proxy --upstream http://127.0.0.1:PORT --port P --rules FILE

Requests pass through to the upstream unchanged unless a rule of FILE (JSON, re-read whenever it changes)
matches them. A rule is {"method": "PUT", "path": "regex", "query": "regex", "header": "If-Match",
"target": "regex", "action": ..., "times": N} (all keys but "action" optional; `times` default: every time;
`target` matches the X-Amz-Target header of JSON APIs such as Kinesis, e.g. "PutRecords") with actions:

- `status:500`, `status:503`: an S3 error response of that status (InternalError, ServiceUnavailable);
- `slowdown`: 503 SlowDown, S3's throttling answer;
- `reset`: the connection is closed without an answer (before the request reaches S3);
- `drop_after_forward`: the request reaches S3 and takes effect, but its answer is lost (the connection is
  closed): the client then retries a request that has already landed;
- `delay:S`: the answer comes S seconds late;
- `timeout`: no answer for 120 s;
- `refuse_odd_records`: a Kinesis PutRecords reaches the stream with only its records at even positions (0, 2,
  ...); the answer says the others were refused with ProvisionedThroughputExceededException, as a throttled
  shard answers (moto never throttles). The client must send those again.

Every matched request is appended to FILE + ".log" (method, path, action), so a test can count them.
No existing tool from the registries does this over plain HTTP without a configuration language of its own
(toxiproxy is TCP-level and has no package here), hence this small helper.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

_ERRORS = {500: "InternalError", 503: "ServiceUnavailable"}


class _Rules:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.mtime: float | None = None
        self.rules: list[dict] = []
        self.used: list[int] = []
        self.lock = threading.Lock()

    def match(self, method: str, path: str, query: str, headers: dict[str, str]) -> str | None:
        with self.lock:
            try:
                mtime = self.path.stat().st_mtime_ns
            except FileNotFoundError:
                mtime = None
            if mtime != self.mtime:
                self.mtime = mtime
                self.rules = json.loads(self.path.read_text()) if mtime is not None else []
                self.used = [0] * len(self.rules)
            for i, rule in enumerate(self.rules):
                if rule.get("method") and rule["method"] != method:
                    continue
                if rule.get("path") and not re.search(rule["path"], path):
                    continue
                if rule.get("query") and not re.search(rule["query"], query):
                    continue
                if rule.get("header") and rule["header"].lower() not in headers:
                    continue
                if rule.get("target") and not re.search(rule["target"], headers.get("x-amz-target", "")):
                    continue
                if rule.get("times") is not None and self.used[i] >= int(rule["times"]):
                    continue
                self.used[i] += 1
                with open(f"{self.path}.log", "a") as log:
                    log.write(json.dumps({"method": method, "path": path, "action": rule["action"]}) + "\n")
                return str(rule["action"])
        return None


def _handler(upstream: str, rules: _Rules) -> type[BaseHTTPRequestHandler]:
    target = urlsplit(upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # quiet
            return

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while True:
                    size = int(self.rfile.readline().strip().split(b";")[0], 16)
                    if size == 0:
                        self.rfile.readline()
                        break
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                return b"".join(chunks)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _drop(self) -> None:
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def _error(self, status: int, code: str) -> None:
            body = f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>{code}</Message></Error>".encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _handle(self) -> None:
            path, _, query = self.path.partition("?")
            headers = {k.lower(): v for k, v in self.headers.items()}
            body = self._body()
            action = rules.match(self.command, path, query, headers)
            if action == "reset":
                return self._drop()
            if action == "timeout":
                time.sleep(120)
                return self._drop()
            if action == "slowdown":
                return self._error(503, "SlowDown")
            if action and action.startswith("status:"):
                status = int(action.split(":")[1])
                return self._error(status, _ERRORS.get(status, "InternalError"))
            if action and action.startswith("delay:"):
                time.sleep(float(action.split(":")[1]))
            refused: list[int] = []
            total = 0
            if action == "refuse_odd_records":
                request = json.loads(body)
                total = len(request["Records"])
                refused = list(range(1, total, 2))
                body = json.dumps({**request, "Records": request["Records"][0::2]}).encode()
            forward = {k: v for k, v in self.headers.items() if k.lower() not in ("transfer-encoding", "connection")}
            forward["Content-Length"] = str(len(body))
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
            try:
                conn.request(self.command, self.path, body=body, headers=forward)
                answer = conn.getresponse()
                data = answer.read()
            finally:
                conn.close()
            if refused and answer.status == 200:
                accepted = iter(json.loads(data)["Records"])
                results = [
                    {"ErrorCode": "ProvisionedThroughputExceededException", "ErrorMessage": "Rate exceeded (fault proxy)"}
                    if i in refused
                    else next(accepted)
                    for i in range(total)
                ]
                data = json.dumps({"FailedRecordCount": len(refused), "Records": results}).encode()
            if action == "drop_after_forward":
                return self._drop()
            self.send_response(answer.status)
            for name, value in answer.getheaders():
                if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(name, value)
            # a HEAD answer has no body but the object's length (pyarrow reads a file's size from it)
            length = answer.getheader("Content-Length") if self.command == "HEAD" else None
            self.send_header("Content-Length", length or str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rules", required=True)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), _handler(args.upstream, _Rules(Path(args.rules))))
    server.daemon_threads = True
    print(f"listening on {args.port} (pid {os.getpid()})", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
