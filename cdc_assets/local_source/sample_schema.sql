-- Sample source for the demo: a small shop. Several tables, a composite primary key,
-- utf8mb4 text, and the common column types.
CREATE DATABASE IF NOT EXISTS shop CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci;
CREATE DATABASE IF NOT EXISTS inventory CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS shop.customers (
    id          INT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    name        VARCHAR(120) NOT NULL,
    email       VARCHAR(190) NULL,
    city        VARCHAR(80)  NULL,
    balance     DECIMAL(12,2) NOT NULL DEFAULT 0,
    loyalty     TINYINT NOT NULL DEFAULT 0,
    created_at  DATETIME(6)  NOT NULL,
    updated_at  TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
) ENGINE=InnoDB;

CREATE TABLE IF NOT EXISTS shop.products (
    sku         VARCHAR(40)  NOT NULL PRIMARY KEY,
    title       TEXT         NOT NULL,
    price       DECIMAL(10,2) NOT NULL,
    stock       INT UNSIGNED NOT NULL,
    weight_kg   DOUBLE       NULL,
    thumbnail   BLOB         NULL
) ENGINE=InnoDB;

CREATE TABLE IF NOT EXISTS shop.orders (
    id          BIGINT UNSIGNED NOT NULL PRIMARY KEY,
    customer_id INT UNSIGNED NOT NULL,
    placed_on   DATE NOT NULL,
    status      ENUM('new','paid','shipped','cancelled') NOT NULL,
    note        VARCHAR(255) NULL,
    total       DECIMAL(14,2) NOT NULL DEFAULT 0
) ENGINE=InnoDB;

CREATE TABLE IF NOT EXISTS shop.order_items (
    order_id    BIGINT UNSIGNED NOT NULL,
    line_no     SMALLINT UNSIGNED NOT NULL,
    sku         VARCHAR(40) NOT NULL,
    quantity    SMALLINT NOT NULL,
    unit_price  DECIMAL(10,2) NOT NULL,
    PRIMARY KEY (order_id, line_no)
) ENGINE=InnoDB;

CREATE TABLE IF NOT EXISTS inventory.stock_moves (
    warehouse   CHAR(3) NOT NULL,
    sku         VARCHAR(40) NOT NULL,
    moved_at    DATETIME(6) NOT NULL,
    delta       INT NOT NULL,
    reason      VARCHAR(64) NULL,
    PRIMARY KEY (warehouse, sku, moved_at)
) ENGINE=InnoDB;

CREATE TABLE IF NOT EXISTS inventory.warehouses (
    code        CHAR(3) NOT NULL PRIMARY KEY,
    name        VARCHAR(100) NOT NULL,
    opens_at    TIME NOT NULL,
    founded     YEAR NULL
) ENGINE=InnoDB;
