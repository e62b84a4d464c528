"""Job and attempt records in the metadata store: create, read, list, compare-and-swap, delete.

Theory of operation
-------------------
Thin coroutines over the store's key methods (docs/metadata.md, "Keys") and the pure records
of :mod:`~bookkeeper_aio.spark.model`. Every change is :func:`update_record`: read, apply a
pure transform, write at the version read, and on a lost race apply the transform again to
the winner (a transform raises to give up). A write whose reply was lost (the store says
"unavailable") is told apart by reading the key back: if it holds exactly what we wrote, the
write happened.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from ..errors import MetadataUnavailableError, MetadataVersionError, SparkJobError
from ..metadata.model import Versioned
from ..metadata.store import MetadataStore, update_key
from .model import (
    ATTEMPTS_PREFIX,
    JOBS_PREFIX,
    AttemptRecord,
    JobRecord,
    attempts_prefix,
    job_key,
)


class _Record(Protocol):
    def to_json_bytes(self) -> bytes: ...


R = TypeVar("R", bound=_Record)


async def create_record(store: MetadataStore, key: str, record: _Record) -> Versioned[bytes]:
    """Write ``record`` at ``key`` only if the key is absent.

    Raises:
        MetadataVersionError: the key exists (with other bytes than ours).
    """
    data = record.to_json_bytes()
    try:
        return await store.put(key, data, expected_version=0)
    except MetadataUnavailableError:
        found = await store.get(key)  # did the lost reply's write land?
        if found is not None and found.value == data:
            return found
        if found is None:
            raise
        raise MetadataVersionError(f"{key} exists", current=found) from None


async def read_record(
    store: MetadataStore, key: str, decode: Callable[[bytes], R]
) -> Versioned[R] | None:
    """The record at ``key`` and its version, or None."""
    stored = await store.get(key)
    return None if stored is None else Versioned(decode(stored.value), stored.version)


async def update_record(
    store: MetadataStore,
    key: str,
    decode: Callable[[bytes], R],
    transform: Callable[[R], R | None],
    retries_max: int,
    current: Versioned[R] | None = None,
) -> Versioned[R]:
    """Read-transform-CAS until it sticks (``metadata.store.update_key``); return what is
    stored now. ``transform`` returns the new record, or None (or an equal one) to leave it;
    it may raise to give up.

    Raises:
        SparkJobError: the record is gone (its job was committed, aborted or cleaned up).
        MetadataVersionError: still conflicting after ``retries_max`` attempts.
    """

    def decoded(stored: Versioned[bytes] | None) -> Versioned[R]:
        if stored is None:
            raise SparkJobError(f"{key} is gone: its job was committed or aborted")
        return Versioned(decode(stored.value), stored.version)

    def encode(record: R) -> bytes:
        return record.to_json_bytes()

    return await update_key(store, key, decoded, encode, transform, retries_max, current)


async def read_job(store: MetadataStore, job_id: str) -> Versioned[JobRecord] | None:
    return await read_record(store, job_key(job_id), JobRecord.from_json_bytes)


async def update_job(
    store: MetadataStore,
    job_id: str,
    transform: Callable[[JobRecord], JobRecord | None],
    retries_max: int,
) -> Versioned[JobRecord]:
    """See :func:`update_record`."""
    return await update_record(
        store, job_key(job_id), JobRecord.from_json_bytes, transform, retries_max
    )


async def update_attempt(
    store: MetadataStore,
    key: str,
    transform: Callable[[AttemptRecord], AttemptRecord | None],
    retries_max: int,
    current: Versioned[AttemptRecord] | None = None,
) -> Versioned[AttemptRecord]:
    """See :func:`update_record`."""
    return await update_record(
        store, key, AttemptRecord.from_json_bytes, transform, retries_max, current
    )


async def list_jobs(store: MetadataStore) -> list[Versioned[JobRecord]]:
    """Every job record, in job id order."""
    return [
        Versioned(JobRecord.from_json_bytes(stored.value), stored.version)
        async for _, stored in store.list_prefix(JOBS_PREFIX)
    ]


async def list_attempts(
    store: MetadataStore, job_id: str, limit: int
) -> dict[str, Versioned[AttemptRecord]]:
    """The job's attempt records by key.

    Raises:
        SparkJobError: more than ``limit`` of them.
    """
    found: dict[str, Versioned[AttemptRecord]] = {}
    async for key, stored in store.list_prefix(attempts_prefix(job_id)):
        if len(found) >= limit:
            raise SparkJobError(f"job {job_id} has more than {limit} attempt records")
        found[key] = Versioned(AttemptRecord.from_json_bytes(stored.value), stored.version)
    return found


async def jobs_with_attempts(store: MetadataStore) -> set[str]:
    """Job ids that have attempt records (also jobs whose record is gone)."""
    jobs = set()
    async for key, _ in store.list_prefix(ATTEMPTS_PREFIX):
        jobs.add(key[len(ATTEMPTS_PREFIX) :].split("/", 1)[0])
    return jobs


async def delete_job_records(store: MetadataStore, job_id: str) -> None:
    """The attempts first, then the job: a late task that records an attempt meanwhile then
    finds the job not OPEN (or gone) and removes what it wrote itself."""
    await store.delete_prefix(attempts_prefix(job_id))
    await store.delete(job_key(job_id))


__all__ = [
    "create_record",
    "delete_job_records",
    "jobs_with_attempts",
    "list_attempts",
    "list_jobs",
    "read_job",
    "update_attempt",
    "update_job",
    "update_record",
]
