"""The storage-engine seam: what a bookie needs from its ledger storage.

Theory of operation
-------------------
An engine stores two things per ledger: entries (``entry_id -> record bytes``, the record being
opaque to the engine) and one :class:`LedgerInfo` (master key, fenced, limbo, explicit LAC).
The interface is small and **synchronous** (STYLE.md guideline 12); the bookie decides where
blocking happens.

Durability contract
    Writes (``put_entry``, ``put_ledger``, ``delete_ledger``) may be buffered. ``sync()`` makes
    every write that returned before ``sync()`` was called durable: after a crash and reopen
    they are all there, byte for byte. A crash may lose writes made after the last ``sync()``
    (some, all or none of them) but never returns a torn or corrupt record: a lost write is
    absent, a present write is whole.

Threading contract
    All methods are called from one thread (the bookie's event loop), except ``sync()`` and
    ``reclaim_space()``, which the bookie may run in one worker thread at the same time as the
    other methods, and ``get_entry()`` of an entry ``can_read_now()`` said no for, which it
    may run in several read threads at once (bookie/read_pool.py). Implementations lock what
    they must for that.

Reads see every write already made, synced or not.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import msgpack


@dataclass(frozen=True)
class LedgerInfo:
    """What a bookie knows about a ledger besides its entries."""

    master_key: bytes = b""
    fenced: bool = False
    limbo: bool = False  # BP-46: never answer an explicit negative for this ledger
    explicit_lac: bytes = b""  # a packed LacProof; empty if none was written
    # BP-31: the ledger's metadata as the bookie last read it (metadata/ledger_record.py), for
    # rebuilding the metadata store if it is lost; empty until read.
    record: bytes = b""

    def to_bytes(self) -> bytes:
        """A compact, versioned encoding for engines that store bytes (version 1 without a
        record, as before records existed; version 2 with one)."""
        fields = [self.master_key, self.fenced, self.limbo, self.explicit_lac]
        if self.record:
            return msgpack.packb([2, *fields, self.record])
        return msgpack.packb([1, *fields])

    @classmethod
    def from_bytes(cls, data: bytes) -> LedgerInfo:
        """Inverse of :meth:`to_bytes`.

        Raises:
            ValueError: not an encoding of a known version.
        """
        fields = msgpack.unpackb(data, raw=False, max_map_len=0)
        known = isinstance(fields, list) and fields and (fields[0], len(fields)) in _ENCODINGS
        if not known:
            raise ValueError(f"not a LedgerInfo v1 or v2 encoding: {data[:40]!r}")
        return cls(*fields[1:])

    def replace(self, **changes: Any) -> LedgerInfo:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


_ENCODINGS = ((1, 5), (2, 6))  # (version, fields): without a record, with one

# An entry's record as put_entries takes it: bytes, or a view of the request it came in.
Record = bytes | memoryview


@runtime_checkable
class Engine(Protocol):
    """Ledger storage: entries and ledger infos, synchronous, with ``sync()`` as durability."""

    def put_entry(self, ledger_id: int, entry_id: int, record: Record) -> None:
        """Store (or overwrite) one entry's record."""

    def put_entries(
        self,
        ledger_id: int,
        entries: list[tuple[int, Record]],
        packed: bytes | None = None,
        recovery: bool = False,
        deferred: bool = False,
    ) -> None:
        """Store (entry id, record) pairs of one ledger, in order: ``put_entry`` for each,
        with the per-call work done once (the bookie's batched adds). A record may be a view
        of the request it came in; the engine copies what it keeps. ``packed``, if given,
        is the same entries as an add batch carries them (``protocol.PACKED_ENTRY_PREFIX``,
        then the record, per entry), which an engine may store as they are. ``recovery``:
        written by a recovery add (a copy autorecovery makes, a recovery's write-back),
        which an engine may store apart from what writers add (the rocksdb engine does).
        ``deferred``: recovery adds nothing relies on before the next ``sync()`` (autorecovery's
        deferred-sync copies, bookie/deferred.py), which an engine may write outside its
        write path as long as reads still see them (the rocksdb engine: SST files it ingests,
        engines/copy_files.py)."""

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        """The record of an entry, or None if absent."""

    def can_read_now(self, ledger_id: int, entry_id: int) -> bool:
        """Whether ``get_entry`` would answer from memory (a cached, recent or absent entry).
        When it is False the bookie reads the entry in a read thread, so that a wait on the
        disk stops neither its event loop nor its other reads; ``get_entry`` must then be
        safe in several threads at once. Cheap: called on every read."""

    def write_pressure(self) -> bool:
        """Whether writes have run so far ahead of the engine's background work (rocksdb:
        memtables waiting for their flush) that more could block the caller; the bookie then
        stops reading requests until it is False. Cheap: called every few MiB written."""

    def last_entry_id(self, ledger_id: int) -> int:
        """The highest entry id stored for the ledger, or -1 if none."""

    def list_entries(self, ledger_id: int, start_entry_id: int, max_count: int) -> list[int]:
        """Up to ``max_count`` stored entry ids >= ``start_entry_id``, ascending."""

    def get_ledger(self, ledger_id: int) -> LedgerInfo | None:
        """The ledger's info, or None if none was stored."""

    def put_ledger(self, ledger_id: int, info: LedgerInfo) -> None:
        """Store (or replace) the ledger's info."""

    def delete_ledger(self, ledger_id: int) -> None:
        """Remove the ledger's info and all its entries (no-op if absent)."""

    def reclaim_space(self, live_ratio_min: float) -> int:
        """Give the disk space of deleted ledgers back; return the bytes freed (measured).
        Crash-safe at every step: a crash loses nothing live and brings nothing deleted back.
        May run in a worker thread at the same time as the other methods (like ``sync``).
        ``live_ratio_min``: engines that rewrite files rewrite those whose live fraction fell
        below it."""

    def ledgers(self) -> list[int]:
        """Ids of every ledger with an info or at least one entry, ascending."""

    def sync(self) -> None:
        """Make every write that returned before this call durable."""

    def close(self) -> None:
        """Sync and release files and locks; the engine is unusable afterwards."""
