"""`python -m cdc_assets.local_spark cluster start|stop [--workers N] [--port P]` (prints the master's URL) and
`python -m cdc_assets.local_spark connect start|stop [--port P] [--master M]` (the long-lived Spark Connect server
`make dev` uses; prints its sc:// URL)."""

from __future__ import annotations

import argparse
import sys

from cdc_assets.local_spark import cluster, connect_server

SERVERS = {"cluster": cluster.main, "connect": connect_server.main}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdc_assets.local_spark", description=__doc__)
    parser.add_argument("server", choices=sorted(SERVERS), help="the standalone cluster or the Spark Connect server")
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="start|stop and the server's options")
    args = parser.parse_args(argv)
    return SERVERS[args.server](args.arguments)


if __name__ == "__main__":
    sys.exit(main())
