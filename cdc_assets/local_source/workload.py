"""Sample schema and a workload generator for the local source.

The workload mixes what a CDC pipeline must get right: multi-row inserts, multi-row updates,
deletes, primary-key-changing updates (single and composite keys) and multi-table transactions,
with utf8mb4 text (emoji included), decimals, DATETIME(6), TIMESTAMP, BLOB and NULLs.
"""

from __future__ import annotations

import datetime as dt
import random
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources

import pymysql

FIRST_ORDER_ID = 10_000_000_000_000_000_000  # above the signed BIGINT range: exercises BIGINT UNSIGNED
NAMES = ["Zoë", "Łukasz", "Ngozi", "Søren", "美咲", "Ahmed", "Chloé", "Dmitri", "Aroha", "Inés"]
EMOJI = ["🚀", "🐘", "🌶️", "✅", "👩🏽‍💻", "🎉", ""]
CITIES = ["Zürich", "São Paulo", "Kraków", "Reykjavík", "東京", None]


def load_sample_schema(conn: pymysql.Connection, shop: str = "shop", inventory: str = "inventory") -> None:
    """Create the sample databases and tables (idempotent), under the given database names."""
    sql = resources.files("cdc_assets.local_source").joinpath("sample_schema.sql").read_text()
    sql = sql.replace("shop", shop).replace("inventory", inventory)
    statements = [s.strip() for s in sql.split(";")]
    with conn.cursor() as cur:
        for statement in statements:
            body = "\n".join(line for line in statement.splitlines() if not line.startswith("--")).strip()
            if body:
                cur.execute(body)
    conn.commit()


_SKU_NUMBERS = re.compile(r"^SKU-\d+-(\d+)|-r(\d+)")  # SKU-<random>-<n>, and -r<n> after each rename


def _highest_sku_number(cur: pymysql.cursors.Cursor, shop: str) -> int:
    """The highest number a workload gave a product's SKU (as created or renamed): a new workload on a source that
    has them numbers its SKUs after it, so a seeded generator never writes a SKU that is there (a duplicate key)."""
    cur.execute(f"SELECT sku FROM {shop}.products")
    numbers = [int(n) for (sku,) in cur.fetchall() for match in _SKU_NUMBERS.findall(sku) for n in match if n]
    return max(numbers, default=0)


@dataclass
class WorkloadStats:
    """What the workload did, by kind of transaction."""

    transactions: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.transactions.values())


