"""Following the source to another server by GTID: a failover to a replica, or a move to any server whose binlog
holds the same transactions under its own file names and offsets.

The checkpoint carries, beside its file:offset, the GTID state there and the id of the server it was taken on: on
MariaDB the last GTID of each domain, on MySQL the set of every transaction executed up to it (tagged ones
included). When capture finds itself on a server with another id, the file:offset means nothing there: the GTID
state does. The new server is asked, as a replica would ask it, to stream from right after that state (MariaDB:
`@slave_connect_state`, strict; MySQL: COM_BINLOG_DUMP_GTID with the executed set, as a replica with auto-position
does); the first transaction it sends starts at the position to resume from in its own binlog. The checkpoint moves
there in a new epoch (`BinlogPosition.epoch`), so that server's batches sort after the old one's, with `_cdc_seq`
counting on: nothing is read twice or skipped. On MySQL a transaction after that point whose GTID is in the set (a
replica's binlog may order transactions differently) is skipped by capture, as a replica's auto-skip does.
"""

from __future__ import annotations

import dataclasses

import pymysql

from cdc_assets.capture.binlog.events import MARIADB_GTID, MYSQL_GTID, MYSQL_GTID_TAGGED, ROTATE, rotate_target
from cdc_assets.capture.binlog.protocol import dump_events, dump_events_after
from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.gtids import GtidState
from cdc_assets.core.positions import BinlogPosition
from cdc_assets.core.settings import MySQLUrl
from cdc_assets.lake.state import Checkpoint
from cdc_assets.source import server as source

_TRIES = 5  # a transaction landing between the look at the stream and the look at the binlog's end: look again


def moved(checkpoint: Checkpoint | None, server: source.ServerInfo) -> bool:
    """Whether the checkpoint was taken on another server than the one capture reads now."""
    return checkpoint is not None and checkpoint.server_id is not None and checkpoint.server_id != server.server_id


def require_same_server(checkpoint: Checkpoint | None, server: source.ServerInfo, what: str) -> None:
    """Refuse work that compares the checkpoint with the source's binlog (`what`: verify, a snapshot) while the
    checkpoint's file and offset are another server's: a capture must move it first."""
    if moved(checkpoint, server):
        assert checkpoint is not None
        raise CdcUserError(
            f"The source is server {server.server_id}, not server {checkpoint.server_id} the checkpoint was taken on: "
            f"run `cdc-lakehouse sync` first, so that capture follows it by GTID, then {what}."
        )


def _unfollowable(checkpoint: Checkpoint, server: source.ServerInfo) -> str | None:
    """Why the checkpoint's GTID state cannot be followed on `server`, or None."""
    state = GtidState.parse(checkpoint.gtid)
    if server.flavor == "mariadb" and not state.domains:
        return "no MariaDB GTID position is in the checkpoint"
    if server.flavor == "mysql" and not state.executed:
        return "no MySQL executed GTID set is in the checkpoint"
    if server.flavor == "mysql" and state.last_gtids_only():
        return (
            "the checkpoint holds the last GTID of each source, not the executed GTID set (it was written before "
            "the set was kept, and the set can only be read from the server it was taken on)"
        )
    if state.tagged and not server.has_tagged_gtids:
        return f"the checkpoint's GTIDs carry tags, which MySQL {server.version} does not know (8.3+ does)"
    return None


