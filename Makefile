# cdc-lakehouse: `make demo`, `make test`, `make dev`. Every target installs what it needs first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
SPARK_CONNECT_PORT ?= 15002
DEV_PORT ?= 3000
## The demo's source: `mariadb` (the default: the project's `demo` source) or `mysql` (Oracle MySQL, unpacked from
## Debian's packages under .local/mysql-dist: the project's second source, `demo_mysql`, cdc_assets/sources/demo_mysql,
## with its own lakehouse, ./lakehouse-mysql). `make dev SOURCE=mysql` starts that server too, so both demo sources
## flow in one UI; `make workload` and `make local-source-start` / `-stop` act on that flavour's demo server.
SOURCE ?= mariadb
ifeq ($(filter $(SOURCE),mariadb mysql),)
$(error SOURCE=$(SOURCE) is not a demo source: use SOURCE=mariadb (the default) or SOURCE=mysql)
endif
DEMO_SOURCE_FLAG := $(if $(filter mysql,$(SOURCE)),--source demo_mysql)
LOCAL_SOURCE := CDC_DEMO_SOURCE=$(SOURCE) $(BIN)/python -m cdc_assets.local_source

.PHONY: demo test dev stop bench chaos workload lint system-deps install local-source-start local-source-stop spark-cluster-start spark-cluster-stop clean

