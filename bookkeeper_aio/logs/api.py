"""The logs API of one client: what ``BookKeeper``'s log methods delegate to.

Theory of operation
-------------------
:class:`Logs` holds what every log operation needs — the client (its one create, open and
delete path for ledgers), the metadata store, the config, the rng and a wall clock for the
times recorded in metadata (retention by age is the one decision taken on them) — and owns the
writers and readers it hands out that are still open: the client's shutdown aborts writers
(their next writer recovers their ledger) and closes readers.

Every ledger of a log is created with the empty password and tagged with the custom metadata
``{"log": <name as UTF-8>}``; a log's readers open its ledgers without a password.
"""

from __future__ import annotations

import time
from asyncio import CancelledError
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..client.writer import LedgerWriter
from ..errors import BookKeeperError, MetadataUnavailableError
from . import admin
from .admin import LogInfo, check_offset
from .keys import read_log
from .options import LogOptions, check_name
from .reader import LogReader, LogRecord, read_records
from .writer import LogWriter

if TYPE_CHECKING:
    from ..client.bookkeeper import BookKeeper

LOG_TAG = "log"  # custom metadata key of every ledger a log creates: the log's name
LOG_PASSWORD = b""


def wall_clock_ms() -> int:
    """Milliseconds since the epoch: metadata timestamps (ctime, a segment's close time)."""
    return int(time.time() * 1000)


