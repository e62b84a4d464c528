"""The disk storage seam: the BP-46 unclean-shutdown marker."""

from __future__ import annotations

import asyncio
from pathlib import Path

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
