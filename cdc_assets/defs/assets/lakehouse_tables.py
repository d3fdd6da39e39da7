"""Every captured table as assets of its own, as Dagster's ingestion integrations (dagster-sling, dagster-dlt) give
them: the source table `mysql/<schema>/<table>` (external, observed by capture), its change log
`changes/<schema>/<table>` and its current state `current/<schema>/<table>`.

The change logs and current states are one `multi_asset` with `can_subset=True` (`lakehouse_tables`): a run
materializes the tables selected, in one step that calls the stages once for all of them (the change-log stage,
then the current-state stage), so three tables picked in the UI are one run that applies exactly those three, and
200 tables due at once are one run, not 200. The step runs the pipeline's one driver (cdc_assets/pipeline/driver.py)
for those tables, as the sync job and the continuous mode do, and records its reports; they and snapshots record
materializations under the same keys.

The specs come from the source's table list, the state the MySQLSource component keeps (`table_list_state`: the
lakehouse's table registry and the source's own tables under its filter, read as the code server loads, and handed to
the runs it launches); a table created since has no asset until the next load; the new-tables sensor applies those
meanwhile (job `apply_new_tables`), recording their materializations under their keys, so none waits for a reload to
be applied. A run of tables whose lakehouse is gone or cannot be read fails with one sentence (`registry_of_run`).
"""

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetIn,
    AssetKey,
    AssetMaterialization,
    AssetOut,
    AssetsDefinition,
    AssetSpec,
    AutomationCondition,
    DataVersion,
    Failure,
    FreshnessPolicy,
    MaterializeResult,
    MetadataValue,
    Nothing,
    get_dagster_logger,
    multi_asset,
)

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.names import TableRef
from cdc_assets.core.parallel import for_each_table
from cdc_assets.core.settings import SourceSettings
from cdc_assets.defs.assets.metadata import applied_figures, changes_figures
from cdc_assets.defs.assets.tables import DATA_VERSION_TAG, table_materializations, table_name
from cdc_assets.defs.keys import TABLES_ASSETS, UNNAMED, SourceKeys
from cdc_assets.defs.resources import SourceResources
from cdc_assets.lake.layout import CHANGES, CURRENT, CURRENT_STAGE
from cdc_assets.lake.locks import run_owner
from cdc_assets.lake.state import TABLES_KEY, known_tables, load_progress, load_registry
from cdc_assets.lake.store import Lakehouse
from cdc_assets.pipeline.driver import CHANGES as CHANGES_STEP
from cdc_assets.pipeline.driver import CURRENT as CURRENT_STEP
from cdc_assets.pipeline.driver import ChangesLogged, CurrentApplied, drive
from cdc_assets.source.server import connect, resolved_source, source_tables
from spark_resources.resources import TransformsResource

SOURCES_GROUP = "sources"
CHANGES_GROUP = "changes"
CURRENT_GROUP = "current"


@dataclass(frozen=True)
class CapturedTable:
    """A table of the source, where its change log and current state live, the seq of the DROP that removed it from
    the source (None while it exists), and whether the lakehouse's registry had it (False: a table of the source that
    capture has not registered yet)."""

    name: str
    location: str
    changes_location: str = ""
    dropped_seq: int | None = None
    captured: bool = True


@dataclass(frozen=True)
class TableOptions:
    """What the definitions give each table's assets: its freshness policy and the automation derived from it
    (None when another mode updates the tables), the owners, and the engine kinds of the lakehouse's assets."""

    freshness: FreshnessPolicy | None = None
    automation: AutomationCondition | None = None
    owners: tuple[str, ...] = ()
    engine_kinds: tuple[str, ...] = ("arrow",)


def captured_tables(house: Lakehouse) -> list[CapturedTable]:
    """Every table the registry knows; a table without current state is read for a DROP (a few reads, not one per
    table: the tables present come from one listing of current/)."""
    present = {str(t) for t in house.tables(CURRENT)}

    def entry(name: str) -> CapturedTable:
        ref = TableRef.parse(name)
        location, changes = house.table_uri(CURRENT, ref), house.table_uri(CHANGES, ref)
        if name in present:
            return CapturedTable(name, location, changes)
        progress = load_progress(house.store, CURRENT_STAGE, name)
        return CapturedTable(name, location, changes, progress.dropped_seq if progress.present is False else None)

    return for_each_table(known_tables(house.store), entry)