class Logs:
    """See the module docstring; ``bk.logs``."""

    tag = LOG_TAG
    password = LOG_PASSWORD

    def __init__(self, bk: BookKeeper, clock_ms: Callable[[], int] = wall_clock_ms) -> None:
        self.bk = bk
        self.ctx = bk.ctx
        self.store = bk.ctx.metadata
        self.config = bk.ctx.config
        self.clock_ms = clock_ms
        self._open: dict[int, LogWriter | LogReader] = {}  # by id(): insertion order

    def register(self, handle: LogWriter | LogReader) -> None:
        self._open[id(handle)] = handle

    def unregister(self, handle: LogWriter | LogReader) -> None:
        self._open.pop(id(handle), None)

    async def close(self) -> None:
        """Abort the writers and close the readers still open (the client shuts down)."""
        for handle in list(self._open.values()):
            if isinstance(handle, LogWriter):
                await handle.abort()
            else:
                await handle.aclose()

    # --- ledgers of logs ------------------------------------------------------------------

    async def new_ledger(self, name: str, options: LogOptions) -> LedgerWriter:
        """A new ledger for log ``name``, tagged with it."""
        return await self.bk.create_ledger(
            options.ensemble_size,
            options.write_quorum,
            options.ack_quorum,
            password=self.password,
            custom_metadata={self.tag: name.encode()},
        )

    async def discard_ledger(self, ledger: LedgerWriter, why: BaseException | None = None) -> None:
        """Close and delete a ledger no log lists (best effort: a failure is logged by the
        caller's path and the ledger stays tagged with its log). ``why``: the error of the
        log update that would have listed it; one that leaves its outcome unknown (the store
        unreachable, a timeout or cancellation: the write may have landed and only its reply
        been lost) keeps the ledger, closed, since the log may list it after all."""
        try:
            await ledger.close()
            if not isinstance(why, MetadataUnavailableError | TimeoutError | CancelledError):
                owner = ledger.metadata.custom_metadata.get(self.tag, b"").decode()
                await self.bk.delete_ledger(ledger.ledger_id, owner_log=owner)
        except BookKeeperError:
            pass

    # --- the public API (BookKeeper delegates here) ----------------------------------------

    async def create_log(
        self, name: str, options: LogOptions | None = None, *, exist_ok: bool = False
    ) -> LogInfo:
        """Create an empty log (its first writer adds its first ledger); ``BookKeeper.
        create_log`` takes the options as keyword arguments.

        A writer rolls over to a new ledger when its ledger holds ``segment_entries_max``
        records, would pass ``segment_bytes_max`` bytes, or its first record is
        ``segment_age_s`` old. Retention removes whole ledgers from the front (never the last
        one): closed more than ``retention_s`` ago, or beyond ``retention_bytes`` of records.

        Raises:
            IncorrectParameterError: an invalid name (before etcd is touched).
            LogExistsError: the log exists (and ``exist_ok`` is False).
        """
        check_name(name)
        return await admin.create_log(self, name, options or LogOptions(), exist_ok)

    def open_log_writer(self, name: str) -> LogWriter:
        """A writer of the log, opened (taking the log over) by ``async with`` or ``open()``.

        Raises:
            IncorrectParameterError: an invalid name.
        """
        return LogWriter(self, name)

    def open_log_reader(self, name: str, from_offset: int = 0) -> LogReader:
        """An async iterator of the log's records from ``from_offset`` on, which waits for
        more at the end; ``aclose()`` it (or use ``async with``) when done.

        Raises:
            IncorrectParameterError: an invalid name or offset (LogTruncatedError and
                NoSuchLogError come from the iteration).
        """
        return LogReader(self, name, from_offset)

    async def read_log(
        self, name: str, from_offset: int = 0, to_offset: int | None = None
    ) -> list[LogRecord]:
        """The confirmed records ``from_offset .. to_offset`` (inclusive; None: to the end),
        at most ``log_read_records_max`` of them: ask again from the next offset.

        Raises:
            NoSuchLogError: no such log.
            LogTruncatedError: ``from_offset`` is below the first offset kept.
            IncorrectParameterError: an invalid name or offset.
        """
        check_name(name)
        check_offset(from_offset, "from_offset")
        if to_offset is not None:
            check_offset(to_offset, "to_offset")
        return await read_records(self, name, from_offset, to_offset)

    async def commit_log_offset(self, name: str, group: str, offset: int) -> None:
        """Store ``group``'s cursor on the log (the next offset it will read, by convention).

        Raises:
            NoSuchLogError: no such log.
            IncorrectParameterError: an invalid name, group or offset.
        """
        check_name(name)
        check_name(group, "group")
        check_offset(offset, "offset")
        await admin.commit_offset(self, name, group, offset)

    async def committed_log_offset(self, name: str, group: str) -> int | None:
        """``group``'s committed offset, or None.

        Raises:
            NoSuchLogError: no such log.
        """
        check_name(name)
        check_name(group, "group")
        return await admin.committed_offset(self, name, group)

    async def list_log_cursors(self, name: str) -> dict[str, int]:
        """Every group's committed offset on the log.

        Raises:
            NoSuchLogError: no such log.
        """
        check_name(name)
        return await admin.list_cursors(self, name)

    async def truncate_log(self, name: str, before_offset: int) -> int:
        """Delete the whole ledgers that hold only offsets below ``before_offset`` (never the
        open one); return the first offset kept.

        Raises:
            NoSuchLogError: no such log.
            IncorrectParameterError: an invalid name or offset.
        """
        check_name(name)
        check_offset(before_offset, "before_offset")
        return await admin.truncate_log(self, name, before_offset)

    async def enforce_log_retention(self, name: str) -> int:
        """Apply the log's ``retention_s`` / ``retention_bytes`` now (its writer does after
        each rollover); return how many ledgers were removed.

        Raises:
            NoSuchLogError: no such log.
        """
        check_name(name)
        return await admin.enforce_retention(self, name)

    async def log_info(self, name: str) -> LogInfo:
        """Segments (ledger id, first offset, last offset, state), start and next offset.

        Raises:
            NoSuchLogError: no such log.
        """
        check_name(name)
        return await admin.describe(self, await read_log(self.store, name))

    async def list_logs(self) -> list[str]:
        """The names of every log, sorted."""
        return await admin.list_logs(self)

    async def delete_log(self, name: str) -> None:
        """Delete the log, its ledgers and its cursors (writers get NoSuchLogError).

        Raises:
            NoSuchLogError: no such log.
        """
        check_name(name)
        await admin.delete_log(self, name)

    async def append_ledgers_to_log(
        self,
        name: str,
        ledger_ids: Sequence[int],
        *,
        properties: Mapping[str, str | None] | None = None,
        expected_properties: Mapping[str, str | None] | None = None,
    ) -> range:
        """Append closed ledgers written elsewhere (empty password, not tagged for another
        log) to the log in one compare-and-swap, as a writer: the log is taken over first
        (a live writer gets LogFencedError; its open ledger is recovered). ``properties``
        are set in the same compare-and-swap (None removes one), on condition that the
        ``expected_properties`` hold (None: absent) at that moment. Returns the offsets the
        ledgers' entries got, in order. Idempotent: when the log holds exactly these ledgers
        already (a retry after a lost reply), it returns their offsets and changes nothing.

        Raises:
            NoSuchLogError / NoSuchLedgerError: no such log or ledger.
            IncorrectParameterError: a ledger is not closed, is in the log already, or
                belongs to another log; duplicate ids.
            UnauthorizedError: a ledger has a password.
            LogFencedError: another writer took over during the commit (nothing appended).
            LogPropertyConflictError: an expected property does not hold (nothing appended).
        """
        check_name(name)
        return await admin.append_ledgers(self, name, ledger_ids, properties, expected_properties)

    def statistics(self) -> dict[str, Any]:
        """Open writers and readers."""
        writers = sum(isinstance(h, LogWriter) for h in self._open.values())
        return {"open_writers": writers, "open_readers": len(self._open) - writers}
