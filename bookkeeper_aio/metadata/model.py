"""Ledger metadata as pure values: the state machine, validation, segments, JSON.

Theory of operation
-------------------
A ledger's metadata is an immutable :class:`LedgerMetadata`. Every change is a pure transform
(:meth:`~LedgerMetadata.with_ensemble_change`, :meth:`~LedgerMetadata.in_recovery`,
:meth:`~LedgerMetadata.closed`) that returns a new value; the store writes it with a
compare-and-swap on the version it was read at (``store.update_ledger``), so two clients can
never both believe their change won. State changes go through :data:`TRANSITIONS`; anything
else raises, because an illegal transition (say, reopening a CLOSED ledger) is a safety bug.

Ensembles are segments: ``((first_entry_id, (bookie, ...)), ...)`` sorted by first entry id,
the first one at entry 0. Entry ``e`` lives on the ensemble of the last segment whose first
entry id is ``<= e``. A writer's ensemble change adds a segment starting at its LAC + 1, or
replaces the last segment when a second change happens before any entry was acknowledged on
the new one.

Nothing here does I/O or reads a clock: ``ctime_ms`` is given by the creator.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import hashlib
import json
import random
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

from ..digest import DIGEST_TYPE, NO_ENTRY
from ..errors import IllegalLedgerTransitionError, IncorrectParameterError, MetadataFormatError

__all__ = [
    "MAX_LEDGER_ID",
    "TRANSITIONS",
    "IllegalLedgerTransitionError",
    "LedgerMetadata",
    "LedgerState",
    "Versioned",
    "check_transition",
    "password_hash",
    "time_ordered_ledger_id",
    "validate_quorums",
]

T = TypeVar("T")
Ensemble = tuple[str, ...]
Segment = tuple[int, Ensemble]
MAX_LEDGER_ID = (1 << 63) - 1  # ids are positive signed 64-bit numbers, as in BookKeeper
FORMAT_VERSION = 1
_ID_EPOCH_MS = 1_735_689_600_000  # 2025-01-01 UTC
_ID_RANDOM_BITS = 22  # below the milliseconds (41 bits: until 2094)


def time_ordered_ledger_id(now_ms: int, rng: random.Random) -> int:
    """A new ledger id: milliseconds since 2025 above 22 random bits, so that ledgers created
    later get greater ids (BookKeeper's ids grow too), with no shared counter to contend on;
    the store's create-if-absent makes each unique. Why ordered: a bookie's rocksdb engine
    keys entries by (ledger, entry): the SSTs of ledgers written together span their ids,
    and a later ledger whose id falls in such a span makes every flush of its entries overlap
    them, whose compactions rewrite payloads again (the engine alone, eight rounds of four
    ledgers written together, 320 MiB: 1,150 MiB of compaction with random ids, 485 with
    growing ones); a greater id appends."""
    elapsed = min(max(now_ms - _ID_EPOCH_MS, 0), MAX_LEDGER_ID >> _ID_RANDOM_BITS)
    return max(1, elapsed << _ID_RANDOM_BITS | rng.getrandbits(_ID_RANDOM_BITS))


class Versioned(NamedTuple, Generic[T]):
    """A value and the store version it was read at (etcd's mod_revision; grows on each write)."""

    value: T
    version: int


class LedgerState(enum.Enum):
    """A ledger's lifecycle state in the metadata store."""

    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


TRANSITIONS: frozenset[tuple[LedgerState, LedgerState]] = frozenset(
    {
        (LedgerState.OPEN, LedgerState.OPEN),  # ensemble changes by the writer
        (LedgerState.OPEN, LedgerState.IN_RECOVERY),  # a recoverer takes over
        (LedgerState.OPEN, LedgerState.CLOSED),  # the writer closes
        (LedgerState.IN_RECOVERY, LedgerState.IN_RECOVERY),  # a recoverer's segment changes
        (LedgerState.IN_RECOVERY, LedgerState.CLOSED),  # recovery finishes
    }
)


def check_transition(ledger_id: int, old: LedgerState, new: LedgerState) -> None:
    """Raise unless ``old -> new`` is in :data:`TRANSITIONS`.

    Raises:
        IllegalLedgerTransitionError: the pair is not in the table.
    """
    if (old, new) not in TRANSITIONS:
        raise IllegalLedgerTransitionError(
            f"ledger {ledger_id}: {old.value} -> {new.value} is not allowed"
        )


def password_hash(password: bytes) -> str:
    """What the metadata keeps of a password: lets a client reject a wrong one early."""
    return hashlib.sha256(b"bookkeeper-aio:" + password).hexdigest()


def validate_quorums(ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
    """Check E >= WQ >= AQ >= 1.

    Raises:
        IncorrectParameterError: they do not hold.
    """
    sizes = (ensemble_size, write_quorum, ack_quorum)
    if (
        not all(type(n) is int for n in sizes)
        or not ensemble_size >= write_quorum >= ack_quorum >= 1
    ):
        raise IncorrectParameterError(
            f"need ensemble_size >= write_quorum >= ack_quorum >= 1, got "
            f"{ensemble_size}, {write_quorum}, {ack_quorum}"
        )


@dataclass(frozen=True)
class LedgerMetadata:
    """One ledger's metadata (see the module docstring).

    ``last_entry_id`` and ``length`` mean something once CLOSED (-1 and 0 for an empty ledger;
    a recoverer that does not know the length writes -1).
    """

    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    ensembles: tuple[Segment, ...]
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = NO_ENTRY
    length: int = 0
    digest_type: str = DIGEST_TYPE
    password_hash: str = ""
    ctime_ms: int = 0
    custom_metadata: dict[str, bytes] = field(default_factory=dict)
    creator_token: str = ""
    # The master key (hex) so that autorecovery can fence and recovery-add copies without the
    # password, as BookKeeper keeps the password in its metadata; "" for older ledgers.
    master_key: str = ""
    # BP-31's archival bit: set by a backup application once it has copied the ledger; with
    # the cluster option require_archival_before_delete, only archived ledgers may be deleted.
    archived: bool = False
    # Seed 001: every entry of a closed ledger, and every entry outside the last segment of
    # an open one, has WQ copies (docs/protocol.md, "Guaranteed write quorum").
    guaranteed_write_quorum: bool = False

    def __post_init__(self) -> None:
        if type(self.ledger_id) is not int or not 0 <= self.ledger_id <= MAX_LEDGER_ID:
            raise IncorrectParameterError(f"ledger id {self.ledger_id!r} is not in [0, 2^63)")
        validate_quorums(self.ensemble_size, self.write_quorum, self.ack_quorum)
        if not isinstance(self.state, LedgerState):
            raise IncorrectParameterError(f"unknown ledger state {self.state!r}")
        if self.last_entry_id < NO_ENTRY or self.length < -1:
            raise IncorrectParameterError(
                f"last_entry_id {self.last_entry_id} / length {self.length} out of range"
            )
        self._check_segments()
        if type(self.guaranteed_write_quorum) is not bool:
            raise IncorrectParameterError("guaranteed_write_quorum must be a bool")
        for key, value in self.custom_metadata.items():
            if not isinstance(key, str) or not isinstance(value, bytes):
                raise IncorrectParameterError("custom metadata maps str keys to bytes values")

    def _check_segments(self) -> None:
        if not self.ensembles or self.ensembles[0][0] != 0:
            raise IncorrectParameterError("the first segment must start at entry 0")
        firsts = [first for first, _ in self.ensembles]
        if firsts != sorted(set(firsts)):
            raise IncorrectParameterError(f"segments out of order: {firsts}")
        for first, ensemble in self.ensembles:
            if (
                len(ensemble) != self.ensemble_size
                or len(set(ensemble)) != len(ensemble)
                or not all(isinstance(b, str) and b for b in ensemble)
            ):
                raise IncorrectParameterError(
                    f"segment at {first} needs {self.ensemble_size} distinct bookie ids: {ensemble}"
                )

    # --- queries --------------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    def ensemble_at(self, entry_id: int) -> Ensemble:
        """The ensemble that stores ``entry_id``."""
        found = self.ensembles[0][1]
        for first, ensemble in self.ensembles:
            if first > entry_id:
                break
            found = ensemble
        return found

    def last_ensemble(self) -> Segment:
        """(first entry id, ensemble) of the last segment."""
        return self.ensembles[-1]

    def bookies(self) -> list[str]:
        """Every bookie that appears in any segment, sorted."""
        return sorted({b for _, ensemble in self.ensembles for b in ensemble})

    # --- transforms -----------------------------------------------------------------------

    def _moved(self, state: LedgerState, **changes: Any) -> LedgerMetadata:
        check_transition(self.ledger_id, self.state, state)
        return dataclasses.replace(self, state=state, **changes)

    def with_ensemble_change(self, first_entry_id: int, ensemble: Ensemble) -> LedgerMetadata:
        """A new last segment from ``first_entry_id`` (replacing one that starts there).

        Raises:
            IncorrectParameterError: it would start before the last segment, or is malformed.
            IllegalLedgerTransitionError: the ledger is CLOSED.
        """
        last_first, _ = self.ensembles[-1]
        if first_entry_id < last_first:
            raise IncorrectParameterError(
                f"segment at {first_entry_id} would precede the last one at {last_first}"
            )
        kept = self.ensembles[:-1] if first_entry_id == last_first else self.ensembles
        return self._moved(self.state, ensembles=(*kept, (first_entry_id, tuple(ensemble))))

    def with_replicas_replaced(
        self, first_entry_id: int, replacements: dict[int, str]
    ) -> LedgerMetadata:
        """The segment starting at ``first_entry_id`` with the bookies at the given ensemble
        indexes replaced (autorecovery: the copies were made first). The state is unchanged.

        Raises:
            IncorrectParameterError: no such segment, a bad index, a bookie twice in the
                ensemble, or the last segment of a ledger that is not CLOSED (its writer or
                recoverer owns it).
        """
        firsts = [first for first, _ in self.ensembles]
        if first_entry_id not in firsts:
            raise IncorrectParameterError(
                f"ledger {self.ledger_id}: no segment at {first_entry_id}"
            )
        position = firsts.index(first_entry_id)
        if position == len(firsts) - 1 and not self.is_closed:
            raise IncorrectParameterError(
                f"ledger {self.ledger_id}: the last segment of a {self.state.value} ledger "
                "belongs to its writer or recoverer"
            )
        ensemble = list(self.ensembles[position][1])
        for index, bookie in replacements.items():
            if not 0 <= index < len(ensemble):
                raise IncorrectParameterError(f"ledger {self.ledger_id}: no ensemble index {index}")
            ensemble[index] = bookie
        segments = list(self.ensembles)
        segments[position] = (first_entry_id, tuple(ensemble))
        return dataclasses.replace(self, ensembles=tuple(segments))

    def marked_archived(self) -> LedgerMetadata:
        """With the archival bit set (the state is unchanged).

        Raises:
            IncorrectParameterError: the ledger is not CLOSED (its end is not known yet).
        """
        if not self.is_closed:
            raise IncorrectParameterError(
                f"ledger {self.ledger_id} is {self.state.value}: only a closed ledger can be "
                "archived"
            )
        return dataclasses.replace(self, archived=True)

    def in_recovery(self) -> LedgerMetadata:
        """Marked IN_RECOVERY (a recoverer owns it; the writer's changes will conflict).

        Raises:
            IllegalLedgerTransitionError: the ledger is CLOSED.
        """
        return self._moved(LedgerState.IN_RECOVERY)

    def closed(self, last_entry_id: int, length: int) -> LedgerMetadata:
        """CLOSED at ``last_entry_id``; segments starting past it are dropped (never used).

        Raises:
            IllegalLedgerTransitionError: the ledger is already CLOSED.
        """
        segments = tuple(s for s in self.ensembles if s[0] <= max(last_entry_id, 0))
        return self._moved(
            LedgerState.CLOSED, last_entry_id=last_entry_id, length=length, ensembles=segments
        )

    # --- JSON -----------------------------------------------------------------------------

    def to_json_bytes(self) -> bytes:
        """Readable JSON (what ``etcdctl get`` shows); bytes values are base64."""
        doc = dataclasses.asdict(self)
        doc["state"] = self.state.value
        doc["ensembles"] = [{"first_entry_id": f, "bookies": list(e)} for f, e in self.ensembles]
        doc["custom_metadata"] = {
            k: base64.b64encode(v).decode() for k, v in sorted(self.custom_metadata.items())
        }
        doc["format_version"] = FORMAT_VERSION
        if not self.guaranteed_write_quorum:  # the default: the bytes of older ledgers
            del doc["guaranteed_write_quorum"]
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_json_bytes(cls, data: bytes) -> LedgerMetadata:
        """Inverse of :meth:`to_json_bytes`.

        Raises:
            MetadataFormatError: not valid ledger metadata JSON (also a ValueError).
        """
        try:
            doc = json.loads(data)
            version = doc.pop("format_version", None)
            if version != FORMAT_VERSION:
                raise MetadataFormatError(f"unknown metadata format version {version!r}")
            doc["state"] = LedgerState(doc["state"])
            doc["ensembles"] = tuple(
                (int(s["first_entry_id"]), tuple(s["bookies"])) for s in doc["ensembles"]
            )
            doc["custom_metadata"] = {
                k: base64.b64decode(v, validate=True) for k, v in doc["custom_metadata"].items()
            }
            return cls(**doc)
        except MetadataFormatError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IncorrectParameterError) as exc:
            raise MetadataFormatError(f"invalid ledger metadata: {exc}") from exc
