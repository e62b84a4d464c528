"""Tombstones of deleted ledgers and the cluster's options (BP-31 "Delete Discipline").

Theory of operation
-------------------
Deleting a ledger is two-phase. Phase one replaces the ledger's metadata, by compare-and-swap
at the version read, with a **tombstone** ``tombstones/<ledger id>`` in one transaction
(``MetadataStore.tombstone_ledger``): the time, the ensembles and the bookies that may hold
copies. Phase two is each bookie's garbage collector: it deletes a ledger's data only when
it finds that ledger *explicitly* tombstoned (a ledger whose metadata is merely missing is an
orphan: reported, never deleted), then adds itself to the tombstone's ``confirmed`` list by
compare-and-swap. The bookie that completes the list removes the tombstone (at the version
it read); a tombstone older than the TTL is removed by whichever collector sees it first.

A new ledger never reuses a tombstoned id (the create transaction checks the tombstone is
absent), and a collector deletes only when the ledger's metadata is absent too: two checks
between a live ledger and its data's deletion.

The cluster's options (``cluster/config``) are one JSON object; today one option,
``require_archival_before_delete``: with it on, deleting a ledger whose ``archived`` bit is
not set is refused (``LedgerNotArchivedError``) and nothing changes.

Pure model and store helpers; ``deleted_ms`` is wall-clock time from the caller's clock
(the simulator passes its virtual one): the TTL is the only decision taken on it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import IncorrectParameterError, MetadataFormatError, MetadataVersionError
from .model import Versioned
from .store import MetadataStore, update_key
from .store_shared import tombstone_key

TOMBSTONES_PREFIX = "tombstones/"
CLUSTER_CONFIG_KEY = "cluster/config"
GC_BOOKIES_PREFIX = "gc/bookies/"
CLUSTER_OPTIONS = ("require_archival_before_delete",)
CAS_ATTEMPTS_MAX = 50


@dataclass(frozen=True)
class Tombstone:
    """A deleted ledger: when, where its copies were, which bookies deleted theirs."""

    ledger_id: int
    deleted_ms: int
    ensembles: tuple[tuple[int, tuple[str, ...]], ...]
    confirmed: tuple[str, ...] = ()
    log: str = ""  # the log it belonged to, if any (for people)

    @property
    def bookies(self) -> tuple[str, ...]:
        """Every bookie of every ensemble, sorted: who must confirm."""
        return tuple(sorted({b for _, ensemble in self.ensembles for b in ensemble}))

    @property
    def complete(self) -> bool:
        """Every bookie that held copies has deleted them."""
        return set(self.bookies) <= set(self.confirmed)

    def confirmed_by(self, bookie_id: str) -> Tombstone:
        """With ``bookie_id`` in ``confirmed`` (idempotent)."""
        if bookie_id in self.confirmed:
            return self
        return replace(self, confirmed=tuple(sorted({*self.confirmed, bookie_id})))

    def expired(self, now_ms: int, ttl_s: float) -> bool:
        """Older than the TTL (removed even if a bookie never confirmed)."""
        return now_ms - self.deleted_ms > ttl_s * 1000

    def to_json_bytes(self) -> bytes:
        doc = {
            "ledger_id": self.ledger_id,
            "deleted_ms": self.deleted_ms,
            "ensembles": [{"first_entry_id": f, "bookies": list(e)} for f, e in self.ensembles],
            "bookies": list(self.bookies),
            "confirmed": list(self.confirmed),
            "log": self.log,
        }
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_json_bytes(cls, data: bytes) -> Tombstone:
        """Raises MetadataFormatError for anything but a tombstone's JSON."""
        try:
            doc = json.loads(data)
            return cls(
                int(doc["ledger_id"]),
                int(doc["deleted_ms"]),
                tuple((int(s["first_entry_id"]), tuple(s["bookies"])) for s in doc["ensembles"]),
                tuple(str(b) for b in doc.get("confirmed", ())),
                str(doc.get("log", "")),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise MetadataFormatError(f"invalid tombstone {data[:200]!r}: {exc}") from exc


async def read_tombstone(store: MetadataStore, ledger_id: int) -> Versioned[Tombstone] | None:
    """The ledger's tombstone, or None."""
    found = await store.get(tombstone_key(ledger_id))
    if found is None:
        return None
    return Versioned(Tombstone.from_json_bytes(found.value), found.version)


async def list_tombstones(store: MetadataStore) -> AsyncIterator[Versioned[Tombstone]]:
    """Every tombstone, by ledger id."""
    async for _, stored in store.list_prefix(TOMBSTONES_PREFIX):
        yield Versioned(Tombstone.from_json_bytes(stored.value), stored.version)


async def confirm(store: MetadataStore, current: Versioned[Tombstone], bookie_id: str) -> str:
    """Add ``bookie_id`` to the tombstone's ``confirmed`` by compare-and-swap; remove the
    tombstone when that completes it. Returns ``"confirmed"``, ``"removed"`` (this call
    completed and removed it) or ``"gone"`` (another bookie or the TTL removed it first)."""

    def decode(found: Versioned[bytes] | None) -> Versioned[Tombstone]:
        if found is None:
            raise _Gone
        return Versioned(Tombstone.from_json_bytes(found.value), found.version)

    try:
        stored = await update_key(
            store, tombstone_key(current.value.ledger_id), decode,
            lambda t: t.to_json_bytes(), lambda t: t.confirmed_by(bookie_id),
            CAS_ATTEMPTS_MAX, current=current,
        )  # fmt: skip
    except _Gone:
        return "gone"
    if stored.value.complete:
        return "removed" if await remove(store, stored) else "gone"
    return "confirmed"


async def remove(store: MetadataStore, current: Versioned[Tombstone]) -> bool:
    """Delete the tombstone at the version read; False if it moved or went meanwhile."""
    try:
        return await store.delete(
            tombstone_key(current.value.ledger_id), expected_version=current.version
        )
    except MetadataVersionError:
        return False


class _Gone(Exception):
    """The tombstone was removed under a confirmation (by another bookie or the TTL)."""


# --- cluster options --------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterOptions:
    """Options every client obeys, kept in ``cluster/config``."""

    require_archival_before_delete: bool = False
    extra: dict[str, object] = field(default_factory=dict)  # keys of newer versions, kept

    def to_json_bytes(self) -> bytes:
        doc = {**self.extra, "require_archival_before_delete": self.require_archival_before_delete}
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_json_bytes(cls, data: bytes) -> ClusterOptions:
        try:
            doc = json.loads(data)
            flag = doc.pop("require_archival_before_delete", False)
            if not isinstance(flag, bool):
                raise TypeError(f"require_archival_before_delete is {flag!r}")
            return cls(flag, doc)
        except (ValueError, TypeError, AttributeError) as exc:
            raise MetadataFormatError(f"invalid cluster config {data[:200]!r}: {exc}") from exc


async def read_cluster_options(store: MetadataStore) -> ClusterOptions:
    found = await store.get(CLUSTER_CONFIG_KEY)
    return ClusterOptions() if found is None else ClusterOptions.from_json_bytes(found.value)


async def set_cluster_option(store: MetadataStore, name: str, value: bool) -> ClusterOptions:
    """Set one option by compare-and-swap; the options now stored.

    Raises:
        IncorrectParameterError: an unknown option name.
    """
    if name not in CLUSTER_OPTIONS:
        raise IncorrectParameterError(
            f"unknown cluster option {name!r}; known: {', '.join(CLUSTER_OPTIONS)}"
        )

    changes: dict[str, Any] = {name: value}

    def decode(found: Versioned[bytes] | None) -> Versioned[ClusterOptions]:
        if found is None:
            return Versioned(ClusterOptions(), 0)
        return Versioned(ClusterOptions.from_json_bytes(found.value), found.version)

    stored = await update_key(
        store, CLUSTER_CONFIG_KEY, decode, lambda o: o.to_json_bytes(),
        lambda o: replace(o, **changes), CAS_ATTEMPTS_MAX,
    )  # fmt: skip
    return stored.value
