"""Kafka offsets to log offsets for one partition.

Theory of operation
-------------------
A partition's log holds one entry per record batch, so log offsets count batches while Kafka
offsets count records. Every entry carries its Kafka base offset (bytes 0..7, written before
the append) and its record count (lastOffsetDelta + 1), and entries are in offset order, so
"the entry holding Kafka offset *k*" is the last entry whose base offset is <= *k*: a
bisection.

* Entries this gateway appended since it took the partition over are indexed as they are
  appended: a compact array of base offsets, log offsets contiguous from the first one
  (bounded: the older half is dropped when it fills up).
* Anything older is found by bisecting over the log itself: first over its segments (by the
  base offset of each segment's first entry, cached: a closed segment never changes), then
  over the entries of that segment. Each probe reads one entry; the base offsets learnt are
  cached (bounded), so a consumer reading forward pays the bisection once, not per fetch.
"""

from __future__ import annotations

import bisect
from array import array
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence

BaseOf = Callable[[int], Awaitable[int]]  # log offset -> the entry's Kafka base offset
Segments = Callable[[], Awaitable[Sequence[tuple[int, int]]]]  # (first, last) log offsets


class OffsetIndex:
    """See the module docstring."""

    def __init__(self, own_entries_max: int, cached_entries_max: int) -> None:
        assert own_entries_max >= 2 and cached_entries_max >= 1
        self.own_entries_max = own_entries_max
        self.cached_entries_max = cached_entries_max
        self._own_first = -1  # log offset of _own_bases[0]
        self._own_bases = array("q")
        self._cache: OrderedDict[int, int] = OrderedDict()  # log offset -> base offset
        self.probes = 0

    def appended(self, log_offset: int, base_offset: int) -> None:
        """An entry this gateway appended (in log order, contiguous)."""
        if not self._own_bases:
            self._own_first = log_offset
        assert log_offset == self._own_first + len(self._own_bases), "appends are contiguous"
        self._own_bases.append(base_offset)
        if len(self._own_bases) > self.own_entries_max:
            half = len(self._own_bases) // 2
            del self._own_bases[:half]
            self._own_first += half

    def own_covers(self, log_offset: int) -> bool:
        """Whether the own index still holds every entry from ``log_offset`` on (or holds
        nothing: no entry appended yet)."""
        return not self._own_bases or self._own_first <= log_offset

    def own(self, kafka_offset: int) -> int | None:
        """The log offset of the entry holding ``kafka_offset`` if it is one of ours."""
        if not self._own_bases or kafka_offset < self._own_bases[0]:
            return None
        return self._own_first + bisect.bisect_right(self._own_bases, kafka_offset) - 1

    async def base_of(self, log_offset: int, read_base: BaseOf) -> int:
        """An entry's Kafka base offset (cached; ``read_base`` reads it from the log)."""
        if self._own_bases and self._own_first <= log_offset < self._own_first + len(
            self._own_bases
        ):
            return self._own_bases[log_offset - self._own_first]
        base = self._cache.get(log_offset)
        if base is None:
            self.probes += 1
            base = await read_base(log_offset)
            self._cache[log_offset] = base
            if len(self._cache) > self.cached_entries_max:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(log_offset)
        return base

    async def locate(self, kafka_offset: int, segments_: Segments, read_base: BaseOf) -> int:
        """The log offset of the entry holding ``kafka_offset``.

        ``segments_()`` gives (first log offset, last log offset) of the log's non-empty
        segments, in order; it is only asked when the entry is older than this gateway's own
        appends. The caller has checked that ``kafka_offset`` is between the log's first
        Kafka offset and its high watermark.
        """
        own = self.own(kafka_offset)
        if own is not None:
            return own
        segments = await segments_()
        lo, hi = 0, len(segments) - 1
        while lo < hi:  # the last segment whose first entry's base offset is <= kafka_offset
            mid = (lo + hi + 1) // 2
            if await self.base_of(segments[mid][0], read_base) <= kafka_offset:
                lo = mid
            else:
                hi = mid - 1
        lo, hi = segments[lo]
        while lo < hi:  # then the last such entry of that segment
            mid = (lo + hi + 1) // 2
            if await self.base_of(mid, read_base) <= kafka_offset:
                lo = mid
            else:
                hi = mid - 1
        return lo