## System packages: a MariaDB server and PostgreSQL (each run as our own dedicated instance; a system one is left
## alone), a Java 17+ runtime for Spark, a RabbitMQ server (the sinks' tests and the demo run a dedicated broker of
## their own), and Chromium, which the UI's browser test drives headless over the DevTools protocol.
system-deps:
	@if ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ] || ! command -v mariadb-install-db >/dev/null 2>&1; then \
		echo "Installing mariadb-server"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq mariadb-server mariadb-client >/dev/null; \
	fi
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
		echo "Installing postgresql (the tests run a dedicated server for a Dagster instance with PostgreSQL storage)"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq postgresql >/dev/null; \
	fi
	@if ! java -version 2>&1 | grep -Eq 'version "(1[7-9]|2[0-9])'; then \
		echo "Installing a Java 17 runtime"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq openjdk-17-jre-headless >/dev/null; \
	fi
	@if [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then \
		echo "Installing rabbitmq-server"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq rabbitmq-server >/dev/null; \
	fi
	@if ! command -v chromium >/dev/null 2>&1; then \
		echo "Installing chromium (headless, for the UI's browser test)"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; \
	fi

## The virtualenv with the project and its pinned dependencies (constraints.txt pins every transitive package), without
## setuptools' notice that an install is editable (every other warning of the build still shows).
$(STAMP): pyproject.toml constraints.txt
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	PYTHONWARNINGS='ignore:Editable installation' $(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

## The project's own modules byte-compiled: an editable install leaves them to be compiled at each import, and
## machines that set PYTHONDONTWRITEBYTECODE=1 would pay that in every `cdc-lakehouse` process (~0.2 s); compileall
## rewrites only what changed since. The instance step also builds the cache of empty Dagster databases.
## Oracle MySQL (the tests' second source, and `make demo SOURCE=mysql`): Debian 12 has only MariaDB, so its unstable
## suite's mysql-server-core and libraries are unpacked under .local/mysql-dist with a private apt configuration
## (nothing of the system changes; about 50 MB, once). See cdc_assets/local_source/mysql_dist.py.
## The Spark driver's class archive (about 160 MB in ~/.cache/cdc-lakehouse, once per pyspark and java; ~30 s): a
## driver JVM maps its classes instead of loading them and starts about 5 s sooner. Spark's own log lines (stderr)
## are dropped; a failure is said in one sentence and sessions start without it. See spark_resources/class_archive.py.
install: system-deps $(STAMP)
	@$(BIN)/python -m compileall -q -j 0 cdc_assets spark_resources >/dev/null
	@$(BIN)/python -m cdc_assets.runtime.instance >/dev/null
	@$(BIN)/python -m cdc_assets.local_source install-mysql
	@$(BIN)/python -m spark_resources.class_archive 2>/dev/null

## `make demo SINKS=1` also publishes every change to a local RabbitMQ and a local Kinesis and reads them back.
demo: install
	$(BIN)/cdc-lakehouse $(DEMO_SOURCE_FLAG) demo $(if $(SINKS),--sinks)

## The suite in TEST_WORKERS processes (pytest-xdist; default 3 on this machine's 2 cores): its tests wait on
## servers, subprocesses, Dagster's daemon and sensor ticks much of the time, so a third worker keeps both cores busy
## (the whole suite took 23:41 in three workers against 27:31 in two, on one machine, one after the other). Each
## worker starts servers of its own as it needs them (MariaDB, MySQL, RabbitMQ, moto, Spark: up to about 3 GB a
## worker); a module's tests stay on one worker, in order; the longest modules are handed out first
## (conftest.LONGEST_FIRST, kept in that order by --no-loadscope-reorder). `--durations=40` (setup.cfg) prints the
## 40 slowest.
TEST_WORKERS ?= 3
test: install
	$(BIN)/ruff check cdc_assets cdc_assets_tests spark_resources benchmarks
	VIRTUAL_ENV=$(abspath $(VENV)) $(BIN)/dg check defs --use-active-venv
	$(BIN)/pytest cdc_assets_tests -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

## Benchmarks (not tests), on a dedicated MariaDB under .local/bench, medians of 3 runs (about 40 minutes):
## (a) 250k changes over 200 tables against the tutorial baseline, (b) 10k changes into 1M- and 10M-row
## tables, (c) a steady 1,000 changes/s with the pipeline hands-off, (a) published to both sinks, a sync's
## fixed costs, and (a)'s apply run with SCD2 history on beside off. See benchmarks/README.md.
bench: install
	$(BIN)/python -m benchmarks.run
	$(BIN)/python -m benchmarks.large_table
	$(BIN)/python -m benchmarks.steady_load
	$(BIN)/python -m benchmarks.sinks
	$(BIN)/python -m benchmarks.fixed_costs
	$(BIN)/python -m benchmarks.history

## The UI and the daemon (schedules, sensors, freshness) on 127.0.0.1:$(DEV_PORT) (`make dev DEV_PORT=3001`). Without
## CDC_SPARK_MASTER, runs share one long-lived Spark Connect server (no run pays for a JVM start) and take Spark only
## from CDC_SPARK_MIN_ROWS changes on; with CDC_SPARK_MASTER set (say the cluster of `make spark-cluster-start`),
## every run goes there and Spark does every stage unless CDC_SPARK_MIN_ROWS says otherwise. `make workload` writes to
## the source. `make dev SINKS=1` also starts the local RabbitMQ and Kinesis and turns both sinks on for them. When
## it ends (Ctrl-C) it stops what it started (the demo source, the Spark Connect server, the brokers), keeping their
## data; the runs are the lakehouse's own Dagster home's (cdc_assets/local_dev.py).
dev: install
	$(BIN)/python -m cdc_assets.local_dev --port $(DEV_PORT) --spark-connect-port $(SPARK_CONNECT_PORT) $(if $(SINKS),--sinks) $(if $(filter mysql,$(SOURCE)),--mysql)

## Stops every local server the project started (the demo sources, the Spark Connect server, the local brokers, a
## local Spark cluster) and keeps all data: what `make clean` stops, without deleting anything.
stop: install
	$(BIN)/python -m cdc_assets.local_dev stop --spark-connect-port $(SPARK_CONNECT_PORT)

## A Spark standalone cluster on 127.0.0.1 from the pyspark wheel: a master on port 7077 and SPARK_WORKERS workers
## (one core, 1 GB each; JVMs of their own, stopped by process id). It prints the master's URL: use it as
## CDC_SPARK_MASTER (`CDC_SPARK_MASTER=spark://127.0.0.1:7077 make dev`). Logs under .local/spark_cluster/.
SPARK_WORKERS ?= 2
spark-cluster-start: install
	$(BIN)/python -m cdc_assets.local_spark cluster start --workers $(SPARK_WORKERS)

spark-cluster-stop: install
	$(BIN)/python -m cdc_assets.local_spark cluster stop

## The demo's live workload against the local source, until Ctrl-C (run it beside `make dev`).
workload: install
	$(LOCAL_SOURCE) live

lint: install
	$(BIN)/ruff check cdc_assets cdc_assets_tests spark_resources benchmarks

local-source-start: install
	$(LOCAL_SOURCE) start

local-source-stop: install
	$(LOCAL_SOURCE) stop

clean: install
	-$(BIN)/python -m cdc_assets.local_source stop-all
	-$(BIN)/python -m cdc_assets.local_spark connect stop --port $(SPARK_CONNECT_PORT)
	-$(BIN)/python -m cdc_assets.local_spark cluster stop
	-$(BIN)/python -m cdc_assets.local_brokers stop
	rm -rf .local lakehouse lakehouse-mysql cdc_assets/sources/.local_defs_state

## Random kills (not a test; about 15 s a round): `sync` SIGKILLed at random moments KILLS times (default 50) under a
## live workload with DDL and TRUNCATE, each followed by a recovery, verify and the exactly-once oracle; prints a table.
## See docs/reliability.md.
KILLS ?= 50
chaos: install
	$(BIN)/python -m benchmarks.chaos --kills $(KILLS)
