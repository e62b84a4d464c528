"""Ledger dirs that fail (issue 28 point 4, BP-31), on an in-process bookie with two dirs and
``engine_fault_injection``: the failed dir's ledgers answer IO_ERROR (never "no such entry"),
new ledgers go to the good dir, its ledgers are marked under-replicated at once, and with no
good dir left the bookie turns read-only in the registry. The process test of the same (with
re-replication) is tests/test_autorecovery_process.py."""

from __future__ import annotations

import asyncio
import uuid

from bookkeeper_aio.bookie.ledger_dirs import INJECT_FILE
from bookkeeper_aio.bookie.server import Bookie
from bookkeeper_aio.errors import StatusCode
from bookkeeper_aio.metadata.store import open_metadata_store
from bookkeeper_aio.metadata.underreplication import list_marks
from bookkeeper_aio.protocol import ReadRequest

from .wire import RawPeer, add, bookie_config


def read(rid: int, ledger_id: int, entry_id: int) -> ReadRequest:
    return ReadRequest(rid, ledger_id, entry_id, 0, None, -1, 0)


async def statuses(peer: RawPeer, *requests: object) -> list[int]:
    peer.send(*requests)  # type: ignore[arg-type]
    return [answer.status for answer in await peer.recv(len(requests))]


async def until(predicate, what: str, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, f"not within {timeout_s} s: {what}"
        await asyncio.sleep(0.05)


async def test_a_failed_dir_answers_errors_its_ledgers_are_marked_and_none_left_is_read_only(
    tmp_path,
):
    uri = f"memory://dirs-{uuid.uuid4().hex[:8]}"
    dirs = [tmp_path / "d0", tmp_path / "d1"]
    async with open_metadata_store(uri) as store:
        await store.init_cluster()
        config = bookie_config(tmp_path, metadata_uri=uri, engine_fault_injection=True).replace(
            ledger_dirs=tuple(map(str, dirs))
        )
        async with Bookie.serve(config) as bookie:
            me = config.bookie_id
            peer = await RawPeer.connect(me)
            # A new ledger goes to good dir ledger_id % 2: ledger 2 to d0, ledger 3 to d1.
            assert await statuses(peer, add(2, 0, b"two"), add(3, 0, b"three")) == [0, 0]
            (dirs[0] / INJECT_FILE).touch()  # d0's disk dies
            assert await statuses(peer, read(4, 2, 0), add(2, 1, b"more", rid=5)) == [
                StatusCode.IO_ERROR, StatusCode.IO_ERROR,
            ]  # fmt: skip
            assert await statuses(peer, read(6, 3, 0)) == [StatusCode.OK]
            # Ledger 4 would have gone to d0 (4 % 2): d1 is the only good dir now.
            assert await statuses(peer, add(4, 0, b"four", rid=7), read(8, 4, 0)) == [0, 0]
            assert await statuses(peer, read(9, 2, 0)) == [StatusCode.IO_ERROR]  # still out

            async def marked() -> bool:
                found = [m.value async for m in list_marks(store)]
                return [(m.ledger_id, [x.bookie for x in m.missing]) for m in found] == [(2, [me])]

            await until(marked, "ledger 2 marked under-replicated")
            assert not bookie.handler.read_only
            (dirs[1] / INJECT_FILE).touch()  # and d1's: no good dir left
            assert await statuses(peer, read(10, 3, 0)) == [StatusCode.IO_ERROR]

            async def read_only() -> bool:
                info = (await store.list_bookies()).get(me)
                return bookie.handler.read_only and info is not None and info.read_only

            await until(read_only, "read-only, in the registry too")
            assert await statuses(peer, add(5, 0, b"five", rid=11)) == [StatusCode.READ_ONLY]
            assert bookie.statistics()["ledger_dirs_failed"] == 2
            await peer.close()
