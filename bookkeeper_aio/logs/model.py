"""A log's metadata as a pure value: segments, offsets, the writer epoch, transforms, JSON.

Theory of operation
-------------------
A log is an ordered list of ledgers (*segments*) behind one name, kept in one key of the
metadata store (``logs/<name>``) and changed only by compare-and-swap of a new
:class:`LogMetadata` built by the pure transforms below. A record's **offset** is its
position in the log: a segment starting at offset *f* holds offsets *f*, *f*+1, ... as its
ledger's entries 0, 1, ...; the next segment starts where the previous one ends, so offsets are
dense across ledgers. Only the last segment may be OPEN (its end is its ledger's end, not
known here); every other one is CLOSED with its number of entries, and never changes again.
Truncation and retention remove whole segments from the front (never an open one):
``start_offset`` is then the first offset still kept, and the removed ledgers wait in
``trash`` until they are deleted.

``epoch`` counts writers: a new writer first bumps it (:meth:`LogMetadata.taken_over`), and
every change a writer makes checks that the epoch is still its own, so a writer that was taken
over can no longer change the list (:class:`~bookkeeper_aio.errors.LogFencedError`); its
ledger is fenced by the new writer's recovery. A writer prepares its next ledger before it
needs it and records it as ``prepared_ledger_id``, so a takeover can delete it (``trash``)
instead of leaking it.

Nothing here does I/O or reads a clock: times are given by the caller.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import IncorrectParameterError, LogFencedError, MetadataFormatError, NoSuchLogError
from ..metadata.model import MAX_LEDGER_ID
from .options import LogOptions, check_name

FORMAT_VERSION = 1


class SegmentState(enum.Enum):
    """A segment's state in the log's list (its ledger's own state is in ledger metadata)."""

    OPEN = "OPEN"
    CLOSED = "CLOSED"


@dataclass(frozen=True)
class LogSegment:
    """One ledger of the log: offsets ``first_offset`` .. ``first_offset + entries - 1``.

    ``size_bytes`` is the payload bytes when known (a segment recovered after its writer's
    crash has none); ``closed_ms`` the wall-clock time it was closed (for ``retention_s``).
    """

    ledger_id: int
    first_offset: int
    state: SegmentState = SegmentState.OPEN
    entries: int | None = None
    size_bytes: int | None = None
    closed_ms: int | None = None

    def __post_init__(self) -> None:
        if type(self.ledger_id) is not int or not 0 < self.ledger_id <= MAX_LEDGER_ID:
            raise IncorrectParameterError(f"ledger id {self.ledger_id!r} is not in [1, 2^63)")
        if type(self.first_offset) is not int or self.first_offset < 0:
            raise IncorrectParameterError(f"first offset {self.first_offset!r} < 0")
        closed = (self.entries, self.closed_ms)
        if self.state is SegmentState.OPEN:
            if closed != (None, None) or self.size_bytes is not None:
                raise IncorrectParameterError("an OPEN segment has no end, size or close time")
        elif self.state is SegmentState.CLOSED:
            if not all(type(n) is int and n >= 0 for n in closed) or (
                self.size_bytes is not None
                and (type(self.size_bytes) is not int or self.size_bytes < 0)
            ):
                raise IncorrectParameterError(f"a CLOSED segment needs its end: {self}")
        else:
            raise IncorrectParameterError(f"unknown segment state {self.state!r}")

    @property
    def is_open(self) -> bool:
        return self.state is SegmentState.OPEN

    @property
    def end_offset(self) -> int:
        """The offset after the segment's last one (CLOSED only)."""
        assert self.entries is not None, "an open segment has no end yet"
        return self.first_offset + self.entries

    def closed(self, entries: int, size_bytes: int | None, closed_ms: int) -> LogSegment:
        """This segment CLOSED with ``entries`` records."""
        return dataclasses.replace(
            self,
            state=SegmentState.CLOSED,
            entries=entries,
            size_bytes=size_bytes,
            closed_ms=closed_ms,
        )


@dataclass(frozen=True)
class LogMetadata:
    """One log's metadata (see the module docstring)."""

    name: str
    log_id: str  # random; tells a re-created log of the same name apart (cursors)
    options: LogOptions
    epoch: int = 0
    writer: str = ""  # who took the log over last (for people reading the metadata)
    start_offset: int = 0
    segments: tuple[LogSegment, ...] = ()
    prepared_ledger_id: int | None = None
    trash: tuple[int, ...] = ()
    deleting: bool = False
    ctime_ms: int = 0
    properties: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name(self.name)
        if type(self.epoch) is not int or self.epoch < 0 or self.start_offset < 0:
            raise IncorrectParameterError(f"log {self.name}: negative epoch or start offset")
        expected = self.start_offset
        for index, segment in enumerate(self.segments):
            if segment.first_offset != expected:
                raise IncorrectParameterError(
                    f"log {self.name}: segment {index} starts at {segment.first_offset}, "
                    f"not {expected} (offsets must be dense)"
                )
            if segment.is_open and index != len(self.segments) - 1:
                raise IncorrectParameterError(f"log {self.name}: only the last segment is OPEN")
            expected = 0 if segment.is_open else segment.end_offset
        ids = [*self.ledger_ids, *self.trash]
        if self.prepared_ledger_id is not None:
            ids.append(self.prepared_ledger_id)
        if len(ids) != len(set(ids)):
            raise IncorrectParameterError(f"log {self.name}: a ledger appears twice: {ids}")
        if self.deleting and (self.segments or self.prepared_ledger_id is not None):
            raise IncorrectParameterError(f"log {self.name}: a deleted log keeps no ledgers")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.properties.items()):
            raise IncorrectParameterError("log properties map str keys to str values")

    # --- queries --------------------------------------------------------------------------

    @property
    def ledger_ids(self) -> tuple[int, ...]:
        return tuple(s.ledger_id for s in self.segments)

    @property
    def open_segment(self) -> LogSegment | None:
        """The last segment if it is OPEN."""
        return self.segments[-1] if self.segments and self.segments[-1].is_open else None

    @property
    def end_offset(self) -> int | None:
        """The next offset when no segment is open (None while one is: its end is its
        ledger's)."""
        if not self.segments:
            return self.start_offset
        last = self.segments[-1]
        return None if last.is_open else last.end_offset

    def segment_index(self, offset: int) -> int | None:
        """The index of the segment holding ``offset``, or None (truncated or not written
        yet; an open last segment holds every offset from its first one)."""
        firsts = [s.first_offset for s in self.segments]
        low, high = 0, len(firsts)
        while low < high:  # bisect: the last segment starting at or before offset
            middle = (low + high) // 2
            if firsts[middle] <= offset:
                low = middle + 1
            else:
                high = middle
        index = low - 1
        if index < 0:
            return None
        segment = self.segments[index]
        return index if segment.is_open or offset < segment.end_offset else None

    def locate(self, offset: int) -> tuple[int, int] | None:
        """(ledger id, entry id) of ``offset``, or None (see :meth:`segment_index`)."""
        index = self.segment_index(offset)
        if index is None:
            return None
        segment = self.segments[index]
        return segment.ledger_id, offset - segment.first_offset

    def estimated_size_bytes(self, segment: LogSegment) -> int:
        """A closed segment's size: its own, or (recovered after a crash: unknown) its
        entries times the mean record size of the segments whose size is known."""
        if segment.size_bytes is not None:
            return segment.size_bytes
        known = [s for s in self.segments if s.size_bytes is not None and s.entries]
        entries = sum(s.entries or 0 for s in known)
        if not entries:
            return 0
        return (segment.entries or 0) * sum(s.size_bytes or 0 for s in known) // entries

    def retention_count(self, now_ms: int) -> int:
        """How many segments retention removes from the front now: closed ones older than
        ``retention_s`` or beyond ``retention_bytes`` (newest kept), never the last one."""
        options = self.options
        total = sum(self.estimated_size_bytes(s) for s in self.segments if not s.is_open)
        count = 0
        for segment in self.segments[:-1]:
            assert segment.closed_ms is not None  # only the last segment may be open
            too_old = (
                options.retention_s is not None
                and segment.closed_ms + options.retention_s * 1000 <= now_ms
            )
            too_big = options.retention_bytes is not None and total > options.retention_bytes
            if not (too_old or too_big):
                break
            total -= self.estimated_size_bytes(segment)
            count += 1
        return count

    # --- transforms -----------------------------------------------------------------------

    def _check_epoch(self, epoch: int) -> None:
        if self.deleting:
            raise NoSuchLogError(f"log {self.name} is being deleted")
        if self.epoch != epoch:
            raise LogFencedError(
                f"log {self.name}: the writer of epoch {epoch} was taken over "
                f"(epoch {self.epoch}, {self.writer})"
            )

    def taken_over(self, writer: str) -> LogMetadata:
        """A new writer's epoch; the previous writer's prepared ledger goes to the trash.

        Raises:
            NoSuchLogError: the log is being deleted.
        """
        self._check_epoch(self.epoch)
        return dataclasses.replace(
            self, epoch=self.epoch + 1, writer=writer, **self._prepared_to_trash()
        )

    def _prepared_to_trash(self) -> dict[str, Any]:
        if self.prepared_ledger_id is None:
            return {}
        return {"prepared_ledger_id": None, "trash": (*self.trash, self.prepared_ledger_id)}

    def with_last_closed(
        self, epoch: int, entries: int, size_bytes: int | None, closed_ms: int
    ) -> LogMetadata:
        """The open segment CLOSED with ``entries`` records (its ledger's true end).

        Raises:
            LogFencedError: ``epoch`` is not the log's (another writer took over).
            IncorrectParameterError: no segment is open.
        """
        self._check_epoch(epoch)
        last = self.open_segment
        if last is None:
            raise IncorrectParameterError(f"log {self.name}: no open segment to close")
        closed = last.closed(entries, size_bytes, closed_ms)
        return dataclasses.replace(self, segments=(*self.segments[:-1], closed))

    def _end_for_append(self, epoch: int) -> int:
        """Where the next segment starts, for a writer of ``epoch`` (none may be open)."""
        self._check_epoch(epoch)
        end = self.end_offset
        if end is None:
            raise IncorrectParameterError(f"log {self.name}: close the open segment first")
        return end

    def with_new_segment(self, epoch: int, ledger_id: int) -> LogMetadata:
        """``ledger_id`` appended as the OPEN segment at the end (no segment may be open).

        Raises:
            LogFencedError: ``epoch`` is not the log's.
            IncorrectParameterError: a segment is open, or the ledger is in the log already.
        """
        end = self._end_for_append(epoch)
        prepared = None if self.prepared_ledger_id == ledger_id else self.prepared_ledger_id
        return dataclasses.replace(
            self,
            segments=(*self.segments, LogSegment(ledger_id, end)),
            prepared_ledger_id=prepared,
        )

    def rolled_over(
        self, epoch: int, entries: int, size_bytes: int | None, closed_ms: int, next_ledger: int
    ) -> LogMetadata:
        """A writer's rollover: the open segment closed, ``next_ledger`` opened after it."""
        closed = self.with_last_closed(epoch, entries, size_bytes, closed_ms)
        return closed.with_new_segment(epoch, next_ledger)

    def with_prepared(self, epoch: int, ledger_id: int) -> LogMetadata:
        """``ledger_id`` recorded as the writer's next ledger (not part of the log yet).

        Raises:
            LogFencedError: ``epoch`` is not the log's.
        """
        self._check_epoch(epoch)
        moved = dataclasses.replace(self, **self._prepared_to_trash())
        return dataclasses.replace(moved, prepared_ledger_id=ledger_id)

    def closed_by_writer(
        self, epoch: int, entries: int, size_bytes: int | None, closed_ms: int
    ) -> LogMetadata:
        """A writer's clean close: its segment closed, its prepared ledger to the trash."""
        closed = self.with_last_closed(epoch, entries, size_bytes, closed_ms)
        return dataclasses.replace(closed, **closed._prepared_to_trash())

    def with_ledgers_appended(
        self, epoch: int, ledgers: Sequence[tuple[int, int, int | None]], closed_ms: int
    ) -> LogMetadata:
        """Closed ledgers written elsewhere, ``(ledger id, entries, size or None)`` each,
        appended in order (a committing job, as a writer of the log: no segment may be open).

        Raises:
            LogFencedError: ``epoch`` is not the log's.
            IncorrectParameterError: a segment is open, or a ledger is in the log already.
        """
        end = self._end_for_append(epoch)
        added = []
        for ledger_id, entries, size_bytes in ledgers:
            added.append(LogSegment(ledger_id, end).closed(entries, size_bytes, closed_ms))
            end += entries
        return dataclasses.replace(self, segments=(*self.segments, *added))

    def with_properties(self, updates: Mapping[str, str | None]) -> LogMetadata:
        """Application properties set (a None value removes one)."""
        properties = {**self.properties, **updates}
        return dataclasses.replace(
            self, properties={k: v for k, v in sorted(properties.items()) if v is not None}
        )

    def without_front(self, count: int) -> LogMetadata:
        """The first ``count`` segments (all CLOSED) removed; their ledgers to the trash."""
        assert all(not s.is_open for s in self.segments[:count]), "never the open segment"
        if count <= 0:
            return self
        removed, kept = self.segments[:count], self.segments[count:]
        start = kept[0].first_offset if kept else removed[-1].end_offset
        trash = (*self.trash, *(s.ledger_id for s in removed))
        return dataclasses.replace(self, segments=kept, start_offset=start, trash=trash)

    def truncated(self, before_offset: int) -> LogMetadata:
        """Every closed segment that ends at or below ``before_offset`` removed (whole
        ledgers only: a segment holding ``before_offset - 1`` and later offsets stays)."""
        count = 0
        for segment in self.segments:
            if segment.is_open or segment.end_offset > before_offset:
                break
            count += 1
        return self.without_front(count)

    def without_trash(self, ledger_ids: Sequence[int]) -> LogMetadata:
        """The trash without ``ledger_ids`` (they were deleted)."""
        gone = set(ledger_ids)
        return dataclasses.replace(self, trash=tuple(i for i in self.trash if i not in gone))

    def marked_deleting(self) -> LogMetadata:
        """Being deleted: every ledger to the trash, writers fenced (epoch bumped)."""
        segments = tuple(s.ledger_id for s in self.segments)
        prepared = () if self.prepared_ledger_id is None else (self.prepared_ledger_id,)
        return dataclasses.replace(
            self,
            epoch=self.epoch + 1,
            segments=(),
            prepared_ledger_id=None,
            trash=(*self.trash, *segments, *prepared),
            deleting=True,
        )

    # --- JSON -----------------------------------------------------------------------------

    def to_json_bytes(self) -> bytes:
        """Readable JSON (what ``etcdctl get`` and ``shell log-info`` show)."""
        doc = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        doc["options"] = dataclasses.asdict(self.options)
        doc["segments"] = [
            {
                "ledger_id": s.ledger_id,
                "first_offset": s.first_offset,
                "state": s.state.value,
                "entries": s.entries,
                "size_bytes": s.size_bytes,
                "closed_ms": s.closed_ms,
            }
            for s in self.segments
        ]  # not dataclasses.asdict: its deep copies cost 10x on long lists
        doc["trash"] = list(self.trash)
        doc["format_version"] = FORMAT_VERSION
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_json_bytes(cls, data: bytes) -> LogMetadata:
        """Inverse of :meth:`to_json_bytes`.

        Raises:
            MetadataFormatError: not valid log metadata.
        """
        try:
            doc = json.loads(data)
            version = doc.pop("format_version", None)
            if version != FORMAT_VERSION:
                raise MetadataFormatError(f"unknown log metadata format version {version!r}")
            doc["options"] = LogOptions(**doc["options"])
            doc["segments"] = tuple(
                LogSegment(**{**s, "state": SegmentState(s["state"])}) for s in doc["segments"]
            )
            doc["trash"] = tuple(doc["trash"])
            return cls(**doc)
        except MetadataFormatError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IncorrectParameterError) as exc:
            raise MetadataFormatError(f"invalid log metadata: {exc}") from exc


def new_log(name: str, options: LogOptions, log_id: str, ctime_ms: int) -> LogMetadata:
    """A log without segments (its first writer adds one)."""
    return LogMetadata(name=name, log_id=log_id, options=options, ctime_ms=ctime_ms)
