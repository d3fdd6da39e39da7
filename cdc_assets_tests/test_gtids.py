"""GTIDs as capture keeps them: MariaDB's last GTID per domain, MySQL's executed GTID set with tags (MySQL 8.3+), their
binary forms (PREVIOUS_GTIDS events, COM_BINLOG_DUMP_GTID, GTID_TAGGED_LOG_EVENT), and on a real MySQL 9.7: every
change of a tagged transaction carries `uuid:tag:n`, and the checkpoint keeps the executed set there."""

from __future__ import annotations

import dataclasses
import json

import pytest

from cdc_assets.capture.binlog.events import mysql_previous_gtids, mysql_tagged_gtid, varlen_int
from cdc_assets.capture.binlog.protocol import encode_gtid_set
from cdc_assets.cli import main
from cdc_assets.core.gtids import GtidState
from cdc_assets.core.names import TableRef
from cdc_assets.lake.delta import read_query
from cdc_assets.lake.layout import CHANGES
from cdc_assets.lake.state import load_checkpoint, save_checkpoint
from cdc_assets_tests.conftest import CdcEnv
from cdc_assets_tests.stage_runs import capture_and_apply, source_and_current

UUID = "aec33d1e-e943-11f1-ae38-02fc00000001"
OTHER = "0b4ac4ae-e943-11f1-8f2d-02fc00000002"
# The body of a GTID_TAGGED_LOG_EVENT as MySQL 9.7.4 wrote it for `aec33d1e-…:mytag:2` (checksum left out)
TAGGED_EVENT = bytes.fromhex(
    "027200000002b9020d037a3ca5038622c503b9027004f103000000020408060a6d7974616708040a100c7f787569f62461061099041283"
    "120b"
)


def test_mysql_executed_sets_parse_and_print_as_mysql_does() -> None:
    text = f"{UUID}:1-5:11:alpha:1-3:beta:7,\n{OTHER}:1-2"
    state = GtidState.parse(text)
    assert state.text() == f"{OTHER}:1-2,{UUID}:1-5:11:alpha:1-3:beta:7"
    assert GtidState.parse(state.text()) == state and state.tagged
    state.add(f"{UUID}:6")
    state.add(f"{UUID}:ALPHA:4")  # MySQL lowercases tags
    state.add(f"{UUID}:10")
    assert state.text() == f"{OTHER}:1-2,{UUID}:1-6:10-11:alpha:1-4:beta:7"
    assert state.holds(f"{UUID}:alpha:2") and not state.holds(f"{UUID}:alpha:5") and not state.holds(f"{UUID}:8")
    assert GtidState.parse(f"{UUID}:1-3").issubset(state) and not GtidState.parse(f"{UUID}:7").issubset(state)
    assert not GtidState.parse(f"{UUID}:1-5").tagged


def test_mariadb_states_keep_the_last_gtid_of_each_domain() -> None:
    state = GtidState.parse("1-2-5,0-1-18")
    state.add("0-1-19")
    assert state.text() == "0-1-19,1-2-5" and not state.executed and not state.holds("0-1-19")


def test_the_last_gtids_a_checkpoint_once_kept_are_told_from_an_executed_set() -> None:
    assert GtidState.parse(f"{UUID}:47").last_gtids_only()  # what the checkpoint once kept
    assert GtidState.parse(f"{UUID}:47,{OTHER}:3").last_gtids_only()
    assert not GtidState.parse(f"{UUID}:1-47").last_gtids_only()
    assert not GtidState.parse(f"{UUID}:1").last_gtids_only()  # the same either way
    assert not GtidState.parse(f"{UUID}:1-4:t:9").last_gtids_only()


@pytest.mark.parametrize(
    ("encoded", "value"),
    [(b"\x00", 0), (b"\x02", 1), (b"\xfe", 127), (b"\x01\x02", 128), (b"\xb9\x02", 0xAE), (b"\xff" + bytes(8), 0)],
)
def test_mysql_serialization_varlen_integers(encoded: bytes, value: int) -> None:
    assert varlen_int(encoded + b"\x99", 0) == (value, len(encoded))


def test_a_tagged_gtid_event_gives_uuid_tag_and_number() -> None:
    assert mysql_tagged_gtid(TAGGED_EVENT) == f"{UUID}:mytag:2"


