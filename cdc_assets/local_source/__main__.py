"""`python -m cdc_assets.local_source start|stop|status|workload N|live|tpcc|install-mysql`: manage the demo source.

The flavour is CDC_DEMO_SOURCE's (`mariadb`, the default, or `mysql`), under `.local/<flavour>`."""

from __future__ import annotations

import argparse
import sys
import threading

from cdc_assets.core.errors import CdcUserError
from cdc_assets.local_source import mysql_dist, server, tpcc
from cdc_assets.local_source.workload import Workload, load_sample_schema


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdc_assets.local_source", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("start", help="start (or reuse) the dedicated server under .local/<flavour>")
    sub.add_parser("stop", help="stop it")
    sub.add_parser("stop-all", help="stop the dedicated servers of both flavours")
    sub.add_parser("install-mysql", help="unpack Oracle MySQL from Debian's packages under .local/mysql-dist")
    sub.add_parser("status", help="say whether it runs, and on which port")
    work = sub.add_parser("workload", help="load the sample schema and run N transactions")
    work.add_argument("transactions", type=int, nargs="?", default=500)
    work.add_argument("--seed", type=int, default=0)
    live = sub.add_parser("live", help="load the sample schema and keep writing, as the demo does (Ctrl-C stops)")
    live.add_argument("--seconds", type=float, default=None, help="stop after this long (default: never)")
    live.add_argument("--tps", type=float, default=40.0, help="transactions per second, about")
    live.add_argument("--seed", type=int, default=0)
    bench = sub.add_parser(
        "tpcc", help="load the TPC-C-shaped workload's tables and foreign keys (once), then run its transactions"
    )
    bench.add_argument("--database", default="tpcc", help="the database its nine tables are in (default: tpcc)")
    bench.add_argument("--warehouses", type=int, default=1, help="at the load: how many (default: 1)")
    bench.add_argument("--transactions", type=int, default=None, help="stop after this many")
    bench.add_argument("--seconds", type=float, default=None, help="stop after this long (default: Ctrl-C stops)")
    bench.add_argument(
        "--tps", type=float, default=50.0, help="transactions per second, steady (0: as fast as they go)"
    )
    bench.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        flavour = server.demo_flavour()
    except CdcUserError as exc:  # CDC_DEMO_SOURCE (`make ... SOURCE=`) names no server of the demo
        print(exc, file=sys.stderr)
        return 2
    base = server.demo_source_dir(flavour)

    if args.command == "install-mysql":
        prefix = mysql_dist.install()
        print(f"Oracle MySQL {mysql_dist.version(prefix)} under {prefix}")
    elif args.command == "start":
        local = server.start(base, flavour=flavour)
        print(f"local {flavour} with ROW binlog on 127.0.0.1:{local.port} (data in {local.base_dir})")
    elif args.command == "stop":
        print("stopped" if server.stop(base) else "not running")
    elif args.command == "stop-all":
        for each in server.FLAVOURS:
            print(f"{each}: {'stopped' if server.stop(base.parent / each) else 'not running'}")
    elif args.command == "status":
        local = server.running(base)
        print(f"{flavour} running on 127.0.0.1:{local.port}" if local else f"{flavour} not running")
    elif args.command == "workload":
        local = server.start(base, flavour=flavour)
        with local.admin_connection(autocommit=False) as conn:
            load_sample_schema(conn)
            workload = Workload(conn, seed=args.seed)
            workload.seed()
            stats = workload.run(args.transactions)
        print(f"ran {stats.total} transactions: {dict(stats.transactions)}")
    elif args.command == "live":
        local = server.start(base, flavour=flavour)
        stop = threading.Event()
        if args.seconds is not None:
            threading.Timer(args.seconds, stop.set).start()
        with local.admin_connection(autocommit=False) as conn:
            load_sample_schema(conn)
            workload = Workload(conn, seed=args.seed)
            workload.seed()
            print(f"writing about {args.tps:g} transactions/s to 127.0.0.1:{local.port} (Ctrl-C stops)", flush=True)
            try:
                stats = workload.run_until(stop, pause_s=1.0 / args.tps)
            except KeyboardInterrupt:
                stats = workload.stats
        print(f"ran {stats.total} transactions: {dict(stats.transactions)}")
    elif args.command == "tpcc":
        return _tpcc(server.start(base, flavour=flavour), args)
    return 0


def _tpcc(local: server.LocalServer, args: argparse.Namespace) -> int:
    """Load the workload's tables where they are not yet, run it, then check TPC-C's consistency conditions."""
    with local.admin_connection(autocommit=False) as conn:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE IF NOT EXISTS `{args.database}` CHARACTER SET utf8mb4")
        scale = tpcc.loaded_scale(conn, args.database)
        workload = tpcc.Tpcc(conn, args.database, seed=args.seed, scale=scale or tpcc.Scale(warehouses=args.warehouses))
        if scale is None:
            workload.load()
            print(f"loaded {args.database} at {workload.scale}, then its foreign keys", flush=True)
        rate = f"at about {args.tps:g}/s" if args.tps else "as fast as they go"
        print(f"running TPC-C's transactions {rate} on 127.0.0.1:{local.port} (Ctrl-C stops)", flush=True)
        try:
            workload.run(args.transactions, args.seconds, args.tps or None)
        except KeyboardInterrupt:
            conn.rollback()
        stats = workload.stats
        violations = tpcc.consistency_violations(workload.condition_rows())
    print(f"ran {stats.total} transactions: {dict(stats.transactions)}")
    for violation in violations:
        print(f"TPC-C consistency {violation}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