def readable_tables(house: Lakehouse) -> list[CapturedTable]:
    """The registry's tables; none when the lakehouse cannot be read now (the pipeline's own assets still load, and
    the next reload lists the tables)."""
    try:
        return captured_tables(house)
    except Exception as exc:  # an unreachable S3 or a corrupt registry must not take the code location down
        get_dagster_logger().warning(f"per-table assets left out: the table registry of {house} could not be read ({exc})")
        return []


def table_list_state(house: Lakehouse, source_tables: Callable[[], list[str]]) -> dict[str, Any]:
    """What the MySQLSource component keeps as its state (JSON): the registry's tables (with their DROPs) and the
    source's own tables under its filter (`source_tables`, read from its information_schema), so a table the source
    has has its assets even before capture registers it. A read that fails (the lakehouse or the source not there
    yet) leaves its tables out with a warning: the definitions still load, and the next load lists them."""
    log = get_dagster_logger()
    entries: dict[str, dict[str, Any]] = {}
    try:
        for t in captured_tables(house):
            entries[t.name] = {"name": t.name, "captured": True, "dropped_seq": t.dropped_seq}
    except Exception as exc:  # an unreachable S3 or a corrupt registry must not take the code location down
        log.warning(f"the table registry of {house} could not be read ({exc}): its tables have no asset until the next load")
    try:
        for name in source_tables():
            entries.setdefault(name, {"name": name, "captured": False, "dropped_seq": None})
    except Exception as exc:  # a source down while the code server loads: the registry's tables still load
        log.warning(f"the source's tables could not be listed ({exc}): only the registry's tables have assets until the next load")
    return {"lakehouse": str(house), "tables": [entries[n] for n in sorted(entries)]}


SOURCE_CONNECT_SECONDS = 5  # a source that does not answer delays the code server's load this long, no more


def source_table_names(source: SourceSettings) -> list[str]:
    """The source's base tables its table filter includes (`schema.table`), read from its information_schema: the
    tables it will deliver, so their assets exist before capture registers them."""
    resolved = resolved_source(source)
    conn = connect(resolved.url, connect_timeout=SOURCE_CONNECT_SECONDS)
    try:
        return [str(t) for t in source_tables(conn, resolved.table_filter)]
    finally:
        conn.close()


def tables_of_state(state: Mapping[str, Any], house: Lakehouse) -> list[CapturedTable]:
    """The tables a `table_list_state` holds, their locations in `house` (the source's lakehouse as now set)."""
    tables = []
    for entry in state.get("tables", []):
        ref = TableRef.parse(entry["name"])
        location, changes = house.table_uri(CURRENT, ref), house.table_uri(CHANGES, ref)
        tables.append(CapturedTable(entry["name"], location, changes, entry.get("dropped_seq"), bool(entry.get("captured", True))))
    return tables


def registry_of_run(house: Lakehouse, captured: set[str]) -> dict[str, Any]:
    """The lakehouse's table registry as a run of per-table assets finds it: a lakehouse that cannot be read, or
    that lost the registry of the tables the definitions were built from (`captured`: moved or removed since), fails
    the run with one sentence naming the cause and the fix, never a framework error."""
    try:
        registry = load_registry(house.store)
    except CdcUserError:
        raise
    except Exception as exc:  # a directory the run may not read, a store that does not answer
        raise CdcUserError(
            f"The lakehouse {house} cannot be read ({type(exc).__name__}: {exc}): make it readable to the runs of "
            "the code location (CDC_LAKEHOUSE, or the component's `lakehouse`), then run again."
        ) from exc
    if captured and not registry:
        raise CdcUserError(
            f"The lakehouse {house} has lost its table registry ({TABLES_KEY}), which listed this run's tables when "
            "the definitions loaded: it was moved or removed. Point the source's lakehouse (CDC_LAKEHOUSE, or the "
            "component's `lakehouse`) at where it is now, or reload the definitions to begin a new lakehouse there."
        )
    return registry