@pytest.mark.parametrize("text", [f"{UUID}:1-7", f"{UUID}:1-7:mytag:1,{OTHER}:3-9:12", f"{OTHER}:a:1:b:2-3", ""])
def test_gtid_sets_encode_as_mysql_reads_and_writes_them(text: str) -> None:
    """What COM_BINLOG_DUMP_GTID sends is the encoding a PREVIOUS_GTIDS event holds: each reads back as the other."""
    state = GtidState.parse(text)
    encoded = encode_gtid_set(state)
    assert mysql_previous_gtids(encoded) == state
    assert (encoded[0], encoded[7]) == ((1, 1) if state.tagged else (len(state.executed), 0))


def test_a_previous_gtids_event_of_mysql_9_7_is_read() -> None:
    """The PREVIOUS_GTIDS event MySQL 9.7.4 wrote once a tagged transaction had run: the tagged format."""
    body = bytes.fromhex(
        "0102000000000001aec33d1ee94311f1ae3802fc00000001000100000000000000010000000000000008000000000000"
        "00aec33d1ee94311f1ae3802fc000000010a6d79746167010000000000000001000000000000000200000000000000"
    )
    assert mysql_previous_gtids(body).text() == f"{UUID}:1-7:mytag:1"


def _executed(cdc: CdcEnv) -> GtidState:
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SELECT @@global.gtid_executed")
        return GtidState.parse(str(cur.fetchone()[0]))


def _new_gtid(before: GtidState, after: GtidState) -> str:
    """The one GTID `after` holds and `before` does not (one transaction ran)."""
    found = [
        f"{uuid}:{tag}:{n}" if tag else f"{uuid}:{n}"
        for (uuid, tag), intervals in after.executed.items()
        for first, last in intervals
        for n in range(first, last + 1)
        if not before.holds(f"{uuid}:{tag}:{n}" if tag else f"{uuid}:{n}")
    ]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("source", ["mysql"], indirect=True)
def test_tagged_gtids_reach_every_change_and_the_checkpoint_keeps_the_executed_set(
    cdc: CdcEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    cdc.execute("CREATE TABLE acct (id INT PRIMARY KEY, balance INT)")
    expected: dict[int, str] = {}
    with cdc.admin() as conn, conn.cursor() as cur:
        for key, tag in [(1, ""), (2, "billing"), (3, "billing"), (4, "Audit_2"), (5, "")]:
            before = _executed(cdc)
            cur.execute(f"SET gtid_next = 'AUTOMATIC{':' + tag if tag else ''}'")
            cur.execute("BEGIN")
            cur.execute("INSERT INTO acct VALUES (%s, 0)", (key,))
            cur.execute("UPDATE acct SET balance = balance + 1 WHERE id = %s", (key,))
            cur.execute("COMMIT")
            expected[key] = _new_gtid(before, _executed(cdc))
        cur.execute("SET gtid_next = 'AUTOMATIC'")
    assert expected[2].endswith(":billing:" + expected[2].rsplit(":", 1)[1]) and ":audit_2:" in expected[4]

    capture_and_apply(cdc)

    log = cdc.lakehouse.open(CHANGES, TableRef(cdc.database, "acct"))
    rows = read_query(log, "SELECT id, _cdc_gtid FROM log WHERE id IS NOT NULL", "log").to_pylist()
    assert sorted((r["id"], r["_cdc_gtid"]) for r in rows) == sorted((k, g) for k, g in expected.items() for _ in "iu")
    checkpoint = load_checkpoint(cdc.lakehouse.store)
    assert checkpoint is not None and GtidState.parse(checkpoint.gtid) == _executed(cdc)  # the set, tags and all
    source, current = source_and_current(cdc, "acct")
    assert current.equals(source)

    capsys.readouterr()
    assert main(["status", "--json"]) == 0
    assert GtidState.parse(json.loads(capsys.readouterr().out)["gtid"]) == _executed(cdc)
    assert main(["status"]) == 0
    assert f"GTIDs:       {checkpoint.gtid}\n" in capsys.readouterr().out

    # A checkpoint as it was once written (the last GTID of each source, tags lost) gets its executed set back
    # from the binlog at the next capture.
    old_form = GtidState.parse(checkpoint.gtid)
    old_form.executed = {(u, t): [(i[-1][1], i[-1][1])] for (u, t), i in old_form.executed.items() if not t}
    save_checkpoint(cdc.lakehouse.store, dataclasses.replace(checkpoint, gtid=old_form.text()))
    with cdc.admin() as conn, conn.cursor() as cur:
        cur.execute("SET gtid_next = 'AUTOMATIC:later'")
        cur.execute("INSERT INTO acct VALUES (6, 0)")
        cur.execute("SET gtid_next = 'AUTOMATIC'")
    capture_and_apply(cdc)
    after = load_checkpoint(cdc.lakehouse.store)
    assert after is not None and GtidState.parse(after.gtid) == _executed(cdc)
