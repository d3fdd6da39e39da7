"""Following the source to another server by GTID: a failover to a replica, or a move to any server whose binlog
holds the same transactions under its own file names and offsets.

The checkpoint carries, beside its file:offset, the GTID state there (the last GTID of each domain) and the id of
the server it was taken on. When capture finds itself on a server with another id, the file:offset means nothing
there: the GTID state does. The new server is asked, as a MariaDB replica would (`@slave_connect_state`, strict), to
stream from right after that state; the first transaction it sends starts at the position to resume from in its
own binlog. The checkpoint moves there in a new epoch (`BinlogPosition.epoch`), so that server's batches sort after
the old one's, with `_cdc_seq` counting on: nothing is read twice or skipped.
"""

from __future__ import annotations

import dataclasses

import pymysql

from cdc_assets.capture.batches import parse_gtid_state
from cdc_assets.capture.binlog.events import MARIADB_GTID, ROTATE, rotate_target
from cdc_assets.capture.binlog.protocol import dump_events
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.positions import BinlogPosition
from cdc_assets.core.settings import MySQLUrl
from cdc_assets.lake.state import Checkpoint
from cdc_assets.source import server as source

_TRIES = 5  # a transaction landing between the look at the stream and the look at the binlog's end: look again


def moved(checkpoint: Checkpoint | None, server: source.ServerInfo) -> bool:
    """Whether the checkpoint was taken on another server than the one capture reads now."""
    return checkpoint is not None and checkpoint.server_id is not None and checkpoint.server_id != server.server_id


def rebased(checkpoint: Checkpoint, url: MySQLUrl, server: source.ServerInfo, reader_server_id: int) -> Checkpoint:
    """The checkpoint at the same GTID state, as a position in `server`'s binlog, in the next epoch."""
    where = f"The source at {url.host}:{url.port} is server {server.server_id}, not server {checkpoint.server_id}"
    if server.flavor != "mariadb" or not checkpoint.gtid:
        raise CdcUserError(
            f"{where} the checkpoint was taken on, and {'no MariaDB GTID position is in the checkpoint' if server.flavor == 'mariadb' else 'following a MySQL failover by GTID is not supported'}"
            f": point CDC_MYSQL_URL back at server {checkpoint.server_id}, or re-initialise the lakehouse and run "
            "`cdc-lakehouse snapshot`."
        )
    position = gtid_position(url, reader_server_id, checkpoint.gtid, where)
    return dataclasses.replace(
        checkpoint, position=position.in_epoch(checkpoint.position.epoch + 1), server_id=server.server_id
    )


def gtid_position(url: MySQLUrl, reader_server_id: int, gtid_state: str, where: str) -> BinlogPosition:
    """Where `gtid_state` lies in the server's binlog: the start of the first transaction after it, or the
    binlog's end when none follows it yet (checked with BINLOG_GTID_POS, so no transaction slips in between)."""
    wanted = parse_gtid_state(gtid_state)
    for _ in range(_TRIES):
        conn = source.connect(url)
        try:
            log_file = None
            for event in dump_events(conn, reader_server_id, None, gtid_state):
                if event.type == ROTATE:
                    log_file = rotate_target(event.body)[0]
                elif event.type == MARIADB_GTID and log_file is not None and event.log_pos:
                    return BinlogPosition(log_file, event.log_pos - event.size)
            end = source.binlog_end(conn)
            with conn.cursor() as cur:
                cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (end.log_file, end.log_pos))
                row = cur.fetchone()
        except pymysql.err.MySQLError as exc:
            raise CdcUserError(
                f"{where} the checkpoint was taken on, and it cannot serve the binlog from the checkpoint's GTID "
                f"position {gtid_state} ({exc.args[-1]}): let it catch up with server's transactions if it is a "
                "replica, or point CDC_MYSQL_URL back at the server the lakehouse came from."
            ) from exc
        finally:
            conn.close()
        here = parse_gtid_state(str(row[0]) if row and row[0] else "")
        if all(here.get(domain) == gtid for domain, gtid in wanted.items()):
            return end
    raise CdcUserError(f"{where}, and its binlog kept moving while capture looked for {gtid_state}: run it again.")