def source_spec(table: CapturedTable, owners: tuple[str, ...], keys: SourceKeys = UNNAMED) -> AssetSpec:
    return AssetSpec(
        key=keys.source_asset_key(table.name),
        group_name=keys.group_of(SOURCES_GROUP),
        kinds={"mysql"},
        owners=list(owners),
        description=(
            f"The source table `{table.name}` on the MySQL or MariaDB server. External: the pipeline reads it from the "
            "binlog, never writes it; each capture that reads a change of it records an observation with the binlog "
            "position it has read up to."
        ),
        metadata={"source_table": table.name},
    )


def changes_spec(table: CapturedTable, options: TableOptions, keys: SourceKeys = UNNAMED) -> AssetSpec:
    return AssetSpec(
        key=keys.changes_asset_key(table.name),
        group_name=keys.group_of(CHANGES_GROUP),
        deps=[keys.source_asset_key(table.name), keys.raw_asset],
        kinds={"delta", *options.engine_kinds},
        owners=list(options.owners),
        automation_condition=options.automation,
        skippable=True,
        description=(
            f"The change log of `{table.name}` (Delta): one row per row change with `_cdc_op`, `_cdc_seq`, "
            "`_cdc_commit_ts`, `_cdc_gtid`, `_cdc_batch` and the before-image, from every raw batch it has not "
            "taken in yet. Materialized with the table's current state."
        ),
        metadata={"dagster/table_name": f"{CHANGES}.{table.name}", "source_table": table.name, "delta_location": MetadataValue.path(table.changes_location)},
    )


def current_spec(table: CapturedTable, options: TableOptions, keys: SourceKeys = UNNAMED) -> AssetSpec:
    dropped = table.dropped_seq is not None
    description = (
        f"The current state of `{table.name}` (Delta): one row per source row, its columns plus `_cdc_seq` and "
        "`_cdc_commit_ts`, kept up to date from the change log. Materializing it takes in the raw batches captured "
        "so far (its change log too) and applies them."
    )
    if not table.captured:
        description += " Not in the lakehouse yet: capture registers it with its first change, or a snapshot loads it."
    if dropped:
        description = f"DROPPED: `{table.name}` was dropped from the source (`_cdc_seq` {table.dropped_seq}); its current state is gone. " + description
    return AssetSpec(
        key=keys.table_asset_key(table.name),
        group_name=keys.group_of(CURRENT_GROUP),
        deps=[keys.changes_asset_key(table.name)],
        kinds={"delta", *options.engine_kinds},
        owners=list(options.owners),
        automation_condition=options.automation,
        freshness_policy=options.freshness,
        skippable=True,
        description=description,
        metadata={
            "dagster/table_name": table_name(table.name),
            "source_table": table.name,
            "delta_location": MetadataValue.path(table.location),
            "dropped": dropped,
            **({"dropped_seq": table.dropped_seq} if dropped else {}),
        },
    )


