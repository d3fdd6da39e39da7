"""The Spark driver's class archive (spark_resources.class_archive): `make install` builds it, a session's driver maps
its classes from it, and an archive whose size is not the one its name holds is never given to a JVM (a JVM that maps
a truncated archive dies of SIGBUS). And the JVMs' other start-up option of ours: the JIT's first tier only."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from spark_resources import class_archive
from spark_resources.session import QUICK_JIT, spark_config

FROM_ARCHIVE = "shared objects file (top)"  # the JVM's class+load log: a class of the dynamic archive

# A run's session, the JVM options of CDC_SPARK_CONF (the user's) added to the pipeline's: the class-load log is
# the user's option, the archive and the time zone are ours.
DRIVER = """
import os
import sys
from pyspark.sql import SparkSession
from cdc_assets.core.settings import Settings
from spark_resources.session import spark_config
engine = Settings.from_env(os.environ).engine
spark = SparkSession.builder.config(map=spark_config(engine.spark_master, dict(engine.spark_conf))).getOrCreate()
assert spark.range(0, 8, 1, 2).mapInArrow(lambda batches: batches, "id long").count() == 8
jvm = spark.sparkContext._jvm
system = jvm.java.lang.System
hotspot = jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
jit = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(hotspot).getVMOption("TieredStopAtLevel").getValue()
print(system.getProperty("user.timezone"), system.getProperty("users.own"), jit)
spark.stop()
"""


def test_a_drivers_classes_come_from_the_archive_make_install_built(tmp_path: Path) -> None:
    archive = class_archive.archive_path()
    assert archive is not None, "make install builds it: python -m spark_resources.class_archive"
    assert f"-XX:SharedArchiveFile={archive}" in spark_config("local[1]")["spark.driver.extraJavaOptions"]
    log = tmp_path / "classes.log"
    users = {"spark.driver.extraJavaOptions": f"-Xlog:class+load=info:file={log} -Dusers.own=kept"}
    done = subprocess.run(
        [sys.executable, "-c", DRIVER], capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "CDC_SPARK_MASTER": "local[1]",
             "CDC_SPARK_CONF": json.dumps(users), "TZ": "America/Sao_Paulo"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # the user's options joined ours, not replacing them; a local master's driver runs the tasks: its full JIT (level 4)
    assert done.stdout.split()[-3:] == ["UTC", "kept", "4"]
    sources = dict(line.split("]")[-1].strip().split(" source: ", 1) for line in log.read_text().splitlines() if " source: " in line)
    assert sources["org.apache.spark.SparkContext"] == FROM_ARCHIVE
    assert sum(source == FROM_ARCHIVE for source in sources.values()) > 5000  # ~13,000 of ~19,000 here
    assert "cds" not in done.stderr.lower() and "sharedarchive" not in done.stderr.lower()  # nothing said of it


def test_an_archive_is_given_to_a_driver_only_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    stem = class_archive.archive_stem()
    assert stem is not None
    assert class_archive.archive_path() is None and class_archive.driver_options() == ""  # none built here
    stem.parent.mkdir(parents=True)
    archive = stem.with_name(f"{stem.name}-100.jsa")
    archive.write_bytes(b"\0" * 60)  # cut short: a JVM mapping it would die
    assert class_archive.archive_path() is None
    assert "SharedArchiveFile" not in spark_config("local[1]")["spark.driver.extraJavaOptions"]
    archive.write_bytes(b"\0" * 100)
    assert class_archive.archive_path() == archive
    assert f"-XX:SharedArchiveFile={archive}" in spark_config("local[1]")["spark.driver.extraJavaOptions"]
    assert "spark.driver.extraJavaOptions" not in spark_config("sc://127.0.0.1:15002")  # Connect: no driver here
    # a cluster's executors map it where they run on this machine; elsewhere the file is not there
    assert str(archive) in spark_config("spark://127.0.0.1:7077")["spark.executor.extraJavaOptions"]
    assert "spark.executor.extraJavaOptions" not in spark_config("spark://10.1.2.3:7077")
    assert "spark.executor.extraJavaOptions" not in spark_config("local[2]")  # executors in the driver's JVM


def test_the_jvms_on_this_machine_compile_with_the_first_tier_only_unless_the_user_says() -> None:
    """QUICK_JIT: a cluster's driver (it schedules; its executors are JVMs of their own) and a cluster's executors on
    this machine (which share its cores); a local master's driver, which runs the tasks, and executors on machines of
    their own keep their JIT; a user's own level, added after ours, is the one a JVM takes (test_spark_cluster: the
    executors' commands)."""
    assert QUICK_JIT not in spark_config("local[2]")["spark.driver.extraJavaOptions"].split()
    assert QUICK_JIT in spark_config("spark://10.1.2.3:7077")["spark.driver.extraJavaOptions"].split()
    assert QUICK_JIT in spark_config("spark://127.0.0.1:7077")["spark.executor.extraJavaOptions"].split()
    assert "spark.executor.extraJavaOptions" not in spark_config("spark://10.1.2.3:7077")
    users = spark_config("spark://127.0.0.1:7077", {"spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=4"})
    levels = [o for o in users["spark.executor.extraJavaOptions"].split() if o.startswith("-XX:TieredStopAtLevel=")]
    assert levels == [QUICK_JIT, "-XX:TieredStopAtLevel=4"]
    driver = spark_config("spark://10.1.2.3:7077")["spark.driver.extraJavaOptions"].split()
    flags = subprocess.run(["java", *driver, "-XX:+PrintFlagsFinal", "-version"], capture_output=True, text=True, timeout=60)
    assert re.search(r"\bTieredStopAtLevel\s+= 1\b", flags.stdout), flags.stdout[-2000:] + flags.stderr  # a JVM takes them


def test_only_the_newest_archives_are_kept(tmp_path: Path) -> None:
    made = []
    for n in range(5):  # five clones' archives, oldest first
        archive = tmp_path / f"spark-4.3.0-driver-classes-{n:012x}-10.jsa"
        archive.write_bytes(b"\0" * 10)
        os.utime(archive, ns=(n * 10**9, n * 10**9))
        made.append(archive)
    partial = tmp_path / ".spark-4.3.0-driver-classes-000000000009.77.partial"
    partial.write_bytes(b"\0")
    os.utime(partial, (0, 0))  # a build that died long ago
    fresh = tmp_path / ".spark-4.3.0-driver-classes-000000000010.78.partial"
    fresh.write_bytes(b"\0")  # a build under way
    removed = class_archive.prune_archives(tmp_path, 3)
    assert sorted(removed) == sorted([made[0], made[1], partial])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*(a.name for a in made[2:]), fresh.name])
