"""Managing logs: create, describe, list, delete, truncate, retention, cursors, and appending
ledgers written elsewhere (a job's commit).

Theory of operation
-------------------
Each operation is a compare-and-swap of the log's key (``keys.update_log``) followed, when it
removed ledgers from the list, by :func:`empty_trash`: removed ledgers are first recorded in
the log's ``trash`` in the same compare-and-swap, then deleted through the client's one delete
path (``BookKeeper.delete_ledger``), then taken out of the trash. A crash in between leaves
them in the trash, and the next truncation, retention run, writer or delete finishes the job;
no ledger of a log is ever forgotten. Names, offsets and options are checked before the store
is touched.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import (
    IncorrectParameterError,
    LogExistsError,
    LogPropertyConflictError,
    MetadataVersionError,
    NoSuchLedgerError,
    NoSuchLogError,
    OperationTimeoutError,
    UnauthorizedError,
)
from ..metadata.model import Versioned, password_hash
from .keys import create_key, cursor_json, cursor_offset, decode, read_log, update_log
from .model import LogMetadata, SegmentState, new_log
from .options import (
    LOGS_PREFIX,
    LogOptions,
    check_name,
    cursor_key,
    cursor_prefix,
    log_key,
)
from .takeover import take_over

if TYPE_CHECKING:
    from .api import Logs


@dataclass(frozen=True)
class LogSegmentInfo:
    """One segment as :meth:`Logs.log_info` shows it. ``last_offset`` is the last confirmed
    offset (``first_offset - 1`` while it holds none); an OPEN segment's grows."""

    ledger_id: int
    first_offset: int
    last_offset: int
    state: SegmentState


@dataclass(frozen=True)
class LogInfo:
    """A log's segments and offsets: records ``start_offset`` .. ``next_offset - 1`` are
    readable (confirmed). ``metadata`` is everything the log's key holds, at ``version``."""

    name: str
    start_offset: int
    next_offset: int
    segments: tuple[LogSegmentInfo, ...]
    metadata: LogMetadata
    version: int

    def locate(self, offset: int) -> tuple[int, int] | None:
        """(ledger id, entry id) of a kept, confirmed ``offset``, else None."""
        if not self.start_offset <= offset < self.next_offset:
            return None
        return self.metadata.locate(offset)


def check_offset(offset: object, what: str) -> int:
    """Raises IncorrectParameterError unless ``offset`` is an int >= 0."""
    if type(offset) is not int or offset < 0:
        raise IncorrectParameterError(f"{what} must be an int >= 0, got {offset!r}")
    return offset


async def create_log(logs: Logs, name: str, options: LogOptions, exist_ok: bool) -> LogInfo:
    """See :meth:`Logs.create_log`."""
    log_id = uuid.UUID(int=logs.ctx.rng.getrandbits(128)).hex
    md = new_log(name, options, log_id, logs.clock_ms())
    if not await create_key(logs.store, log_key(name), md.to_json_bytes()):
        try:
            existing = await read_log(logs.store, name)
        except NoSuchLogError as exc:  # being deleted (or deleted just now): still a conflict
            raise LogExistsError(f"log {name!r} exists ({exc}); retry") from None
        if not exist_ok:
            raise LogExistsError(f"log {name!r} exists; pass exist_ok=True to reuse it")
        return await describe(logs, existing)
    return await describe(logs, await read_log(logs.store, name))


async def describe(logs: Logs, versioned: Versioned[LogMetadata]) -> LogInfo:
    """The log's :class:`LogInfo`; an open segment's end is its ledger's LAC (asked of its
    bookies)."""
    md = versioned.value
    segments = []
    for segment in md.segments:
        if segment.is_open:
            reader = await logs.bk.open_ledger(segment.ledger_id, logs.password, recovery=False)
            last = segment.first_offset + reader.last_add_confirmed
        else:
            last = segment.end_offset - 1
        segments.append(
            LogSegmentInfo(segment.ledger_id, segment.first_offset, last, segment.state)
        )
    next_offset = segments[-1].last_offset + 1 if segments else md.start_offset
    return LogInfo(md.name, md.start_offset, next_offset, tuple(segments), md, versioned.version)


async def list_logs(logs: Logs) -> list[str]:
    """See :meth:`Logs.list_logs`."""
    names = []
    async for key, stored in logs.store.list_prefix(LOGS_PREFIX):
        name = key[len(LOGS_PREFIX) :]
        if "/" in name:
            continue  # a cursor of a log
        if not decode(name, stored, deleting_ok=True).value.deleting:
            names.append(name)
    return names


