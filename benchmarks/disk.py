"""The disk's raw limits, the baselines of the bookie figures.

:func:`group_commit_limit`: what a journal could do with no protocol, no Python request handling
and no network: append ``batch_bytes`` then fdatasync, in a preallocated file, like the journal
does once its files are recycled (written blocks, overwritten). :func:`new_blocks_limit`: what
the disk writes into blocks never written before, as three fresh bookies' journals and engines
do: several streams appending with fdatasync to new fallocated files. :func:`copy_limit`: what a
re-replication could do: read data the page cache does not hold and write it to another file,
synced.
"""

from __future__ import annotations

import mmap
import os
import queue
import threading
import time
from pathlib import Path

from bookkeeper_aio.direct_io import open_file

from .stats import latency_summary

_COPY_CHUNKS_AHEAD = 4  # copy_limit: chunks read and not yet written, at most


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
        # Real zeros, as in a journal file recycled by a checkpoint (a bookie's steady state):
        # fdatasync then has no extent to convert. New blocks (a fresh bookie's fallocated
        # journal, its engine's new files) are slower on some disks: ~190 MB/s against ~475
        # on the benchmarks' VM (docs/performance.md, "The journal's preallocation").
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


_STEP_BYTES = 1 << 20  # new_blocks_limit: fallocated ahead a step at a time, as the journal


def new_blocks_limit(
    directory: Path, batch_bytes: int, duration_s: float, streams: int = 3
) -> dict[str, float]:
    """MB/s (10**6 bytes) that ``streams`` threads write together, each appending
    ``batch_bytes`` then fdatasync to a new file whose blocks it fallocates a step ahead (as a
    fresh bookie's journal does; O_DIRECT where the fs allows): the disk's rate for blocks
    never written before. Three bookies on one disk each write every entry twice (journal and
    engine), so their bytes against this say how near the disk a closed loop is."""
    os.sync()
    buffer = mmap.mmap(-1, batch_bytes)  # page-aligned, as O_DIRECT needs
    buffer.write(os.urandom(batch_bytes))
    batches = [0] * streams
    latencies: list[list[float]] = [[] for _ in range(streams)]
    failed: list[BaseException] = []
    deadline = time.perf_counter() + duration_s

    def append(i: int) -> None:
        path = Path(directory) / f"disk-new-blocks-{i}.bin"
        try:
            fd, _ = open_file(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC)
            try:
                allocated = offset = 0
                while time.perf_counter() < deadline:
                    while offset + batch_bytes > allocated:
                        os.posix_fallocate(fd, allocated, _STEP_BYTES)
                        allocated += _STEP_BYTES
                    t0 = time.perf_counter()
                    os.pwrite(fd, buffer, offset)
                    os.fdatasync(fd)
                    latencies[i].append(time.perf_counter() - t0)
                    offset += batch_bytes
                    batches[i] += 1
            finally:
                os.close(fd)
                path.unlink(missing_ok=True)
        except BaseException as exc:  # raised below, in the caller's thread
            failed.append(exc)

    start = time.perf_counter()
    threads = [threading.Thread(target=append, args=(i,)) for i in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    buffer.close()
    if failed:
        raise RuntimeError(f"new_blocks_limit failed: {failed[0]!r}") from failed[0]
    return {
        "streams": streams,
        "batch_bytes": batch_bytes,
        "mb_per_s": sum(batches) * batch_bytes / elapsed / 1e6,
        **latency_summary([t for stream in latencies for t in stream]),
    }


def copy_limit(
    directory: Path, total_bytes: int, chunk_bytes: int = 1 << 20, sync_bytes: int = 64 << 20
) -> dict[str, float]:
    """MiB/s of the disk copying ``total_bytes`` it does not hold in the page cache from one
    file to another: the baseline of a re-replication, which reads what the engines flushed
    around the page cache and writes it again (docs/performance.md, ``rereplication``).

    The source is written first with O_DIRECT (and its cached pages, if any, dropped), so the
    copy reads it from the device, as a source bookie reads its flushed SSTs and blob files.
    A reader thread reads ``chunk_bytes`` at a time ahead of the writer (at most four chunks);
    the writer writes them with O_DIRECT (as RocksDB's flushes do) and fdatasyncs every
    ``sync_bytes`` and at the end (a memtable's flush, a checkpoint). No protocol, no Python
    request handling, no network: what a copy could do on this disk. The clock runs from the
    first read to the last fdatasync."""
    os.sync()
    total_bytes = max(chunk_bytes, total_bytes - total_bytes % chunk_bytes)
    src, dst = Path(directory) / "disk-copy-src.bin", Path(directory) / "disk-copy-dst.bin"
    buffers = [mmap.mmap(-1, chunk_bytes) for _ in range(_COPY_CHUNKS_AHEAD)]
    buffers[0].write(os.urandom(chunk_bytes))
    try:
        fd, _ = open_file(src, os.O_CREAT | os.O_WRONLY | os.O_TRUNC)
        try:
            for offset in range(0, total_bytes, chunk_bytes):
                os.pwrite(fd, buffers[0], offset)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # a buffered fallback's pages
        finally:
            os.close(fd)
        free: queue.Queue[mmap.mmap] = queue.Queue()
        full: queue.Queue[tuple[mmap.mmap, int] | None] = queue.Queue()
        for buffer in buffers:
            free.put(buffer)
        failed: list[BaseException] = []
        stop = threading.Event()
        start = time.perf_counter()
        reader = threading.Thread(
            target=_read_ahead, args=(src, total_bytes, chunk_bytes, free, full, failed, stop)
        )
        reader.start()
        copied = 0
        fd, _ = open_file(dst, os.O_CREAT | os.O_WRONLY | os.O_TRUNC)
        try:
            while (item := full.get()) is not None:
                buffer, offset = item
                os.pwrite(fd, buffer, offset)
                free.put(buffer)
                copied += chunk_bytes
                if copied % sync_bytes < chunk_bytes:
                    os.fdatasync(fd)
            os.fdatasync(fd)
        finally:
            os.close(fd)
            stop.set()  # the writer failed: the reader ends at its next chunk
            for buffer in buffers:  # (and wakes up if it waits for a free buffer)
                free.put(buffer)
            reader.join()
        elapsed = time.perf_counter() - start
        if failed or copied != total_bytes:
            raise RuntimeError(f"copy_limit read {copied} of {total_bytes} bytes: {failed}")
    finally:
        for buffer in buffers:
            buffer.close()
        src.unlink(missing_ok=True)
        dst.unlink(missing_ok=True)
    return {"copy_bytes": total_bytes, "copy_mib_per_s": total_bytes / (1 << 20) / elapsed}


def _read_ahead(
    path: Path,
    total_bytes: int,
    chunk_bytes: int,
    free: queue.Queue[mmap.mmap],
    full: queue.Queue[tuple[mmap.mmap, int] | None],
    failed: list[BaseException],
    stop: threading.Event,
) -> None:
    """:func:`copy_limit`'s reader: each chunk into a free buffer, handed to the writer; it
    stops at the first short read or error (``failed``), or once ``stop`` is set."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            for offset in range(0, total_bytes, chunk_bytes):
                buffer = free.get()
                if stop.is_set():
                    break
                if os.preadv(fd, [buffer], offset) != chunk_bytes:
                    raise OSError(f"short read at {offset}")
                full.put((buffer, offset))
        finally:
            os.close(fd)
    except BaseException as exc:  # told to the writer, which raises it
        failed.append(exc)
    finally:
        full.put(None)
