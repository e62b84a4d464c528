"""The one delete path of ledgers (BP-31 "Delete Discipline") and the archival bit.

Theory of operation
-------------------
Every ledger delete in the code — ``BookKeeper.delete_ledger``, logs' truncation, retention
and delete, Spark's cleanup, the shell — ends in :func:`delete_ledger`, which checks, in
order, before anything changes:

1. the ledger exists (a second delete names the first: its tombstone is still there, or it
   has no metadata at all);
2. it does not belong to a log, unless the caller is that log (``owner_log``): a log's
   ledger is removed by truncating or deleting the log, which keeps the log consistent;
3. the cluster's ``require_archival_before_delete`` option: an unarchived ledger is refused
   with :class:`LedgerNotArchivedError`.

Then the ledger's metadata is replaced, by compare-and-swap at the version read, with its
tombstone (``metadata/tombstones.py``): the bookies' garbage collectors delete the data of
tombstoned ledgers only. A lost race (a writer's ensemble change) re-reads and checks again.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import (
    LedgerNotArchivedError,
    LedgerOfLogError,
    MetadataVersionError,
    NoSuchLedgerError,
)
from ..metadata.model import LedgerMetadata, Versioned
from ..metadata.store import MetadataStore, update_ledger
from ..metadata.tombstones import Tombstone, read_cluster_options, read_tombstone

CAS_ATTEMPTS_MAX = 20


async def delete_ledger(
    store: MetadataStore,
    ledger_id: int,
    *,
    log_tag: str,
    owner_log: str | None,
    now_ms: Callable[[], int],
) -> Tombstone:
    """Tombstone the ledger after the checks of the module docstring; the tombstone written.

    Raises:
        NoSuchLedgerError: no such ledger (the message says if it was deleted before).
        LedgerOfLogError: it belongs to a log other than ``owner_log``.
        LedgerNotArchivedError: archival is required and the ledger is not archived.
        MetadataVersionError: the metadata kept changing.
    """
    options = await read_cluster_options(store)
    for _ in range(CAS_ATTEMPTS_MAX):
        current = await _read(store, ledger_id)
        md = current.value
        tag = md.custom_metadata.get(log_tag)
        if tag is not None and tag.decode(errors="replace") != owner_log:
            raise LedgerOfLogError(
                f"ledger {ledger_id} belongs to log {tag.decode(errors='replace')!r}: delete or "
                "truncate the log instead"
            )
        if options.require_archival_before_delete and not md.archived:
            raise LedgerNotArchivedError(
                f"ledger {ledger_id} is not archived and the cluster requires archival before "
                "delete (mark it archived first, or set cluster-config "
                "require-archival-before-delete false)"
            )
        tombstone = Tombstone(ledger_id, now_ms(), md.ensembles, log=owner_log or "")
        try:
            await store.tombstone_ledger(ledger_id, current.version, tombstone.to_json_bytes())
            return tombstone
        except MetadataVersionError:
            continue  # a writer or autorecovery moved it: check again on the new value
    raise MetadataVersionError(f"ledger {ledger_id}: kept changing while deleting")


async def _read(store: MetadataStore, ledger_id: int) -> Versioned[LedgerMetadata]:
    try:
        return await store.read_ledger(ledger_id)
    except NoSuchLedgerError:
        stone = await read_tombstone(store, ledger_id)
        if stone is not None:
            raise NoSuchLedgerError(
                f"ledger {ledger_id} was already deleted (at {stone.value.deleted_ms} ms since "
                f"the epoch; bookies confirmed: {len(stone.value.confirmed)} of "
                f"{len(stone.value.bookies)})"
            ) from None
        raise NoSuchLedgerError(
            f"ledger {ledger_id} has no metadata: never created, or deleted and its data collected"
        ) from None


async def mark_archived(store: MetadataStore, ledger_id: int) -> Versioned[LedgerMetadata]:
    """Set the ledger's archival bit by compare-and-swap (idempotent).

    Raises:
        NoSuchLedgerError: no such ledger.
        IncorrectParameterError: the ledger is not closed.
    """
    return await update_ledger(
        store,
        ledger_id,
        lambda v: None if v.value.archived else v.value.marked_archived(),
        CAS_ATTEMPTS_MAX,
    )
