"""Embedding the client in an asyncio service: one BookKeeper per process, pipelined appends.

`append_nowait` returns a future without waiting, so a service can keep many appends in flight.
The client bounds how many (`ClientConfig.adds_pending_max`): past it `append_nowait` raises and
`append` waits — backpressure, not memory growth. Futures complete in entry order.

    python examples/service.py etcd://127.0.0.1:2379/bookkeeper
"""

from __future__ import annotations

import asyncio
import sys
import time

from bookkeeper_aio import BookKeeper


class EventLog:
    """A tiny service: appends events to one ledger and reports throughput."""

    def __init__(self, bk: BookKeeper) -> None:
        self.bk = bk

    async def run(self, events: int) -> None:
        ledger = await self.bk.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"svc",
            custom_metadata={"app": b"event-log"},
        )  # fmt: skip
        start = time.perf_counter()
        entry_ids: list[int] = []
        for first in range(0, events, 1000):  # windows of 1000 appends in flight
            window = [ledger.append_nowait(f"event {i}".encode())
                      for i in range(first, min(first + 1000, events))]  # fmt: skip
            entry_ids += await asyncio.gather(*window)
        elapsed = time.perf_counter() - start
        assert entry_ids == list(range(events))
        await ledger.close()
        print(f"{events} events in {elapsed:.2f}s ({events / elapsed:,.0f}/s), "
              f"ledger {ledger.ledger_id}")  # fmt: skip


async def main(uri: str) -> None:
    async with BookKeeper.connect(uri) as bk:
        await EventLog(bk).run(10_000)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