async def empty_trash(logs: Logs, name: str) -> int:
    """Delete the ledgers in the log's trash (see the module docstring); how many."""
    md = (await read_log(logs.store, name, deleting_ok=True)).value
    if not md.trash:
        return 0
    gone = []
    for ledger_id in md.trash:
        try:
            await logs.bk.delete_ledger(ledger_id, owner_log=name)
        except NoSuchLedgerError:
            pass  # deleted by an earlier attempt
        gone.append(ledger_id)
    retries = logs.config.metadata_retries_max
    await update_log(logs.store, name, lambda m: m.without_trash(gone), retries, deleting_ok=True)
    return len(gone)


async def delete_log(logs: Logs, name: str) -> None:
    """See :meth:`Logs.delete_log`."""
    retries = logs.config.metadata_retries_max
    await update_log(
        logs.store,
        name,
        lambda md: None if md.deleting else md.marked_deleting(),
        retries,
        deleting_ok=True,
    )
    await empty_trash(logs, name)
    await logs.store.delete_prefix(cursor_prefix(name))
    for _ in range(retries):
        current = await read_log(logs.store, name, deleting_ok=True)
        try:
            await logs.store.delete(log_key(name), expected_version=current.version)
            return
        except MetadataVersionError as exc:
            if exc.current is None:
                return  # a concurrent delete finished first
    raise MetadataVersionError(f"log {name}: {retries} conflicting updates while deleting")


async def truncate_log(logs: Logs, name: str, before_offset: int) -> int:
    """See :meth:`Logs.truncate_log`."""
    retries = logs.config.metadata_retries_max
    versioned = await update_log(logs.store, name, lambda md: md.truncated(before_offset), retries)
    await empty_trash(logs, name)
    return versioned.value.start_offset


async def enforce_retention(logs: Logs, name: str) -> int:
    """See :meth:`Logs.enforce_log_retention`."""
    now_ms = logs.clock_ms()
    removed = 0

    def retained(md: LogMetadata) -> LogMetadata:
        nonlocal removed
        removed = md.retention_count(now_ms)
        return md.without_front(removed)

    await update_log(logs.store, name, retained, logs.config.metadata_retries_max)
    await empty_trash(logs, name)
    return removed


async def commit_offset(logs: Logs, name: str, group: str, offset: int) -> None:
    """See :meth:`Logs.commit_log_offset`."""
    md = (await read_log(logs.store, name)).value
    await logs.store.put(cursor_key(name, group), cursor_json(offset, md.log_id))


async def committed_offset(logs: Logs, name: str, group: str) -> int | None:
    """See :meth:`Logs.committed_log_offset`."""
    md = (await read_log(logs.store, name)).value
    stored = await logs.store.get(cursor_key(name, group))
    return None if stored is None else cursor_offset(stored.value, md.log_id)


async def list_cursors(logs: Logs, name: str) -> dict[str, int]:
    """See :meth:`Logs.list_log_cursors`."""
    md = (await read_log(logs.store, name)).value
    prefix = cursor_prefix(name)
    found = {}
    async for key, stored in logs.store.list_prefix(prefix):
        offset = cursor_offset(stored.value, md.log_id)
        if offset is not None:
            found[key[len(prefix) :]] = offset
    return found


async def append_ledgers(
    logs: Logs,
    name: str,
    ledger_ids: Sequence[int],
    properties: Mapping[str, str | None] | None,
    expected_properties: Mapping[str, str | None] | None = None,
) -> range:
    """See :meth:`Logs.append_ledgers_to_log`."""
    if not isinstance(ledger_ids, Sequence) or len(set(ledger_ids)) != len(ledger_ids):
        raise IncorrectParameterError(f"ledger_ids: a sequence of distinct ids, not {ledger_ids}")
    for mapping in (properties or {}, expected_properties or {}):
        for key, value in mapping.items():
            if not isinstance(key, str) or not (value is None or isinstance(value, str)):
                raise IncorrectParameterError("properties map str keys to str values (or None)")
    current = await read_log(logs.store, name)
    done = _appended_already(current, ledger_ids)
    if done is not None:
        return done  # a retry of a commit whose reply was lost: nothing to do
    _check_properties(current.value, expected_properties)  # before fencing anyone for nothing
    ledgers = [await _closed_ledger(logs, name, ledger_id) for ledger_id in ledger_ids]
    writer = f"{logs.config.client_name}-append-{uuid.UUID(int=logs.ctx.rng.getrandbits(128))}"
    try:
        async with asyncio.timeout(logs.config.log_open_timeout_s):
            versioned = await _take_over_and_append(
                logs, name, writer, ledgers, properties, expected_properties
            )
    except TimeoutError:
        raise OperationTimeoutError(
            f"log {name}: appending {list(ledger_ids)} did not finish within "
            f"log_open_timeout_s={logs.config.log_open_timeout_s}"
        ) from None
    await empty_trash(logs, name)
    md = versioned.value
    end = md.end_offset
    assert end is not None  # a committing job leaves no segment open
    first = md.segments[-len(ledgers)].first_offset if ledgers else end
    return range(first, end)


