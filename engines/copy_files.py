"""Copy files: autorecovery's deferred-sync copies written straight into SST files, which the
rocksdb engine ingests at its next sync, around its memtables and their paced flushes.

Theory of operation
-------------------
A deferred-sync copy (``protocol.ADD_FLAG_DEFERRED_SYNC``, bookie/deferred.py) is relied on by
nobody until a sync after it: a listing of its ledger waits for one. Through the memtables such
a copy cost its target a flush, and flushes are paced (``engine_write_rate_bytes_per_s``) so
that writers' journal fdatasyncs do not wait behind them: re-replication ran at that rate, 56-88
MB/s with the default 64 MiB/s, on a disk that copies ~200-400 MiB/s (docs/performance.md,
"What bounds the copy").
So the rocksdb engine hands them here instead:

* each ledger's copies go, in ascending key order, into an SST file of its own written with
  RocksDB's ``SstFileWriter`` under ``<ledger dir>/copy-files/``; a file past ``file_bytes`` is
  *sealed* (takes no more) and the ledger's next copy starts another;
* a sync seals every file, ``fdatasync``s them (outside the engine's lock, without the GIL),
  then under the lock finishes each one (its last blocks and footer, a small fsync), ingests it
  into ``COPIES_CF`` by moving it (a hard link: the payload is written once) and hands back the
  batch index entries, which the engine writes and makes durable in the same sync. An ingested
  file skips the memtables, so the rate limiter never sees it; the copy is paced by the
  replication workers' own ``replication_rate_bytes_per_s`` instead;
* a read, a listing or a delete of a ledger with copies still here ingests them first (reads)
  or drops them (delete) under the lock: rare, since nothing reads a target's copies before a
  listing, and a listing waits for a sync.

A crash before the sync loses the files' copies, as it lost them from the memtable before (no
journal covers them); opening removes what a crash left in the dir, and the listing after the
restart finds them missing. At most ``OPEN_LEDGERS_MAX`` ledgers have a file being written (each
holds RocksDB's index and filter blocks and a 1 MiB write buffer): past that, a copy goes
through the memtables (``add`` answers False).

Threading: every method runs under the engine's lock, except :func:`sync_data`.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field

from rocksdict import DBCompressionType, Options, SstFileWriter

OPEN_LEDGERS_MAX = 16  # ledgers with a copy file being written at once
DIR_NAME = "copy-files"


@dataclass(eq=False)
class CopyFile:
    """One SST file of one ledger's copies, in the order its keys were added."""

    ledger_id: int
    path: str
    writer: SstFileWriter | None
    index: list[tuple[bytes, bytes]] = field(default_factory=list)  # (batch key, index value)
    size: int = 0  # payload bytes
    sealed: bool = False  # takes no more copies
    done: bool = False  # ingested or dropped


class CopyFiles:
    """The copy files of one rocksdb engine (module docstring).

    Raises (on open):
        OSError: the dir cannot be emptied or created.
    """

    def __init__(self, directory: str, file_bytes: int) -> None:
        assert file_bytes > 0
        self.directory = directory
        self.file_bytes = file_bytes
        # A crash's leftovers: never ingested, never listed, so never relied on.
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        self._files: dict[int, list[CopyFile]] = {}  # ledger -> its files, oldest first
        self._open = 0  # files not sealed
        self._made = 0
        self.ingested_files = 0
        self.ingested_bytes = 0

    def add(self, ledger_id: int, key: bytes, value: bytes, index_value: bytes) -> bool:
        """Write one batch into the ledger's open file; False if too many ledgers have one
        and this one has none. Batches come in ascending key order (the engine's batches lie
        above the ledger's last entry); one that does not starts a file of its own."""
        files = self._files.get(ledger_id)
        current = files[-1] if files and not files[-1].sealed else None
        if current is not None and current.index and key <= current.index[-1][0]:
            self._seal(current)  # an SST's keys ascend
            current = None
        if current is None:
            if self._open >= OPEN_LEDGERS_MAX:
                return False
            current = self._new_file(ledger_id)
            self._files.setdefault(ledger_id, []).append(current)
        assert current.writer is not None
        current.writer[key] = value
        current.index.append((key, index_value))
        current.size += len(value)
        if current.size >= self.file_bytes:
            self._seal(current)
        return True

    def _new_file(self, ledger_id: int) -> CopyFile:
        self._made += 1
        path = os.path.join(self.directory, f"{ledger_id}-{self._made}.sst")
        writer = SstFileWriter(_writer_options())
        writer.open(path)
        self._open += 1
        return CopyFile(ledger_id, path, writer)

    def _seal(self, file: CopyFile) -> None:
        if not file.sealed:
            file.sealed = True
            self._open -= 1

    def pending(self, ledger_id: int) -> bool:
        """Whether the ledger has copies here, not ingested yet."""
        return ledger_id in self._files

    def seal_all(self) -> list[CopyFile]:
        """Seal every file and return them all (a sync begins: it ingests these)."""
        files = [f for ledger_files in self._files.values() for f in ledger_files]
        for file in files:
            self._seal(file)
        return files

    def take(self, ledger_id: int) -> list[CopyFile]:
        """Seal and return the ledger's files (to ingest them now)."""
        files = self._files.get(ledger_id, [])
        for file in files:
            self._seal(file)
        return list(files)

    def ingest(
        self,
        files: list[CopyFile],
        ingest_file: Callable[[str], None],
        write_index: Callable[[list[tuple[bytes, bytes]]], None],
    ) -> None:
        """Finish and ingest (``ingest_file(path)``) each file not done yet, oldest first,
        and write its index entries (``write_index``) once its payloads are in the DB. A file
        that fails is dropped with the rest of its ledger's (lost, as in a crash), and the
        error raised as an OSError."""
        for file in files:
            if file.done:
                continue  # ingested by a read, or dropped by a delete, meanwhile
            try:
                assert file.writer is not None
                file.writer.finish()
                file.writer = None
                ingest_file(file.path)
            except Exception as exc:  # rocksdict raises a bare Exception
                self.drop(file.ledger_id)
                raise OSError(errno.EIO, f"ingesting copy file {file.path} failed: {exc}") from exc
            file.done = True
            write_index(file.index)
            self.ingested_files += 1
            self.ingested_bytes += file.size
            self._forget(file)

    def _forget(self, file: CopyFile) -> None:
        files = self._files.get(file.ledger_id)
        if files is not None:
            files.remove(file)
            if not files:
                del self._files[file.ledger_id]

    def drop(self, ledger_id: int) -> None:
        """Forget the ledger's files and delete them (the ledger is deleted, or its copies
        lost)."""
        for file in self._files.pop(ledger_id, []):
            if not file.sealed:
                self._open -= 1
            file.sealed = file.done = True
            file.writer = None  # closes its descriptor
            try:
                os.remove(file.path)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        """Drop every file (the engine closes; a sync before it ingested what it could)."""
        for ledger_id in list(self._files):
            self.drop(ledger_id)


def sync_data(files: list[CopyFile]) -> None:
    """``fdatasync`` the files' bytes written so far, without the GIL and outside the engine's
    lock, so that finishing them under it syncs only their tails. A file gone meanwhile
    (ingested by a read, dropped) is skipped."""
    for file in files:
        try:
            fd = os.open(file.path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)


def _writer_options() -> Options:
    """The files' options: bytewise raw keys as the DB's, no compression (as COPIES_CF)."""
    options = Options(raw_mode=True)
    options.set_compression_type(DBCompressionType.none())
    return options
