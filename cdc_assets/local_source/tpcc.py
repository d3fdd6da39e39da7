"""A TPC-C-shaped workload at a small scale, and TPC-C's consistency conditions as a pure function.

The nine tables of TPC-C (clause 1.3), loaded as clause 4.3.3.1 says at a scale of seconds (1 or 2 warehouses, a few
dozen customers a district, a hundred items), then the foreign keys added *after* the load with `ALTER TABLE … ADD
CONSTRAINT … FOREIGN KEY … REFERENCES …`, as sysbench's TPC-C scripts (whose table names end in a number: `stock1`)
and other TPC-C setups do, then the five transactions in their usual mix, each one source transaction over several
tables: New-Order (1% of them rolled back on an unused item, as clause 2.4.1.4 asks), Payment, Order-Status and
Stock-Level (read-only) and Delivery. A seeded generator and a simulated clock make a run deterministic: the same seed
on the same load writes the same rows. A CDC pipeline must carry all of it, the foreign keys' DDL included.

`consistency_violations` checks TPC-C's consistency conditions 1-4 (clause 3.3.2) over rows given as plain data (lists
of dicts, or pyarrow tables), wherever they were read: the source, or a lakehouse's current-state tables.
"""

from __future__ import annotations

import datetime as dt
import random
import string
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pymysql

from cdc_assets.local_source.workload import WorkloadStats

TABLES = ("warehouse", "district", "customer", "history", "new_orders", "orders", "order_line", "item", "stock")
# the tables conditions 1-4 read, and the columns they read of each
CONDITION_COLUMNS = {
    "warehouse": ("w_id", "w_ytd"),
    "district": ("d_w_id", "d_id", "d_ytd", "d_next_o_id"),
    "orders": ("o_w_id", "o_d_id", "o_id", "o_ol_cnt"),
    "new_orders": ("no_w_id", "no_d_id", "no_o_id"),
    "order_line": ("ol_w_id", "ol_d_id", "ol_o_id"),
}
# clause 5.2.3's minimum mix, the rest New-Order
MIX = (("new_order", 45), ("payment", 43), ("order_status", 4), ("delivery", 4), ("stock_level", 4))
SYLLABLES = ("BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING")  # clause 4.3.2.3
LOADED_AT = dt.datetime(2024, 1, 1, 8, 0, 0)  # the simulated clock's start: no value depends on the wall clock
DISTRICT_YTD = Decimal("30000.00")

