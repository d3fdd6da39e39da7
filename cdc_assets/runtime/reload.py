"""A code location's reload, asked of the Dagster webserver through Dagster's public GraphQL client: what makes a
table captured after the definitions loaded appear as assets without a person pressing "Reload definitions".

The per-table assets are built from the MySQLSource component's state (components/mysql_source.py), which a load of
the code location under `dg dev` / `dagster dev` refreshes, and a code server whose state is kept by the code server
itself (LEGACY_CODE_SERVER_SNAPSHOTS) refreshes at every load. A reload is that load."""

from __future__ import annotations

from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError, ReloadRepositoryLocationStatus

from cdc_assets.core.settings import WebserverAddress

RELOAD_TIMEOUT_SECONDS = 120  # a code location with thousands of tables takes a while to load


def reload_code_location(webserver: WebserverAddress, location: str) -> str | None:
    """Ask `webserver` to reload the code location `location`; None once it is loaded again, else why not (the
    webserver does not answer, the location is unknown to it, or it failed to load)."""
    try:
        client = DagsterGraphQLClient(
            webserver.host,
            port_number=webserver.port,
            use_https=webserver.use_https,
            path_prefix=webserver.path_prefix,
            timeout=RELOAD_TIMEOUT_SECONDS,
        )
        info = client.reload_repository_location(location)
    except (DagsterGraphQLClientError, ConnectionError, OSError) as exc:
        return f"the webserver at {webserver} did not reload {location} ({str(exc).splitlines()[0][:200]})"
    if info.status != ReloadRepositoryLocationStatus.SUCCESS:
        return f"the webserver at {webserver} could not reload {location} ({info.failure_type}: {info.message})"
    return None