def build_table_assets(
    tables: list[CapturedTable], options_for: Any, keys: SourceKeys = UNNAMED
) -> list[AssetSpec | AssetsDefinition]:
    """The source specs and the one subsettable multi-asset over every table's change log and current state, under
    the keys of the source `keys` names; `options_for(table name)` gives each table's TableOptions."""
    if not tables:
        return []
    options = {t.name: options_for(t.name) for t in tables}
    captured = {t.name for t in tables if t.captured}  # the registry had them when the definitions were built
    by_key: dict[AssetKey, str] = {}
    outs: dict[str, AssetOut] = {}
    ins: dict[str, AssetIn] = {"raw_batches": AssetIn(keys.raw_asset, dagster_type=Nothing)}
    deps: dict[str, set[AssetKey]] = {}
    # inputs and outputs named by position: Dagster's names from keys would hold a segment such as `a~20b`,
    # which is not a valid Dagster name
    for i, t in enumerate(tables):
        changes, current = changes_spec(t, options[t.name], keys), current_spec(t, options[t.name], keys)
        by_key[changes.key] = by_key[current.key] = t.name
        for name, spec in ((f"changes_{i}", changes), (f"current_{i}", current)):
            outs[name] = AssetOut.from_spec(spec.replace_attributes(deps=[]), dagster_type=Nothing, is_required=False)
            deps[name] = {dep.asset_key for dep in spec.deps}
        ins[f"source_{i}"] = AssetIn(keys.source_asset_key(t.name), dagster_type=Nothing)

    @multi_asset(
        name=keys.op(TABLES_ASSETS),
        outs=outs,
        ins=ins,
        internal_asset_deps=deps,
        can_subset=True,
        required_resource_keys=keys.resource_keys("lakehouse", "transforms"),
        description=(
            "Takes the selected tables' new raw batches into their change logs, checks them, and applies them to their "
            "current state: one step for every table selected, however many."
        ),
    )
    def lakehouse_tables(context: AssetExecutionContext) -> Iterator[MaterializeResult]:
        used = SourceResources(context, keys)
        house = used.lakehouse.get()
        selected = context.selected_asset_keys
        registry = registry_of_run(house, {by_key[k] for k in selected} & captured)
        # a table of the source that capture has not registered yet has nothing to apply: none of its keys is yielded
        current = sorted({by_key[k] for k in selected if keys.is_current(k)} & set(registry))
        tables = sorted(({by_key[k] for k in selected} | set(current)) & set(registry))
        if tables:
            yield from apply_tables(context, house, used.transforms, tables, current, selected, keys)

    return [*(source_spec(t, options[t.name].owners, keys) for t in tables), lakehouse_tables]


def apply_tables(
    context: AssetExecutionContext,
    house: Lakehouse,
    transforms: TransformsResource,
    tables: list[str],
    current: list[str],
    selected: Any,
    keys: SourceKeys,
) -> Iterator[MaterializeResult]:
    """The pipeline's change logs of `tables`, their seqs checked (a duplicate stops the run), then the current state
    of `current` (pipeline/driver.py), recorded: a materialization of each key selected, and an event of each other
    key the run wrote (the change log of a table selected by its current state alone, a rename's other side)."""
    steps = (CHANGES_STEP, CURRENT_STEP) if current else (CHANGES_STEP,)
    owner = run_owner(context.run.run_id)
    for report in drive(
        None, house, owner=owner, steps=steps, tables=tables, current_tables=current, transforms=transforms.for_changes, log=context.log
    ):
        if isinstance(report, ChangesLogged):
            yield from _changes_recorded(context, report, selected, keys)
        elif isinstance(report, CurrentApplied):
            yield from _current_recorded(context, house, report, selected, keys)


def _changes_recorded(
    context: AssetExecutionContext, logged: ChangesLogged, selected: Any, keys: SourceKeys
) -> Iterator[MaterializeResult]:
    """Each change log's materialization; a duplicate seq fails change_log_seq_unique, which blocks current state."""
    for table in logged.tables:
        key = keys.changes_asset_key(table)
        metadata = changes_figures(logged.changes, table)
        if key in selected:
            yield MaterializeResult(asset_key=key, metadata=metadata)
        else:
            context.log_event(AssetMaterialization(key, metadata=metadata))
    if logged.duplicates:
        raise Failure(
            description="change_log_seq_unique failed, current state not applied: "
            + ", ".join(f"{t}: {n} duplicate changes" for t, n in logged.duplicates.items())
        )


def _current_recorded(
    context: AssetExecutionContext, house: Lakehouse, applied: CurrentApplied, selected: Any, keys: SourceKeys
) -> Iterator[MaterializeResult]:
    """Each applied table's own asset, with the facts the driver read of it."""
    report = applied.current
    own = table_materializations(house, applied_figures(report.tables, report.applied), applied.facts, keys=keys)
    for table, event in own.items():
        key = keys.table_asset_key(table)
        if key in selected:
            version = (event.tags or {}).get(DATA_VERSION_TAG)
            yield MaterializeResult(
                asset_key=key,
                metadata=dict(event.metadata),
                data_version=DataVersion(version) if version else None,
            )
        else:  # a rename's other side
            context.log_event(event)
