"""Issue 45: an incremental sync's cost follows its changes, not its table count, counted rather than timed. The
same kind of change is written once to a few tables and once to many, and each sync's work is counted: the Delta
commits of each layer (one per touched table, none for another) and the statements its source user ran, read from the
server's own per-user statistics (MariaDB's `userstat`), so the count takes in every process of the sync."""

from __future__ import annotations

import gc
import secrets
from pathlib import Path

import pytest

from cdc_assets.core import work_tally
from cdc_assets.core.parallel import for_each_table
from cdc_assets.lake.layout import CHANGES, CURRENT
from cdc_assets.local_source.server import READER_GRANTS
from cdc_assets_tests.conftest import CdcEnv

TABLES = 23
FEW = 3
# Statements of the source user per table touched, beyond what every sync runs whatever it touches: one, the check
# after the apply reading the table's changed keys' rows (its row count is one statement for many tables; it was a
# statement per table too, 2 in all). A regression guard: it must not grow (issue 45 wants a few for many tables).
STATEMENTS_PER_TOUCHED_TABLE = 1
# What a sync may run more, or less, whatever it touches (a retried read, say): far below what one statement more per
# table would add over the TABLES - FEW tables more that the second sync touches (20), so that still fails.
STATEMENTS_NOISE = 5


def _counting_user(cdc: CdcEnv) -> tuple[str, str]:
    """A reader of its own (the reader's grants), whose statements the server counts apart from every other test's:
    its name and URL."""
    user, password = f"cost_{secrets.token_hex(4)}", secrets.token_hex(12)
    with cdc.server.admin_connection() as conn, conn.cursor() as cur:
        cur.execute("SET GLOBAL userstat = ON")
        cur.execute(f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY %s", (password,))
        cur.execute(f"GRANT {READER_GRANTS[cdc.server.flavour]} ON *.* TO '{user}'@'127.0.0.1'")
    return user, f"mysql://{user}:{password}@127.0.0.1:{cdc.server.port}"


def _statements(cdc: CdcEnv, user: str) -> int:
    with cdc.server.admin_connection() as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT SELECT_COMMANDS + UPDATE_COMMANDS + OTHER_COMMANDS FROM information_schema.USER_STATISTICS "
            "WHERE USER = %s",
            (user,),
        )
        row = cur.fetchone()
    return int(row[0]) if row else 0


def _commits(lakehouse: Path, layer: str, database: str) -> dict[str, int]:
    """Each table's Delta commits so far in a layer (its log's JSON entries)."""
    tables = sorted((lakehouse / layer / database).glob("*/_delta_log"))
    return {log.parent.name: len(list(log.glob("*.json"))) for log in tables}


def _sync_counted(cdc: CdcEnv, user: str, touched: list[str]) -> tuple[int, dict[str, dict[str, int]]]:
    """One change written to each of `touched`, then a sync: the statements it ran and each layer's new commits."""
    cdc.execute(*(f"UPDATE {t} SET v = v + 1 WHERE id = 1" for t in touched))
    before = {layer: _commits(cdc.lakehouse_dir, layer, cdc.database) for layer in (CHANGES, CURRENT)}
    statements = _statements(cdc, user)
    assert cdc.sync() == 0
    statements = _statements(cdc, user) - statements
    after = {layer: _commits(cdc.lakehouse_dir, layer, cdc.database) for layer in (CHANGES, CURRENT)}
    new = {layer: {t: n - before[layer].get(t, 0) for t, n in after[layer].items() if n != before[layer].get(t, 0)} for layer in after}
    return statements, new


def test_a_syncs_commits_and_source_statements_grow_with_the_tables_it_touches_not_the_tables_it_has(
    cdc: CdcEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    tables = [f"t{i:02}" for i in range(TABLES)]
    cdc.execute(*(f"CREATE TABLE {t} (id INT PRIMARY KEY, v INT NOT NULL)" for t in tables))
    cdc.execute(*(f"INSERT INTO {t} SELECT seq, 0 FROM {cdc.numbers(20)}" for t in tables))
    user, url = _counting_user(cdc)
    monkeypatch.setenv("CDC_MYSQL_URL", url)
    assert cdc.sync() == 0  # the first sync: every table's snapshot, not counted

    few, few_commits = _sync_counted(cdc, user, tables[:FEW])
    many, many_commits = _sync_counted(cdc, user, tables)
    for layer in (CHANGES, CURRENT):  # one commit per touched table per layer, none for a table not touched
        assert few_commits[layer] == dict.fromkeys(tables[:FEW], 1), (layer, few_commits)
        assert many_commits[layer] == dict.fromkeys(tables, 1), (layer, many_commits)
    assert few > 0, "the server counted no statement of the sync's user"  # else the bound below proves nothing
    bound = (TABLES - FEW) * STATEMENTS_PER_TOUCHED_TABLE + STATEMENTS_NOISE
    assert many - few <= bound, f"{few} statements for {FEW} tables touched, {many} for {TABLES}: more than {bound} more"


def test_the_work_tally_adds_up_threads_and_a_forked_childs_work() -> None:
    """`sync -v`'s work by kind (core.work_tally): every thread's count lands in the process's tally, a difference of
    two snapshots is one sync's own, and a child's tally added to it (the forked child's `work` message) counts once.
    Python's cyclic garbage collections are counted too, as they happen (every thread waits while one runs)."""
    before = work_tally.snapshot()
    for_each_table(range(8), lambda _i: work_tally.count(work_tally.CURRENT_STATE_COMMITS, 0.25))
    child = work_tally.Tally({work_tally.CHANGE_LOG_COMMITS: 8}, {work_tally.CHANGE_LOG_COMMITS: 1.0})
    work_tally.add(child)
    gc.collect()
    own = work_tally.snapshot() - before
    assert own.counts.get(work_tally.GC_PAUSES, 0) >= 1 and own.seconds[work_tally.GC_PAUSES] > 0
    work = work_tally.Tally(
        {k: n for k, n in own.counts.items() if k != work_tally.GC_PAUSES},
        {k: n for k, n in own.seconds.items() if k != work_tally.GC_PAUSES},
    )  # the collections the pool's threads set off are as many as their allocations make
    assert work.counts == {work_tally.CURRENT_STATE_COMMITS: 8, work_tally.CHANGE_LOG_COMMITS: 8}
    assert work.sentence() == "change-log commits 8 (1.0 s), current-state commits 8 (2.0 s)"  # KINDS' order
    assert (work + work).counts[work_tally.CHANGE_LOG_COMMITS] == 16
    assert own.sentence().endswith(f"cyclic garbage collections {own.counts[work_tally.GC_PAUSES]:,} "
                                   f"({own.seconds[work_tally.GC_PAUSES]:.1f} s)")  # last, in KINDS' order