async def _take_over_and_append(
    logs: Logs,
    name: str,
    writer: str,
    ledgers: list[tuple[int, int, int | None]],
    properties: Mapping[str, str | None] | None,
    expected_properties: Mapping[str, str | None] | None,
) -> Versioned[LogMetadata]:
    """The takeover, then the one compare-and-swap that appends ``ledgers`` (and sets
    ``properties``, if ``expected_properties`` hold then)."""
    ledger_ids = {ledger_id for ledger_id, _, _ in ledgers}
    takeover = await take_over(logs, name, writer)
    now_ms = logs.clock_ms()

    def appended(md: LogMetadata) -> LogMetadata:
        known = {*md.ledger_ids, *md.trash, md.prepared_ledger_id}
        if known & ledger_ids:
            raise IncorrectParameterError(f"log {name}: a ledger of {ledger_ids} is in it already")
        _check_properties(md, expected_properties)
        sealed = takeover.seal(md, now_ms)
        return sealed.with_ledgers_appended(takeover.epoch, ledgers, now_ms).with_properties(
            properties or {}
        )

    retries = logs.config.metadata_retries_max
    return await update_log(logs.store, name, appended, retries, current=takeover.versioned)


def _check_properties(md: LogMetadata, expected: Mapping[str, str | None] | None) -> None:
    """Raises LogPropertyConflictError unless each expected property holds (None: absent)."""
    for key, value in (expected or {}).items():
        if md.properties.get(key) != value:
            raise LogPropertyConflictError(
                f"log {md.name}: property {key} is {md.properties.get(key)!r}, not {value!r}"
            )


def _appended_already(versioned: Versioned[LogMetadata], ledger_ids: Sequence[int]) -> range | None:
    """The offsets of ``ledger_ids`` if the log holds exactly them, in order, one after the
    other (an earlier call appended them); None if it holds none of them.

    Raises:
        IncorrectParameterError: it holds some of them, or not in that order.
    """
    md = versioned.value
    held = [s for s in md.segments if s.ledger_id in set(ledger_ids)]
    if not held or not ledger_ids:
        return None
    ids = md.ledger_ids
    start = ids.index(ledger_ids[0]) if ledger_ids[0] in ids else -1
    if tuple(ledger_ids) != ids[start : start + len(ledger_ids)] or held[-1].is_open:
        raise IncorrectParameterError(f"log {md.name}: a ledger of {list(ledger_ids)} is in it")
    return range(held[0].first_offset, held[-1].end_offset)


async def _closed_ledger(logs: Logs, name: str, ledger_id: int) -> tuple[int, int, int | None]:
    """(id, entries, size or None) of a ledger a job wrote, checked for appending to ``name``.

    Raises:
        NoSuchLedgerError; UnauthorizedError (another password); IncorrectParameterError
        (not closed, or tagged for another log).
    """
    if type(ledger_id) is not int:
        raise IncorrectParameterError(f"ledger id {ledger_id!r} is not an int")
    md = (await logs.ctx.metadata.read_ledger(ledger_id)).value
    if not md.is_closed:
        raise IncorrectParameterError(f"ledger {ledger_id} is not closed: close it first")
    if md.password_hash != password_hash(logs.password):
        raise UnauthorizedError(f"ledger {ledger_id} has a password: logs read theirs without")
    tag = md.custom_metadata.get(logs.tag)
    if tag is not None and tag != name.encode():
        raise IncorrectParameterError(f"ledger {ledger_id} belongs to log {tag.decode()!r}")
    return ledger_id, md.last_entry_id + 1, (md.length if md.length >= 0 else None)


__all__ = ["LogInfo", "LogSegmentInfo", "check_name", "check_offset"]
