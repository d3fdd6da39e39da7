"""Capture's decoder of MySQL's binary JSON against the route it replaced: python-mysql-replication's `parse_json`
with the decoded values written out by `json.dumps` (the text that route gave was not the server's; the time is
what it cost).

`.venv/bin/python -m benchmarks.json_decoder [DOCUMENTS]` (default 3,000): a dedicated MySQL under
`.local/bench-json` (stopped at the end), a table of application-like documents (orders with line items, events
with properties, nested profiles, one in ten over 64 KB), their binary forms taken from the binlog's row events,
then each decoder over all of them, best of three rounds, in this one process.
"""

from __future__ import annotations

import atexit
import datetime as dt
import json
import random
import shutil
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pymysql
from pymysqlreplication.json_binary import parse_json

from cdc_assets.capture.binlog import events
from cdc_assets.capture.binlog.json_binary import json_text
from cdc_assets.capture.binlog.protocol import dump_events
from cdc_assets.core.settings import MySQLUrl
from cdc_assets.local_source import server as local_server
from cdc_assets.source.server import binlog_end

BASE = Path(".local") / "bench-json"
ROUNDS = 3


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(("alpha", "beta", "gamma", "délta", "ε", "order", "shipped", "🚀", "x")) for _ in range(n))


def _document(rng: random.Random, i: int) -> dict[str, Any] | list[Any]:
    roll = rng.random()
    if roll < 0.4:
        items = [
            {"sku": f"SKU-{rng.randint(1, 99999):05d}", "qty": rng.randint(1, 5), "price": round(rng.uniform(1, 500), 2)}
            for _ in range(rng.randint(1, 10))
        ]
        return {
            "order_id": i, "paid": rng.random() < 0.8, "notes": None if rng.random() < 0.7 else _words(rng, 8),
            "customer": {"id": rng.randint(1, 10**6), "name": _words(rng, 2), "email": f"user{i}@example.com",
                         "tags": [_words(rng, 1) for _ in range(rng.randint(0, 4))]},
            "items": items, "total": round(sum(x["qty"] * x["price"] for x in items), 2),
            "created": f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T10:00:00Z",
        }  # fmt: skip
    if roll < 0.7:
        props: dict[str, Any] = {}
        for k in range(rng.randint(5, 20)):
            props[f"p{k}"] = rng.choice((rng.randint(-(2**40), 2**40), rng.random() * 1000, _words(rng, 3), True, None))
        return {"type": rng.choice(("click", "view", "buy")), "ts": 1_700_000_000_000 + i, "props": props,
                "user_agent": "Mozilla/5.0 (X11; Linux x86_64) " + _words(rng, 10)}  # fmt: skip
    if roll < 0.9:
        return {
            "name": _words(rng, 2), "settings": {"theme": "dark", "langs": ["en", "fr"], "limits": list(range(20))},
            "history": [{"at": rng.randint(0, 10**9), "ok": rng.random() < 0.5} for _ in range(rng.randint(0, 30))],
        }  # fmt: skip
    return [{"n": k, "v": rng.random(), "s": _words(rng, 2)} for k in range(2000)]  # over 64 KB: the large format


def _documents(server: local_server.LocalServer, count: int) -> list[bytes]:
    """The binary forms of `count` documents, as the binlog's row events carry them."""
    rng = random.Random(7)
    with server.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("DROP DATABASE IF EXISTS bench_json")
        cur.execute("CREATE DATABASE bench_json")
        cur.execute("CREATE TABLE bench_json.docs (id INT PRIMARY KEY, j JSON)")
        start = binlog_end(conn)
        for first in range(0, count, 200):
            rows = [(i, json.dumps(_document(rng, i), ensure_ascii=False)) for i in range(first, min(count, first + 200))]
            cur.executemany("INSERT INTO bench_json.docs VALUES (%s, %s)", rows)
    reader = pymysql.connect(**MySQLUrl.parse(server.reader_url()).connection_settings())  # type: ignore[arg-type]
    found: list[bytes] = []
    try:
        for event in dump_events(reader, 4290, start):
            if event.type == events.WRITE_ROWS_V2:
                found += _inserted(event.body)
    finally:
        reader.close()
    return found


def _inserted(body: bytes) -> list[bytes]:
    """The JSON values of a WRITE_ROWS_V2 event of `docs (id INT NOT NULL, j JSON NOT NULL in practice)`."""
    pos = 10 + int.from_bytes(body[8:10], "little") - 2 + 2
    found: list[bytes] = []
    while pos < len(body):
        pos += 5  # null bits, id
        length = int.from_bytes(body[pos : pos + 4], "little")
        found.append(body[pos + 4 : pos + 4 + length])
        pos += 4 + length
    return found


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {(k.decode() if isinstance(k, bytes) else k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _replaced_route(data: bytes) -> str:
    """What capture did before: python-mysql-replication's decoding, written out by json.dumps."""

    def default(item: Any) -> Any:
        if isinstance(item, bytes):
            return item.decode("utf-8", "surrogateescape")
        if isinstance(item, Decimal):
            return float(item)
        if isinstance(item, dt.date | dt.datetime | dt.time):
            return item.isoformat()
        raise TypeError(type(item))

    return json.dumps(_plain(parse_json(data[0], data[1:])), default=default, ensure_ascii=False)


def _best_seconds(decode: Any, documents: list[bytes]) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        began = time.perf_counter()
        for data in documents:
            decode(data)
        best = min(best, time.perf_counter() - began)
    return best


def main(count: int = 3_000) -> dict[str, Any]:
    local_server.stop(BASE)
    shutil.rmtree(BASE, ignore_errors=True)
    server = local_server.start(BASE, flavour=local_server.MYSQL)
    atexit.register(local_server.stop, BASE)
    documents = _documents(server, count)
    figures: dict[str, Any] = {"documents": len(documents)}
    groups = {
        "under 64 KB": [d for d in documents if len(d) < 65536],
        "64 KB and over": [d for d in documents if len(d) >= 65536],
    }
    for group, chosen in groups.items():
        megabytes = sum(len(d) for d in chosen) / 1e6
        ours = _best_seconds(json_text, chosen)
        replaced = _best_seconds(_replaced_route, chosen)
        parse_only = _best_seconds(lambda d: parse_json(d[0], d[1:]), chosen)
        figures |= {
            f"{group}: documents (average KB)": f"{len(chosen)} ({megabytes * 1000 / max(1, len(chosen)):.1f})",
            f"{group}: json_text documents/s": round(len(chosen) / ours),
            f"{group}: json_text MB/s": round(megabytes / ours, 1),
            f"{group}: parse_json + json.dumps (replaced) documents/s": round(len(chosen) / replaced),
            f"{group}: parse_json alone documents/s": round(len(chosen) / parse_only),
            f"{group}: ratio to the replaced route (higher is faster)": round(replaced / ours, 2),
        }
    for name, value in figures.items():
        print(f"{name:>70}: {value}")
    return figures


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3_000)
