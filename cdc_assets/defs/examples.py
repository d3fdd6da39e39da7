"""An example of what the lakehouse is for: a downstream asset that depends on one table's asset
(`current/shop/orders` of the demo's sample schema) and reads its current state with pandas through deltalake.

Registered in the code location only when the lakehouse has captured its table. It materializes on its own after
each change of the table's data (a new data version, not the pipeline's confirmations that a quiet table is up to
date) when Dagster's automation sensor runs (`make dev`), or from the UI.
"""

from typing import TYPE_CHECKING, Any

from dagster import (
    AssetExecutionContext,
    AssetsDefinition,
    AssetSelection,
    AutomationCondition,
    AutomationConditionSensorDefinition,
    DefaultSensorStatus,
    Failure,
    MetadataValue,
    Output,
    asset,
)

from cdc_assets.core.names import TableRef
from cdc_assets.defs.keys import UNNAMED, SourceKeys
from cdc_assets.defs.resources import SourceResources
from cdc_assets.lake.delta import read_query
from cdc_assets.lake.layout import CURRENT

if TYPE_CHECKING:
    import pandas as pd  # imported where an example runs: every command loads the definitions, few run an example

ORDERS_TABLE = "shop.orders"  # cdc_assets/local_source/sample_schema.sql
EXAMPLES_GROUP = "examples"
EXAMPLES_SENSOR = "examples_automation_sensor"


def orders_by_status(orders: "pd.DataFrame") -> "pd.DataFrame":
    """Orders and their total per status, statuses sorted: the kind of summary an analyst builds on a table."""
    summary = orders.groupby("status", sort=True).agg(orders=("status", "size"), total=("total", "sum")).reset_index()
    return summary.astype({"orders": "int64"})


def after_data_changed() -> AutomationCondition:
    """Dagster's eager condition, on a new data version of a dependency rather than any new materialization: the
    pipeline also materializes a quiet table's asset to confirm it up to date (its freshness), with the same data
    version, and that must not run the example again."""
    table_changed = AutomationCondition.any_deps_match(
        AutomationCondition.data_version_changed() | AutomationCondition.will_be_requested()
    ).with_label("any_deps_data_changed")
    return AutomationCondition.eager().replace("any_deps_updated", table_changed)


def build_orders_summary(table: str = ORDERS_TABLE, keys: SourceKeys = UNNAMED) -> AssetsDefinition:
    """The example asset over `table` (an orders table with `status` and `total` columns) of the source `keys` names."""

    @asset(
        key=keys.asset_key(EXAMPLES_GROUP, "orders_by_status"),
        group_name=keys.group_of(EXAMPLES_GROUP),
        deps=[keys.table_asset_key(table)],
        required_resource_keys=keys.resource_keys("lakehouse"),
        automation_condition=after_data_changed(),
        kinds={"pandas"},
        description=(
            f"Example downstream asset: the orders of {table} and their total per status, read from its current state "
            "(Delta) with pandas. It depends on that one table's asset, and runs again after the table changes."
        ),
    )
    def orders_summary(context: AssetExecutionContext) -> Output[Any]:
        dt = SourceResources(context, keys).lakehouse.get().open(CURRENT, TableRef.parse(table))
        if dt is None:
            raise Failure(f"{table} has no current state in the lakehouse: run `cdc-lakehouse sync` first.")
        orders = read_query(dt, "SELECT status, total FROM t").to_pandas()
        summary = orders_by_status(orders)
        context.log.info(f"{len(orders)} orders of {table} in {len(summary)} statuses")
        return Output(
            summary,
            metadata={
                "dagster/row_count": len(summary),
                "orders": len(orders),
                "delta_version": dt.version(),
                "preview": MetadataValue.md(f"```\n{summary.to_string(index=False)}\n```"),
            },
        )

    return orders_summary


def example_assets(tables: set[str], keys: SourceKeys = UNNAMED) -> list[AssetsDefinition]:
    """The examples whose table the lakehouse has captured (none before the first sync)."""
    return [build_orders_summary(ORDERS_TABLE, keys)] if ORDERS_TABLE in tables else []


def example_sensors(
    assets: list[AssetsDefinition], keys: SourceKeys = UNNAMED
) -> list[AutomationConditionSensorDefinition]:
    """Dagster's automation sensor over the examples, running from the start (Dagster's default one starts
    stopped), so an example follows its table under `make dev` without a click."""
    if not assets:
        return []
    return [
        AutomationConditionSensorDefinition(
            keys.qualified(EXAMPLES_SENSOR),
            target=AssetSelection.assets(*assets),
            default_status=DefaultSensorStatus.RUNNING,
            description="Materializes the example assets after their table's asset was materialized (eager).",
        )
    ]