class Workload:
    """Deterministic (seeded) generator of realistic shop transactions."""

    def __init__(
        self, conn: pymysql.Connection, seed: int = 0, shop: str = "shop", inventory: str = "inventory"
    ) -> None:
        self.conn = conn
        self.shop = shop
        self.inventory = inventory
        self.rng = random.Random(seed)
        self.stats = WorkloadStats()
        self._sku_counter = 0
        self._numbered = False  # whether the counter starts after the SKUs the source already holds

    # -- seed data -------------------------------------------------------------------------------------
    def seed(self, customers: int = 50, products: int = 30) -> None:
        """The first rows; on a source seeded before (an earlier `workload`, `live` or demo), more rows of the same
        kinds, numbered after the ones there."""
        with self.conn.cursor() as cur:
            cur.execute(f"SELECT COUNT(*) FROM {self.inventory}.warehouses")
            if cur.fetchone()[0] == 0:
                cur.executemany(
                    f"INSERT INTO {self.inventory}.warehouses (code, name, opens_at, founded) VALUES (%s,%s,%s,%s)",
                    [
                        ("ZRH", "Zürich Nord 🏔️", "07:30:00", 1998),
                        ("GRU", "São Paulo Leste", "06:00:00", 2011),
                        ("NRT", "成田 倉庫", "22:15:00", None),
                    ],
                )
            self._insert_products(cur, products)
            self._insert_customers(cur, customers)
        self.conn.commit()
        self.stats.transactions["seed"] += 1

    def _number_skus(self, cur: pymysql.cursors.Cursor) -> None:
        """Before this workload's first new SKU: number them after the highest the source holds."""
        if not self._numbered:
            self._sku_counter = max(self._sku_counter, _highest_sku_number(cur, self.shop))
            self._numbered = True

    def _insert_products(self, cur: pymysql.cursors.Cursor, n: int) -> None:
        self._number_skus(cur)
        rows = []
        for _ in range(n):
            self._sku_counter += 1
            sku = f"SKU-{self.rng.randint(0, 10**9):09d}-{self._sku_counter}"
            thumb = None if self.rng.random() < 0.3 else self.rng.randbytes(self.rng.randint(0, 64))
            rows.append(
                (
                    sku,
                    f"Product {self._sku_counter} {self.rng.choice(EMOJI)}",
                    f"{self.rng.randint(100, 99999) / 100:.2f}",
                    self.rng.randint(0, 4_000_000_000),
                    None if self.rng.random() < 0.2 else self.rng.uniform(0.01, 250.0),
                    thumb,
                )
            )
        cur.executemany(
            f"INSERT INTO {self.shop}.products (sku, title, price, stock, weight_kg, thumbnail) VALUES (%s,%s,%s,%s,%s,%s)",
            rows,
        )

    def _insert_customers(self, cur: pymysql.cursors.Cursor, n: int) -> None:
        rows = []
        for _ in range(n):
            name = f"{self.rng.choice(NAMES)} {self.rng.choice(EMOJI)}".strip()
            email = None if self.rng.random() < 0.2 else f"user{self.rng.randint(1, 10**6)}@example.org"
            created = dt.datetime(2020, 1, 1) + dt.timedelta(
                seconds=self.rng.randint(0, 10**8), microseconds=self.rng.randint(0, 999_999)
            )
            rows.append((name, email, self.rng.choice(CITIES), self.rng.randint(-128, 127), created))
        cur.executemany(
            f"INSERT INTO {self.shop}.customers (name, email, city, loyalty, created_at) VALUES (%s,%s,%s,%s,%s)",
            rows,
        )

    # -- one transaction ---------------------------------------------------------------------------------
    def step(self) -> str:
        """Run one randomly chosen transaction and return its kind."""
        kinds = [
            (self.place_order, 30),
            (self.new_customers, 10),
            (self.new_products, 5),
            (self.reprice, 10),
            (self.ship_orders, 10),
            (self.cancel_order, 8),
            (self.rename_sku, 5),
            (self.renumber_lines, 5),
            (self.delete_customers, 4),
            (self.touch_warehouse, 3),
        ]
        action = self.rng.choices([k for k, _ in kinds], weights=[w for _, w in kinds])[0]
        with self.conn.cursor() as cur:
            action(cur)
        self.conn.commit()
        self.stats.transactions[action.__name__] += 1
        return action.__name__

    def run(self, transactions: int) -> WorkloadStats:
        for _ in range(transactions):
            self.step()
        return self.stats

    def run_until(self, stop: threading.Event, pause_s: float = 0.01) -> WorkloadStats:
        """Keep writing until `stop` is set: the demo's live workload."""
        while not stop.is_set():
            self.step()
            stop.wait(pause_s)
        return self.stats

    def _pick(self, cur: pymysql.cursors.Cursor, sql: str) -> list[tuple]:
        cur.execute(sql)
        rows = list(cur.fetchall())
        self.rng.shuffle(rows)
        return rows

    def new_customers(self, cur: pymysql.cursors.Cursor) -> None:
        self._insert_customers(cur, self.rng.randint(1, 20))

    def new_products(self, cur: pymysql.cursors.Cursor) -> None:
        self._insert_products(cur, self.rng.randint(1, 5))

    def place_order(self, cur: pymysql.cursors.Cursor) -> None:
        """A multi-table transaction: order, its lines, stock, stock moves and the customer's balance."""
        customers = self._pick(cur, f"SELECT id FROM {self.shop}.customers ORDER BY id DESC LIMIT 200")
        products = self._pick(cur, f"SELECT sku, price FROM {self.shop}.products ORDER BY sku LIMIT 500")
        if not customers or not products:
            return
        cur.execute(f"SELECT COALESCE(MAX(id), %s) + 1 FROM {self.shop}.orders", (FIRST_ORDER_ID,))
        order_id = int(cur.fetchone()[0])
        customer_id = customers[0][0]
        placed_on = dt.date(2024, 1, 1) + dt.timedelta(days=self.rng.randint(0, 700))
        note = self.rng.choice([None, "", "leave at the door 🚪", "Geschenk: bitte einpacken"])
        cur.execute(
            f"INSERT INTO {self.shop}.orders (id, customer_id, placed_on, status, note) VALUES (%s,%s,%s,'new',%s)",
            (order_id, customer_id, placed_on, note),
        )
        total = 0.0
        lines = products[: self.rng.randint(1, 5)]
        items = []
        for line_no, (sku, price) in enumerate(lines, start=1):
            qty = self.rng.randint(1, 9)
            total += float(price) * qty
            items.append((order_id, line_no, sku, qty, price))
        cur.executemany(
            f"INSERT INTO {self.shop}.order_items (order_id, line_no, sku, quantity, unit_price) VALUES (%s,%s,%s,%s,%s)",
            items,
        )
        moved_at = dt.datetime(2024, 6, 1) + dt.timedelta(microseconds=self.rng.randint(0, 10**13))
        for _, _, sku, qty, _ in items:
            cur.execute(
                f"UPDATE {self.shop}.products SET stock = GREATEST(stock, %s) - %s WHERE sku = %s", (qty, qty, sku)
            )
            cur.execute(
                f"INSERT IGNORE INTO {self.inventory}.stock_moves (warehouse, sku, moved_at, delta, reason) "
                "VALUES (%s,%s,%s,%s,%s)",
                (self.rng.choice(["ZRH", "GRU", "NRT"]), sku, moved_at, -qty, f"order {order_id}"),
            )
        cur.execute(
            f"UPDATE {self.shop}.orders SET total = %s, status = 'paid' WHERE id = %s", (f"{total:.2f}", order_id)
        )
        cur.execute(
            f"UPDATE {self.shop}.customers SET balance = balance - %s, loyalty = LEAST(loyalty + 1, 127) WHERE id = %s",
            (f"{total:.2f}", customer_id),
        )

    def reprice(self, cur: pymysql.cursors.Cursor) -> None:
        """A multi-row update."""
        digit = str(self.rng.randint(0, 9))
        cur.execute(
            f"UPDATE {self.shop}.products SET price = ROUND(price * %s, 2) WHERE sku LIKE %s",
            (self.rng.choice(["1.05", "0.95", "1.10"]), f"SKU-{digit}%"),
        )

    def ship_orders(self, cur: pymysql.cursors.Cursor) -> None:
        cur.execute(
            f"UPDATE {self.shop}.orders SET status = 'shipped', note = CONCAT(COALESCE(note, ''), ' 📦') "
            "WHERE status = 'paid' ORDER BY id LIMIT %s",
            (self.rng.randint(1, 10),),
        )

    def cancel_order(self, cur: pymysql.cursors.Cursor) -> None:
        """Deletes: the lines of an order and the order itself."""
        orders = self._pick(cur, f"SELECT id FROM {self.shop}.orders ORDER BY id DESC LIMIT 100")
        if not orders:
            return
        order_id = orders[0][0]
        cur.execute(f"DELETE FROM {self.shop}.order_items WHERE order_id = %s", (order_id,))
        cur.execute(f"DELETE FROM {self.shop}.orders WHERE id = %s", (order_id,))

    def rename_sku(self, cur: pymysql.cursors.Cursor) -> None:
        """A primary-key-changing update, and the rows that reference the key."""
        products = self._pick(cur, f"SELECT sku FROM {self.shop}.products ORDER BY sku LIMIT 500")
        if not products:
            return
        old = products[0][0]
        self._number_skus(cur)
        self._sku_counter += 1
        new = f"{old.split('-r')[0]}-r{self._sku_counter}"
        cur.execute(
            f"UPDATE {self.shop}.products SET sku = %s, title = CONCAT(title, ' (renamed)') WHERE sku = %s", (new, old)
        )
        cur.execute(f"UPDATE {self.shop}.order_items SET sku = %s WHERE sku = %s", (new, old))

    def renumber_lines(self, cur: pymysql.cursors.Cursor) -> None:
        """A key-changing multi-row update on a composite primary key."""
        orders = self._pick(
            cur, f"SELECT DISTINCT order_id FROM {self.shop}.order_items ORDER BY order_id DESC LIMIT 100"
        )
        if not orders:
            return
        cur.execute(
            f"UPDATE {self.shop}.order_items SET line_no = line_no + 100 WHERE order_id = %s AND line_no < 60000 "
            "ORDER BY line_no DESC",
            (orders[0][0],),
        )

    def delete_customers(self, cur: pymysql.cursors.Cursor) -> None:
        cur.execute(
            f"DELETE FROM {self.shop}.customers WHERE id NOT IN (SELECT customer_id FROM {self.shop}.orders) ORDER BY id LIMIT %s",
            (self.rng.randint(1, 3),),
        )

    def touch_warehouse(self, cur: pymysql.cursors.Cursor) -> None:
        cur.execute(
            f"UPDATE {self.inventory}.warehouses SET opens_at = ADDTIME(opens_at, '00:15:00') WHERE code = %s",
            (self.rng.choice(["ZRH", "GRU", "NRT"]),),
        )
