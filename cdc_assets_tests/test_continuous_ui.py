"""The continuous mode as the UI drives it: under `dagster dev`, the `continuous` job launched through the
webserver's GraphQL API (what the Launchpad's "Launch run" sends) follows the binlog, and "Terminate" (the same
API's `terminateRun`) stops it after a whole cycle: the run ends canceled, the lakehouse's locks are free, and a
`sync` goes on from where it stopped with nothing lost or doubled."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

from cdc_assets.defs.keys import CONTINUOUS_JOB
from cdc_assets.runtime.instance import ensure_dagster_home
from cdc_assets.stages.follow import continuous_holder
from cdc_assets.verification.integrity import duplicate_seqs
from cdc_assets_tests.conftest import CdcEnv, run_cli
from cdc_assets_tests.dagster_dev import dagster_dev, graphql, wait_for
from cdc_assets_tests.test_restart import _write_transactions

LAUNCH = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on InvalidSubsetError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""
TERMINATE = """
mutation Terminate($runId: String!) {
  terminateRun(runId: $runId) {
    __typename
    ... on TerminateRunFailure { message }
    ... on PythonError { message }
  }
}
"""
STATUS = "query Status($runId: ID!) { runOrError(runId: $runId) { ... on Run { status } } }"


def _location_loaded(port: int) -> bool:
    try:
        data = graphql(
            port,
            "{ workspaceOrError { ... on Workspace { locationEntries { name locationOrLoadError { __typename } } } } }",
            {},
        )
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False
    entries = data["workspaceOrError"].get("locationEntries") or []
    return any(e["locationOrLoadError"] and e["locationOrLoadError"]["__typename"] == "RepositoryLocation" for e in entries)


def _equal(cdc: CdcEnv) -> bool:
    diffs = cdc.verify()
    return len(diffs) == 1 and all(d.ok and d.in_flight_keys == 0 and d.compared_rows for d in diffs)


def test_launched_and_terminated_from_the_ui(cdc: CdcEnv, tmp_path: Path, monkeypatch) -> None:
    cdc.execute("CREATE TABLE acct (id INT PRIMARY KEY, owner VARCHAR(40), balance INT)")
    _write_transactions(cdc, transactions=40, rows_each=5)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    ensure_dagster_home()
    with dagster_dev(tmp_path / "dagster-dev.log") as port:
        wait_for("the webserver and its code location", lambda: _location_loaded(port), timeout_s=120, every_s=1)
        selector = {"repositoryLocationName": "cdc_assets", "repositoryName": "__repository__", "jobName": CONTINUOUS_JOB}
        launched = graphql(port, LAUNCH, {"params": {"selector": selector, "runConfigData": {}}})["launchRun"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        run_id = launched["run"]["runId"]

        def status() -> str:
            return graphql(port, STATUS, {"runId": run_id})["runOrError"]["status"]

        # it catches up with what was written before it, then keeps up with what is written while it runs
        wait_for("the continuous run to catch up", lambda: _equal(cdc), timeout_s=120)
        assert status() == "STARTED" and continuous_holder(cdc.lakehouse) is not None
        _write_transactions(cdc, transactions=20, rows_each=5, start=40)
        wait_for("the new writes", lambda: _equal(cdc), timeout_s=60)

        terminated = graphql(port, TERMINATE, {"runId": run_id})["terminateRun"]
        assert terminated["__typename"] == "TerminateRunSuccess", terminated
        wait_for("the run to end canceled", lambda: status() == "CANCELED", timeout_s=60)
        assert continuous_holder(cdc.lakehouse) is None  # its locks are given back

    # a batch sync goes on where the continuous run stopped: nothing lost, nothing applied twice
    _write_transactions(cdc, transactions=10, rows_each=5, start=60)
    synced = run_cli("sync", timeout=300)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert _equal(cdc)
    assert duplicate_seqs(cdc.lakehouse) == {}
