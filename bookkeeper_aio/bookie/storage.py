"""Where a bookie keeps its data: the disk seam between the server and the file system.

Theory of operation
-------------------
The server (``server.py``) never touches files itself. It asks a :class:`BookieStorage` to
check cookies, open the engine and the journal (replaying the journal into the engine), measure
disk usage, close the engine, and keep the unclean-shutdown marker: a ``DIRTY`` file in every
ledger dir while the bookie runs (BP-46), so a crash is detected at the next boot. The marker
holds the operating system's boot id (``/proc/sys/kernel/random/boot_id``): a crash after
which the same system still runs (``kill -9``, an OOM kill, a fail-stop) lost nothing an
engine had handed to the kernel, only a power loss or a kernel crash may have
(:meth:`BookieStorage.crash_kept_writes`).
:class:`DiskStorage` is production: real dirs, with every blocking call in a worker thread.
The simulator (``bookkeeper_aio.sim``) passes its own storage, in memory and inline, so the
same server code runs on a virtual clock.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from engines import open_engine

from ..config import BookieConfig
from ..engine import Engine
from ..metadata.store import MetadataStore
from .cookie import CookieCheck, check_cookies, restamp_cookies
from .disk import DiskUsage, disk_usage
from .handler import JournalSink
from .journal import Journal
from .journal_files import fsync_dir
from .ledger_dirs import LedgerDirs, open_dirs
from .records import replay_into

DIRTY_FILE = "DIRTY"  # present while the bookie runs: left behind by a crash (BP-46)
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"  # Linux: new at every boot
PressureCallback = Callable[[bool], None]
FailureCallback = Callable[[BaseException], None]


class BookieJournal(JournalSink, Protocol):
    """What the server needs from a started journal (``journal.Journal``)."""

    async def checkpoint(self, sync_engine: Callable[[], None]) -> None: ...

    async def close(self) -> None: ...

    def statistics(self) -> dict[str, int | float]: ...


class BookieStorage(Protocol):
    """A bookie's storage, opened once per boot."""

    async def check_cookies(self, metadata: MetadataStore) -> CookieCheck:
        """Validate (or on first boot write) the cookies (raises CookieError)."""
        ...

    async def restamp_cookies(self, metadata: MetadataStore, check: CookieCheck) -> None:
        """Rewrite the cookies :meth:`check_cookies` asked to repair (after phase one)."""
        ...

    async def open(
        self, on_pressure: PressureCallback, on_failure: FailureCallback
    ) -> tuple[Engine, BookieJournal, int]:
        """Open the engine, replay the journal into it, start the journal.

        Returns the engine, the started journal and the number of records replayed.
        """
        ...

    async def disk_usage(self) -> DiskUsage: ...

    async def close_engine(self, engine: Engine) -> None: ...

    async def reclaim_space(self, engine: Engine, live_ratio_min: float) -> int:
        """The engine's ``reclaim_space`` where blocking belongs; the bytes freed."""
        ...

    async def unclean_shutdown(self) -> bool:
        """Did the last run end without a clean shutdown (a marker was left behind)?"""
        ...

    async def mark_running(self, running: bool) -> None:
        """Set (on start) or clear (on a clean shutdown) the unclean-shutdown marker."""
        ...

    async def crash_kept_writes(self) -> bool:
        """After an unclean shutdown: did every write the last run's engine had returned from
        survive it? True when the operating system kept running since (the marker names its
        current boot) and the engine hands each write to the kernel before it returns: then
        nothing the bookie acknowledged was lost, and BP-46's limbo is not needed."""
        ...


