"""What the rocksdb engine knows of its data in memory: the batches its reads parsed
(:class:`ParsedBatches`) and the batches still in a memtable (:class:`MemtableBatches`).

Both answer one question cheaply, without RocksDB: whether a read needs the DB at all, and
whether it may have to wait for the disk. Reading a batch's entries one by one (a tailing or
catching-up reader) parses the batch once and then slices it; a read of a batch still in a
memtable never waits for the disk, so the bookie serves it on its event loop instead of a read
thread (``RocksDBEngine.can_read_now``, bookie/read_pool.py). Neither holds a lock: the
engine's lock guards :class:`ParsedBatches`, and :class:`MemtableBatches` changes on the
event loop's thread only (``sync()``'s thread sets one integer: :meth:`MemtableBatches.flushed`).
"""

from __future__ import annotations

from collections import OrderedDict, deque

from .rocksdb_keys import _ID_MAX, _Batch

PARSED_COUNT_MAX = 16  # batches kept parsed (each read looks through them)
RECENT_MAX = 65_536  # batches known to be in a memtable (tiny entries: a few MiB of them)


class ParsedBatches:
    """Batches parsed by reads, newest last, keyed by (ledger id, first entry id): at most
    ``PARSED_COUNT_MAX`` of them and ``bytes_max`` bytes of values (a batch bigger than that
    is not kept). The engine's lock held for every call."""

    __slots__ = ("_batches", "bytes_max", "value_bytes")

    def __init__(self, bytes_max: int) -> None:
        self._batches: OrderedDict[tuple[int, int], _Batch] = OrderedDict()
        self.value_bytes = 0  # the kept values' bytes
        self.bytes_max = bytes_max

    def __len__(self) -> int:
        return len(self._batches)

    def get(self, ledger_id: int, first: int) -> _Batch | None:
        """The batch kept under its exact key, or None."""
        return self._batches.get((ledger_id, first))

    def find(self, ledger_id: int, entry_id: int) -> _Batch | None:
        """The kept batch whose id range covers ``entry_id``, or None."""
        for (lid, first), batch in reversed(self._batches.items()):
            if lid == ledger_id and first <= entry_id <= batch.last:
                return batch
        return None

    def remember(self, ledger_id: int, first: int, batch: _Batch) -> None:
        """Keep a batch just read (replacing one kept under its key: two threads read it at
        once), then drop the oldest until within both bounds."""
        if len(batch.value) > self.bytes_max:
            return
        old = self._batches.pop((ledger_id, first), None)
        if old is not None:
            self.value_bytes -= len(old.value)
        self._batches[(ledger_id, first)] = batch
        self.value_bytes += len(batch.value)
        while self.value_bytes > self.bytes_max or len(self._batches) > PARSED_COUNT_MAX:
            self.value_bytes -= len(self._batches.popitem(last=False)[1].value)

    def drop_ledger(self, ledger_id: int) -> None:
        """Forget a deleted ledger's batches."""
        for key in [k for k in self._batches if k[0] == ledger_id]:
            self.value_bytes -= len(self._batches.pop(key).value)


class MemtableBatches:
    """Which batches are still in a memtable: those written less than a memtable's bytes
    (``memtable_bytes``) ago and since the last flush ``sync()`` made (without the WAL it
    flushes the memtables), at most ``RECENT_MAX`` of them. Per ledger it keeps the first id
    from which every batch of the ledger is among them; a ledger is absent when none is (or
    when its newest entries reached the DB another way: copy files ingested, a delete)."""

    __slots__ = ("_first", "_flushed_at", "_memtable_bytes", "_recent", "put_bytes")

    def __init__(self, memtable_bytes: int) -> None:
        self._memtable_bytes = memtable_bytes
        # Oldest first: (put_bytes after the batch, its ledger, its last id).
        self._recent: deque[tuple[int, int, int]] = deque()
        self._first: dict[int, int] = {}
        self.put_bytes = 0  # payload bytes of the batches written since open
        self._flushed_at = 0  # put_bytes when sync() last flushed the memtables

    def added(self, ledger_id: int, first: int, last: int, size: int) -> None:
        """A batch of ``size`` payload bytes, ids ``first`` to ``last``, went to a memtable."""
        self.put_bytes += size
        self._first.setdefault(ledger_id, first)
        self._recent.append((self.put_bytes, ledger_id, last))
        self._forget_flushed()

    def holds(self, ledger_id: int, entry_id: int) -> bool:
        """Whether the ledger's batch holding ``entry_id`` (if any) is in a memtable: the
        event loop's thread, which ages out what a flush has written by now."""
        self._forget_flushed()
        first = self._first.get(ledger_id)
        return first is not None and entry_id >= first

    def holds_batch(self, ledger_id: int, first: int) -> bool:
        """Whether the ledger's batch starting at ``first`` was in a memtable when the event
        loop last looked (any thread: ages nothing out)."""
        return self._first.get(ledger_id, _ID_MAX) <= first

    def forget_ledger(self, ledger_id: int) -> None:
        """The ledger's batches no longer count as in memory (its later ones will again);
        its entries in the queue age out alone."""
        self._first.pop(ledger_id, None)

    def flushed(self, put_bytes: int) -> None:
        """``sync()`` flushed the memtables, which then held the batches written until
        ``put_bytes`` (read before the flush)."""
        self._flushed_at = put_bytes

    def _forget_flushed(self) -> None:
        recent, first = self._recent, self._first
        if not recent:
            return
        oldest = max(self.put_bytes - self._memtable_bytes, self._flushed_at)
        while recent and (recent[0][0] <= oldest or len(recent) > RECENT_MAX):
            _, ledger_id, last = recent.popleft()
            if ledger_id in first:  # (not forgotten since)
                first[ledger_id] = last + 1  # its later batches are still in memory
