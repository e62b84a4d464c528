"""The disk's raw group-commit limit: a write + fdatasync loop, the baseline for bookie figures.

This is what a journal could do with no protocol, no Python request handling and no network:
append ``batch_bytes`` then fdatasync, in a preallocated file, like the journal does.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from .stats import latency_summary


def group_commit_limit(
    directory: Path, batch_bytes: int, duration_s: float, entry_bytes: int = 1024
) -> dict[str, float]:
    """Entries/s and fsync latency for batches of ``batch_bytes`` written with fdatasync.

    Starts with a ``sync()``: the write-back of what earlier phases left in the page cache is
    not part of the disk's limit."""
    os.sync()
    path = Path(directory) / f"disk-baseline-{batch_bytes}.bin"
    block = os.urandom(batch_bytes)
    prealloc = 64 * 1024 * 1024
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
    try:
        # Real zeros, like the journal's preallocation: fdatasync then has no extent to convert.
        zeros = bytes(1 << 20)
        for i in range(prealloc >> 20):
            os.pwrite(fd, zeros, i << 20)
        os.fsync(fd)
        latencies: list[float] = []
        offset, batches = 0, 0
        start = time.perf_counter()
        while time.perf_counter() - start < duration_s:
            t0 = time.perf_counter()
            os.pwrite(fd, block, offset)
            os.fdatasync(fd)
            latencies.append(time.perf_counter() - t0)
            offset = (offset + batch_bytes) % (prealloc - batch_bytes)
            batches += 1
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return {
        "batch_bytes": batch_bytes,
        "fsyncs_per_s": batches / elapsed,
        "entries_per_s": batches * (batch_bytes / entry_bytes) / elapsed,
        **latency_summary(latencies),
    }