SCHEMA = """
CREATE TABLE warehouse{s} (
  w_id SMALLINT NOT NULL, w_name VARCHAR(10), w_street_1 VARCHAR(20), w_street_2 VARCHAR(20), w_city VARCHAR(20),
  w_state CHAR(2), w_zip CHAR(9), w_tax DECIMAL(4,4), w_ytd DECIMAL(12,2),
  PRIMARY KEY (w_id)
) ENGINE=InnoDB;
CREATE TABLE district{s} (
  d_id TINYINT NOT NULL, d_w_id SMALLINT NOT NULL, d_name VARCHAR(10), d_street_1 VARCHAR(20), d_street_2 VARCHAR(20),
  d_city VARCHAR(20), d_state CHAR(2), d_zip CHAR(9), d_tax DECIMAL(4,4), d_ytd DECIMAL(12,2), d_next_o_id INT,
  PRIMARY KEY (d_w_id, d_id)
) ENGINE=InnoDB;
CREATE TABLE customer{s} (
  c_id INT NOT NULL, c_d_id TINYINT NOT NULL, c_w_id SMALLINT NOT NULL, c_first VARCHAR(16), c_middle CHAR(2),
  c_last VARCHAR(16), c_street_1 VARCHAR(20), c_street_2 VARCHAR(20), c_city VARCHAR(20), c_state CHAR(2),
  c_zip CHAR(9), c_phone CHAR(16), c_since DATETIME, c_credit CHAR(2), c_credit_lim DECIMAL(12,2),
  c_discount DECIMAL(4,4), c_balance DECIMAL(12,2), c_ytd_payment DECIMAL(12,2), c_payment_cnt SMALLINT,
  c_delivery_cnt SMALLINT, c_data VARCHAR(500),
  PRIMARY KEY (c_w_id, c_d_id, c_id), KEY idx_customer (c_w_id, c_d_id, c_last, c_first)
) ENGINE=InnoDB;
CREATE TABLE history{s} (
  h_id INT NOT NULL AUTO_INCREMENT, h_c_id INT, h_c_d_id TINYINT, h_c_w_id SMALLINT, h_d_id TINYINT,
  h_w_id SMALLINT, h_date DATETIME, h_amount DECIMAL(6,2), h_data VARCHAR(24),
  PRIMARY KEY (h_id)
) ENGINE=InnoDB;
CREATE TABLE orders{s} (
  o_id INT NOT NULL, o_d_id TINYINT NOT NULL, o_w_id SMALLINT NOT NULL, o_c_id INT, o_entry_d DATETIME,
  o_carrier_id TINYINT, o_ol_cnt TINYINT, o_all_local TINYINT,
  PRIMARY KEY (o_w_id, o_d_id, o_id), KEY idx_orders (o_w_id, o_d_id, o_c_id, o_id)
) ENGINE=InnoDB;
CREATE TABLE new_orders{s} (
  no_o_id INT NOT NULL, no_d_id TINYINT NOT NULL, no_w_id SMALLINT NOT NULL,
  PRIMARY KEY (no_w_id, no_d_id, no_o_id)
) ENGINE=InnoDB;
CREATE TABLE order_line{s} (
  ol_o_id INT NOT NULL, ol_d_id TINYINT NOT NULL, ol_w_id SMALLINT NOT NULL, ol_number TINYINT NOT NULL,
  ol_i_id INT, ol_supply_w_id SMALLINT, ol_delivery_d DATETIME, ol_quantity TINYINT, ol_amount DECIMAL(6,2),
  ol_dist_info CHAR(24),
  PRIMARY KEY (ol_w_id, ol_d_id, ol_o_id, ol_number)
) ENGINE=InnoDB;
CREATE TABLE item{s} (
  i_id INT NOT NULL, i_im_id INT, i_name VARCHAR(24), i_price DECIMAL(5,2), i_data VARCHAR(50),
  PRIMARY KEY (i_id)
) ENGINE=InnoDB;
CREATE TABLE stock{s} (
  s_i_id INT NOT NULL, s_w_id SMALLINT NOT NULL, s_quantity SMALLINT,
  s_dist_01 CHAR(24), s_dist_02 CHAR(24), s_dist_03 CHAR(24), s_dist_04 CHAR(24), s_dist_05 CHAR(24),
  s_dist_06 CHAR(24), s_dist_07 CHAR(24), s_dist_08 CHAR(24), s_dist_09 CHAR(24), s_dist_10 CHAR(24),
  s_ytd DECIMAL(8,0), s_order_cnt SMALLINT, s_remote_cnt SMALLINT, s_data VARCHAR(50),
  PRIMARY KEY (s_w_id, s_i_id)
) ENGINE=InnoDB
"""

# (table, referencing columns, referenced table, referenced columns): sysbench's TPC-C foreign keys, in its order
FOREIGN_KEYS = (
    ("new_orders", "no_w_id,no_d_id,no_o_id", "orders", "o_w_id,o_d_id,o_id"),
    ("orders", "o_w_id,o_d_id,o_c_id", "customer", "c_w_id,c_d_id,c_id"),
    ("customer", "c_w_id,c_d_id", "district", "d_w_id,d_id"),
    ("history", "h_c_w_id,h_c_d_id,h_c_id", "customer", "c_w_id,c_d_id,c_id"),
    ("history", "h_w_id,h_d_id", "district", "d_w_id,d_id"),
    ("district", "d_w_id", "warehouse", "w_id"),
    ("order_line", "ol_w_id,ol_d_id,ol_o_id", "orders", "o_w_id,o_d_id,o_id"),
    ("order_line", "ol_supply_w_id,ol_i_id", "stock", "s_w_id,s_i_id"),
    ("stock", "s_w_id", "warehouse", "w_id"),
    ("stock", "s_i_id", "item", "i_id"),
)


