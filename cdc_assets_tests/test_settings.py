"""Configuration parsing: URLs, table filters and their error sentences."""

import pytest

from cdc_assets.core.errors import CdcUserError
from cdc_assets.core.settings import MySQLUrl, TableFilter


def test_url_never_shows_its_password() -> None:
    url = MySQLUrl.parse("mysql://reader:s%40cret@db.example:3307")
    assert (url.host, url.port, url.user, url.password) == ("db.example", 3307, "reader", "s@cret")
    assert "s@cret" not in repr(url) and "s@cret" not in str(url)
    assert MySQLUrl.parse("mysql://reader@localhost").port == 3306


@pytest.mark.parametrize("bad", ["", "localhost:3306", "postgres://u:p@h:1", "mysql://u:p@h:notaport"])
def test_bad_urls_name_the_fix(bad: str) -> None:
    with pytest.raises(CdcUserError, match="mysql://user:password@host:port"):
        MySQLUrl.parse(bad)


def test_table_filter() -> None:
    default = TableFilter.parse(None, None)
    assert default.matches("shop", "orders")
    assert not default.matches("mysql", "user")
    shop = TableFilter.parse("shop.*, inventory.stock_*", "shop.tmp_*")
    assert shop.matches("shop", "orders") and shop.matches("inventory", "stock_moves")
    assert not shop.matches("shop", "tmp_1") and not shop.matches("inventory", "warehouses")
    assert shop.matches_schema("inventory") and not shop.matches_schema("other")
    with pytest.raises(CdcUserError, match="schema.table"):
        TableFilter.parse("orders", None)
