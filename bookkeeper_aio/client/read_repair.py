"""Read repair: a bad copy a read met is replaced by the good copy the read found (BP-31 "no
repair in the read path": *in addition to finding a good replica, repair the bad one*).

Theory of operation
-------------------
:func:`~bookkeeper_aio.client.reads.read_entry` reads the replicas of an entry one after the
other; a replica that answers a confirmed entry with a corrupt copy (its digest does not
match), BAD_DIGEST or IO_ERROR holds the entry but cannot give it intact. When a good copy turns
up, the read hands both to :meth:`ReadRepair.note`, and once the read is answered
:meth:`ReadRepair.run` writes the good copy back to each bad replica with the recovery flag
(:func:`~bookkeeper_aio.client.reads.write_copy`: the bookie checks the digest again and
overwrites its copy; the ledger may be fenced or closed). The master key comes from the
ledger's metadata, as autorecovery's does.

A write-back that fails (the bookie's disk is out of service, it went away, the ledger has no
master key in its metadata) falls back to a mark for autorecovery (:class:`ShortCopies`), as
does a read that found no good copy at all. Copies waiting for repair are bounded by
``REPAIRS_MAX`` per read; past it they are marked instead (the worker rewrites them).
"""

from __future__ import annotations

import asyncio
import logging

from ..metadata.model import LedgerMetadata
from ..protocol import ReadResponse
from .context import ClientContext
from .reads import write_copy
from .short_copies import ShortCopies

log = logging.getLogger(__name__)

REPAIRS_MAX = 1_000  # copies held for write-back by one read call; past it: marked


class ReadRepair:
    """Bad copies one read call met, with the good copy to write back (module docstring)."""

    def __init__(self, ctx: ClientContext, md: LedgerMetadata, short: ShortCopies) -> None:
        self.ctx = ctx
        self.md = md
        self.short = short
        self.todo: list[tuple[ReadResponse, list[str]]] = []
        self.repaired = 0
        self.failed = 0

    def note(self, entry_id: int, copy: ReadResponse, bookies: list[str]) -> None:
        """``bookies`` answered ``entry_id`` with a bad copy; ``copy`` is a verified one."""
        if len(self.todo) < REPAIRS_MAX:
            self.todo.append((copy, list(bookies)))
        else:
            for bookie in bookies:
                self.short.add(bookie, entry_id)

    async def run(self) -> None:
        """Write every noted copy back (never raises); what fails is marked in ``short``."""
        todo, self.todo = self.todo, []
        if not todo:
            return
        key = bytes.fromhex(self.md.master_key) if self.md.master_key else b""
        window = asyncio.Semaphore(max(1, self.ctx.config.recovery_reads_parallel_max))

        async def one(copy: ReadResponse, bookie: str) -> None:
            async with window:
                why: str | None = "the ledger's metadata has no master key"
                if key:
                    why = await write_copy(self.ctx, self.md.ledger_id, key, bookie, copy)
            if why is None:
                self.repaired += 1
                log.warning("ledger %d entry %d: the bad copy on %s was replaced by a good one "
                            "(read repair)", self.md.ledger_id, copy.entry_id, bookie)  # fmt: skip
                return
            self.failed += 1
            self.short.add(bookie, copy.entry_id)
            log.warning("ledger %d entry %d: read repair of the copy on %s failed (%s); "
                        "marked for autorecovery", self.md.ledger_id, copy.entry_id, bookie,
                        why)  # fmt: skip

        await asyncio.gather(*(one(copy, b) for copy, bookies in todo for b in bookies))