@dataclass(frozen=True)
class Scale:
    """How much is loaded. TPC-C's own is 10 districts, 3,000 customers and orders a district, 100,000 items; this
    default loads in seconds. The newest 30% of each district's orders are undelivered new orders (TPC-C: the last 900
    of 3,000)."""

    warehouses: int = 1
    districts: int = 10
    customers: int = 30  # per district; as many orders per district are loaded, one a customer
    items: int = 100

    @property
    def first_new_order(self) -> int:
        return self.customers - self.customers * 3 // 10 + 1

    @property
    def last_names(self) -> int:
        """How many distinct last names a district's customers have: the first this many customers have one each (as
        TPC-C's first 1,000 do), the others one of them (so a Payment by last name may find several customers)."""
        return max(1, self.customers // 3)


def loaded_scale(conn: pymysql.Connection, database: str, suffix: str = "") -> Scale | None:
    """The scale a database was loaded at (None: not loaded), so a later run goes on over the rows that are there."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = %s AND table_name = %s",
            (database, f"warehouse{suffix}"),
        )
        if not cur.fetchone()[0]:
            return None
        counts = []
        for table, column in (("warehouse", "w_id"), ("district", "d_id"), ("customer", "c_id"), ("item", "i_id")):
            cur.execute(f"SELECT COALESCE(MAX({column}), 0) FROM `{database}`.{table}{suffix}")
            counts.append(int(cur.fetchone()[0]))
    conn.commit()
    return Scale(*counts) if all(counts) else None


def foreign_key_statements(database: str, suffix: str = "") -> list[str]:
    """The statements that add the foreign keys to loaded tables, named as sysbench names them (`fkey_stock_2_1`)."""
    statements, numbers = [], Counter[str]()
    for table, columns, parent, parent_columns in FOREIGN_KEYS:
        numbers[table] += 1
        name = f"fkey_{table}_{numbers[table]}" + (f"_{suffix}" if suffix else "")
        statements.append(
            f"ALTER TABLE `{database}`.{table}{suffix} ADD CONSTRAINT {name} FOREIGN KEY({columns}) "
            f"REFERENCES `{database}`.{parent}{suffix}({parent_columns})"
        )
    return statements


def last_name(number: int) -> str:
    """A customer's last name from a number in 0..999, three syllables (clause 4.3.2.3)."""
    return "".join(SYLLABLES[int(digit)] for digit in f"{number:03d}")


class Tpcc:
    """The workload on one database of a source, over one connection (autocommit off): `load`, then `run`.

    `suffix` ends every table's name, as sysbench's `stock1`; the foreign keys are added by `load` unless told not to.
    """

    def __init__(
        self, conn: pymysql.Connection, database: str, seed: int = 0, scale: Scale | None = None, suffix: str = ""
    ) -> None:
        self.conn = conn
        self.database = database
        self.suffix = suffix
        self.rng = random.Random(seed)
        self.scale = scale or Scale()
        self.stats = WorkloadStats()
        self.clock = LOADED_AT
        # clause 2.1.6's run-time constants of NURand, drawn once from the seed
        self.c_last, self.c_id, self.ol_i_id = (
            self.rng.randint(0, 255),
            self.rng.randint(0, 1023),
            self.rng.randint(0, 8191),
        )

    def table(self, name: str) -> str:
        return f"`{self.database}`.{name}{self.suffix}"

    # -- the load ------------------------------------------------------------------------------------------
    def load(self, foreign_keys: bool = True) -> None:
        """The nine tables created and loaded (clause 4.3.3.1, at this scale; a table's rows of one warehouse or
        district a transaction), then the foreign keys added by ALTER TABLE, one statement each."""
        with self.conn.cursor() as cur:
            for statement in filter(str.strip, SCHEMA.format(s=self.suffix).split(";")):
                cur.execute(statement.replace("CREATE TABLE ", f"CREATE TABLE `{self.database}`.", 1))
            for table, rows in self.initial_rows():
                columns = list(rows[0])
                cur.executemany(
                    f"INSERT INTO {self.table(table)} ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))})",
                    [tuple(row.values()) for row in rows],
                )
                self.conn.commit()
            if foreign_keys:
                for statement in foreign_key_statements(self.database, self.suffix):
                    cur.execute(statement)
        self.conn.commit()
        self.stats.transactions["load"] += 1

    def initial_rows(self) -> Iterable[tuple[str, list[dict[str, Any]]]]:
        """The rows `load` inserts, a table's rows of one warehouse or district at a time, drawn from the seed."""
        scale, rng = self.scale, self.rng
        yield "item", [
            {"i_id": i, "i_im_id": rng.randint(1, 10_000), "i_name": self._text(14, 24), "i_price": self._money(1, 100),
             "i_data": self._data()}
            for i in range(1, scale.items + 1)
        ]  # fmt: skip
        yield "warehouse", [
            {"w_id": w, "w_name": self._text(6, 10), **self._address("w"), "w_tax": self._tax(),
             "w_ytd": DISTRICT_YTD * scale.districts}
            for w in range(1, scale.warehouses + 1)
        ]  # fmt: skip
        for w in range(1, scale.warehouses + 1):
            yield "stock", [
                {"s_i_id": i, "s_w_id": w, "s_quantity": rng.randint(10, 100),
                 **{f"s_dist_{d:02d}": self._text(24, 24) for d in range(1, 11)},
                 "s_ytd": 0, "s_order_cnt": 0, "s_remote_cnt": 0, "s_data": self._data()}
                for i in range(1, scale.items + 1)
            ]  # fmt: skip
            yield "district", [
                {"d_id": d, "d_w_id": w, "d_name": self._text(6, 10), **self._address("d"), "d_tax": self._tax(),
                 "d_ytd": DISTRICT_YTD, "d_next_o_id": scale.customers + 1}
                for d in range(1, scale.districts + 1)
            ]  # fmt: skip
            for d in range(1, scale.districts + 1):
                yield from self._district_rows(w, d)

    def _district_rows(self, w: int, d: int) -> Iterable[tuple[str, list[dict[str, Any]]]]:
        scale, rng = self.scale, self.rng
        customers = []
        for c in range(1, scale.customers + 1):
            name = c - 1 if c <= scale.last_names else self._nurand(255, 0, scale.last_names - 1, self.c_last)
            customers.append(
                {"c_id": c, "c_d_id": d, "c_w_id": w, "c_first": self._text(8, 16), "c_middle": "OE",
                 "c_last": last_name(name), **self._address("c"), "c_phone": self._digits(16),
                 "c_since": self.clock, "c_credit": "BC" if rng.random() < 0.1 else "GC",
                 "c_credit_lim": Decimal("50000.00"), "c_discount": self._money(0, 0.5, places=4),
                 "c_balance": Decimal("-10.00"), "c_ytd_payment": Decimal("10.00"), "c_payment_cnt": 1,
                 "c_delivery_cnt": 0, "c_data": self._text(300, 500)}
            )  # fmt: skip
        yield "customer", customers
        yield "history", [
            {"h_c_id": c, "h_c_d_id": d, "h_c_w_id": w, "h_d_id": d, "h_w_id": w, "h_date": self.clock,
             "h_amount": Decimal("10.00"), "h_data": self._text(12, 24)}
            for c in range(1, scale.customers + 1)
        ]  # fmt: skip
        owners = list(range(1, scale.customers + 1))
        rng.shuffle(owners)
        orders, lines = [], []
        for o, c in enumerate(owners, start=1):
            delivered = o < scale.first_new_order
            count = rng.randint(5, 15)
            orders.append(
                {"o_id": o, "o_d_id": d, "o_w_id": w, "o_c_id": c, "o_entry_d": self.clock,
                 "o_carrier_id": rng.randint(1, 10) if delivered else None, "o_ol_cnt": count, "o_all_local": 1}
            )  # fmt: skip
            lines += [
                {"ol_o_id": o, "ol_d_id": d, "ol_w_id": w, "ol_number": n, "ol_i_id": rng.randint(1, scale.items),
                 "ol_supply_w_id": w, "ol_delivery_d": self.clock if delivered else None, "ol_quantity": 5,
                 "ol_amount": Decimal("0.00") if delivered else self._money(0.01, 9999.99),
                 "ol_dist_info": self._text(24, 24)}
                for n in range(1, count + 1)
            ]  # fmt: skip
        yield "orders", orders
        yield "order_line", lines
        yield (
            "new_orders",
            [{"no_o_id": o, "no_d_id": d, "no_w_id": w} for o in range(scale.first_new_order, scale.customers + 1)],
        )

    # -- random values (clause 4.3.2) ------------------------------------------------------------------------
    def _nurand(self, a: int, x: int, y: int, c: int) -> int:
        """NURand(A, x, y) of clause 2.1.6: a non-uniform choice in x..y, some values far more often than others."""
        return ((self.rng.randint(0, a) | self.rng.randint(x, y)) + c) % (y - x + 1) + x

    def _text(self, shortest: int, longest: int) -> str:
        return "".join(self.rng.choices(string.ascii_letters + string.digits, k=self.rng.randint(shortest, longest)))

    def _digits(self, length: int) -> str:
        return "".join(self.rng.choices(string.digits, k=length))

    def _data(self) -> str:
        """i_data, s_data: 10% of them hold "ORIGINAL" somewhere."""
        text = self._text(26, 50)
        if self.rng.random() < 0.1:
            at = self.rng.randint(0, len(text) - 8)
            text = text[:at] + "ORIGINAL" + text[at + 8 :]
        return text

    def _money(self, low: float, high: float, places: int = 2) -> Decimal:
        unit = 10**places
        return Decimal(self.rng.randint(round(low * unit), round(high * unit))).scaleb(-places)

    def _tax(self) -> Decimal:
        return self._money(0, 0.2, places=4)

    def _address(self, prefix: str) -> dict[str, str]:
        return {
            f"{prefix}_street_1": self._text(10, 20), f"{prefix}_street_2": self._text(10, 20),
            f"{prefix}_city": self._text(10, 20), f"{prefix}_state": "".join(self.rng.choices(string.ascii_uppercase, k=2)),
            f"{prefix}_zip": self._digits(4) + "11111",
        }  # fmt: skip

    def _other_warehouse(self, w: int) -> int:
        return self.rng.choice([o for o in range(1, self.scale.warehouses + 1) if o != w])

    # -- the transactions ---------------------------------------------------------------------------------
    def step(self) -> str:
        """One transaction of the mix, committed (or, for 1% of New-Orders, rolled back); returns its kind."""
        kind = self.rng.choices([k for k, _ in MIX], weights=[w for _, w in MIX])[0]
        self.clock += dt.timedelta(seconds=1)
        with self.conn.cursor() as cur:
            committed = getattr(self, kind)(cur)
        if committed:
            self.conn.commit()
        else:
            self.conn.rollback()
        self.stats.transactions[kind if committed else f"{kind}_rolled_back"] += 1
        return kind

    def run(
        self,
        transactions: int | None = None,
        seconds: float | None = None,
        tps: float | None = None,
        stop: threading.Event | None = None,
    ) -> WorkloadStats:
        """Transactions at a steady `tps` (None: as fast as they go), until `transactions` ran, `seconds` passed or
        `stop` is set, whichever comes first. Each is due at start + n / tps, so a slow one does not slow the rest."""
        stop = stop or threading.Event()
        started = time.monotonic()
        done = 0
        while not stop.is_set() and (transactions is None or done < transactions):
            now = time.monotonic()
            due = started + done / tps if tps else now
            if seconds is not None and max(now, due) - started >= seconds:
                break
            if due > now and stop.wait(due - now):
                break
            self.step()
            done += 1
        return self.stats

    def _customer(self, cur: pymysql.cursors.Cursor, w: int, d: int) -> int:
        """The customer a Payment or Order-Status is for: 60% by last name (the middle one of those of that name, by
        first name), 40% by id (clause 2.5.1.2)."""
        scale = self.scale
        if self.rng.random() < 0.6:
            name = last_name(self._nurand(255, 0, scale.last_names - 1, self.c_last))
            cur.execute(
                f"SELECT c_id FROM {self.table('customer')} WHERE c_w_id = %s AND c_d_id = %s AND c_last = %s "
                "ORDER BY c_first",
                (w, d, name),
            )
            found = [c for (c,) in cur.fetchall()]
            return found[(len(found) - 1) // 2]
        return self._nurand(1023, 1, scale.customers, self.c_id)

    def new_order(self, cur: pymysql.cursors.Cursor) -> bool:
        """Clause 2.4: an order of 5-15 lines, its new-order row, the district's next order id and the stock of each
        item; False (roll back) when its last item is unused, as 1% of them are."""
        scale, rng, t = self.scale, self.rng, self.table
        w, d = rng.randint(1, scale.warehouses), rng.randint(1, scale.districts)
        c = self._nurand(1023, 1, scale.customers, self.c_id)
        count, rollback = rng.randint(5, 15), rng.random() < 0.01
        items = [self._nurand(8191, 1, scale.items, self.ol_i_id) for _ in range(count)]
        if rollback:
            items[-1] = scale.items + 1  # no such item
        supply = [self._other_warehouse(w) if scale.warehouses > 1 and rng.random() < 0.01 else w for _ in items]
        quantities = [rng.randint(1, 10) for _ in items]
        cur.execute(f"SELECT w_tax FROM {t('warehouse')} WHERE w_id = %s", (w,))
        cur.execute(
            f"SELECT d_tax, d_next_o_id FROM {t('district')} WHERE d_w_id = %s AND d_id = %s FOR UPDATE", (w, d)
        )
        _, o = cur.fetchone()
        cur.execute(f"UPDATE {t('district')} SET d_next_o_id = d_next_o_id + 1 WHERE d_w_id = %s AND d_id = %s", (w, d))
        cur.execute(
            f"SELECT c_discount, c_last, c_credit FROM {t('customer')} WHERE c_w_id = %s AND c_d_id = %s AND c_id = %s",
            (w, d, c),
        )
        cur.execute(
            f"INSERT INTO {t('orders')} (o_id, o_d_id, o_w_id, o_c_id, o_entry_d, o_carrier_id, o_ol_cnt, o_all_local) "
            "VALUES (%s, %s, %s, %s, %s, NULL, %s, %s)",
            (o, d, w, c, self.clock, count, int(all(s == w for s in supply))),
        )
        cur.execute(f"INSERT INTO {t('new_orders')} (no_o_id, no_d_id, no_w_id) VALUES (%s, %s, %s)", (o, d, w))
        for number, (i, s_w, quantity) in enumerate(zip(items, supply, quantities, strict=True), start=1):
            cur.execute(f"SELECT i_price, i_name, i_data FROM {t('item')} WHERE i_id = %s", (i,))
            item = cur.fetchone()
            if item is None:
                return False
            cur.execute(
                f"SELECT s_quantity, s_dist_{d:02d} FROM {t('stock')} WHERE s_i_id = %s AND s_w_id = %s FOR UPDATE",
                (i, s_w),
            )
            stock, dist_info = cur.fetchone()
            left = stock - quantity if stock - quantity >= 10 else stock - quantity + 91
            cur.execute(
                f"UPDATE {t('stock')} SET s_quantity = %s, s_ytd = s_ytd + %s, s_order_cnt = s_order_cnt + 1, "
                "s_remote_cnt = s_remote_cnt + %s WHERE s_i_id = %s AND s_w_id = %s",
                (left, quantity, int(s_w != w), i, s_w),
            )
            cur.execute(
                f"INSERT INTO {t('order_line')} (ol_o_id, ol_d_id, ol_w_id, ol_number, ol_i_id, ol_supply_w_id, "
                "ol_delivery_d, ol_quantity, ol_amount, ol_dist_info) VALUES (%s, %s, %s, %s, %s, %s, NULL, %s, %s, %s)",
                (o, d, w, number, i, s_w, quantity, item[0] * quantity, dist_info),
            )
        return True

    def payment(self, cur: pymysql.cursors.Cursor) -> bool:
        """Clause 2.5: the warehouse's and district's year-to-date takings, the customer's balance (and, for bad
        credit, its c_data) and a history row; 15% of customers from another warehouse."""
        scale, rng, t = self.scale, self.rng, self.table
        w, d = rng.randint(1, scale.warehouses), rng.randint(1, scale.districts)
        c_w, c_d = (
            (w, d)
            if scale.warehouses == 1 or rng.random() < 0.85
            else (self._other_warehouse(w), rng.randint(1, scale.districts))
        )
        amount = self._money(1, 5000)
        c = self._customer(cur, c_w, c_d)
        cur.execute(f"UPDATE {t('warehouse')} SET w_ytd = w_ytd + %s WHERE w_id = %s", (amount, w))
        cur.execute(f"SELECT w_name FROM {t('warehouse')} WHERE w_id = %s", (w,))
        (w_name,) = cur.fetchone()
        cur.execute(f"UPDATE {t('district')} SET d_ytd = d_ytd + %s WHERE d_w_id = %s AND d_id = %s", (amount, w, d))
        cur.execute(f"SELECT d_name FROM {t('district')} WHERE d_w_id = %s AND d_id = %s", (w, d))
        (d_name,) = cur.fetchone()
        where = "WHERE c_w_id = %s AND c_d_id = %s AND c_id = %s"
        cur.execute(f"SELECT c_credit, c_data FROM {t('customer')} {where} FOR UPDATE", (c_w, c_d, c))
        credit, data = cur.fetchone()
        cur.execute(
            f"UPDATE {t('customer')} SET c_balance = c_balance - %s, c_ytd_payment = c_ytd_payment + %s, "
            f"c_payment_cnt = c_payment_cnt + 1 {where}",
            (amount, amount, c_w, c_d, c),
        )
        if credit == "BC":
            data = f"{c} {c_d} {c_w} {d} {w} {amount} | {data}"[:500]
            cur.execute(f"UPDATE {t('customer')} SET c_data = %s {where}", (data, c_w, c_d, c))
        cur.execute(
            f"INSERT INTO {t('history')} (h_c_id, h_c_d_id, h_c_w_id, h_d_id, h_w_id, h_date, h_amount, h_data) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            (c, c_d, c_w, d, w, self.clock, amount, f"{w_name}    {d_name}"[:24]),
        )
        return True

    def order_status(self, cur: pymysql.cursors.Cursor) -> bool:
        """Clause 2.6, read-only: a customer's balance, last order and its lines."""
        t = self.table
        w, d = self.rng.randint(1, self.scale.warehouses), self.rng.randint(1, self.scale.districts)
        c = self._customer(cur, w, d)
        cur.execute(f"SELECT c_balance, c_first, c_middle, c_last FROM {t('customer')} "
                    "WHERE c_w_id = %s AND c_d_id = %s AND c_id = %s", (w, d, c))  # fmt: skip
        cur.execute(
            f"SELECT o_id, o_entry_d, o_carrier_id FROM {t('orders')} WHERE o_w_id = %s AND o_d_id = %s AND o_c_id = %s "
            "ORDER BY o_id DESC LIMIT 1",
            (w, d, c),
        )
        last = cur.fetchone()
        if last is not None:
            cur.execute(
                f"SELECT ol_i_id, ol_supply_w_id, ol_quantity, ol_amount, ol_delivery_d FROM {t('order_line')} "
                "WHERE ol_w_id = %s AND ol_d_id = %s AND ol_o_id = %s",
                (w, d, last[0]),
            )
            cur.fetchall()
        return True

    def delivery(self, cur: pymysql.cursors.Cursor) -> bool:
        """Clause 2.7: in each district of a warehouse, the oldest new order delivered: its new-order row deleted, its
        carrier set, its lines dated, its amount added to the customer's balance."""
        t = self.table
        w, carrier = self.rng.randint(1, self.scale.warehouses), self.rng.randint(1, 10)
        for d in range(1, self.scale.districts + 1):
            cur.execute(
                f"SELECT no_o_id FROM {t('new_orders')} WHERE no_w_id = %s AND no_d_id = %s ORDER BY no_o_id LIMIT 1 "
                "FOR UPDATE",
                (w, d),
            )
            oldest = cur.fetchone()
            if oldest is None:
                continue
            (o,) = oldest
            cur.execute(
                f"DELETE FROM {t('new_orders')} WHERE no_w_id = %s AND no_d_id = %s AND no_o_id = %s", (w, d, o)
            )
            cur.execute(f"SELECT o_c_id FROM {t('orders')} WHERE o_w_id = %s AND o_d_id = %s AND o_id = %s", (w, d, o))
            (c,) = cur.fetchone()
            cur.execute(
                f"UPDATE {t('orders')} SET o_carrier_id = %s WHERE o_w_id = %s AND o_d_id = %s AND o_id = %s",
                (carrier, w, d, o),
            )
            lines = "WHERE ol_w_id = %s AND ol_d_id = %s AND ol_o_id = %s"
            cur.execute(f"UPDATE {t('order_line')} SET ol_delivery_d = %s {lines}", (self.clock, w, d, o))
            cur.execute(f"SELECT COALESCE(SUM(ol_amount), 0) FROM {t('order_line')} {lines}", (w, d, o))
            (total,) = cur.fetchone()
            cur.execute(
                f"UPDATE {t('customer')} SET c_balance = c_balance + %s, c_delivery_cnt = c_delivery_cnt + 1 "
                "WHERE c_w_id = %s AND c_d_id = %s AND c_id = %s",
                (total, w, d, c),
            )
        return True

    def stock_level(self, cur: pymysql.cursors.Cursor) -> bool:
        """Clause 2.8, read-only: how many items of a district's last 20 orders are low on stock."""
        t = self.table
        w, d = self.rng.randint(1, self.scale.warehouses), self.rng.randint(1, self.scale.districts)
        cur.execute(f"SELECT d_next_o_id FROM {t('district')} WHERE d_w_id = %s AND d_id = %s", (w, d))
        (next_o,) = cur.fetchone()
        cur.execute(
            f"SELECT COUNT(DISTINCT s_i_id) FROM {t('order_line')} JOIN {t('stock')} ON s_i_id = ol_i_id AND s_w_id = %s "
            "WHERE ol_w_id = %s AND ol_d_id = %s AND ol_o_id >= %s AND ol_o_id < %s AND s_quantity < %s",
            (w, w, d, next_o - 20, next_o, self.rng.randint(10, 20)),
        )
        cur.fetchone()
        return True

    # -- reading back ---------------------------------------------------------------------------------------
    def condition_rows(self) -> dict[str, list[dict[str, Any]]]:
        """The rows conditions 1-4 read, from the source, in one consistent read."""
        rows: dict[str, list[dict[str, Any]]] = {}
        with self.conn.cursor(pymysql.cursors.DictCursor) as cur:
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            for table, columns in CONDITION_COLUMNS.items():
                cur.execute(f"SELECT {', '.join(columns)} FROM {self.table(table)}")
                rows[table] = list(cur.fetchall())
        self.conn.commit()
        return rows


# -- TPC-C's consistency conditions (clause 3.3.2) --------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    """One consistency condition (1-4) that does not hold for one warehouse or district, and what was found."""

    condition: int
    where: str
    found: str

    def __str__(self) -> str:
        return f"condition {self.condition}, {self.where}: {self.found}"


def _plain_rows(rows: Any, columns: Iterable[str]) -> list[Mapping[str, Any]]:
    """Rows as dicts, from a list of dicts or from anything pyarrow-like (`select` and `to_pylist`)."""
    if hasattr(rows, "to_pylist"):
        return (rows.select(list(columns)) if hasattr(rows, "select") else rows).to_pylist()
    return list(rows)


def _number(value: Any) -> Decimal:
    """A DECIMAL as Decimal whatever it came as (Decimal, int, float, or text): sums must be exact."""
    return value if isinstance(value, Decimal) else Decimal(str(value))


def consistency_violations(tables: Mapping[str, Any]) -> list[Violation]:
    """TPC-C's consistency conditions 1-4 over the rows of `tables` (by the names of `CONDITION_COLUMNS`, each a list
    of dicts or a pyarrow table holding at least those columns), wherever they were read; empty when all hold.

    1. W_YTD = sum(D_YTD) for each warehouse.
    2. D_NEXT_O_ID - 1 = max(O_ID) = max(NO_O_ID) for each district (max(NO_O_ID) only where it has new orders).
    3. max(NO_O_ID) - min(NO_O_ID) + 1 = its count of NEW-ORDER rows, for each district with new orders.
    4. sum(O_OL_CNT) = its count of ORDER-LINE rows, for each district.
    """
    rows = {name: _plain_rows(tables[name], columns) for name, columns in CONDITION_COLUMNS.items()}
    district_ytd: dict[Any, Decimal] = defaultdict(Decimal)
    next_order: dict[tuple[Any, Any], int] = {}
    for r in rows["district"]:
        district_ytd[r["d_w_id"]] += _number(r["d_ytd"])
        next_order[(r["d_w_id"], r["d_id"])] = int(r["d_next_o_id"])
    orders: dict[tuple[Any, Any], list[int]] = defaultdict(list)
    line_counts: Counter[tuple[Any, Any]] = Counter()
    for r in rows["orders"]:
        orders[(r["o_w_id"], r["o_d_id"])].append(int(r["o_id"]))
        line_counts[(r["o_w_id"], r["o_d_id"])] += int(r["o_ol_cnt"])
    new_orders: dict[tuple[Any, Any], list[int]] = defaultdict(list)
    for r in rows["new_orders"]:
        new_orders[(r["no_w_id"], r["no_d_id"])].append(int(r["no_o_id"]))
    lines = Counter((r["ol_w_id"], r["ol_d_id"]) for r in rows["order_line"])

    found: list[Violation] = []
    warehouse_ytd = {r["w_id"]: _number(r["w_ytd"]) for r in rows["warehouse"]}
    for w in sorted(set(warehouse_ytd) | set(district_ytd)):
        if warehouse_ytd.get(w) != district_ytd.get(w, Decimal(0)):
            w_ytd = warehouse_ytd.get(w, "no WAREHOUSE row")
            found.append(Violation(1, f"warehouse {w}", f"W_YTD {w_ytd} != sum(D_YTD) {district_ytd.get(w, 0)}"))
    for key in sorted(set(next_order) | set(orders) | set(new_orders) | set(lines)):
        where = f"district {key[1]} of warehouse {key[0]}"
        last = next_order[key] - 1 if key in next_order else None
        highest = max(orders[key], default=0)
        waiting = new_orders.get(key, [])
        if last is None or last != highest or (waiting and max(waiting) != last):
            seen = f"D_NEXT_O_ID - 1 = {last if last is not None else '(no DISTRICT row)'}, max(O_ID) = {highest}"
            found.append(Violation(2, where, seen + (f", max(NO_O_ID) = {max(waiting)}" if waiting else "")))
        if waiting and max(waiting) - min(waiting) + 1 != len(waiting):
            found.append(
                Violation(3, where, f"max(NO_O_ID) - min(NO_O_ID) + 1 = {max(waiting) - min(waiting) + 1}, "
                          f"{len(waiting)} NEW-ORDER rows")
            )  # fmt: skip
        if line_counts[key] != lines[key]:
            found.append(Violation(4, where, f"sum(O_OL_CNT) = {line_counts[key]}, {lines[key]} ORDER-LINE rows"))
    return found
