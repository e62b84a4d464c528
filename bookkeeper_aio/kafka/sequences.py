"""Idempotent producers: sequence numbers per producer and partition (pure).

Theory of operation
-------------------
An idempotent producer (``enable.idempotence``) gets a producer id and epoch from
InitProducerId and numbers the records it sends to each partition 0, 1, 2, ... A batch carries
its producer id, epoch and first sequence; its last sequence is first + lastOffsetDelta. The
partition's owner keeps, per producer, the epoch and the last :data:`BATCHES_KEPT` batches
(Kafka keeps five: a producer has at most five requests in flight per connection) and decides
each new batch with :meth:`ProducerSequences.check`:

* not idempotent (producer id -1): append;
* a producer it does not know (new, evicted, or known only to a previous owner beyond what it
  read back from the log): append, whatever the sequence;
* an older epoch: ``INVALID_PRODUCER_EPOCH``; a newer one must start at sequence 0;
* the same first and last sequence as a kept batch: a **duplicate** (a retry of a batch that
  was written, or is being written): answered with the original's outcome, never appended
  twice;
* otherwise the first sequence must follow the last one kept (mod 2^31), else
  ``OUT_OF_ORDER_SEQUENCE_NUMBER``.

:meth:`record` is called once the batch has its base offset (before its append is
acknowledged): a retry that arrives meanwhile waits for the original through the ``token``
stored with it. The number of producers tracked is bounded (least recently used evicted).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from .errors import ErrorCode, KafkaError
from .records import NO_PRODUCER_ID, BatchHeader

BATCHES_KEPT = 5
SEQUENCE_MODULUS = 2**31


@dataclass(frozen=True, slots=True)
class KeptBatch:
    """A batch a producer sent, as remembered for duplicate detection."""

    first_sequence: int
    last_sequence: int
    base_offset: int
    token: Any = None  # what a duplicate waits for (the original append's future)


@dataclass(slots=True)
class _Producer:
    epoch: int
    batches: deque[KeptBatch] = field(default_factory=lambda: deque(maxlen=BATCHES_KEPT))


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The batch was already written (or is being written): answer with ``original``."""

    original: KeptBatch


class ProducerSequences:
    """One partition's idempotent-producer state (see the module docstring)."""

    def __init__(self, producers_max: int) -> None:
        assert producers_max > 0
        self.producers_max = producers_max
        self._producers: OrderedDict[int, _Producer] = OrderedDict()
        self.duplicates = 0

    def check(self, header: BatchHeader) -> Duplicate | None:
        """None: append the batch; :class:`Duplicate`: answer with the original's outcome.

        Raises:
            KafkaError: INVALID_PRODUCER_EPOCH or OUT_OF_ORDER_SEQUENCE_NUMBER.
        """
        if header.producer_id == NO_PRODUCER_ID:
            return None
        producer = self._producers.get(header.producer_id)
        if producer is None:
            return None
        self._producers.move_to_end(header.producer_id)
        if header.producer_epoch < producer.epoch:
            raise KafkaError(
                f"producer {header.producer_id} epoch {header.producer_epoch} < {producer.epoch}",
                ErrorCode.INVALID_PRODUCER_EPOCH,
            )
        if header.producer_epoch > producer.epoch:
            if header.base_sequence != 0:
                raise _out_of_order(header, "a new epoch starts at sequence 0")
            return None
        for kept in producer.batches:
            last = header.last_sequence % SEQUENCE_MODULUS
            if (kept.first_sequence, kept.last_sequence) == (header.base_sequence, last):
                self.duplicates += 1
                return Duplicate(kept)
        if producer.batches:
            expected = (producer.batches[-1].last_sequence + 1) % SEQUENCE_MODULUS
            if header.base_sequence != expected:
                raise _out_of_order(header, f"expected sequence {expected}")
        return None

    def record(self, header: BatchHeader, base_offset: int, token: Any = None) -> None:
        """Remember a batch that :meth:`check` let through and that now has its offset."""
        if header.producer_id == NO_PRODUCER_ID:
            return
        producer = self._producers.get(header.producer_id)
        if producer is None or header.producer_epoch != producer.epoch:
            producer = _Producer(header.producer_epoch)
            self._producers[header.producer_id] = producer
        self._producers.move_to_end(header.producer_id)
        last = header.last_sequence % SEQUENCE_MODULUS
        producer.batches.append(KeptBatch(header.base_sequence, last, base_offset, token))
        while len(self._producers) > self.producers_max:
            self._producers.popitem(last=False)

    def __len__(self) -> int:
        return len(self._producers)


def _out_of_order(header: BatchHeader, why: str) -> KafkaError:
    return KafkaError(
        f"producer {header.producer_id} epoch {header.producer_epoch}: batch at sequence "
        f"{header.base_sequence} is out of order ({why})",
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
    )
