"""A local SparkSession for tests, benchmarks, examples and development on one machine.

Spark binds its driver to the host's first non-loopback address by default; here everything
stays on 127.0.0.1 (the machine may have no other network), the web UI and the console
progress bars are off, and the Python workers run this interpreter (``PYSPARK_PYTHON``:
otherwise they may run another Python, without this package).
"""

from __future__ import annotations

import os
import sys
from typing import Any


def local_session(app_name: str = "bookkeeper-aio", master: str = "local[2]", **conf: str) -> Any:
    """``SparkSession.builder.getOrCreate()`` for ``master`` (``local[N]``, or ``local[N,F]``
    to try a failed task F times), bound to 127.0.0.1, with ``conf`` (Spark keys contain dots:
    ``local_session(**{"spark.sql.shuffle.partitions": "4"})``)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


__all__ = ["local_session"]