class DiskStorage:
    """Production storage: the configured dirs, blocking work in worker threads."""

    def __init__(self, config: BookieConfig, engine: Engine | None = None) -> None:
        self.config = config
        self._engine = engine

    async def check_cookies(self, metadata: MetadataStore) -> CookieCheck:
        cfg = self.config
        await asyncio.to_thread(_make_dirs, (cfg.journal_dir, *cfg.ledger_dirs))
        return await check_cookies(cfg, metadata)

    async def restamp_cookies(self, metadata: MetadataStore, check: CookieCheck) -> None:
        await restamp_cookies(self.config, metadata, check)

    async def open(
        self, on_pressure: PressureCallback, on_failure: FailureCallback
    ) -> tuple[Engine, BookieJournal, int]:
        cfg = self.config
        await asyncio.to_thread(_make_dirs, (cfg.journal_dir, *cfg.ledger_dirs))
        engine = self._engine
        if engine is None:
            one_dir = partial(
                _open_one,
                cfg.engine,
                journaled=cfg.journal_write_data,
                direct_io=cfg.engine_direct_io,
                blob_files=cfg.engine_blob_files,
                write_behind_bytes=cfg.engine_write_behind_bytes,
                write_rate_bytes_per_s=cfg.engine_write_rate_bytes_per_s,
                copy_file_bytes=cfg.engine_copy_file_bytes,
            )
            shards = await asyncio.to_thread(
                open_dirs, cfg.ledger_dirs, one_dir, inject=cfg.engine_fault_injection
            )
            engine = LedgerDirs(shards)  # a failing dir goes out of service (ledger_dirs.py)
        journal = Journal(cfg.journal_dir, cfg, on_pressure=on_pressure, on_failure=on_failure)
        replayed = await asyncio.to_thread(replay_into, engine, journal.replay())
        await journal.start()
        return engine, journal, replayed

    async def disk_usage(self) -> DiskUsage:
        return await asyncio.to_thread(disk_usage, self.config.ledger_dirs)

    async def close_engine(self, engine: Engine) -> None:
        await asyncio.to_thread(engine.close)

    async def reclaim_space(self, engine: Engine, live_ratio_min: float) -> int:
        return await asyncio.to_thread(engine.reclaim_space, live_ratio_min)

    async def unclean_shutdown(self) -> bool:
        return any((Path(d) / DIRTY_FILE).exists() for d in self.config.ledger_dirs)

    async def mark_running(self, running: bool) -> None:
        await asyncio.to_thread(_mark_dirs, self.config.ledger_dirs, running)

    async def crash_kept_writes(self) -> bool:
        cfg = self.config
        # Only rocksdb with its WAL (a journal-less bookie) writes each put to the kernel
        # before returning (a write() per write batch); the files engine keeps a buffer in
        # the process, and an engine given from outside is not known here.
        if self._engine is not None or cfg.engine != "rocksdb" or cfg.journal_write_data:
            return False
        return await asyncio.to_thread(_markers_name_this_boot, cfg.ledger_dirs)


def _open_one(name: str, directory: str, **options: Any) -> Engine:
    return open_engine(name, [directory], **options)


def os_boot_id() -> bytes | None:
    """The running kernel's boot id (new at every boot), or None where there is none."""
    try:
        return Path(BOOT_ID_FILE).read_bytes().strip() or None
    except OSError:
        return None


def _markers_name_this_boot(dirs: tuple[str, ...]) -> bool:
    """Whether every ledger dir's marker holds the running kernel's boot id."""
    boot = os_boot_id()
    if boot is None:
        return False
    try:
        return all((Path(d) / DIRTY_FILE).read_bytes() == boot for d in dirs)
    except OSError:  # a dir without its marker (wiped): the cookies' repair decides
        return False


def _mark_dirs(dirs: tuple[str, ...], running: bool) -> None:
    """Create (durably, holding the kernel's boot id) or remove the ``DIRTY`` marker in every
    ledger dir."""
    boot = os_boot_id() or b""
    for d in dirs:
        path = Path(d) / DIRTY_FILE
        if running:
            with open(path, "wb") as f:
                f.write(boot)
                os.fsync(f.fileno())
        else:
            path.unlink(missing_ok=True)
        fsync_dir(Path(d))


def _make_dirs(dirs: tuple[str, ...]) -> None:
    for d in dirs:
        Path(d).mkdir(parents=True, exist_ok=True)
