"""A class-data-sharing archive of a Spark driver's classes, so that a run's driver JVM starts in about half the time.

Before a session is up, a driver JVM loads, parses and verifies thousands of classes from Spark's jars, and its first
job thousands more (Catalyst, code generation, Arrow): on this 2-core machine 8.2 s to a local session and 5.9 s to
its first job. A JDK's dynamic CDS archive (`-XX:ArchiveClassesAtExit`, JDK 13+) keeps those classes parsed and
verified; a JVM started with it (`-XX:SharedArchiveFile`) maps them instead: 4.2-4.9 s and 3.1-3.4 s
(benchmarks/README.md, "Fewer driver round trips, fewer jobs, the JVMs' classes archived").

`make install` builds the archive (`python -m spark_resources.class_archive`: a small local session and job, its JVM
told to write the archive as it exits) in `$XDG_CACHE_HOME/cdc-lakehouse/` (default `~/.cache`), under a name that
holds the pyspark version, a digest of the java binary and of the jars it was built with (a dynamic archive holds
the classpath and checks its jars: a virtualenv elsewhere, another clone's, or pyspark installed again does not match
it, and a JVM given an archive that does not match maps none at all, not even the JDK's own, and starts slower than
without; a fresh clone's suite took 48 min instead of 30 so) and the archive's size; it is written under a temporary
name and renamed into place, and only the newest three are kept (KEPT_ARCHIVES: every clone or virtualenv has its
own). A JVM given a truncated archive dies of SIGBUS as it maps it, so an archive is used only
when its size is the one its name holds. A session's driver (spark_resources.session.spark_config) is given it when it is there and starts as
before when it is not. A JVM whose classpath or JDK does not match an archive does not use it (`-Xshare:auto`), and
the JVM's CDS log is off, so nothing is printed either way. Executors map it too when their cluster runs on this
machine (the standalone cluster of `make spark-cluster-start` and the tests): the first job's wait for them fell from
9.7-10.0 s to 6.7-6.8 s here. Elsewhere they are left alone: the file is not on their machines, and a JVM told of a
missing archive maps none, not even the JDK's own.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import time
from importlib.metadata import version
from pathlib import Path

QUIET = "-Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"
KEPT_ARCHIVES = 3  # each clone or virtualenv builds its own (~160 MB): a CI machine cloning for every run keeps these


def _java() -> Path | None:
    """The java binary Spark's launcher runs: JAVA_HOME's, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def archive_stem() -> Path | None:
    """This pyspark's and this java's archive, less its size and suffix; None without a java or pyspark. The
    archive holds the jars' paths: a pyspark installed elsewhere (another virtualenv, another clone) has its own."""
    java, spec = _java(), importlib.util.find_spec("pyspark")
    if java is None or spec is None or spec.origin is None:
        return None
    stat = java.stat()
    jars = Path(spec.origin).parent.resolve() / "jars"
    # the JVM checks the jars it was built from: a pyspark installed again (same path, new files) needs a new one
    held = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in jars.glob("*.jar")) if jars.is_dir() else []
    digest = hashlib.sha256(f"{java}\0{stat.st_size}\0{stat.st_mtime_ns}\0{jars}\0{held}".encode()).hexdigest()[:12]
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "cdc-lakehouse" / f"spark-{version('pyspark')}-driver-classes-{digest}"


def archive_path() -> Path | None:
    """The whole archive of this pyspark and this java, when there is one."""
    stem = archive_stem()
    if stem is None or not stem.parent.is_dir():
        return None
    for path in sorted(stem.parent.glob(f"{stem.name}-*.jsa")):
        size = path.name[len(stem.name) + 1 : -len(".jsa")]
        if size.isdigit() and path.is_file() and path.stat().st_size == int(size):
            return path
    return None


def driver_options() -> str:
    """The driver JVM's options that map the archive, or "" when there is none (or its path would need quoting:
    Spark splits these options on spaces)."""
    path = archive_path()
    if path is None or any(c.isspace() or c in "'\"\\" for c in str(path)):
        return ""
    return f"-XX:SharedArchiveFile={path} {QUIET}"


def build() -> Path | None:
    """Build the archive unless it is there; the archive, or None when this machine cannot have one."""
    stem, built = archive_stem(), archive_path()
    if stem is None or built is not None:
        return built
    stem.parent.mkdir(parents=True, exist_ok=True)
    partial = stem.with_name(f".{stem.name}.{os.getpid()}.partial")
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", f"-Duser.timezone=UTC -XX:ArchiveClassesAtExit={partial} {QUIET}")
        .getOrCreate()
    )
    try:
        _exercise(spark)
    finally:
        gateway = spark.sparkContext._gateway
        spark.stop()
        process = getattr(gateway, "proc", None)
        if process is not None:  # the JVM exits when its stdin closes, and writes the archive as it exits
            process.stdin.close()
            process.wait(timeout=300)
    if not partial.is_file():
        return None
    path = stem.with_name(f"{stem.name}-{partial.stat().st_size}.jsa")
    os.replace(partial, path)
    prune_archives(path.parent, KEPT_ARCHIVES)
    return path


def prune_archives(folder: Path, keep: int) -> list[Path]:
    """Remove all but the `keep` newest archives in `folder` (a JVM that maps one keeps it while it runs; one started
    later without it starts as without an archive), and partial ones an hour old; returns those removed."""
    archives = sorted(folder.glob("spark-*-driver-classes-*.jsa"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    stale = [p for p in folder.glob(".spark-*-driver-classes-*.partial") if time.time() - p.stat().st_mtime > 3600]
    removed = archives[keep:] + stale
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


def _exercise(spark: object) -> None:
    """What a stage run's driver does first: a frame of Arrow rows, Python tasks over a range, a shuffle, a collect."""
    import pyarrow as pa

    def same(batches):  # noqa: ANN001, ANN202 (a task's function)
        yield from batches

    rows = spark.createDataFrame(pa.table({"k": ["a", "b"], "v": [1, 2]}))  # type: ignore[attr-defined]
    tasks = spark.range(0, 8, 1, 2).mapInArrow(same, "id long")  # type: ignore[attr-defined]
    tasks.join(rows.selectExpr("v as id", "k"), "id", "left").repartition(2, "k").groupBy("k").count().collect()


if __name__ == "__main__":
    try:
        built = build()
    except Exception as exc:  # noqa: BLE001 (a session starts without it: say so, do not fail the install)
        print(f"No Spark class archive was built ({type(exc).__name__}: {exc}); Spark sessions start without one.")
        built = None
    if built is None:
        print("No Spark class archive: no java found, or its JVM wrote none; Spark sessions start without one.")
