"""The reference engine: plain dicts, with a simulated disk so crashes can be modelled.

Theory of operation
-------------------
Reads and writes go to a working copy. Every write is also appended to a pending list;
``sync()`` applies the pending list to a :class:`MemoryDisk`, the part that "survives a crash".
Reopening an engine on the same disk starts from the synced state only, which is exactly what a
crash that loses unsynced writes leaves behind. The simulator and the unit tests use this; the
bookie's ``--engine memory`` uses a fresh disk (nothing survives a restart).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from bookkeeper_aio.engine import LedgerInfo, Record

_Write = tuple[str, int, int, object]  # (kind, ledger_id, entry_id, value)


@dataclass
class MemoryDisk:
    """The durable state of a memory engine: what a crash keeps."""

    entries: dict[int, dict[int, bytes]] = field(default_factory=dict)
    ledgers: dict[int, LedgerInfo] = field(default_factory=dict)
    syncs: int = 0

    def apply(self, writes: list[_Write]) -> None:
        """Apply writes in order (used by sync and by crash models that keep a prefix)."""
        for kind, ledger_id, entry_id, value in writes:
            if kind == "entry":
                assert isinstance(value, bytes)
                self.entries.setdefault(ledger_id, {})[entry_id] = value
            elif kind == "ledger":
                assert isinstance(value, LedgerInfo)
                self.ledgers[ledger_id] = value
            else:
                self.entries.pop(ledger_id, None)
                self.ledgers.pop(ledger_id, None)


class MemoryEngine:
    """An :class:`~bookkeeper_aio.engine.Engine` in memory, durable only up to ``sync()``."""

    def __init__(self, disk: MemoryDisk | None = None) -> None:
        self.disk = disk if disk is not None else MemoryDisk()
        self._entries = {lid: dict(es) for lid, es in self.disk.entries.items()}
        self._ledgers = dict(self.disk.ledgers)
        self._last = {lid: max(es) for lid, es in self._entries.items() if es}
        self._pending: list[_Write] = []
        self._lock = threading.Lock()
        self._closed = False

    def put_entry(self, ledger_id: int, entry_id: int, record: Record) -> None:
        assert not self._closed
        self._entries.setdefault(ledger_id, {})[entry_id] = bytes(record)
        if entry_id > self._last.get(ledger_id, -1):
            self._last[ledger_id] = entry_id
        with self._lock:
            self._pending.append(("entry", ledger_id, entry_id, bytes(record)))

    def put_entries(
        self,
        ledger_id: int,
        entries: list[tuple[int, Record]],
        packed: bytes | None = None,
        recovery: bool = False,
        deferred: bool = False,
    ) -> None:
        for entry_id, record in entries:
            self.put_entry(ledger_id, entry_id, record)

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        return self._entries.get(ledger_id, {}).get(entry_id)

    def can_read_now(self, ledger_id: int, entry_id: int) -> bool:
        return True  # everything is in memory

    def write_pressure(self) -> bool:
        return False

    def last_entry_id(self, ledger_id: int) -> int:
        return self._last.get(ledger_id, -1)

    def list_entries(self, ledger_id: int, start_entry_id: int, max_count: int) -> list[int]:
        ids = sorted(e for e in self._entries.get(ledger_id, {}) if e >= start_entry_id)
        return ids[:max_count]

    def get_ledger(self, ledger_id: int) -> LedgerInfo | None:
        return self._ledgers.get(ledger_id)

    def put_ledger(self, ledger_id: int, info: LedgerInfo) -> None:
        assert not self._closed
        self._ledgers[ledger_id] = info
        with self._lock:
            self._pending.append(("ledger", ledger_id, 0, info))

    def delete_ledger(self, ledger_id: int) -> None:
        assert not self._closed
        self._entries.pop(ledger_id, None)
        self._ledgers.pop(ledger_id, None)
        self._last.pop(ledger_id, None)
        with self._lock:
            self._pending.append(("delete", ledger_id, 0, None))

    def ledgers(self) -> list[int]:
        return sorted(set(self._ledgers) | {lid for lid, es in self._entries.items() if es})

    def unsynced_writes(self) -> list[_Write]:
        """Writes not yet synced, oldest first (crash models choose which of them survive)."""
        with self._lock:
            return list(self._pending)

    def reclaim_space(self, live_ratio_min: float) -> int:
        return 0  # a deleted ledger's dicts are gone with it

    def sync(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
            self.disk.apply(pending)
            self.disk.syncs += 1

    def close(self) -> None:
        if not self._closed:
            self.sync()
            self._closed = True
