"""Write a ledger from one client while another tails it.

    python examples/write_and_tail.py etcd://127.0.0.1:2379/bookkeeper

(`python -m bookkeeper_aio.sandbox --bookies 3` prints a metadata URI to use.)
"""

from __future__ import annotations

import asyncio
import sys

from bookkeeper_aio import BookKeeper


async def main(uri: str, count: int = 1000) -> None:
    async with BookKeeper.connect(uri) as writer_bk, BookKeeper.connect(uri) as reader_bk:
        writer = await writer_bk.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"example"
        )
        reader = await reader_bk.open_ledger(writer.ledger_id, password=b"example", recovery=False)

        async def tail() -> int:
            seen = 0
            async for entry in reader.tail(from_entry_id=0):
                assert entry.payload == f"event {entry.entry_id}".encode()
                seen += 1
            return seen

        tailer = asyncio.create_task(tail())
        for i in range(count):
            await writer.append(f"event {i}".encode())
        await writer.close()  # the tail ends once it has read up to the last entry
        print(f"wrote {count} entries to ledger {writer.ledger_id}; tail read {await tailer}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