def rebased(checkpoint: Checkpoint, url: MySQLUrl, server: source.ServerInfo, reader_server_id: int) -> Checkpoint:
    """The checkpoint at the same GTID state, as a position in `server`'s binlog, in the next epoch."""
    where = f"The source at {url.host}:{url.port} is server {server.server_id}, not server {checkpoint.server_id}"
    problem = _unfollowable(checkpoint, server)
    if problem is not None:
        raise CdcUserError(
            f"{where} the checkpoint was taken on, and {problem}: point CDC_MYSQL_URL back at server "
            f"{checkpoint.server_id}, or re-initialise the lakehouse and run `cdc-lakehouse snapshot`."
        )
    assert checkpoint.gtid is not None
    if server.flavor == "mysql":
        position = executed_set_position(url, reader_server_id, GtidState.parse(checkpoint.gtid), where)
    else:
        position = gtid_position(url, reader_server_id, checkpoint.gtid, where)
    return dataclasses.replace(
        checkpoint, position=position.in_epoch(checkpoint.position.epoch + 1), server_id=server.server_id
    )


def gtid_position(url: MySQLUrl, reader_server_id: int, gtid_state: str, where: str) -> BinlogPosition:
    """Where a MariaDB `gtid_state` lies in the server's binlog: the start of the first transaction after it, or the
    binlog's end when none follows it yet (checked with BINLOG_GTID_POS, so no transaction slips in between)."""
    wanted = GtidState.parse(gtid_state).domains
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
            raise _cannot_serve(exc, where, gtid_state) from exc
        finally:
            conn.close()
        here = GtidState.parse(str(row[0]) if row and row[0] else "").domains
        if all(here.get(domain) == gtid for domain, gtid in wanted.items()):
            return end
    raise CdcUserError(f"{where}, and its binlog kept moving while capture looked for {gtid_state}: run it again.")


def executed_set_position(url: MySQLUrl, reader_server_id: int, executed: GtidState, where: str) -> BinlogPosition:
    """Where MySQL's executed set `executed` ends in the server's binlog: the start of the first transaction the
    server's GTID dump sends for it (the first not in the set), or the binlog's end when it sends none (then the
    executed set reported with that end must be within the set, so no transaction slipped in between). The server
    must hold every transaction of the set: one not caught up would write them later, after that point."""
    text = executed.text()
    for _ in range(_TRIES):
        conn = source.connect(url)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT GTID_SUBSET(%s, @@global.gtid_executed)", (text,))
                if not cur.fetchone()[0]:
                    raise CdcUserError(
                        f"{where} the checkpoint was taken on, and it has not executed all of the checkpoint's GTID "
                        f"set {text}: let it catch up with the transactions of server's source if it is a replica, "
                        "or point CDC_MYSQL_URL back at the server the lakehouse came from."
                    )
            log_file = None
            for event in dump_events_after(conn, reader_server_id, executed):
                if event.type == ROTATE:
                    log_file = rotate_target(event.body)[0]
                elif event.type in (MYSQL_GTID, MYSQL_GTID_TAGGED) and log_file is not None and event.log_pos:
                    return BinlogPosition(log_file, event.log_pos - event.size)
            end, here = source.binlog_status(conn)
        except pymysql.err.MySQLError as exc:
            raise _cannot_serve(exc, where, text) from exc
        finally:
            conn.close()
        if GtidState.parse(here).issubset(executed):
            return end
    raise CdcUserError(f"{where}, and its binlog kept moving while capture looked for {text}: run it again.")


def _cannot_serve(exc: pymysql.err.MySQLError, where: str, gtid_state: str | None) -> CdcUserError:
    message = str(exc.args[-1])
    if "anonymous transaction" in message.lower():
        return CdcUserError(
            f"{where} the checkpoint was taken on, and its binlog holds transactions without a GTID (written before "
            "its gtid_mode was ON) where capture must look for the checkpoint's GTID set: purge the binlogs written "
            "before gtid_mode=ON on it (PURGE BINARY LOGS TO the first one written after), or point CDC_MYSQL_URL "
            "back at the server the lakehouse came from."
        )
    return CdcUserError(
        f"{where} the checkpoint was taken on, and it cannot serve the binlog from the checkpoint's GTID "
        f"position {gtid_state} ({message}): let it catch up with server's transactions if it is a "
        "replica, or point CDC_MYSQL_URL back at the server the lakehouse came from."
    )
