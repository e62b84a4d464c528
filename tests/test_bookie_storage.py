"""The disk storage seam: the BP-46 unclean-shutdown marker."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bookkeeper_aio.bookie import storage as storage_module
from bookkeeper_aio.bookie.storage import DIRTY_FILE, DiskStorage
from bookkeeper_aio.config import BookieConfig


def test_unclean_shutdown_marker_in_every_ledger_dir(tmp_path: Path) -> None:
    dirs = (str(tmp_path / "a"), str(tmp_path / "b"))
    for d in dirs:
        Path(d).mkdir()
    storage = DiskStorage(BookieConfig(ledger_dirs=dirs, journal_dir=str(tmp_path / "j")))

    async def scenario() -> list[bool]:
        seen = [await storage.unclean_shutdown()]
        await storage.mark_running(True)  # started: a crash from now on leaves the marker
        seen.append(await storage.unclean_shutdown())
        assert all((Path(d) / DIRTY_FILE).exists() for d in dirs)
        (Path(dirs[0]) / DIRTY_FILE).unlink()  # one dir's marker is enough to tell
        seen.append(await storage.unclean_shutdown())
        await storage.mark_running(False)  # clean shutdown
        seen.append(await storage.unclean_shutdown())
        return seen

    assert asyncio.run(scenario()) == [False, True, True, False]


def test_every_ledger_dir_paces_its_engine_writes_at_the_configured_rate(tmp_path: Path) -> None:
    dirs = (str(tmp_path / "a"), str(tmp_path / "b"))
    paced = BookieConfig(ledger_dirs=dirs, journal_dir=str(tmp_path / "j"))
    unlimited = paced.replace(engine_write_rate_bytes_per_s=0)

    async def limiters(config: BookieConfig) -> list[str]:
        storage = DiskStorage(config)
        engine, journal, _ = await storage.open(lambda full: None, lambda exc: None)
        await journal.close()
        await storage.close_engine(engine)
        return [line.split("Options.rate_limiter:")[1].strip()
                for d in dirs for line in (Path(d) / "LOG").read_text().splitlines()
                if "Options.rate_limiter:" in line]  # fmt: skip

    assert paced.engine_write_rate_bytes_per_s > 0
    assert [limiter != "(nil)" for limiter in asyncio.run(limiters(paced))] == [True, True]
    assert asyncio.run(limiters(unlimited)) == ["(nil)", "(nil)"]


def test_a_crash_the_system_survived_kept_the_engines_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The marker names the kernel's boot: after a crash on the same boot a journal-less
    rocksdb bookie lost nothing (its WAL had every write), so it needs no limbo; after a
    reboot (another boot id), with an engine that buffers in the process, or with the
    journal, it does not say so."""
    boot = tmp_path / "boot_id"
    boot.write_text("1111-aaaa\n")
    monkeypatch.setattr(storage_module, "BOOT_ID_FILE", str(boot))
    dirs = (str(tmp_path / "a"), str(tmp_path / "b"))
    for d in dirs:
        Path(d).mkdir()
    base = BookieConfig(ledger_dirs=dirs, journal_dir=str(tmp_path / "j"))

    async def kept(config: BookieConfig) -> bool:
        storage = DiskStorage(config)
        await storage.mark_running(True)  # ... and the process is killed
        return await storage.crash_kept_writes()

    journal_less = base.replace(journal_write_data=False, metadata_uri="memory://x")
    assert asyncio.run(kept(journal_less))
    assert (Path(dirs[0]) / DIRTY_FILE).read_bytes() == b"1111-aaaa"
    assert not asyncio.run(kept(base))  # journaled: its rocksdb runs without a WAL
    assert not asyncio.run(kept(journal_less.replace(engine="files")))  # buffers in-process

    async def after_reboot() -> bool:
        storage = DiskStorage(journal_less)
        await storage.mark_running(True)
        boot.write_text("2222-bbbb\n")  # a power loss: the machine booted again
        return await storage.crash_kept_writes()

    assert not asyncio.run(after_reboot())
    boot.unlink()  # no boot id to compare: never vouch
    assert not asyncio.run(kept(journal_less))
