"""`python -m cdc_assets.local_brokers start [--env] | stop | status`: the local brokers of the demo and `make dev`.

`start --env` prints shell `export` lines that turn both sinks on for the demo's destinations (the AMQP URL holds
the local broker's password: eval it, do not log it)."""

from __future__ import annotations

import argparse
import shlex
import sys

from cdc_assets.local_brokers import destinations, kinesis, rabbitmq


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdc_assets.local_brokers", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start (or reuse) RabbitMQ under .local/rabbitmq and Kinesis under .local/kinesis")
    start.add_argument("--env", action="store_true", help="print export lines for the sinks instead of a summary")
    sub.add_parser("stop", help="stop both")
    sub.add_parser("status", help="say which run, and where")
    args = parser.parse_args(argv)
    if args.command == "start":
        found = destinations.start()
        if args.env:
            for name, value in found.environment().items():
                print(f"export {name}={shlex.quote(value)}")
        else:
            print(
                f"local RabbitMQ on 127.0.0.1:{found.rabbit.port} (exchange {destinations.EXCHANGE}, queue "
                f"{destinations.QUEUE}), local Kinesis on {found.kinesis.endpoint_url} (stream {destinations.STREAM})"
            )
    elif args.command == "stop":
        stopped = destinations.stop()
        print("stopped " + " and ".join(stopped) if stopped else "not running")
    else:
        rabbit, stream = rabbitmq.running(), kinesis.running()
        print(f"RabbitMQ: {'127.0.0.1:' + str(rabbit.port) if rabbit else 'not running'}")
        print(f"Kinesis:  {stream.endpoint_url if stream else 'not running'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
