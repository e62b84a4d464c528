"""Deferred-sync copies: autorecovery's copies stored without the journal, durable at the
bookie's next engine sync (``protocol.ADD_FLAG_DEFERRED_SYNC``).

Theory of operation
-------------------
A copy journaled like a writer's add cost its target the copied bytes ~2.7 times on disk: the
journal record, the zero-fill ahead of a fresh journal file, then the engine's memtable flush
(docs/performance.md at 909bfe3, ``rereplication``; the journal now fallocates instead of the
zero-fill, which leaves ~1.7 times); and its fdatasyncs queued behind the writers'
on the same journal. A copy needs none of that to be safe, because nothing relies on it until a
worker has *listed* it: the worker swaps the target into the ledger's ensemble, or deletes the mark,
only after a listing of the target found the copies (autorecovery/worker.py). So:

* an add with ``ADD_FLAG_RECOVERY | ADD_FLAG_DEFERRED_SYNC`` is put into the engine and
  answered at once, and its ledger is noted here with the number of engine syncs begun so far;
* every engine sync (the bookie's checkpoint) notes when it begins and, once it returned,
  clears the ledgers whose copies were stored before it began;
* a ``ListEntriesRequest`` of a ledger with copies not yet synced waits for such a sync first
  (bookie/handler.py; at most ``list_sync_timeout_s``, then IO_ERROR): whatever a listing
  reports is durable. Checkpoints run one at a time, each numbered when it begins (not when
  it was asked for), and a listing's checkpoint whose turn comes after another covered its
  ledger is skipped: the listings of autorecovery's workers, arriving together, share one
  engine flush instead of queueing one each.

A crash before that sync loses the copies (the rocksdb engine keeps them in SST files it
ingests at its sync, engines/copy_files.py, or in its memtable, which no journal covers); the
listing after the restart finds them missing and they are copied again. The state is a dict
of ledger ids, emptied by every checkpoint (``checkpoint_interval_s``).
"""

from __future__ import annotations


class DeferredCopies:
    """The ledgers that hold copies not yet covered by an engine sync (module docstring)."""

    def __init__(self) -> None:
        self._begun = 0  # engine syncs begun
        self._unsynced: dict[int, int] = {}  # ledger -> syncs begun when its last copy came

    def stored(self, ledger_id: int) -> None:
        """Copies of the ledger were put into the engine, not journaled."""
        self._unsynced[ledger_id] = self._begun

    def pending(self, ledger_id: int) -> bool:
        """Whether the ledger has copies that no finished sync covers."""
        return ledger_id in self._unsynced

    def sync_begins(self) -> int:
        """An engine sync is about to begin; pass what this returns to :meth:`synced` once it
        returned."""
        begun = self._begun
        self._begun += 1
        return begun

    def synced(self, begun: int) -> None:
        """The sync :meth:`sync_begins` numbered ``begun`` returned: every copy stored before
        it began is durable."""
        done = [lid for lid, at in self._unsynced.items() if at <= begun]
        for lid in done:
            del self._unsynced[lid]

    def __len__(self) -> int:
        return len(self._unsynced)
